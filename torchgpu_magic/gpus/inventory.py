"""``%gpuinfo``'s report: torch's view, NVML's view and the environment, matched GPU by GPU.

Each GPU NVML sees is one entry, with torch's ``cuda:N`` beside it where torch sees it: the matching by
UUID (or PCI bus id) under ``CUDA_VISIBLE_DEVICES`` is :mod:`torchgpu_magic.gpus.gpumap`'s. When torch
cannot use a GPU the report says why, naming the actual cause and the fix.

tests may hand :func:`build_report` a ``view_fn`` returning a :class:`~torchgpu_magic.gpus.gpumap.TorchView`
of their own, as torch would describe a GPU machine.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Optional

from ..caches import table
from ..errors import MagicInputError
from ..render import Lines, Report, Reportable, Table, can_print, fmt_bytes, fmt_value, is_na
from . import gpumap, hosting, machine, nvml
from .causes import diagnose
from .gpumap import GPUMapping, TorchDevice, TorchView, gpu_map, torch_view
from .hosting import Place
from .machine import Machine
from .nvml import NA
from .processes import foreign_pids
from .snapshots import HINTS

# ---- the report ---------------------------------------------------------------------------------

@dataclass
class ProcessRow:
    """A process on a GPU; ``is_self`` marks this process."""

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


class GPUInfoLayout:
    """What ``%gpuinfo``'s two reports (this NVIDIA one, :mod:`.accelerated`'s for other GPUs) share: their
    data as JSON, and one layout: the headline, why torch cannot use a GPU (the ``diagnosis``), the report's
    own tables, its notes."""

    def to_dict(self) -> dict:
        """Plain JSON-able data; NA becomes None."""
        return _plain(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def _diagnosis_lines(self) -> list:
        cross = "✗" if can_print("✗") else "x"
        return [line for d in self.diagnosis for line in (f"{cross} {d.message}", f"  fix: {d.fix}")]

    def _layout(self, tables: list, notes: list) -> Report:
        """The report of ``tables`` and ``notes`` below the headline and the diagnosis."""
        parts: list = []
        if self.diagnosis:
            parts.append(Report([Lines(self._diagnosis_lines())], title="Why torch cannot use a GPU:",
                                indent="  "))
        parts += tables
        if notes:
            parts.append(Report([Lines(notes)], title="Notes:", indent="  "))
        return Report(parts, title=self._headline(), gap=True)


@dataclass(repr=False)
class GPUReport(GPUInfoLayout, Reportable):
    """What ``%gpuinfo`` shows: environment, GPUs, processes, and a diagnosis when torch has no GPU."""

    environment: dict
    torch: TorchView
    gpus: list
    diagnosis: list
    nvml_problem: Any = None
    show_processes: bool = True
    pid: int = 0
    machine: Optional[Machine] = None
    place: Optional[Place] = None

    # ---- data ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able data (every field but ``show_processes``); NA becomes None."""
        data = super().to_dict()
        del data["show_processes"]
        return data

    @property
    def torch_can_use_gpu(self) -> bool:
        return bool(self.torch.is_available and self.torch.devices)

    # ---- text and HTML ---------------------------------------------------------------------------
    def _headline(self) -> str:
        env = self.environment
        torch_part = f"torch {env['torch_version']}"
        torch_part += f" (CUDA {env['torch_cuda']})" if env["torch_cuda"] else " (CPU-only build)"
        count = env["nvml_gpu_count"]
        if any(d.cause == "no_nvidia_gpu" for d in self.diagnosis):
            nvml_part = "no NVIDIA GPU"
        elif self.nvml_problem is not None:
            nvml_part = "NVML unavailable"
        else:
            nvml_part = (f"{count} NVIDIA GPU{'s' if count != 1 else ''}, driver {env['driver_version']} "
                         f"(CUDA {env['cuda_driver_version']})")
        n_torch = len(self.torch.devices)
        use = (f"torch can use {n_torch} GPU{'s' if n_torch != 1 else ''}" if self.torch_can_use_gpu
               else "torch cannot use a GPU")
        return f"{use} | {torch_part} | {nvml_part}"

    def _environment_table(self) -> Table:
        env = self.environment
        table = Table(["item", "value"], title="Environment")
        rows = [
            ("driver", env["driver_version"]),
            ("CUDA (driver supports up to)", env["cuda_driver_version"]),
            ("torch", env["torch_version"]),
            ("torch built with CUDA", env["torch_cuda"] if env["torch_cuda"] else "none (CPU-only build)"),
            ("cuDNN", env["cudnn"]),
            ("CUDA_VISIBLE_DEVICES", env_text(env["CUDA_VISIBLE_DEVICES"])),
            ("CUDA_DEVICE_ORDER", env_text(env["CUDA_DEVICE_ORDER"])),
            ("other accelerators", ", ".join(self.torch.other_accelerators) or "none"),
        ]
        if self.machine is not None:
            rows += _machine_rows(self.machine)
        if self.place is not None:
            rows.append(("runs in", self.place.describe()))
        rows.append(("this process's PID", self.pid))
        for key, value in rows:
            table.add(key, fmt_value(value))
        return table

    def _gpu_tables(self) -> tuple:
        ident = Table(["cuda", "nvml", "name", "uuid", "cc", "memory used / total",
                       "torch alloc / reserved / peak"], align="rrlllrr", title="GPUs")
        state = Table(["cuda", "nvml", "util", "temp", "power / limit", "SM / mem clock", "PCIe", "persist",
                       "MIG"], align="rrrrrrlll", title="GPU state")
        degrees = "°C" if can_print("°") else "C"
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
            power = f"{fmt_value(s.power_draw, 'W')} / {fmt_value(s.power_limit, 'W')}"
            clocks = f"{fmt_value(s.clock_sm)} / {fmt_value(s.clock_memory)} MHz"
            pcie = "N/A" if is_na(s.pcie_generation) else f"gen{s.pcie_generation} x{fmt_value(s.pcie_width)}"
            mig = (f"on ({len(s.mig_devices)} instance{'s' if len(s.mig_devices) != 1 else ''})"
                   if s.mig_mode is True else fmt_value(s.mig_mode))
            state.add(cuda, nvml_index, fmt_value(s.utilization_gpu, "%"), fmt_value(s.temperature, degrees),
                      power, clocks, pcie, fmt_value(s.persistence_mode), mig)
        return ident, state

    def _process_table(self) -> Table:
        table = Table(["nvml", "pid", "name", "GPU memory", "type", ""], align="rrlrll", title="Processes")
        for g in self.gpus:
            for p in g.processes:
                table.add("-" if g.nvml_index is None else g.nvml_index, p.pid, fmt_value(p.name),
                          fmt_bytes(p.used_memory), p.kind, "<- this process" if p.is_self else "")
        return table

    def _notes(self) -> list:
        notes = []
        problem = self.nvml_problem
        if problem is not None and not any(d.explains_nvml or d.fix == problem.hint for d in self.diagnosis):
            notes.append(f"NVML: {problem.message}. {self._hint(problem)}")
        for g in self.gpus:
            where = f"GPU {g.nvml_index}" if g.nvml_index is not None else f"cuda:{g.torch_index}"
            s = g.snapshot
            if s is not None:
                for problem in s.problems:
                    notes.append(f"{where}: {problem.message}. {self._hint(problem)}")
                if s.not_supported:
                    notes.append(f"{where}: N/A where this GPU or driver does not report it "
                                 f"({', '.join(s.not_supported)}).")
            if self.show_processes:
                if g.process_problem is not None:
                    notes.append(f"{where}: process list incomplete ({g.process_problem.message}). "
                                 f"{self._hint(g.process_problem)}")
                if g.host_pids:
                    notes.append(f"{where}: the list shows host PIDs (this process runs in a container, "
                                 f"PID {self.pid} here), so its own process cannot be marked by PID.")
            if g.mapping is not None and g.mapping.matched_by == "CUDA_VISIBLE_DEVICES" and \
                    not self.torch.named_by_nvml:
                notes.append(f"cuda:{g.torch_index} matched to GPU {g.nvml_index} by position in "
                             "CUDA_VISIBLE_DEVICES (torch reported no UUID or PCI bus id).")
        if self.torch.named_by_nvml:
            notes.append("CUDA is not initialised in this process: torch's GPUs are named from NVML in "
                         "CUDA_VISIBLE_DEVICES order, and torch holds no GPU memory yet (asking torch would "
                         "initialise CUDA).")
        return notes + [f"torch warned: {text}" for text in self.torch.warnings]

    def _hint(self, problem: Any) -> str:
        """NVML's hint, in the words for where this runs: the permission hint names containers only in one."""
        if problem.hint == HINTS["no_permission"] and self.place is not None and self.place.container is None:
            return HINTS["no_permission_host"]
        return problem.hint

    def report(self) -> Report:
        """The headline; why torch cannot use a GPU; the GPUs, their state and processes; the
        environment; the notes."""
        tables: list = []
        if self.gpus:
            ident, state = self._gpu_tables()
            tables += [ident, state] if state.rows else [ident]
            if self.show_processes:
                procs = self._process_table()
                tables.append(procs if procs.rows else Lines(["Processes: none listed"]))
        return self._layout(tables + [self._environment_table()], self._notes())


