"""Clocks (method step 5), and what is read from a device around the timed runs.

On an accelerator with timing events (CUDA, ROCm, XPU, MPS), pre-created events around each sample give
device time, and ``perf_counter`` gives host enqueue time and synchronized wall time; where events cannot
time, ``perf_counter`` around a device synchronize; on cpu only ``perf_counter``, and the result says the
figure is host time. The wall clock stops after synchronizing the whole device rather than
``end.synchronize()``, so work the cell leaves running on *other* streams shows up as wall time far above
device time (the "other streams" warning). Events, streams and synchronize come from the device layer
(:mod:`torchgpu_magic.accelerators`). Clocks are injectable: the tests drive the engine with a fake one.

The CUDA clock (also ROCm's) counts how often the cell waits for the GPU (:meth:`Clock.count_syncs`) and
reads the GPU's SM clock and its reasons from NVML after every sample (:meth:`Clock.note_sample`,
:class:`~.throttle.ClockWatch`). Also here: which devices can be timed, the allocator figures around a
measurement (:class:`MemoryProbe`), and the ``_sleep`` calibration that checks the CUDA clock.
torch is imported lazily.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import accelerators
from ..caches import table
from ..errors import MagicInputError
from ..torchapi import gpu_spin
from .cells import CompiledCell

FLUSH_FACTOR = 2  # --flush-l2 writes at least twice the cache: one cache's worth can leave lines resident
FLUSH_MIN_BYTES = 256 * 2**20  # ... and on CUDA at least 256 MiB, as triton's do_bench
SPIN_S = 50e-6  # the device-side spin a start event waits behind (each sample; each loop with --cold)
SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's sync debug mode warning
PROTOTYPE_WARNING = "Synchronization debug mode is a prototype feature"  # torch's, once per process
_SPIN_CYCLES = table()  # CUDA device index -> _sleep cycles lasting SPIN_S, calibrated once per process


@dataclass(frozen=True)
class Sample:
    """One sample's totals in seconds for ``loops`` loops: host enqueue, synchronized wall, device time
    (None where the clock has no such figure)."""

    loops: int
    host: float
    wall: Optional[float] = None
    device: Optional[float] = None


@dataclass(frozen=True)
class Mode:
    """How each loop runs: ``cold`` synchronizes after every loop, ``flush`` is a callable that evicts the
    cache before every loop (outside the timed window)."""

    cold: bool = False
    flush: Optional[Callable[[], Any]] = None


class Clock:
    """What the engine needs from a clock. ``kind`` names the headline figure: 'device' (accelerator
    events), 'host' (``perf_counter`` only: cpu) or 'wall' (``perf_counter`` around synchronize)."""

    kind = "host"
    label = "perf_counter"
    flush_bytes = 0  # the size of the buffer --flush-l2 writes, once make_flush made it

    def now(self) -> float:
        """Seconds on a monotonic clock, for the time budget."""
        return time.perf_counter()

    def measure(self, cell: CompiledCell, loops: int, mode: Mode) -> Sample:
        """Run ``loops`` loops of ``cell`` and return their totals."""
        raise NotImplementedError

    def count_syncs(self, cell: CompiledCell) -> Optional[int]:
        """Run the cell once (a warm-up run) counting how often it waits for the device; None where this
        clock cannot see that (only the CUDA clock can)."""
        return None

    def note_sample(self) -> None:
        """Called after each timed sample (not after warm-up runs): the CUDA clock reads NVML here."""

    def make_flush(self) -> Callable[[], Any]:
        """A callable that evicts this device's cache (``--flush-l2``)."""
        raise MagicInputError("--flush-l2 is not available for this device")

    @staticmethod
    def primary(sample: Sample, kind: str) -> float:
        """The headline total of ``sample`` for a clock of ``kind``; a figure the sample lacks falls back
        to the next one it has (device, then synchronized wall, then host)."""
        order = {"device": (sample.device, sample.wall), "wall": (sample.wall,)}.get(kind, ())
        return next((value for value in order if value is not None), sample.host)


class HostClock(Clock):
    """cpu: ``perf_counter`` only; the work is done when the call returns, so host time is the time.

    ``--cold`` changes nothing here (there is no queue to drain). ``--flush-l2`` writes a buffer twice the
    size of the CPU's last-level cache before every loop (one cache's worth can leave lines resident) and
    times each loop on its own, leaving the writes out.
    """

    kind = "host"
    label = "perf_counter (host time)"

    def measure(self, cell: CompiledCell, loops: int, mode: Mode) -> Sample:
        if mode.flush is None:
            t0 = time.perf_counter()
            cell.run(loops)
            t1 = time.perf_counter()
            return Sample(loops, host=t1 - t0)
        flush, clock = mode.flush, time.perf_counter
        spent = [0.0, 0.0]

        def before() -> None:
            flush()
            spent[1] = clock()

        def after() -> None:
            spent[0] += clock() - spent[1]

        cell.run(loops, before, after)
        return Sample(loops, host=spent[0])

    def make_flush(self) -> Callable[[], Any]:
        import torch

        buffer = torch.empty(FLUSH_FACTOR * cpu_cache_bytes(), dtype=torch.uint8)
        self.flush_bytes = buffer.numel()
        return buffer.zero_


