"""``%gpuinfo``'s report: torch's view, NVML's view and the environment, matched GPU by GPU.

torch numbers the GPUs it can see (``cuda:0`` ...) after ``CUDA_VISIBLE_DEVICES`` has reordered or hidden
them; NVML numbers every GPU in the machine in PCI order. The two are matched by UUID (or PCI bus id),
never by position (model: nvitop's ``_parse_cuda_visible_devices``). When torch cannot use a GPU the
report says why, naming the actual cause and the fix.

torch is asked through :func:`torch_view`, which touches CUDA only when torch is a CUDA build and
``torch.cuda.is_available()`` is True; tests may hand :func:`build_report` and :func:`gpu_map` a
:class:`TorchView` of their own.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable, Optional

from . import nvml
from .errors import MagicInputError
from .nvml import NA
from .render import Table, fmt_bytes, fmt_value, html_lines, is_na

__all__ = [
    "TorchDevice",
    "TorchView",
    "GPUMapping",
    "GPUEntry",
    "ProcessRow",
    "Diagnosis",
    "GPUReport",
    "torch_view",
    "gpu_map",
    "parse_cuda_visible_devices",
    "build_report",
]

HIDING_VALUES_EXAMPLE = "'' or '-1' or 'NoDevFiles'"


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


def _uuid_text(raw: Any) -> Any:
    """torch's ``props.uuid`` as text; torch prints it without the 'GPU-' prefix NVML uses."""
    if raw is None:
        return NA
    text = str(raw).strip()
    return text if text else NA


def _pci_text(props: Any) -> Any:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return NA
    domain = getattr(props, "pci_domain_id", 0) or 0
    device = getattr(props, "pci_device_id", 0) or 0
    return f"{int(domain):08X}:{int(bus):02X}:{int(device):02X}.0"


def torch_view() -> TorchView:
    """Ask torch what it can use. Never initialises CUDA unless torch is a CUDA build and a GPU is usable."""
    import torch

    view = TorchView(version=str(torch.__version__), cuda=torch.version.cuda,
                     hip=getattr(torch.version, "hip", None))
    if view.cuda or view.hip:
        try:
            version = torch.backends.cudnn.version()
            view.cudnn = NA if version is None else version
        except Exception:  # noqa: BLE001 - a missing cuDNN library is reported as N/A
            view.cudnn = NA
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            view.is_available = bool(torch.cuda.is_available())
        view.warnings = [" ".join(str(w.message).split()) for w in caught]
    if view.is_available:
        view.device_count = torch.cuda.device_count()
        for i in range(view.device_count):
            props = torch.cuda.get_device_properties(i)
            view.devices.append(TorchDevice(
                index=i, name=props.name, capability=f"{props.major}.{props.minor}",
                uuid=_uuid_text(getattr(props, "uuid", None)), pci_bus_id=_pci_text(props),
                total_memory=int(props.total_memory), allocated=torch.cuda.memory_allocated(i),
                reserved=torch.cuda.memory_reserved(i), peak=torch.cuda.max_memory_allocated(i),
            ))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        view.other_accelerators.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        view.other_accelerators.append("xpu")
    return view


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
    text = str(uuid).strip().lower()
    for prefix in ("mig-", "gpu-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def _bus_key(bus_id: Any) -> Optional[tuple]:
    """(domain, bus, device) of a PCI bus id such as '00000000:18:00.0' or '0000:18:00.0'."""
    match = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.\d+)?\s*", str(bus_id))
    if not match:
        return None
    return (int(match.group(1) or "0", 16), int(match.group(2), 16), int(match.group(3), 16))


def _strtoul(text: str) -> int:
    """Leading unsigned integer as CUDA's strtoul reads it ('1gpu' -> 1); -1 when there is none."""
    match = re.match(r"\+?(\d+)", text)
    return int(match.group(1)) if match else -1


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
    index = _strtoul(entry)
    if index < 0 or index >= len(gpus):
        return None
    return (index, None)