def _machine_rows(here: Machine) -> list:
    """What the OS says about NVIDIA hardware, for the environment table."""
    if here.system == "Darwin":
        return [("NVIDIA GPUs", "none (macOS)")]
    if here.wsl:
        access = "GPU access (/dev/dxg)" if here.wsl_gpu else "no GPU access (no /dev/dxg)"
        shared = "NVIDIA's driver shared from Windows" if here.wsl_nvidia else "no NVIDIA driver from Windows"
        return [("WSL", f"{access}, {shared}")]
    if here.system != "Linux":
        return []
    if here.nvidia_gpus is None:
        bus = "unknown (the PCI bus cannot be read here)"
    elif not here.nvidia_gpus:
        bus = "none"
    else:
        bus = "; ".join(f"{g.label()} at {g.address} ({g.driver or 'no'} driver)" for g in here.nvidia_gpus)
    module = "not loaded" if here.kernel_driver is None else (here.kernel_driver or "loaded")
    return [("NVIDIA GPUs on the PCI bus", bus), ("NVIDIA kernel driver", module)]


def env_text(value: Optional[str]) -> str:
    """An environment variable's value as the reports show it: quoted, or '(unset)'."""
    return "(unset)" if value is None else repr(value)


def _get(obj: Any, name: str) -> Any:
    return NA if obj is None else getattr(obj, name)