class SyncClock(Clock):
    """An accelerator whose events cannot time (no event class, or one refusing ``enable_timing``):
    ``perf_counter`` around the work with a device synchronize at both ends: host enqueue and synchronized
    wall, the wall being the headline."""

    kind = "wall"
    label = "perf_counter + synchronize"
    host_time = staticmethod(time.perf_counter)  # host enqueue and wall (tests: a simulated machine's clock)

    def __init__(self, device: Any) -> None:
        self.device = device
        kind, index = accelerators.split(device)
        wait = accelerators.synchronizer(kind)
        self._sync = lambda: wait(index)

    def measure(self, cell: CompiledCell, loops: int, mode: Mode) -> Sample:
        sync = self._sync
        sync()
        t0 = self.host_time()
        if mode.cold:
            cell.run(loops, lambda: None, sync)  # nothing before a loop, a synchronize after it
        else:
            cell.run(loops)
        t1 = self.host_time()
        sync()
        t2 = self.host_time()
        return Sample(loops, host=t1 - t0, wall=t2 - t0)


class EventClock(Clock):
    """An accelerator with timing events (CUDA, ROCm, XPU, MPS, a PrivateUse1 backend's ``Event``):
    pre-created events around each sample (device time), ``perf_counter`` for host enqueue and for the
    wall time after synchronizing the whole device (method step 5). The events come from the device
    layer (:mod:`torchgpu_magic.accelerators`), recorded on the device's current stream (MPS has one).

    ``--cold`` and ``--flush-l2`` record an event pair per loop instead, so the host's synchronize and
    relaunch gaps between loops stay out of the device time. :class:`CudaClock` adds what only CUDA (and
    ROCm's HIP) offers: a device-side spin the start event waits behind, the count of the cell's waits
    for the GPU, and NVML's clocks.
    """

    kind = "device"
    host_time = staticmethod(time.perf_counter)  # host enqueue and wall (tests: the simulated GPU's clock)

    def __init__(self, device: Any) -> None:
        self.device = device
        self.device_kind, self.index = accelerators.split(device)
        self.label = f"{accelerators.backend_label(self.device_kind)} events"
        self._sync = accelerators.synchronizer(self.device_kind)  # kept: counting syncs wraps the public one
        self._start, self._end = self._event(), self._event()
        self._pairs: list = []
        self.hot_spin = False  # only CUDA can queue the start event behind a spin

    def _event(self) -> Any:
        event = accelerators.timing_event(self.device_kind)
        if event is None:
            raise MagicInputError(f"torch cannot time events on {self.device}")
        return event

    def _spin(self) -> None:
        """Queue the device-side spin a start event waits behind (CUDA only)."""

    def measure(self, cell: CompiledCell, loops: int, mode: Mode) -> Sample:
        index, sync = self.index, self._sync
        stream = accelerators.current_stream(self.device)
        record = (lambda event: event.record()) if stream is None else (lambda event: event.record(stream))
        before = after = None
        used: list = []
        per_loop = mode.flush is not None or mode.cold
        if per_loop:
            self._pairs += [(self._event(), self._event()) for _ in range(loops - len(self._pairs))]
            pairs = iter(self._pairs[:loops])
            flush, cold, spin = mode.flush, mode.cold, self._spin

            def before() -> None:
                pair = next(pairs)
                used.append(pair)
                if flush is not None:
                    flush()
                if cold:
                    spin()
                record(pair[0])

            def after() -> None:
                record(used[-1][1])
                if cold:
                    sync(index)
        start, end = self._start, self._end
        sync(index)
        hot_spin = not per_loop and self.hot_spin
        if hot_spin:
            self._spin()
        t0 = self.host_time()
        record(start)
        cell.run(loops, before, after)
        record(end)
        t1 = self.host_time()
        sync(index)
        t2 = self.host_time()
        if used:
            device_ms = sum(s.elapsed_time(e) for s, e in used)
            return Sample(loops, host=t1 - t0, wall=t2 - t0, device=device_ms / 1e3)
        # the spin ran for about SPIN_S from t0 on, and the sample's work after it (never below device time)
        device_s = start.elapsed_time(end) / 1e3
        wall = max(t2 - t0 - SPIN_S, device_s) if hot_spin else t2 - t0
        return Sample(loops, host=t1 - t0, wall=wall, device=device_s)

    def make_flush(self) -> Callable[[], Any]:
        """A buffer twice the device's last-level cache (at least 256 MiB), written before every loop:
        CUDA's and ROCm's L2, XPU's last-level cache; refused where torch reports no cache size (MPS)."""
        import torch

        cache = accelerators.facts(self.device).cache
        if not cache:
            raise MagicInputError(f"--flush-l2 needs the cache size; torch reports none for {self.device}")
        size = max(FLUSH_FACTOR * cache, FLUSH_MIN_BYTES)
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.flush_bytes = size
        return buffer.zero_


