"""The simulated GPU's memory: torch's CUDA caching allocator, the device it takes memory from, and the
machines around it (NVML's view, the other processes), as scripted scenarios.

The allocator follows ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch at 001074d, read through the
reference index; not :mod:`torchgpu_magic.cudamem.allocator`, the code under test): every request rounded
up to 512 bytes (``kMinBlockSize``); requests up to 1 MiB (``kSmallSize``) from the small pool, whose
segments are 2 MiB (``kSmallBuffer``), larger ones from the large pool, whose new segments are 20 MiB
(``kLargeBuffer``) below 10 MiB (``kMinLargeAlloc``) and the request rounded up to 2 MiB
(``kRoundLarge``) above; the smallest free block that fits is taken (``get_free_block``) and split when
what is left is at least 512 bytes (small pool) or more than 1 MiB (large pool; ``should_split``); a freed
block merges with free neighbours of its segment (``free_block``); when the device cannot give a new
segment, the cached segments with nothing allocated are released and the request retried
(``release_cached_blocks``), and then ``torch.OutOfMemoryError`` is raised with torch's own message for
the figures (``malloc``: "Tried to allocate" names the segment size asked of the device,
``reportProcessMemoryInfo`` lists NVML's compute processes, "Including non-PyTorch memory, this process"
only where NVML lists this PID, ``format_size`` prints two decimals and 1024-based units). The statistics
torch reads (``memory_stats``: allocated, reserved, active, requested bytes, segment and allocation
counts, each current / peak / allocated / freed per pool) move as the C++ moves them, and
``memory_snapshot`` lists segments and blocks in torch's layout.

The device: ``cudaMemGetInfo``'s total is the one torch reports (``total_memory``); what is free is that
less the CUDA context (once this process has one), torch's reserved segments and what the scenario's
other processes hold. NVML's figures follow the same memory: its ``used`` and this process's entry in
the compute-process list (by its own PID, under a host PID, or not there, as the scenario says).

Scenarios (:data:`SCENARIOS`) come from real machines' documented outputs, each citing its source.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = MiB  # kSmallSize
SMALL_BUFFER = 2 * MiB  # kSmallBuffer
LARGE_BUFFER = 20 * MiB  # kLargeBuffer
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge
NVML_IDLE_USED = 4 * MiB  # what NVML's v2 memory query says is used on an idle H100 (fake_pynvml.h100)
# torch 2.13's default cuBLAS workspace on sm_90 (at::cuda::getChosenWorkspaceSize: ":4096:8", 8 x 4 MiB)
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * KiB


def round_size(size: int) -> int:
    """``round_size``: at least 512 bytes, a multiple of 512 (no roundup_power2_divisions configured)."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment a rounded request asks of the device."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


