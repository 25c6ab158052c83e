"""The :class:`Sampler` thread that feeds the ``%gpumem`` panel, and :class:`CellLog`, the per-cell log.

The sampler takes a :class:`~torchgpu_magic.gpumem.figures.MemorySnapshot` every ``interval`` seconds in
a named daemon thread (model: nvitop's ``collect_in_background``: drift-free schedule, clean stop) and
keeps the peaks and a bounded history; the cell log records what each cell did to memory, between
IPython's pre- and post-run events. Both read the figures of :mod:`torchgpu_magic.gpumem.figures`
and, like them, never initialise CUDA.

Standard library only; no IPython, no ipywidgets (the view is :mod:`torchgpu_magic.gpumem.panel`).
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

from .. import accelerators
from ..errors import MagicInputError
from ..host import HostCounters, reset_peak_rss
from ..render import is_na
from .figures import GPUTarget, MemorySnapshot, collect, driver_view
from .records import DEFAULT_KEEP, CellGPU, CellRecord, CellRecords

MIN_INTERVAL = 0.05
MAX_INTERVAL = 60.0
DEFAULT_INTERVAL = 1.0
HISTORY_SECONDS = 300.0
THREAD_NAME = "torchgpu-magic-gpumem"


def validate_interval(seconds: Any) -> float:
    """``seconds`` as a float between :data:`MIN_INTERVAL` and :data:`MAX_INTERVAL`, else MagicInputError."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise MagicInputError(f"interval must be a number of seconds, got {seconds!r}") from None
    if not math.isfinite(value) or not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise MagicInputError(
            f"interval must be between {MIN_INTERVAL:g} and {MAX_INTERVAL:g} seconds, got {seconds!r}"
        )
    return value


# ---- per-cell accounting ---------------------------------------------------------------------------
class _CellStart:
    """The figures a cell started from (a plain slotted class: made before every cell)."""

    __slots__ = ("t0", "wall", "rss", "peak_reset", "allocated", "nvml", "peak_kept")

    def __init__(self, wall: float, rss: Optional[int], peak_reset: bool) -> None:
        self.t0 = 0.0
        self.wall = wall
        self.rss = rss
        self.peak_reset = peak_reset
        self.allocated: dict = {}  # (kind, index): torch's allocated bytes
        self.nvml: dict = {}  # (kind, index): the driver's figure for this process
        self.peak_kept: dict = {}  # (kind, index): whether torch keeps a peak there (not MPS)


