"""What a measurement becomes (torchgpu_magic/timing/results.py): the method's warnings, the result's
headline, text, HTML and plain data, the comparison's speed-ups, and the kernel table."""
from __future__ import annotations

import functools
import re

import pytest
from fake_clock import FakeClock, fake_run
from profiler_events import function_event

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


def test_launch_bound_is_judged_from_the_gpus_idle_time_between_kernels():
    """host >= 0.9 x device misfires once CUDA's launch queue fills (the host blocks on it while the GPU
    never idles): launch-bound comes from the --kernels pass's busy time, or is not said at all."""
    stats = Stats.of([1e-3] * 5)
    assert not timing.assess(stats, "device", host=0.95e-3, device=1e-3, wall=1.01e-3)  # no pass: silent
    assert not timing.assess(stats, "device", host=0.99e-3, device=1e-3, wall=1.01e-3, busy=0.97e-3)
    bound = timing.assess(stats, "device", host=0.3e-3, device=1e-3, wall=1.01e-3, busy=0.2e-3)
    assert len(bound) == 1 and bound[0].startswith("launch-bound: the GPU idled 80.0 % of the device time")
    assert not timing.assess(stats, "device", host=0.3e-3, device=1e-3, wall=1.01e-3, busy=0.2e-3, cold=True)


def test_other_streams():
    stats = Stats.of([1e-3] * 5)
    streams = timing.assess(stats, "device", host=1e-5, device=1e-3, wall=5e-3)
    assert len(streams) == 1 and "other streams" in streams[0]
    assert not timing.assess(stats, "device", host=1e-5, device=1e-3, wall=5e-3, flush=True)
    # a small absolute excess (sync latency on a tiny cell) is not work on other streams
    tiny = Stats.of([2e-6] * 5)
    assert not timing.assess(tiny, "device", host=1e-7, device=2e-6, wall=4e-6, loops=1)
    # host clocks have no device time to compare with
    assert not timing.assess(stats, "host", host=1e-3)


def test_cold_wall_time_is_not_taken_for_other_streams():
    """Under --cold every loop's wall time holds the tool's own spin and synchronize: a 10 us kernel has
    ~80 us of wall per loop, which says nothing about other streams (issue 19, item 2)."""
    stats = Stats.of([10e-6] * 20)
    assert not timing.assess(stats, "device", host=5e-6, device=10e-6, wall=86e-6, loops=100, cold=True)
    from torchgpu_magic.timing import flags

    assert flags.other_streams(10e-6, 86e-6, 100, flush=False)
    assert not flags.other_streams(10e-6, 86e-6, 100, flush=False, cold=True)


def test_a_cell_that_waits_for_the_gpu_says_so_and_its_idle_time_is_not_blamed_on_launches():
    stats = Stats.of([1e-3] * 5)
    waits = timing.assess(stats, "device", host=0.99e-3, device=1e-3, wall=1.01e-3, syncs=1)
    assert len(waits) == 1 and waits[0].startswith("the cell waits for the GPU (1 synchronizing call per")
    both = timing.assess(stats, "device", host=0.99e-3, device=1e-3, wall=1.01e-3, syncs=2, busy=1e-4)
    assert both[1].startswith("launch-bound") and "waits for the GPU above" in both[1]
    assert not timing.assess(stats, "device", host=0.99e-3, device=1e-3, syncs=None)  # not counted


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
    assert engine.empty_kernels_reason(False, 0) == "no torch op ran"
    assert engine.empty_kernels_reason(True, 0).startswith("no torch op ran")
    # CUPTI recorded CUDA activity (our own synchronize), but no kernel: the cell launched none
    assert engine.empty_kernels_reason(True, 0, runtime=1) == "the cell launched no GPU kernel"
    assert "2 torch ops ran on the host only" in engine.empty_kernels_reason(True, 2, runtime=1)
    reason = engine.empty_kernels_reason(True, 3)
    assert "3 torch ops but no CUDA activity" in reason and "CUPTI" in reason
    text = timing.kernel_table([], device=True, empty=reason).to_text()
    assert "CUPTI" in text and "no torch op ran" not in text


def _made_event(name, activity, start, end, device="CUDA", annotation=False, legacy=False):
    """A profiler event from a pass with CUDA activity, as newer torch carries it; with ``legacy``, as
    torch 2.11's carries it, without its activity."""
    return function_event(name, device, start, end, annotation, None if legacy else activity)


