"""The measuring loop (torchgpu_magic/timing/engine.py) driven by a fake clock on virtual time
(tests/fake_clock.py), so it is deterministic: auto-range, warm-up, the stopping rule, the first run
apart, and the empty-cell floor."""
from __future__ import annotations

import statistics

import pytest
from fake_clock import FakeClock, fake_run

from torchgpu_magic import timing
from torchgpu_magic.timing import Options, Sample, Stats, engine


# ---- auto-range -----------------------------------------------------------------------------------------
def test_autorange_picks_the_smallest_1_2_5_count_filling_a_millisecond():
    clock = FakeClock(lambda call, loops: 3e-6)
    run = fake_run(clock, samples=3)
    assert run.loops == 500
    assert clock.calls[0] == 1  # the first run is one loop
    assert all(s.loops == 500 for s in run.samples)


def test_one_busy_moment_does_not_end_the_search():
    # call 1 (the search's first sample) is slow: the confirming re-run shows the real cost
    clock = FakeClock(lambda call, loops: 5e-3 if call == 1 else 10e-6)
    assert fake_run(clock, samples=3, warmup=0).loops == 100


def test_warm_up_grows_the_loops_when_a_slow_start_fooled_the_search():
    # the first three calls (first run and the search's sample + confirmation) are slow
    clock = FakeClock(lambda call, loops: 2e-3 if call < 3 else 20e-6)
    run = fake_run(clock, samples=3)
    assert run.loops == 50  # 50 x 20 us = 1 ms


def test_fixed_loops_skip_the_search():
    clock = FakeClock(lambda call, loops: 1e-6)
    run = fake_run(clock, loops=7, samples=4, warmup=0)
    assert clock.calls == [1, 7, 7, 7, 7] and run.loops == 7


# ---- warm-up --------------------------------------------------------------------------------------------
def test_a_sample_stops_growing_at_20_ms_of_wall_time_whatever_its_device_time():
    """Under --cold an empty cell has next to no device time and every loop costs a spin and a synchronize:
    aiming at 1 ms of device time would grow a sample without end (1e9 loops)."""
    class ColdEmpty(FakeClock):
        def measure(self, cell, loops, mode):
            self.calls.append(loops)
            self.t += 100e-6 * loops
            return Sample(loops, host=10e-6 * loops, wall=100e-6 * loops, device=0.0)

    clock = ColdEmpty(None, kind="device")
    run = fake_run(clock, max_time=2.0)
    assert run.loops == 200 and max(clock.calls) == 200  # 20 ms of wall a sample, and never more


def test_warm_up_runs_until_the_median_of_three_settles():
    # per-loop cost halves its excess every run after the search, then is flat
    def cost(call, loops):
        return 1e-3 * (1 + 2.0 ** -(call - 3)) if call > 3 else 2e-3

    clock = FakeClock(cost)
    run = fake_run(clock, samples=5, loops=1)
    warm = run.warmup_runs
    assert warm >= timing.WARMUP_MIN_RUNS + 1
    # the last warm-up windows moved less than 2 %
    per = [cost(c, 1) for c in range(1, 1 + warm)]
    now, before = statistics.median(per[-3:]), statistics.median(per[-4:-1])
    assert abs(now - before) / before < 0.02


def test_warm_up_lasts_at_least_25_ms_and_at_most_one_second():
    short = FakeClock(lambda call, loops: 1e-3)  # flat from the start: settled, but 25 ms first
    assert 25 <= fake_run(short, samples=3, loops=1).warmup_runs <= 26
    drifting = FakeClock(lambda call, loops: 1e-3 * 1.05 ** call)  # never settles
    run = fake_run(drifting, samples=3, loops=1, max_time=100)
    assert sum(1e-3 * 1.05 ** c for c in range(1, 1 + run.warmup_runs)) >= 1.0
    assert sum(1e-3 * 1.05 ** c for c in range(1, run.warmup_runs)) < 1.0


def test_warmup_option_runs_exactly_n_loops():
    clock = FakeClock(lambda call, loops: 1e-3)
    run = fake_run(clock, samples=2, loops=1, warmup=17)
    assert clock.calls == [1, 17, 1, 1] and run.warmup_runs == 17


# ---- the stopping rule ----------------------------------------------------------------------------------
def test_steady_samples_converge_after_7_samples_and_0_2_seconds():
    clock = FakeClock(lambda call, loops: 10e-6)
    run = fake_run(clock, loops=100, warmup=0)
    assert run.stop == "converged"
    assert len(run.samples) == 200  # 1 ms samples: 0.2 s needs 200 of them
    slow = FakeClock(lambda call, loops: 50e-3)
    run = fake_run(slow, loops=1, warmup=0)
    assert run.stop == "converged" and len(run.samples) == 7  # 7 samples last 0.35 s


