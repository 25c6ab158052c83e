"""The IPython side of torchgpu_magic: one ``Magics`` class per magic, registered together.

As IPython keeps its own magics (``IPython/core/magics/``), each magic has a module named after it
(``gpuinfo.py``, ``ontorch.py``, ``cudatime.py``, ``whereis.py``, ``gpumem.py``, ``cudamem.py``) holding its
options, hooks and state; ``base.py`` holds what they share as magics (options, closers), ``shell.py`` what
they share of IPython's shell (the one cell compiler, results shown or returned, the history let go of), and
``explainers.py`` the always-on hooks that show an explained error above its traceback. This package is the
only part of torchgpu_magic that knows IPython's magic machinery and the only one that turns the core's
:class:`~torchgpu_magic.errors.MagicInputError` into IPython's ``UsageError``. :func:`load` registers every
magic's class under one :class:`~.base.TorchGPUMagics`, whose closers undo whatever the magics hooked into the
shell (event callbacks, formatters, threads), so that :func:`unload` removes exactly what loading and use
added.
"""
from __future__ import annotations

from typing import Any, Optional

from .base import TorchGPUMagics
from .cudamem import CUDAMemMagics
from .cudatime import CUDATimeMagics
from .gpuinfo import GPUInfoMagics
from .gpumem import GPUMemMagics
from .ontorch import OnTorchMagics
from .whereis import WhereIsMagics

__all__ = ["TorchGPUMagics", "instance", "load", "unload"]

# One Magics class per magic, in the order %lsmagic and the README list them.
_PARTS = (GPUInfoMagics, OnTorchMagics, CUDATimeMagics, WhereIsMagics, GPUMemMagics, CUDAMemMagics)


def instance(shell: Any) -> Optional[TorchGPUMagics]:
    """The registered :class:`TorchGPUMagics` of ``shell``, or None when the extension is not loaded."""
    found = shell.magics_manager.registry.get(TorchGPUMagics.__name__)
    return found if isinstance(found, TorchGPUMagics) else None


def load(shell: Any) -> None:
    """Register the magics on ``shell`` once; a second call is a no-op."""
    if instance(shell) is not None:
        return
    magics = TorchGPUMagics(shell, _PARTS)
    shell.register_magics(magics, *magics.parts)
    magics.start()


def unload(shell: Any) -> None:
    """Undo :func:`load` and everything the magics hooked in since; a no-op when not loaded.

    IPython has no API to unregister magics, so ours are removed from the manager's tables by hand.
    """
    magics = instance(shell)
    if magics is None:
        return
    try:
        magics.close()
    finally:
        manager = shell.magics_manager
        ours = [magics, *magics.parts]
        for table in manager.magics.values():
            for name, func in list(table.items()):
                if any(getattr(func, "__self__", None) is obj for obj in ours):
                    del table[name]
        for obj in ours:
            if manager.registry.get(type(obj).__name__) is obj:
                del manager.registry[type(obj).__name__]
