"""The ``%%cudatime`` engine: compile a cell once, clock it correctly, decide when to stop, and report.

``%time`` and ``%timeit`` read a host clock and never synchronize, so for GPU work they measure how long
it took to *queue* kernels. This module follows ``docs/timing-method.md``:

1. **Compile once.** :func:`compile_cell` puts the cell's (already transformed) body in a loop inside one
   generator function, as IPython's ``%timeit`` puts it in ``inner(_it, _timer)``; the setup statement
   runs once, in the same scope, when the generator starts. No ``exec`` per loop.
2. **First run apart**, timed and excluded from the statistics (lazy init, autotuning, allocator growth).
3. **Auto-range** (1-2-5 loops per sample until one sample lasts >= ~1 ms), then **warm up** until the
   median of the last 3 runs moves < 2 % (at least 3 runs and 25 ms, at most 1 s).
4. **Samples** until >= 7 samples and >= 0.2 s, then until the median's 95 % confidence interval lies within
   +-1 % of it (or IQR/median < 2 %); ``max_time`` caps it and the result then says "not converged".
5. **Clocks** (:class:`Clock`): on CUDA, pre-created events around each sample give device time, and
   ``perf_counter`` gives host enqueue time and synchronized wall time; on cpu only ``perf_counter``, and
   the result says the figure is host time. The wall clock stops after ``torch.cuda.synchronize(device)``
   rather than ``end.synchronize()``, so work the cell leaves running on *other* streams shows up as wall
   time far above device time (the "other streams" warning). Clocks are injectable, so the stopping rule
   and the auto-range are tested deterministically with a fake clock.

``gc`` is disabled while sampling. Nothing here imports IPython; torch is imported lazily.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import gc
import io
import itertools
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Optional, Sequence, Union

from .errors import MagicInputError
from .render import Table, fmt_bytes, fmt_percent, fmt_seconds, html_lines, is_na

# ---- the method's constants (docs/timing-method.md) ---------------------------------------------------
TARGET_SAMPLE_S = 1e-3  # one sample lasts at least this long (step 4)
MIN_SAMPLES = 7  # step 6
MIN_TIME_S = 0.2  # step 6
MAX_TIME_S = 10.0  # step 6, default of --max-time
CI_TARGET = 0.01  # the median's 95 % CI within +-1 %
IQR_TARGET = 0.02  # ... or IQR/median below 2 %
FLOOR_SAMPLES = 3  # never fewer samples than this, even past max_time (median and IQR need them)
WARMUP_MIN_RUNS = 3  # step 3
WARMUP_MIN_S = 0.025
WARMUP_MAX_S = 1.0
WARMUP_SETTLED = 0.02
NOISY, UNRELIABLE = 0.10, 0.25  # IQR/median thresholds (torch.utils.benchmark's Measurement)
SLOW_OUTLIER = 4.0  # slowest > 4 x fastest (IPython's %timeit)
FLOOR_FACTOR = 10.0  # result < 10 x the empty-cell floor
LAUNCH_BOUND = 0.9  # host enqueue >= 0.9 x device
OTHER_STREAMS = 1.5  # synchronized wall > 1.5 x device ...
OTHER_STREAMS_MIN_S = 100e-6  # ... and by more than this per sample (sync latency is ~10 us)
MAX_LOOPS = 10**9
KERNEL_ROWS = 10
KERNEL_MAX_LOOPS = 1000


# ---- compile once --------------------------------------------------------------------------------------
_TEMPLATE = """
def _cudatime_cell():
    setup
    _cudatime_args = yield
    while True:
        _cudatime_it, _cudatime_before, _cudatime_after = _cudatime_args
        if _cudatime_before is None:
            for _cudatime_i in _cudatime_it:
                stmt
        else:
            for _cudatime_i in _cudatime_it:
                _cudatime_before()
                stmt
                _cudatime_after()
        _cudatime_args = yield
"""


class _Filler(ast.NodeTransformer):
    """Replace the template's bare ``setup`` / ``stmt`` lines with the bodies (IPython's
    ``TimeitTemplateFiller``), keeping the user's line numbers so tracebacks point at the cell."""

    def __init__(self, setup: list, stmt: list) -> None:
        self.bodies = {"setup": setup, "stmt": stmt}

    def visit_Expr(self, node: ast.Expr) -> Any:
        if isinstance(node.value, ast.Name) and node.value.id in self.bodies:
            return copy.deepcopy(self.bodies[node.value.id])
        return node