def test_noisy_samples_do_not_converge_and_stop_at_max_time():
    # spread evenly over 1-3 ms (a golden-ratio sequence): the median's CI shrinks like 1/sqrt(n), too
    # slowly to reach +-1 % in 2 s
    clock = FakeClock(lambda call, loops: 1e-3 * (1 + 2 * ((call * 0.6180339887) % 1)))
    run = fake_run(clock, loops=1, warmup=0, max_time=2.0)
    assert run.stop == "max-time"
    assert 2.0 <= run.elapsed < 2.0 + 3e-3
    result = timing.result_from(run, clock, "cpu", (None, None, None), None, Options(max_time=2.0), 1,
                                "x", "y")
    assert result.converged is False
    assert any(w.startswith("not converged within --max-time 2 s") for w in result.warnings)


def test_median_ci_converges_where_iqr_alone_would_not():
    # 1 in 3 samples is 1.5 % slower: IQR/median stays ~1.5 % at first... then the CI narrows
    clock = FakeClock(lambda call, loops: 1e-3 * (1.015 if call % 3 == 0 else 1.0))
    run = fake_run(clock, loops=1, warmup=0)
    assert run.stop == "converged"
    per = [s.host for s in run.samples]
    assert Stats.of(per).settled() and len(per) >= 200


def test_at_least_three_samples_even_past_max_time():
    clock = FakeClock(lambda call, loops: 2.0)
    run = fake_run(clock, loops=1, warmup=0, max_time=1.0)
    assert run.stop == "max-time" and len(run.samples) == timing.FLOOR_SAMPLES


def test_fixed_samples_ignore_the_rule():
    clock = FakeClock(lambda call, loops: 1e-3 * (1 + call % 2))
    run = fake_run(clock, loops=1, warmup=0, samples=4)
    assert run.stop == "fixed" and len(run.samples) == 4


# ---- first run ------------------------------------------------------------------------------------------
def test_first_run_is_timed_apart_and_excluded():
    clock = FakeClock(lambda call, loops: 1.0 if call == 0 else 2e-3, kind="device", host_ratio=0.01)
    run = fake_run(clock, warmup=0, samples=5)
    result = timing.result_from(run, clock, "cuda:0", (0, 1024, 2048), None, Options(samples=5), 1,
                                "t", "GPU")
    assert result.first_run == 1.0
    assert max(result.samples) == pytest.approx(2e-3)
    assert result.median == pytest.approx(2e-3) and result.device_time == pytest.approx(2e-3)
    assert result.host == pytest.approx(2e-5)
    assert "first run 1.00 s (excluded)" in result.to_text()


def test_a_first_run_longer_than_max_time_leaves_the_samples_their_budget():
    # torch.compile, autotuning or cudnn.benchmark: the first run alone outlasts --max-time
    clock = FakeClock(lambda call, loops: 5.0 if call == 0 else 1e-3)
    run = fake_run(clock, max_time=1.0)
    assert len(run.samples) >= 7 and run.stop == "converged"
    assert run.elapsed >= 5.0  # the whole measurement still counts the first run


def test_host_syncs_counted_in_a_warm_run_reach_the_result():
    class SyncingClock(FakeClock):
        def count_syncs(self, cell):
            self.measure(cell, 1, None)
            return 2

    clock = SyncingClock(lambda call, loops: 1e-3, kind="device", host_ratio=1.0)
    run = fake_run(clock, warmup=3, samples=5, loops=1)
    assert run.syncs == 2 and clock.calls == [1, 1, 2, 1, 1, 1, 1, 1]  # first, census, 2 more warm, 5
    result = timing.result_from(run, clock, "cuda:0", (0, 0, 0), None, Options(samples=5), 1, "t", "GPU")
    assert result.host_syncs == 2
    assert any(w.startswith("the cell waits for the GPU (2 synchronizing calls") for w in result.warnings)
    assert not any(w.startswith("launch-bound") for w in result.warnings)
    run = fake_run(SyncingClock(lambda call, loops: 1e-3, kind="device"), warmup=0, samples=5, loops=1)
    assert run.syncs is None  # --warmup 0: no warm run to count in


def test_time_cell_keeps_a_cpu_cell_on_the_host_and_runs_its_first_run_once():
    import torch

    runs = []
    cell = timing.compile_cell("runs.append(1)", {"runs": runs})
    result = engine.time_cell(cell, torch.device("cpu"), Options(loops=1, warmup=0, samples=3),
                              follow_cuda=True)
    assert result.kind == "host" and result.device == "cpu"
    # one first run (on the host clock), no second one, three samples, and the roofline's counting run
    assert len(runs) == 1 + 3 + 1
    assert result.roofline is not None and result.roofline.flops == 0


# ---- the empty-cell floor -------------------------------------------------------------------------------
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
