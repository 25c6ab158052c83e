"""``%gpuinfo``: what GPUs there are, what is using them, and whether torch can use them."""
from __future__ import annotations

from typing import Any

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from .base import MagicsPart, parse_args, usage_errors


@magics_class
class GPUInfoMagics(MagicsPart):
    """``%gpuinfo``: a report built by :mod:`torchgpu_magic.inventory`; the magic only parses and shows."""

    @magic_arguments()
    @argument("-i", "--index", type=int, default=None,
              help="show one GPU: torch's cuda:N where torch sees GPUs, else NVML's index N")
    @argument("--no-processes", action="store_true", help="leave out the processes using each GPU")
    @argument("--json", action="store_true", help="print the report as JSON")
    @argument("-o", dest="return_report", action="store_true",
              help="return the report object (a GPUReport) instead of displaying it")
    @line_magic
    @usage_errors
    def gpuinfo(self, line: str = "") -> Any:
        """What GPUs there are, what is using them, and whether torch can use them (and if not, why)."""
        args = parse_args(self.gpuinfo, line)
        from ..inventory import build_report

        report = build_report(index=args.index, show_processes=not args.no_processes)
        if args.json:
            print(report.to_json())
        elif not args.return_report:
            from IPython.display import display

            display(report)
        return report if args.return_report else None