def _as_module(code: Union[str, ast.Module], filename: str) -> ast.Module:
    if isinstance(code, ast.Module):
        return code
    return ast.parse(code or "pass", filename, "exec")


class CompiledCell:
    """A cell compiled once into a generator that runs ``loops`` iterations per :meth:`run`.

    :meth:`start` runs the setup (in the same scope as the cell, as ``%%timeit`` does) and must come
    before :meth:`run`; calling it again starts afresh (a new setup, e.g. on another device).
    """

    def __init__(self, factory: Callable[[], Any], filename: str) -> None:
        self._factory = factory
        self._gen: Any = None
        self.filename = filename

    def start(self) -> None:
        """Run the setup statement and get ready to run loops."""
        self.close()
        gen = self._factory()
        next(gen)
        self._gen = gen

    def run(self, loops: int, before: Optional[Callable[[], Any]] = None,
            after: Optional[Callable[[], Any]] = None) -> None:
        """Run the cell ``loops`` times; ``before`` / ``after`` (both or neither) wrap every loop."""
        if self._gen is None:
            self.start()
        self._gen.send((itertools.repeat(None, loops), before, after))

    def close(self) -> None:
        """Drop the generator (and with it the setup's locals)."""
        if self._gen is not None:
            self._gen.close()
            self._gen = None


def compile_cell(stmt: Union[str, ast.Module], namespace: dict, setup: Union[str, ast.Module] = "",
                 filename: str = "<cudatime>") -> CompiledCell:
    """Compile ``stmt`` (and ``setup``) once into a :class:`CompiledCell` whose globals are ``namespace``.

    ``stmt`` and ``setup`` are source already transformed by the shell (IPython's ``transform_cell``),
    as text or as parsed modules (after ``transform_ast``). Each is compiled on its own first, so a
    ``return`` or ``yield`` that would become legal inside the loop function is still a SyntaxError.
    """
    setup_ast = _as_module(setup, filename)
    stmt_ast = _as_module(stmt, filename)
    compile(setup_ast, filename, "exec", dont_inherit=True)
    compile(stmt_ast, filename, "exec", dont_inherit=True)
    template = ast.parse(_TEMPLATE)
    filled = _Filler(setup_ast.body or [ast.Pass()], stmt_ast.body or [ast.Pass()]).visit(template)
    code = compile(ast.fix_missing_locations(filled), filename, "exec", dont_inherit=True)
    local: dict = {}
    exec(code, namespace, local)  # defines the generator function only; runs nothing of the cell
    return CompiledCell(local["_cudatime_cell"], filename)


# ---- clocks --------------------------------------------------------------------------------------------
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

    def make_flush(self) -> Callable[[], Any]:
        """A callable that evicts this device's cache (``--flush-l2``)."""
        raise MagicInputError("--flush-l2 is not available for this device")

    @staticmethod
    def primary(sample: Sample, kind: str) -> float:
        """The headline total of ``sample`` for a clock of ``kind``."""
        value = {"device": sample.device, "wall": sample.wall}.get(kind, sample.host)
        return sample.host if value is None else value


