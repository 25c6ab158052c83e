"""The roofline's analysis and report (timing/roofline.py): the bound on both sides of the ridge point
with a synthetic peak, percentages for one precision and a mix, the SM clock's scaling (and a clock
reading the achieved figures prove wrong), achieved figures without a peak, the notes that say what the
counts leave out, ``--peak`` parsing, and the object as plain data."""
from __future__ import annotations

import pytest

from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.timing import peaks, roofline
from torchgpu_magic.timing.counting import Counts

SYNTHETIC = peaks.Peak("Synthetic", {"fp32": 100e9}, 10e9, "test")  # ridge: 10 FLOP/B


def counts(flops=0, nbytes=0, kind="fp32", where="cpu", **kw):
    return Counts(flops={(where, kind): flops} if flops else {}, bytes={where: nbytes}, ops=1, **kw)


def test_above_the_ridge_point_the_cell_is_compute_bound():
    rl = roofline.analyse(counts(20_000_000, 1_000_000), "cpu", 0.4e-3, SYNTHETIC)  # intensity 20
    assert rl.intensity == 20 and rl.ridge == pytest.approx(10)
    assert rl.achieved_flops == pytest.approx(50e9) and rl.flops_fraction == pytest.approx(0.5)
    assert rl.achieved_bandwidth == pytest.approx(2.5e9) and rl.bandwidth_fraction == pytest.approx(0.25)
    assert rl.bound == "compute"
    assert rl.line() == ("50.0 GFLOP/s (50.0 % of Synthetic fp32), 2.50 GB/s (25.0 % of 10.0 GB/s); "
                         "compute-bound (intensity 20.0 FLOP/B, ridge 10.0 FLOP/B)")
    assert rl.short() == "50.0 GFLOP/s (50.0 %), 2.50 GB/s (25.0 %)"


def test_below_the_ridge_point_the_cell_is_memory_bound():
    rl = roofline.analyse(counts(5_000_000, 1_000_000), "cpu", 0.2e-3, SYNTHETIC)  # intensity 5
    assert rl.intensity == 5 and rl.bound == "memory"
    assert rl.flops_fraction == pytest.approx(0.25) and rl.bandwidth_fraction == pytest.approx(0.5)
    assert rl.line().endswith("; memory-bound (intensity 5.00 FLOP/B, ridge 10.0 FLOP/B)")


def test_no_flops_at_all_is_memory_bound_with_a_bandwidth_percentage_only():
    rl = roofline.analyse(counts(0, 12_000_000), "cpu", 2e-3, SYNTHETIC)
    assert rl.bound == "memory" and rl.flops_fraction is None
    assert rl.line() == "no FLOPs counted, 6.00 GB/s (60.0 % of 10.0 GB/s); memory-bound (intensity 0 FLOP/B)"


def test_a_mix_of_precisions_is_held_against_each_ones_peak():
    peak = peaks.Peak("Mixed", {"bf16": 400e9, "fp32": 100e9}, 10e9, "test")
    mix = Counts(flops={("cuda", "bf16"): 8_000_000, ("cuda", "fp32"): 2_000_000}, bytes={"cuda": 100_000})
    rl = roofline.analyse(mix, "cuda", 1e-4, peak)
    assert rl.compute_time == pytest.approx(8e6 / 400e9 + 2e6 / 100e9)  # 40 us at peak
    assert rl.flops_fraction == pytest.approx(0.4) and rl.bound == "compute"
    assert "(40.0 % of Mixed peaks for this mix (bf16 80.0 %, fp32 20.0 % of FLOPs))" in rl.line()


def test_without_a_peak_the_line_has_achieved_figures_and_the_intensity_only():
    rl = roofline.analyse(counts(20_000_000, 1_000_000), "cpu", 0.4e-3, None)
    assert rl.bound is None and rl.flops_fraction is None and rl.bandwidth_fraction is None
    assert rl.line() == "50.0 GFLOP/s, 2.50 GB/s; intensity 20.0 FLOP/B"
    assert rl.short() == "50.0 GFLOP/s, 2.50 GB/s"


