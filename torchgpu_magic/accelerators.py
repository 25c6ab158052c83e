"""The device layer: what any accelerator torch runs on can say, asked without side effects.

Every room asks here, not ``torch.cuda`` / ``torch.mps`` / ``torch.xpu``, for what any accelerator can
say: which one this torch was built for (:func:`current_kind`: ``torch.accelerator.current_accelerator()``,
a compile-time answer that asks no device, creates no context and does not poison fork; ``'cuda'`` is
also AMD's ROCm, torch's cuda API over HIP, :func:`is_rocm`; an out-of-tree PrivateUse1 backend such as
Ascend's ``'npu'`` is its registered name), whether it is initialised (:func:`state`), how many devices
and which is current, synchronize, events and streams, the allocator's figures, and giving its cache
back.

``torch.accelerator`` is asked where torch provides it for the backend at hand (its memory functions
exist from torch 2.9; torch 2.11's MPS allocator is not yet a ``DeviceAllocator``, so they raise "Allocator
for mps is not a DeviceAllocator" there, as for some PrivateUse1 backends); the backend's own module
(``torch.get_device_module(kind)``) answers where the generic API cannot, and for what is specific to it:
MPS's ``current_allocated_memory()`` / ``driver_allocated_memory()`` / ``recommended_max_memory()`` (the
GPU's working-set limit on unified memory), CUDA's and XPU's device properties. Where torch keeps no peak
(MPS before torch's accelerator API reached it) :func:`peak` is None and the caller tracks its own.

Nothing here initialises a device just to look: torch is only asked when it is already imported, and an
allocator only once its backend is initialised (MPS has no lazy initialisation and no per-process context:
a usable MPS counts as initialised). torch is never imported here.
"""
from __future__ import annotations

import contextlib
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .caches import table

_CPU_ONLY = table()  # {torch module: True} for a torch seen to be built without CUDA or ROCm
_NO_OTHER = table()  # {torch module: True} for one seen to have no accelerator besides CUDA / ROCm

NAMES = {"cuda": "CUDA", "rocm": "ROCm", "mps": "MPS", "xpu": "XPU"}
"""How a person names each backend (:func:`backend_label`)."""


# ---- which accelerator ---------------------------------------------------------------------------------
def _torch() -> Any:
    return sys.modules.get("torch")


def current_kind() -> Optional[str]:
    """The device type of the accelerator this torch was built for ('cuda', 'mps', 'xpu', or a PrivateUse1
    name such as 'npu'), None for a CPU-only build or when torch is not imported. Asks no device."""
    torch = _torch()
    if torch is None:
        return None
    try:
        device = torch.accelerator.current_accelerator()
    except Exception:  # noqa: BLE001 - a half-imported or broken torch has no accelerator to offer
        return None
    return None if device is None else str(device.type)


def is_rocm() -> bool:
    """Whether this torch is a ROCm build: its ``cuda`` API runs on AMD GPUs over HIP."""
    torch = _torch()
    return bool(torch is not None and getattr(getattr(torch, "version", None), "hip", None))


def backend_label(kind: Optional[str] = None) -> str:
    """'CUDA', 'ROCm', 'MPS', 'XPU', or a PrivateUse1 name in capitals ('NPU'), for the backend behind
    device type ``kind`` (default this torch's accelerator): 'ROCm' for cuda on a ROCm build."""
    kind = current_kind() if kind is None else kind
    name = "rocm" if kind == "cuda" and is_rocm() else kind or "cpu"
    return NAMES.get(name, name.upper())


def backend_module(kind: str) -> Any:
    """torch's module for ``kind`` (``torch.cuda``, ``torch.mps``, ``torch.xpu``, ``torch.npu``...), None
    when torch is not imported or has none."""
    torch = _torch()
    if torch is None or kind in (None, "cpu", "meta"):
        return None
    module = getattr(torch, kind, None)  # what torch.get_device_module answers, registered backends too
    return module if isinstance(module, types.ModuleType) else None