class HostClock(Clock):
    """cpu: ``perf_counter`` only; the work is done when the call returns, so host time is the time.

    ``--cold`` changes nothing here (there is no queue to drain). ``--flush-l2`` writes a buffer the size
    of the CPU's last-level cache before every loop and times each loop on its own, leaving the writes out.
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

        buffer = torch.empty(cpu_cache_bytes(), dtype=torch.uint8)
        self.flush_bytes = buffer.numel()
        return buffer.zero_


class SyncClock(Clock):
    """mps / xpu: ``perf_counter`` around the work with a device synchronize at both ends (no event API
    common to all of them): host enqueue and synchronized wall, the wall being the headline."""

    kind = "wall"
    label = "perf_counter + synchronize"

    def __init__(self, device: Any) -> None:
        from . import devices

        self.device = device
        self._sync = lambda: devices.synchronize(device)

    def measure(self, cell: CompiledCell, loops: int, mode: Mode) -> Sample:
        sync = self._sync
        sync()
        t0 = time.perf_counter()
        if mode.cold:
            cell.run(loops, _nothing, sync)
        else:
            cell.run(loops)
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        return Sample(loops, host=t1 - t0, wall=t2 - t0)


class CudaClock(Clock):
    """CUDA: pre-created events around each sample (device time), ``perf_counter`` for host enqueue and
    for the wall time after synchronizing the whole device (method step 5)."""

    kind = "device"
    label = "CUDA events"

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = device
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._pairs: list = []

    def measure(self, cell: CompiledCell, loops: int, mode: Mode) -> Sample:
        torch, device = self._torch, self.device
        stream = torch.cuda.current_stream(device)
        sync = torch.cuda.synchronize
        before = after = None
        used: list = []
        if mode.flush is not None:
            # Per-loop events so the cache writes stay outside the timed span (as triton's do_bench).
            while len(self._pairs) < loops:
                new = torch.cuda.Event
                self._pairs.append((new(enable_timing=True), new(enable_timing=True)))
            pairs = iter(self._pairs[:loops])
            flush = mode.flush

            def before() -> None:
                pair = next(pairs)
                used.append(pair)
                flush()
                pair[0].record(stream)

            def after() -> None:
                used[-1][1].record(stream)
                if mode.cold:
                    sync(device)
        elif mode.cold:
            before = _nothing

            def after() -> None:
                sync(device)
        start, end = self._start, self._end
        sync(device)
        t0 = time.perf_counter()
        start.record(stream)
        cell.run(loops, before, after)
        end.record(stream)
        t1 = time.perf_counter()
        sync(device)
        t2 = time.perf_counter()
        if used:
            device_ms = sum(s.elapsed_time(e) for s, e in used)
        else:
            device_ms = start.elapsed_time(end)
        return Sample(loops, host=t1 - t0, wall=t2 - t0, device=device_ms / 1e3)

    def make_flush(self) -> Callable[[], Any]:
        torch = self._torch
        size = int(torch.cuda.get_device_properties(self.device).L2_cache_size) or 50 * 2**20
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.flush_bytes = size
        return buffer.zero_


def _nothing() -> None:
    """The per-loop hook that does nothing (``--cold`` needs only the one after the loop)."""


def cpu_cache_bytes() -> int:
    """The largest CPU cache Linux reports for cpu0 (the last-level cache); 32 MiB where it cannot say."""
    best = 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    with contextlib.suppress(OSError):
        for entry in os.listdir(root):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(root, entry, "size")) as handle:
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
    if kind not in ("cpu", "cuda", "mps", "xpu"):
        raise MagicInputError(f"cannot time on '{device}'; valid: cpu, cuda, cuda:N, mps, xpu")
    if flush_l2 and kind in ("mps", "xpu"):
        raise MagicInputError(f"--flush-l2 works on cuda and cpu; torch reports no L2 size for {kind}")


def clock_for(device: Any) -> Clock:
    """The right clock for a ``torch.device`` (see :func:`check_device` for the ones refused)."""
    check_device(device)
    kind = getattr(device, "type", str(device))
    if kind == "cuda":
        return CudaClock(device)
    if kind == "cpu":
        return HostClock()
    return SyncClock(device)


def timing_device() -> Any:
    """The device ``%%cudatime`` times on without ``--devices``: torch's default device when it is not
    cpu (e.g. inside ``%%ontorch cuda``), else the current CUDA GPU when torch sees one (cells usually
    put tensors there explicitly, and events cost a CPU-only cell nothing), else cpu."""
    import torch

    from . import devices

    device = devices.default_device()
    if device.type == "cpu" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


# ---- memory --------------------------------------------------------------------------------------------
class MemoryProbe:
    """Allocator figures around the timed runs: allocated before, peak above it, reserved growth.

    On CUDA this resets torch's peak-memory counter for the device (a peak cannot be read otherwise).
    On cpu torch keeps no allocator statistics, so every figure is None ('N/A').
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.cuda = getattr(device, "type", None) == "cuda"
        self.before: Optional[int] = None
        self._reserved: Optional[int] = None

    def start(self) -> None:
        if not self.cuda:
            return
        import torch

        torch.cuda.synchronize(self.device)
        self.before = int(torch.cuda.memory_allocated(self.device))
        self._reserved = int(torch.cuda.memory_reserved(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)

    def stop(self) -> tuple:
        """(allocated before, peak above it, reserved growth), bytes or None."""
        if not self.cuda or self.before is None:
            return None, None, None
        import torch

        peak = int(torch.cuda.max_memory_allocated(self.device)) - self.before
        growth = int(torch.cuda.memory_reserved(self.device)) - (self._reserved or 0)
        return self.before, max(peak, 0), growth


# ---- statistics ----------------------------------------------------------------------------------------
def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (numpy's default method)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


@dataclass(frozen=True)
class Stats:
    """Summary of per-loop times: median, quartiles, spread, and the median's 95 % confidence interval
    (distribution-free, from order statistics)."""

    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    mean: float
    std: float
    ci_low: float
    ci_high: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        return _ratio(self.iqr, self.median)

    @property
    def rel_ci(self) -> float:
        """Half-width of the median's 95 % CI relative to the median (the larger side)."""
        return _ratio(max(self.median - self.ci_low, self.ci_high - self.median), self.median)

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        data = sorted(float(v) for v in values)
        n = len(data)
        if n == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan, nan, nan)
        mean = sum(data) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in data) / (n - 1)) if n > 1 else math.nan
        half = 1.96 * math.sqrt(n) / 2
        lo = min(max(math.floor(n / 2 - half), 1), n)  # 1-based ranks
        hi = max(min(math.ceil(1 + n / 2 + half), n), 1)
        return cls(n, quantile(data, 0.5), quantile(data, 0.25), quantile(data, 0.75), data[0], data[-1],
                   mean, std, data[lo - 1], data[hi - 1])

    def settled(self) -> bool:
        """The method's convergence test: the median's CI within +-1 %, or IQR/median below 2 %."""
        return self.rel_ci < CI_TARGET or self.rel_iqr < IQR_TARGET


