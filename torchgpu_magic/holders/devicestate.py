"""One device's memory read live, for the out-of-memory explanation, ``%gpumem holders`` and ``%gpumem
free``: its capacity and what is free, this process's share, torch's allocator (allocated, reserved, the
cache between them and the largest free block in it, what its rounding adds), and the other processes NVML
lists on it.

On the cpu, "free" is what this process may still take: the system's available memory, or less under a
cgroup's limit or ``ulimit -v`` (:func:`torchgpu_magic.host.host_memory`), and ``limit`` names the limit.
On a GPU, NVML's process list is read through :func:`torchgpu_magic.gpus.processes.foreign_pids`: in a
container without ``--pid=host`` it names the host's PIDs, this process among them under a number it
cannot recognise, so no process is called "another" there (``foreign`` keeps what NVML listed).

Read-only and never raising: a figure that cannot be read is None and a note says why. Nothing here
initialises CUDA: a GPU is asked only when CUDA already is initialised in this process (an out-of-memory
error on it means it is).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from .. import accelerators
from ..accelerators import initialised_cuda
from ..gpus import gpumap, nvml, processes
from ..host import host_memory
from ..render import fmt_bytes, is_na
from ..torchapi import has_primary_context


@dataclass(frozen=True)
class DeviceState:
    """What one device's memory is now, in bytes (None where it cannot be read). ``process`` is this
    process's share (RSS on cpu, NVML's figure on a GPU); ``largest_free_block`` the largest free block
    inside torch's cache, which says whether the cache is fragmented; ``others`` the (pid, name, bytes) of
    other processes on the device; ``foreign`` the (pid, name, bytes) NVML lists under another PID
    namespace's numbers (this process among them, unrecognisable), in which case ``others`` is empty;
    ``unmeasured`` the (pid, name) of other processes NVML lists without their memory (a MIG slice);
    ``requested`` what torch's tensors asked for (``allocated`` less the allocator's rounding to 512-byte
    blocks); ``limit`` the limit that bounds ``free`` on the cpu (empty: the system's own figures)."""

    device: str
    total: Optional[int] = None
    free: Optional[int] = None
    process: Optional[int] = None
    allocated: Optional[int] = None
    reserved: Optional[int] = None
    largest_free_block: Optional[int] = None
    others: tuple = ()
    notes: tuple = ()
    foreign: tuple = ()
    unmeasured: tuple = ()
    requested: Optional[int] = None
    limit: str = ""

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

    @property
    def outside(self) -> Optional[int]:
        """On a GPU, the bytes in use beyond torch's reserved memory and what NVML names other processes
        hold (this process's CUDA context, libraries' own allocations, processes NVML cannot tell apart);
        None where it cannot be read."""
        if self.kind != "cuda" or self.reserved is None or self.free is None or self.total is None:
            return None
        return self.total - self.free - self.reserved - sum(size for _, _, size in self.others)

    def to_dict(self) -> dict:
        rows = {name: [list(o) for o in getattr(self, name)] for name in ("others", "foreign", "unmeasured")}
        return {**asdict(self), **rows, "notes": list(self.notes), "cache": self.cache}


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


def used_devices(used: Callable[[tuple], Any]) -> list:
    """Those of :func:`~torchgpu_magic.accelerators.initialised_devices` for which ``used((kind, index))``
    is true; a device that fails to answer (a lost GPU) is left out."""
    found: list = []
    for device in accelerators.initialised_devices():
        with contextlib.suppress(Exception):
            if used(device):
                found.append(device)
    return found


def _cpu(device: str) -> DeviceState:
    """The cpu as this process sees it: what it may still take (under its limits) of what it may hold."""
    memory = host_memory()
    if memory is None:
        return DeviceState(device, notes=("psutil could not read this process's memory",))
    if memory.limit is None:
        return DeviceState(device, total=memory.total, free=memory.available, process=memory.rss)
    note = (f"the system has {fmt_bytes(memory.available)} of {fmt_bytes(memory.total)} available; this "
            f"process may take only what {memory.limit.name} leaves it")
    return DeviceState(device, total=memory.capacity, free=memory.usable, process=memory.rss,
                       notes=(note,), limit=memory.limit.describe())


def _cuda(device: str, index: Optional[int]) -> DeviceState:
    cuda = initialised_cuda()
    if cuda is None:
        return DeviceState(device, notes=("CUDA is not initialised in this process: torch holds nothing "
                                          "there",))
    if index is None:
        index = int(cuda.current_device())
        device = f"cuda:{index}"
    stats = cuda.memory_stats(index)
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    requested = stats.get("requested_bytes.all.current")
    notes: list = []
    if has_primary_context(index):
        free, total = (int(v) for v in cuda.mem_get_info(index))
    else:  # cudaMemGetInfo would create the context (hundreds of MiB) just to answer
        free, total = None, int(cuda.get_device_properties(index).total_memory)
        notes.append(f"no CUDA context on {device} yet: what is free there is not asked (asking would create "
                     "one)")
    process, others, foreign, unmeasured = None, (), (), ()
    target = gpumap.nvml_target(index)
    if target is not None:
        nvml_index, mig = target
        _, _, process, _, problems = processes.process_figures(nvml_index, os.getpid(), mig)
        notes.extend(problems)
        others, foreign, unmeasured, told = _other_processes(nvml_index, mig, reserved)
        if told:
            notes.append(told)
        process = None if is_na(process) else process
    return DeviceState(device, total, free, process, allocated, reserved, _largest_free_block(cuda, index),
                       others, tuple(notes), foreign, unmeasured,
                       None if requested is None else int(requested))


def _other_processes(nvml_index: int, mig: Any, reserved: int = 0) -> tuple:
    """((pid, name, bytes) of every other process NVML lists on the GPU, largest first; the same of the
    processes it lists under another PID namespace's numbers that may be this one; (pid, name) of the
    other processes it lists without their memory, as on a MIG slice; under another namespace's numbers,
    what could be told of this process, else '').

    Under the host's PIDs this process cannot be found by its PID, but by what it holds: at least torch's
    ``reserved`` memory. A listed process holding less is another; if exactly one holds as much, it is
    this one; if several do, NVML cannot tell which (``foreign`` keeps them all, ``others`` none of
    them)."""
    procs, _ = nvml.processes(nvml_index, mig)
    mine = os.getpid()
    listed = sorted(((p.pid, "" if is_na(p.name) else str(p.name), int(p.used_memory)) for p in procs
                     if not is_na(p.used_memory)), key=lambda p: -p[2])
    unmeasured = tuple(dict.fromkeys((p.pid, "" if is_na(p.name) else str(p.name)) for p in procs
                                     if is_na(p.used_memory) and p.pid != mine))
    if processes.foreign_pids(procs, mine):
        maybe_me = [p for p in listed if p[2] >= reserved]
        if len(maybe_me) > 1:
            return (), tuple(listed), unmeasured, _told_apart((), tuple(maybe_me))
        others = tuple(p for p in listed if p not in maybe_me)
        return others, tuple(maybe_me), unmeasured, _told_apart(others, tuple(maybe_me))
    return tuple(p for p in listed if p[0] != mine), (), unmeasured, ""


def _told_apart(others: tuple, foreign: tuple) -> str:
    """What NVML's list under the host's PIDs says of this process, told apart by what it holds."""
    if len(foreign) > 1:
        return f"{len(foreign)} of them hold at least what torch reserves here: any could be this process"
    named = ", ".join(str(pid) for pid, _, _ in others[:4])
    if not foreign:
        return (f"none of them holds what torch reserves here, so this process is not in NVML's list and the "
                f"process{'es' if len(others) != 1 else ''} it lists ({named}) are others")
    return (f"only PID {foreign[0][0]} holds at least what torch reserves here: that is this process"
            + (f", and {named} {'are' if len(others) != 1 else 'is'} another" if others else ""))


def allocator_blocks(cuda: Any, index: int) -> Optional[list]:
    """The blocks of torch's caching allocator on ``cuda:index`` (its segments' ``blocks``); None where
    torch keeps no segments (the cudaMallocAsync backend)."""
    try:
        segments = cuda.memory_snapshot()
    except Exception:  # noqa: BLE001 - another allocator backend keeps no segments
        return None
    return [block for segment in segments if segment.get("device") == index
            for block in segment.get("blocks", ())]


def _largest_free_block(cuda: Any, index: int) -> Optional[int]:
    """The largest free block in torch's cache on ``cuda:index`` (torch's ``memory_stats`` counts free
    split bytes, not their largest piece); None where torch cannot say."""
    blocks = allocator_blocks(cuda, index)
    if blocks is None:
        return None
    return max((int(b.get("size", 0)) for b in blocks if b.get("state") == "inactive"), default=0)


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
