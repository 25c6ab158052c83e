"""The hardware's limits for ``%%cudatime``'s roofline: datasheet peaks of NVIDIA GPUs, per precision, and
their memory bandwidth; which entry a device is, by the name torch and NVML report; and the peak scaled
to the SM clock the samples ran at and to the SMs the device really has (a MIG instance has a share of
them).

Figures are dense (NVIDIA's datasheets print tensor figures "with sparsity": those are halved here) and
in FLOP/s and bytes/s. Per precision: ``fp64`` is the FP64 Tensor Core figure where the GPU has one
(cuBLAS runs fp64 GEMMs on it), ``fp32`` the CUDA-core figure, ``tf32`` / ``bf16`` / ``fp16`` / ``fp8``
the tensor-core figures with FP32 accumulate, which is what PyTorch's matmuls use (GeForce cards run
FP16 accumulate at twice that rate; PyTorch does not use it). A precision a datasheet does not list has no
entry, and a FLOP of it gets no percentage.

Each entry's ``clock_mhz`` is the SM clock its tensor figures assume: the H100 whitepaper's 1830 MHz
(SXM) and 1620 MHz (PCIe), elsewhere the boost clock, or the clock the figure implies (figure / (SMs x
tensor FLOP per SM per clock)) where NVIDIA states none. Its ``core_clock_mhz`` is the clock its fp32 and
fp64 figures assume, which is not always the same: an H100 SXM's 67 TFLOP/s fp32 is 132 SMs x 128 FP32
lanes x 2 FLOP at its 1980 MHz boost clock, not at the tensor figures' 1830 MHz (the same holds for the
other Hopper entries and B200; elsewhere both figures imply the one boost clock). When the samples ran at
a lower SM clock (the median of what NVML read after each of them, :mod:`.throttle`), each precision's
FLOP/s peak is scaled by clock / the clock its own figure assumes, and the report says so.

Nothing here imports torch at import time; it is asked only for a CUDA device.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import accelerators

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
LABELS = {"fp64": "fp64", "fp32": "fp32", "tf32": "tf32 dense", "bf16": "bf16 dense", "fp16": "fp16 dense",
          "fp8": "fp8 dense"}
FALLBACK = {"tf32": "fp32"}  # no TF32 units (Volta, Turing): cuBLAS runs an fp32 GEMM on CUDA cores
ANY = "*"  # the precision key of a --peak FLOPS figure: it applies to every FLOP
CORE_PRECISIONS = ("fp64", "fp32")  # figures at the clock of the CUDA cores (GPUModel.core_clock_mhz)

H100_PAGE = "https://www.nvidia.com/en-us/data-center/h100/"
H100_PDF = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
H200_PAGE = "https://www.nvidia.com/en-us/data-center/h200/"
GH200_PAGE = "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"
HGX_PAGE = "https://www.nvidia.com/en-us/data-center/hgx/"
A100_PDF = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
V100_PDF = ("https://images.nvidia.com/content/technologies/volta/pdf/"
            "volta-v100-datasheet-update-us-1165301-r5.pdf")
T4_PDF = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
          "t4-tensor-core-datasheet-951643.pdf")
ADA_PDF = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
GA102_PDF = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
HOPPER_CLOCKS = "H100 whitepaper, table 3 (tensor figures at 1830 MHz SXM5, 1620 MHz PCIe)"


@dataclass(frozen=True)
class GPUModel:
    """One row of the peak table: a GPU model's dense peaks (FLOP/s per precision), memory bandwidth
    (bytes/s), SM count, the SM clock its tensor figures assume, memory size, and where the figures are
    from. ``pattern`` is a regular expression searched in the lower-cased name torch / NVML report."""

    name: str
    pattern: str
    flops: dict
    bandwidth: float
    sms: int
    clock_mhz: float
    memory_gb: float
    source: str
    core_clock_mhz: float = 0.0  # the clock the fp32 / fp64 figures assume; 0: clock_mhz


def _gpu(name: str, pattern: str, source: str, sms: int, clock_mhz: float, memory_gb: float,
         bandwidth_gbs: float, core_clock_mhz: float = 0.0, **tflops: float) -> GPUModel:
    return GPUModel(name, pattern, {p: tflops[p] * 1e12 for p in PRECISIONS if p in tflops},
                    bandwidth_gbs * 1e9, sms, clock_mhz, memory_gb, source, core_clock_mhz)


# fp32 and fp64 (the CUDA-core figures, and Hopper's FP64 tensor figure) at the boost clock: 67 TFLOP/s =
# 132 x 256 x 1.98 GHz (SXM), 60 = 132 x 256 x 1.776 GHz (NVL), 51 = 114 x 256 x 1.755 GHz (PCIe)
_HOPPER_SXM = dict(core_clock_mhz=1980, fp64=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979)
_HOPPER_NVL = dict(core_clock_mhz=1776, fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5)
_A100 = dict(fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312)

# Ordered from the most specific pattern to the least: the first match wins.
TABLE = (
    _gpu("H100 NVL", r"\bh100 nvl", H100_PAGE, 132, 1545, 94, 3900, **_HOPPER_NVL),
    _gpu("H100 PCIe", r"\bh100\b.*pcie", f"{H100_PDF} ; {HOPPER_CLOCKS}", 114, 1620, 80, 2000,
         core_clock_mhz=1755, fp64=51, fp32=51, tf32=378, bf16=756.5, fp16=756.5, fp8=1513),
    _gpu("H100 SXM", r"\bh100\b", f"{H100_PAGE} ; {HOPPER_CLOCKS}", 132, 1830, 80, 3350, **_HOPPER_SXM),
    _gpu("GH200 144GB HBM3e", r"\bgh200\b.*(144g|hbm3e)", GH200_PAGE, 132, 1830, 144, 4900, **_HOPPER_SXM),
    _gpu("GH200", r"\bgh200\b", GH200_PAGE, 132, 1830, 96, 4000, **_HOPPER_SXM),
    _gpu("H200 NVL", r"\bh200 nvl", H200_PAGE, 132, 1545, 141, 4800, **_HOPPER_NVL),
    _gpu("H200", r"\bh200\b", H200_PAGE, 132, 1830, 141, 4800, **_HOPPER_SXM),
    _gpu("B200", r"\bb200\b", f"{HGX_PAGE} (HGX B200, per GPU)", 148, 1855, 180, 7700,
         core_clock_mhz=1980, fp64=37, fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500),
    _gpu("A100 SXM 80GB", r"\ba100\b.*sxm.*80", A100_PDF, 108, 1410, 80, 2039, **_A100),
    _gpu("A100 SXM 40GB", r"\ba100\b.*sxm", A100_PDF, 108, 1410, 40, 1555, **_A100),
    _gpu("A100 PCIe 80GB", r"\ba100\b.*(80gb.*pcie|pcie.*80)", A100_PDF, 108, 1410, 80, 1935, **_A100),
    _gpu("A100 PCIe 40GB", r"\ba100\b.*pcie", A100_PDF, 108, 1410, 40, 1555, **_A100),
    _gpu("L40S", r"\bl40s\b", "https://www.nvidia.com/en-us/data-center/l40s/", 142, 2490, 48, 864,
         core_clock_mhz=2520, fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733),
    _gpu("L4", r"\bl4\b", "https://www.nvidia.com/en-us/data-center/l4/", 58, 2040, 24, 300,
         fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5),
    _gpu("A10G", r"\ba10g\b", "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ "
         "(AWS's A10G; NVIDIA publishes no datasheet for it)", 80, 1710, 24, 600,
         fp32=35, tf32=35, bf16=70, fp16=70),
    _gpu("A10", r"\ba10\b", "https://www.nvidia.com/en-us/data-center/products/a10-gpu/", 72, 1695, 24, 600,
         fp32=31.2, tf32=62.5, bf16=125, fp16=125),
    _gpu("T4", r"\bt4\b", T4_PDF, 40, 1590, 16, 320, fp32=8.1, fp16=65),
    _gpu("V100S PCIe", r"\bv100s\b", V100_PDF, 80, 1597, 32, 1134, fp64=8.2, fp32=16.4, fp16=130),
    _gpu("V100 SXM2", r"\bv100-sxm2", V100_PDF, 80, 1530, 32, 900, fp64=7.8, fp32=15.7, fp16=125),
    _gpu("V100 PCIe", r"\bv100-pcie", V100_PDF, 80, 1380, 32, 900, fp64=7, fp32=14, fp16=112),
    _gpu("RTX 4090", r"\brtx 4090\b(?!.*(laptop|\bd\b))", f"{ADA_PDF} (appendix A)", 128, 2520, 24, 1008,
         fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3),
    _gpu("RTX 3090", r"\brtx 3090\b(?! ti)", f"{GA102_PDF} (appendix A)", 82, 1695, 24, 936,
         fp32=35.6, tf32=35.6, bf16=71, fp16=71),
)


def lookup(name: str) -> Optional[GPUModel]:
    """The table's entry for a GPU called ``name`` (as ``torch.cuda.get_device_name`` or NVML say it,
    e.g. 'NVIDIA H100 80GB HBM3', 'Tesla T4', 'NVIDIA A100-SXM4-40GB MIG 3g.20gb'); None if unknown."""
    text = " ".join(str(name).lower().split())
    return next((model for model in TABLE if re.search(model.pattern, text)), None)


@dataclass(repr=False)
class Peak:
    """The limits one measurement is held against: FLOP/s per precision (after the device's share of
    SMs, before clock scaling), memory bandwidth, where they come from, and the SM clock the samples ran
    at (``clock_mhz``) against the clock the tensor figures assume (``reference_mhz``) and the clock the
    fp32 / fp64 figures assume (``core_reference_mhz``; None: ``reference_mhz``)."""

    name: str
    flops: dict
    bandwidth: Optional[float]
    source: str
    clock_mhz: Optional[float] = None
    reference_mhz: Optional[float] = None
    notes: list = field(default_factory=list)
    core_reference_mhz: Optional[float] = None

    def reference_for(self, precision: str) -> Optional[float]:
        """The SM clock the figure used for ``precision`` assumes (its fallback's, for tf32 on a GPU
        without TF32 units); None for ``--peak``."""
        if ANY in self.flops:
            return None
        shown = precision if precision in self.flops else FALLBACK.get(precision, precision)
        if shown in CORE_PRECISIONS and self.core_reference_mhz:
            return self.core_reference_mhz
        return self.reference_mhz

    def scale_for(self, precision: str) -> float:
        """clock / the clock ``precision``'s figure assumes, when the GPU ran below it; else 1."""
        reference = self.reference_for(precision)
        return min(1.0, self.clock_mhz / reference) if self.clock_mhz and reference else 1.0

    def flops_for(self, precision: str, clocked: bool = True) -> Optional[float]:
        """Peak FLOP/s for ``precision`` (scaled to the clock unless ``clocked`` is False); None if the
        table has no figure for it."""
        value = (self.flops.get(precision) or self.flops.get(FALLBACK.get(precision, ""))
                 or self.flops.get(ANY))
        return value * (self.scale_for(precision) if clocked else 1.0) if value else None

    def label(self, precision: str) -> str:
        """'H100 SXM bf16 dense', or '--peak' for the user's figure."""
        if ANY in self.flops:
            return self.name
        shown = precision if precision in self.flops else FALLBACK.get(precision, precision)
        return f"{self.name} {LABELS.get(shown, shown)}"


