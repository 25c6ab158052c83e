"""``%%cudatime``'s roofline on the simulated H100 (tests/simulated_gpu.py, fixture ``simulated_gpu``): the
peak table entry chosen by the name torch reports, the percentage in the report, the peaks scaled to the
SM clock the samples ran at (NVML's readings after each sample), and the peak looked up for the device
the cell was timed on, not for "CUDA is initialised".

The simulation runs no CUDA kernel of a real op, so the cells' CUDA tensors are stand-ins
(:class:`simulated_gpu.CudaStandIn`): real metadata on ``cuda:0`` (what the first-run watch and the
counter read), no values, and for each op one simulated kernel of a known length. What is tested is
everything after the kernels: the device decision, the counting, the peak lookup, the clock scaling and
the report, with the achieved figure known exactly (FLOPs / kernel time). Whether a real GPU reaches
those percentages is the `gpu` tests' question (tests/test_cudatime_roofline.py).
"""
from __future__ import annotations

import re

import pytest
from conftest import run
from IPython.core.formatters import PlainTextFormatter
from IPython.utils.capture import capture_output

from torchgpu_magic.render import fmt_percent

N = 8192
MATMUL_FLOPS = 2 * N ** 3  # bf16
MATMUL_BYTES = 3 * N * N * 2  # a and b read, the product written
H100_BF16 = 989.5e12
FAST = "-n 1 -r 5 --warmup 1"


class Matmul:
    """Stand-ins for two 8192 x 8192 bf16 CUDA tensors ``a`` and ``b`` in the shell, whose matmul takes
    ``kernel_s`` seconds on the simulated H100."""

    def __init__(self, ip, sim):
        self.ip, self.sim = ip, sim

    def takes(self, kernel_s):
        import simulated_gpu
        import torch

        for name in ("a", "b"):
            self.ip.user_ns[name] = simulated_gpu.cuda_standin(self.sim, (N, N), torch.bfloat16, kernel_s)


@pytest.fixture
def gpu(ip, simulated_gpu):
    """The simulated H100 (``.sim``) with ``a @ b`` taking 1.5 ms in the shell (``.takes`` changes it), and
    a 64 x 64 cpu tensor ``x``."""
    run(ip, "import torch\nx = torch.ones(64, 64)")
    matmul = Matmul(ip, simulated_gpu)
    matmul.takes(1.5e-3)
    return matmul


def _roofline_line(result):
    return next(line for line in PlainTextFormatter()(result).splitlines() if "FLOP/s" in line)


def test_on_the_simulated_h100_the_table_picks_h100_sxm_and_the_report_gives_the_percentage(ip, gpu):
    with capture_output() as shown:
        run(ip, f"%%cudatime {FAST}\ny = a @ b")
    result = run(ip, f"%%cudatime -o -q {FAST}\ny = a @ b")
    assert result.device == "cuda:0" and result.clock == "CUDA events"  # the watch saw cuda:0 tensors
    # the kernel's 1.5 ms, plus what the GPU idled while the host was still launching it (slow stand-ins):
    # less than the host's enqueue time; both on the simulated machine's clock, which a loaded machine's
    # preemptions do not move (tests/simulated_gpu.SimulatedTime)
    assert 1.5e-3 <= result.median < 1.5e-3 + result.host
    rl = result.roofline
    assert (rl.peak_name, rl.clock_scales) == ("H100 SXM", {})  # 1980 MHz: at or above the table's 1830
    assert rl.flops_by_precision == {"bf16": MATMUL_FLOPS} and rl.bytes == MATMUL_BYTES
    assert rl.peak_flops == {"bf16": H100_BF16} and rl.peak_bandwidth == 3.35e12
    assert rl.flops_fraction == pytest.approx(MATMUL_FLOPS / result.median / H100_BF16)
    assert 0.6 < rl.flops_fraction <= MATMUL_FLOPS / 1.5e-3 / H100_BF16 and rl.bound == "compute"
    assert "h100" in rl.peak_source.lower()
    line = _roofline_line(result)
    assert line == "  " + rl.line()
    assert re.fullmatch(r"  \d{3} TFLOP/s \(\d\d\.\d % of H100 SXM bf16 dense\), \d{3} GB/s \(\d\.\d\d % "
                        r"of 3\.35 TB/s\); compute-bound \(intensity 2\.73 kFLOP/B, ridge 295 FLOP/B\)",
                        line), line
    assert not any("scaled to the SM clock" in note for note in result.notes)
    [out] = shown.outputs  # what the notebook shows: the same line in HTML
    assert re.search(r"\d\d\.\d % of H100 SXM bf16 dense", out.data["text/html"])
    data = result.to_dict()["roofline"]
    assert data["peak_name"] == "H100 SXM" and data["flops"] == MATMUL_FLOPS and data["bound"] == "compute"


def _clock_at(gpu, monkeypatch, mhz, reason):
    import pynvml

    nvml_gpu = gpu.sim.nvml_module.machine.gpus[0]
    monkeypatch.setitem(nvml_gpu.clocks, "sm", lambda: mhz)
    monkeypatch.setattr(nvml_gpu, "clock_reasons", lambda: getattr(pynvml, reason))


