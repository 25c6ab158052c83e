"""The %%cudatime engine without IPython: statistics, auto-range, warm-up and the stopping rule driven by
an injected fake clock (deterministic), compile-once semantics, warnings and result objects."""
from __future__ import annotations

import math
import statistics

import pytest

from torchgpu_magic import timing
from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.timing import Clock, Options, Sample, Stats, engine


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


def _cell():
    cell = timing.compile_cell("pass", {})
    cell.start()
    return cell


def _run(clock, **options):
    return timing.measure(_cell(), clock, Options(**options))


# ---- statistics ----------------------------------------------------------------------------------------
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


# ---- auto-range ----------------------------------------------------------------------------------------
def test_next_loops_follows_1_2_5_and_aims_at_the_target():
    assert timing.next_loops(1, 0.4e-3, 1e-3) == 5
    assert timing.next_loops(5, 0.9e-3, 1e-3) == 10
    assert timing.next_loops(1, 1e-9, 1e-3) == 100  # at most 100-fold per step
    assert timing.next_loops(1, 0.0, 1e-3) == 100
    assert timing.loops_for(3e-6, 1e-3) == 500  # 200 x 3 us = 0.6 ms is short, 500 x 3 us = 1.5 ms
    assert timing.loops_for(2e-3, 1e-3) == 1


def test_autorange_picks_the_smallest_1_2_5_count_filling_a_millisecond():
    clock = FakeClock(lambda call, loops: 3e-6)
    run = _run(clock, samples=3)
    assert run.loops == 500
    assert clock.calls[0] == 1  # the first run is one loop
    assert all(s.loops == 500 for s in run.samples)


def test_one_busy_moment_does_not_end_the_search():
    # call 1 (the search's first sample) is slow: the confirming re-run shows the real cost
    clock = FakeClock(lambda call, loops: 5e-3 if call == 1 else 10e-6)
    assert _run(clock, samples=3, warmup=0).loops == 100


def test_warm_up_grows_the_loops_when_a_slow_start_fooled_the_search():
    # the first three calls (first run and the search's sample + confirmation) are slow
    clock = FakeClock(lambda call, loops: 2e-3 if call < 3 else 20e-6)
    run = _run(clock, samples=3)
    assert run.loops == 50  # 50 x 20 us = 1 ms


def test_fixed_loops_skip_the_search():
    clock = FakeClock(lambda call, loops: 1e-6)
    run = _run(clock, loops=7, samples=4, warmup=0)
    assert clock.calls == [1, 7, 7, 7, 7] and run.loops == 7


# ---- warm-up -------------------------------------------------------------------------------------------
def test_warm_up_runs_until_the_median_of_three_settles():
    # per-loop cost halves its excess every run after the search, then is flat
    def cost(call, loops):
        return 1e-3 * (1 + 2.0 ** -(call - 3)) if call > 3 else 2e-3

    clock = FakeClock(cost)
    run = _run(clock, samples=5, loops=1)
    warm = run.warmup_runs
    assert warm >= timing.WARMUP_MIN_RUNS + 1
    # the last warm-up windows moved less than 2 %
    per = [cost(c, 1) for c in range(1, 1 + warm)]
    now, before = statistics.median(per[-3:]), statistics.median(per[-4:-1])
    assert abs(now - before) / before < 0.02


def test_warm_up_lasts_at_least_25_ms_and_at_most_one_second():
    short = FakeClock(lambda call, loops: 1e-3)  # flat from the start: settled, but 25 ms first
    assert 25 <= _run(short, samples=3, loops=1).warmup_runs <= 26
    drifting = FakeClock(lambda call, loops: 1e-3 * 1.05 ** call)  # never settles
    run = _run(drifting, samples=3, loops=1, max_time=100)
    assert sum(1e-3 * 1.05 ** c for c in range(1, 1 + run.warmup_runs)) >= 1.0
    assert sum(1e-3 * 1.05 ** c for c in range(1, run.warmup_runs)) < 1.0


