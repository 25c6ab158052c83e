"""``%gpuinfo``'s report: torch's view, NVML's view and the environment, matched GPU by GPU.

Each GPU NVML sees is one entry, with torch's ``cuda:N`` beside it where torch sees it: the matching by
UUID (or PCI bus id) under ``CUDA_VISIBLE_DEVICES`` is :mod:`torchgpu_magic.gpus.gpumap`'s, whose names this
module hands on for its callers. When torch cannot use a GPU the report says why, naming the actual cause
and the fix.

tests may hand :func:`build_report` a ``view_fn`` returning a :class:`~torchgpu_magic.gpus.gpumap.TorchView`
of their own, as torch would describe a GPU machine.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable, Optional

from ..errors import MagicInputError
from ..render import Table, fmt_bytes, fmt_value, html_lines, is_na
from . import nvml
from .gpumap import GPUMapping, TorchDevice, TorchView, gpu_map, parse_cuda_visible_devices, torch_view
from .nvml import NA
from .problems import driver_fix

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
            ("this process's PID", self.pid),
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
                          fmt_bytes(p.used_memory), p.kind, "<- this process" if p.is_self else "")
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
        fix = driver_fix() if problem.code == "library_not_found" else problem.hint
        causes.append(Diagnosis("no_driver", what, fix))
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


def _slice_memory(snap: Any, mig_uuid: str) -> None:
    """Show the memory of the MIG instance torch uses, not of the whole GPU (a 10 GB slice is not 80)."""
    for mig in snap.mig_devices:
        if mig.uuid == mig_uuid and not is_na(mig.memory_total) and not is_na(mig.memory_used):
            snap.memory_total, snap.memory_used = mig.memory_total, mig.memory_used
            snap.memory_free = mig.memory_total - mig.memory_used


def _mark_host_pids(entries: list, pid: int) -> None:
    """Say 'host PIDs' where NVML's process lists name another PID namespace's processes (the one check,
    :func:`~.processes.foreign_pids`, over every GPU's list: this process on any GPU settles it)."""
    from .processes import foreign_pids

    if not foreign_pids([p for e in entries for p in e.processes], pid):
        return
    for entry in entries:
        if foreign_pids(entry.processes, pid):
            entry.host_pids = True
