"""Recognising an out-of-memory error and reading what its message says: which device, how much was asked,
and the figures the allocator printed (total, free, allocated, reserved but unallocated, other processes).

PyTorch has worded the error many ways: CUDA's caching allocator (the ``(GPU 0; ... total capacity; ...)``
form of 0.4 to 2.0, the ``GPU 0 has a total capacity of ...`` form since 2.1), the same text hipified for
ROCm (``HIP out of memory``), the ``cudaMallocAsync`` backend, bare CUDA runtime and driver errors,
Triton's launcher (its driver's own ``cuGetErrorString``, e.g. loading a kernel's module on a full GPU),
the MPS and XPU allocators, the CPU allocator (``DefaultCPUAllocator``, and TH's ``Buy new RAM!`` before
it).
``tests/oom_wordings.py`` lists each wording with where it came from, and the look-alikes that must not
match (a launch's "out of resources", cuBLAS' ``CUBLAS_STATUS_ALLOC_FAILED``, shape and dtype errors).

Only strings are read: nothing here touches a tensor or a device. The explanation that names what holds
the memory is :mod:`torchgpu_magic.explain.outofmemory`'s.
"""
from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Optional

from ..caches import cache

_SIZE = r"(\d+(?:\.\d+)?\s*(?:bytes|[KMGTPE]i?B|B))"


def _s(name: str) -> str:
    """A size as format_size prints it, captured as the group ``name``."""
    return f"(?P<{name}>{_SIZE[1:-1]})"


_UNITS = {"bytes": 0, "B": 0, "KiB": 1, "KB": 1, "MiB": 2, "MB": 2, "GiB": 3, "GB": 3, "TiB": 4, "TB": 4,
          "PiB": 5, "PB": 5, "EiB": 6, "EB": 6}
# The device type torch gives each backend's devices (ROCm GPUs are 'cuda' to torch).
_DEVICE_OF = {"cuda": "cuda", "hip": "cuda", "cuda-async": "cuda", "xpu": "xpu", "mps": "mps", "cpu": "cpu"}


