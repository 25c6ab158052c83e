"""The peak table (timing/peaks.py): every model the roofline promises, matched by the names torch and NVML
report, each entry with its source; unknown GPUs; the share of SMs and memory slices a MIG instance has;
and the peaks scaled to an SM clock below the one the figures assume (the clock itself is the samples',
tests/test_timing_clocks.py; the whole path on the simulated H100 is in tests/test_simulated_roofline.py)."""
from __future__ import annotations

import pytest
import torch

from torchgpu_magic.timing import peaks

# (the name torch.cuda.get_device_name / nvmlDeviceGetName report, the table's entry)
REPORTED = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA GH200 144G HBM3e", "GH200 144GB HBM3e"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"),
    ("GeForce RTX 3090", "RTX 3090"),
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "A100 SXM 40GB"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "H100 SXM"),
]


@pytest.mark.parametrize(("reported", "entry"), REPORTED)
def test_each_model_is_found_by_the_name_torch_and_nvml_report(reported, entry):
    model = peaks.lookup(reported)
    assert model is not None and model.name == entry


@pytest.mark.parametrize("reported", [
    "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4090 D",
    "NVIDIA GeForce RTX 3060 Laptop GPU", "NVIDIA H20", "NVIDIA H800", "NVIDIA GB200", "NVIDIA L40",
    "NVIDIA A30", "Tesla V100-SXM3-32GB", "AMD Instinct MI300X", "", "cpu",
])
def test_a_gpu_the_table_does_not_hold_is_unknown(reported):
    assert peaks.lookup(reported) is None


def test_the_table_covers_every_model_the_roofline_promises():
    promised = {"H100 SXM", "H100 PCIe", "H100 NVL", "H200", "GH200", "B200", "A100 SXM 40GB",
                "A100 SXM 80GB", "A100 PCIe 40GB", "A100 PCIe 80GB", "L40S", "L4", "A10G", "T4", "V100 SXM2",
                "V100 PCIe", "RTX 4090", "RTX 3090"}
    assert promised <= {model.name for model in peaks.TABLE}


@pytest.mark.parametrize("model", peaks.TABLE, ids=lambda m: m.name)
def test_each_entry_names_its_source_and_has_figures(model):
    assert model.source.startswith("https://")
    assert set(model.flops) <= set(peaks.PRECISIONS) and model.flops.get("fp32", 0) > 1e12
    assert model.flops.get("fp16", 0) > model.flops["fp32"]  # a tensor-core figure is listed
    assert 1e11 < model.bandwidth < 1e13 and model.sms > 0 and 1000 < model.clock_mhz < 3000


def test_datasheet_figures_are_the_dense_ones():
    h100 = peaks.lookup("NVIDIA H100 80GB HBM3")
    assert h100.flops["bf16"] == 989.5e12 and h100.flops["fp8"] == 1979e12  # 1,979 / 3,958 with sparsity
    assert h100.bandwidth == 3.35e12 and h100.clock_mhz == 1830
    assert h100.flops["bf16"] / h100.bandwidth == pytest.approx(295, abs=1)  # the H100's ridge point
    a100 = peaks.lookup("NVIDIA A100-SXM4-80GB")
    assert a100.flops["tf32"] == 156e12 and a100.bandwidth == 2039e9 and "fp8" not in a100.flops
    t4 = peaks.lookup("Tesla T4")
    assert t4.flops == {"fp32": 8.1e12, "fp16": 65e12}  # no bf16, no TF32 on Turing


def test_a_peak_falls_back_from_tf32_to_fp32_where_the_gpu_has_no_tf32():
    peak = peaks.resolve(peaks.lookup("Tesla V100-SXM2-16GB"), "Tesla V100-SXM2-16GB", 80, None)
    assert peak.flops_for("tf32") == 15.7e12 and peak.label("tf32") == "V100 SXM2 fp32"
    assert peak.flops_for("bf16") is None  # Volta has no bf16 tensor cores
    assert peak.label("fp16") == "V100 SXM2 fp16 dense"


def test_a_mig_instance_gets_its_share_of_sms_and_memory_slices():
    name = "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    peak = peaks.resolve(peaks.lookup(name), name, 42, None)
    assert peak.flops["bf16"] == pytest.approx(312e12 * 42 / 108)
    assert peak.bandwidth == pytest.approx(1555e9 / 2)
    assert peak.notes == ["roofline: FLOP/s peaks scaled to the 42 of 108 SMs this device has",
                          "roofline: bandwidth scaled to the MIG instance's 20 of 40 GB memory slices"]