# ---- initialised or not ----------------------------------------------------------------------------------
def cuda_state() -> str:
    """How much torch can tell about CUDA (or ROCm) without side effects: "not imported", "no CUDA", "not
    initialised" or "initialised". Asked around every cell, so cheap: ``is_initialized`` first, and a
    CPU-only build's answer remembered (``is_available`` there costs tens of microseconds)."""
    torch = _torch()
    if torch is None:
        return "not imported"
    if torch in _CPU_ONLY:
        return "no CUDA"
    try:
        if torch.cuda.is_initialized():
            return "initialised"
        if torch.cuda.is_available():
            return "not initialised"
        if getattr(torch.version, "cuda", None) is None and getattr(torch.version, "hip", None) is None:
            _CPU_ONLY[torch] = True
        return "no CUDA"
    except Exception:  # noqa: BLE001 - a half-imported or broken torch: say so, never raise
        return "no CUDA"


def state(kind: Optional[str] = None) -> str:
    """:func:`cuda_state` for any accelerator (``kind``, default this torch's): "not imported", "no
    accelerator", "not initialised" or "initialised". MPS has no lazy initialisation (and no per-process
    context to create): usable is initialised. A PrivateUse1 module without ``is_initialized`` is treated
    the same way."""
    torch = _torch()
    if torch is None:
        return "not imported"
    kind = current_kind() if kind is None else kind
    if kind is None:
        return "no accelerator"
    if kind == "cuda":
        found = cuda_state()
        return "no accelerator" if found == "no CUDA" else found
    module = backend_module(kind)
    try:
        if kind == "mps":
            return "initialised" if torch.backends.mps.is_available() else "no accelerator"
        checker = getattr(module, "is_initialized", None)
        if checker is not None and checker():
            return "initialised"
        if module is None or not module.is_available():
            return "no accelerator"
        return "not initialised" if checker is not None else "initialised"
    except Exception:  # noqa: BLE001 - a backend that cannot say is not usable
        return "no accelerator"


def started(kind: str) -> bool:
    """Whether the backend of ``kind`` (one with lazy initialisation: cuda, xpu) is initialised in this
    process, asked as cheaply as torch allows: its ``is_initialized()`` alone, never a device count
    (counting asks NVML or Level Zero): what ``%%ontorch`` asks around every cell."""
    checker = getattr(backend_module(kind), "is_initialized", None)
    try:
        return checker is not None and bool(checker())
    except Exception:  # noqa: BLE001 - a backend that cannot say has not started
        return False


def initialised(kind: str) -> Any:
    """The backend module of ``kind`` when it is initialised in this process, else None: the one way into
    an allocator here and in the sampler, so neither initialises."""
    return backend_module(kind) if state(kind) == "initialised" else None


def initialised_cuda() -> Any:
    """``torch.cuda`` when torch is imported and CUDA (or ROCm) initialised in this process, else None."""
    return sys.modules["torch"].cuda if cuda_state() == "initialised" else None


def initialised_kinds() -> list:
    """The accelerators initialised in this process: this torch's, and mps / xpu where usable besides.
    Asked around every cell, so a torch seen to have no accelerator but CUDA (none of MPS, XPU or a
    PrivateUse1 backend, which a process never gains) is asked about CUDA alone (:func:`other_kinds`
    remembers it)."""
    kinds = ["cuda"] if cuda_state() == "initialised" else []
    return kinds + [kind for kind in other_kinds() if state(kind) == "initialised"]


def initialised_devices() -> list:
    """``(kind, index)`` of every device of the accelerators initialised in this process (one not
    initialised is not asked: asking would initialise it); a backend that cannot count its devices (a lost
    GPU) adds none. The devices a cell's figures and the memory reports go through."""
    found: list = []
    for kind in initialised_kinds():
        with contextlib.suppress(Exception):
            found.extend((kind, index) for index in range(device_count(kind)))
    return found


