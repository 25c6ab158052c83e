"""``%%cudatime``: time a cell, or one statement, correctly on a GPU."""
from __future__ import annotations

import ast
import contextlib
import re
from typing import Any, Optional

from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.magic import line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from .. import devices
from ..errors import MagicInputError
from .base import MagicsPart, parse_args, usage_errors
from .shell import register_cell, show

TIMED = ("auto", "local", "cpu", "cuda", "mps", "xpu")
"""The devices ``--devices`` takes: any but meta."""
NOTHING_TO_TIME = ("holds no data and runs no kernels, so there is nothing to time (%timeit measures the "
                   "dispatch overhead of meta tensors)")


@magics_class
class CUDATimeMagics(MagicsPart):
    """``%%cudatime`` and ``%cudatime``: the measuring is :mod:`torchgpu_magic.timing`'s; this class splits
    the options from the statement, compiles the cell the way IPython would, runs one measurement per
    ``--devices`` / ``--threads`` row, and keeps what the cell prints to its first run."""

    @magic_arguments()
    @argument("-n", dest="loops", type=int, metavar="LOOPS",
              help="loops per sample (default: the 1-2-5 sequence until one sample lasts >= 1 ms)")
    @argument("-r", dest="samples", type=int, metavar="SAMPLES",
              help="exactly this many samples (default: >= 7 samples and 0.2 s, then until the median's "
                   "95%% CI is within +-1%%, or IQR/median < 2%%)")
    @argument("--warmup", type=int, metavar="N",
              help="run the cell N times to warm up (default: until the median of the last 3 runs moves "
                   "< 2%%, at most 1 s; 0 skips it)")
    @argument("--max-time", dest="max_time", type=float, default=10.0, metavar="S",
              help="stop sampling after S seconds and say 'not converged' (default 10)")
    @argument("-o", dest="output", action="store_true", help="return the result object")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @argument("--cold", action="store_true",
              help="synchronize after every loop, so each run starts on an idle GPU (an event pair per loop)")
    @argument("--flush-l2", dest="flush_l2", action="store_true",
              help="overwrite twice the L2 cache (the last-level cache on cpu and xpu) before every loop, "
                   "untimed")
    @argument("--devices", metavar="LIST",
              help="comma-separated devices to run the cell on, one row each (e.g. cpu,cuda:0)")
    @argument("--threads", metavar="LIST",
              help="comma-separated torch CPU thread counts, one row each (e.g. 1,4,16); restored after")
    @argument("--kernels", action="store_true",
              help="add a separate torch.profiler pass listing the top kernels (cpu: ops)")
    @argument("--no-roofline", dest="no_roofline", action="store_true",
              help="skip the extra, untimed run that counts FLOPs and bytes (for a cell that must not run "
                   "again: one that appends, trains, sends...)")
    @argument("--peak", metavar="FLOPS[,BYTES_PER_S]",
              help="peak FLOP/s (and bytes/s) to give the percentage against, in place of the GPU table's "
                   "(e.g. 1.5e12,2e11 or 1.5T,200G); on cpu the only way to get one")
    @argument("--cluster", nargs="?", const="", default=None, metavar="NAME",
              help="time the cell on every engine of the ipyparallel Client/view or Dask Client NAME at "
                   "once (without NAME: the one in the namespace); a row per engine and the spread")
    @argument("--timeout", type=float, default=None, metavar="S",
              help="with --cluster: seconds each engine may take (default 30 + 2 x --max-time)")
    @argument("statement", nargs="*",
              help="cell magic: setup run once before timing; line magic: the statement to time "
                   "(put -- before a statement that starts with '-')")
    @usage_errors
    @line_cell_magic
    def cudatime(self, line: str = "", cell: Optional[str] = None) -> Any:
        """Time a cell (``%%cudatime [options] [setup]``) or one statement correctly on a GPU, whichever torch
        runs on (CUDA, ROCm, Apple MPS, Intel XPU: the name stays %%cudatime): the backend's events for the
        device time, beside host enqueue and synchronized wall time; the first run apart, samples until the
        median is known to +-1 %; FLOP/s and bytes/s against the device's peak (the roofline).

        Reference: https://github.com/torchgpu-magic/torchgpu-magic/blob/main/docs/cudatime.md
        """
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of the cell's traceback
        from .. import timing

        opts_text, statement = self._split(line)
        args = parse_args(self.cudatime, opts_text)
        if cell is None and not statement.strip():
            raise UsageError("%cudatime: no statement to time. Usage: %cudatime [options] STATEMENT, "
                             "or %%cudatime [options] [setup] with the cell below")
        opts = timing.Options(loops=args.loops, samples=args.samples, warmup=args.warmup,
                              max_time=args.max_time, cold=args.cold, flush_l2=args.flush_l2,
                              kernels=args.kernels, roofline=not args.no_roofline,
                              peak=None if args.peak is None else timing.parse_peak(args.peak))
        opts.check()
        setup, body = (statement, cell) if cell is not None else ("", statement)
        magic = "%%cudatime" if cell is not None else "%cudatime"
        if args.cluster is not None:
            return self._cluster(args, opts, setup, body, magic)
        targets = ([self._device(spec) for spec in self._items(args.devices, "--devices")]
                   if args.devices is not None else [timing.timing_device()])
        for device in targets:
            timing.check_device(device, args.flush_l2)
        threads = ([self._thread_count(text) for text in self._items(args.threads, "--threads")]
                   if args.threads is not None else [None])
        compiled = self._compile(setup, body, cell is not None)
        rows = []
        try:
            for device in targets:
                for count in threads:
                    result = self._row(compiled, device, count, opts, args.devices is not None,
                                                show_output=not rows)
                    label = str(device) + ("" if count is None else f", {count} thread{'s' * (count != 1)}")
                    result.magic = magic
                    rows.append((label, result))
        except Exception as exc:  # the cell's own error: show it from the cell's frame, as %time would
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != compiled.filename:
                tb = tb.tb_next
            if tb is None:
                raise
            raise exc.with_traceback(tb)  # noqa: B904 - the same exception, with our frames left out
        outcome = rows[0][1] if len(rows) == 1 and args.devices is None and args.threads is None \
            else timing.TimingComparison(rows, magic)
        return show(outcome, args.output, args.quiet)

    def _cluster(self, args: Any, opts: Any, setup: str, body: str, magic: str) -> Any:
        """``--cluster``: the cell timed on every engine at once, in each engine's namespace
        (:func:`torchgpu_magic.cluster.time_cell`); shown, or returned with ``-o``. ``magic``: the form
        the user typed, which an interrupt's line names."""
        from .. import cluster

        if args.threads is not None:
            raise UsageError("%cudatime: --threads does not go with --cluster (time each engine as it is)")
        devices = self._items(args.devices, "--devices") if args.devices is not None else [None]
        if len(devices) > 1:
            raise UsageError("%cudatime: with --cluster, --devices takes one device (each engine's own "
                             "cuda:N, or local)")
        if devices[0] is not None:
            self._device(devices[0], here=False)
        bridge = self.cluster_bridge(args.cluster)
        bridge.magic = magic
        options = {name: getattr(opts, name) for name in ("loops", "samples", "warmup", "max_time", "cold",
                                                          "flush_l2", "kernels", "roofline", "peak")}
        outcome = cluster.time_cell(bridge, setup, body, options, devices[0], args.timeout)
        return show(outcome, args.output, args.quiet)

    def _split(self, line: str) -> tuple:
        """Split the magic's line into (options, statement): options are the leading tokens that look like
        options (with their values); the statement is the rest, verbatim (quotes and spacing kept, which
        ``parse_argstring`` would not do). ``--`` ends the options explicitly."""
        actions = self.cudatime.parser._option_string_actions
        longs = [name for name in actions if name.startswith("--")]
        tokens = list(re.finditer(r"\S+", line))
        index = 0
        while index < len(tokens):
            token = tokens[index].group()
            if token == "--":
                return line[:tokens[index].start()], line[tokens[index].end():].strip()
            if not re.match(r"--?[A-Za-z]", token):
                return line[:tokens[index].start()], line[tokens[index].start():].strip()
            name = token.split("=", 1)[0]
            if name not in actions and name.startswith("--"):
                matches = [long for long in longs if long.startswith(name)]
                name = matches[0] if len(matches) == 1 else name
            action = actions.get(name) or (actions.get(token[:2]) if not token.startswith("--") else None)
            attached = "=" in token or (not token.startswith("--") and len(token) > 2)
            index += 1
            if action is not None and action.nargs not in (0, "?") and not attached:
                index += 1  # the option's value
            elif action is not None and action.nargs == "?" and not attached and index < len(tokens) \
                    and self._names_cluster(tokens, index):
                index += 1  # --cluster NAME: an optional value, a name when there is one
        return line, ""

    def _names_cluster(self, tokens: list, index: int) -> bool:
        """Whether the word after ``--cluster`` is its NAME rather than the setup statement's first word
        (``%%cudatime --cluster x = torch.ones(8)``): an identifier that holds a cluster object, or one
        followed by nothing or by an option."""
        from ..cluster import kind_of

        word = tokens[index].group()
        if not word.isidentifier():
            return False
        if word in self.shell.user_ns and kind_of(self.shell.user_ns[word]):
            return True
        return index + 1 == len(tokens) or bool(re.match(r"--?[A-Za-z]", tokens[index + 1].group()))

    @staticmethod
    def _items(text: str, option: str) -> list:
        """The items of a comma-separated ``--devices`` / ``--threads`` LIST; a blank one is a UsageError."""
        items = [item.strip() for item in text.split(",")]
        if not all(items):
            raise UsageError(f"%cudatime: {option} takes a comma-separated list without blanks, e.g. "
                             f"{'cpu,cuda:0' if option == '--devices' else '1,4,16'}; got {text!r}")
        return items

    @staticmethod
    def _device(spec: str, here: bool = True) -> Any:
        """One ``--devices`` item, checked by :func:`~torchgpu_magic.devices.device_option` (meta, which
        runs no kernels, is refused); with ``here`` False (``--cluster``: each engine resolves it on its
        own GPUs) only its spelling. A bad one is a UsageError naming the devices --devices takes."""
        try:
            return devices.device_option(spec, TIMED, here, {"meta": NOTHING_TO_TIME})
        except MagicInputError as exc:
            raise UsageError(f"%cudatime: --devices: {exc}") from None

    @staticmethod
    def _thread_count(text: str) -> int:
        """One ``--threads`` item as a thread count, 1 to 4096."""
        if not text.isdigit() or not 1 <= int(text) <= 4096:
            raise UsageError(f"%cudatime: --threads takes whole numbers from 1 to 4096 (e.g. 1,4,16); "
                             f"got {text!r}")
        return int(text)

    def _compile(self, setup: str, body: str, is_cell: bool) -> Any:
        """Transform and compile once (as %timeit does), registering the source so tracebacks show the
        cell's lines: for the cell magic, line 1 is the setup (on the magic's line) and the body follows."""
        from .. import timing

        shell = self.shell
        setup_src = shell.transform_cell(setup) if setup.strip() else ""
        body_src = shell.transform_cell(body)
        offset = max(1, setup_src.count("\n")) if is_cell else 0
        source = (setup_src.rstrip("\n") + "\n" + body_src) if is_cell else body_src
        filename = register_cell(shell, source)
        start = 0  # the line the part being parsed starts after: the setup, then the body
        try:
            setup_ast = shell.compile.ast_parse(setup_src or "pass", filename)
            start = offset
            body_ast = shell.compile.ast_parse(body_src, filename)
        except SyntaxError as exc:
            exc.lineno = (exc.lineno or 1) + start
            if getattr(exc, "end_lineno", None):
                exc.end_lineno += start
            raise CellSyntaxError(exc, shell) from None
        ast.increment_lineno(body_ast, offset)
        setup_ast = shell.transform_ast(setup_ast)
        body_ast = shell.transform_ast(body_ast)
        try:
            return timing.compile_cell(body_ast, shell.user_ns, setup_ast, filename)
        except SyntaxError as exc:  # found by the compiler ('return' outside a function...)
            if exc.filename != filename:
                raise
            raise CellSyntaxError(exc, shell) from None

    def _row(self, compiled: Any, device: Any, threads: Optional[int], opts: Any,
               switch: bool, show_output: bool) -> Any:
        """One measurement: on ``device`` (switched to it when ``--devices`` named it) with ``threads``
        CPU threads (when ``--threads`` named them); torch's state is restored however it ends."""
        import torch

        from .. import timing

        saved_threads = torch.get_num_threads()
        try:
            with devices.use_device(device) if switch else contextlib.nullcontext():
                if threads is not None:
                    torch.set_num_threads(threads)
                return timing.time_cell(compiled, device, opts, self._silence, show_output,
                                        follow_cuda=not switch)
        finally:
            if threads is not None:
                torch.set_num_threads(saved_threads)

    def _silence(self) -> Any:
        """A context that discards what the cell prints or displays (every run after the first: a cell
        run a thousand times must not print a thousand times, nor keep the output in memory)."""
        from .. import timing

        shell = self.shell
        stack = contextlib.ExitStack()
        quiet = DisplayPublisher(shell=shell)
        quiet.publish = lambda *args, **kwargs: None
        quiet.clear_output = lambda *args, **kwargs: None
        saved = shell.display_pub
        shell.display_pub = quiet
        stack.callback(setattr, shell, "display_pub", saved)
        stack.enter_context(timing.silenced())
        return stack


class CellSyntaxError(Exception):
    """A SyntaxError in the timed statement or setup, shown the way IPython shows one in a cell (the
    cell's line and a caret) rather than from the package's frames: IPython renders an exception
    through ``_render_traceback_`` when it has one. ``.error`` is the SyntaxError itself."""

    def __init__(self, error: SyntaxError, shell: Any) -> None:
        super().__init__(f"{error.msg} (line {error.lineno})")
        self.error = error
        self._syntax_tb = shell.SyntaxTB

    def _render_traceback_(self) -> list:
        return self._syntax_tb.structured_traceback(SyntaxError, self.error, [])
