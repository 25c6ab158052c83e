"""``%gpumem``: memory per cell (kept as records), shown as a live panel where a widget can render and as
one line per cell where none can (a terminal)."""
from __future__ import annotations

import sys
import time
from typing import Any, Optional

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from .. import devices, gpumem
from ..errors import MagicInputError
from .base import MagicsPart, TorchGPUMagics, parse_args, usage_errors
from .shell import ipython_tracebacks, release_outputs, release_traceback, show

# The panel's static snapshot (the text/html and text/plain a saved notebook keeps) is rewritten after a
# cell at most this often, and always when the panel stops: rewriting it redraws the live view too.
SNAPSHOT_EVERY = 2.0
_INSTALL = "pip install torchgpu-magic[widgets]"
# %gpumem's subcommands (its positional ``action``; none: start)
ACTIONS = ("stop", "holders", "free")


def _watch_state() -> tuple:
    """(device type, state) deciding the GPUs %gpumem watches: ('cuda', CUDA's state) where NVML may see
    them, ('cuda', 'rocm') on ROCm, else the accelerator's type and state (MPS, XPU, PrivateUse1)."""
    from .. import accelerators

    kind = accelerators.current_kind()
    if kind == "cuda" and accelerators.is_rocm():
        return "cuda", "rocm" if accelerators.cuda_state() != "initialised" else "rocm initialised"
    if kind is not None and kind != "cuda":
        return kind, accelerators.state(kind)
    return "cuda", accelerators.cuda_state()


def shows_widgets(shell: Any) -> bool:
    """True when ``shell``'s frontend can show a widget: a Jupyter kernel (ipykernel's shell has a
    ``kernel``), not a terminal or a bare InteractiveShell, whatever is importable."""
    return getattr(shell, "kernel", None) is not None