class CellLog:
    """Per-cell memory accounting: :meth:`start` before a cell, :meth:`finish` after it; the
    :class:`~torchgpu_magic.gpumem.records.CellRecords` of the last ``keep`` cells are :attr:`records`.

    Before a cell it resets torch's peak counter (``reset_peak_memory_stats``, CUDA already initialised
    only) and the kernel's peak-RSS mark, so the peaks afterwards are this cell's own. Cheap on purpose
    (it runs around every cell): host figures come from /proc files kept open (:class:`HostCounters`),
    nothing is formatted, and NVML is asked only for :attr:`targets` that NVML can see. ``targets`` are
    set by the owner, on the main thread.
    """

    def __init__(self, keep: int = DEFAULT_KEEP, targets: Sequence[GPUTarget] = ()) -> None:
        self.records = CellRecords(keep=keep)
        self.targets: tuple = tuple(targets)
        self._host = HostCounters()
        self._start: Optional[_CellStart] = None

    def _driver_usage(self) -> dict:
        """This process's usage as its driver sees it, per ``(kind, torch index)``: NVML's figure, AMD
        SMI's, or MPS's driver-allocated memory, for the targets torch sees."""
        seen = ((t, driver_view(t, os.getpid())[2]) for t in self.targets if t.torch_index is not None)
        return {(t.kind, t.torch_index): int(process) for t, process in seen if not is_na(process)}

    def start(self) -> None:
        """Record the figures before a cell and reset the peak counters."""
        begin = _CellStart(time.time(), self._host.rss(), self._host.reset_peak())
        devices = accelerators.initialised_devices()
        if devices:
            try:
                for device in devices:
                    begin.peak_kept[device] = accelerators.reset_peak(device)
                    begin.allocated[device] = int(accelerators.allocated(device) or 0)
            except Exception:  # noqa: BLE001 - a lost GPU: this cell gets no GPU figures
                begin.allocated.clear()
            if self.targets:  # before the backend is initialised this process holds nothing: 0, not asked
                begin.nvml = self._driver_usage()
        begin.t0 = time.perf_counter()  # the cell's time leaves out this hook's own
        self._start = begin

    def finish(self, number: Optional[int], source: str) -> Optional[CellRecord]:
        """Close the cell opened by :meth:`start`; None when no cell was open."""
        seconds = time.perf_counter()
        begin, self._start = self._start, None
        if begin is None:
            return None
        seconds -= begin.t0
        rss, peak = self._host.rss_and_peak()
        rss_delta = rss - begin.rss if rss is not None and begin.rss is not None else None
        rss_peak = peak if begin.peak_reset else None
        gpus = []
        devices = accelerators.initialised_devices()
        if devices:  # a cell that initialised its accelerator itself started from 0 on every device
            nvml = self._driver_usage() if self.targets else {}
            try:
                for device in devices:
                    before = begin.allocated.get(device, 0)
                    now = int(accelerators.allocated(device) or 0)
                    # where torch keeps no peak (MPS), the higher of the cell's start and end
                    kept = begin.peak_kept.get(device, accelerators.peak(device) is not None)
                    peak_now = int(accelerators.peak(device) or 0) if kept else before
                    nvml_delta = nvml[device] - begin.nvml.get(device, 0) if device in nvml else None
                    if now or before or peak_now or nvml_delta:
                        gpus.append(CellGPU(device[1], now - before, max(peak_now, now), nvml_delta,
                                            device[0]))
            except Exception:  # noqa: BLE001
                gpus = []
        first_line = next((line.strip()[:80] for line in source.splitlines() if line.strip()), "")
        record = CellRecord(number, first_line, begin.wall, seconds, rss_delta, rss_peak, tuple(gpus))
        self.records.append(record)
        return record

    def clear(self) -> None:
        """Forget every record (and an open cell)."""
        self.records.clear()
        self._start = None

    def close(self) -> None:
        """Give back the /proc files; the records stay."""
        self._start = None
        self._host.close()


