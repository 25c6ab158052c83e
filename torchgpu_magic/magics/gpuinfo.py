"""``%gpuinfo``: what GPUs there are, what is using them, and whether torch can use them."""
from __future__ import annotations

import json
from typing import Any

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..errors import MagicInputError
from .base import MagicsPart, parse_args, usage_errors
from .shell import show


@magics_class
class GPUInfoMagics(MagicsPart):
    """``%gpuinfo``: a report built by :mod:`torchgpu_magic.gpus.inventory` (NVIDIA) or
    :mod:`torchgpu_magic.gpus.accelerated` (MPS, ROCm, XPU); the magic parses and shows."""

    @magic_arguments()
    @argument("-i", "--index", type=int, default=None,
              help="show one GPU: torch's cuda:N where torch sees GPUs, else NVML's index N")
    @argument("--no-processes", action="store_true", help="leave out the processes using each GPU")
    @argument("--json", action="store_true", help="print the report as JSON")
    @argument("-o", dest="return_report", action="store_true",
              help="return the report object (a GPUReport) instead of displaying it")
    @argument("--cluster", nargs="?", const="", default=None, metavar="NAME",
              help="one report for every engine of an ipyparallel Client/view or Dask Client NAME "
                   "(without NAME: the one in the namespace)")
    @argument("--timeout", type=float, default=None, metavar="S",
              help="with --cluster: seconds each engine may take (default 30)")
    @line_magic
    @usage_errors
    def gpuinfo(self, line: str = "") -> Any:
        """What GPUs there are, what is using them, and whether torch can use them (and if not, why, with
        the fix that applies where the kernel runs).

        Reference: https://github.com/torchgpu-magic/torchgpu-magic/blob/main/docs/gpuinfo.md
        """
        args = parse_args(self.gpuinfo, line)
        if args.cluster is not None:
            report = self._cluster(args)
        else:
            from ..gpus.accelerated import gpu_report

            report = gpu_report(index=args.index, show_processes=not args.no_processes)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        return show(report, args.return_report, quiet=args.json)

    def _cluster(self, args: Any) -> Any:
        """``--cluster``: the cluster-wide report (:func:`torchgpu_magic.cluster.gpu_report`)."""
        from .. import cluster

        if args.index is not None:
            raise MagicInputError("-i does not go with --cluster: the cluster report shows every GPU")
        bridge = self.cluster_bridge(args.cluster)
        return cluster.gpu_report(bridge, not args.no_processes,
                                  cluster.DEFAULT_TIMEOUT if args.timeout is None else args.timeout)