@pytest.mark.parametrize("legacy", [False, True], ids=["activity", "torch 2.11"])
def test_tally_counts_torch_ops_and_kernels_not_runtime_rows_or_annotations(legacy):
    """The runtime row of our own synchronize is no op (a cell that launched nothing is not told 'CUPTI
    unavailable'), and record_function ranges on the GPU's timeline are no kernels (issue 19, item 3);
    the same from torch 2.11's events, which carry no activity (its GPU run listed no kernel)."""
    _event = functools.partial(_made_event, legacy=legacy)
    events = [
        _event("aten::add", "cpu_op", 0, 5, device="CPU"),
        _event("step", "user_annotation", 0, 60, device="CPU", annotation=True),
        _event("cudaLaunchKernel", "cuda_runtime", 1, 3, device="CPU"),
        _event("cudaDeviceSynchronize", "cuda_runtime", 50, 60, device="CPU"),
        _event("step", "gpu_user_annotation", 10, 40, annotation=True),
        _event("add_kernel", "kernel", 10, 20),
        _event("add_kernel", "kernel", 15, 25),  # on another stream, overlapping the first
        _event("Memcpy DtoH", "gpu_memcpy", 30, 32),
    ]
    totals, ops, runtime, busy = engine.tally(events)
    assert ops == 1 and runtime == 2
    assert totals == {"add_kernel": (2, 20.0), "Memcpy DtoH": (1, 2.0)}  # no 'step' row
    assert busy == 15 + 2  # the union of 10-25 and 30-32
    totals, ops, runtime, busy = engine.tally(events[2:4])
    assert (totals, ops, runtime, busy) == ({}, 0, 2, 0.0)


def test_clock_lines_warn_under_75_percent_and_note_anything_below_the_max():
    from torchgpu_magic.timing import throttle

    readings = [(1980, ()), (1755, ("power cap",)), (345, ("idle",)), (None, None)]
    summary = throttle.ClockWatch(1980, None, readings).summary()
    # the idle reading (clocks already dropped) and the unreadable one say nothing about a sample; the
    # median of the others is the clock the roofline scales its peaks to
    assert summary == {"max_mhz": 1980, "samples": 2, "below_max": 1, "below_75": 0, "lowest_mhz": 1755,
                       "median_mhz": 1867.5, "reasons": ["power cap"]}
    warnings, notes = throttle.clock_lines(summary)
    assert warnings == [] and notes == [
        "SM clock below its max in 1 of 2 samples (lowest 1755 MHz, 88.6 % of 1980 MHz: power cap)"]
    at_max = throttle.ClockWatch(1980, None, [(1980, ("sync boost",))] * 2).summary()
    assert throttle.clock_lines(at_max) == (
        [], ["SM clock at its max (1980 MHz) in all 2 samples, with clock reasons reported: sync boost"])
    assert throttle.clock_lines(throttle.ClockWatch(None).summary()) == ([], [])
    assert throttle.ClockWatch(None).summary()["median_mhz"] is None


# ---- a small result object, as torch's Measurement --------------------------------------------------
def test_a_result_keeps_raw_samples_and_derives_its_statistics():
    result = _result()
    assert result.median == timing.Stats.of(result.samples).median and result.stats is result.stats
    data = result.to_dict()
    assert data["median"] == result.median and data["ci95"] == list(result.ci95) and data["converged"] is True
    raw = timing.TimingResult.__dataclass_fields__
    rebuilt = timing.TimingResult(**{k: v for k, v in data.items() if k in raw})
    assert rebuilt.median == result.median and rebuilt.to_text() == result.to_text()


def test_the_repr_is_one_short_line_and_ipython_prints_the_report():
    from IPython.core.formatters import PlainTextFormatter

    result = _result()
    assert repr(result) == "<TimingResult %%cudatime on cuda:0: 2.00 ms device time per loop, 9 x 1 loops>"
    assert PlainTextFormatter()(result) == result.to_text() != repr(result)


def test_results_go_into_torch_benchmark_compare():
    from torch.utils.benchmark import Compare

    cell = timing.compile_cell("y = x + 1", {"x": 1}, setup="x = 2")
    assert (cell.stmt, cell.setup) == ("y = x + 1", "x = 2")
    fast, slow = _result(1e-3), _result(4e-3)
    first = fast.to_measurement("add", "x + 1")
    assert first.median == pytest.approx(1e-3) and first.number_per_run == 1 and len(first.raw_times) == 9
    assert first.task_spec.description == "cuda:0" and first.task_spec.num_threads == 4
    compare = Compare([first, slow.to_measurement("add", "x + 1", description="cpu")])
    lines = str(compare).splitlines()
    assert lines[0].startswith("[----") and " add " in lines[0]
    assert re.fullmatch(r"\s*\|\s*cuda:0\s*\|\s*cpu\s*", lines[1]), lines  # a column per description
    assert re.fullmatch(r"\s*x \+ 1\s*\|\s*1\.0\s*\|\s*4\.0\s*", lines[3]), lines  # the row, in ms
