"""``%gpuinfo`` where NVML does not see the GPU: an Apple silicon Mac (MPS), AMD GPUs under ROCm (torch's
``cuda`` over HIP, with AMD SMI's figures), an Intel GPU (XPU), an out-of-tree PrivateUse1 backend.

:func:`gpu_report` picks the report: this one where torch's accelerator is one of those, on a Mac, or on
a machine whose GPUs are AMD's, on the PCI bus or in AMD SMI's list, and none NVIDIA's (a CUDA or CPU build
of torch there gets the reason it cannot use them); :mod:`.inventory`'s NVIDIA report everywhere else.
Torch is asked through the device layer (:mod:`torchgpu_magic.accelerators`); ROCm's GPUs are named
from AMD SMI before torch's HIP runtime is initialised, as NVIDIA's are from NVML (asking torch would
initialise it); an XPU is named by torch, which initialises XPU. What cannot be read is N/A and a note,
never a traceback.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import accelerators
from ..errors import MagicInputError
from ..render import Report, Reportable, Table, fmt_bytes, fmt_value, is_na
from ..torchapi import backend_linked
from . import amdsmi, apple, backendcauses, inventory, machine, nvml
from .gpumap import TorchView
from .inventory import GPUInfoLayout, env_text
from .snapshots import NA

__all__ = ["DeviceRow", "AcceleratorReport", "applies", "build_report", "gpu_report"]

ENV = {"MPS": ("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_ENABLE_MPS_FALLBACK"),
       "ROCm": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                "HSA_OVERRIDE_GFX_VERSION", "PYTORCH_HIP_ALLOC_CONF"),
       "XPU": ("ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "ZE_FLAT_DEVICE_HIERARCHY")}


@dataclass
class DeviceRow:
    """One GPU: torch's device (``label``; None where torch cannot see it), what it is, torch's allocator
    figures, and the driver's (AMD SMI's; MPS's driver-allocated memory against its working-set limit)."""

    label: Optional[str]
    name: Any = NA
    arch: Any = NA
    units: Any = NA
    capacity: Any = NA  # what torch may use: the GPU's memory; MPS's working-set limit
    allocated: Any = NA
    reserved: Any = NA
    peak: Any = NA
    used: Any = NA  # the driver's figures: all processes (AMD SMI), this process (MPS)
    total: Any = NA
    utilization: Any = NA
    temperature: Any = NA
    power: Any = NA
    processes: list = field(default_factory=list)  # (pid, name, bytes, is this process)


@dataclass(repr=False)
class AcceleratorReport(GPUInfoLayout, Reportable):
    """What ``%gpuinfo`` shows for these backends: torch's build, the machine, each GPU, why torch cannot
    use one (``diagnosis``), the environment variables that steer the backend, notes."""

    backend: str
    torch_version: str
    build: str
    machine: list  # (item, value) rows: the Mac's chip and memory, AMD SMI's driver...
    devices: list
    diagnosis: list
    environment: dict
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    show_processes: bool = True
    pid: int = 0

    @property
    def torch_can_use_gpu(self) -> bool:
        return any(d.label is not None for d in self.devices) and not self.diagnosis

    def to_dict(self) -> dict:
        """Plain JSON-able data, with whether torch can use a GPU; N/A becomes None."""
        return super().to_dict() | {"torch_can_use_gpu": self.torch_can_use_gpu}

    def _headline(self) -> str:
        count = sum(d.label is not None for d in self.devices)
        use = (f"torch can use {count} GPU{'s' * (count != 1)} ({self.backend})" if self.torch_can_use_gpu
               else "torch cannot use a GPU")
        named = sorted({str(d.name) for d in self.devices if not is_na(d.name)})
        here = "; ".join(f"{k} {v}" for k, v in self.machine[:2]) or ", ".join(named) or "no GPU found"
        return f"{use} | torch {self.torch_version} ({self.build}) | {here}"

    def report(self) -> Report:
        """The headline; why torch cannot use a GPU; the GPUs, their processes; the machine and
        environment; the notes."""
        gpus = Table(["device", "name", "arch", "units", "capacity", "torch alloc / reserved / peak",
                      "driver used / total", "util", "temp", "power"], align="lllrrrrrrr", title="GPUs")
        for d in self.devices:
            torch_mem = "-" if d.label is None else (
                f"{fmt_bytes(d.allocated)} / {fmt_bytes(d.reserved)} / {fmt_bytes(d.peak)}")
            gpus.add(d.label or "-", fmt_value(d.name), fmt_value(d.arch), fmt_value(d.units),
                     fmt_bytes(d.capacity), torch_mem, f"{fmt_bytes(d.used)} / {fmt_bytes(d.total)}",
                     fmt_value(d.utilization, "%"), fmt_value(d.temperature, "C"), fmt_value(d.power, "W"))
        tables = [gpus] if self.devices else []
        procs = Table(["device", "pid", "name", "GPU memory", ""], align="lrlrl", title="Processes")
        for d in self.devices:
            for pid, name, size, mine in d.processes:
                procs.add(d.label or "-", pid, fmt_value(name), fmt_bytes(size),
                          "<- this process" if mine else "")
        if self.show_processes and procs.rows:
            tables.append(procs)
        machine = Table(["item", "value"], title="Machine and environment")
        for key, value in self.machine + [(k, env_text(v)) for k, v in self.environment.items()]:
            machine.add(key, fmt_value(value))
        machine.add("this process's PID", self.pid)
        notes = [f"! {w.message} ({w.fix})" for w in self.warnings] + self.notes
        return self._layout(tables + [machine], notes)