class CudaClock(EventClock):
    """CUDA and ROCm (torch's cuda API over HIP): :class:`EventClock` with what they add.

    The GPU is idle when a sample starts (it was synchronized), so the start event is queued behind a
    short device-side spin (``torch.cuda._sleep`` of :data:`SPIN_S`, as nvbench queues its start behind
    a blocking kernel): the event fires when the spin ends, by which time the cell's first kernels are
    queued, and the first launch's latency stays out of the device time. The synchronized wall time
    leaves the spin out too, so it compares with device time. A cell that waits for the GPU itself
    (:meth:`count_syncs`) starts its samples without the spin. Under ``--cold`` every loop's start event
    waits behind a spin. The GPU's SM clock is read from NVML after every sample (NVIDIA only).
    """

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.watch: Any = None  # a throttle.ClockWatch once watch_clocks() ran
        self.hot_spin = True  # off once count_syncs found the cell waiting for the GPU

    def _spin(self) -> None:
        gpu_spin(self._spin_cycles())

    def count_syncs(self, cell: CompiledCell) -> Optional[int]:
        """One hot run of the cell (a warm-up run, after the first run, whose compilation and autotuning
        may synchronize for reasons of their own) counting how often it waits for the GPU: the
        synchronizing operations torch's sync debug mode flags (``.item()``, ``.cpu()``, ``print(t)``,
        ``nonzero``...) and calls to ``torch.cuda.synchronize`` / ``torch.accelerator.synchronize``. The
        spin is calibrated before counting; torch's notice that the debug mode is a prototype is dropped;
        the cell's own warnings are passed on as they were, also when the run raises. A cell that waits for
        the GPU has its samples start without the spin: the host would wait for the spin too (charging it
        to host enqueue), and every wait leaves the GPU idle before the next launch anyway."""
        import torch

        self._spin_cycles()
        syncs = 0
        publics = [(module, module.synchronize) for module in (torch.cuda, torch.accelerator)]

        def counting(public: Callable[..., Any]) -> Callable[..., Any]:
            def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal syncs
                syncs += 1
                return public(*args, **kwargs)
            return counted

        caught: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.filterwarnings("always", message=SYNC_WARNING)
                saved_mode = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("warn")
                for module, public in publics:
                    module.synchronize = counting(public)
                try:
                    self.measure(cell, 1, Mode())
                finally:
                    for module, public in publics:
                        module.synchronize = public
                    torch.cuda.set_sync_debug_mode(saved_mode)
        finally:
            for seen in caught:
                text = str(seen.message)
                if text.startswith(SYNC_WARNING):
                    syncs += 1
                elif not text.startswith(PROTOTYPE_WARNING):
                    warnings.warn_explicit(seen.message, seen.category, seen.filename, seen.lineno,
                                           source=seen.source)
        self.hot_spin = not syncs
        return syncs

    def watch_clocks(self) -> None:
        """Read the GPU's SM clock and its reasons from NVML after every sample from now on."""
        from .throttle import ClockWatch

        self.watch = ClockWatch.for_device(self.device)

    def note_sample(self) -> None:
        if self.watch is not None:
            self.watch.read()

    def _spin_cycles(self) -> int:
        """``torch.cuda._sleep`` cycles lasting :data:`SPIN_S` on this GPU (calibrated once per process)."""
        import torch

        index = self.index
        if index not in _SPIN_CYCLES:
            with torch.cuda.device(index):
                _SPIN_CYCLES[index] = max(1, int(sleep_cycles_per_ms() * SPIN_S * 1e3))
        return _SPIN_CYCLES[index]


def cpu_cache_bytes() -> int:
    """The largest CPU cache Linux reports for cpu0 (the last-level cache); 32 MiB where it cannot say."""
    best = 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    with contextlib.suppress(OSError):
        for entry in os.listdir(root):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(root, entry, "size")) as handle:
                text = handle.read().strip().upper()
                scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
                best = max(best, int(text.rstrip("KMG")) * scale)
    return best or 32 * 2**20


