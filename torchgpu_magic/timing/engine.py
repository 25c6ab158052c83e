"""The measuring loop (method steps 2, 3 and 7): first run apart, auto-range, warm-up, samples until the
stopping rule; the empty-cell floor, the ``--kernels`` profiler pass, and :func:`time_cell`, which puts
a whole measurement together.

The first run is timed and excluded from the statistics (lazy init, autotuning, allocator growth).
Auto-range picks 1-2-5 loops per sample until one sample lasts >= ~1 ms, then warm-up runs until the
median of the last 3 runs moves < 2 % (at least 3 runs and 25 ms, at most 1 s). ``gc`` is disabled
while sampling. Nothing here imports IPython; torch is imported lazily.
"""
from __future__ import annotations

import contextlib
import gc
import time
from typing import Any, Callable, ContextManager, Iterator, Optional

from .cells import CompiledCell, compile_cell, silenced
from .clocks import Clock, MemoryProbe, Mode, Sample, check_device, clock_for, cuda_initialised, timing_device
from .results import KernelRow, Run, TimingResult, device_name, result_from
from .stats import MAX_LOOPS, Options, Stats, loops_for, median, next_loops, ratio, stop_reason

WARMUP_MIN_RUNS = 3  # step 3
WARMUP_MIN_S = 0.025
WARMUP_MAX_S = 1.0
WARMUP_SETTLED = 0.02
KERNEL_ROWS = 10
KERNEL_MAX_LOOPS = 1000


# ---- the measuring loop ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _gc_disabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def measure(cell: CompiledCell, clock: Clock, opts: Options, mode: Optional[Mode] = None,
            silence: Callable[[], ContextManager[Any]] = silenced, show_first: bool = True,
            first: Optional[Sample] = None) -> Run:
    """Time ``cell`` with ``clock`` following the method: first run apart, auto-range, warm-up, samples
    until the stopping rule (whose ``--max-time`` budget starts after the first run). The first run's
    output is shown (unless ``show_first`` is False); later runs run under ``silence()``. ``gc`` is off
    throughout. The cell must have been started; ``first`` is its first run when the caller made it."""
    mode = mode or Mode()
    kind = clock.kind
    t_start = clock.now()
    with _gc_disabled():
        syncs = 0
        if first is None:
            with contextlib.nullcontext() if show_first else silence():
                first, syncs = clock.first_run(cell, mode)
        # The --max-time budget starts after the excluded first run: a slow one (torch.compile,
        # autotuning, cudnn.benchmark) must not eat the samples' time.
        t_begin = clock.now()
        with silence():
            loops, warm_runs = _autorange(cell, clock, opts, mode, t_begin)
            runs, history = _warm_up(cell, clock, opts, mode, loops)
            warm_runs += runs
            if opts.loops is None and history:
                # A slow start (thread pools waking, lazy init) can end the search too early: the warm
                # runs say what one loop really costs, so grow the loops to fill a sample after all.
                loops = max(loops, loops_for(median(history[-3:]), opts.target_sample))
            samples: list = []
            per_loop: list = []
            t_sampling = clock.now()
            while True:
                sample = clock.measure(cell, loops, mode)
                samples.append(sample)
                per_loop.append(Clock.primary(sample, kind) / loops)
                now = clock.now()
                reason = stop_reason(per_loop, now - t_sampling, now - t_begin, opts)
                if reason:
                    break
    return Run(samples, loops, first, reason, clock.now() - t_start, warm_runs, kind, syncs)


def _autorange(cell: CompiledCell, clock: Clock, opts: Options, mode: Mode, t_begin: float) -> tuple:
    """Loops per sample (``-n`` or the 1-2-5 search) and how many runs the search made."""
    if opts.loops is not None:
        return opts.loops, 0
    loops, runs = 1, 0
    while True:
        total = Clock.primary(clock.measure(cell, loops, mode), clock.kind)
        runs += loops
        if total >= opts.target_sample:  # one busy moment must not end the search: confirm it once
            total = min(total, Clock.primary(clock.measure(cell, loops, mode), clock.kind))
            runs += loops
        if total >= opts.target_sample or loops >= MAX_LOOPS or clock.now() - t_begin >= opts.max_time:
            return loops, runs
        loops = next_loops(loops, total, opts.target_sample)


def _warm_up(cell: CompiledCell, clock: Clock, opts: Options, mode: Mode, loops: int) -> tuple:
    """Warm up (method step 3); return the number of loops run and the per-loop times of the warm-up
    samples. ``--warmup N`` runs exactly N loops (and returns no history)."""
    if opts.warmup is not None:
        if opts.warmup:
            clock.measure(cell, opts.warmup, mode)
        return opts.warmup, []
    start = clock.now()
    history: list = []
    while True:
        elapsed = clock.now() - start
        if elapsed >= WARMUP_MAX_S:
            break
        if len(history) > WARMUP_MIN_RUNS and elapsed >= WARMUP_MIN_S:
            now, before = median(history[-3:]), median(history[-4:-1])
            if abs(ratio(now - before, before)) < WARMUP_SETTLED:
                break
        history.append(Clock.primary(clock.measure(cell, loops, mode), clock.kind) / loops)
    return len(history) * loops, history


# ---- the empty-cell floor -------------------------------------------------------------------------------
_FLOORS: dict = {}