def device_label(kind: str, index: int) -> str:
    """How a report names torch's device ``kind:index``: 'cuda:0', 'xpu:1'; 'mps' for a Mac's one GPU."""
    return kind if kind == "mps" else f"{kind}:{index}"


def _known_kinds() -> list:
    known = ["cuda", "xpu", "mps"]
    kind = current_kind()
    return known + [kind] if kind not in (None, *known) else known


# ---- devices -----------------------------------------------------------------------------------------
def device_count(kind: Optional[str] = None) -> int:
    """How many devices of ``kind`` (default this torch's accelerator) torch sees; 0 where none is usable.
    Never initialises (CUDA and XPU count through NVML / Level Zero before initialisation)."""
    kind = current_kind() if kind is None else kind
    module = backend_module(kind)  # None without torch, and for cpu and meta
    if module is None:
        return 0
    try:
        return int(_torch().backends.mps.is_available() if kind == "mps" else module.device_count())
    except Exception:  # noqa: BLE001 - a backend that cannot count has no device to offer
        return 0


def available_kinds() -> list:
    """The accelerator types with a usable device here, in the order ``auto`` prefers them."""
    return [kind for kind in _known_kinds() if device_count(kind)]


def other_kinds() -> list:
    """:func:`available_kinds` but CUDA (and ROCm): MPS, XPU, a PrivateUse1 backend. A torch seen to have
    none of them is remembered: every cell asks (:func:`initialised_kinds`), and every ``%gpuinfo`` (on
    every engine for ``--cluster``), where asking each backend was over half of torch's part of the
    report (measured on an engine between calls: 38 of 58 us)."""
    torch = _torch()
    if torch is None or torch in _NO_OTHER:
        return []
    found = [kind for kind in _known_kinds() if kind != "cuda" and device_count(kind)]
    if not found and current_kind() in (None, "cuda"):
        _NO_OTHER[torch] = True
    return found


def current_index(kind: Optional[str] = None) -> int:
    """The current device of ``kind`` (default this torch's accelerator); 0 before it is initialised
    (asking would initialise it)."""
    kind = current_kind() if kind is None else kind
    module = initialised(kind) if kind not in (None, "mps") else None
    return 0 if module is None else int(module.current_device())