def test_warmup_option_runs_exactly_n_loops():
    clock = FakeClock(lambda call, loops: 1e-3)
    run = _run(clock, samples=2, loops=1, warmup=17)
    assert clock.calls == [1, 17, 1, 1] and run.warmup_runs == 17


# ---- the stopping rule ---------------------------------------------------------------------------------
def test_steady_samples_converge_after_7_samples_and_0_2_seconds():
    clock = FakeClock(lambda call, loops: 10e-6)
    run = _run(clock, loops=100, warmup=0)
    assert run.stop == "converged"
    assert len(run.samples) == 200  # 1 ms samples: 0.2 s needs 200 of them
    slow = FakeClock(lambda call, loops: 50e-3)
    run = _run(slow, loops=1, warmup=0)
    assert run.stop == "converged" and len(run.samples) == 7  # 7 samples last 0.35 s


def test_noisy_samples_do_not_converge_and_stop_at_max_time():
    # spread evenly over 1-3 ms (a golden-ratio sequence): the median's CI shrinks like 1/sqrt(n), too
    # slowly to reach +-1 % in 2 s
    clock = FakeClock(lambda call, loops: 1e-3 * (1 + 2 * ((call * 0.6180339887) % 1)))
    run = _run(clock, loops=1, warmup=0, max_time=2.0)
    assert run.stop == "max-time"
    assert 2.0 <= run.elapsed < 2.0 + 3e-3
    result = timing.result_from(run, clock, "cpu", (None, None, None), None, Options(max_time=2.0), 1,
                                "x", "y")
    assert result.converged is False
    assert any(w.startswith("not converged within --max-time 2 s") for w in result.warnings)


def test_median_ci_converges_where_iqr_alone_would_not():
    # 1 in 3 samples is 1.5 % slower: IQR/median stays ~1.5 % at first... then the CI narrows
    clock = FakeClock(lambda call, loops: 1e-3 * (1.015 if call % 3 == 0 else 1.0))
    run = _run(clock, loops=1, warmup=0)
    assert run.stop == "converged"
    per = [s.host for s in run.samples]
    assert Stats.of(per).settled() and len(per) >= 200


def test_at_least_three_samples_even_past_max_time():
    clock = FakeClock(lambda call, loops: 2.0)
    run = _run(clock, loops=1, warmup=0, max_time=1.0)
    assert run.stop == "max-time" and len(run.samples) == timing.FLOOR_SAMPLES


def test_fixed_samples_ignore_the_rule():
    clock = FakeClock(lambda call, loops: 1e-3 * (1 + call % 2))
    run = _run(clock, loops=1, warmup=0, samples=4)
    assert run.stop == "fixed" and len(run.samples) == 4


def test_stop_reason_is_a_pure_function():
    opts = Options()
    assert timing.stop_reason([1.0] * 6, 1.0, 1.0, opts) is None  # 7 samples needed
    assert timing.stop_reason([1.0] * 7, 0.1, 0.1, opts) is None  # 0.2 s needed
    assert timing.stop_reason([1.0] * 7, 0.2, 0.2, opts) == "converged"
    assert timing.stop_reason([1.0, 2.0] * 4, 5.0, 10.0, opts) == "max-time"
    assert timing.stop_reason([1.0, 2.0] * 4, 5.0, 9.9, opts) is None


# ---- first run -----------------------------------------------------------------------------------------
def test_first_run_is_timed_apart_and_excluded():
    clock = FakeClock(lambda call, loops: 1.0 if call == 0 else 2e-3, kind="device", host_ratio=0.01)
    run = _run(clock, warmup=0, samples=5)
    result = timing.result_from(run, clock, "cuda:0", (0, 1024, 2048), None, Options(samples=5), 1,
                                "t", "GPU")
    assert result.first_run == 1.0
    assert max(result.samples) == pytest.approx(2e-3)
    assert result.median == pytest.approx(2e-3) and result.device_time == pytest.approx(2e-3)
    assert result.host == pytest.approx(2e-5)
    assert "first run 1.00 s (excluded)" in result.to_text()


