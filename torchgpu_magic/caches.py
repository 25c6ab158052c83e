"""What the package works out once and keeps for the life of the process: compiled patterns, classes
made on first use, per-type and per-device answers on hot paths. Every such cache is made here, with
:func:`cache` (a function's results) or :func:`table` (a dict a loop reads at C speed), so that
:func:`reset_caches` forgets them all at once: tests call it after replacing what a cache was worked out
from (torch's functions, a simulated GPU). Classes made on first use are not kept here but with
``functools.cache`` in their own module: a class made again would not be the class its subclasses and
instances were made from. Standard library only.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

_CLEARS: list = []  # the clear() of every cache made here
F = TypeVar("F", bound=Callable[..., Any])


def cache(func: Optional[F] = None, *, maxsize: Optional[int] = None) -> Any:
    """``functools.lru_cache`` (unbounded unless ``maxsize``), forgotten by :func:`reset_caches`; used bare
    (``@cache``) or with ``maxsize`` (``@cache(maxsize=1)``: only the latest answer kept)."""
    if func is None:
        return functools.partial(cache, maxsize=maxsize)
    cached = functools.lru_cache(maxsize=maxsize)(func)
    _CLEARS.append(cached.cache_clear)
    return cached


def table() -> dict:
    """An empty dict to fill as a cache where a function call per lookup would cost too much (a walk
    over 10,000 tensors), emptied by :func:`reset_caches`."""
    found: dict = {}
    _CLEARS.append(found.clear)
    return found


def reset_caches() -> None:
    """Forget everything every cache of the package holds."""
    for clear in _CLEARS:
        clear()