def _ratio(part: float, whole: float) -> float:
    if whole == 0:
        return 0.0 if part == 0 else math.inf
    return part / whole


# ---- options and the measuring loop ---------------------------------------------------------------------
@dataclass
class Options:
    """What the magic's options set. None means 'choose automatically' (loops, samples, warm-up)."""

    loops: Optional[int] = None
    samples: Optional[int] = None
    warmup: Optional[int] = None
    max_time: float = MAX_TIME_S
    cold: bool = False
    flush_l2: bool = False
    kernels: bool = False
    min_samples: int = MIN_SAMPLES
    min_time: float = MIN_TIME_S
    target_sample: float = TARGET_SAMPLE_S

    def check(self) -> None:
        """Raise :class:`MagicInputError` for values the engine cannot use."""
        counts = (("-n", self.loops, 1), ("-r", self.samples, 1), ("--warmup", self.warmup, 0))
        for name, value, low in counts:
            if value is not None and (not isinstance(value, int) or value < low or value > MAX_LOOPS):
                raise MagicInputError(f"{name} must be a whole number from {low} to {MAX_LOOPS:,}, "
                                      f"not {value!r}")
        if not (isinstance(self.max_time, (int, float)) and 0 < self.max_time <= 86400
                and math.isfinite(self.max_time)):
            raise MagicInputError(f"--max-time must be a number of seconds above 0, not {self.max_time!r}")


def next_loops(loops: int, elapsed: float, target: float) -> int:
    """The next loop count of the 1-2-5 sequence after ``loops``, aiming straight at ``target`` from
    ``elapsed`` (the time ``loops`` took), but growing at most 100-fold in one step."""
    want = loops * 100 if elapsed <= 0 else loops * target / elapsed
    want = min(max(want, loops + 1), loops * 100)
    for decade in itertools.count():
        for step in (1, 2, 5):
            value = step * 10**decade
            if value >= want:
                return min(value, MAX_LOOPS)
    raise AssertionError("unreachable")


def loops_for(per_loop: float, target: float) -> int:
    """The smallest 1-2-5 loop count whose sample of ``per_loop`` seconds each lasts >= ``target``."""
    loops = 1
    while loops * per_loop < target and loops < MAX_LOOPS:
        loops = next_loops(loops, loops * per_loop, target)
    return loops


def stop_reason(per_loop: Sequence[float], sampling_s: float, total_s: float, opts: Options) -> Optional[str]:
    """Why sampling should stop now: 'fixed' (-r reached), 'converged', 'max-time', or None to go on."""
    n = len(per_loop)
    if opts.samples is not None:
        return "fixed" if n >= opts.samples else None
    if n >= opts.min_samples and sampling_s >= opts.min_time and Stats.of(per_loop).settled():
        return "converged"
    if total_s >= opts.max_time and n >= FLOOR_SAMPLES:
        return "max-time"
    return None


@dataclass
class Run:
    """The raw outcome of :func:`measure`, before it becomes a :class:`TimingResult`."""

    samples: list
    loops: int
    first: Sample
    stop: str
    elapsed: float
    warmup_runs: int
    kind: str