# ---- warnings ------------------------------------------------------------------------------------------
def test_noise_warnings_at_10_and_25_percent():
    assert timing.assess(Stats.of([1.0, 1.0, 1.0, 1.0]), "host") == []
    noisy = timing.assess(Stats.of([1.0, 1.0, 1.15, 1.15]), "host")
    assert len(noisy) == 1 and noisy[0].startswith("noisy")
    bad = timing.assess(Stats.of([1.0, 1.0, 1.4, 1.4]), "host")
    assert len(bad) == 1 and bad[0].startswith("unreliable")


def test_slowest_over_four_times_fastest():
    found = timing.assess(Stats.of([1.0] * 20 + [4.5]), "host")
    assert found == ["the slowest sample took 4.5 x the fastest: something is cached between runs, or the "
                     "machine was busy"]
    assert timing.assess(Stats.of([1.0] * 20 + [3.9]), "host") == []


def test_floor_warning_under_ten_times_an_empty_cell():
    stats = Stats.of([90e-9] * 5)
    assert any("empty cell" in w for w in timing.assess(stats, "host", floor=10e-9))
    assert not timing.assess(stats, "host", floor=8e-9)


def test_launch_bound_and_other_streams():
    stats = Stats.of([1e-3] * 5)
    bound = timing.assess(stats, "device", host=0.95e-3, device=1e-3, wall=1.01e-3)
    assert len(bound) == 1 and bound[0].startswith("launch-bound")
    assert not timing.assess(stats, "device", host=0.95e-3, device=1e-3, wall=1.01e-3, cold=True)
    streams = timing.assess(stats, "device", host=1e-5, device=1e-3, wall=5e-3)
    assert len(streams) == 1 and "other streams" in streams[0]
    assert not timing.assess(stats, "device", host=1e-5, device=1e-3, wall=5e-3, flush=True)
    # a small absolute excess (sync latency on a tiny cell) is not work on other streams
    tiny = Stats.of([2e-6] * 5)
    assert not timing.assess(tiny, "device", host=1e-7, device=2e-6, wall=4e-6, loops=1)
    # host clocks have no device time to compare with
    assert not timing.assess(stats, "host", host=1e-3)


# ---- compile once --------------------------------------------------------------------------------------
def test_setup_runs_once_in_the_cell_scope_and_loops_run_n_times():
    ns = {"log": []}
    cell = timing.compile_cell("count += 1\nlog.append(count)", ns, setup="count = 10\nlog.append('setup')")
    cell.start()
    cell.run(3)
    cell.run(2)
    assert ns["log"] == ["setup", 11, 12, 13, 14, 15]
    assert "count" not in ns  # like %timeit, the cell's names stay local
    cell.start()  # a fresh start runs the setup again (another device row)
    cell.run(1)
    assert ns["log"][-2:] == ["setup", 11]


def test_hooks_wrap_every_loop():
    ns = {"log": []}
    cell = timing.compile_cell("log.append('x')", ns)
    cell.start()
    cell.run(2, lambda: ns["log"].append("<"), lambda: ns["log"].append(">"))
    assert ns["log"] == ["<", "x", ">", "<", "x", ">"]


@pytest.mark.parametrize("code", ["return 1", "yield 1", "x = (", "await f()"])
def test_code_illegal_at_top_level_stays_a_syntax_error(code):
    with pytest.raises(SyntaxError):
        timing.compile_cell(code, {})


def test_errors_keep_the_cell_filename_and_line():
    cell = timing.compile_cell("a = 1\nb = 1 / 0", {}, filename="<my-cell>")
    cell.start()
    with pytest.raises(ZeroDivisionError) as info:
        cell.run(1)
    last = info.traceback[-1]
    assert str(last.path) == "<my-cell>" and last.lineno + 1 == 2


