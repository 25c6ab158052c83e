"""Which physical GPU is torch's ``cuda:N``: torch's view of its GPUs, matched to NVML's by UUID.

torch numbers the GPUs it can see (``cuda:0`` ...) after ``CUDA_VISIBLE_DEVICES`` has reordered or hidden
them, and may see a MIG instance instead of a whole GPU; NVML numbers every GPU in the machine in PCI
order. The two are matched by UUID (or PCI bus id), never by position (model: nvitop's
``_parse_cuda_visible_devices``); :func:`parse_cuda_visible_devices` reads the variable as CUDA does, for
the cases torch says neither and for the GPUs torch will see before CUDA is initialised.

torch is asked through :func:`torch_view`, which never initialises CUDA where NVML can name torch's GPUs
(:func:`named_by_nvml`): ``torch.cuda.get_device_properties`` would, and a CUDA context costs hundreds of
MiB on the GPU; tests may hand :func:`gpu_map` a :class:`TorchView` of their own.
Used by %gpuinfo's report (:mod:`torchgpu_magic.gpus.inventory`) and by %gpumem to pick the GPUs to watch.
"""
from __future__ import annotations

import contextlib
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import accelerators
from ..render import is_na
from . import nvml
from .nvml import NA

__all__ = [
    "TorchDevice",
    "TorchView",
    "GPUMapping",
    "torch_view",
    "gpu_map",
    "parse_cuda_visible_devices",
]


# ---- torch's view -------------------------------------------------------------------------------

@dataclass
class TorchDevice:
    """One GPU as torch sees it, with this process's allocator figures (bytes)."""

    index: int
    name: Any = NA
    capability: Any = NA
    uuid: Any = NA
    pci_bus_id: Any = NA
    total_memory: Any = NA
    allocated: Any = NA
    reserved: Any = NA
    peak: Any = NA


@dataclass
class TorchView:
    """What torch says about CUDA (and other accelerators) in this process."""

    version: str
    cuda: Optional[str] = None
    hip: Optional[str] = None
    cudnn: Any = NA
    is_available: bool = False
    device_count: int = 0
    devices: list = field(default_factory=list)
    other_accelerators: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    named_by_nvml: bool = False  # CUDA not initialised: the devices were named from NVML, not asked of torch


def _pci_text(props: Any) -> Any:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return NA
    domain = getattr(props, "pci_domain_id", 0) or 0
    device = getattr(props, "pci_device_id", 0) or 0
    return f"{int(domain):08X}:{int(bus):02X}:{int(device):02X}.0"


def torch_view(gpus: Optional[list] = None) -> TorchView:
    """Ask torch what it can use. Never initialises CUDA where NVML can name torch's GPUs
    (:func:`named_by_nvml`; ``gpus``: NVML's identities when the caller has read them already), else only
    when torch is a CUDA build and a GPU is usable; never raises for what torch cannot answer (those are
    ``warnings``, shown as notes)."""
    import torch

    view = TorchView(version=str(torch.__version__), cuda=torch.version.cuda,
                     hip=getattr(torch.version, "hip", None))
    if view.cuda or view.hip:
        with contextlib.suppress(Exception):  # a missing cuDNN library leaves it N/A
            version = torch.backends.cudnn.version()
            view.cudnn = NA if version is None else version
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            view.is_available = bool(torch.cuda.is_available())
        view.warnings = [" ".join(str(w.message).split()) for w in caught]
    if view.is_available:
        try:
            view.device_count = torch.cuda.device_count()
        except Exception as exc:  # noqa: BLE001 - every problem is a note in the report, never a traceback
            view.warnings.append(f"torch.cuda.device_count() failed: {_one_line(exc)}")
        named = None if torch.cuda.is_initialized() else named_by_nvml(view.device_count, gpus)
        view.named_by_nvml = named is not None
        view.devices = named if named is not None else [
            _torch_device(torch, i, view.warnings) for i in range(view.device_count)]
    view.other_accelerators = accelerators.other_kinds()
    return view


