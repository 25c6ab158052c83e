"""What keeps failed cells' frames alive, found without keeping them: the exception Python keeps for the
last error shown (``sys.last_*``) and the errors of earlier failed cells.

IPython's ``run_code`` frame holds the cell's ``ExecutionResult``, which holds the error, whose traceback
holds that frame: a reference cycle only the garbage collector breaks, so a failed cell's frames (and the
tensors their locals hold) outlive the next cell, and the next error, also with this extension unloaded.
:func:`note_failed` keeps a weak reference to each failed cell's result (the magics call it after each
cell), :func:`earlier_errors` gives the errors of those still alive, and :func:`release_earlier` breaks
their cycles for ``%gpumem free``. Standard library only.
"""
from __future__ import annotations

import sys
import weakref
from collections import deque
from typing import Any

FAILED_KEPT = 16  # failed cells remembered (weakly), the latest kept
_FAILED: deque = deque(maxlen=FAILED_KEPT)


def last_tracebacks() -> list:
    """The exception Python keeps for the last error shown (``sys.last_exc``, ``sys.last_value``) and its
    traceback (``sys.last_traceback``), and the errors of earlier failed cells whose frames are still
    alive (:func:`earlier_errors`): what keeps failed cells' frames alive."""
    found = [getattr(sys, name, None) for name in ("last_exc", "last_value", "last_traceback")]
    return [item for item in found if item is not None] + earlier_errors()


def note_failed(result: Any) -> None:
    """Remember, weakly, a failed cell's result (IPython's ``ExecutionResult``, whose ``error_in_exec``
    is the error): while the garbage collector has not broken the cycle through it, its frames hold
    memory that :func:`collect` counts and ``%gpumem free`` gives back. Keeps no strong reference."""
    if getattr(result, "error_in_exec", None) is None:
        return
    try:
        ref = weakref.ref(result)
    except TypeError:  # a result that takes no weak reference: nothing to remember
        return
    if all(known() is not result for known in _FAILED):
        _FAILED.append(ref)


def earlier_errors() -> list:
    """The errors of the failed cells :func:`note_failed` saw whose results are still alive."""
    errors = (getattr(ref(), "error_in_exec", None) for ref in list(_FAILED))
    return [error for error in errors if error is not None]


def release_earlier() -> list:
    """Let go of the failed cells' errors :func:`note_failed` saw (their results' ``error_in_exec``):
    each cycle through a result is broken, and its frames are freed without waiting for the garbage
    collector. Returns what was let go of, as 'In[n]'s error'."""
    released = []
    for ref in list(_FAILED):
        result = ref()
        if result is not None and getattr(result, "error_in_exec", None) is not None:
            result.error_in_exec = None
            number = getattr(result, "execution_count", None)
            released.append(f"In[{number}]'s error" if number is not None else "a failed cell's error")
    _FAILED.clear()
    return released