# ---- options, devices, floor, memory -------------------------------------------------------------------
@pytest.mark.parametrize("options", [dict(loops=0), dict(samples=0), dict(warmup=-1), dict(max_time=0),
                                     dict(max_time=float("nan")), dict(loops=2.5)])
def test_bad_options_are_refused_in_one_line(options):
    with pytest.raises(MagicInputError) as info:
        Options(**options).check()
    assert "\n" not in str(info.value)


def test_meta_cannot_be_timed():
    import torch

    with pytest.raises(MagicInputError, match="meta tensors hold no data"):
        timing.check_device(torch.device("meta"))
    timing.check_device(torch.device("cpu"), flush_l2=True)


def test_empty_cell_floor_is_measured_once_per_device_and_mode():
    clock = FakeClock(lambda call, loops: 25e-9)
    engine._FLOORS.pop(("fake:0", False), None)
    try:
        assert timing.empty_cell_floor("fake:0", clock=clock) == pytest.approx(25e-9)
        calls = len(clock.calls)
        assert timing.empty_cell_floor("fake:0", clock=clock) == pytest.approx(25e-9)
        assert len(clock.calls) == calls
    finally:
        engine._FLOORS.pop(("fake:0", False), None)


def test_cpu_memory_is_not_available_rather_than_invented():
    import torch

    probe = timing.MemoryProbe(torch.device("cpu"))
    probe.start()
    assert probe.stop() == (None, None, None)


def test_cpu_cache_size_is_positive():
    assert timing.cpu_cache_bytes() >= 2**20


# ---- results -------------------------------------------------------------------------------------------
def _result(per_loop=2e-3, kind="device", **kw):
    clock = FakeClock(lambda call, loops: per_loop, kind=kind, host_ratio=0.01)
    run = _run(clock, warmup=0, samples=9, loops=1)
    return timing.result_from(run, clock, "cuda:0" if kind == "device" else "cpu", (1000, 2048, 4096),
                              1e-8, Options(samples=9, **kw), 4, "2.13.0", "Fake GPU")


def test_result_headline_and_reprs():
    result = _result()
    assert result.headline() == ("2.00 ms device time per loop (median; IQR 0 s, min 2.00 ms; 9 samples x 1 "
                                 "loop)")
    text = result.to_text()
    assert "host enqueue 20.0" in text and "synchronized wall 2.00 ms" in text
    assert "peak +2.00 KiB above the 1000 B allocated before; reserved +4.00 KiB" in text
    html = result._repr_html_()
    assert "<table" in html and "device time" in html

    class Printer:
        out = ""

        def text(self, value):
            self.out += value

    printer = Printer()
    result._repr_pretty_(printer, False)
    assert printer.out == text


def test_result_to_dict_is_plain_data():
    import json

    data = _result(kind="host").to_dict()
    json.dumps(data)
    for key in ("median", "iqr", "min", "max", "mean", "std", "samples", "loops", "first_run", "host",
                "device_time", "wall", "memory_peak", "device_name", "torch_version", "converged",
                "warnings", "notes"):
        assert key in data
    assert data["device_time"] is None and data["kind"] == "host"
    assert data["std"] == 0.0 and len(data["samples"]) == 9


def test_comparison_speedup_relative_to_first_row():
    slow, fast = _result(4e-3), _result(1e-3)
    table = timing.TimingComparison([("cpu", slow), ("cuda:0", fast)])
    assert table.speedups() == [1.0, 4.0]
    assert "4.00x" in table.to_text() and "4.00x" in table._repr_html_()
    rows = table.to_dict()["rows"]
    assert [r["label"] for r in rows] == ["cpu", "cuda:0"] and rows[1]["speedup"] == 4.0


def test_kernel_table_lists_rows():
    rows = [timing.KernelRow("aten::mm", 1, 1e-3, 0.9), timing.KernelRow("aten::add", 2, 1e-4, 0.1)]
    text = timing.kernel_table(rows, device=False).to_text()
    assert "aten::mm" in text and "90.0 %" in text
    assert "no torch op ran" in timing.kernel_table([], device=True).to_text()
