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

import importlib
from typing import Any, Optional

from .base import TorchGPUMagics

__all__ = ["MAGICS", "TorchGPUMagics", "instance", "load", "unload"]

# Each magic: its name, the module of this package it lives in, its class there, and the forms IPython
# knows it in; in the order %lsmagic and the README list them. The modules are imported at a magic's
# first use, not at %load_ext: compiling and running all six (their options built into argparse
# parsers) was most of what loading cost where no bytecode is cached (the CI machines'
# PYTHONDONTWRITEBYTECODE).
MAGICS = (
    ("gpuinfo", "gpuinfo", "GPUInfoMagics", ("line",)),
    ("ontorch", "ontorch", "OnTorchMagics", ("line", "cell")),
    ("cudatime", "cudatime", "CUDATimeMagics", ("line", "cell")),
    ("whereis", "whereis", "WhereIsMagics", ("line",)),
    ("gpumem", "gpumem", "GPUMemMagics", ("line",)),
    ("cudamem", "cudamem", "CUDAMemMagics", ("cell",)),
)


class FirstUse:
    # What `load` registers under a magic's name until the magic is first used: calling it, or reading
    # anything of it (`%ontorch?` reads its __doc__, IPython looks for attributes on what it calls), has
    # the extension make the magic's class, which registers the real magic in its place; then the real
    # one answers. As IPython 9 declares its own magics (IPython.core.magic.LazyMagic), and on IPython
    # 7.34 too. `__self__` is the extension, so that `unload` finds and removes it without loading.
    __slots__ = ("__self__", "_name", "_module", "_class")

    def __init__(self, owner: TorchGPUMagics, name: str, module: str, cls: str) -> None:
        self.__self__, self._name, self._module, self._class = owner, name, module, cls

    def resolve(self) -> Any:
        """The real magic (its bound method), its class made and registered first if need be."""
        cls = getattr(importlib.import_module(f"{__name__}.{self._module}"), self._class)
        return getattr(self.__self__.part(cls), self._name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of a cell's traceback
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resolve(), name)

    @property
    def __doc__(self) -> Optional[str]:
        return self.resolve().__doc__

    def __repr__(self) -> str:
        return f"<torchgpu_magic's %{self._name}, loaded at first use>"


def instance(shell: Any) -> Optional[TorchGPUMagics]:
    """The registered :class:`TorchGPUMagics` of ``shell``, or None when the extension is not loaded."""
    found = shell.magics_manager.registry.get(TorchGPUMagics.__name__)
    return found if isinstance(found, TorchGPUMagics) else None


def load(shell: Any) -> None:
    """Register the magics on ``shell`` once (each as a :class:`FirstUse` until its first use); a second
    call is a no-op."""
    if instance(shell) is not None:
        return
    magics = TorchGPUMagics(shell)
    shell.register_magics(magics)
    tables = shell.magics_manager.magics
    for name, module, cls, kinds in MAGICS:
        stand_in = FirstUse(magics, name, module, cls)
        for kind in kinds:
            tables[kind][name] = stand_in
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