def parse_size(text: str) -> int:
    """Bytes of a size as PyTorch's ``format_size`` prints it ('12.50 MiB', '0 bytes', '1.2 GB'). Every
    allocator here formats in powers of 1024, whether it writes 'GiB' or 'GB'. Read exactly (a float would
    lose the last digits of a byte count over 2**53)."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(\w+)", text.strip()).groups()
    return round(Fraction(number) * 1024 ** _UNITS[unit])


@dataclass(frozen=True)
class OOMFacts:
    """What an out-of-memory message says, in bytes (None where it does not say). ``device`` is as
    torch names it ('cuda:0', 'cpu', 'mps', 'xpu:1'; 'cuda' where the message names no index);
    ``backend`` the allocator that raised ('cuda', 'hip', 'cuda-async', 'mps', 'xpu', 'cpu', 'python');
    ``wording`` which form of the message it was. ``in_use`` is what this process has on the device
    (PyTorch's and the rest), ``others`` the (pid, bytes) of other processes the message lists,
    ``allocated`` what PyTorch's tensors hold (its private pools, e.g. CUDA graphs', included; those alone
    are ``private_pools``), ``cached`` reserved but unallocated (torch's cache, which
    the allocator already emptied of whole free segments before raising: what is left is fragments),
    ``limit`` a per-process cap (``set_per_process_memory_fraction``, MPS' high watermark)."""

    backend: str
    device: Optional[str]
    wording: str
    asked: Optional[int] = None
    total: Optional[int] = None
    free: Optional[int] = None
    in_use: Optional[int] = None
    others: tuple = ()
    allocated: Optional[int] = None
    reserved: Optional[int] = None
    cached: Optional[int] = None
    private_pools: Optional[int] = None
    limit: Optional[int] = None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["others"] = [list(pair) for pair in self.others]
        return out


# (wording, pattern, backend when the pattern does not name it). The first that matches decides; the
# named groups that a pattern has are read into OOMFacts. Detail patterns below add what a long message
# says anywhere in it.
_FORMS = [
    ("allocator", rf"(?P<backend>CUDA|HIP|XPU) out of memory\. Tried to allocate {_s('asked')}"
                  rf"\. GPU (?P<index>\d+) has a total capac(?:i)?ty of {_s('total')}"
                  rf"(?: of which {_s('free')} is free)?", None),
    ("allocator-legacy", rf"(?P<backend>CUDA|HIP|XPU) out of memory\. Tried to allocate "
                         rf"{_s('asked')} \((?:GPU|XPU) ?(?P<index>\d+); "
                         rf"{_s('total')} total capacity; "
                         rf"{_s('allocated')} already allocated;"
                         rf"(?: {_s('free')} free;)?"
                         rf"(?: {_s('limit')} allowed;)?"
                         rf"(?: {_s('reserved')} reserved in total by PyTorch"
                         rf"| {_s('cached')} cached)?", None),
    ("cuda-async", r"Allocation on device (?P<index>\d+) would exceed allowed memory\. \(out of memory\)",
     "cuda-async"),
    ("mps", rf"MPS backend out of memory \(MPS allocated: {_s('allocated')}, other "
            rf"allocations: {_s('other_alloc')}"
            rf"(?:, max allowed: {_s('limit')})?\)\. Tried to allocate "
            rf"{_s('asked')}", "mps"),
    ("mps-buffer", rf"Invalid buffer size: {_s('asked')}", "mps"),
    ("cpu", rf"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate "
            rf"{_s('asked')}", "cpu"),
    ("cpu-legacy", rf"not enough memory: you tried to (?:re)?allocate {_s('asked')}\. Buy new RAM!", "cpu"),
    ("cpu-memalign", r"posix_memalign\(&data, gAlignment, nbytes\) == 0\. 12 vs 0", "cpu"),
    ("runtime", r"(?P<backend>CUDA|HIP) (?:error|driver error): out of memory", None),
    ("runtime-legacy", r"cuda runtime error \(2\) ?: ?out of memory"
                       r"|THCudaCheck FAIL .*error=2 : out of memory", "cuda"),
    ("nccl", r"Cuda failure '?out of memory'?", "cuda"),
    ("triton", r"Triton Error \[(?P<backend>CUDA|HIP)\]:\s+(?:Code: \d+, Messsage: )?out of memory", None),
    ("bare", r"(?P<backend>CUDA|HIP|XPU) out of memory|(?P<mps>MPS) backend out of memory", None),
]
_DETAILS = [
    ("in_use", rf"this process has {_SIZE} memory in use"),
    ("limit", rf"{_SIZE} allowed;"),
    ("allocated", rf"Of the allocated memory {_SIZE} is allocated by PyTorch"),
    ("private_pools", rf"with {_SIZE} allocated in private pools"),
    ("cached", rf"and {_SIZE} is reserved by PyTorch but unallocated"),
    ("allocated", rf"Currently allocated\s*: {_SIZE}"),
    ("asked", rf"Requested\s*: {_SIZE}"),
    ("total", rf"Device limit\s*: {_SIZE}"),
    ("free", rf"Free \(according to CUDA\)\s*: {_SIZE}"),
    ("limit", rf"PyTorch limit \(set by user-supplied memory fraction\)\s*: {_SIZE}"),
]
_NO_LIMIT = 2 ** 60


@cache
def _compiled() -> tuple:
    """The wordings, the details, other processes' lines and numpy's size, compiled on the first error."""
    return ([(w, re.compile(p), b) for w, p, b in _FORMS], [(f, re.compile(p)) for f, p in _DETAILS],
            re.compile(rf"Process (\d+) has {_SIZE} memory in use"),
            re.compile(rf"Unable to allocate {_SIZE}"))


def oom_facts(exc: BaseException) -> Optional[OOMFacts]:
    """The :class:`OOMFacts` of ``exc`` when it is an out-of-memory error, else None: a
    ``torch.OutOfMemoryError`` (whatever its text), a ``RuntimeError`` in one of PyTorch's wordings, or
    Python's own ``MemoryError`` (numpy's ``Unable to allocate ...`` included), which is host memory."""
    if not isinstance(exc, (RuntimeError, MemoryError)):
        return None
    forms, details, process, numpy_size = _compiled()
    text = str(exc)
    for wording, pattern, backend in forms:
        found = pattern.search(text)
        if found is not None:
            return _facts(wording, found, backend, text, details, process)
    if isinstance(exc, MemoryError):
        asked = numpy_size.search(text)
        return OOMFacts("python", "cpu", "memoryerror", asked=parse_size(asked.group(1)) if asked else None)
    # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError), whatever its text, without importing torch
    kind = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if isinstance(kind, type) and isinstance(exc, kind):
        return OOMFacts("cuda", "cuda", "outofmemoryerror")
    return None


def _facts(wording: str, found: Any, backend: Optional[str], text: str, details: list,
           process: Any) -> OOMFacts:
    groups = {k: v for k, v in found.groupdict().items() if v is not None}
    name = groups.pop("backend", None) or groups.pop("mps", None)
    backend = name.lower() if name else backend or "cuda"
    device_type = _DEVICE_OF.get(backend, "cuda")
    index = groups.pop("index", None)
    device = f"{device_type}:{index}" if index is not None and device_type != "mps" else device_type
    other_alloc = groups.pop("other_alloc", None)
    values = {key: parse_size(value) for key, value in groups.items()}
    for key, pattern in details:
        if key not in values:
            detail = pattern.search(text)
            if detail is not None:
                values[key] = parse_size(detail.group(1))
    if backend == "mps":
        values["total"] = values.get("limit")
        if other_alloc is not None and "allocated" in values:
            values["in_use"] = values["allocated"] + parse_size(other_alloc)
    allocated, cached, reserved = values.get("allocated"), values.get("cached"), values.get("reserved")
    if allocated is not None and cached is not None and reserved is None:
        values["reserved"] = allocated + cached  # 'allocated by PyTorch' includes the private pools
    elif reserved is not None and allocated is not None and cached is None:
        values["cached"] = max(0, reserved - allocated)
    if (values.get("limit") or 0) >= _NO_LIMIT:  # cudaMallocAsync prints its 'no limit' as 16 EiB
        values.pop("limit")
    others = tuple((int(pid), parse_size(size)) for pid, size in process.findall(text))
    return OOMFacts(backend, device, wording, others=others, **values)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (see :func:`oom_facts`)."""
    return oom_facts(exc) is not None