def _match_uuid(entry: str, gpus: list) -> Optional[tuple]:
    """A 'GPU-…' / 'MIG-…' / 'MIG-GPU-…/gi/ci' entry, full or abbreviated, matching one device only."""
    text = entry.lower()
    legacy = re.fullmatch(r"mig-gpu-([0-9a-f-]+)/(\d+)/(\d+)", text)
    if legacy:
        parents = [g for g in gpus if not is_na(g.uuid) and _bare(g.uuid).startswith(legacy.group(1))]
        if len(parents) != 1:
            return None
        gi, ci = int(legacy.group(2)), int(legacy.group(3))
        for mig in parents[0].mig_devices:
            if mig.gpu_instance_id == gi and mig.compute_instance_id == ci:
                return (parents[0].index, mig.index)
        return None
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


def _identities() -> list:
    if nvml.status() is not None:
        return []
    return [nvml.gpu_snapshot(i, identity_only=True) for i in range(nvml.device_count())]


def gpu_map(view: Optional[TorchView] = None, gpus: Optional[list] = None) -> list:
    """One :class:`GPUMapping` per GPU torch can see; empty when torch sees no CUDA GPU.

    ``view`` defaults to :func:`torch_view` and ``gpus`` to NVML's identity snapshots.
    """
    view = torch_view() if view is None else view
    if not view.is_available or not view.devices:
        return []
    gpus = _identities() if gpus is None else gpus
    visible = parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus) if gpus else []
    positional = len(visible) == len(view.devices)
    result = []
    for dev in view.devices:
        mapping = _match_device(dev, gpus)
        if mapping is None and positional:
            index, slot = visible[dev.index]
            mig = _mig_at(gpus[index], slot)
            mapping = GPUMapping(dev.index, index, mig.uuid if mig else gpus[index].uuid,
                                 mig.name if mig else gpus[index].name, "CUDA_VISIBLE_DEVICES",
                                 mig.uuid if mig else None)
        if mapping is None:
            mapping = GPUMapping(dev.index, None, dev.uuid, dev.name)
        result.append(mapping)
    return result


def _mig_at(gpu: Any, slot: Optional[int]) -> Any:
    if slot is None:
        return None
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


# ---- the report ---------------------------------------------------------------------------------

@dataclass
class ProcessRow:
    """A process on a GPU; ``is_self`` marks this kernel's own process."""

    pid: int
    name: Any
    used_memory: Any
    kind: str
    is_self: bool = False


@dataclass
class GPUEntry:
    """One GPU: NVML's snapshot (physical GPU) and torch's view of it, when torch can see it."""

    nvml_index: Optional[int]
    torch_index: Optional[int]
    snapshot: Any = None
    torch: Optional[TorchDevice] = None
    mapping: Optional[GPUMapping] = None
    processes: list = field(default_factory=list)
    process_problem: Any = None
    host_pids: bool = False


@dataclass
class Diagnosis:
    """Why torch cannot use a GPU: a ``cause`` code, what is wrong, and how to fix it."""

    cause: str
    message: str
    fix: str


