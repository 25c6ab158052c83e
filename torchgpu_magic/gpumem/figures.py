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

from ..accelerators import cuda_state, torch_figures
from ..host import HostMemory, host_memory
from ..render import Lines, Report, Reportable, Table, fmt_bytes, is_na


# ---- figures ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPUTarget:
    """One GPU to watch: torch's index (None when torch cannot see it) and NVML's index (None when NVML
    cannot see it), matched by gpumap (by UUID, so CUDA_VISIBLE_DEVICES reordering is right)."""

    torch_index: Optional[int]
    nvml_index: Optional[int]
    name: str = ""
    mig_uuid: Optional[str] = None  # the MIG instance torch uses: NVML is asked about it, not the GPU

    @property
    def label(self) -> str:
        """'cuda:0' when torch sees it, else 'nvml:3'."""
        if self.torch_index is not None:
            return f"cuda:{self.torch_index}"
        return f"nvml:{self.nvml_index}"


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
        out = {k: _plain(v) for k, v in asdict(self).items() if k not in ("target", "problems")}
        out.update(asdict(self.target))
        out["cache"] = self.cache
        out["other"] = self.other
        out["problems"] = list(self.problems)
        return out


@dataclass(frozen=True, repr=False)
class MemorySnapshot(Reportable):
    """Everything one sample saw. ``cuda`` says how much torch could tell: 'not imported', 'no CUDA',
    'not initialised' (torch holds no GPU memory yet), 'initialised'."""

    time: float
    wall_time: float
    host: Optional[HostMemory]
    gpus: tuple = ()
    cuda: str = "not imported"
    status: tuple = ()

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
        table = Table(
            ["GPU", "NVML used / total", "this process", "allocated", "cache", "other",
             "other processes", "peak allocated"],
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
            lines.append(_CUDA_NOTES[self.cuda])
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


def _plain(value: Any) -> Any:
    return None if is_na(value) else value


def collect(targets: Sequence[GPUTarget], pid: Optional[int] = None) -> MemorySnapshot:
    """Take one sample of host memory and every target GPU. Never raises for a lost GPU or a broken
    NVML: those become ``problems`` / ``status`` lines."""
    pid = os.getpid() if pid is None else pid
    status = []
    nvml_ok = False
    if any(t.nvml_index is not None for t in targets):
        from ..gpus import nvml, processes

        problem = nvml.status()  # never raises: a missing or broken NVML is a problem it returns
        if problem is None:
            nvml_ok = True
        else:
            status.append(processes.problem_text(problem))
    state = cuda_state()
    gpus = []
    for target in targets:
        used = total = process = others = None
        problems: tuple = ()
        if nvml_ok and target.nvml_index is not None:
            used, total, process, others, problems = processes.process_figures(
                target.nvml_index, pid, target.mig_uuid)
        allocated = reserved = peak = None
        if target.torch_index is not None:
            allocated, reserved, peak = torch_figures(target.torch_index)
        gpus.append(GPUMemory(target, used, total, process, others, allocated, reserved, peak, problems))
    return MemorySnapshot(time.monotonic(), time.time(), host_memory(), tuple(gpus), state, tuple(status))


