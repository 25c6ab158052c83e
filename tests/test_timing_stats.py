"""Statistics and stopping (torchgpu_magic/timing/stats.py): quantiles and the median's CI against the
standard library, the 1-2-5 loop counts, the stopping rule as a pure function, and the options' checks."""
from __future__ import annotations

import math
import statistics

import pytest

from torchgpu_magic import timing
from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.timing import Options, Stats


# ---- statistics -----------------------------------------------------------------------------------------
def test_stats_match_the_standard_library_and_numpy_quantiles():
    data = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 7.0, 8.0]
    stats = Stats.of(data)
    assert stats.median == statistics.median(data)
    assert stats.mean == pytest.approx(statistics.mean(data))
    assert stats.std == pytest.approx(statistics.stdev(data))
    assert (stats.q1, stats.q3) == (pytest.approx(2.75), pytest.approx(7.25))  # numpy.percentile, linear
    assert (stats.min, stats.max, stats.n) == (1.0, 10.0, 8)
    assert stats.iqr == pytest.approx(4.5)


def test_median_confidence_interval_from_order_statistics():
    seven = Stats.of(range(1, 8))
    assert (seven.ci_low, seven.ci_high) == (1, 7)  # with 7 samples the 95 % CI is the whole range
    hundred = Stats.of(range(1, 101))
    assert (hundred.ci_low, hundred.ci_high) == (40, 61)  # ranks n/2 -+ 1.96 sqrt(n)/2
    assert hundred.rel_ci == pytest.approx((61 - 50.5) / 50.5)


def test_single_sample_and_zero_median_do_not_divide_by_zero():
    one = Stats.of([2.0])
    assert one.median == 2.0 and math.isnan(one.std) and one.iqr == 0
    zero = Stats.of([0.0, 0.0, 0.0])
    assert zero.rel_iqr == 0 and zero.rel_ci == 0 and zero.settled()


# ---- loop counts ----------------------------------------------------------------------------------------
def test_next_loops_follows_1_2_5_and_aims_at_the_target():
    assert timing.next_loops(1, 0.4e-3, 1e-3) == 5
    assert timing.next_loops(5, 0.9e-3, 1e-3) == 10
    assert timing.next_loops(1, 1e-9, 1e-3) == 100  # at most 100-fold per step
    assert timing.next_loops(1, 0.0, 1e-3) == 100
    assert timing.loops_for(3e-6, 1e-3) == 500  # 200 x 3 us = 0.6 ms is short, 500 x 3 us = 1.5 ms
    assert timing.loops_for(2e-3, 1e-3) == 1


# ---- the stopping rule ----------------------------------------------------------------------------------
def test_stop_reason_is_a_pure_function():
    opts = Options()
    assert timing.stop_reason([1.0] * 6, 1.0, 1.0, opts) is None  # 7 samples needed
    assert timing.stop_reason([1.0] * 7, 0.1, 0.1, opts) is None  # 0.2 s needed
    assert timing.stop_reason([1.0] * 7, 0.2, 0.2, opts) == "converged"
    assert timing.stop_reason([1.0, 2.0] * 4, 5.0, 10.0, opts) == "max-time"
    assert timing.stop_reason([1.0, 2.0] * 4, 5.0, 9.9, opts) is None


# ---- options --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [dict(loops=0), dict(samples=0), dict(warmup=-1), dict(max_time=0),
                                     dict(max_time=float("nan")), dict(loops=2.5), dict(peak=(0,)),
                                     dict(peak=(1e12, -1.0)), dict(peak="1T"), dict(peak=(1, 2, 3)),
                                     dict(peak=(None,)), dict(peak=(float("inf"),)),
                                     dict(peak=(1e12,), roofline=False)])
def test_bad_options_are_refused_in_one_line(options):
    with pytest.raises(MagicInputError) as info:
        Options(**options).check()
    assert "\n" not in str(info.value)


def test_peak_options_the_engine_takes():
    for peak in ((1e12,), (1e12, None), (1e12, 2e11), [3, 4.5]):
        Options(peak=peak).check()