def test_a_precision_the_table_lacks_gets_no_percentage_and_a_note():
    v100 = peaks.resolve(peaks.lookup("Tesla V100-SXM2-16GB"), "Tesla V100-SXM2-16GB", 80, None)
    rl = roofline.analyse(counts(1_000_000, 1000, kind="bf16", where="cuda"), "cuda", 1e-3, v100)
    assert rl.flops_fraction is None and rl.bound is None
    assert "roofline: no bf16 peak for V100 SXM2 in the table: no FLOP/s percentage" in rl.notes


def test_the_peak_follows_the_sm_clock_the_samples_ran_at_and_the_report_says_the_scaled_peak():
    h100 = peaks.resolve(peaks.lookup("NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3", 132, 1464.0)
    rl = roofline.analyse(counts(500_000_000, 1_000_000, kind="bf16", where="cuda"), "cuda", 1e-6, h100)
    assert rl.clock_scales == {"bf16": pytest.approx(0.8)} and rl.reference_mhz == {"bf16": 1830}
    assert rl.flops_fraction == pytest.approx(500e12 / (989.5e12 * 0.8))
    assert ("roofline: FLOP/s peaks scaled to the SM clock the samples ran at, 1,464 of the 1,830 MHz the "
            "table's figures assume (the median of NVML's readings after each sample): bf16 792 TFLOP/s"
            ) in rl.notes
    assert "(63.2 % of H100 SXM bf16 dense at 1,464 MHz)" in rl.line()


def test_a_mix_is_scaled_from_each_precisions_own_clock_and_the_report_says_both():
    """fp32 figures assume the H100's 1980 MHz, bf16 ones 1830 MHz (issue 28, item 10)."""
    h100 = peaks.resolve(peaks.lookup("NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3", 132, 1464.0)
    mix = Counts(flops={("cuda", "bf16"): 400_000_000, ("cuda", "fp32"): 10_000_000},
                          bytes={"cuda": 1_000_000})
    rl = roofline.analyse(mix, "cuda", 1e-3, h100)
    assert rl.clock_scales == {"bf16": pytest.approx(1464 / 1830), "fp32": pytest.approx(1464 / 1980)}
    assert rl.peak_flops["fp32"] == pytest.approx(67e12 * 1464 / 1980)
    assert rl.compute_time == pytest.approx(4e8 / (989.5e12 * 0.8) + 1e7 / (67e12 * 1464 / 1980))
    assert any(n.startswith("roofline: FLOP/s peaks scaled to the SM clock the samples ran at, 1,464 of the "
                            "1,830 (bf16) / 1,980 (fp32) MHz the table's figures assume") for n in rl.notes)


def test_a_clock_the_achieved_flops_prove_wrong_is_dropped():
    """A GPU that slowed down between a sample and its reading: 800 TFLOP/s cannot have run at 345 MHz."""
    h100 = peaks.resolve(peaks.lookup("NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3", 132, 345.0)
    rl = roofline.analyse(counts(800_000_000, 1_000_000, kind="bf16", where="cuda"), "cuda", 1e-6, h100)
    assert rl.clock_scales == {} and rl.flops_fraction == pytest.approx(800 / 989.5)
    assert any(n.startswith("roofline: the SM clock NVML read after the samples (345 MHz, their median) is "
                            "below what the achieved") for n in rl.notes)
    assert "(80.8 % of H100 SXM bf16 dense)" in rl.line()


def test_the_notes_say_what_the_counts_are_and_leave_out():
    rl = roofline.analyse(counts(1_000_000, 4_000, uncounted={f"aten.op{i}": i for i in range(1, 8)},
                                 opaque={"cond": 2}, compiled=True), "cpu", 1e-3, None)
    first = rl.notes[0]
    assert first.startswith("roofline: 1.00 MFLOP and 4.00 kB per loop, counted in one extra untimed run")
    assert "--no-roofline skips it, for a cell that must not run again" in first
    # bytes are each op's reads and writes: less where data stays in L2, so never "a lower bound" (issue 28)
    assert "lower bound" not in first and "less where data stays in L2 between ops" in first
    assert ("roofline: FLOPs count matmuls, convolutions and attention (torch's FlopCounterMode); not "
            "counted: aten.op7 x7, aten.op6 x6, aten.op5 x5, aten.op4 x4, aten.op3 x3 and 2 more; the FLOP "
            "figure is a lower bound") in rl.notes
    assert any("the FLOPs and bytes inside cond x2 are not counted" in n for n in rl.notes)
    assert any(n.startswith("roofline: torch.compile'd code ran eagerly for the count") for n in rl.notes)


def test_work_on_another_device_is_left_out_and_said():
    mixed = Counts(flops={("cpu", "fp32"): 10, ("cuda", "fp32"): 1000}, bytes={"cpu": 40, "cuda": 4000})
    rl = roofline.analyse(mixed, "cuda", 1e-3, None)
    assert rl.flops == 1000 and rl.bytes == 4000
    assert "roofline: 10 FLOP and 40 B on cpu are left out (not the timed device)" in rl.notes


def test_a_run_that_saw_no_op_says_so_and_shows_no_line():
    rl = roofline.analyse(Counts(), "cuda", 1e-3, SYNTHETIC)
    assert rl.line() is None and rl.short() == "-"
    assert any(n.startswith("roofline: the counting run saw no torch op") for n in rl.notes)


def test_above_peak_bandwidth_says_the_data_stays_in_cache():
    rl = roofline.analyse(counts(0, 100_000_000), "cpu", 1e-3, SYNTHETIC)  # 100 GB/s against 10
    assert rl.bandwidth_fraction == pytest.approx(10)
    assert any(n.startswith("roofline: above the peak bandwidth: the data stays in cache") for n in rl.notes)


def test_to_dict_carries_flops_bytes_achieved_peaks_fractions_and_bound_and_comes_back():
    rl = roofline.analyse(counts(20_000_000, 1_000_000), "cpu", 0.4e-3, SYNTHETIC)
    data = rl.to_dict()
    assert data["flops"] == 20_000_000 and data["bytes"] == 1_000_000 and data["bound"] == "compute"
    assert data["achieved_flops"] == pytest.approx(50e9) and data["flops_fraction"] == pytest.approx(0.5)
    assert data["peak_flops"] == {"fp32": 100e9} and data["peak_bandwidth"] == 10e9
    assert data["peak_name"] == "Synthetic" and data["flops_by_precision"] == {"fp32": 20_000_000}
    assert "notes" not in data  # the notes are the result's
    again = roofline.Roofline.from_dict(data)
    assert again.line() == rl.line() and again.bound == "compute"


@pytest.mark.parametrize(("text", "expected"), [
    ("1.5e12,2e11", (1.5e12, 2e11)), ("1.5T,200G", (1.5e12, 200e9)), ("312T", (312e12, None)),
    (" 2e9 , 5e9 ", (2e9, 5e9)), ("800k", (800e3, None)), (".5P", (0.5e15, None)),
])
def test_peak_option_values(text, expected):
    flops, bandwidth = roofline.parse_peak(text)
    assert flops == pytest.approx(expected[0])
    assert bandwidth == (None if expected[1] is None else pytest.approx(expected[1]))


@pytest.mark.parametrize("text", ["", "fast", "1,2,3", "0", "-1", "1e12,", "1X", "1T,0", "nan", "inf"])
def test_bad_peak_values_say_what_is_valid(text):
    with pytest.raises(MagicInputError, match=r"--peak takes FLOPS\[,BYTES_PER_S\]: one or two numbers"):
        roofline.parse_peak(text)


def test_causal_attention_is_said_with_its_convention_and_no_longer_passes_the_peak():
    """Counted as full, a causal attention kernel reached up to 2x its real FLOP/s and, past 100 %, the
    report blamed the clock (issue 28, item 6)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from torchgpu_magic.timing import counting

    q = torch.randn(2, 4, 256, 64)
    measured = counting.count(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
                              contextlib.nullcontext)
    causal_work = 4 * 2 * 4 * 64 * (256 * 257 // 2)  # what the kernel does: the attended pairs
    seconds = causal_work / (0.75 * 1e9)  # a kernel running at 75 % of a 1 GFLOP/s --peak
    rl = roofline.analyse(measured, "cpu", seconds, peaks.user_peak(1e9, 1e12, None))
    assert rl.flops_fraction == pytest.approx(0.75)
    assert not any("above the FLOP/s peak" in n for n in rl.notes)
    assert any(n.startswith("roofline: causal attention (aten._scaled_dot_product_flash_attention_for_cpu "
                            "x1) "
                            "counted by the (query, key) pairs it attends") for n in rl.notes)