# ---- the sampler thread ----------------------------------------------------------------------------
class Schedule:
    """The clock the sampler thread keeps its schedule on: monotonic time, and a wait on the thread's
    Event that a stop, a resume or a new interval cuts short (True when it did). Tests give a
    :class:`Sampler` virtual time instead (``tests/fake_clock.py``), so that no test depends on how soon
    a loaded machine schedules the thread."""

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @staticmethod
    def wait(event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


class Sampler:
    """Samples memory every ``interval`` seconds in a named daemon thread and hands each
    :class:`MemorySnapshot` to ``callback`` (called in the sampler thread; exceptions are kept in
    :attr:`last_error`, never printed).

    The schedule is drift-free (the next tick is the previous one plus ``interval``, as nvitop's
    ``collect_in_background``; after a stall it skips ahead instead of bursting), :meth:`stop` ends the
    thread within one interval (it waits on an Event, never sleeps blindly), and :attr:`history` keeps the
    last ``history_seconds`` of snapshots for sparklines. ``peak`` figures are the highest allocated /
    RSS seen since :meth:`reset_peaks`, fed by every sample and by :meth:`note_cell`.

    ``targets`` are the GPUs to watch; the owner changes them with :meth:`set_targets` from its own
    thread (say, after the cell whose first ``.cuda()`` initialised CUDA, when torch's indices can be
    matched to NVML's for real). The sampler thread never works them out itself: that matching asks
    torch under ``warnings.catch_warnings``, which is process-wide and would swallow the warnings of
    the user's running cell.
    """

    schedule: Schedule = Schedule()

    def __init__(
        self,
        targets: Sequence[GPUTarget] = (),
        interval: float = DEFAULT_INTERVAL,
        callback: Optional[Callable[[MemorySnapshot], None]] = None,
        history_seconds: float = HISTORY_SECONDS,
    ) -> None:
        self.targets: tuple = tuple(targets)
        self.callback = callback
        self.history_seconds = float(history_seconds)
        self.last_error: Optional[str] = None
        self.latest: Optional[MemorySnapshot] = None
        self._interval = validate_interval(interval)
        self._history: collections.deque = collections.deque(maxlen=self._history_len())
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = False
        self._paused = False
        self._thread: Optional[threading.Thread] = None
        self._peaks: dict = {}
        self._peak_rss = 0

    def set_targets(self, targets: Sequence[GPUTarget]) -> None:
        """Watch ``targets`` from the next sample on."""
        with self._lock:
            self.targets = tuple(targets)

    # -- settings
    @property
    def interval(self) -> float:
        """Seconds between samples; setting it validates and takes effect at once."""
        return self._interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        value = validate_interval(seconds)
        with self._lock:
            self._interval = value
            self._history = collections.deque(self._history, maxlen=self._history_len())
        self._wake.set()

    def _history_len(self) -> int:
        return max(2, int(self.history_seconds / self._interval) + 1)

    @property
    def paused(self) -> bool:
        """True while ticks skip sampling (the thread keeps its schedule and stops as quickly)."""
        return self._paused

    def pause(self) -> None:
        """Stop sampling until :meth:`resume`; the last figures stay."""
        self._paused = True

    def resume(self) -> None:
        """Sample again from the next tick (and now)."""
        self._paused = False
        self._wake.set()

    @property
    def history(self) -> list:
        """The kept snapshots, oldest first (a copy)."""
        with self._lock:
            return list(self._history)

    # -- thread
    @property
    def running(self) -> bool:
        """True while the sampler thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (a no-op when it runs)."""
        if self.running:
            return
        self._stopping = False
        self._wake.clear()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> bool:
        """Ask the thread to end and wait for it (up to ``timeout``, default one interval plus a second);
        True when it has ended. Safe to call from the sampler thread itself and when not running."""
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(self._interval + 1.0 if timeout is None else timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True

    def _run(self) -> None:
        clock = self.schedule
        next_at = clock.now()
        while not self._stopping:
            if not self._paused:
                self.sample_now()
            next_at += self._interval
            now = clock.now()
            if next_at <= now:  # a slow sample or a suspended machine: skip the missed ticks
                next_at = now + self._interval
            if clock.wait(self._wake, next_at - now):
                self._wake.clear()
                next_at = clock.now()  # interval changed, resumed, or stopping: re-plan from now

    # -- samples
    def sample_now(self) -> MemorySnapshot:
        """Take one sample now (any thread), fold it into peaks and history, and call the callback."""
        with self._lock:
            snapshot = collect(self.targets)
            snapshot = self._fold_peaks(snapshot)
            self.latest = snapshot
            self._history.append(snapshot)
            if self.callback is not None:
                try:
                    self.callback(snapshot)
                except Exception as exc:  # noqa: BLE001 - a view's failure must not kill the sampler
                    self.last_error = f"{type(exc).__name__}: {exc}"
        return snapshot

    def _fold_peaks(self, snapshot: MemorySnapshot) -> MemorySnapshot:
        gpus = []
        for g in snapshot.gpus:
            index = g.target.torch_index
            seen = [v for v in (g.allocated, g.peak) if not is_na(v)]
            if index is None or not seen:
                gpus.append(replace(g, peak=None) if index is None else g)
                continue
            key = g.target.label
            self._peaks[key] = max(self._peaks.get(key, 0), *map(int, seen))
            gpus.append(replace(g, peak=self._peaks[key]))
        host = snapshot.host
        if host is not None:
            self._peak_rss = max(self._peak_rss, host.rss, host.peak_rss or 0)
            host = replace(host, peak_rss=self._peak_rss)
        return replace(snapshot, gpus=tuple(gpus), host=host)

    def note_cell(self, record: CellRecord) -> None:
        """Fold a cell's peaks into the peak figures (torch's counter is reset before every cell, so a
        peak between two samples would otherwise be lost)."""
        with self._lock:
            for g in record.gpus:
                self._peaks[g.label] = max(self._peaks.get(g.label, 0), g.peak)
            if record.rss_peak is not None:
                self._peak_rss = max(self._peak_rss, record.rss_peak)

    def reset_peaks(self) -> None:
        """Start the peak figures again from now (torch's own peak counter and the kernel's peak RSS
        mark too, where an accelerator is initialised / the OS allows)."""
        with self._lock:
            self._peaks.clear()
            self._peak_rss = 0
            reset_peak_rss()
            with contextlib.suppress(Exception):  # a lost GPU: the figures start again all the same
                for device in accelerators.initialised_devices():
                    accelerators.reset_peak(device)
        self.sample_now()