def user_peak(flops: Optional[float], bandwidth: Optional[float], table: Optional[Peak]) -> Peak:
    """``--peak FLOPS[,BYTES_PER_S]``: the user's figures, each replacing the table's (what it leaves out,
    the bandwidth, still comes from the table entry when there is one)."""
    if table is not None and bandwidth is None:
        return Peak("--peak", {ANY: flops}, table.bandwidth, f"--peak; bandwidth: {table.source}",
                    notes=[n for n in table.notes if n.startswith("roofline: bandwidth")])
    return Peak("--peak", {ANY: flops}, bandwidth, "--peak")


def for_device(device: Any, clock_mhz: Optional[float] = None) -> tuple:
    """``(Peak or None, notes)`` for the device a cell was timed on: the table's entry for a CUDA GPU,
    scaled to its SMs and memory slices (MIG), carrying ``clock_mhz``, the SM clock the samples ran at
    (the median of NVML's readings after each sample, :class:`~.throttle.ClockWatch`; None where NVML
    read none). Elsewhere, or for a GPU not in the table, None and a note saying how to give a peak."""
    kind = getattr(device, "type", str(device))
    hint = "--peak FLOPS[,BYTES_PER_S] sets one, for a percentage"
    if kind != "cuda":
        return None, [f"roofline: no peak figures for {kind} ({hint})"]
    facts = accelerators.facts(device)
    model = lookup(facts.name)
    if model is None:
        return None, [f"roofline: {facts.name} is not in the peak table: achieved figures only ({hint})"]
    sms = int(facts.units) if facts.units else model.sms
    return resolve(model, facts.name, sms, clock_mhz), []


def resolve(model: GPUModel, name: str, sms: int, clock_mhz: Optional[float]) -> Peak:
    """``model``'s figures for a device called ``name`` with ``sms`` SMs, at SM clock ``clock_mhz``: the
    FLOP/s scaled to the SMs it has (a MIG instance, a cut-down variant), the bandwidth to a MIG
    instance's memory slices (its memory over the GPU's)."""
    notes = []
    flops = dict(model.flops)
    if 0 < sms < model.sms:
        flops = {p: v * sms / model.sms for p, v in flops.items()}
        notes.append(f"roofline: FLOP/s peaks scaled to the {sms} of {model.sms} SMs this device has")
    bandwidth = model.bandwidth
    mig = re.search(r"\bmig (\d+)g\.(\d+)gb", name.lower())
    if mig and int(mig.group(2)) < model.memory_gb:
        bandwidth *= int(mig.group(2)) / model.memory_gb
        notes.append(f"roofline: bandwidth scaled to the MIG instance's {mig.group(2)} of "
                     f"{model.memory_gb:g} GB memory slices")
    return Peak(model.name, flops, bandwidth, model.source, clock_mhz, model.clock_mhz, notes,
                model.core_clock_mhz or model.clock_mhz)
