"""Clocks on virtual time, so that no test depends on how fast a loaded machine runs it: :class:`FakeClock`
for the %%cudatime engine's tests (tests/test_timing_engine.py and tests/test_timing_results.py: the
stopping rule, auto-range and warm-up run deterministically), and :class:`VirtualTime` for the %gpumem
sampler thread's schedule (tests/test_sampler.py, tests/test_panel.py)."""
from __future__ import annotations

import threading
import time

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


class ScriptedHostClock(FakeClock):
    """A :class:`FakeClock` for the shell-level tests of %%cudatime: it runs the cell for real (its side
    effects happen, as under the host clock) but reports the scripted seconds, and the time budget runs on
    the same virtual time. Put it in place of the host clock with
    ``monkeypatch.setattr(engine, "clock_for", lambda device: clock)``."""

    label = "perf_counter (host time)"

    def measure(self, cell, loops, mode):
        cell.run(loops)
        return super().measure(cell, loops, mode)


def fake_run(clock, **options):
    """``timing.measure`` of an empty cell with ``clock`` and ``Options(**options)``."""
    cell = timing.compile_cell("pass", {})
    cell.start()
    return timing.measure(cell, clock, Options(**options))


class VirtualTime:
    """Virtual time for the %gpumem sampler thread: set it as a sampler's ``schedule`` (or as
    ``Sampler.schedule`` for the samplers a magic makes). Time moves only when the test moves it
    (:meth:`advance_to`), or when a tick's work spends some (:meth:`spend`, from the sampler thread). The
    thread's waits end when virtual time reaches their deadline or their Event is set, and
    :meth:`advance_to` and :meth:`settle` return only once the thread has done what became due and waits
    again (or has ended): every tick the test expects has happened, however slowly the machine ran it.

    ``woken`` records each finished wait: True where its Event cut it short (a stop, a resume, a new
    interval), False where its deadline came."""

    GIVE_UP_S = 60.0  # a thread that never comes back to wait is a hang: fail the test, do not block it

    def __init__(self) -> None:
        self.t = 0.0
        self.woken: list = []
        self._deadline = None
        self._event = None
        self._cond = threading.Condition()

    def now(self) -> float:
        return self.t

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self._cond:
            self._deadline, self._event = self.t + seconds, event
            try:
                while not event.is_set() and self.t < self._deadline:
                    self._cond.wait(0.005)  # setting an Event notifies no Condition: look again soon
            finally:
                self._deadline = self._event = None
            self.woken.append(event.is_set())
            return self.woken[-1]

    def spend(self, seconds: float) -> None:
        """Work inside a tick that takes ``seconds`` of virtual time (call from the sampler thread)."""
        with self._cond:
            self.t += seconds

    def advance_to(self, moment: float, sampler) -> None:
        """Move virtual time to ``moment`` and return once ``sampler``'s thread waits again."""
        with self._cond:
            assert moment >= self.t, (moment, self.t)
            self.t = moment
            self._cond.notify_all()
        self.settle(sampler)

    def settle(self, sampler) -> None:
        """Return once ``sampler``'s thread waits for a moment still to come with its Event unset, or has
        ended: after ``start()``, a stop, a resume or a new interval."""
        give_up = time.monotonic() + self.GIVE_UP_S
        while sampler.running:
            with self._cond:
                if self._deadline is not None and self._deadline > self.t and not self._event.is_set():
                    return
            if time.monotonic() > give_up:
                raise AssertionError(f"the sampler thread did not wait again within {self.GIVE_UP_S} s")
            time.sleep(0.001)
