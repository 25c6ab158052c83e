"""Per-process memory figures: host RSS, NVML and torch's allocator, side by side, one sample at a time.

Why three sources side by side: ``nvidia-smi`` (NVML) counts everything a process holds on the GPU (the
CUDA context, cuBLAS workspaces, torch's cache), ``torch.cuda.memory_allocated()`` counts only live
tensors, and ``memory_reserved()`` what torch's caching allocator holds. The gaps are what people ask
about, so a :class:`GPUMemory` carries all of them and derives the gaps:

* ``cache``  = reserved - allocated: held by torch's allocator, free for new tensors, not for others;
* ``other``  = this process's NVML usage - reserved: CUDA context and non-torch allocations;
* ``others`` = memory that other processes hold on the same GPU.

Nothing here initialises CUDA: torch is only asked when it is already imported and CUDA already
initialised in this process (a sampler must not create a CUDA context just to look; the sampler thread
and the per-cell log that take these figures are :mod:`torchgpu_magic.gpumem.sampler`). NVML goes
through :mod:`torchgpu_magic.gpus.nvml`, which answers NA instead of raising. psutil and torch are imported
lazily.

Standard library plus psutil; no IPython, no ipywidgets (the view is :mod:`torchgpu_magic.gpumem.panel`).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from .. import accelerators
from ..accelerators import cuda_state, device_label, torch_figures
from ..host import HostMemory, host_memory
from ..render import Lines, Report, Reportable, Table, fmt_bytes, is_na


# ---- figures ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPUTarget:
    """One GPU to watch: torch's index on device type ``kind`` (None when torch cannot see it) and NVML's
    index (None when NVML cannot see it), matched by gpumap (by UUID, so CUDA_VISIBLE_DEVICES reordering
    is right); on ROCm, AMD SMI's index instead of NVML's; on MPS and XPU neither (torch's figures)."""

    torch_index: Optional[int]
    nvml_index: Optional[int]
    name: str = ""
    mig_uuid: Optional[str] = None  # the MIG instance torch uses: NVML is asked about it, not the GPU
    kind: str = "cuda"
    amdsmi_index: Optional[int] = None

    @property
    def label(self) -> str:
        """'cuda:0', 'xpu:0' or 'mps' when torch sees it, else 'nvml:3' / 'amdsmi:1'."""
        if self.torch_index is not None:
            return device_label(self.kind, self.torch_index)
        return f"nvml:{self.nvml_index}" if self.nvml_index is not None else f"amdsmi:{self.amdsmi_index}"


def targets_from(mappings: Sequence[Any]) -> list[GPUTarget]:
    """GPU targets from ``gpumap.gpu_map()`` rows (``torch_index, nvml_index, name``, ``mig``)."""
    return [GPUTarget(m.torch_index, m.nvml_index, "" if is_na(m.name) else str(m.name),
                      None if is_na(getattr(m, "mig", None)) else getattr(m, "mig", None)) for m in mappings]


def nvml_targets(state: str) -> list[GPUTarget]:
    """The GPUs to watch from NVML alone, for when torch cannot be asked without initialising CUDA
    (``state`` is :func:`cuda_state`'s): every GPU NVML sees for a torch without CUDA; else the GPUs
    ``CUDA_VISIBLE_DEVICES`` lets CUDA see, in its order (torch's numbering to come), where a MIG instance
    is watched as that instance: its memory and processes, not the whole GPU's."""
    from ..gpus import gpumap, nvml

    if nvml.status() is not None:
        return []
    gpus = [nvml.gpu_snapshot(i, identity_only=True) for i in range(nvml.device_count())]
    if state == "no CUDA":
        return [GPUTarget(None, g.index, str(g.name)) for g in gpus]
    targets = []
    for position, (index, slot) in enumerate(
            gpumap.parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)):
        mig = next((m for m in gpus[index].mig_devices if m.index == slot), None)
        targets.append(GPUTarget(position, index, str(mig.name if mig else gpus[index].name),
                                 str(mig.uuid) if mig else None))
    return targets