@dataclass
class GPUReport:
    """What ``%gpuinfo`` shows: environment, GPUs, processes, and a diagnosis when torch has no GPU."""

    environment: dict
    torch: TorchView
    gpus: list
    diagnosis: list
    nvml_problem: Any = None
    show_processes: bool = True
    pid: int = 0

    # ---- data ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able data; NA becomes None."""
        return _plain({
            "environment": self.environment,
            "torch": self.torch,
            "gpus": self.gpus,
            "diagnosis": self.diagnosis,
            "nvml_problem": self.nvml_problem,
            "pid": self.pid,
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @property
    def torch_can_use_gpu(self) -> bool:
        return bool(self.torch.is_available and self.torch.devices)

    # ---- text and HTML ---------------------------------------------------------------------------
    def _headline(self) -> str:
        env = self.environment
        torch_part = f"torch {env['torch_version']}"
        torch_part += f" (CUDA {env['torch_cuda']})" if env["torch_cuda"] else " (CPU-only build)"
        count = env["nvml_gpu_count"]
        if self.nvml_problem is not None:
            nvml_part = "NVML unavailable"
        else:
            nvml_part = (f"{count} NVIDIA GPU{'s' if count != 1 else ''}, driver {env['driver_version']} "
                         f"(CUDA {env['cuda_driver_version']})")
        n_torch = len(self.torch.devices)
        if self.torch_can_use_gpu:
            use = f"torch can use {n_torch} GPU{'s' if n_torch != 1 else ''}"
        else:
            use = "torch cannot use a GPU"
        return f"{use} | {torch_part} | {nvml_part}"

    def _diagnosis_lines(self) -> list:
        lines = []
        for d in self.diagnosis:
            lines.append(f"✗ {d.message}" if _can_encode("✗") else f"x {d.message}")
            lines.append(f"  fix: {d.fix}")
        return lines

    def _environment_table(self) -> Table:
        env = self.environment
        table = Table(["item", "value"], title="Environment")
        rows = [
            ("driver", env["driver_version"]),
            ("CUDA (driver supports up to)", env["cuda_driver_version"]),
            ("torch", env["torch_version"]),
            ("torch built with CUDA", env["torch_cuda"] if env["torch_cuda"] else "none (CPU-only build)"),
            ("cuDNN", env["cudnn"]),
            ("CUDA_VISIBLE_DEVICES", _env_text(env["CUDA_VISIBLE_DEVICES"])),
            ("CUDA_DEVICE_ORDER", _env_text(env["CUDA_DEVICE_ORDER"])),
            ("other accelerators", ", ".join(self.torch.other_accelerators) or "none"),
            ("this kernel's PID", self.pid),
        ]
        for key, value in rows:
            table.add(key, fmt_value(value))
        return table

    def _gpu_tables(self) -> tuple:
        ident = Table(["cuda", "nvml", "name", "uuid", "cc", "memory used / total",
                       "torch alloc / reserved / peak"], align="rrlllrr", title="GPUs")
        state = Table(["cuda", "nvml", "util", "temp", "power / limit", "SM / mem clock", "PCIe", "persist",
                       "MIG"], align="rrrrrrlll", title="GPU state")
        degrees = "°C" if _can_encode("°") else "C"
        for g in self.gpus:
            s = g.snapshot
            cuda = "-" if g.torch_index is None else f"cuda:{g.torch_index}"
            nvml_index = "-" if g.nvml_index is None else str(g.nvml_index)
            t = g.torch
            name = g.mapping.name if g.mapping is not None and g.mapping.mig else _pick(s, "name", t, "name")
            uuid = g.mapping.uuid if g.mapping is not None and g.mapping.mig else _pick(s, "uuid", t, "uuid")
            cc = _pick(s, "compute_capability", t, "capability")
            total = _pick(s, "memory_total", t, "total_memory")
            mem = f"{fmt_bytes(_get(s, 'memory_used'))} / {fmt_bytes(total)}"
            torch_mem = "-" if t is None else (
                f"{fmt_bytes(t.allocated)} / {fmt_bytes(t.reserved)} / {fmt_bytes(t.peak)}")
            ident.add(cuda, nvml_index, fmt_value(name), fmt_value(uuid), fmt_value(cc), mem, torch_mem)
            if s is None:
                continue
            util = "N/A" if is_na(s.utilization_gpu) else f"{s.utilization_gpu} %"
            temp = "N/A" if is_na(s.temperature) else f"{s.temperature} {degrees}"
            power = f"{fmt_value(s.power_draw, 'W')} / {fmt_value(s.power_limit, 'W')}"
            clocks = f"{fmt_value(s.clock_sm)} / {fmt_value(s.clock_memory)} MHz"
            pcie = "N/A" if is_na(s.pcie_generation) else f"gen{s.pcie_generation} x{fmt_value(s.pcie_width)}"
            mig = fmt_value(s.mig_mode)
            if s.mig_mode is True:
                mig = f"on ({len(s.mig_devices)} instance{'s' if len(s.mig_devices) != 1 else ''})"
            state.add(cuda, nvml_index, util, temp, power, clocks, pcie, fmt_value(s.persistence_mode), mig)
        return ident, state

    def _process_table(self) -> Table:
        table = Table(["nvml", "pid", "name", "GPU memory", "type", ""], align="rrlrll", title="Processes")
        for g in self.gpus:
            for p in g.processes:
                table.add("-" if g.nvml_index is None else g.nvml_index, p.pid, fmt_value(p.name),
                          fmt_bytes(p.used_memory), p.kind, "<- this kernel" if p.is_self else "")
        return table

    def _notes(self) -> list:
        notes = []
        problem = self.nvml_problem
        if problem is not None and all(d.fix != problem.hint for d in self.diagnosis):
            notes.append(f"NVML: {problem.message}. {problem.hint}")
        for g in self.gpus:
            where = f"GPU {g.nvml_index}" if g.nvml_index is not None else f"cuda:{g.torch_index}"
            s = g.snapshot
            if s is not None:
                for problem in s.problems:
                    notes.append(f"{where}: {problem.message}. {problem.hint}")
                if s.not_supported:
                    notes.append(f"{where}: N/A where this GPU or driver does not report it "
                                 f"({', '.join(s.not_supported)}).")
            if self.show_processes:
                if g.process_problem is not None:
                    notes.append(f"{where}: process list incomplete ({g.process_problem.message}). "
                                 f"{g.process_problem.hint}")
                if g.host_pids:
                    notes.append(f"{where}: the list shows host PIDs (this kernel runs in a container, "
                                 f"PID {self.pid} here), so its own process cannot be marked by PID.")
            if g.mapping is not None and g.mapping.matched_by == "CUDA_VISIBLE_DEVICES":
                notes.append(f"cuda:{g.torch_index} matched to GPU {g.nvml_index} by position in "
                             "CUDA_VISIBLE_DEVICES (torch reported no UUID or PCI bus id).")
        for text in self.torch.warnings:
            notes.append(f"torch warned: {text}")
        return notes

    def to_text(self) -> str:
        parts = [self._headline()]
        if self.diagnosis:
            lines = ["  " + line for line in self._diagnosis_lines()]
            parts.append("\n".join(["Why torch cannot use a GPU:"] + lines))
        if self.gpus:
            ident, state = self._gpu_tables()
            parts.append(ident.to_text())
            if state.rows:
                parts.append(state.to_text())
            if self.show_processes:
                procs = self._process_table()
                if procs.rows:
                    parts.append(procs.to_text())
                else:
                    parts.append("Processes: none listed")
        parts.append(self._environment_table().to_text())
        notes = self._notes()
        if notes:
            parts.append("\n".join(["Notes:"] + ["  " + n for n in notes]))
        return "\n\n".join(parts)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("GPUReport(...)" if cycle else self.to_text())

    def _repr_html_(self) -> str:
        import html

        out = [f'<div class="torchgpu-magic"><p><b>{html.escape(self._headline())}</b></p>']
        if self.diagnosis:
            out.append("<p><b>Why torch cannot use a GPU:</b></p>")
            out.append(html_lines(self._diagnosis_lines()))
        if self.gpus:
            ident, state = self._gpu_tables()
            out.append(ident.to_html())
            if state.rows:
                out.append(state.to_html())
            if self.show_processes:
                procs = self._process_table()
                out.append(procs.to_html() if procs.rows else html_lines(["Processes: none listed"]))
        out.append(self._environment_table().to_html())
        notes = self._notes()
        if notes:
            out.append("<p><b>Notes:</b></p>" + html_lines(notes))
        out.append("</div>")
        return "".join(out)

    def __repr__(self) -> str:
        return self.to_text()


def _env_text(value: Optional[str]) -> str:
    return "(unset)" if value is None else repr(value)


def _can_encode(text: str) -> bool:
    import sys

    try:
        text.encode(getattr(sys.stdout, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _get(obj: Any, name: str) -> Any:
    return NA if obj is None else getattr(obj, name)


def _pick(snap: Any, snap_field: str, dev: Any, dev_field: str) -> Any:
    """NVML's figure, else torch's."""
    value = _get(snap, snap_field)
    return _get(dev, dev_field) if is_na(value) else value


def _plain(obj: Any) -> Any:
    if is_na(obj):
        return None
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# ---- building it --------------------------------------------------------------------------------

def _version_tuple(text: Any) -> Optional[tuple]:
    match = re.match(r"(\d+)\.(\d+)", str(text)) if text and not is_na(text) else None
    return (int(match.group(1)), int(match.group(2))) if match else None


def _hides_all(value: Optional[str], gpus: list) -> bool:
    return value is not None and bool(gpus) and not parse_cuda_visible_devices(value, gpus)


def diagnose(view: TorchView, problem: Any, gpus: list, env: dict) -> list:
    """Every reason torch cannot use a GPU here (empty when it can)."""
    if view.is_available and view.devices:
        return []
    causes = []
    names = sorted({str(g.name) for g in gpus if not is_na(g.name)})
    seen = f"{len(gpus)} NVIDIA GPU{'s' if len(gpus) != 1 else ''} ({', '.join(names)})" if gpus else ""
    if not view.cuda and not view.hip:
        message = f"torch {view.version} is a CPU-only build (torch.version.cuda is None)"
        if gpus:
            message += f"; NVML sees {seen}, which a CUDA build of torch would use"
        fix = ("install a CUDA build of torch that this driver supports "
               f"(CUDA {env['cuda_driver_version']} or older): see https://pytorch.org/get-started/locally/")
        if not gpus:
            fix = "on a machine with an NVIDIA GPU, install a CUDA build of torch (https://pytorch.org/get-started/locally/)"
        causes.append(Diagnosis("cpu_only_build", message, fix))
    if problem is not None and problem.code in ("library_not_found", "driver_not_loaded", "driver_mismatch"):
        what = {
            "library_not_found": "no NVIDIA driver: the NVML library was not found",
            "driver_not_loaded": "no NVIDIA driver loaded: NVML says the kernel driver is not loaded",
            "driver_mismatch": "the NVIDIA driver is half-upgraded: its library and kernel module differ",
        }[problem.code]
        causes.append(Diagnosis("no_driver", what, problem.hint))
    elif problem is None and not gpus:
        causes.append(Diagnosis("no_gpu", "the NVIDIA driver works but finds no GPU",
                                "is a GPU attached to this machine or container? (`nvidia-smi -L`)"))
    visible = env["CUDA_VISIBLE_DEVICES"]
    if _hides_all(visible, gpus):
        causes.append(Diagnosis(
            "hidden_by_cuda_visible_devices",
            f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU ({seen} present)",
            "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (e.g. '0'), then restart the kernel: "
            "CUDA reads it once, when it starts"))
    if view.cuda:
        need, have = _version_tuple(view.cuda), _version_tuple(env["cuda_driver_version"])
        if need and have and have[0] < need[0]:
            causes.append(Diagnosis(
                "driver_too_old",
                f"driver {env['driver_version']} supports CUDA up to {env['cuda_driver_version']}, "
                f"but torch {view.version} was built with CUDA {view.cuda}",
                f"update the NVIDIA driver to one for CUDA {need[0]}.x, or install a torch built for "
                f"CUDA {have[0]}.x"))
    if view.other_accelerators:
        first = view.other_accelerators[0]
        causes.append(Diagnosis(
            "other_accelerator",
            f"torch can use another accelerator here instead: {', '.join(view.other_accelerators)}",
            f"run on it with torch.device({first!r}) (or %%ontorch {first})"))
    if not causes:
        said = f" torch warned: {view.warnings[0]}" if view.warnings else ""
        causes.append(Diagnosis(
            "unknown", f"torch.cuda.is_available() is False although the driver sees {seen}.{said}",
            "run `nvidia-smi` and `python -c 'import torch; torch.cuda.init()'` to see CUDA's own error"))
    return causes


def build_report(index: Optional[int] = None, show_processes: bool = True,
                 view_fn: Callable[[], TorchView] = torch_view) -> GPUReport:
    """Collect the report. ``index`` keeps one GPU: torch's ``cuda:N`` when torch sees GPUs, else NVML's
    index; an index that does not exist raises :class:`MagicInputError` naming the valid ones."""
    view = view_fn()
    problem = nvml.status()
    count = nvml.device_count() if problem is None else 0
    identities = [nvml.gpu_snapshot(i, identity_only=True) for i in range(count)]
    env = {
        "driver_version": nvml.driver_version() if problem is None else NA,
        "cuda_driver_version": nvml.cuda_driver_version() if problem is None else NA,
        "torch_version": view.version,
        "torch_cuda": view.cuda,
        "torch_hip": view.hip,
        "cudnn": view.cudnn,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER"),
        "nvml_gpu_count": count,
    }
    mapping = gpu_map(view, identities)
    entries = _entries(view, mapping, count)
    _select(entries, index, bool(view.is_available and view.devices))
    pid = os.getpid()
    for entry in entries:
        if entry.nvml_index is not None:
            entry.snapshot = nvml.gpu_snapshot(entry.nvml_index)
            if show_processes:
                procs, entry.process_problem = nvml.processes(entry.nvml_index)
                entry.processes = [ProcessRow(p.pid, p.name, p.used_memory, p.kind, p.pid == pid)
                                   for p in procs]
    if show_processes:
        _mark_host_pids(entries, pid)
    return GPUReport(environment=env, torch=view, gpus=entries,
                     diagnosis=diagnose(view, problem, identities, env), nvml_problem=problem,
                     show_processes=show_processes, pid=pid)


def _entries(view: TorchView, mapping: list, count: int) -> list:
    """One entry per NVML GPU (with torch's index where torch sees it), then torch GPUs NVML lacks."""
    by_nvml: dict = {}
    unmatched = []
    for m in mapping:
        if m.nvml_index is None or m.nvml_index in by_nvml:
            unmatched.append(m)
        else:
            by_nvml[m.nvml_index] = m
    devices = {d.index: d for d in view.devices}
    entries = []
    for i in range(count):
        m = by_nvml.get(i)
        entries.append(GPUEntry(nvml_index=i, torch_index=m.torch_index if m else None,
                                torch=devices.get(m.torch_index) if m else None, mapping=m))
    for m in unmatched:
        entries.append(GPUEntry(nvml_index=None, torch_index=m.torch_index, torch=devices.get(m.torch_index),
                                mapping=m))
    entries.sort(key=lambda e: (e.torch_index is None, e.torch_index or 0, e.nvml_index or 0))
    return entries


def _select(entries: list, index: Optional[int], by_torch: bool) -> None:
    if index is None:
        return
    key = "torch_index" if by_torch else "nvml_index"
    valid = sorted(getattr(e, key) for e in entries if getattr(e, key) is not None)
    keep = [e for e in entries if getattr(e, key) == index]
    if not keep:
        kind = "torch GPU index (cuda:N)" if by_torch else "GPU index"
        if not valid:
            raise MagicInputError(f"no {kind} {index}: there is no GPU here")
        raise MagicInputError(f"no {kind} {index}; valid: {', '.join(map(str, valid))}")
    entries[:] = keep


def _mark_host_pids(entries: list, pid: int) -> None:
    """Say 'host PIDs' where NVML lists processes, none is ours, and their PIDs do not exist here."""
    try:
        import psutil
    except ImportError:
        return
    listed = [p for e in entries for p in e.processes]
    if not listed or any(p.is_self for p in listed):
        return
    for entry in entries:
        if entry.processes and not all(psutil.pid_exists(p.pid) for p in entry.processes):
            entry.host_pids = True
