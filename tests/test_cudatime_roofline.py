"""%%cudatime's roofline through a real InteractiveShell: the line under the headline in plain text and
HTML, --peak and --no-roofline, the counting run apart from the samples (and its failure turned into a
note), the comparison table's achieved column, -o's plain data; and, under the `gpu` marker, a bf16
matmul and a large elementwise add against the table's peaks on a real GPU."""
from __future__ import annotations

import re

import pytest
from conftest import run
from IPython.core.formatters import PlainTextFormatter
from IPython.utils.capture import capture_output

FAST = "-n 2 -r 3 --warmup 0"
MATMUL_LINE = re.compile(r"^  \S+ [kMGT]?FLOP/s \(\S+ % of --peak\), \S+ [kMGT]?B/s \(\S+ % of 10\.0 GB/s\); "
                         r"memory-bound \(intensity 16\.0 FLOP/B, ridge 100 FLOP/B\)$")


@pytest.fixture
def tip(ip):
    """The shell with torch, a 64 x 64 cpu tensor and a log list (cells of cpu tensors are timed on the
    host, however initialised CUDA is)."""
    run(ip, "import torch\nx = torch.ones(64, 64)\nlog = []")
    return ip


def test_a_cpu_cell_gets_achieved_figures_under_the_headline_and_a_hint_for_a_peak(tip):
    result = run(tip, f"%%cudatime -o -q {FAST}\ny = x @ x")
    rl = result.roofline
    assert rl.flops == 2 * 64 ** 3 and rl.bound is None
    assert rl.bytes == 2 * 64 * 64 * 4  # x read once (one tensor is read once per op), the product written
    lines = PlainTextFormatter()(result).splitlines()
    assert lines[2] == "  " + rl.line() and re.fullmatch(r"  \S+ [kMGT]?FLOP/s, \S+ [kMGT]?B/s; intensity "
                                                          r"16\.0 FLOP/B", lines[2])
    hint = "  roofline: no peak figures for cpu (--peak FLOPS[,BYTES_PER_S] sets one, for a percentage)"
    assert hint in lines
    assert any(line.startswith("  roofline: 524 kFLOP and 32.8 kB per loop, counted in one extra untimed run")
               for line in lines)


def test_peak_gives_percentages_and_the_bound_in_text_and_html(tip):
    with capture_output() as captured:
        run(tip, f"%%cudatime {FAST} --peak 1T,10G\ny = x @ x")
    [shown] = captured.outputs
    text, page = shown.data["text/plain"], shown.data["text/html"]
    line = text.splitlines()[2]
    assert MATMUL_LINE.match(line), line
    assert f'<div class="torchgpu-magic-note">{line.strip()}</div>' in page  # its own line, as in the text
    result = run(tip, f"%%cudatime -o -q {FAST} --peak 1T,10G\ny = x @ x")
    assert MATMUL_LINE.match(PlainTextFormatter()(result).splitlines()[2])
    assert result.roofline.peak_flops == {"fp32": 1e12} and result.roofline.peak_bandwidth == 10e9


def test_the_counting_run_comes_once_after_the_samples_never_inside_them(tip):
    run(tip, "from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as modes")
    run(tip, f"%%cudatime -q {FAST}\nlog.append(len(modes()))")
    # the first run under the device watch (observe.watch), 3 x 2 timed loops under no mode; then the
    # counting run under its own
    assert tip.user_ns["log"] == [1] + [0] * 6 + [1]


def test_no_roofline_skips_the_counting_run_and_the_line(tip):
    result = run(tip, f"%%cudatime -o -q {FAST} --no-roofline\nlog.append(1)\ny = x @ x")
    assert tip.user_ns["log"] == [1] * 7 and result.roofline is None
    assert "FLOP" not in result.to_text() and "roofline" not in result.to_text()
    assert result.to_dict()["roofline"] is None and "achieved" not in result._repr_html_()


def test_o_carries_flops_bytes_achieved_peaks_fractions_and_bound(tip):
    data = run(tip, f"%cudatime -o -q {FAST} --peak 100G,10G x @ x").to_dict()["roofline"]
    assert data["flops"] == 2 * 64 ** 3 and data["bytes"] == 2 * 64 * 64 * 4
    assert data["achieved_flops"] > 0 and data["achieved_bandwidth"] > 0
    assert data["peak_flops"] == {"fp32": 100e9} and data["peak_bandwidth"] == 10e9
    assert data["flops_fraction"] > 0 and data["bandwidth_fraction"] > 0 and data["bound"] == "compute"
    assert data["intensity"] == pytest.approx(16.0)


