"""``python -m torchgpu_magic`` (console script ``torchgpu-info``): ``%gpuinfo`` in a terminal."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .errors import MagicInputError


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the GPU report; exit status 0, or 2 for bad options (argparse's convention)."""
    parser = argparse.ArgumentParser(
        prog="torchgpu-info",
        description="What GPUs there are, what is using them, and whether torch can use them.")
    parser.add_argument("-i", "--index", type=int, default=None,
                        help="show one GPU: torch's cuda:N where torch sees GPUs, else NVML's index N")
    parser.add_argument("--no-processes", action="store_true", help="leave out the processes using each GPU")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    from .gpus.accelerated import gpu_report

    try:
        report = gpu_report(index=args.index, show_processes=not args.no_processes)
    except MagicInputError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.to_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
