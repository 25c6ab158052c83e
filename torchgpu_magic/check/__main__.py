"""``python -m torchgpu_magic.check --out DIR``: run the GPU check's steps and write ``DIR/summary.md``.

Exit status 0 when no step failed or timed out (skipped steps say why in the summary), 1 otherwise, 2 for
bad options.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from . import plan, summary
from .outcome import FAILING
from .runner import run_plan

DEADLINE_S = 450.0  # the whole run, under 8 minutes with the interpreter's start and the summary


def _names(text: Optional[str], known: list, parser: argparse.ArgumentParser) -> Optional[list]:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"no step named {', '.join(unknown)}; the steps are: {', '.join(known)}")
    return names


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchgpu_magic.check",
        description="Check torchgpu_magic on this machine's GPU: every step under a time limit, one log "
                    "each, and DIR/summary.md with each check's figure and verdict.")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), metavar="DIR",
                        help="where the logs, summary.md and tour-gpu.ipynb go (default: ./gpu-check)")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, metavar="S",
                        help=f"seconds for the whole run (default {DEADLINE_S:.0f}); each step's limit is "
                             "cut to what is left, and steps that no longer fit are skipped")
    parser.add_argument("--only", metavar="NAMES", help="run only these steps (comma-separated)")
    parser.add_argument("--skip", metavar="NAMES", help="leave out these steps (comma-separated)")
    parser.add_argument("--repo", type=Path, default=None, metavar="DIR",
                        help="the checkout whose tests, benchmarks and notebooks to run (default: the one "
                             "this package was imported from, if any)")
    parser.add_argument("--list", action="store_true", help="list the steps and their limits, run nothing")
    args = parser.parse_args(argv)
    if args.deadline <= 0:
        parser.error(f"--deadline takes a positive number of seconds, not {args.deadline:g}")

    package = Path(__file__).resolve().parent.parent
    root = args.repo.resolve() if args.repo is not None else plan.repo_root(package)
    out = args.out.resolve()
    steps = plan.steps(out, root)
    known = [s.name for s in steps]
    only, skip = _names(args.only, known, parser), _names(args.skip, known, parser) or []
    steps = [s for s in steps if (only is None or s.name in only) and s.name not in skip]
    if args.list:
        for s in steps:
            print(f"{s.name:<22} {s.limit:>5.0f} s{'  (when time is left)' if s.optional else ''}  {s.title}"
                  + (f"  [skipped: {s.unavailable}]" if s.unavailable else ""))
        return 0

    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if plan.repo_root(package) is not None:  # every step imports this checkout's package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package.parent), env.get("PYTHONPATH")) if p)
    command = shlex.join(["python", "-m", "torchgpu_magic.check", *(sys.argv[1:] if argv is None else argv)])
    started, begun = time.strftime("%Y-%m-%d %H:%M:%S %Z"), time.monotonic()
    print(f"{command}: {len(steps)} steps, {args.deadline:.0f} s budget, output in {out}", flush=True)
    results = run_plan(steps, out, args.deadline, env=env, cwd=root,
                       echo=lambda line: print(line, flush=True))
    text = summary.write(out, results, command, args.deadline, time.monotonic() - begun, started,
                         note=None if root else plan.NOT_A_CHECKOUT)
    print("\n" + text, flush=True)
    return 1 if any(r.outcome.verdict in FAILING for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
