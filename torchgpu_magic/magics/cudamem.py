"""``%%cudamem``: a cell's memory by category and module, measured, or predicted for a GPU you don't have."""
from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any, Optional

from IPython.core.error import UsageError
from IPython.core.magic import cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from .. import devices
from ..errors import MagicInputError
from .base import MagicsPart, parse_args, usage_errors
from .shell import register_cell, show

DEVICES = ("cpu", "cuda", "mps", "xpu")
"""The devices a measured run reports (those here), and those --predict predicts for (a GPU you need not
have; mps and xpu with their own capacity)."""


@magics_class
class CUDAMemMagics(MagicsPart):
    """``%%cudamem`` (any accelerator: CUDA, ROCm, MPS, XPU; the name stays): the tracking, prediction and
    reports are :mod:`torchgpu_magic.memory`'s
    (``tracking``, ``prediction``, ``cellmem``); this class reads the options, compiles the cell as IPython
    would, finds the names it uses, and shows or returns the report."""

    @magic_arguments()
    @argument("device", nargs="?", default=None, metavar="DEVICE",
              help="cpu, cuda, cuda:N, mps, xpu or xpu:N (any accelerator: the name stays %%cudamem). "
                   "Measured: the device to report (default: the one with the highest peak). --predict / "
                   "--fit: the device to predict for (default cuda; no GPU needed)")
    @argument("--predict", action="store_true",
              help="run the cell on fake copies of what it uses (FakeTensorMode): nothing real is "
                   "allocated, moved or changed, and the figures are a prediction for DEVICE")
    @argument("--capacity", metavar="SIZE",
              help="the device memory to compare with, e.g. 80GiB, 24GB (default: the device's own when "
                   "torch knows it; total RAM for cpu)")
    @argument("--fit", metavar="NAME[,NAME...]",
              help="predict at several first dimensions of these tensors (the batch) and report the "
                   "largest that fits the capacity (implies --predict)")
    @argument("--arch", metavar="GEN",
              help="the GPU generation predicted for, for the CUDA context and cuBLAS workspace "
                   "allowances: volta, turing, ampere, ada, hopper, blackwell, sm_90 or 9.0 (default: the "
                   "GPU's own when there is one)")
    @argument("--compare", action="store_true",
              help="predict the step for DEVICE (default: the device the cell's model or tensors are on), "
                   "then measure it there, and show both side by side on one scale")
    @argument("--svg", metavar="FILE",
              help="also save the picture of memory over the step to FILE, an .svg file (with --compare: "
                   "both side by side; with --fit: at the largest batch that fits)")
    @argument("--top", type=int, default=8, metavar="N",
              help="modules shown in the by-module table (default 8; 0: all)")
    @argument("-o", dest="output", action="store_true",
              help="return the report object; its .series is the memory over the step's events "
                   "(.series.to_pandas(), .series.to_dict())")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @usage_errors
    @cell_magic
    def cudamem(self, line: str, cell: str) -> Any:
        """A training step's memory by category and module, drawn over the step, and whether it fits:
        measured (torch's MemTracker), predicted for DEVICE without one (``--predict``), or both side by
        side (``--compare``); ``--fit NAME`` finds the largest batch that fits.

        Reference: https://github.com/torchgpu-magic/torchgpu-magic/blob/main/docs/cudamem.md
        """
        from ..cudamem import StepComparison, prediction, run, targetdevice

        args = parse_args(self.cudamem, line)
        if args.top < 0:
            raise UsageError(f"%cudamem: --top takes 0 (all) or a positive count; got {args.top}")
        if args.compare and (args.predict or args.fit is not None):
            raise UsageError("%cudamem: --compare predicts the step and then measures it; leave out "
                             "--predict and --fit")
        svg = _svg_path(args.svg) if args.svg is not None else None
        capacity = targetdevice.parse_size(args.capacity) if args.capacity is not None else None
        cc = targetdevice.parse_arch(args.arch) if args.arch is not None else None
        fit_names = self._fit_names(args.fit)
        predicting = args.predict or fit_names is not None
        target = targetdevice.resolve_target(self._predicted_device(args.device)) if predicting else None
        measured_on = None if predicting or args.device is None else self._measured_device(args.device)
        run.tracker_class()  # a torch without MemTracker: one line, before anything runs
        code, tree, filename = self._compile(cell, line)
        ns = self.shell.user_ns
        names = prediction.names_read(tree, ns)
        if (predicting or args.compare) and any(isinstance(node, ast.Name) and node.id == "get_ipython"
                                                for node in ast.walk(tree)):
            flag = "--compare" if args.compare else "--predict"
            raise UsageError(f"%cudamem: {flag} does not run IPython magics or shell commands inside the "
                             "cell (they would act on your real namespace); leave them out of it")
        values = [(n, ns[n]) for n in names]
        if args.compare:
            device = args.device or run.home_device(run.find_objects(values))
            target = targetdevice.resolve_target(self._predicted_device(device))
            measured_on = self._measured_device(device)
        if fit_names is not None:
            outcome: Any = prediction.fit(code, filename, ns, names, target, fit_names, capacity, cc,
                                          args.top)
        elif predicting:
            outcome = prediction.predict(code, filename, ns, names, target, capacity, cc, args.top)
        elif args.compare:
            predicted = prediction.predict(code, filename, ns, names, target, capacity, cc, args.top)
            outcome = StepComparison(self._measure(code, filename, values, measured_on, capacity, args.top),
                                     predicted)
        else:
            outcome = self._measure(code, filename, values, measured_on, capacity, args.top)
        if svg is not None:
            _save_svg(outcome, svg, args.quiet)
        return show(outcome, args.output, args.quiet)

    @staticmethod
    def _fit_names(text: Optional[str]) -> Optional[list]:
        """``--fit x,y`` -> ['x', 'y']; names must be identifiers."""
        if text is None:
            return None
        names = [n.strip() for n in text.split(",")]
        if not all(n.isidentifier() for n in names):
            raise UsageError(f"%cudamem: --fit takes names of tensors separated by commas (e.g. --fit x or "
                             f"--fit input_ids,labels); got {text!r}")
        return names

    @staticmethod
    def _measured_device(spec: str) -> str:
        """DEVICE for a measured run: a device that exists here ('cuda' -> 'cuda:N', the current GPU),
        checked as every magic checks a device; for one absent here, the --predict that predicts for it
        (in the words --predict takes: 'cuda' for 'gpu')."""
        try:
            return str(devices.device_option(spec, DEVICES))
        except MagicInputError as exc:
            meant = getattr(exc, "meant", None)
            hint = ""
            if meant is not None and meant.split(":")[0] in DEVICES:
                try:
                    devices.device_option(meant, DEVICES)
                except MagicInputError:  # absent here: predicting for it needs no GPU
                    hint = f"; to predict for it without one, use --predict {meant}"
            raise UsageError(f"%cudamem: {exc}{hint}") from None

    @staticmethod
    def _predicted_device(spec: Optional[str]) -> str:
        """DEVICE for --predict / --fit (default cuda): any spelling of cpu, cuda, cuda:N, mps, xpu or
        xpu:N, checked as every magic checks a device, without needing one here."""
        try:
            return str(devices.device_option(spec or "cuda", DEVICES, exists=False))
        except MagicInputError as exc:
            raise UsageError(f"%cudamem: --predict: {exc}") from None

    def _compile(self, cell: str, line: str) -> tuple:
        """``(code, ast, filename)`` of the cell, transformed as IPython runs cells and registered so that
        tracebacks show its lines, numbered as the cell shows them: a comment line stands for the magic's
        own line. A syntax error is one line."""
        shell = self.shell
        source = f"# %%cudamem {line}".rstrip() + "\n" + shell.transform_cell(cell)
        filename = register_cell(shell, source)
        try:
            tree = shell.transform_ast(shell.compile.ast_parse(source, filename))
            code = shell.compile(tree, filename, "exec")
        except SyntaxError as exc:
            raise UsageError(f"%cudamem: the cell has a syntax error: line {exc.lineno}: {exc.msg}") from None
        return code, tree, filename

    def _measure(self, code: Any, filename: str, values: list, device: Optional[str], capacity: Optional[int],
                 top: int) -> Any:
        """The real run, tracked; the cell's own error shows from the cell's lines, as in any cell."""
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of the cell's traceback
        from ..cudamem import run, targetdevice

        ns = self.shell.user_ns
        try:
            outcome = run.measure(lambda: exec(code, ns), values, device, top, filename)
        except Exception as exc:  # the cell's own error: its traceback from the cell's frame
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != filename:
                tb = tb.tb_next
            if tb is None:
                raise
            raise exc.with_traceback(tb)  # noqa: B904 - the same exception, our frames left out
        kind = outcome.device.split(":")[0]
        if capacity is not None:
            outcome.capacity, outcome.capacity_source = capacity, "--capacity"
        elif kind == "cpu":
            outcome.capacity, outcome.capacity_source = targetdevice.host_capacity()
        elif kind == "cuda":
            facts = targetdevice.device_facts(targetdevice.resolve_target(outcome.device))
            outcome.capacity, outcome.capacity_source = facts[0], facts[1]
        return outcome