class _NullWriter(io.TextIOBase):
    """A text sink that keeps nothing (a cell that prints in every loop must not grow memory)."""

    def write(self, text: str) -> int:
        return len(text)


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Discard what the cell prints to stdout / stderr (runs after the first)."""
    sink = _NullWriter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


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
            silence: Callable[[], ContextManager[Any]] = silenced, show_first: bool = True) -> Run:
    """Time ``cell`` with ``clock`` following the method: first run apart, auto-range, warm-up, samples
    until the stopping rule. The first run's output is shown (unless ``show_first`` is False); later
    runs run under ``silence()``. ``gc`` is off throughout. The cell must have been started."""
    mode = mode or Mode()
    kind = clock.kind
    t_begin = clock.now()
    with _gc_disabled():
        with contextlib.nullcontext() if show_first else silence():
            first = clock.measure(cell, 1, mode)
        with silence():
            loops, warm_runs = _autorange(cell, clock, opts, mode, t_begin)
            runs, history = _warm_up(cell, clock, opts, mode, loops)
            warm_runs += runs
            if opts.loops is None and history:
                # A slow start (thread pools waking, lazy init) can end the search too early: the warm
                # runs say what one loop really costs, so grow the loops to fill a sample after all.
                loops = max(loops, loops_for(_median(history[-3:]), opts.target_sample))
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
    return Run(samples, loops, first, reason, clock.now() - t_begin, warm_runs, kind)


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
            now, before = _median(history[-3:]), _median(history[-4:-1])
            if abs(_ratio(now - before, before)) < WARMUP_SETTLED:
                break
        history.append(Clock.primary(clock.measure(cell, loops, mode), clock.kind) / loops)
    return len(history) * loops, history


def _median(values: Sequence[float]) -> float:
    return quantile(sorted(values), 0.5)


# ---- the empty-cell floor -------------------------------------------------------------------------------
_FLOORS: dict = {}


def sleep_cycles_per_ms() -> float:
    """How many cycles of ``torch.cuda._sleep`` last one millisecond on the current GPU: ten 1e6-cycle
    runs timed with CUDA events, trimmed mean, as PyTorch's own tests calibrate it. Kernels of known
    length are how the CUDA clock is checked (tests and ``benchmarks/bench_timing.py --gpu``)."""
    import torch

    torch.cuda._sleep(1_000_000)  # load the kernel
    torch.cuda.synchronize()
    spans = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        end.synchronize()
        spans.append(start.elapsed_time(end))
    kept = sorted(spans)[2:-2]
    return 1_000_000 / (sum(kept) / len(kept))


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


# ---- warnings -------------------------------------------------------------------------------------------
def assess(stats: Stats, kind: str, host: Optional[float] = None, device: Optional[float] = None,
           wall: Optional[float] = None, loops: int = 1, floor: Optional[float] = None,
           cold: bool = False, flush: bool = False) -> list:
    """The method's flags (step 8) for per-loop ``stats`` and median host / device / wall times."""
    out = []
    rel = stats.rel_iqr
    if rel > UNRELIABLE:
        out.append(f"unreliable: IQR is {fmt_percent(rel)} of the median (> 25 %); the machine is busy or "
                   "the cell's work varies from run to run")
    elif rel > NOISY:
        out.append(f"noisy: IQR is {fmt_percent(rel)} of the median (> 10 %)")
    if stats.min > 0 and stats.max > SLOW_OUTLIER * stats.min:
        out.append(f"the slowest sample took {stats.max / stats.min:.1f} x the fastest: something is cached "
                   "between runs, or the machine was busy")
    if floor is not None and floor > 0 and stats.median < FLOOR_FACTOR * floor:
        out.append(f"the result is under 10 x the time of an empty cell ({fmt_seconds(floor)} per loop): "
                   "mostly loop and clock overhead")
    if kind == "device" and device and host is not None and not cold and host >= LAUNCH_BOUND * device:
        out.append(f"launch-bound: host enqueue ({fmt_seconds(host)}) is {host / device:.2f} x device time; "
                   "the CPU cannot feed the GPU (many small kernels, or CPU work in the cell)")
    if (kind == "device" and device and wall is not None and not flush and wall > OTHER_STREAMS * device
            and (wall - device) * loops > OTHER_STREAMS_MIN_S):
        out.append(f"synchronized wall time ({fmt_seconds(wall)}) is {wall / device:.1f} x device time: the "
                   "cell queues work on other streams (or devices) that the events on the current stream "
                   "do not see")
    return out


# ---- --kernels ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelRow:
    """One kernel (CUDA) or op (cpu) of the ``--kernels`` pass, per loop."""

    name: str
    calls: float
    time: float
    share: float


