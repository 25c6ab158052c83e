"""Run `make test`'s legs, several at a time, and say how each went.

Each leg is a make target of its own (``make --no-print-directory LEG``), run in a process of its own with
its output in ``test-artifacts/legs/LEG.log``; ``--jobs`` of them run at once (default: the machine's CPUs,
at most 4: 2 on the 2-core CI machines), taken in the order given, so list the long ones
first. When a leg ends, its whole log is printed at once (legs never interleave their lines), with its
result and seconds. Every leg runs even when another failed: one broken leg must not hide what the others
would say. The end is one line per leg and the run's wall time, and the exit status is 1 if any leg failed.

Why at once: the legs are independent (separate venvs or separate pytest sessions, each with its own
temporary directories, kernels, clusters and ports), and one leg keeps 1.3 of two cores busy on average
(its kernels, engines and browser wait on one another): run one after another they took 21 minutes of
CI, two at a time 14 (user + sys 18 min over 14.3 min of wall time). Three at a time took as long
(13 min 25 s of legs against 13 min 40 s) with each leg far slower: two it is, on two cores.

Usage: python3 tests/run_legs.py [--jobs N] LEG [LEG ...]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LOGS = Path("test-artifacts") / "legs"


def run_leg(leg: str, printed: threading.Lock) -> tuple:
    """Run one leg to its end, its output to its log; then print the log whole. ``(leg, ok, seconds)``."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{leg}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(["make", "--no-print-directory", leg], stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, check=False)
    seconds = time.monotonic() - started
    ok = done.returncode == 0
    with printed:
        print(f"==== {leg}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s (log: {log}) ====", flush=True)
        sys.stdout.buffer.write(log.read_bytes())
        print(flush=True)
    return leg, ok, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                        help="legs at once (default: the CPUs, at most 4)")
    parser.add_argument("legs", nargs="+", help="make targets, the long ones first")
    args = parser.parse_args()
    started = time.monotonic()
    printed = threading.Lock()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda leg: run_leg(leg, printed), args.legs))
    print(f"make test, by leg ({max(1, args.jobs)} at a time, {time.monotonic() - started:.0f} s in all):")
    for leg, ok, seconds in results:
        print(f"  {leg:<20} {'passed' if ok else 'FAILED'} in {seconds:.0f} s")
    if not all(ok for _, ok, _ in results):
        print("make test: FAILED (a leg above failed)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
