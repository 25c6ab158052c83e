"""``%%cudamem``: a cell's memory by category and module, measured, or predicted for a GPU you don't have."""
from __future__ import annotations

from typing import Any, Optional

from IPython.core.error import UsageError
from IPython.core.magic import cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from .base import MagicsPart, parse_args, usage_errors
from .shell import register_cell, show


@magics_class
class CUDAMemMagics(MagicsPart):
    """``%%cudamem``: the tracking, prediction and reports are :mod:`torchgpu_magic.memory`'s
    (``tracking``, ``prediction``, ``cellmem``); this class reads the options, compiles the cell as IPython
    would, finds the names it uses, and shows or returns the report."""

    @magic_arguments()
    @argument("device", nargs="?", default=None, metavar="DEVICE",
              help="cpu, cuda or cuda:N. Measured: the device to report (default: the one with the highest "
                   "peak). --predict / --fit: the device to predict for (default cuda; no GPU needed)")
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
    @argument("--top", type=int, default=8, metavar="N",
              help="modules shown in the by-module table (default 8; 0: all)")
    @argument("-o", dest="output", action="store_true", help="return the report object")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @usage_errors
    @cell_magic
    def cudamem(self, line: str, cell: str) -> Any:
        """A training step's memory by category and module, and whether it fits: measured on a real run
        (torch's MemTracker), or predicted for DEVICE without one (``--predict``, on fake tensors);
        ``--fit NAME`` finds the largest batch that fits.

        Reference: https://github.com/torchgpu-magic/torchgpu-magic/blob/main/docs/cudamem.md
        """
        from ..cudamem import prediction, run, targetdevice

        args = parse_args(self.cudamem, line)
        if args.top < 0:
            raise UsageError(f"%cudamem: --top takes 0 (all) or a positive count; got {args.top}")
        capacity = targetdevice.parse_size(args.capacity) if args.capacity is not None else None
        cc = targetdevice.parse_arch(args.arch) if args.arch is not None else None
        fit_names = self._fit_names(args.fit)
        predicting = args.predict or fit_names is not None
        target = targetdevice.resolve_target(args.device or "cuda") if predicting else None
        measured_on = None if predicting or args.device is None else self._measured_device(args.device)
        run.tracker_class()  # a torch without MemTracker: one line, before anything runs
        code, tree, filename = self._compile(cell)
        ns = self.shell.user_ns
        names = prediction.cell_names(tree, ns)
        if predicting and "get_ipython" in {n.id for n in _names(tree)}:
            raise UsageError("%cudamem: --predict does not run IPython magics or shell commands inside the "
                             "cell (they would act on your real namespace); leave them out of it")
        if fit_names is not None:
            outcome: Any = prediction.fit(code, filename, ns, names, target, fit_names, capacity, cc,
                                          args.top)
        elif predicting:
            outcome = prediction.predict(code, filename, ns, names, target, capacity, cc, args.top)
        else:
            outcome = self._measure(code, filename, [(n, ns[n]) for n in names], measured_on, capacity,
                                    args.top)
        return show(outcome, args.output, args.quiet)

    @staticmethod
    def _fit_names(text: Optional[str]) -> Optional[list]:
        """``--fit x,y`` -> ['x', 'y']; names must be identifiers."""
        if text is None:
            return None
        names = [n.strip() for n in text.split(",")]
        bad = [n for n in names if not n.isidentifier()]
        if bad or not names:
            raise UsageError(f"%cudamem: --fit takes names of tensors separated by commas (e.g. --fit x or "
                             f"--fit input_ids,labels); got {text!r}")
        return names

    @staticmethod
    def _measured_device(spec: str) -> str:
        """DEVICE for a measured run: a device that exists here ('cuda' -> 'cuda:N', the current GPU)."""
        from .. import devices
        from ..errors import MagicInputError

        try:
            return str(devices.resolve(spec))
        except MagicInputError as exc:
            reason = str(exc).split(". Devices here:")[0]
            raise UsageError(f"%cudamem: {reason}; to predict for it without one, use --predict "
                             f"{spec.strip()}") from None

    def _compile(self, cell: str) -> tuple:
        """``(code, ast, filename)`` of the cell, transformed as IPython runs cells and registered so that
        tracebacks show its lines; a syntax error is one line."""
        shell = self.shell
        source = shell.transform_cell(cell)
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
            outcome = run.measure(lambda: exec(code, ns), values, device, top)
        except run.TrackerUnavailable:
            raise
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


def _names(tree: Any) -> list:
    import ast

    return [node for node in ast.walk(tree) if isinstance(node, ast.Name)]