def _svg_path(text: str) -> Path:
    """``--svg FILE``: a writable path ending in .svg in a directory that exists, checked before the cell
    runs; anything else is a one-line error."""
    path = Path(text).expanduser()
    if path.suffix.lower() != ".svg":
        raise UsageError(f"%cudamem: --svg takes a file name ending in .svg (e.g. --svg step.svg); "
                         f"got {text!r}")
    if path.is_dir():
        raise UsageError(f"%cudamem: --svg {text!r} is a directory; give a file name in it, e.g. "
                         f"{str(path / 'step.svg')!r}")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"%cudamem: --svg: there is no directory {str(folder)!r} to write {path.name!r} "
                         f"into")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"%cudamem: --svg: {str(path)!r} cannot be written here (permission denied)")
    return path.resolve()


def _save_svg(outcome: Any, path: Path, quiet: bool) -> None:
    """Write ``outcome``'s picture (for --fit, the one at the largest batch that fits) to ``path``."""
    from ..cudamem import FitResult

    if isinstance(outcome, FitResult):
        if outcome.at_best is None:
            raise UsageError("%cudamem: --svg: no batch fits, so there is no step to draw")
        outcome = outcome.at_best
    picture = outcome.picture()
    try:
        path.write_text(picture.to_svg(), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"%cudamem: --svg: cannot write {str(path)!r}: {exc.strerror or exc}") from None
    if not quiet:
        print(f"%%cudamem: the picture is saved to {path}")