def test_below_the_tables_clock_the_peak_is_scaled_and_the_scaled_peak_is_said(ip, gpu, monkeypatch):
    _clock_at(gpu, monkeypatch, 1200, "nvmlClocksEventReasonSwPowerCap")
    gpu.takes(4e-3)  # 275 TFLOP/s: possible at 1200 MHz (649 TFLOP/s bf16)
    result = run(ip, f"%%cudatime -o -q {FAST}\ny = a @ b")
    rl = result.roofline
    assert result.sm_clock["median_mhz"] == 1200 and rl.clock_mhz == 1200
    assert rl.reference_mhz == {"bf16": 1830}
    assert rl.clock_scales == {"bf16": pytest.approx(1200 / 1830)}
    assert rl.peak_flops["bf16"] == pytest.approx(H100_BF16 * 1200 / 1830)
    assert rl.flops_fraction == pytest.approx(MATMUL_FLOPS / result.median / (H100_BF16 * 1200 / 1830))
    line = _roofline_line(result)
    assert f"({fmt_percent(rl.flops_fraction)} of H100 SXM bf16 dense at 1,200 MHz)" in line, line
    assert ("roofline: FLOP/s peaks scaled to the SM clock the samples ran at, 1,200 of the 1,830 MHz the "
            "table's figures assume (the median of NVML's readings after each sample): bf16 649 TFLOP/s"
            ) in result.notes
    assert any(w.startswith("the GPU ran under 75 % of its max SM clock in 5 of 5 samples") for w in
               result.warnings)  # the throttle warning, from the same readings


def test_below_the_max_clock_but_above_the_tables_the_datasheet_peak_holds(ip, gpu, monkeypatch):
    """The H100's figures assume 1830 MHz; at 1900 MHz (below its 1980 MHz max) they hold as they are."""
    _clock_at(gpu, monkeypatch, 1900, "nvmlClocksEventReasonSwPowerCap")
    result = run(ip, f"%%cudatime -o -q {FAST}\ny = a @ b")
    rl = result.roofline
    assert rl.clock_mhz == 1900 and rl.clock_scales == {} and rl.peak_flops == {"bf16": H100_BF16}
    assert "at 1,900 MHz" not in rl.line() and not any("scaled to the SM clock" in n for n in result.notes)
    assert any(n.startswith("SM clock below its max in 5 of 5 samples (lowest 1900 MHz")
               for n in result.notes)


def test_a_cpu_cell_after_cuda_was_initialised_gets_no_gpu_peak(ip, gpu):
    """CUDA initialised by an earlier cell is not "the cell used the GPU": the cell of cpu tensors is
    timed on the host, and the roofline holds it against no GPU's peak."""
    import torch

    run(ip, "torch.cuda.init()")
    assert torch.cuda.is_initialized()
    result = run(ip, f"%%cudatime -o -q {FAST}\ny = x @ x")
    assert result.device == "cpu" and result.roofline.peak_name is None
    assert result.roofline.flops == 2 * 64 ** 3 and "H100" not in result.to_text()
    assert "roofline: no peak figures for cpu (--peak FLOPS[,BYTES_PER_S] sets one, for a percentage)" in \
        result.notes


def test_causal_flash_attention_on_the_simulated_h100_counts_the_attended_pairs(ip, gpu):
    """CUDA's flash kernel, called as SDPA's CUDA path calls it (issue 28, item 6): its FLOPs follow the
    pairs a causal mask leaves, so a kernel at 60 % of the bf16 peak reads 60 %, not 120 % with a note
    blaming the clock."""
    import simulated_gpu
    import torch

    b, h, s, d = 8, 16, 8192, 128  # a 3.7 ms kernel
    causal = 4 * b * h * d * (s * (s + 1) // 2)
    kernel_s = causal / (0.6 * H100_BF16)
    ip.user_ns["q"] = simulated_gpu.cuda_standin(gpu.sim, (b, h, s, d), torch.bfloat16, kernel_s)
    result = run(ip, f"%%cudatime -o -q {FAST}\n"
                     "y = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)[0]")
    rl = result.roofline
    assert rl.flops_by_precision == {"bf16": causal}
    assert rl.causal == {"aten._scaled_dot_product_flash_attention": 1}
    assert rl.flops_fraction <= 0.6 and not any("above the FLOP/s peak" in n for n in result.notes)


def test_an_fp32_matmul_after_the_new_tf32_setting_keeps_its_roofline_line(ip, gpu):
    """transformers' TrainingArguments(tf32=True) sets torch.backends.cuda.matmul.fp32_precision; from then
    on reading allow_tf32 raises, and every fp32 matmul cell lost its roofline to "not counted:
    RuntimeError" (issue 28, item 2). The matmul counts as TF32, against the H100's TF32 peak."""
    import simulated_gpu
    import torch

    for name in ("a", "b"):
        ip.user_ns[name] = simulated_gpu.cuda_standin(gpu.sim, (N, N), torch.float32, 3e-3)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        result = run(ip, f"%%cudatime -o -q {FAST}\ny = a @ b")
    finally:
        torch.backends.cuda.matmul.fp32_precision = "none"
    rl = result.roofline
    assert rl.error is None and rl.flops_by_precision == {"tf32": MATMUL_FLOPS}
    assert rl.peak_flops == {"tf32": 494.5e12} and "H100 SXM tf32 dense" in _roofline_line(result)
    assert not any("not counted" in note for note in result.notes)