@magics_class
class GPUMemMagics(MagicsPart):
    """``%gpumem``: a :class:`~torchgpu_magic.gpumem.CellLog` fed by the cell events while it runs, shown
    either by one :class:`~torchgpu_magic.gpumem.panel.MemoryPanel` per kernel (over one
    :class:`~torchgpu_magic.gpumem.Sampler`) or, in text mode, by one printed line per cell."""

    def __init__(self, shell: Any, owner: TorchGPUMagics) -> None:
        super().__init__(shell, owner)
        self._panel: Any = None  # the live panel.MemoryPanel: one sampler per kernel
        self._display: Any = None  # the DisplayHandle of the panel's output
        self._snapshot_at = 0.0  # when that output's static snapshot was last rewritten
        self._cell_refresh = False  # refresh the panel after each cell instead of from the thread
        self._text = False  # text mode: a line after each cell, no panel, no thread
        self._cells: Any = None  # gpumem.CellLog while per-cell accounting is hooked in
        self._growth: Any = None  # gpumem.growth.GrowthWatch beside it: a cell that grows run after run
        self._records: Any = None  # the last cell log's records, kept after it stops
        self._cells_wanted = True  # the last --cells choice for the live panel
        self._targets_state: Optional[tuple] = None  # the accelerator's state the targets were chosen in
        self._cluster_live: Any = None  # (cluster.memory.ClusterSampler, panel.ClusterPanel) for --cluster

    @line_magic
    @magic_arguments()
    @argument("action", nargs="?", default=None,
              help="'stop': stop the sampler, close the panel, stop the per-cell lines; 'holders [DEVICE]': "
                   "who holds memory, by name, largest first; 'free': give back what the last error's "
                   "traceback and the output history hold, and empty torch's cache. Nothing: start.")
    @argument("device", nargs="?", default=None, metavar="DEVICE",
              help="with 'holders': one device (cpu, cuda:0, mps, xpu:0); default: every device in use")
    @argument("--interval", default=None,
              help="seconds between samples, 0.05 to 60 (default 1; the panel keeps the last 5 minutes)")
    @argument("--cells", choices=["on", "off"], default=None,
              help="per-cell memory accounting in the panel (on by default)")
    @argument("--text", action="store_true",
              help="text mode: a snapshot now and one line after each cell, no widget, no thread "
                   "(the default where no widget can show: a terminal, or no ipywidgets)")
    @argument("--widget", action="store_true",
              help="the live panel (the default in a Jupyter kernel with ipywidgets)")
    @argument("--refresh", choices=["thread", "cell"], default=None,
              help="how the panel is refreshed: 'thread' (live, every interval) or 'cell' (after each "
                   "cell, from the main thread; the default in Colab, which drops thread updates)")
    @argument("--records", action="store_true",
              help="return the per-cell records (every cell since %%gpumem started, up to 10,000) "
                   "instead of showing the panel")
    @argument("-o", dest="output", action="store_true",
              help="return the per-cell records object (to_dict, to_csv, to_pandas)")
    @argument("--cluster", nargs="?", const="", default=None, metavar="NAME",
              help="every engine's GPU memory and per-cell peaks, for the ipyparallel Client/view or Dask "
                   "Client NAME (without NAME: the one in the namespace); 'stop' stops it too")
    @usage_errors
    def gpumem(self, line: str = "") -> Any:
        """Memory per cell and live: NVML, torch's allocator and host RSS side by side in a panel (a line
        per cell in a terminal); ``%gpumem holders`` says who holds memory, ``%gpumem free`` gives it back.

        Reference: https://github.com/torchgpu-magic/torchgpu-magic/blob/main/docs/gpumem.md
        """
        args = parse_args(self.gpumem, line)
        if args.action is not None and args.action not in ACTIONS:
            raise MagicInputError(f"unknown action {args.action!r}: use 'stop', 'holders [DEVICE]', 'free', "
                                  "or nothing to start")
        if args.device is not None and args.action != "holders":
            raise MagicInputError(f"{args.device!r}: only 'holders' takes a DEVICE")
        if args.action in ("holders", "free"):
            return self._holders_or_free(args, line)
        interval = None if args.interval is None else gpumem.validate_interval(args.interval)
        if args.text and args.widget:
            raise MagicInputError("--text and --widget exclude each other")
        if args.cluster is not None and args.action is None:
            return self._cluster(args, interval)
        if args.action == "stop":
            if line.split() != ["stop"]:
                raise MagicInputError("'stop' takes no options")
            cluster = self._cluster_live is not None
            self._stop_cluster()
            said = ("%gpumem: sampler stopped, panel closed" if self._panel is not None
                    else "%gpumem: per-cell lines stopped" if self._text else "%gpumem: not running")
            if cluster:
                said = ("%gpumem: cluster sampler stopped, panel closed" if said.endswith("not running")
                        else said + "; cluster sampler stopped, its panel closed")
            self._stop()
            print(said)
            return None
        if args.records:
            if interval is not None or args.cells or args.text or args.widget or args.refresh:
                raise MagicInputError("--records takes no option but -o")
            return self.records()
        text = self._wants_text(args.text, args.widget)
        if text and (args.refresh is not None or args.cells is not None):
            raise MagicInputError("--refresh and --cells are options of the panel, not of --text")
        if text:
            self._start_text(interval)
        else:
            self._start_panel(interval, args.refresh, args.cells)
            self._display = display(self._panel.widget, display_id=True)
            self._snapshot_at = time.monotonic()
        if not args.output:
            return None
        # the running %gpumem's records themselves, which keep filling as cells run
        return self._cells.records if self._cells is not None else self.records()

    # ---- holders and free --------------------------------------------------------------------------
    def _holders_or_free(self, args: Any, line: str) -> Any:
        """``%gpumem holders [DEVICE] [-o]`` and ``%gpumem free [-o]``: each takes -o alone."""
        options = [word for word in line.split() if word not in (args.action, args.device)]
        if any(word != "-o" for word in options):
            takes = "DEVICE and -o" if args.action == "holders" else "-o"
            raise MagicInputError(f"'{args.action}' takes {takes}, not "
                                  + " ".join(w for w in options if w != "-o"))
        if args.action == "holders":
            from ..holders.report import holders_report

            # DEVICE as torch names devices ('cuda' is the current GPU), checked as every magic checks one
            device = None if args.device is None else devices.option_name(
                devices.device_option(args.device, ("cpu", "cuda", "mps", "xpu")))
            report = holders_report(self.shell.user_ns, device, ipython_tracebacks(self.shell))
        else:
            from ..holders.free import give_back

            steps = [("the last error's traceback", "traceback", lambda: release_traceback(self.shell)),
                     ("the output history", "output", lambda: release_outputs(self.shell))]
            report = give_back(steps, self.shell.user_ns, ipython_tracebacks(self.shell))
        return show(report, args.output)

    # ---- choosing the view ------------------------------------------------------------------------
    def _wants_text(self, text: bool, widget: bool) -> bool:
        """Text mode or the panel: --text / --widget when given, else by the frontend (and by whether
        ipywidgets is there, with the hint to install it)."""
        if text:
            return True
        try:
            import ipywidgets  # noqa: F401 - only to learn whether the live panel can exist
        except ImportError:
            if widget:
                raise MagicInputError(f"--widget needs ipywidgets: {_INSTALL}") from None
            print(f"%gpumem: text mode; for the live panel: {_INSTALL}")
            return True
        return not widget and not shows_widgets(self.shell)

    def records(self) -> Any:
        """A copy of the per-cell records of the running (or last) ``%gpumem``; empty before one ran."""
        from ..gpumem.records import CellRecords

        records = self._cells.records if self._cells is not None else self._records
        return records.copy() if records is not None else CellRecords()

    # ---- text mode --------------------------------------------------------------------------------
    def _start_text(self, interval: Optional[float]) -> None:
        """A snapshot now; a line after each cell from now on (the panel, if open, closes)."""
        if interval is not None:
            raise MagicInputError("--interval sets the panel's sampling: text mode samples per cell")
        self.add_closer(self._stop)
        if self._panel is not None:
            self._stop()
        display(gpumem.collect(self._targets()))
        if not self._text:
            self._text = True
            self._hook_cells()
            print("%gpumem: one line after each cell from now on; `%gpumem stop` ends it")

    # ---- the panel --------------------------------------------------------------------------------
    def _start_panel(self, interval: Optional[float], refresh: Optional[str], cells: Optional[str]) -> Any:
        """The running panel (made and started on first use) with the options applied."""
        from ..gpumem import panel

        self.add_closer(self._stop)
        if self._text:
            self._stop()
        live = self._panel
        if live is None or live.closed:
            targets = self._targets()
            sampler = gpumem.Sampler(targets, interval or gpumem.DEFAULT_INTERVAL)
            live = panel.MemoryPanel(sampler, on_close=self._on_panel_closed)
            self._panel = live
            self._cells_wanted = True
            # Colab (its kernel imports google.colab) shows no widget update made from a thread
            # (googlecolab/colabtools #3373): refreshed after each cell there
            self._cell_refresh = "google.colab" in sys.modules if refresh is None else refresh == "cell"
            live.refresh()  # figures from the start: the output's snapshot is taken when shown
            if not self._cell_refresh:
                sampler.start()
        else:
            if interval is not None:
                live.sampler.interval = interval
            if refresh is not None and (refresh == "cell") != self._cell_refresh:
                self._cell_refresh = refresh == "cell"
                if self._cell_refresh:
                    live.sampler.stop()
                else:
                    live.sampler.start()
        if cells is not None:
            self._cells_wanted = cells == "on"
        if not self._cells_wanted:
            self._unhook_cells()
        elif self._cells is None:
            self._hook_cells()
        live.show_cells(self._cells.records if self._cells else (), on=self._cells is not None)
        if self._cell_refresh:
            live.refresh()
        return live

    def _targets(self) -> list:
        """The GPUs to watch, without initialising CUDA: once CUDA is initialised, torch's devices
        matched to NVML's by UUID (inventory.gpu_map); before that, NVML's GPUs in the order
        CUDA_VISIBLE_DEVICES gives them (the order torch will use; a MIG instance as itself), and all of
        them for a torch without CUDA (gpumem.nvml_targets). On an accelerator NVML does not see (MPS,
        XPU, ROCm's AMD GPUs, a PrivateUse1 backend), torch's devices (gpumem.accelerator_targets).
        Called on the main thread only (at start, and after a cell that changed the accelerator's
        state): gpu_map asks torch under ``warnings.catch_warnings``, which is process-wide."""
        from ..gpus import inventory

        self._targets_state = _watch_state()
        kind, state = self._targets_state
        if kind != "cuda" or state.startswith("rocm"):
            return gpumem.accelerator_targets()
        if state == "initialised":
            mappings = inventory.gpu_map()
            if mappings:
                return gpumem.targets_from(mappings)
        return gpumem.nvml_targets(state)

    def _retarget(self) -> None:
        """Work the targets out again when the accelerator's state changed (say, the cell's first
        ``.cuda()``)."""
        if _watch_state() == self._targets_state:
            return
        targets = self._targets()
        if self._panel is not None:
            self._panel.sampler.set_targets(targets)
        if self._cells is not None:
            self._cells.targets = tuple(targets)

    def _update_snapshot(self, final: bool = False) -> None:
        """Rewrite the panel output's static snapshot (what a saved notebook keeps). While the panel is
        live the output keeps its widget view too; ``final``: the snapshot alone, the view being gone.
        Where the frontend cannot rewrite an output in place (a terminal, shown the panel by
        ``--widget``) an update would print the whole snapshot again after every cell: there only the
        final one is printed, once, when the panel stops."""
        live, handle = self._panel, self._display
        if live is None or handle is None or (not final and not shows_widgets(self.shell)):
            return
        try:
            if final:
                handle.update(live.static_bundle(), raw=True)
            else:
                handle.update(live.widget)
        except Exception:  # noqa: BLE001 - a frontend gone away must not break a cell
            return
        self._snapshot_at = time.monotonic()

    # ---- --cluster ---------------------------------------------------------------------------------
    def _cluster(self, args: Any, interval: Optional[float]) -> Any:
        """``--cluster``: text mode prints one per-engine table; the panel is a widget the
        :class:`~torchgpu_magic.cluster.memory.ClusterSampler` thread updates, with each notebook cell's
        peaks per engine collected on its next tick (the notebook never waits for the engines)."""
        from ..cluster import DEFAULT_TIMEOUT
        from ..cluster.memory import ClusterSampler

        if args.records or args.cells is not None or args.refresh is not None:
            raise MagicInputError("--cluster takes --interval, --text / --widget and -o")
        bridge = self.cluster_bridge(args.cluster)
        self._stop_cluster()
        sampler = ClusterSampler(bridge, interval or 1.0)
        first = sampler.tick(DEFAULT_TIMEOUT)  # the engines' first call imports torch and this package
        if self._wants_text(args.text, args.widget):
            return show(first, args.output)
        from ..gpumem import panel

        view = panel.ClusterPanel(first._repr_html_())
        sampler.on_update = view.update
        self._cluster_live = (sampler, view)
        self.shell.events.register("post_run_cell", self._cluster_cell)
        self.add_closer(self._stop_cluster)
        sampler.start()
        display(view.widget)
        return first if args.output else None

    def _cluster_cell(self, result: Any = None) -> None:
        """post_run_cell while the cluster panel runs: the next tick collects this cell's peaks."""
        live = self._cluster_live
        if live is not None:
            live[0].note_cell(f"[{getattr(result, 'execution_count', None) or '?'}]")

    def _stop_cluster(self) -> None:
        """Stop the cluster sampler (bounded wait), close its panel, unhook its cell event."""
        live, self._cluster_live = self._cluster_live, None
        callbacks = self.shell.events.callbacks.get("post_run_cell", [])
        if self._cluster_cell in callbacks:
            self.shell.events.unregister("post_run_cell", self._cluster_cell)
        if live is not None:
            sampler, view = live
            sampler.stop()
            view.close()

    def _stop(self) -> None:
        """Stop the sampler, close the panel (its output keeps the last snapshot), stop the per-cell
        lines and unhook the cell events (also the unload closer)."""
        self._text = False
        live = self._panel
        if live is not None:
            live.close()  # calls _on_panel_closed
        self._unhook_cells()

    def _on_panel_closed(self) -> None:
        """The panel closed (by `%gpumem stop`, unload, or its widget's close()): keep its last state in
        its output and unhook with it."""
        self._update_snapshot(final=True)
        self._panel = None
        self._display = None
        self._unhook_cells()

    # ---- the cell events --------------------------------------------------------------------------
    def _grew(self, record: Any, source: str) -> Optional[str]:
        """The warning when this cell, run again and again, grew memory each time (once per streak)."""
        watch = self._growth
        if watch is None:
            return None
        try:
            return watch.observe(record, source, self.shell.user_ns)
        except Exception as exc:  # noqa: BLE001 - the warning must never break a cell
            return f"[gpumem] could not check this cell's growth ({type(exc).__name__}: {exc})"

    def _hook_cells(self) -> None:
        """Start per-cell accounting: a fresh cell log, fed by the pre/post_run_cell events."""
        from ..gpumem.growth import GrowthWatch

        self._cells = gpumem.CellLog(targets=self._panel.sampler.targets if self._panel else self._targets())
        self._growth = GrowthWatch()
        self.shell.events.register("pre_run_cell", self._pre_cell)
        self.shell.events.register("post_run_cell", self._post_cell)

    def _unhook_cells(self) -> None:
        """Stop per-cell accounting and unregister its events, keeping the records; a no-op when off."""
        log, self._cells = self._cells, None
        self._growth = None
        if log is None:
            return
        log.close()
        self._records = log.records
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
        """post_run_cell: the cell's record; then, by mode, its line printed, or the panel told (and, in
        cell-refresh mode, redrawn here on the main thread)."""
        log = self._cells
        if log is None:
            return
        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        record = log.finish(getattr(result, "execution_count", None), source)
        self._retarget()
        if record is None:
            return
        warning = self._grew(record, source)
        if self._text:
            print(record.line())
            if warning:
                print(warning)
            return
        live = self._panel
        if live is None:
            return
        live.sampler.note_cell(record)
        live.show_cells(log.records, warning=warning)
        if self._cell_refresh:
            live.refresh()
        if time.monotonic() - self._snapshot_at >= SNAPSHOT_EVERY:
            self._update_snapshot()