# ---- which report ------------------------------------------------------------------------------------
def _nvidia_gpus(here: machine.Machine) -> int:
    """How many NVIDIA GPUs are here: NVML's count, else the PCI bus's (a GPU without its driver)."""
    return nvml.device_count() or len(here.nvidia_gpus or ())


def applies() -> bool:
    """Whether this report, rather than the NVIDIA one, describes this machine: torch's accelerator is MPS,
    XPU or a PrivateUse1 backend, torch is a ROCm build, this is a Mac, or its GPUs are AMD's (on the PCI
    bus, or listed by AMD SMI) and none is NVIDIA's."""
    kind = accelerators.current_kind()
    if kind not in (None, "cuda") or accelerators.is_rocm() or sys.platform == "darwin":
        return True
    bus = machine.survey()
    return not _nvidia_gpus(bus) and bool(bus.amd_gpus or amdsmi.gpus())


def gpu_report(index: Optional[int] = None, show_processes: bool = True) -> Any:
    """``%gpuinfo``'s report for this machine: :func:`build_report` where :func:`applies`, else the NVIDIA
    inventory's."""
    if applies():
        return build_report(index, show_processes)
    return inventory.build_report(index=index, show_processes=show_processes)


# ---- building it -------------------------------------------------------------------------------------
def build_report(index: Optional[int] = None, show_processes: bool = True) -> AcceleratorReport:
    """Collect the report; ``index`` keeps torch's device N (an index that does not exist is a
    :class:`MagicInputError` naming the valid ones)."""
    import torch

    kind = accelerators.current_kind()
    version = str(torch.__version__)
    if kind == "mps" or (kind is None and sys.platform == "darwin"):
        report = _mac(version, torch, kind == "mps")
    elif kind in (None, "cuda"):
        report = _amd(version, torch)
    else:
        report = _other(version, kind)
    report.show_processes, report.pid = show_processes, os.getpid()
    if index is not None:
        keep = [d for d in report.devices if d.label is not None and d.label.split(":")[-1] == str(index)]
        if not keep:
            valid = [d.label for d in report.devices if d.label is not None]
            raise MagicInputError(f"no GPU index {index} torch can use" + (
                f"; valid: {', '.join(valid)}" if valid else ": there is none here"))
        report.devices = keep
    return report


def _torch_figures(row: DeviceRow, kind: str, index: int) -> None:
    row.allocated, row.reserved, row.peak = (NA if v is None else v
                                             for v in accelerators.torch_figures(index, kind))


def _mac(version: str, torch: Any, usable: bool) -> AcceleratorReport:
    mps = torch.backends.mps
    mac = apple.mac_facts(torch_has_mps=mps.is_built())
    rows = [] if mac is None else [
        ("chip", mac.chip or NA), ("unified memory", fmt_bytes(mac.memory)), ("macOS", mac.macos or NA),
        ("Rosetta (x86_64 on Apple silicon)", "yes" if mac.translated else "no")]
    devices, notes = [], []
    if usable:
        facts = accelerators.facts("mps")
        row = DeviceRow("mps", facts.name, NA, facts.units or NA, facts.memory or NA)
        _torch_figures(row, "mps", 0)
        row.used, row.total = row.reserved, facts.memory or NA
        devices.append(row)
        notes.append(f"unified memory: the GPU shares the Mac's {fmt_bytes(mac.memory if mac else None)}; "
                     f"Metal's working-set limit (torch.mps.recommended_max_memory(), "
                     f"{fmt_bytes(facts.memory)}) is what the GPU may use without paging. 'driver used' is "
                     "torch.mps.driver_allocated_memory(): this process's Metal allocations, its cache "
                     "included")
        notes.append("torch keeps no peak on MPS before its accelerator API covers it; %gpumem tracks one by "
                     "sampling")
    causes = backendcauses.mac_causes(version, mps.is_built(), usable, mac)
    return AcceleratorReport("MPS", version, "MPS build" if mps.is_built() else "no MPS", rows, devices,
                             causes, _env("MPS"), notes)