def test_comparison_rows_get_an_achieved_column(tip):
    table = run(tip, f"%cudatime -o -q {FAST} --threads 1,2 --peak 1T,10G x @ x")
    text = PlainTextFormatter()(table)
    header = text.splitlines()[1]
    assert header.rstrip().endswith("achieved (% of peak)")
    rows = text.splitlines()[3:5]
    assert all(re.search(r"FLOP/s \(\S+ %\), \S+ [kMGT]?B/s \(\S+ %\)$", row) for row in rows), rows
    assert "achieved (% of peak)" in table._repr_html_()
    assert all(row["roofline"]["flops"] == 2 * 64 ** 3 for row in table.to_dict()["rows"])


def test_a_counting_run_that_fails_becomes_a_note_and_the_timing_stands(tip):
    run(tip, "runs = []")
    code = ("%%cudatime -o -q -n 1 -r 3 --warmup 0\nruns.append(1)\n"
            "if len(runs) == 5:\n    raise RuntimeError('only the fifth run fails')")
    result = run(tip, code)
    assert result.n == 3 and result.roofline.error == "RuntimeError: only the fifth run fails"
    assert ("roofline: not counted: the extra counting run raised RuntimeError: only the fifth run fails "
            "(--no-roofline skips that run)") in result.notes
    assert result.roofline.line() is None and "FLOP/s" not in result.to_text()


def test_a_peak_lookup_that_fails_costs_the_percentage_not_the_report(tip, monkeypatch):
    from torchgpu_magic.timing import peaks

    def broken(device, clock_mhz=None):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(peaks, "for_device", broken)
    result = run(tip, f"%%cudatime -o -q {FAST}\ny = x @ x")
    assert result.roofline.flops == 2 * 64 ** 3 and result.roofline.peak_name is None
    assert ("roofline: no peak figures: asking torch about cpu failed (RuntimeError: CUDA error: unspecified "
            "launch failure)") in result.notes
    mine = run(tip, f"%%cudatime -o -q {FAST} --peak 1T,10G\ny = x @ x")  # both given: no lookup at all
    assert mine.roofline.peak_bandwidth == 10e9 and not any("no peak figures" in n for n in mine.notes)


# ---- on a real GPU -----------------------------------------------------------------------------------
@pytest.fixture
def gip(tip):
    run(tip, "torch.ones(1, device='cuda')")
    return tip


def _table_peak(roofline):
    """The roofline of a GPU the peak table lists (skipped only for one it does not list: a listed GPU
    whose roofline came out without a peak is a failure, as torch 2.11's missing Tag.inplace once made)."""
    import torch

    from torchgpu_magic.timing import peaks

    name = torch.cuda.get_device_name()
    if peaks.lookup(name) is None:
        pytest.skip(f"{name} is not in the peak table")
    assert roofline.peak_name is not None and roofline.flops is not None, vars(roofline)
    return roofline


@pytest.mark.gpu
def test_gpu_bf16_matmul_runs_at_half_to_all_of_the_table_peak(gip):
    run(gip, "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\nb = torch.randn_like(a)")
    rl = _table_peak(run(gip, "%%cudatime -o -q --max-time 5\na @ b").roofline)
    assert rl.flops_by_precision == {"bf16": 2 * 8192 ** 3} and rl.bytes == 3 * 8192 ** 2 * 2
    assert 0.5 <= rl.flops_fraction <= 1.0, rl.line()
    assert rl.bound == "compute"


@pytest.mark.gpu
def test_gpu_large_elementwise_add_runs_at_half_to_all_of_the_memory_bandwidth(gip):
    run(gip, "p = torch.randn(2 ** 28, device='cuda')\nq = torch.randn_like(p)")  # 1 GiB each
    rl = _table_peak(run(gip, "%%cudatime -o -q --max-time 5\np + q").roofline)
    assert rl.flops == 0 and rl.bytes == 3 * 2 ** 28 * 4
    assert 0.5 <= rl.bandwidth_fraction <= 1.0, rl.line()
    assert rl.bound == "memory"
