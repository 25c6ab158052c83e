"""``%gpumem``: a live memory panel (NVML, torch's allocator, host RSS) and each cell's memory."""
from __future__ import annotations

from typing import Any, Optional

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..errors import MagicInputError
from .base import MagicsPart, TorchGPUMagics, parse_args, usage_errors


@magics_class
class GPUMemMagics(MagicsPart):
    """``%gpumem``: one :class:`~torchgpu_magic.memory.Sampler` per kernel behind one
    :class:`~torchgpu_magic.panel.MemoryPanel`, and the cell events that feed the panel's per-cell log."""

    def __init__(self, shell: Any, owner: TorchGPUMagics) -> None:
        super().__init__(shell, owner)
        self._panel: Any = None  # the live panel.MemoryPanel: one sampler per kernel
        self._cells: Any = None  # memory.CellLog while per-cell accounting is hooked in
        self._cells_wanted = True  # the last --cells choice for the live panel
        self._closer_added = False

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
            was_running = self._panel is not None
            self._stop()
            print("%gpumem: sampler stopped, panel closed" if was_running else "%gpumem: not running")
            return
        from IPython.display import display

        try:
            import ipywidgets  # noqa: F401 - only to learn whether the live panel can exist
        except ImportError:
            display(memory.collect(self._targets()))
            print("%gpumem: this is one snapshot; for the live panel: pip install torchgpu-magic[widgets]")
            return
        panel = self._start_panel(interval)
        if args.cells is not None:
            self._cells_wanted = args.cells == "on"
        if not self._cells_wanted:
            self._unhook_cells()
        elif self._cells is None:
            self._hook_cells()
        panel.show_cells(self._cells.records if self._cells else [], on=self._cells is not None)
        display(panel.widget)

    @staticmethod
    def _targets() -> list:
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

    def _start_panel(self, interval: Optional[float]) -> Any:
        """The running panel (made and started on first use); ``interval`` applied when given."""
        from .. import memory, panel

        if not self._closer_added:
            self.add_closer(self._stop)
            self._closer_added = True
        live = self._panel
        if live is None or live.closed:
            sampler = memory.Sampler(self._targets, interval or memory.DEFAULT_INTERVAL)
            live = panel.MemoryPanel(sampler, on_close=self._on_panel_closed)
            self._panel = live
            self._cells_wanted = True
            sampler.start()
        elif interval is not None:
            live.sampler.interval = interval
        return live

    def _stop(self) -> None:
        """Stop the sampler, close the panel and unhook the cell events (also the unload closer)."""
        live, self._panel = self._panel, None
        if live is not None:
            live.close()  # calls _on_panel_closed
        self._unhook_cells()

    def _on_panel_closed(self) -> None:
        """The panel closed (by `%gpumem stop`, unload, or its widget's close()): unhook with it."""
        self._panel = None
        self._unhook_cells()

    def _hook_cells(self) -> None:
        """Start per-cell accounting: a fresh cell log, fed by the pre/post_run_cell events."""
        from .. import memory

        self._cells = memory.CellLog()
        self.shell.events.register("pre_run_cell", self._pre_cell)
        self.shell.events.register("post_run_cell", self._post_cell)

    def _unhook_cells(self) -> None:
        """Stop per-cell accounting and unregister its events; a no-op when it is off."""
        if self._cells is None:
            return
        self._cells = None
        events = self.shell.events
        for name, callback in (("pre_run_cell", self._pre_cell),
                               ("post_run_cell", self._post_cell)):
            if callback in events.callbacks.get(name, []):
                events.unregister(name, callback)

    def _pre_cell(self, info: Any = None) -> None:
        """pre_run_cell: note the memory figures a cell starts from."""
        if self._cells is not None:
            self._cells.start()

    def _post_cell(self, result: Any = None) -> None:
        """post_run_cell: the cell's memory record, into the sampler's history and the panel's table."""
        log, live = self._cells, self._panel
        if log is None:
            return
        info = getattr(result, "info", None)
        record = log.finish(getattr(result, "execution_count", None), getattr(info, "raw_cell", "") or "")
        if record is not None and live is not None:
            live.sampler.note_cell(record)
            live.show_cells(log.records)
