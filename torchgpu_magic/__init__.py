"""torchgpu_magic: IPython/Jupyter magics for PyTorch on GPUs.

``%load_ext torchgpu_magic`` registers ``%gpuinfo``, ``%%ontorch``, ``%%cudatime``, ``%gpumem`` and
``%whereis``.  Importing this package is cheap on purpose: torch, pynvml and ipywidgets are imported only
when a magic first needs them, so loading the extension never slows a kernel's start-up.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics (and nothing else) on ``ipython``; calling it twice registers once."""
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove everything :func:`load_ipython_extension` and the magics registered: magics, event
    callbacks, formatters, exception handlers, threads. Safe to call when not loaded."""
    from .magics import unload

    unload(ipython)