def named_by_nvml(count: int, gpus: Optional[list] = None) -> Optional[list]:
    """torch's ``count`` GPUs as NVML names them, without initialising CUDA: the GPUs CUDA_VISIBLE_DEVICES
    lets CUDA see, in its order, with torch's allocator at zero (it holds nothing before CUDA is
    initialised). None where NVML cannot say which GPU is which: NVML unavailable, a count that does not
    match, or GPUs of different kinds under CUDA's default FASTEST_FIRST order (which may put any of them
    first; identical GPUs keep PCI order, as does CUDA_DEVICE_ORDER=PCI_BUS_ID). The UUID is left to the
    matching (:func:`gpu_map` pairs them by this position). ``gpus``: :func:`identities`, read when not
    given."""
    gpus = identities() if gpus is None else gpus
    visible = parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    if not count or len(visible) != count:
        return None
    chosen = [(gpus[index], _mig_at(gpus[index], slot)) for index, slot in visible]
    if os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID" and \
            len({(gpu.name, gpu.compute_capability) for gpu, _ in chosen}) > 1:
        return None
    return [TorchDevice(position, name=(mig or gpu).name, capability=gpu.compute_capability,
                        total_memory=nvml.memory(gpu.index, mig.uuid if mig else None)[1],
                        allocated=0, reserved=0, peak=0)
            for position, (gpu, mig) in enumerate(chosen)]


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _torch_device(torch: Any, index: int, notes: list) -> TorchDevice:
    """``cuda:index`` as torch sees it; what torch cannot say (e.g. in a child forked after CUDA was
    initialised, or with the GPU gone) is NA, with a note in ``notes``."""
    dev = TorchDevice(index=index)
    try:
        props = torch.cuda.get_device_properties(index)
        dev.name, dev.capability = props.name, f"{props.major}.{props.minor}"
        uuid = getattr(props, "uuid", None)  # torch prints it without the 'GPU-' prefix NVML uses
        dev.uuid = NA if uuid is None else (str(uuid).strip() or NA)
        dev.pci_bus_id = _pci_text(props)
        dev.total_memory = int(props.total_memory)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"cuda:{index}: torch.cuda.get_device_properties failed: {_one_line(exc)}")
    try:  # asked of torch.cuda itself: this view is of CUDA's devices, and runs where CUDA is initialised
        dev.allocated = torch.cuda.memory_allocated(index)
        dev.reserved = torch.cuda.memory_reserved(index)
        dev.peak = torch.cuda.max_memory_allocated(index)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"cuda:{index}: torch's allocator figures failed: {_one_line(exc)}")
    return dev


# ---- matching torch's GPUs to NVML's ------------------------------------------------------------

@dataclass
class GPUMapping:
    """torch's ``cuda:<torch_index>`` is NVML's GPU ``nvml_index`` (None when it could not be matched).

    ``matched_by`` says how: 'uuid', 'pci_bus_id' or 'CUDA_VISIBLE_DEVICES' (position in the parsed
    list, used only when torch reports neither UUID nor bus id).
    """

    torch_index: int
    nvml_index: Optional[int]
    uuid: Any
    name: Any
    matched_by: Optional[str] = None
    mig: Any = None


_HEX_UUID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def _bare(uuid: Any) -> str:
    """A UUID without its 'GPU-' / 'MIG-' prefix, lower case, for comparing torch's and NVML's."""
    return str(uuid).strip().lower().removeprefix("mig-").removeprefix("gpu-")


def _bus_key(bus_id: Any) -> Optional[tuple]:
    """(domain, bus, device) of a PCI bus id such as '00000000:18:00.0' or '0000:18:00.0'."""
    match = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.\d+)?\s*", str(bus_id))
    if not match:
        return None
    return (int(match.group(1) or "0", 16), int(match.group(2), 16), int(match.group(3), 16))


def parse_cuda_visible_devices(value: Optional[str], gpus: list) -> list:
    """Which NVML GPUs CUDA will enumerate for ``CUDA_VISIBLE_DEVICES=value``, in CUDA's order.

    ``gpus`` are identity snapshots (:func:`nvml.gpu_snapshot` with ``identity_only=True``) in NVML
    order. Returns ``(nvml_index, mig_slot or None)`` pairs. Follows CUDA's rules: indices are read
    like strtoul; a negative, unknown or out-of-range entry ends the list; a repeated entry empties it;
    UUIDs ('GPU-…', 'MIG-…', also abbreviated) cannot be mixed with indices; and a process enumerates
    at most one MIG instance (the first listed, or the first instance of the first GPU in MIG mode).
    """
    if value is None:
        picked = [(g.index, None) for g in gpus]
    else:
        picked = []
        entries = [e.strip() for e in value.split(",")]
        by_uuid = entries[0].upper().startswith(("GPU-", "MIG-")) if entries else False
        for entry in entries:
            target = _match_uuid(entry, gpus) if by_uuid else _match_index(entry, gpus)
            if target is None:
                break
            if target in picked:
                return []
            picked.append(target)
    migs = [p for p in picked if p[1] is not None]
    if migs:
        return migs[:1]
    result = []
    for index, _ in picked:
        gpu = gpus[index]
        if gpu.mig_mode is True:
            if gpu.mig_devices:
                return [(index, gpu.mig_devices[0].index)]
            continue
        result.append((index, None))
    return result


