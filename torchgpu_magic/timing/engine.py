"""The measuring loop (method steps 2, 3 and 7): first run apart, auto-range, warm-up, samples until the
stopping rule; the empty-cell floor, the ``--kernels`` profiler pass, and :func:`time_cell`, which puts
a whole measurement together.

The first run is timed and excluded from the statistics (lazy init, autotuning, allocator growth); it
runs watched (:mod:`.observe`), so the device to time on follows what the cell touched. The first warm-up
run counts the cell's waits for the GPU. Auto-range picks 1-2-5 loops per sample until one sample lasts
>= ~1 ms, then warm-up runs until the median of the last 3 runs moves < 2 % (at least 3 runs and 25 ms,
at most 1 s). ``gc`` is disabled while sampling. Nothing here imports IPython; torch is imported lazily.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from typing import Any, Callable, ContextManager, Iterator, Optional

from .. import accelerators, devices
from ..caches import table
from ..host import gc_paused
from ..torchapi import has_primary_context, profiler_activity
from .cells import CompiledCell, compile_cell, silenced
from .clocks import Clock, MemoryProbe, Mode, Sample, check_device, clock_for
from .observe import Touched, names_cuda, timing_device, watch
from .results import KernelRow, Run, TimingResult, result_from
from .stats import (
    MAX_LOOPS,
    MAX_SAMPLE_WALL_S,
    TARGET_SAMPLE_S,
    Options,
    loops_for,
    median,
    next_loops,
    ratio,
    stop_reason,
)

WARMUP_MIN_RUNS = 3  # step 3
WARMUP_MIN_S = 0.025
WARMUP_MAX_S = 1.0
WARMUP_SETTLED = 0.02
KERNEL_ROWS = 10
KERNEL_MAX_LOOPS = 1000


# ---- the measuring loop ---------------------------------------------------------------------------------
def measure(cell: CompiledCell, clock: Clock, opts: Options, mode: Optional[Mode] = None,
            silence: Callable[[], ContextManager[Any]] = silenced, first: Optional[Sample] = None) -> Run:
    """Time ``cell`` with ``clock`` following the method: first run apart, auto-range, warm-up (its first
    run counting the cell's waits for the GPU, unless ``--warmup 0``), samples until the stopping rule
    (whose ``--max-time`` budget starts after the first run). The first run's output is shown; later runs
    run under ``silence()``. ``gc`` is off throughout. The cell must have been started; ``first`` is its
    first run when the caller made it."""
    mode = mode or Mode()
    kind = clock.kind
    t_start = clock.now()
    with gc_paused():
        if first is None:
            first = clock.measure(cell, 1, mode)
        # The --max-time budget starts after the excluded first run: a slow one (torch.compile,
        # autotuning, cudnn.benchmark) must not eat the samples' time.
        t_begin = clock.now()
        with silence():
            syncs = clock.count_syncs(cell) if opts.warmup != 0 else None
            counted = 0 if syncs is None else 1
            loops, warm_runs = _autorange(cell, clock, opts, mode, t_begin)
            runs, history, costs = _warm_up(cell, clock, opts, mode, loops, counted)
            warm_runs += runs + counted
            if opts.loops is None and history:
                # A slow start (thread pools waking, lazy init) can end the search too early: the warm
                # runs say what one loop really costs, so grow the loops to fill a sample after all
                # (no further than MAX_SAMPLE_WALL_S of wall time a sample, as the search).
                wanted = loops_for(median(history[-3:]), TARGET_SAMPLE_S)
                loops = max(loops, min(wanted, loops_for(median(costs[-3:]), MAX_SAMPLE_WALL_S)))
            samples: list = []
            per_loop: list = []
            t_sampling = clock.now()
            while True:
                sample = clock.measure(cell, loops, mode)
                clock.note_sample()
                samples.append(sample)
                per_loop.append(Clock.primary(sample, kind) / loops)
                now = clock.now()
                reason = stop_reason(per_loop, now - t_sampling, now - t_begin, opts)
                if reason:
                    break
    return Run(samples, loops, first, reason, clock.now() - t_start, warm_runs, kind, syncs)


def _autorange(cell: CompiledCell, clock: Clock, opts: Options, mode: Mode, t_begin: float) -> tuple:
    """Loops per sample (``-n`` or the 1-2-5 search) and how many runs the search made. The search stops
    once a sample holds :data:`TARGET_SAMPLE_S` of the headline figure, or lasts :data:`MAX_SAMPLE_WALL_S` of
    wall time whatever it holds."""
    if opts.loops is not None:
        return opts.loops, 0
    loops, runs = 1, 0
    while True:
        sample = clock.measure(cell, loops, mode)
        total, spent = Clock.primary(sample, clock.kind), Clock.primary(sample, "wall")  # spent: wall or host
        runs += loops
        if total >= TARGET_SAMPLE_S:  # one busy moment must not end the search: confirm it once
            total = min(total, Clock.primary(clock.measure(cell, loops, mode), clock.kind))
            runs += loops
        if total >= TARGET_SAMPLE_S or spent >= MAX_SAMPLE_WALL_S or loops >= MAX_LOOPS \
                or clock.now() - t_begin >= opts.max_time:
            return loops, runs
        loops = min(next_loops(loops, total, TARGET_SAMPLE_S),
                    next_loops(loops, spent, MAX_SAMPLE_WALL_S))


def _warm_up(cell: CompiledCell, clock: Clock, opts: Options, mode: Mode, loops: int, done: int = 0) -> tuple:
    """Warm up (method step 3); return the number of loops run, the per-loop headline times of the warm-up
    samples and their per-loop wall times. ``--warmup N`` runs exactly N loops in all, ``done`` of them
    already run (the one that counted syncs), and returns no history."""
    if opts.warmup is not None:
        left = max(0, opts.warmup - done)
        if left:
            clock.measure(cell, left, mode)
        return left, [], []
    start = clock.now()
    history: list = []
    costs: list = []
    while True:
        elapsed = clock.now() - start
        if elapsed >= WARMUP_MAX_S:
            break
        if len(history) > WARMUP_MIN_RUNS and elapsed >= WARMUP_MIN_S:
            now, before = median(history[-3:]), median(history[-4:-1])
            if abs(ratio(now - before, before)) < WARMUP_SETTLED:
                break
        sample = clock.measure(cell, loops, mode)
        history.append(Clock.primary(sample, clock.kind) / loops)
        costs.append(Clock.primary(sample, "wall") / loops)
    return len(history) * loops, history, costs


# ---- the empty-cell floor -------------------------------------------------------------------------------
_FLOORS = table()  # (device, cold): the empty cell's time per loop


def empty_cell_floor(device: Any, cold: bool = False, clock: Optional[Clock] = None) -> float:
    """Per-loop time this engine reports for an empty cell on ``device`` (the loop and clock overhead);
    measured once per device and mode per process, then cached."""
    key = (str(device), bool(cold))
    if key not in _FLOORS:
        cell = compile_cell("pass", {}, filename="<cudatime-floor>")
        cell.start()
        run = measure(cell, clock or clock_for(device), Options(min_time=0.05, max_time=0.5), Mode(cold=cold))
        _FLOORS[key] = median([Clock.primary(s, run.kind) / s.loops for s in run.samples])
    return _FLOORS[key]


# ---- --kernels ------------------------------------------------------------------------------------------
KERNEL_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")  # device work; gpu_user_annotation is not
RUNTIME_ACTIVITIES = ("cuda_runtime", "cuda_driver")


def profile_kernels(cell: CompiledCell, device: Any, loops: int,
                    silence: Callable[[], ContextManager[Any]] = silenced) -> tuple:
    """A separate ``torch.profiler`` pass of ``loops`` loops, run hot (never mixed with the timing
    samples): the top kernels by device time on CUDA, the top ops by self CPU time elsewhere, per loop.
    Returns ``(rows, why, busy)``: ``why`` says why there are no rows (None when there are), ``busy`` the
    seconds per loop the GPU spent in kernels (their union: kernels on several streams count once), None
    off CUDA or without kernels."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = getattr(device, "type", None) == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    loops = max(1, min(loops, KERNEL_MAX_LOOPS))
    with silence(), markers_dropped(), profile(activities=activities) as prof:
        cell.run(loops)
        if on_cuda:
            accelerators.synchronize(device)  # its runtime row shows that CUPTI recorded CUDA activity
    if on_cuda:
        totals, ops, runtime, busy = tally(prof.events())
    else:
        totals = {avg.key: (avg.count, float(avg.self_cpu_time_total)) for avg in prof.key_averages()}
        ops, runtime, busy = sum(count for count, _ in totals.values()), 0, None
    grand = sum(spent for _, spent in totals.values()) or 1.0
    rows = sorted(totals.items(), key=lambda item: -item[1][1])[:KERNEL_ROWS]
    table = [KernelRow(name, calls / loops, spent / 1e6 / loops, spent / grand)
             for name, (calls, spent) in rows]
    why = None if rows else empty_kernels_reason(on_cuda, ops, runtime)
    return table, why, (busy / 1e6 / loops if busy else None)


KINETO_MARKERS = (b"USDT:",)
"""How the lines start that torch's profiler (Kineto) writes to the process's stderr at every start and
stop (``USDT:... profiler_start`` / ``profiler_stop``): markers for tracing tools, not messages."""


@contextlib.contextmanager
def markers_dropped() -> Iterator[None]:
    """Run the block with the process's stderr (file descriptor 2, where Kineto's C++ logger writes,
    below Python's ``sys.stderr``) going to a temporary file; afterwards write back every line but
    Kineto's :data:`KINETO_MARKERS`, so its warnings and errors (and anything else written meanwhile)
    still reach the terminal, or the notebook (ipykernel forwards file descriptor 2). A file, not a
    pipe: nothing written meanwhile can block on it."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to write to: nothing to drop
        yield
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()  # what Python wrote before goes out before, not into the file
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True)
                    if not line.startswith(KINETO_MARKERS)]
            if kept:
                os.write(2, b"".join(kept))


def tally(events: Any) -> tuple:
    """A CUDA profiler pass's events as ``(totals, ops, runtime, busy)``: ``totals`` maps each kernel (and
    memcpy / memset) to ``(calls, microseconds)``; ``ops`` counts the torch ops the host ran (not the CUDA
    runtime's rows, nor ``record_function`` ranges); ``runtime`` the CUDA runtime / driver rows (our own
    synchronize makes one whenever CUPTI records at all); ``busy`` the microseconds of the union of the
    kernels' spans. ``record_function`` ranges shown on the GPU's timeline are no kernels: left out, as
    torch's own table leaves them out."""
    totals: dict = {}
    spans = []
    ops = runtime = 0
    for event in events:
        activity = profiler_activity(event)
        if activity in RUNTIME_ACTIVITIES:
            runtime += 1
        elif activity in KERNEL_ACTIVITIES and not event.is_user_annotation:
            calls, spent = totals.get(event.name, (0, 0.0))
            totals[event.name] = (calls + 1, spent + event.device_time_total)
            spans.append((event.time_range.start, event.time_range.end))
        elif activity == "cpu_op":
            ops += 1
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(spans):  # each span adds what it covers beyond the spans before it
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return totals, ops, runtime, busy


