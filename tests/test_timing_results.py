"""What a measurement becomes (torchgpu_magic/timing/results.py): the method's warnings, the result's
headline, text, HTML and plain data, the comparison's speed-ups, and the kernel table."""
from __future__ import annotations

import pytest
from fake_clock import FakeClock, fake_run

from torchgpu_magic import timing
from torchgpu_magic.timing import Options, Stats, engine


# ---- warnings -------------------------------------------------------------------------------------------
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


def test_a_cell_that_waits_for_the_gpu_is_not_called_launch_bound():
    stats = Stats.of([1e-3] * 5)
    waits = timing.assess(stats, "device", host=0.99e-3, device=1e-3, wall=1.01e-3, syncs=1)
    assert len(waits) == 1 and waits[0].startswith("the cell waits for the GPU (1 synchronizing call per")


def test_the_floor_warning_says_which_mode_the_floor_ran_in():
    stats = Stats.of([1e-6] * 5)
    assert "measured hot)" in timing.assess(stats, "host", host=1e-6, floor=1e-6)[0]
    cold = timing.assess(stats, "host", host=1e-6, floor=1e-6, cold=True, flush=True)[0]
    assert "measured with --cold, without --flush-l2)" in cold


def test_work_on_other_streams_makes_wall_time_the_headline():
    clock = FakeClock(lambda call, loops: 2e-3, kind="device", host_ratio=0.01, wall_ratio=5.0)
    run = fake_run(clock, warmup=0, samples=5, loops=1)
    result = timing.result_from(run, clock, "cuda:0", (0, 0, 0), None, Options(samples=5), 1, "t", "GPU")
    assert result.kind == "wall" and result.median == pytest.approx(10e-3)
    assert result.device_time == pytest.approx(2e-3)
    assert result.headline().startswith("10.0 ms synchronized wall time per loop")
    assert any("other streams" in w and "headline is the synchronized wall time" in w
               for w in result.warnings)


# ---- results --------------------------------------------------------------------------------------------
def _result(per_loop=2e-3, kind="device", **kw):
    clock = FakeClock(lambda call, loops: per_loop, kind=kind, host_ratio=0.01)
    run = fake_run(clock, warmup=0, samples=9, loops=1)
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
    hot = timing.kernel_table(rows, device=True, hot_only=True).to_text()
    assert "run hot: without --cold / --flush-l2" in hot


def test_no_kernels_recorded_is_told_apart_from_no_op_ran():
    assert engine.empty_kernels_reason(True, 0) == "no torch op ran"
    assert engine.empty_kernels_reason(False, 0) == "no torch op ran"
    reason = engine.empty_kernels_reason(True, 3)
    assert "3 torch ops but no GPU kernel" in reason and "CUPTI" in reason
    text = timing.kernel_table([], device=True, empty=reason).to_text()
    assert "CUPTI" in text and "no torch op ran" not in text
