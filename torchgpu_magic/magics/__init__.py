"""The IPython side of torchgpu_magic: one ``Magics`` class per magic, registered together.

As IPython keeps its own magics (``IPython/core/magics/``), each magic has a module named after it
(``gpuinfo.py``, ``ontorch.py``, ``cudatime.py``, ``whereis.py``, ``gpumem.py``) holding its options, hooks
and state; ``base.py`` holds what they share. This package is the only part of torchgpu_magic that knows
IPython's magic machinery and the only one that turns the core's
:class:`~torchgpu_magic.errors.MagicInputError` into IPython's ``UsageError``. :func:`load` registers every
magic's class under one :class:`~.base.TorchGPUMagics`, whose closers undo whatever the magics hooked into
the shell (event callbacks, formatters, threads), so that :func:`unload` removes exactly what loading and
use added.
"""
from __future__ import annotations

from typing import Any, Optional

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..errors import MagicInputError
from .base import MagicsPart, TorchGPUMagics, parse_args, usage_errors
from .cudatime import CUDATimeMagics
from .gpuinfo import GPUInfoMagics
from .ontorch import OnTorchMagics
from .whereis import WhereIsMagics


@magics_class
class _UnsplitMagics(MagicsPart):
    """The magics not yet moved to a module of their own."""

    # ---- %gpumem (issue 6) -----------------------------------------------------------------------
    _gpumem_panel: Any = None  # the live panel.MemoryPanel: one sampler per kernel
    _gpumem_cells: Any = None  # memory.CellLog while per-cell accounting is hooked in
    _gpumem_cells_wanted = True  # the last --cells choice for the live panel
    _gpumem_closer_added = False

    @line_magic
    @magic_arguments()
    @argument("action", nargs="?", default=None,
              help="'stop': stop the sampler and close the panel. Nothing: show the live panel.")
    @argument("--interval", default=None,
              help="seconds between samples, 0.05 to 60 (default 1; the panel keeps the last 5 minutes)")
    @argument("--cells", choices=["on", "off"], default=None,
              help="per-cell memory accounting (on by default while the panel is open)")
    @usage_errors
    def gpumem(self, line: str = "") -> None:
        """A live memory panel: NVML, torch's allocator and host RSS side by side, and each cell's
        memory delta and peak. Without ipywidgets it prints one text snapshot instead.
        """
        from .. import memory

        args = parse_args(self.gpumem, line)
        if args.action not in (None, "stop"):
            raise MagicInputError(f"unknown action {args.action!r}: use 'stop', or nothing to show the panel")
        interval = None if args.interval is None else memory.validate_interval(args.interval)
        if args.action == "stop":
            if interval is not None or args.cells is not None:
                raise MagicInputError("'stop' takes no options")
            was_running = self._gpumem_panel is not None
            self._gpumem_stop()
            print("%gpumem: sampler stopped, panel closed" if was_running else "%gpumem: not running")
            return
        from IPython.display import display

        try:
            import ipywidgets  # noqa: F401 - only to learn whether the live panel can exist
        except ImportError:
            display(memory.collect(self._gpumem_targets()))
            print("%gpumem: this is one snapshot; for the live panel: pip install torchgpu-magic[widgets]")
            return
        panel = self._gpumem_start(interval)
        if args.cells is not None:
            self._gpumem_cells_wanted = args.cells == "on"
        if not self._gpumem_cells_wanted:
            self._gpumem_unhook_cells()
        elif self._gpumem_cells is None:
            self._gpumem_hook_cells()
        panel.show_cells(self._gpumem_cells.records if self._gpumem_cells else [],
                         on=self._gpumem_cells is not None)
        display(panel.widget)

    @staticmethod
    def _gpumem_targets() -> list:
        """The GPUs for the panel, without initialising CUDA: once CUDA is initialised, torch's devices
        matched to NVML's by UUID (inventory.gpu_map); before that, NVML's GPUs in the order
        CUDA_VISIBLE_DEVICES gives them (the order torch will use), and all of them for a torch without
        CUDA. The sampler asks again when CUDA's state changes."""
        import os

        from .. import inventory, memory, nvml

        state = memory.cuda_state()
        if state == "initialised":
            mappings = inventory.gpu_map()
            if mappings:
                return memory.targets_from(mappings)
        if nvml.status() is not None:
            return []
        gpus = [nvml.gpu_snapshot(i, identity_only=True) for i in range(nvml.device_count())]
        if state == "no CUDA":
            return [memory.GPUTarget(None, g.index, str(g.name)) for g in gpus]
        visible = inventory.parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
        targets = []
        for position, (index, slot) in enumerate(visible):
            mig = next((m for m in gpus[index].mig_devices if m.index == slot), None)
            targets.append(memory.GPUTarget(position, index, str(mig.name if mig else gpus[index].name)))
        return targets

    def _gpumem_start(self, interval: Optional[float]) -> Any:
        """The running panel (made and started on first use); ``interval`` applied when given."""
        from .. import memory, panel

        if not self._gpumem_closer_added:
            self.add_closer(self._gpumem_stop)
            self._gpumem_closer_added = True
        live = self._gpumem_panel
        if live is None or live.closed:
            sampler = memory.Sampler(self._gpumem_targets, interval or memory.DEFAULT_INTERVAL)
            live = panel.MemoryPanel(sampler, on_close=self._gpumem_closed)
            self._gpumem_panel = live
            self._gpumem_cells_wanted = True
            sampler.start()
        elif interval is not None:
            live.sampler.interval = interval
        return live

    def _gpumem_stop(self) -> None:
        """Stop the sampler, close the panel and unhook the cell events (also the unload closer)."""
        live, self._gpumem_panel = self._gpumem_panel, None
        if live is not None:
            live.close()  # calls _gpumem_closed
        self._gpumem_unhook_cells()

    def _gpumem_closed(self) -> None:
        """The panel closed (by `%gpumem stop`, unload, or its widget's close()): unhook with it."""
        self._gpumem_panel = None
        self._gpumem_unhook_cells()

    def _gpumem_hook_cells(self) -> None:
        from .. import memory

        self._gpumem_cells = memory.CellLog()
        self.shell.events.register("pre_run_cell", self._gpumem_pre_cell)
        self.shell.events.register("post_run_cell", self._gpumem_post_cell)

    def _gpumem_unhook_cells(self) -> None:
        if self._gpumem_cells is None:
            return
        self._gpumem_cells = None
        events = self.shell.events
        for name, callback in (("pre_run_cell", self._gpumem_pre_cell),
                               ("post_run_cell", self._gpumem_post_cell)):
            if callback in events.callbacks.get(name, []):
                events.unregister(name, callback)

    def _gpumem_pre_cell(self, info: Any = None) -> None:
        if self._gpumem_cells is not None:
            self._gpumem_cells.start()

    def _gpumem_post_cell(self, result: Any = None) -> None:
        log, live = self._gpumem_cells, self._gpumem_panel
        if log is None:
            return
        info = getattr(result, "info", None)
        record = log.finish(getattr(result, "execution_count", None), getattr(info, "raw_cell", "") or "")
        if record is not None and live is not None:
            live.sampler.note_cell(record)
            live.show_cells(log.records)


_PARTS = (GPUInfoMagics, OnTorchMagics, CUDATimeMagics, WhereIsMagics, _UnsplitMagics)


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