def profile_kernels(cell: CompiledCell, device: Any, loops: int,
                    silence: Callable[[], ContextManager[Any]] = silenced) -> list:
    """A separate ``torch.profiler`` pass of ``loops`` loops (never mixed with the timing samples): the
    top kernels by device time on CUDA, the top ops by self CPU time elsewhere, per loop."""
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
    if on_cuda:
        for event in prof.events():
            if event.device_type == DeviceType.CUDA:
                calls, spent = totals.get(event.name, (0, 0.0))
                totals[event.name] = (calls + 1, spent + event.device_time_total)
    else:
        for avg in prof.key_averages():
            totals[avg.key] = (avg.count, float(avg.self_cpu_time_total))
    grand = sum(spent for _, spent in totals.values()) or 1.0
    rows = sorted(totals.items(), key=lambda item: -item[1][1])[:KERNEL_ROWS]
    return [KernelRow(name, calls / loops, spent / 1e6 / loops, spent / grand)
            for name, (calls, spent) in rows]


# ---- results --------------------------------------------------------------------------------------------
_KIND_WORDS = {"device": "device time", "host": "host time", "wall": "synchronized wall time"}


@dataclass
class TimingResult:
    """One ``%%cudatime`` measurement. Times are seconds per loop; ``samples`` are the per-loop headline
    times (device time on CUDA, host time on cpu) of every sample that entered the statistics."""

    device: str
    device_name: str
    torch_version: str
    clock: str
    kind: str
    samples: list
    loops: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    mean: float
    std: float
    ci95: tuple
    first_run: float
    host: Optional[float]
    device_time: Optional[float]
    wall: Optional[float]
    host_samples: list
    device_samples: Optional[list]
    wall_samples: Optional[list]
    memory_before: Optional[int]
    memory_peak: Optional[int]
    memory_reserved_growth: Optional[int]
    floor: Optional[float]
    converged: bool
    stop_reason: str
    elapsed: float
    warmup_loops: int
    threads: int
    cold: bool = False
    flush_l2: bool = False
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    kernels: Optional[list] = None

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def n(self) -> int:
        return len(self.samples)

    # -- text ----------------------------------------------------------------------------------------
    def headline(self) -> str:
        """'50.2 ms device time per loop (median; IQR 12.3 µs, min 50.1 ms; 23 samples x 1 loop)'."""
        loops = f"{self.loops:,} loop{'s' if self.loops != 1 else ''}"
        return (f"{fmt_seconds(self.median)} {_KIND_WORDS[self.kind]} per loop (median; IQR "
                f"{fmt_seconds(self.iqr)}, min {fmt_seconds(self.min)}; {self.n} samples x {loops})")

    def detail_lines(self) -> list:
        """The figures under the headline (method step 8), then warnings and notes."""
        parts = []
        if self.kind != "host" and self.host is not None:
            parts.append(f"host enqueue {fmt_seconds(self.host)}")
        if self.wall is not None:
            parts.append(f"synchronized wall {fmt_seconds(self.wall)}")
        parts.append(f"first run {fmt_seconds(self.first_run)} (excluded)")
        lines = ["per loop: " + ", ".join(parts)]
        if self.memory_peak is None:
            lines.append("memory: N/A (torch keeps no allocator statistics for this device)")
        else:
            lines.append(f"memory: peak {fmt_bytes(self.memory_peak, signed=True)} above the "
                         f"{fmt_bytes(self.memory_before)} allocated before; reserved "
                         f"{fmt_bytes(self.memory_reserved_growth, signed=True)}")
        lines += ["! " + w for w in self.warnings]
        lines += self.notes
        return lines

    def to_text(self) -> str:
        title = f"%%cudatime on {self.device} ({self.device_name}), {self.clock}"
        lines = [title, "  " + self.headline()] + ["  " + line for line in self.detail_lines()]
        if self.kernels is not None:
            lines.append(kernel_table(self.kernels, self.kind == "device").to_text(indent="  "))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text() if not cycle else "TimingResult(...)")

    def _repr_html_(self) -> str:
        table = Table(["", "per loop"], align="lr",
                      title=f"%%cudatime on {self.device} ({self.device_name}), {self.clock}")
        table.add(f"median {_KIND_WORDS[self.kind]}", fmt_seconds(self.median))
        table.add("IQR", fmt_seconds(self.iqr))
        table.add("min / max", f"{fmt_seconds(self.min)} / {fmt_seconds(self.max)}")
        table.add("samples x loops", f"{self.n} x {self.loops:,}")
        if self.kind != "host" and self.host is not None:
            table.add("host enqueue", fmt_seconds(self.host))
        if self.wall is not None:
            table.add("synchronized wall", fmt_seconds(self.wall))
        table.add("first run (excluded)", fmt_seconds(self.first_run))
        table.add("peak memory above before", fmt_bytes(self.memory_peak, signed=True))
        table.add("reserved growth", fmt_bytes(self.memory_reserved_growth, signed=True))
        out = table.to_html() + html_lines(["! " + w for w in self.warnings] + self.notes)
        if self.kernels is not None:
            out += kernel_table(self.kernels, self.kind == "device").to_html()
        return out

    def to_dict(self) -> dict:
        """Plain data (seconds, bytes; None for N/A): every field, plus ``iqr``."""
        out = {name: _plain(getattr(self, name)) for name in self.__dataclass_fields__}
        out["iqr"] = _plain(self.iqr)
        out["kernels"] = None if self.kernels is None else [_plain(vars(row)) for row in self.kernels]
        return out


