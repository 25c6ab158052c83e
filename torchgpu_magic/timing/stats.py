"""Statistics and stopping (method steps 4 and 6): per-loop times summarised, when to stop sampling, and
how many loops fill one sample.

:class:`Stats` gives the median, quartiles and the median's 95 % confidence interval (distribution-free,
from order statistics); :func:`stop_reason` is the stopping rule: at least 7 samples and 0.2 s, then until
the CI lies within +-1 % of the median (or IQR/median < 2 %), ``max_time`` capping it.
:class:`Options` carries what the magic's options set, checked before anything runs; the rule reads its
limits there. Pure functions of numbers: no clock, no torch, so they are tested directly.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import MagicInputError

# ---- the method's constants (docs/timing-method.md, steps 4 and 6) --------------------------------------
TARGET_SAMPLE_S = 1e-3  # one sample lasts at least this long (step 4)
MAX_SAMPLE_WALL_S = 20e-3  # ... and the search stops growing it past this much wall time: under --cold
# an empty cell has next to no device time, every loop costing a spin and a synchronize
MIN_SAMPLES = 7  # step 6
MIN_TIME_S = 0.2  # step 6
MAX_TIME_S = 10.0  # step 6, default of --max-time
CI_TARGET = 0.01  # the median's 95 % CI within +-1 %
IQR_TARGET = 0.02  # ... or IQR/median below 2 %
FLOOR_SAMPLES = 3  # never fewer samples than this, even past max_time (median and IQR need them)
MAX_LOOPS = 10**9


# ---- statistics -----------------------------------------------------------------------------------------
def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (numpy's default method)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    """The median of ``values`` in any order."""
    return quantile(sorted(values), 0.5)


def ratio(part: float, whole: float) -> float:
    """``part / whole``, with 0 / 0 = 0 and x / 0 = inf (a zero median must not raise)."""
    if whole == 0:
        return 0.0 if part == 0 else math.inf
    return part / whole


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
        return ratio(self.iqr, self.median)

    @property
    def rel_ci(self) -> float:
        """Half-width of the median's 95 % CI relative to the median (the larger side)."""
        return ratio(max(self.median - self.ci_low, self.ci_high - self.median), self.median)

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        data = sorted(float(v) for v in values)
        n = len(data)
        if n == 0:
            return cls(0, *[math.nan] * 9)
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


# ---- options, loop counts and the stopping rule ---------------------------------------------------------
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
    roofline: bool = True  # count FLOPs and bytes in one extra, untimed run (--no-roofline: False)
    peak: Optional[tuple] = None  # --peak: (FLOP/s, bytes/s or None), in place of the table's
    min_time: float = MIN_TIME_S  # the empty-cell floor samples for less

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
        if self.peak is not None:
            values = list(self.peak) if isinstance(self.peak, (tuple, list)) else [self.peak]
            if not 1 <= len(values) <= 2 or not all(
                    v is None and i == 1 or isinstance(v, (int, float)) and 0 < v < math.inf
                    for i, v in enumerate(values)):
                raise MagicInputError(f"--peak takes FLOPS[,BYTES_PER_S]: numbers per second above 0, not "
                                      f"{self.peak!r}")
            if not self.roofline:
                raise MagicInputError("--peak goes with the roofline: drop --no-roofline to use it")


def next_loops(loops: int, elapsed: float, target: float) -> int:
    """The next loop count of the 1-2-5 sequence after ``loops``, aiming straight at ``target`` from
    ``elapsed`` (the time ``loops`` took), but growing at most 100-fold in one step."""
    want = loops * 100 if elapsed <= 0 else loops * target / elapsed
    want = min(max(want, loops + 1), loops * 100)
    sequence = (step * 10**decade for decade in itertools.count() for step in (1, 2, 5))
    return min(next(value for value in sequence if value >= want), MAX_LOOPS)


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
    if n >= MIN_SAMPLES and sampling_s >= opts.min_time and Stats.of(per_loop).settled():
        return "converged"
    if total_s >= opts.max_time and n >= FLOOR_SAMPLES:
        return "max-time"
    return None

