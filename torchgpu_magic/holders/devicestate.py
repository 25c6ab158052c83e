"""One device's memory read live, for the out-of-memory explanation, ``%gpumem holders`` and ``%gpumem
free``: its capacity and what is free, this process's share, torch's allocator (allocated, reserved, the
cache between them and the largest free block in it), and the other processes NVML lists on it.

Read-only and never raising: a figure that cannot be read is None and a note says why. Nothing here
initialises CUDA: a GPU is asked only when CUDA already is initialised in this process (an out-of-memory
error on it means it is).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Optional

from .. import accelerators
from ..accelerators import initialised_cuda
from ..gpus import processes
from ..render import is_na


@dataclass(frozen=True)
class DeviceState:
    """What one device's memory is now, in bytes (None where it cannot be read). ``process`` is this
    process's share (RSS on cpu, NVML's figure on a GPU); ``largest_free_block`` the largest free block
    inside torch's cache, which says whether the cache is fragmented; ``others`` the (pid, name, bytes) of
    other processes on the device."""

    device: str
    total: Optional[int] = None
    free: Optional[int] = None
    process: Optional[int] = None
    allocated: Optional[int] = None
    reserved: Optional[int] = None
    largest_free_block: Optional[int] = None
    others: tuple = ()
    notes: tuple = ()

    @property
    def kind(self) -> str:
        """'cpu', 'cuda', 'mps', 'xpu'..."""
        return self.device.partition(":")[0]

    @property
    def cache(self) -> Optional[int]:
        """Reserved but not allocated: torch's cache on the device."""
        if self.allocated is None or self.reserved is None:
            return None
        return max(0, self.reserved - self.allocated)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["others"] = [list(o) for o in self.others]
        out["notes"] = list(self.notes)
        out["cache"] = self.cache
        return out


def read(device: str) -> DeviceState:
    """The :class:`DeviceState` of ``device`` ('cpu', 'cuda:0', 'mps', 'xpu:0')."""
    kind, _, index = device.partition(":")
    try:
        if kind == "cpu":
            return _cpu(device)
        if kind == "cuda":
            return _cuda(device, int(index) if index.isdigit() else None)
        if kind not in ("meta", "disk") and kind in accelerators.available_kinds():
            return _other_backend(device, kind, int(index) if index.isdigit() else 0)
    except Exception as exc:  # noqa: BLE001 - a device that cannot be read is a note, never an error
        return DeviceState(device, notes=(f"{device} could not be read ({type(exc).__name__}: {exc})",))
    return DeviceState(device, notes=(f"torch keeps no memory figures for {device}",))


def _cpu(device: str) -> DeviceState:
    try:
        import psutil

        vm = psutil.virtual_memory()
        rss = int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001
        return DeviceState(device, notes=("psutil could not read this process's memory",))
    return DeviceState(device, total=int(vm.total), free=int(vm.available), process=rss)


def _cuda(device: str, index: Optional[int]) -> DeviceState:
    cuda = initialised_cuda()
    if cuda is None:
        return DeviceState(device, notes=("CUDA is not initialised in this process: torch holds nothing "
                                          "there",))
    if index is None:
        index = int(cuda.current_device())
        device = f"cuda:{index}"
    allocated = int(cuda.memory_allocated(index))
    reserved = int(cuda.memory_reserved(index))
    free, total = (int(v) for v in cuda.mem_get_info(index))
    notes: list = []
    process = None
    others: tuple = ()
    target = _nvml_target(index)
    if target is not None:
        nvml_index, mig = target
        _, _, process, _, problems = processes.process_figures(nvml_index, os.getpid(), mig)
        notes.extend(problems)
        others = _other_processes(nvml_index, mig)
        process = None if is_na(process) else process
    return DeviceState(device, total, free, process, allocated, reserved, _largest_free_block(cuda, index),
                       others, tuple(notes))


def _nvml_target(index: int) -> Optional[tuple]:
    """(NVML index, MIG uuid) of torch's ``cuda:index``, matched by UUID; None where NVML cannot say."""
    from ..gpus import gpumap, nvml

    if nvml.status() is not None:
        return None
    for mapping in gpumap.gpu_map():
        if mapping.torch_index == index and mapping.nvml_index is not None:
            mig = getattr(mapping, "mig", None)
            return mapping.nvml_index, None if is_na(mig) else mig
    return None


def _other_processes(nvml_index: int, mig: Any) -> tuple:
    """(pid, name, bytes) of every other process NVML lists on the GPU, largest first."""
    from ..gpus import nvml

    procs, _ = nvml.processes(nvml_index, mig)
    mine = os.getpid()
    found = [(p.pid, "" if is_na(p.name) else str(p.name), int(p.used_memory)) for p in procs
             if p.pid != mine and not is_na(p.used_memory)]
    return tuple(sorted(found, key=lambda p: -p[2]))


def _largest_free_block(cuda: Any, index: int) -> Optional[int]:
    """The largest free block in torch's cache on ``cuda:index``, from the allocator's segments (torch's
    ``memory_stats`` counts free split bytes, not their largest piece); None where torch cannot say."""
    try:
        segments = cuda.memory_snapshot()
    except Exception:  # noqa: BLE001 - another allocator backend (cudaMallocAsync) keeps no segments
        return None
    largest = 0
    for segment in segments:
        if segment.get("device") != index:
            continue
        for block in segment.get("blocks", ()):
            if block.get("state") == "inactive":
                largest = max(largest, int(block.get("size", 0)))
    return largest


def _other_backend(device: str, kind: str, index: int) -> DeviceState:
    """MPS (its working-set limit as the total, the driver's allocation as this process's share), XPU
    and PrivateUse1 backends, through the device layer."""
    if accelerators.initialised(kind) is None:
        return DeviceState(device, notes=(f"{kind} is not initialised in this process",))
    at = (kind, index)
    allocated, reserved = accelerators.allocated(at), accelerators.reserved(at)
    if kind == "mps":
        return DeviceState(device, total=accelerators.working_set_limit(), allocated=allocated,
                           reserved=reserved, process=reserved)
    info = accelerators.memory_info(at)
    free, total = info if info is not None else (None, None)
    return DeviceState(device, total=total, free=free, allocated=allocated, reserved=reserved)