def _pick(snap: Any, snap_field: str, dev: Any, dev_field: str) -> Any:
    """NVML's figure, else torch's."""
    value = _get(snap, snap_field)
    return _get(dev, dev_field) if is_na(value) else value


_FIELDS = table()  # type -> the names of its fields if a dataclass, else False: for _plain
_AS_IS = (str, int, bool, type(None))


def _plain(obj: Any) -> Any:
    """``obj`` as plain JSON-able data, in one walk (``asdict`` first would copy every nested dataclass
    and walk it twice). Most of a report is strings and numbers, taken as they are before any other
    test, and a dataclass's field names are read once per type: this walk was a third of each engine's
    part of ``%gpuinfo --cluster``."""
    kind = type(obj)
    if kind in _AS_IS:
        return obj
    if is_na(obj):
        return None
    if kind is dict:
        return {str(k): _plain(v) for k, v in obj.items()}
    if kind is list or kind is tuple:
        return [_plain(v) for v in obj]
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in fields(kind)) if is_dataclass(kind) else False
    if names is not False:
        return {name: _plain(getattr(obj, name)) for name in names}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# ---- building it --------------------------------------------------------------------------------

def build_report(index: Optional[int] = None, show_processes: bool = True,
                 view_fn: Optional[Callable[[], TorchView]] = None, here: Optional[Machine] = None,
                 place: Optional[Place] = None) -> GPUReport:
    """Collect the report. ``index`` keeps one GPU: torch's ``cuda:N`` when torch sees GPUs, else NVML's
    index; an index that does not exist raises :class:`MagicInputError` naming the valid ones. ``here``
    and ``place`` are what this machine has and where the kernel runs (read when not given:
    :func:`.machine.survey`, :func:`.hosting.where`)."""
    identities = gpumap.identities()  # none without NVML; read once for naming torch's GPUs and matching
    view = torch_view(identities) if view_fn is None else view_fn()
    here = machine.survey() if here is None else here
    place = hosting.where() if place is None else place
    problem = nvml.status()
    count = len(identities)
    env = {
        "driver_version": nvml.driver_version(),
        "cuda_driver_version": nvml.cuda_driver_version(),
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
            mig = entry.mapping.mig if entry.mapping is not None and entry.mapping.mig else None
            if mig:
                _slice_memory(entry.snapshot, mig)
            if show_processes:
                procs, entry.process_problem = nvml.processes(entry.nvml_index, mig)
                entry.processes = [ProcessRow(p.pid, p.name, p.used_memory, p.kind, p.pid == pid)
                                   for p in procs]
    if show_processes:
        _mark_host_pids(entries, pid)
    return GPUReport(environment=env, torch=view, gpus=entries,
                     diagnosis=diagnose(view, problem, identities, env, here, place), nvml_problem=problem,
                     show_processes=show_processes, pid=pid, machine=here, place=place)


def _entries(view: TorchView, mapping: list, count: int) -> list:
    """One entry per NVML GPU (with torch's index where torch sees it), then torch GPUs NVML lacks."""
    devices = {d.index: d for d in view.devices}
    entries = [GPUEntry(nvml_index=i, torch_index=None) for i in range(count)]
    for m in mapping:  # the NVML indices matched are those of the ``count`` GPUs
        entry = entries[m.nvml_index] if m.nvml_index is not None else None
        if entry is None or entry.mapping is not None:  # unmatched, or a second torch GPU on one NVML GPU
            entry = GPUEntry(nvml_index=None, torch_index=None)
            entries.append(entry)
        entry.torch_index, entry.torch, entry.mapping = m.torch_index, devices.get(m.torch_index), m
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
        raise MagicInputError(f"no {kind} {index}" + (
            f"; valid: {', '.join(map(str, valid))}" if valid else ": there is no GPU here"))
    entries[:] = keep


def _slice_memory(snap: Any, mig_uuid: str) -> None:
    """Show the memory of the MIG instance torch uses, not of the whole GPU (a 10 GB slice is not 80)."""
    for mig in snap.mig_devices:
        if mig.uuid == mig_uuid and not is_na(mig.memory_total) and not is_na(mig.memory_used):
            snap.memory_total, snap.memory_used = mig.memory_total, mig.memory_used
            snap.memory_free = mig.memory_total - mig.memory_used


def _mark_host_pids(entries: list, pid: int) -> None:
    """Say 'host PIDs' where NVML's process lists name another PID namespace's processes (the one check,
    :func:`~.processes.foreign_pids`, over every GPU's list: this process on any GPU settles it)."""
    if foreign_pids([p for e in entries for p in e.processes], pid):
        for entry in entries:
            entry.host_pids = foreign_pids(entry.processes, pid)