def kernel_table(rows: Sequence[KernelRow], device: bool) -> Table:
    """The ``--kernels`` rows as a table."""
    title = ("top kernels by device time (separate torch.profiler pass)" if device
             else "top ops by self CPU time (separate torch.profiler pass)")
    if not rows:
        title += ": no torch op ran"
    table = Table(["name", "calls/loop", "time/loop", "share"], align="lrrr", title=title)
    for row in rows:
        name = row.name if len(row.name) <= 70 else row.name[:67] + "..."
        calls = f"{row.calls:.3g}"
        table.add(name, calls, fmt_seconds(row.time), fmt_percent(row.share))
    return table


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return None if is_na(value) or math.isinf(value) else value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass
class TimingComparison:
    """Rows of :class:`TimingResult` (``--devices`` / ``--threads``) with speed-up against the first row."""

    rows: list  # [(label, TimingResult)]

    def speedups(self) -> list:
        base = self.rows[0][1].median
        return [_ratio(base, result.median) for _, result in self.rows]

    def table(self) -> Table:
        headers = ["row", "device", "time per loop", "IQR", "min", "samples x loops", "speed-up",
                   "first run", "clock"]
        title = "%%cudatime comparison (median per loop; speed-up relative to the first row)"
        table = Table(headers, align="llrrrrrrl", title=title)
        for (label, result), speedup in zip(self.rows, self.speedups()):
            table.add(label, result.device_name, fmt_seconds(result.median), fmt_seconds(result.iqr),
                      fmt_seconds(result.min), f"{result.n} x {result.loops:,}", f"{speedup:.2f}x",
                      fmt_seconds(result.first_run), _KIND_WORDS[result.kind])
        return table

    def notes(self) -> list:
        """Each row's warnings (prefixed with its label), then its notes; a note every row shares is
        said once, without a label."""
        shared = [n for n in self.rows[0][1].notes if all(n in r.notes for _, r in self.rows)]
        out = []
        for label, result in self.rows:
            out += [f"{label}: ! {w}" for w in result.warnings]
            out += [f"{label}: {n}" for n in result.notes if n not in shared]
        return out + shared

    def _kernel_tables(self) -> list:
        out = []
        for label, result in self.rows:
            if result.kernels is not None:
                table = kernel_table(result.kernels, result.kind == "device")
                table.title = f"{label}: {table.title}"
                out.append(table)
        return out

    def to_text(self) -> str:
        return "\n".join([self.table().to_text()] + ["  " + line for line in self.notes()]
                         + [table.to_text(indent="  ") for table in self._kernel_tables()])

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text() if not cycle else "TimingComparison(...)")

    def _repr_html_(self) -> str:
        return (self.table().to_html() + html_lines(self.notes())
                + "".join(table.to_html() for table in self._kernel_tables()))

    def to_dict(self) -> dict:
        return {"rows": [dict(label=label, speedup=_plain(s), **result.to_dict())
                         for (label, result), s in zip(self.rows, self.speedups())]}


# ---- putting it together --------------------------------------------------------------------------------
def device_name(device: Any) -> str:
    """A person's name for ``device``: the GPU model, or the CPU model where Linux says it."""
    kind = getattr(device, "type", str(device))
    if kind == "cuda":
        import torch

        return str(torch.cuda.get_device_name(device))
    if kind == "cpu":
        with contextlib.suppress(OSError):
            with open("/proc/cpuinfo") as handle:
                for line in handle:
                    if line.lower().startswith("model name"):
                        return line.split(":", 1)[1].strip()
        return platform.processor() or platform.machine() or "CPU"
    return str(device)