def check_device(device: Any, flush_l2: bool = False) -> None:
    """Raise :class:`MagicInputError` unless this engine can time on ``device`` (with ``--flush-l2``).
    ``meta`` is refused: nothing runs there, so there is nothing to time. Creates nothing."""
    kind = getattr(device, "type", str(device))
    if kind == "meta":
        raise MagicInputError(
            "cannot time on 'meta': meta tensors hold no data and run no kernels, so there is nothing to "
            "time (%timeit measures their dispatch overhead); valid: cpu or an accelerator"
        )
    timeable = ("cpu", "cuda", "mps", "xpu")
    other = accelerators.current_kind()  # an out-of-tree backend's (PrivateUse1), None without one
    if kind not in timeable and kind != other:
        raise MagicInputError(f"cannot time on '{device}'; valid: cpu, cuda, cuda:N, mps, xpu, xpu:N"
                              + (f", {other}" if other is not None and other not in timeable else ""))
    if flush_l2 and kind == "mps":
        raise MagicInputError("--flush-l2 works on cpu, cuda and xpu; torch reports no cache size for mps")


def clock_for(device: Any) -> Clock:
    """The right clock for a ``torch.device`` (see :func:`check_device` for the ones refused)."""
    check_device(device)
    kind = getattr(device, "type", str(device))
    if kind == "cpu":
        return HostClock()
    if kind == "cuda":
        return CudaClock(device)
    return SyncClock(device) if accelerators.timing_event(kind) is None else EventClock(device)


# ---- memory ---------------------------------------------------------------------------------------------
class MemoryProbe:
    """Allocator figures around the timed runs: allocated before, peak above it, reserved growth.

    On an accelerator this resets torch's peak-memory counter for the device (a peak cannot be read
    otherwise); where torch keeps no peak (MPS before torch's accelerator API reached it) the peak is None
    and the result says why. On cpu torch keeps no allocator statistics, so every figure is None ('N/A').
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.accelerator = getattr(device, "type", "cpu") not in ("cpu", "meta")
        self.before: Optional[int] = None
        self._reserved: Optional[int] = None
        self._peaks = False

    def start(self) -> None:
        if not self.accelerator:
            return
        accelerators.synchronize(self.device)
        self.before = accelerators.allocated(self.device)
        self._reserved = accelerators.reserved(self.device)
        self._peaks = accelerators.reset_peak(self.device)

    def stop(self) -> tuple:
        """(allocated before, peak above it, reserved growth), bytes or None."""
        if not self.accelerator or self.before is None:
            return None, None, None
        peak = accelerators.peak(self.device) if self._peaks else None
        reserved = accelerators.reserved(self.device)
        growth = None if reserved is None else reserved - (self._reserved or 0)
        return self.before, None if peak is None else max(peak - self.before, 0), growth


# ---- checking the CUDA clock ----------------------------------------------------------------------------
CALIBRATION_CYCLES = (1_000_000, 2_000_000)  # the two lengths whose difference calibrates


def sleep_cycles_per_ms(warm_s: float = 0.0) -> float:
    """How many cycles of ``torch.cuda._sleep`` last one millisecond on the current GPU: runs of 1e6 and
    2e6 cycles, ten of each, timed with CUDA events (trimmed means), and the cycles between them over the
    time between them. A slope, where PyTorch's own tests divide one length by its time: that time also
    holds what every kernel costs besides its cycles (its start, 0.6 us, and the two events around it,
    1.3 us, on an H200), and the host's launch latency where the GPU idles at the start event (7 to 9 us),
    so a single length came out 0.5 to 1.7 % slow on an H200 and every check built on it off by as much.
    Each start event also waits behind a short spin (as ``--cold``'s do), so no launch latency enters
    either length. Kernels of known length are how the CUDA clock is checked (tests, the GPU check and
    ``benchmarks/bench_timing.py --gpu``). ``warm_s`` spins the GPU that long first, so it calibrates at
    the boost clock the checks then run at."""
    gpu_spin(1_000_000)  # load the kernel
    accelerators.synchronize("cuda")
    start_warm = time.perf_counter()
    while time.perf_counter() - start_warm < warm_s:
        gpu_spin(1_000_000)
        accelerators.synchronize("cuda")
    means = []
    for cycles in CALIBRATION_CYCLES:
        spans = []
        for _ in range(10):
            start, end = accelerators.timing_event("cuda"), accelerators.timing_event("cuda")
            gpu_spin(100_000)  # 50 to 100 us: the GPU is still busy when the timed kernel is launched
            start.record()
            gpu_spin(cycles)
            end.record()
            end.synchronize()
            spans.append(start.elapsed_time(end))
        kept = sorted(spans)[2:-2]
        means.append(sum(kept) / len(kept))
    (short, long), (short_ms, long_ms) = CALIBRATION_CYCLES, means
    return (long - short) / (long_ms - short_ms)