def empty_cell_floor(device: Any, cold: bool = False, clock: Optional[Clock] = None) -> float:
    """Per-loop time this engine reports for an empty cell on ``device`` (the loop and clock overhead);
    measured once per device and mode per process, then cached."""
    key = (str(device), bool(cold))
    if key not in _FLOORS:
        cell = compile_cell("pass", {}, filename="<cudatime-floor>")
        cell.start()
        opts = Options(min_time=0.05, max_time=0.5)
        run = measure(cell, clock or clock_for(device), opts, Mode(cold=cold))
        _FLOORS[key] = Stats.of([Clock.primary(s, run.kind) / s.loops for s in run.samples]).median
    return _FLOORS[key]


# ---- --kernels ------------------------------------------------------------------------------------------
def profile_kernels(cell: CompiledCell, device: Any, loops: int,
                    silence: Callable[[], ContextManager[Any]] = silenced) -> tuple:
    """A separate ``torch.profiler`` pass of ``loops`` loops, run hot (never mixed with the timing
    samples): the top kernels by device time on CUDA, the top ops by self CPU time elsewhere, per loop.
    Returns ``(rows, why)``: ``why`` says why there are no rows (None when there are)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_cuda = getattr(device, "type", None) == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    loops = max(1, min(loops, KERNEL_MAX_LOOPS))
    totals: dict = {}
    with silence(), profile(activities=activities) as prof:
        cell.run(loops)
        if on_cuda:
            torch.cuda.synchronize(device)
    events = prof.events()
    ops = sum(1 for event in events if event.device_type == DeviceType.CPU)
    if on_cuda:
        for event in events:
            if event.device_type == DeviceType.CUDA:
                calls, spent = totals.get(event.name, (0, 0.0))
                totals[event.name] = (calls + 1, spent + event.device_time_total)
    else:
        for avg in prof.key_averages():
            totals[avg.key] = (avg.count, float(avg.self_cpu_time_total))
    grand = sum(spent for _, spent in totals.values()) or 1.0
    rows = sorted(totals.items(), key=lambda item: -item[1][1])[:KERNEL_ROWS]
    table = [KernelRow(name, calls / loops, spent / 1e6 / loops, spent / grand)
             for name, (calls, spent) in rows]
    return table, None if rows else empty_kernels_reason(on_cuda, ops)


def empty_kernels_reason(on_cuda: bool, cpu_ops: int) -> str:
    """Why a ``--kernels`` pass has no rows: no torch op ran, or (on CUDA) ops ran but the profiler
    recorded no kernel, which happens when CUPTI is unavailable or held by another profiler."""
    if not cpu_ops or not on_cuda:
        return "no torch op ran"
    return (f"the profiler recorded {cpu_ops} torch op{'s' * (cpu_ops != 1)} but no GPU kernel: CUPTI is "
            "unavailable, or held by another profiler (nsys, ncu, a torch.profiler already running)")


# ---- putting it together --------------------------------------------------------------------------------
def time_cell(cell: CompiledCell, device: Any, opts: Options,
              silence: Callable[[], ContextManager[Any]] = silenced,
              show_output: bool = True, follow_cuda: bool = False) -> TimingResult:
    """Measure ``cell`` on ``device`` (a ``torch.device``): start it (setup), floor, memory, timing, and
    the optional ``--kernels`` pass. What the setup and the first run print is shown when ``show_output``
    (everything else runs under ``silence()``). The cell is closed afterwards, whatever happens.

    ``follow_cuda`` (no ``--devices``): ``device`` was chosen before the cell ran; when it is cpu, the
    setup and the first run are timed on the host and, if they initialised CUDA, the cell is timed on the
    current CUDA GPU after all (:func:`~.clocks.choose_device`), its first run reported as that one."""
    import torch

    opts.check()
    check_device(device, opts.flush_l2)
    first: Optional[Sample] = None
    try:
        with contextlib.nullcontext() if show_output else silence():
            cell.start()
            if follow_cuda and getattr(device, "type", None) == "cpu":
                first = _host_first_run(cell)
        if first is not None:
            device = timing_device(cuda_before=False, cuda_after=cuda_initialised())
            check_device(device, opts.flush_l2)
        clock = clock_for(device)
        floor = empty_cell_floor(device, opts.cold)
        mode = Mode(cold=opts.cold, flush=clock.make_flush() if opts.flush_l2 else None)
        probe = MemoryProbe(device)
        probe.start()
        if first is not None and device.type == "cpu":
            run = measure(cell, clock, opts, mode, silence, show_first=False, first=first)
        else:
            run = measure(cell, clock, opts, mode, silence, show_output and first is None)
            if first is not None:  # the run that initialised CUDA was the cell's real first run
                run.first = first
        memory = probe.stop()
        result = result_from(run, clock, device, memory, floor, opts, torch.get_num_threads(),
                             torch.__version__, device_name(device))
        if opts.roofline:  # FLOPs and bytes, counted in one more run (untimed, after the samples)
            from . import roofline

            roofline.attach(result, lambda: cell.run(1), device, opts.peak, silence)
        if opts.kernels:
            result.kernels, result.kernels_empty = profile_kernels(cell, device, run.loops, silence)
    finally:
        cell.close()
    return result


def _host_first_run(cell: CompiledCell) -> Sample:
    """The first run on the host clock; if CUDA is initialised once it returns, the device is
    synchronized and the sample carries that wall time too."""
    t0 = time.perf_counter()
    cell.run(1)
    t1 = time.perf_counter()
    if not cuda_initialised():
        return Sample(1, host=t1 - t0)
    import torch

    torch.cuda.synchronize()
    return Sample(1, host=t1 - t0, wall=time.perf_counter() - t0)