def hip_visible(found: int) -> list:
    """AMD SMI's indices of the GPUs HIP enumerates, in HIP's order: ROCR_VISIBLE_DEVICES, then
    HIP_VISIBLE_DEVICES (or CUDA_VISIBLE_DEVICES, which HIP also reads) select by index; UUIDs and other
    forms cannot be matched by position, and give none."""
    order = list(range(found))
    hip = os.environ.get("HIP_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    for value in (os.environ.get("ROCR_VISIBLE_DEVICES"), hip):
        if value is None:
            continue
        picked = []
        for entry in value.split(","):
            entry = entry.strip()
            if not entry.isdigit() or int(entry) >= len(order):
                break
            picked.append(order[int(entry)])
        order = picked
    return order


def split(device: Any) -> tuple:
    """(type, index) of a ``torch.device``, a string ('cuda:1', 'mps') or a pair; an index left out is
    the current device of that type (0 before it is initialised)."""
    if isinstance(device, tuple):
        kind, index = device
    elif isinstance(device, str):
        kind, _, text = device.partition(":")
        index = int(text) if text else None
    else:
        kind, index = device.type, device.index
    return kind, current_index(kind) if index is None else int(index)


def synchronize(device: Any) -> None:
    """Wait for the work queued on ``device`` (no-op on cpu and meta): ``torch.accelerator.synchronize``
    for this torch's accelerator, the backend's own ``synchronize`` for another."""
    kind, index = split(device)
    if kind not in ("cpu", "meta"):
        synchronizer(kind)(index)


def synchronizer(kind: str) -> Callable[[int], None]:
    """:func:`synchronize` for ``kind`` as a function of the device index, looked up now: a clock keeps it,
    so that its own waits stay out of a count of the cell's that wraps torch's public functions later."""
    torch = _torch()
    generic = getattr(getattr(torch, "accelerator", None), "synchronize", None)
    if generic is not None and kind == current_kind():
        return generic
    if kind == "mps":
        wait = torch.mps.synchronize
        return lambda index: wait()
    return backend_module(kind).synchronize


def timing_event(kind: str) -> Any:
    """An event created with ``enable_timing=True`` on ``kind`` (``torch.cuda.Event``, ``torch.xpu.Event``,
    ``torch.mps.Event``, a PrivateUse1 module's ``Event``); None where events cannot time there (no event
    class, or one that refuses timing): the caller falls back to synchronized wall time."""
    cls = getattr(backend_module(kind), "Event", None)
    if cls is None:
        return None
    try:
        return cls(enable_timing=True)
    except Exception:  # noqa: BLE001 - e.g. a backend without timing events
        return None


def current_stream(device: Any) -> Any:
    """The current stream of ``device`` to record events on; None for MPS, which has one stream that its
    events always record on."""
    kind, index = split(device)
    getter = getattr(backend_module(kind), "current_stream", None) if kind != "mps" else None
    return getter(index) if getter is not None else None


# ---- the allocator -------------------------------------------------------------------------------------
_GENERIC_FAILS = (RuntimeError, AttributeError, NotImplementedError, TypeError, ValueError)
# "Allocator for mps is not a DeviceAllocator" (a RuntimeError from torch's internal assert), or a torch
# too old for the name: then the backend's own module answers


def _ask(kind: str, index: int, generic: str, specific: Optional[str] = None) -> Any:
    """``torch.accelerator.<generic>(index)`` for this torch's accelerator; where torch has no such function
    or it cannot answer for this backend, the backend module's ``<specific or generic>(index)``; None when
    neither exists."""
    if kind == current_kind():
        function = getattr(getattr(_torch(), "accelerator", None), generic, None)
        if function is not None:
            try:
                return function(index)
            except _GENERIC_FAILS:
                pass
    function = getattr(backend_module(kind), specific or generic, None)
    if function is None:
        return None
    return function() if kind == "mps" else function(index)


def _figure(device: Any, generic: str, on_mps: Optional[str] = None) -> Optional[int]:
    """An allocator figure of ``device`` in bytes (:func:`_ask`; ``on_mps``: ``torch.mps``'s own name for
    it): 0 before the backend is initialised, None where torch cannot say."""
    kind, index = split(device)
    if initialised(kind) is None:
        return 0
    value = _ask(kind, index, generic, on_mps if kind == "mps" else None)
    return None if value is None else int(value)


def allocated(device: Any) -> Optional[int]:
    """Bytes of live tensors on ``device`` (torch's allocator); 0 before the backend is initialised."""
    return _figure(device, "memory_allocated", "current_allocated_memory")


def reserved(device: Any) -> Optional[int]:
    """Bytes torch's allocator holds on ``device`` (tensors and its cache). MPS: the Metal driver's
    allocation for this process (``driver_allocated_memory``), which holds the cache too."""
    return _figure(device, "memory_reserved", "driver_allocated_memory")


def peak(device: Any) -> Optional[int]:
    """The most bytes of live tensors since the last :func:`reset_peak`; None where torch keeps no peak
    (MPS on a torch whose accelerator API does not reach it): the caller tracks its own."""
    return _figure(device, "max_memory_allocated")  # torch.mps has none of its own


def reset_peak(device: Any) -> bool:
    """Start torch's peak counter for ``device`` again; False where torch keeps none (see :func:`peak`),
    or the backend is not initialised."""
    kind, index = split(device)
    if initialised(kind) is None or _ask(kind, index, "max_memory_allocated") is None:
        return False
    _ask(kind, index, "reset_peak_memory_stats")
    return True


def memory_info(device: Any) -> Optional[tuple]:
    """(free, total) bytes of ``device`` as its driver sees them (all processes), None before the backend
    is initialised (asking CUDA creates a context) or where torch cannot say. MPS: against the working-set
    limit, free being what the Metal driver has not allocated to this process."""
    kind, index = split(device)
    if initialised(kind) is None:
        return None
    if kind == "mps":
        limit, driver = working_set_limit(), reserved(device)
        return None if limit is None or driver is None else (max(0, limit - driver), limit)
    try:
        value = _ask(kind, index, "get_memory_info", "mem_get_info")
    except _GENERIC_FAILS:
        return None
    return None if value is None else (int(value[0]), int(value[1]))


def working_set_limit() -> Optional[int]:
    """MPS's limit on this process's GPU memory, ``recommended_max_memory()`` (Metal's
    ``recommendedMaxWorkingSetSize``: on unified memory, the share of RAM the GPU may use); None off MPS."""
    function = getattr(backend_module("mps"), "recommended_max_memory", None)
    if function is None or state("mps") != "initialised":
        return None
    return int(function())


def torch_figures(torch_index: int, kind: str = "cuda") -> tuple:
    """(allocated, reserved, peak) of torch's allocator on ``kind:torch_index``; zeros when the backend is
    not initialised (torch then holds nothing), Nones when torch cannot answer (peak alone is None where
    torch keeps none)."""
    if initialised(kind) is None:
        return 0, 0, 0
    device = (kind, torch_index)
    try:
        return allocated(device), reserved(device), peak(device)
    except Exception:  # noqa: BLE001 - e.g. the GPU fell off the bus: the panel shows N/A
        return None, None, None


def empty_cache(kind: Optional[str] = None) -> bool:
    """Give torch's cached memory on ``kind`` (default: every initialised accelerator) back to the driver;
    False (and nothing done) when none is initialised."""
    kinds = initialised_kinds() if kind is None else [kind] if initialised(kind) is not None else []
    generic = getattr(getattr(_torch(), "accelerator", None), "empty_cache", None)
    for each in kinds:
        try:
            if generic is None or each != current_kind():
                raise AttributeError(each)
            generic()
        except _GENERIC_FAILS:
            backend_module(each).empty_cache()
    return bool(kinds)


# ---- what a device is ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceFacts:
    """What torch says a device is. ``memory`` is its capacity for torch (MPS: the working-set limit);
    ``units`` its compute units (SMs, CUs, Xe cores, GPU cores); ``cache`` the last-level cache in bytes."""

    kind: str
    index: int
    name: str
    memory: Optional[int] = None
    units: Optional[int] = None
    cache: Optional[int] = None
    arch: Optional[str] = None


def facts(device: Any) -> DeviceFacts:
    """What ``device`` is, as torch says it; initialises the backend (CUDA and XPU read the driver's device
    table), so callers ask only for a device in use or about to be."""
    kind, index = split(device)
    if kind == "mps":
        mps = _torch().backends.mps
        name = getattr(mps, "get_name", None)
        cores = getattr(mps, "get_core_count", None)
        return DeviceFacts(kind, 0, str(name()) if name else "Apple GPU (MPS)", working_set_limit(),
                           int(cores()) if cores else None)
    props = backend_module(kind).get_device_properties(index)
    arch = getattr(props, "gcnArchName", None) or (
        f"sm_{props.major}{props.minor}" if hasattr(props, "major") else None)
    units = getattr(props, "multi_processor_count", None) or getattr(props, "gpu_subslice_count", None) \
        or getattr(props, "max_compute_units", None)
    cache = getattr(props, "L2_cache_size", None) or getattr(props, "last_level_cache_size", None)
    return DeviceFacts(kind, index, str(props.name), int(props.total_memory), units and int(units),
                       cache and int(cache), arch and str(arch).split(":")[0])


def device_name(device: Any) -> str:
    """A person's name for an accelerator: 'NVIDIA H100 80GB HBM3', 'AMD Instinct MI300X', 'Apple M2 Max'."""
    try:
        return facts(device).name
    except Exception:  # noqa: BLE001 - a device torch cannot describe is named by its type
        return str(device)