def accelerator_targets() -> list[GPUTarget]:
    """The devices to watch on an accelerator NVML does not see, without initialising it: MPS (the Mac's
    one GPU), XPU and PrivateUse1 backends (torch's devices, named once initialised), and AMD GPUs under
    ROCm, torch's ``cuda:N`` each matched to AMD SMI's GPU by position in HIP's visibility list."""
    kind = accelerators.current_kind()
    if kind is None:
        return []
    count = accelerators.device_count(kind)
    named = accelerators.state(kind) == "initialised"
    if kind == "cuda":
        from ..gpus import amdsmi

        gpus = amdsmi.gpus()
        visible = accelerators.hip_visible(len(gpus))
        return [GPUTarget(i, None, str(gpus[visible[i]].name) if i < len(visible) else "", kind="cuda",
                          amdsmi_index=visible[i] if i < len(visible) else None) for i in range(count)]
    return [GPUTarget(i, None, accelerators.device_name((kind, i)) if named else "", kind=kind)
            for i in range(count)]


@dataclass(frozen=True)
class GPUMemory:
    """One GPU seen three ways. Every figure is bytes, or NA/None where that source cannot say."""

    target: GPUTarget
    used: Any = None          # NVML: all processes, plus the driver's reservation
    total: Any = None         # NVML
    process: Any = None       # NVML: this process (its PID in the compute/graphics process lists)
    others: Any = None        # NVML: every other process on this GPU
    allocated: Any = None     # torch.cuda.memory_allocated: live tensors
    reserved: Any = None      # torch.cuda.memory_reserved: held by the caching allocator
    peak: Any = None          # highest allocated since the last reset (the Sampler's: gpumem.sampler)
    problems: tuple = ()

    @property
    def cache(self) -> Any:
        """Reserved but not allocated: torch's cache (``torch.cuda.empty_cache()`` gives it back)."""
        if is_na(self.reserved) or is_na(self.allocated):
            return None
        return max(0, int(self.reserved) - int(self.allocated))

    @property
    def other(self) -> Any:
        """This process's NVML usage beyond torch's reservation: CUDA context, libraries, non-torch
        allocations. Clamped at 0 (the two sources are read a moment apart)."""
        if is_na(self.process):
            return None
        reserved = 0 if is_na(self.reserved) else int(self.reserved)
        return max(0, int(self.process) - reserved)

    def to_dict(self) -> dict:
        """Plain figures (None for N/A), derived ones included."""
        figures = {k: None if is_na(v) else v for k, v in asdict(self).items()
                   if k not in ("target", "problems")}
        return {**figures, **asdict(self.target), "cache": self.cache, "other": self.other,
                "problems": list(self.problems)}


@dataclass(frozen=True, repr=False)
class MemorySnapshot(Reportable):
    """Everything one sample saw. ``cuda`` says how much torch could tell of its accelerator (CUDA, or
    ``backend``): 'not imported', 'no CUDA', 'not initialised' (torch holds no GPU memory yet),
    'initialised'."""

    time: float
    wall_time: float
    host: Optional[HostMemory]
    gpus: tuple = ()
    cuda: str = "not imported"
    status: tuple = ()
    backend: str = "CUDA"

    def to_dict(self) -> dict:
        """Plain values for code and JSON."""
        return {
            "time": self.time,
            "wall_time": self.wall_time,
            "host": asdict(self.host) if self.host else None,
            "gpus": [g.to_dict() for g in self.gpus],
            "cuda": self.cuda,
            "status": list(self.status),
        }

    def host_line(self) -> str:
        """'host: this process 1.2 GiB RSS · system available 20 GiB of 24 GiB'."""
        if self.host is None:
            return "host: memory figures unavailable"
        h = self.host
        return (
            f"host: this process {fmt_bytes(h.rss)} RSS · system available "
            f"{fmt_bytes(h.available)} of {fmt_bytes(h.total)}"
        )

    def table(self) -> Optional[Table]:
        """The GPU rows as a table, or None on a machine without GPUs."""
        if not self.gpus:
            return None
        source = "NVML " if any(g.target.nvml_index is not None for g in self.gpus) else \
            "AMD SMI " if any(g.target.amdsmi_index is not None for g in self.gpus) else ""
        used = "driver-allocated / working-set limit" if all(g.target.kind == "mps" for g in self.gpus) \
            else f"{source}used / total"
        table = Table(
            ["GPU", used, "this process", "allocated", "cache", "other", "other processes", "peak allocated"],
            align="lrrrrrrr",
        )
        for g in self.gpus:
            name = f"{g.target.label} {g.target.name}".strip()
            table.add(name, f"{fmt_bytes(g.used)} / {fmt_bytes(g.total)}", fmt_bytes(g.process),
                      fmt_bytes(g.allocated), fmt_bytes(g.cache), fmt_bytes(g.other),
                      fmt_bytes(g.others), fmt_bytes(g.peak))
        return table

    def notes(self) -> list[str]:
        """Lines under the table: no GPU, CUDA state, problems."""
        lines = []
        if not self.gpus:
            lines.append("no GPU: host memory only")
        elif self.cuda in _CUDA_NOTES:
            lines.append(_CUDA_NOTES[self.cuda].replace("CUDA", self.backend))
        if any(g.target.kind == "mps" for g in self.gpus):
            lines.append(MPS_NOTE)
        lines.extend(self.status)
        for g in self.gpus:
            lines.extend(f"{g.target.label}: {p}" for p in g.problems)
        return lines

    def report(self) -> Report:
        """The host's line, the GPU table, the notes."""
        return Report([Lines([self.host_line()]), self.table(), Lines(self.notes())],
                      title="Memory (this process)", indent="  ")


