"""What `%gpumem`'s sampler costs, measured side by side in one process.

Rows:
- the sampler thread with the panel's update as its callback, at 1 Hz and 10 Hz: this process's CPU time
  over wall time while the main thread sleeps, minus the same for an idle window (target at 1 Hz:
  ≤ 0.5 % of one core). Windows alternate (idle, 1 Hz, 10 Hz, ...) so machine noise hits all alike;
  also the CPU time of one tick (sample + panel update), measured in a tight loop;
- a busy CPU cell (a torch matmul loop, all threads, about 1 s) timed with no sampler, with the sampler
  at 1 Hz and at 10 Hz already running, runs alternating; the median slowdown against the no-sampler runs
  (target at 1 Hz: ≤ 1 %), beside a second no-sampler arm whose "slowdown" is this machine's noise floor.

The panel's widgets have no frontend here (ipywidgets' dummy comm), so the figures include building
and serialising the state but not the zmq send of a real kernel. Equal terms: every window and every
run of the cell is in the same process, on the same live objects; only the sampler differs.

Run: `python benchmarks/bench_panel.py [--window 6] [--rounds 3] [--cell 1.0]`.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Optional

from torchgpu_magic import gpumem as memory
from torchgpu_magic.gpumem import panel


def _panel(interval: float) -> panel.MemoryPanel:
    return panel.MemoryPanel(memory.Sampler([], interval=interval))


def _cpu_share(seconds: float, interval: Optional[float]) -> float:
    """Process CPU seconds per wall second over ``seconds`` of sleep, with a sampler at ``interval``."""
    live = _panel(interval) if interval else None
    if live is not None:
        live.sampler.start()
    try:
        time.sleep(0.2)  # let the first tick pass
        c0, w0 = time.process_time(), time.perf_counter()
        time.sleep(seconds)
        return (time.process_time() - c0) / (time.perf_counter() - w0)
    finally:
        if live is not None:
            live.close()


def _tick_cost(n: int = 300) -> float:
    """CPU seconds of one tick (collect + fold + panel update) with a full history."""
    live = _panel(1.0)
    try:
        for _ in range(live.sampler._history.maxlen):
            live.sampler.sample_now()
        c0 = time.thread_time()
        for _ in range(n):
            live.sampler.sample_now()
        return (time.thread_time() - c0) / n
    finally:
        live.close()


def _busy_cell(torch: Any, a: Any, b: Any, loops: int) -> float:
    t0 = time.perf_counter()
    for _ in range(loops):
        torch.mm(a, b)
    return time.perf_counter() - t0


def _cell_times(rounds: int, seconds: float) -> tuple:
    """Per arm, the busy cell's times; the cell is sized to last about ``seconds``, so a 1 Hz sampler
    ticks about once inside it. Each arm's panel is built and its first tick done before the cell
    starts, as when a panel is already open while the user runs cells."""
    import torch

    a, b = torch.randn(512, 512), torch.randn(512, 512)
    _busy_cell(torch, a, b, 10)  # warm-up
    once = _busy_cell(torch, a, b, 20) / 20
    loops = max(10, int(seconds / once))
    times: dict = {None: [], "control": [], 1.0: [], 0.1: []}
    for _ in range(rounds):
        for interval in times:  # alternate the arms
            live = _panel(interval) if isinstance(interval, float) else None
            if live is not None:
                live.sampler.start()
            try:
                time.sleep(0.3)  # the panel is up and has ticked, in every arm alike
                times[interval].append(_busy_cell(torch, a, b, loops))
            finally:
                if live is not None:
                    live.close()
    return times, loops


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=6.0, help="seconds per CPU-share window")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--cell", type=float, default=1.0, help="seconds the busy cell lasts")
    args = parser.parse_args(argv)

    tick = _tick_cost()
    print(f"one tick (sample + panel update, full history): {tick * 1e3:.3f} ms CPU "
          f"-> {tick * 100:.3f} % of a core at 1 Hz, {tick * 1000:.2f} % at 10 Hz")

    shares: dict = {None: [], 1.0: [], 0.1: []}
    for _ in range(args.rounds):
        for interval in shares:
            shares[interval].append(_cpu_share(args.window, interval))
    idle = statistics.median(shares[None])
    print(f"process CPU / wall, idle window: {idle * 100:.3f} %")
    for interval, label in ((1.0, "1 Hz"), (0.1, "10 Hz")):
        extra = statistics.median(shares[interval]) - idle
        target = " (target <= 0.5 %)" if interval == 1.0 else ""
        print(f"sampler at {label}: +{extra * 100:.3f} % of one core over idle{target}")

    times, loops = _cell_times(max(5, args.rounds * 3), args.cell)
    base = statistics.median(times[None])
    print(f"busy CPU cell (torch.mm 512x512 x {loops}): {base * 1e3:.1f} ms median without a sampler")
    for interval, label in (("control", "no sampler again (noise floor)"), (1.0, "the sampler at 1 Hz"),
                            (0.1, "the sampler at 10 Hz")):
        ratios = [t / b for t, b in zip(times[interval], times[None])]
        slow = statistics.median(ratios) - 1
        target = " (target <= 1 %)" if interval == 1.0 else ""
        print(f"  with {label}: {slow * 100:+.2f} % (median of paired runs){target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
