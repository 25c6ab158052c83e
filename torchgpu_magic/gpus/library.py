"""A GPU maker's monitoring library (NVML's ``pynvml``, AMD SMI's ``amdsmi``) brought up on first use, once,
under a lock, and shut down by a reset: what :mod:`.nvml` and :mod:`.amdsmi` share. Standard library only.
"""
from __future__ import annotations

import threading
from typing import Any, Callable


class Library:
    """``load()`` imports and initialises the library: ``(module, None)``, or ``(None, why not)`` without
    raising. It runs on the first :meth:`module` or :meth:`status` (threads wait for the one that runs it)
    and not again until :meth:`reset`, which calls the module's ``shutdown`` function."""

    def __init__(self, load: Callable[[], tuple], shutdown: str) -> None:
        self._load, self._shutdown = load, shutdown
        self._lock = threading.Lock()
        self._tried = False
        self._module: Any = None
        self._problem: Any = None

    def module(self) -> Any:
        """The initialised module, or None where it cannot be had (:meth:`status` says why)."""
        if not self._tried:
            with self._lock:
                if not self._tried:
                    self._module, self._problem = self._load()
                    self._tried = True
        return self._module

    def status(self) -> Any:
        """Initialise the library on first use; None when it works, else why it does not."""
        self.module()
        return self._problem

    def reset(self) -> None:
        """Shut the library down and forget everything, so the next call initialises afresh."""
        with self._lock:
            module, self._module, self._problem, self._tried = self._module, None, None, False
            if module is not None:
                try:
                    getattr(module, self._shutdown)()
                except Exception:  # noqa: BLE001, S110 - nothing to do about a failed shutdown
                    pass