def empty_kernels_reason(on_cuda: bool, ops: int, runtime: int = 0) -> str:
    """Why a ``--kernels`` pass has no rows: no torch op ran; or (on CUDA) CUPTI recorded CUDA activity
    (the runtime rows of our own synchronize) but no kernel, so the cell launched none (views and other
    host-side ops launch nothing); or it recorded no CUDA activity at all: CUPTI is unavailable, or held
    by another profiler."""
    if on_cuda and runtime:
        return "the cell launched no GPU kernel" + (
            f" ({ops} torch op{'s' * (ops != 1)} ran on the host only: views, shape and metadata ops)"
            if ops else "")
    if not ops:
        return "no torch op ran" + (", and the profiler recorded no CUDA activity" if on_cuda else "")
    return (f"the profiler recorded {ops} torch op{'s' * (ops != 1)} but no CUDA activity, not even its own "
            "synchronize: CUPTI is unavailable, or held by another profiler (nsys, ncu, a "
            "torch.profiler already running)")


# ---- putting it together --------------------------------------------------------------------------------
def time_cell(cell: CompiledCell, device: Any, opts: Options,
              silence: Callable[[], ContextManager[Any]] = silenced,
              show_output: bool = True, follow_cuda: bool = False) -> TimingResult:
    """Measure ``cell`` on ``device`` (a ``torch.device``): start it (setup), first run, floor, memory,
    timing, and the optional ``--kernels`` pass. What the setup and the first run print is shown when
    ``show_output`` (everything else runs under ``silence()``). The cell is closed afterwards, whatever
    happens. The first run is watched (:func:`~.observe.watch`) for the working set the result compares
    with the L2 cache.

    ``follow_cuda`` (no ``--devices``): ``device`` was chosen before the cell ran from torch's default
    device alone; when it is cpu, the setup and the first run are watched on the host clock and the cell
    is timed where their tensors were (:func:`~.observe.choose_device`): on the GPU when they were on it,
    the cell initialised CUDA or its code names CUDA, else on the host, however initialised CUDA already
    was."""
    import torch

    opts.check()
    check_device(device, opts.flush_l2)
    first: Optional[Sample] = None
    touched: Optional[Touched] = None
    output = contextlib.nullcontext if show_output else silence
    try:
        if follow_cuda and getattr(device, "type", None) == "cpu":
            with output(), watch() as touched:
                cell.start()
                _quiesce()
                started = time.perf_counter()
                cell.run(1)
                host = time.perf_counter() - started
            touched.names_cuda = names_cuda(cell.code, cell.namespace)
            device = timing_device(touched)
            check_device(device, opts.flush_l2)
            first = Sample(1, host=host)
            if device.type != "cpu":  # and the wall time until the first run's work on the device is done
                devices.synchronize(device)
                first = Sample(1, host=host, wall=time.perf_counter() - started)
        else:
            with output():
                cell.start()
        clock = clock_for(device)
        floor = empty_cell_floor(device, opts.cold)
        mode = Mode(cold=opts.cold, flush=clock.make_flush() if opts.flush_l2 else None)
        probe = MemoryProbe(device)
        probe.start()
        if first is None:
            with output(), watch() as touched:
                first = clock.measure(cell, 1, mode)
        if hasattr(clock, "watch_clocks"):  # NVML's SM clocks (CUDA; nothing read where NVML has none)
            clock.watch_clocks()
        run = measure(cell, clock, opts, mode, silence, first=first)
        memory = probe.stop()
        kernels = profile_kernels(cell, device, run.loops, silence) if opts.kernels else None
        result = result_from(run, clock, device, memory, floor, opts, torch.get_num_threads(),
                             torch.__version__, kernels=kernels, task=(cell.stmt, cell.setup),
                             working_set=touched.working_set(device) if touched else None)
        if opts.roofline:  # FLOPs and bytes, counted in one more run (untimed, after the samples)
            from . import roofline

            roofline.attach(result, lambda: cell.run(1), device, opts.peak, silence)
    finally:
        cell.close()
    return result


def _quiesce() -> None:
    """Wait for device work queued before the first run (by the setup, or earlier cells), so the first
    run's wall time is its own; only where the accelerator is initialised already, and on CUDA only where
    its context exists: synchronizing without one would create it, for a cell that may never use the GPU."""
    kind = accelerators.current_kind()
    if kind is None or accelerators.initialised(kind) is None:
        return
    current = accelerators.current_index(kind)
    if kind != "cuda" or has_primary_context(current):
        accelerators.synchronize((kind, current))