def test_the_peak_scales_with_an_sm_clock_below_the_one_the_figures_assume():
    model = peaks.lookup("NVIDIA H100 80GB HBM3")
    slow = peaks.resolve(model, "NVIDIA H100 80GB HBM3", 132, 1464.0)
    assert slow.scale_for("bf16") == pytest.approx(0.8)
    assert slow.flops_for("bf16") == pytest.approx(989.5e12 * 0.8)
    assert slow.flops_for("bf16", clocked=False) == 989.5e12
    fast = peaks.resolve(model, "NVIDIA H100 80GB HBM3", 132, 1980.0)  # above 1830: the datasheet holds
    assert fast.scale_for("bf16") == 1.0 and fast.flops_for("bf16") == 989.5e12
    assert peaks.resolve(model, "NVIDIA H100 80GB HBM3", 132, None).scale_for("bf16") == 1.0


def test_fp32_and_fp64_peaks_scale_from_the_clock_their_own_figures_assume():
    """An H100 SXM's 67 TFLOP/s fp32 is 132 SMs x 128 lanes x 2 FLOP at 1980 MHz; its tensor figures
    assume 1830 MHz. Throttled to 1464 MHz, fp32 keeps 1464/1980 of its peak, not 1464/1830 (issue 28,
    item 10: "% of fp32 peak" read up to 8 % low)."""
    model = peaks.lookup("NVIDIA H100 80GB HBM3")
    assert model.flops["fp32"] == pytest.approx(132 * 128 * 2 * 1980e6, rel=0.01)
    assert model.flops["bf16"] == pytest.approx(132 * 4096 * 1830e6, rel=0.01)
    slow = peaks.resolve(model, "NVIDIA H100 80GB HBM3", 132, 1464.0)
    assert slow.flops_for("fp32") == pytest.approx(67e12 * 1464 / 1980)
    assert slow.flops_for("fp64") == pytest.approx(67e12 * 1464 / 1980)
    assert slow.flops_for("tf32") == pytest.approx(494.5e12 * 1464 / 1830)
    at_1900 = peaks.resolve(model, "NVIDIA H100 80GB HBM3", 132, 1900.0)  # above 1830, below 1980
    assert at_1900.flops_for("bf16") == 989.5e12
    assert at_1900.flops_for("fp32") == pytest.approx(67e12 * 1900 / 1980)
    a100 = peaks.resolve(peaks.lookup("NVIDIA A100-SXM4-80GB"), "NVIDIA A100-SXM4-80GB", 108, 1128.0)
    assert a100.scale_for("fp32") == a100.scale_for("bf16") == pytest.approx(0.8)  # one boost clock


@pytest.mark.parametrize("model", peaks.TABLE, ids=lambda m: m.name)
def test_each_fp32_figure_is_what_its_sms_do_at_the_clock_it_is_said_to_assume(model):
    """fp32 FLOP/s = SMs x FP32 lanes x 2 at ``core_clock_mhz`` (within 2 %): the clock recorded for each
    entry is the one its figure implies."""
    lanes = {"T4": 64, "V100 SXM2": 64, "V100 PCIe": 64, "V100S PCIe": 64, "A100 SXM 80GB": 64,
             "A100 SXM 40GB": 64, "A100 PCIe 80GB": 64, "A100 PCIe 40GB": 64}.get(model.name, 128)
    clock = model.core_clock_mhz or model.clock_mhz
    assert model.flops["fp32"] == pytest.approx(model.sms * lanes * 2 * clock * 1e6, rel=0.02), model.name


def test_the_users_peak_replaces_the_table_and_keeps_its_bandwidth_unless_given():
    table = peaks.resolve(peaks.lookup("NVIDIA L4"), "NVIDIA L4", 58, 1000.0)
    mine = peaks.user_peak(50e12, None, table)
    assert mine.flops_for("bf16") == mine.flops_for("fp64") == 50e12 and mine.bandwidth == 300e9
    assert mine.scale_for("bf16") == 1.0 and mine.label("bf16") == "--peak"
    assert peaks.user_peak(1e12, 2e11, table).bandwidth == 2e11
    assert peaks.user_peak(1e12, None, None).bandwidth is None


def test_cpu_and_other_devices_have_no_peak_but_a_hint():
    peak, notes = peaks.for_device(torch.device("cpu"))
    assert peak is None
    assert notes == ["roofline: no peak figures for cpu (--peak FLOPS[,BYTES_PER_S] sets one, for a "
                     "percentage)"]


def test_the_docs_list_every_entry_with_its_source():
    from conftest import ROOT

    readme = (ROOT / "docs" / "cudatime.md").read_text()
    for model in peaks.TABLE:
        assert model.source.split()[0] in readme, model.name
        assert f"{model.flops['fp32'] / 1e12:g}" in readme, model.name