def result_from(run: Run, clock: Clock, device: Any, memory: tuple, floor: Optional[float],
                opts: Options, threads: int, torch_version: str, name: str) -> TimingResult:
    """Turn a :class:`Run` into a :class:`TimingResult` with its statistics, warnings and notes."""
    per = [Clock.primary(s, run.kind) / s.loops for s in run.samples]
    stats = Stats.of(per)
    host = [s.host / s.loops for s in run.samples]
    wall = [s.wall / s.loops for s in run.samples] if run.samples[0].wall is not None else None
    dev = [s.device / s.loops for s in run.samples] if run.samples[0].device is not None else None
    host_m = _median(host)
    wall_m = _median(wall) if wall else None
    dev_m = _median(dev) if dev else None
    settled = stats.settled()
    warnings = assess(stats, run.kind, host_m, dev_m, wall_m, run.loops, floor, opts.cold, opts.flush_l2)
    if run.stop == "max-time":
        warnings.append(f"not converged within --max-time {opts.max_time:g} s: the median's 95 % CI is "
                        f"+-{fmt_percent(stats.rel_ci)} (want < 1 %), IQR/median "
                        f"{fmt_percent(stats.rel_iqr)} (want < 2 %)")
    notes = []
    if run.stop == "fixed" and not settled:
        notes.append(f"-r {len(per)}: fixed sample count; the median's 95 % CI is "
                     f"+-{fmt_percent(stats.rel_ci)}")
    if run.kind == "host":
        notes.append("host time (perf_counter): cpu work is finished when the call returns")
    if opts.cold:
        notes.append("--cold: synchronized after every loop" + (
            "; device time includes each run's launch latency" if run.kind == "device"
            else " (nothing to synchronize on cpu: same as the default)" if run.kind == "host" else ""))
    if opts.flush_l2:
        what = "L2 cache" if run.kind == "device" else "last-level cache"
        notes.append(f"--flush-l2: {fmt_bytes(clock.flush_bytes)} (the {what}) is overwritten before every "
                     "loop, outside the timed span")
    first = Clock.primary(run.first, run.kind)
    return TimingResult(
        device=str(device), device_name=name, torch_version=torch_version, clock=clock.label, kind=run.kind,
        samples=per, loops=run.loops, median=stats.median, q1=stats.q1, q3=stats.q3, min=stats.min,
        max=stats.max, mean=stats.mean, std=stats.std, ci95=(stats.ci_low, stats.ci_high), first_run=first,
        host=host_m, device_time=dev_m, wall=wall_m, host_samples=host, device_samples=dev, wall_samples=wall,
        memory_before=memory[0], memory_peak=memory[1], memory_reserved_growth=memory[2], floor=floor,
        converged=settled and run.stop != "max-time", stop_reason=run.stop, elapsed=run.elapsed,
        warmup_loops=run.warmup_runs, threads=threads, cold=opts.cold, flush_l2=opts.flush_l2,
        warnings=warnings, notes=notes,
    )


def time_cell(cell: CompiledCell, device: Any, opts: Options,
              silence: Callable[[], ContextManager[Any]] = silenced,
              show_output: bool = True) -> TimingResult:
    """Measure ``cell`` on ``device`` (a ``torch.device``): start it (setup), floor, memory, timing, and
    the optional ``--kernels`` pass. What the setup and the first run print is shown when ``show_output``
    (everything else runs under ``silence()``). The cell is closed afterwards, whatever happens."""
    import torch

    opts.check()
    check_device(device, opts.flush_l2)
    clock = clock_for(device)
    floor = empty_cell_floor(device, opts.cold)
    mode = Mode(cold=opts.cold, flush=clock.make_flush() if opts.flush_l2 else None)
    probe = MemoryProbe(device)
    try:
        with contextlib.nullcontext() if show_output else silence():
            cell.start()
        probe.start()
        run = measure(cell, clock, opts, mode, silence, show_output)
        memory = probe.stop()
        result = result_from(run, clock, device, memory, floor, opts, torch.get_num_threads(),
                             torch.__version__, device_name(device))
        if opts.kernels:
            result.kernels = profile_kernels(cell, device, run.loops, silence)
    finally:
        cell.close()
    return result