_CUDA_NOTES = {
    "not imported": "torch is not imported in this process yet, so it holds no GPU memory",
    "no CUDA": "this torch has no CUDA (a CPU build?): only NVML's figures are shown",
    "not initialised": "CUDA is not initialised in this process yet, so torch holds no GPU memory",
}


MPS_NOTE = ("mps: unified memory; the GPU may use up to its working-set limit (Metal's "
            "recommendedMaxWorkingSetSize). torch keeps no peak on MPS: the peak shown is the highest "
            "allocated of the samples and of each cell's start and end")


def collect(targets: Sequence[GPUTarget]) -> MemorySnapshot:
    """Take one sample of host memory and every target GPU. Never raises for a lost GPU or a broken
    NVML: those become ``problems`` / ``status`` lines."""
    pid = os.getpid()
    status = []
    nvml_ok = False
    if any(t.nvml_index is not None for t in targets):
        from ..gpus import nvml, processes

        problem = nvml.status()  # never raises: a missing or broken NVML is a problem it returns
        nvml_ok = problem is None
        if problem is not None:
            status.append(processes.problem_text(problem))
    kind = next((t.kind for t in targets), accelerators.current_kind() or "cuda")
    state = cuda_state() if kind == "cuda" else accelerators.state(kind)
    gpus = []
    for target in targets:
        used, total, process, others, problems = driver_view(target, pid, nvml_ok)
        allocated = reserved = peak = None
        if target.torch_index is not None:
            allocated, reserved, peak = torch_figures(target.torch_index, target.kind)
        gpus.append(GPUMemory(target, used, total, process, others, allocated, reserved, peak, problems))
    return MemorySnapshot(time.monotonic(), time.time(), host_memory(), tuple(gpus), state, tuple(status),
                          accelerators.backend_label(kind))


def amdsmi_figures(index: int, pid: int) -> tuple:
    """(used, total, this process, other processes, problems) of AMD SMI's GPU ``index``."""
    from ..gpus import amdsmi

    problem = amdsmi.status()
    if problem is not None:
        return None, None, None, None, (f"AMD SMI: {problem}",)
    gpus = amdsmi.gpus()
    if index >= len(gpus):
        return None, None, None, None, (f"AMD SMI lists no GPU {index}",)
    gpu = gpus[index]
    by_pid = {p.pid: int(p.used_memory) for p in gpu.processes if not is_na(p.used_memory)}
    mine = by_pid.pop(pid, 0)
    return gpu.memory_used, gpu.memory_total, mine, sum(by_pid.values()), tuple(gpu.problems)


def driver_view(target: GPUTarget, pid: int, nvml_ok: bool = True) -> tuple:
    """(used, total, this process, other processes, problems) of ``target`` as its driver sees them:
    NVML's (unless ``nvml_ok`` is False: NVML is broken), AMD SMI's, or for a backend neither sees torch's
    device layer's: MPS's driver-allocated memory against its working-set limit (both this process's),
    elsewhere the device's free and total memory (all processes), asked only once the backend is
    initialised. Nones where none of them can say."""
    if nvml_ok and target.nvml_index is not None:
        from ..gpus import processes

        return processes.process_figures(target.nvml_index, pid, target.mig_uuid)
    if target.amdsmi_index is not None:
        return amdsmi_figures(target.amdsmi_index, pid)
    if target.kind == "cuda" or target.torch_index is None:
        return None, None, None, None, ()
    device = (target.kind, target.torch_index)
    try:
        if target.kind == "mps":
            driver = accelerators.reserved(device)
            return driver, accelerators.working_set_limit(), driver, None, ()
        info = accelerators.memory_info(device)
    except Exception:  # noqa: BLE001 - a backend that cannot say shows N/A
        info = None
    return (None, None, None, None, ()) if info is None else (info[1] - info[0], info[1], None, None, ())


