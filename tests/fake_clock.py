"""A clock on virtual time for the %%cudatime engine's tests (tests/test_timing_engine.py and
tests/test_timing_results.py): the stopping rule, auto-range and warm-up run deterministically."""
from __future__ import annotations

from torchgpu_magic import timing
from torchgpu_magic.timing import Clock, Options, Sample


class FakeClock(Clock):
    """A clock on virtual time: ``per_loop(call, loops)`` scripts the seconds per loop of each measure
    call (call 0 is the first run). Nothing of the cell runs; ``now()`` advances by what was 'measured'."""

    def __init__(self, per_loop, kind="host", host_ratio=1.0, wall_ratio=1.0):
        self.per_loop = per_loop
        self.kind = kind
        self.host_ratio = host_ratio
        self.wall_ratio = wall_ratio
        self.t = 0.0
        self.calls = []

    def now(self):
        return self.t

    def measure(self, cell, loops, mode):
        total = self.per_loop(len(self.calls), loops) * loops
        self.calls.append(loops)
        self.t += total * max(1.0, self.wall_ratio)
        if self.kind == "device":
            return Sample(loops, host=total * self.host_ratio, wall=total * self.wall_ratio, device=total)
        return Sample(loops, host=total)


def fake_run(clock, **options):
    """``timing.measure`` of an empty cell with ``clock`` and ``Options(**options)``."""
    cell = timing.compile_cell("pass", {})
    cell.start()
    return timing.measure(cell, clock, Options(**options))