def format_size(size: int) -> str:
    """torch's ``format_size`` (CUDACachingAllocator.cpp): '0 bytes', '512.00 KiB', '1.50 GiB'."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= MiB:
        return f"{size / 1024:.2f} KiB"
    if size <= GiB:
        return f"{size / MiB:.2f} MiB"
    return f"{size / GiB:.2f} GiB"


class Block:
    """A piece of a segment: ``offset`` and ``size`` in it, ``requested`` bytes when allocated."""

    __slots__ = ("segment", "offset", "size", "requested", "allocated")

    def __init__(self, segment: Segment, offset: int, size: int) -> None:
        self.segment, self.offset, self.size = segment, offset, size
        self.requested = 0
        self.allocated = False

    @property
    def address(self) -> int:
        return self.segment.address + self.offset


class Segment:
    """One ``cudaMalloc`` of the allocator: its blocks in address order."""

    _addresses = itertools.count(0x7F2000000000, 1 << 36)  # far apart: segments never overlap

    def __init__(self, size: int, small: bool) -> None:
        self.address = next(Segment._addresses)
        self.size, self.small = size, small
        self.blocks = [Block(self, 0, size)]

    def empty(self) -> bool:
        return len(self.blocks) == 1 and not self.blocks[0].allocated


def _stat() -> dict:
    return {"current": 0, "peak": 0, "allocated": 0, "freed": 0}


_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
           "active_bytes", "inactive_split_bytes", "requested_bytes")


class CachingAllocator:
    """torch's device caching allocator for the simulated ``cuda:0`` (see the module's docstring)."""

    def __init__(self, memory: DeviceMemory) -> None:
        self.memory = memory
        self.segments: list = []
        self.stats = {name: {pool: _stat() for pool in ("all", "small_pool", "large_pool")}
                      for name in _ARRAYS}
        self.counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
                         "num_device_alloc": 0, "num_device_free": 0}

    # ---- statistics, as torch keeps them -------------------------------------------------------------
    def _change(self, name: str, small: bool, amount: int) -> None:
        for pool in ("all", "small_pool" if small else "large_pool"):
            stat = self.stats[name][pool]
            stat["current"] += amount
            if amount > 0:
                stat["allocated"] += amount
                stat["peak"] = max(stat["peak"], stat["current"])
            else:
                stat["freed"] -= amount

    def current(self, name: str) -> int:
        return self.stats[name]["all"]["current"]

    def reset_peaks(self) -> None:
        for arrays in self.stats.values():
            for stat in arrays.values():
                stat["peak"] = stat["current"]

    def memory_stats(self) -> dict:
        """``torch._C._cuda_memoryStats``: the nested dict ``torch.cuda.memory_stats`` flattens."""
        out: dict = {name: {pool: dict(stat) for pool, stat in arrays.items()}
                     for name, arrays in self.stats.items()}
        out.update(self.counters)
        out["max_split_size"] = -1
        out["oversize_allocations"] = _stat()
        out["oversize_segments"] = _stat()
        return out

    # ---- allocating ---------------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        """A block for ``nbytes``, from the cache or a new segment; ``torch.OutOfMemoryError`` with
        torch's message where the device has no room even after the cache's whole free segments went."""
        __tracebackhide__ = True  # noqa: F841 - C++ in torch: no Python frame of the user's
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._free_block(size, small)
        if block is None:
            ask = allocation_size(size)
            if not self.memory.can_take(ask):
                self.counters["num_alloc_retries"] += 1
                self.release_cached()
            if not self.memory.can_take(ask):
                self.counters["num_ooms"] += 1
                raise torch.OutOfMemoryError(self.memory.oom_message(ask))
            segment = Segment(ask, small)
            self.segments.append(segment)
            self.counters["num_device_alloc"] += 1
            self._change("segment", small, 1)
            self._change("reserved_bytes", small, ask)
            self.memory.changed()
            block = segment.blocks[0]
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            segment = block.segment
            rest = Block(segment, block.offset + size, remaining)
            block.size = size
            segment.blocks.insert(segment.blocks.index(block) + 1, rest)
        block.allocated, block.requested = True, nbytes
        for name, amount in (("allocation", 1), ("active", 1), ("allocated_bytes", block.size),
                             ("active_bytes", block.size), ("requested_bytes", nbytes)):
            self._change(name, small, amount)
        return block

    def _free_block(self, size: int, small: bool) -> Optional[Block]:
        """The smallest free block of the pool that holds ``size`` (lowest address on a tie)."""
        found = [b for s in self.segments if s.small == small for b in s.blocks
                 if not b.allocated and b.size >= size]
        return min(found, key=lambda b: (b.size, b.address)) if found else None

    def free(self, block: Block) -> None:
        """Give ``block`` back to the cache, merged with free neighbours in its segment."""
        segment, small = block.segment, block.segment.small
        for name, amount in (("allocation", -1), ("active", -1), ("allocated_bytes", -block.size),
                             ("active_bytes", -block.size), ("requested_bytes", -block.requested)):
            self._change(name, small, amount)
        block.allocated, block.requested = False, 0
        at = segment.blocks.index(block)
        if at + 1 < len(segment.blocks) and not segment.blocks[at + 1].allocated:
            block.size += segment.blocks.pop(at + 1).size
        if at > 0 and not segment.blocks[at - 1].allocated:
            before = segment.blocks[at - 1]
            before.size += segment.blocks.pop(at).size

    def release_cached(self) -> int:
        """``emptyCache`` / ``release_cached_blocks``: every segment with nothing allocated goes back
        to the device; the bytes released."""
        released = 0
        for segment in [s for s in self.segments if s.empty()]:
            self.segments.remove(segment)
            self.counters["num_device_free"] += 1
            self._change("segment", segment.small, -1)
            self._change("reserved_bytes", segment.small, -segment.size)
            released += segment.size
        if released:
            self.memory.changed()
        return released

    def snapshot(self) -> list:
        """``memory_snapshot()``'s segments, in torch's layout."""
        out = []
        for s in self.segments:
            blocks = [{"address": b.address, "size": b.size, "requested_size": b.requested,
                       "state": "active_allocated" if b.allocated else "inactive", "frames": []}
                      for b in s.blocks]
            allocated = sum(b.size for b in s.blocks if b.allocated)
            out.append({"device": 0, "address": s.address, "total_size": s.size, "allocated_size": allocated,
                        "active_size": allocated, "requested_size": sum(b.requested for b in s.blocks),
                        "stream": 0, "segment_type": "small" if s.small else "large",
                        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
        return out


@dataclass
class MemoryScenario:
    """What is on the GPU beside this process, and how NVML lists this process: ``listing`` 'own' (its
    PID: on the host, or a container started with --pid=host), 'host' (under ``host_pid``: a container
    without --pid=host) or 'hidden' (not listed). ``others``: (host PID, bytes) of other processes.
    ``context``: the CUDA context's size once this process has one. ``mig``: the MIG profile this
    process's CUDA device is a slice of (then ``total`` is what torch reports for it, and NVML lists the
    slice's processes without their memory, as it does for a user without privileges). ``source``: where
    the figures come from."""

    name: str
    listing: str = "own"
    host_pid: Optional[int] = None
    others: tuple = ()
    context: int = 522 * MiB
    mig: Optional[str] = None
    total: Optional[int] = None
    source: str = ""


# An H100 80GB's CUDA context: "Process 3736537 has 522.00 MiB memory in use" is a process holding only
# its context in an OOM message printed on an H100 (79.18 GiB), and issue 28 item 9 measured 0.5-0.6 GiB.
SCENARIOS = {
    "alone": MemoryScenario(
        "alone", source="this process alone on the H100, listed by its own PID (a host, or --pid=host)"),
    "shared": MemoryScenario(
        "shared", others=((4190001, 12288 * MiB),),
        source="another job's 12 GiB beside this process, both listed by their PIDs (fake_pynvml's "
               "h100_busy figures)"),
    "container": MemoryScenario(
        "container", listing="host", host_pid=21422,
        source="a container without --pid=host: NVML lists this process under its host PID, as in "
               "https://github.com/OpenHelix-Team/cobra/issues/24 ('Process 21422 has 23.57 GiB memory "
               "in use' for the process that failed)"),
    "container_shared": MemoryScenario(
        "container_shared", listing="host", host_pid=3736537, others=((3955547, int(49.48 * GiB)),),
        source="a container sharing the GPU with an inference engine: an OOM message printed on an H100 "
               "listed 'Process 3736537 has 522.00 MiB memory in use. Process 3955547 has 49.48 GiB'"),
    "hidden": MemoryScenario(
        "hidden", listing="hidden", others=((4190002, 8192 * MiB),),
        source="NVML lists only another process's host PID: this one is not in the list at all"),
    "mig": MemoryScenario(
        "mig", mig="3g.40gb", total=40192 * MiB, others=((4190003, 8 * GiB),),
        source="an H100 80GB's MIG 3g.40gb slice shared with another job: torch reports its total_memory "
               "as 39.25 GiB (a GPU table of a test suite recording it), and NVML in MIG mode gives a user "
               "without privileges no per-process memory (fake_pynvml's mig_user, after nvidia-smi)"),
}


class DeviceMemory:
    """The simulated GPU's memory under a :class:`MemoryScenario`: the allocator, what the device has
    free, and NVML's figures kept in step (``nvml_gpu``: the scripted GPU of fake_pynvml, or None)."""

    def __init__(self, total: int, has_context: Any, nvml_gpu: Any = None,
                 scenario: Optional[MemoryScenario] = None) -> None:
        self.total = total
        self.has_context = has_context  # () -> bool: whether this process has its CUDA context
        self.nvml_gpu = nvml_gpu
        self.scenario = scenario or SCENARIOS["alone"]
        self.allocator = CachingAllocator(self)
        self.changed()

    @property
    def reserved(self) -> int:
        return self.allocator.current("reserved_bytes")

    def context(self) -> int:
        return self.scenario.context if self.has_context() else 0

    def others(self) -> int:
        return sum(size for _, size in self.scenario.others)

    def free(self) -> int:
        """``cudaMemGetInfo``'s free bytes."""
        return max(0, self.total - self.context() - self.reserved - self.others())

    def mem_get_info(self) -> tuple:
        """``cudaMemGetInfo``: (free, total). Asking creates the context, as the call does."""
        self.changed()
        return self.free(), self.total

    def can_take(self, size: int) -> bool:
        return size <= self.free()

    def process_figure(self) -> int:
        """What NVML says this process holds: its context and torch's segments."""
        return self.context() + self.reserved if self.has_context() else 0

    def host_pids(self) -> set:
        """The PIDs NVML lists under the host's numbers in this scenario (this process's and the others'
        in a container without --pid=host, or only the others' where this one is not listed): none of them
        is a process of this PID namespace."""
        if self.scenario.listing == "own":
            return set()
        return {pid for pid in (self.scenario.host_pid, *(p for p, _ in self.scenario.others)) if pid}

    def processes(self) -> list:
        """NVML's compute processes, (pid, bytes) in the order it lists them."""
        listed = [(pid, size) for pid, size in self.scenario.others]
        mine = self.process_figure()
        if mine and self.scenario.listing != "hidden":
            pid = os.getpid() if self.scenario.listing == "own" else self.scenario.host_pid
            listed.insert(0, (pid, mine))
        return listed

    def changed(self) -> None:
        """Keep NVML's figures in step with the device (on a MIG slice: the slice's, and the process
        list without memory figures)."""
        gpu = self.nvml_gpu
        if gpu is None:
            return
        import fake_pynvml

        used = NVML_IDLE_USED + self.process_figure() + self.others()
        if self.scenario.mig and gpu.migs:
            gpu.migs[0].memory_used = used
            gpu.compute = [fake_pynvml.FakeProcess(pid, None, gpuInstanceId=gpu.migs[0].gpu_instance_id,
                                                   computeInstanceId=gpu.migs[0].compute_instance_id)
                           for pid, _ in self.processes()]
        else:
            gpu.compute = [fake_pynvml.FakeProcess(pid, size) for pid, size in self.processes()]
        gpu.memory_used = used

    def oom_message(self, ask: int) -> str:
        """torch's message for a segment of ``ask`` bytes the device could not give (``malloc``)."""
        stats = self.allocator
        allocated, reserved = stats.current("allocated_bytes"), stats.current("reserved_bytes")
        procs = ""  # on a MIG slice torch asks the whole GPU's list, refused to a user: not modelled
        for pid, size in ([] if self.scenario.mig else self.processes()):
            who = ("Including non-PyTorch memory, this process" if pid == os.getpid() else f"Process {pid}")
            procs += f"{who} has {format_size(size)} memory in use. "
        return (f"CUDA out of memory. Tried to allocate {format_size(ask)}. GPU 0 has a total capacity of "
                f"{format_size(self.total)} of which {format_size(self.free())} is free. {procs}"
                f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
                f"{format_size(reserved - allocated)} is reserved by PyTorch but unallocated. If reserved "
                "but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
                "for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


@dataclass(eq=False)
class SimStorage:
    """The memory behind simulated CUDA tensors: one allocator block, shared by a tensor and its views,
    given back when the last of them goes. Answers what ``torch.UntypedStorage`` is asked by the code
    that reads storages (torch's MemTracker, this package's accounting): device, size, element size,
    data pointer, and an identity (``_cdata``)."""

    allocator: CachingAllocator
    nbytes_: int
    block: Any = field(init=False)

    def __post_init__(self) -> None:
        __tracebackhide__ = True  # noqa: F841 - the C++ allocator's place
        self.block = self.allocator.malloc(self.nbytes_)
        self._cdata = self.block.address

    device = torch.device("cuda", 0)

    def size(self) -> int:
        return self.nbytes_

    def nbytes(self) -> int:
        return self.nbytes_

    def element_size(self) -> int:
        return 1

    def data_ptr(self) -> int:
        return self.block.address

    def __hash__(self) -> int:
        return id(self)

    def __del__(self) -> None:
        block, self.block = getattr(self, "block", None), None
        if block is not None and block.allocated:
            self.allocator.free(block)
