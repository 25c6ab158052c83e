"""``%whereis``: where tensors, modules and optimizers live.

Besides the magic, two opt-in hooks: ``--watch`` (a line after each cell) and ``--repr`` (a placement line
above tensors and modules shown as a result). Why a cell mixed devices is explained above its traceback,
always on (:mod:`.explainers`).
"""
from __future__ import annotations

import html
from typing import Any, Callable, Optional

from IPython.core.error import UsageError
from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.lib.pretty import _repr_pprint

from .. import devices, placement
from ..errors import MagicInputError
from .base import MagicsPart, TorchGPUMagics, parse_args, usage_errors
from .shell import show


@magics_class
class WhereIsMagics(MagicsPart):
    """``%whereis`` and its hooks; it only reads the namespace, through :mod:`torchgpu_magic.placement`."""

    def __init__(self, shell: Any, owner: TorchGPUMagics) -> None:
        super().__init__(shell, owner)
        self._snapshot: Optional[dict] = None  # the namespace as of the last cell, while --watch is on
        self._snapshot_cache: Any = None  # --watch's own placement.SnapshotCache, while it is on
        self._saved_printers: Optional[list] = None  # the display printers --repr on replaced, to put back

    @magic_arguments()
    @argument("names", nargs="*", metavar="NAME",
              help="tensor / module / optimizer to show in detail: NAME, NAME.attr, NAME[0], NAME['key']")
    @argument("--watch", choices=("on", "off"), default=None,
              help="after each cell, one line naming the tensors and modules it created or moved")
    @argument("--repr", dest="repr_", choices=("on", "off"), default=None,
              help="a placement line above the repr of tensors and modules shown as a cell's result")
    @argument("--device", default=None, metavar="D",
              help="the table: only what is on device D (cpu, cuda:0, meta...)")
    @argument("--sort", choices=("bytes", "name"), default=None,
              help="the table: largest first (data + gradients), or by name; default: namespace order")
    @argument("--top", type=int, default=None, metavar="N",
              help="the table: the first N rows per device, then one line for the rest; 0: all "
                   "(default 100)")
    @argument("-o", dest="return_report", action="store_true",
              help="return the report object instead of displaying it")
    @argument("--cluster", nargs="?", const="", default=None, metavar="CLIENT",
              help="each engine's placement, merged by name, for the ipyparallel Client/view or Dask "
                   "Client CLIENT (without it: the one in the namespace)")
    @argument("--timeout", type=float, default=None, metavar="S",
              help="with --cluster: seconds each engine may take (default 30)")
    @line_magic
    @usage_errors
    def whereis(self, line: str = "") -> Any:
        """Where tensors, modules and optimizers live: ``%whereis`` (the whole namespace, by device),
        ``%whereis NAME`` (one object in detail), ``--watch on|off``, ``--repr on|off``. It only reads.

        Reference: https://github.com/torchgpu-magic/torchgpu-magic/blob/main/docs/whereis.md
        """
        args = parse_args(self.whereis, line)
        if args.cluster is not None and (args.watch or args.repr_):
            raise UsageError("%whereis: --watch / --repr act on this kernel; they do not go with --cluster")
        if (args.watch or args.repr_) and args.names:
            raise UsageError("%whereis: --watch / --repr take no NAME; use them alone: %whereis --watch on")
        if args.watch or args.repr_:
            if args.return_report:
                raise UsageError("%whereis: -o returns a report; it does not go with --watch / --repr")
            if args.watch:
                self._watch(args.watch == "on")
            if args.repr_:
                self._repr(args.repr_ == "on")
            return None
        ns = self.shell.user_ns
        table_options = args.device is not None or args.sort is not None or args.top is not None
        if args.names and table_options:
            raise UsageError("%whereis: --device / --sort / --top shape the table; use them without NAME")
        if args.top is not None and args.top < 0:
            raise UsageError(f"%whereis: --top takes a count of rows (0: all), not {args.top}")
        device = None
        if args.device is not None:  # with --cluster the engines' devices: its spelling only
            try:
                device = str(devices.device_option(args.device, devices.KINDS, exists=args.cluster is None))
            except MagicInputError as exc:
                raise UsageError(f"%whereis: --device: {exc}") from None
        if args.cluster is not None:
            report = self._cluster(args)
        elif args.names:
            reports = [placement.describe(name, placement.resolve(name, ns), ns) for name in args.names]
            report = reports[0] if len(reports) == 1 else reports
        else:
            top = placement.DEFAULT_TOP if args.top is None else (args.top or None)
            report = placement.namespace_report(ns, device=device, sort=args.sort, top=top)
        if args.return_report or not isinstance(report, list):
            return show(report, args.return_report)
        for item in report:
            show(item)
        return None

    def _cluster(self, args: Any) -> Any:
        """``--cluster``: every engine's placement merged by name. A CLIENT that is no cluster object
        is read as the first NAME, so ``%whereis --cluster model`` works with the one cluster there."""
        from .. import cluster

        ns = self.shell.user_ns
        name, names = args.cluster, list(args.names)
        if name and name not in cluster.candidates(ns) and cluster.candidates(ns):
            name, names = "", [name, *names]
        bridge = self.cluster_bridge(name)
        return cluster.placement_report(bridge, names,
                                        cluster.DEFAULT_TIMEOUT if args.timeout is None else args.timeout)

    def _close(self) -> None:
        """Unload: stop --watch and put back the printers --repr replaced."""
        try:
            self._watch(False)
        finally:
            self._repr(False)

    def _watch(self, on: bool) -> None:
        """--watch on|off: hook :meth:`_watch_cell` after each cell (from a fresh snapshot), or unhook it."""
        registered = self._watch_cell in self.shell.events.callbacks["post_run_cell"]
        if on:
            if self._snapshot_cache is None:
                self._snapshot_cache = placement.SnapshotCache()
            self._snapshot = placement.namespace_snapshot(self.shell.user_ns, self._snapshot_cache)
            if not registered:
                self.shell.events.register("post_run_cell", self._watch_cell)
            self.add_closer(self._close)
        else:
            self._snapshot = self._snapshot_cache = None
            if registered:
                self.shell.events.unregister("post_run_cell", self._watch_cell)

    def _watch_cell(self, result: Any = None) -> None:
        """post_run_cell: one line naming what the cell created or moved (nothing when nothing did)."""
        before = self._snapshot or {}
        after = placement.namespace_snapshot(self.shell.user_ns, self._snapshot_cache)
        self._snapshot = after
        changes = placement.changed(before, after)
        if changes:
            print(placement.watch_line(changes, before))

    def _repr(self, on: bool) -> None:
        """--repr on: register text/plain and text/html printers for tensors and modules that put a
        placement line above whatever printer was there before (kept, and put back by --repr off)."""
        formatters = self.shell.display_formatter.formatters
        if not on:
            for mime, cls, had, old, deferred in reversed(self._saved_printers or []):
                fmt = formatters[mime]
                if getattr(fmt.type_printers.get(cls), "_torchgpu_whereis", False):
                    if had:
                        fmt.type_printers[cls] = old
                    else:
                        fmt.type_printers.pop(cls, None)
                    if deferred is not None:
                        fmt.deferred_printers[(cls.__module__, cls.__name__)] = deferred
            self._saved_printers = None
            return
        if self._saved_printers is not None:
            return
        import torch

        saved = []
        for mime in ("text/plain", "text/html"):
            fmt = formatters[mime]
            wrap = _plain_printer if mime == "text/plain" else _html_printer
            for cls in (torch.Tensor, torch.nn.Module):
                deferred = fmt.deferred_printers.pop((cls.__module__, cls.__name__), None)
                had = cls in fmt.type_printers
                old = fmt.type_printers.get(cls)
                saved.append((mime, cls, had, old, deferred))
                fmt.type_printers[cls] = wrap(old if had else deferred)
        self._saved_printers = saved
        self.add_closer(self._close)


def _plain_printer(previous: Optional[Callable[..., Any]]) -> Callable[..., Any]:
    """A text/plain printer: the placement line, then what ``previous`` (or the plain repr) prints."""

    def printer(obj: Any, p: Any, cycle: bool) -> None:
        p.text(placement.placement_line(obj))
        p.break_()
        (previous or _repr_pprint)(obj, p, cycle)

    printer._torchgpu_whereis = True  # type: ignore[attr-defined]
    return printer


def _html_printer(previous: Optional[Callable[..., Any]]) -> Callable[..., Any]:
    """A text/html printer: the placement line above ``previous``'s HTML, or above the escaped repr."""

    def printer(obj: Any) -> str:
        body = previous(obj) if previous is not None else None
        if body is None:
            body = f"<pre>{html.escape(repr(obj))}</pre>"
        line = html.escape(placement.placement_line(obj))
        return f'<div class="torchgpu-magic-note"><b>{line}</b></div>{body}'

    printer._torchgpu_whereis = True  # type: ignore[attr-defined]
    return printer