def _amd(version: str, torch: Any) -> AcceleratorReport:
    """A ROCm build, or a CUDA / CPU build on a machine whose GPUs are AMD's."""
    problem = amdsmi.status()
    amd = amdsmi.gpus()
    bus = machine.survey()
    pci = bus.amd_gpus or ()
    hip = getattr(torch.version, "hip", None)
    available = bool(hip) and accelerators.device_count("cuda") > 0
    view = TorchView(version=version, cuda=torch.version.cuda, hip=hip, is_available=available)
    rows = [("AMD GPUs (AMD SMI)", f"{len(amd)}" + (f", driver {amd[0].driver}" if amd else ""))]
    if pci:
        rows.append(("AMD GPUs (PCI bus)",
                     ", ".join(f"{g.label()} ({g.driver or 'no driver'})" for g in pci)))
    notes = [f"AMD SMI: {problem}. {amdsmi.INSTALL}: without it, torch's view alone"] if problem else []
    devices = _rocm_devices(amd) if available else []
    mapped = set(accelerators.hip_visible(len(amd))[:len(devices)])
    devices += [_amd_row(None, gpu) for i, gpu in enumerate(amd) if i not in mapped]  # GPUs torch cannot see
    if not amd and not devices:  # AMD SMI cannot say: the PCI bus names them
        devices = [DeviceRow(None, g.label()) for g in pci]
    if available and accelerators.cuda_state() != "initialised" and amd:
        notes.append("HIP is not initialised in this process: torch's GPUs are named from AMD SMI in "
                     "HIP_VISIBLE_DEVICES order, and torch holds no GPU memory yet (asking torch would "
                     "initialise HIP)")
    names = [str(g.name) for g in amd] or [g.label() for g in pci]
    causes = backendcauses.rocm_causes(view, names, problem, _nvidia_gpus(bus), os.environ,
                                       backendcauses.kfd_problem(),
                                       [g.label() for g in pci if g.driver is None])
    warning = backendcauses.gfx_problem(amd, torch.cuda.get_arch_list() if hip else [], os.environ)
    build = f"ROCm, HIP {hip}" if hip else f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
    return AcceleratorReport("ROCm", version, build, rows, devices, causes, _env("ROCm"), notes,
                             [warning] if warning else [])


def _rocm_devices(amd: list) -> list:
    """torch's ``cuda:N`` on ROCm, each beside AMD SMI's GPU in HIP's order; named by torch once HIP is
    initialised, else by AMD SMI (and by torch, initialising HIP, where AMD SMI cannot say)."""
    visible = accelerators.hip_visible(len(amd))
    rows = []
    for index in range(accelerators.device_count("cuda")):
        gpu = amd[visible[index]] if index < len(visible) else None
        row = _amd_row(f"cuda:{index}", gpu)
        if accelerators.cuda_state() == "initialised" or gpu is None:
            facts = accelerators.facts(("cuda", index))
            row.name, row.arch, row.units, row.capacity = facts.name, facts.arch, facts.units, facts.memory
        _torch_figures(row, "cuda", index)
        rows.append(row)
    return rows


def _amd_row(label: Optional[str], gpu: Any) -> DeviceRow:
    if gpu is None:
        return DeviceRow(label)
    mine = os.getpid()
    return DeviceRow(label, gpu.name, gpu.arch, gpu.compute_units, gpu.memory_total, used=gpu.memory_used,
                     total=gpu.memory_total, utilization=gpu.utilization, temperature=gpu.temperature,
                     power=gpu.power, processes=[(p.pid, p.name, p.used_memory, p.pid == mine)
                                                 for p in gpu.processes])


def _other(version: str, kind: str) -> AcceleratorReport:
    """XPU, or a PrivateUse1 backend: torch's view alone (naming a device initialises the backend)."""
    label = accelerators.backend_label(kind)
    count = accelerators.device_count(kind)
    devices, notes = [], []
    for index in range(count):
        facts = accelerators.facts((kind, index))
        row = DeviceRow(f"{kind}:{index}", facts.name, facts.arch or NA, facts.units or NA,
                        facts.memory or NA)
        _torch_figures(row, kind, index)
        info = accelerators.memory_info((kind, index))
        if info is not None:
            row.used, row.total = info[1] - info[0], info[1]
        devices.append(row)
    if count:
        notes.append(f"torch named the devices ({kind} is initialised in this process to ask it); 'driver "
                     f"used' is all processes' use, from torch's free and total memory")
    causes = backendcauses.xpu_causes(version, backend_linked("xpu"), bool(count), os.environ, [
        f"{g.label()} ({g.driver or 'no driver'})" for g in machine.survey().intel_gpus or ()]) \
        if kind == "xpu" and not count else []
    return AcceleratorReport(label, version, f"{label} build", [], devices, causes, _env(label), notes)


def _env(backend: str) -> dict:
    return {name: os.environ.get(name) for name in ENV.get(backend, ())}