def _match_index(entry: str, gpus: list) -> Optional[tuple]:
    """An index read as CUDA's strtoul reads it ('1gpu' -> 1); None when there is none or no such GPU."""
    match = re.match(r"\+?(\d+)", entry)
    if not match or int(match.group(1)) >= len(gpus):
        return None
    return (int(match.group(1)), None)


def _match_uuid(entry: str, gpus: list) -> Optional[tuple]:
    """A 'GPU-…' / 'MIG-…' / 'MIG-GPU-…/gi/ci' entry, full or abbreviated, matching one device only."""
    text = entry.lower()
    legacy = re.fullmatch(r"mig-gpu-([0-9a-f-]+)/(\d+)/(\d+)", text)
    if legacy:
        parents = [g for g in gpus if not is_na(g.uuid) and _bare(g.uuid).startswith(legacy.group(1))]
        if len(parents) != 1:
            return None
        ids = (int(legacy.group(2)), int(legacy.group(3)))  # its GPU instance and compute instance
        return next(((parents[0].index, mig.index) for mig in parents[0].mig_devices
                     if (mig.gpu_instance_id, mig.compute_instance_id) == ids), None)
    if not re.fullmatch(r"(gpu|mig)-[0-9a-f-]+", text):
        return None
    prefix = _bare(text)
    found = []
    for gpu in gpus:
        if text.startswith("gpu-") and not is_na(gpu.uuid) and _bare(gpu.uuid).startswith(prefix):
            found.append((gpu.index, None))
        if text.startswith("mig-"):
            found += [(gpu.index, m.index) for m in gpu.mig_devices
                      if not is_na(m.uuid) and _bare(m.uuid).startswith(prefix)]
    return found[0] if len(found) == 1 else None


def identities() -> list:
    """NVML's identity snapshots of every GPU (:func:`nvml.gpu_snapshot` with ``identity_only``), in NVML's
    order; empty without NVML."""
    return [nvml.gpu_snapshot(i, identity_only=True) for i in range(nvml.device_count())]


def gpu_map(view: Optional[TorchView] = None, gpus: Optional[list] = None) -> list:
    """One :class:`GPUMapping` per GPU torch can see; empty when torch sees no CUDA GPU.

    ``view`` defaults to :func:`torch_view` and ``gpus`` to NVML's identity snapshots (read once: the
    view is asked with them, to name torch's GPUs before CUDA is initialised).
    """
    if view is None:
        gpus = identities() if gpus is None else gpus
        view = torch_view(gpus)
    if not view.is_available or not view.devices:
        return []
    gpus = identities() if gpus is None else gpus
    visible = parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    positional = len(visible) == len(view.devices)
    result = []
    for dev in view.devices:
        mapping = _match_device(dev, gpus)
        if mapping is None and positional:
            index, slot = visible[dev.index]
            mig = _mig_at(gpus[index], slot)
            named = mig or gpus[index]  # the MIG instance torch sees, else the whole GPU
            mapping = GPUMapping(dev.index, index, named.uuid, named.name, "CUDA_VISIBLE_DEVICES",
                                 mig.uuid if mig else None)
        if mapping is None:
            mapping = GPUMapping(dev.index, None, dev.uuid, dev.name)
        result.append(mapping)
    return result


def nvml_target(index: int) -> Optional[tuple]:
    """(NVML index, MIG uuid or None) of torch's ``cuda:index``; None where NVML cannot say."""
    if nvml.status() is not None:
        return None
    mapping = next((m for m in gpu_map() if m.torch_index == index and m.nvml_index is not None), None)
    return None if mapping is None else (mapping.nvml_index, None if is_na(mapping.mig) else mapping.mig)


def _mig_at(gpu: Any, slot: Optional[int]) -> Any:
    return next((m for m in gpu.mig_devices if m.index == slot), None)


def _match_device(dev: TorchDevice, gpus: list) -> Optional[GPUMapping]:
    if not is_na(dev.uuid) and _HEX_UUID.search(_bare(dev.uuid)):
        want = _bare(dev.uuid)
        for gpu in gpus:
            if not is_na(gpu.uuid) and _bare(gpu.uuid) == want:
                return GPUMapping(dev.index, gpu.index, gpu.uuid, gpu.name, "uuid")
            for mig in gpu.mig_devices:
                if not is_na(mig.uuid) and _bare(mig.uuid) == want:
                    return GPUMapping(dev.index, gpu.index, mig.uuid, mig.name, "uuid", mig.uuid)
    key = _bus_key(dev.pci_bus_id) if not is_na(dev.pci_bus_id) else None
    if key is not None:
        for gpu in gpus:
            if not is_na(gpu.pci_bus_id) and _bus_key(gpu.pci_bus_id) == key:
                return GPUMapping(dev.index, gpu.index, gpu.uuid, gpu.name, "pci_bus_id")
    return None
