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
and the per-cell log that take these figures are :mod:`torchgpu_magic.memory.sampler`). NVML goes
through :mod:`torchgpu_magic.gpus.nvml`, which answers NA instead of raising. psutil and torch are imported
lazily.

Standard library plus psutil; no IPython, no ipywidgets (the view is :mod:`torchgpu_magic.memory.panel`).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from ..render import Table, fmt_bytes, html_lines, is_na

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


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
class HostMemory:
    """This process's resident memory and the system's, in bytes. ``peak_rss`` is the kernel's
    high-water mark (VmHWM) since the last reset, None where the OS does not say."""

    rss: int
    available: int
    total: int
    peak_rss: Optional[int] = None


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
    peak: Any = None          # highest allocated since the last reset (the Sampler's: memory.sampler)
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


@dataclass(frozen=True)
class MemorySnapshot:
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

    def to_text(self) -> str:
        """The snapshot as terminal text (what IPython prints for it)."""
        parts = ["Memory (this process)", "  " + self.host_line()]
        table = self.table()
        if table is not None:
            parts.append(table.to_text(indent="  "))
        parts.extend("  " + line for line in self.notes())
        return "\n".join(parts)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        table = self.table()
        return (
            "<div><b>Memory (this process)</b>"
            + html_lines([self.host_line()])
            + (table.to_html() if table is not None else "")
            + html_lines(self.notes())
            + "</div>"
        )


_CUDA_NOTES = {
    "not imported": "torch is not imported in this process yet, so it holds no GPU memory",
    "no CUDA": "this torch has no CUDA (a CPU build?): only NVML's figures are shown",
    "not initialised": "CUDA is not initialised in this process yet, so torch holds no GPU memory",
}


def _plain(value: Any) -> Any:
    return None if is_na(value) else value


# ---- sources ---------------------------------------------------------------------------------------
def host_memory() -> Optional[HostMemory]:
    """RSS and system memory from psutil, peak RSS from /proc (Linux); None if psutil cannot say."""
    try:
        import psutil

        rss = psutil.Process().memory_info().rss
        vm = psutil.virtual_memory()
    except Exception:  # noqa: BLE001 - an unreadable /proc must not break a sample
        return None
    return HostMemory(rss=int(rss), available=int(vm.available), total=int(vm.total), peak_rss=peak_rss())


def peak_rss() -> Optional[int]:
    """The kernel's resident-set high-water mark (VmHWM) in bytes, or None off Linux."""
    try:
        with open(_STATUS, encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class HostCounters:
    """This process's RSS and its high-water mark, cheap enough to read around every cell: /proc's files
    are opened once and re-read with ``pread`` (opening them costs more than reading them), RSS from
    ``statm``, RSS and peak together from one read of ``status`` (VmRSS, VmHWM), and the peak reset by
    writing '5' to ``clear_refs``. Off Linux, RSS comes from psutil and the peak is None. Reopens after
    a fork (the files name the process that opened them); :meth:`close` gives the files back."""

    def __init__(self) -> None:
        self._pid = -1
        self._fds: dict = {}
        self._process: Any = None  # psutil.Process, made once, where /proc cannot be read

    def _fd(self, name: str, flags: int) -> Optional[int]:
        if self._pid != os.getpid():
            self.close()
            self._pid = os.getpid()
        if name not in self._fds:
            try:
                self._fds[name] = os.open(f"/proc/self/{name}", flags)
            except OSError:
                self._fds[name] = None
        return self._fds[name]

    def _psutil_rss(self) -> Optional[int]:
        try:
            import psutil

            if self._process is None:
                self._process = psutil.Process()
            return int(self._process.memory_info().rss)
        except Exception:  # noqa: BLE001 - an unreadable process must not break a cell
            return None

    def rss(self) -> Optional[int]:
        """Resident bytes now."""
        fd = self._fd("statm", os.O_RDONLY)
        if fd is not None:
            try:
                return int(os.pread(fd, 256, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                pass
        return self._psutil_rss()

    def rss_and_peak(self) -> tuple:
        """(resident bytes, peak resident bytes since the last reset); the peak None off Linux."""
        fd = self._fd("status", os.O_RDONLY)
        if fd is not None:
            try:
                text = os.pread(fd, 8192, 0)
                rss_at, hwm_at = text.find(b"VmRSS:"), text.find(b"VmHWM:")
                if rss_at >= 0 and hwm_at >= 0:
                    return (int(text[rss_at + 6:text.index(b"k", rss_at)]) * 1024,
                            int(text[hwm_at + 6:text.index(b"k", hwm_at)]) * 1024)
            except (OSError, ValueError):
                pass
        return self._psutil_rss(), None

    def reset_peak(self) -> bool:
        """Reset the peak to the current RSS; False where the OS does not allow it."""
        fd = self._fd("clear_refs", os.O_WRONLY)
        if fd is None:
            return False
        try:
            os.write(fd, b"5")
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Close the /proc files (they reopen on next use)."""
        for fd in self._fds.values():
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fds = {}


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write '5' to /proc/self/clear_refs); False where
    that is not possible, and a per-cell peak RSS then reads N/A rather than a lifetime maximum."""
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


_CPU_ONLY: Any = None  # a torch seen to be built without CUDA or ROCm: its answer never changes


def cuda_state() -> str:
    """How much torch can tell without side effects: see :class:`MemorySnapshot`. Asked around every
    cell, so cheap: ``is_initialized`` first, and a CPU-only build's answer remembered
    (``is_available`` there costs tens of microseconds, a failed attribute lookup in ``torch._C``)."""
    global _CPU_ONLY
    torch = sys.modules.get("torch")
    if torch is None:
        return "not imported"
    if torch is _CPU_ONLY:
        return "no CUDA"
    try:
        if torch.cuda.is_initialized():
            return "initialised"
        if torch.cuda.is_available():
            return "not initialised"
        version = torch.version
        if getattr(version, "cuda", None) is None and getattr(version, "hip", None) is None:
            _CPU_ONLY = torch
        return "no CUDA"
    except Exception:  # noqa: BLE001 - a half-imported or broken torch: say so, never raise
        return "no CUDA"


def initialised_cuda() -> Any:
    """``torch.cuda`` when torch is imported and CUDA initialised in this process, else None: the one
    way into torch's allocator here and in the sampler, so that neither initialises CUDA."""
    if cuda_state() != "initialised":
        return None
    return sys.modules["torch"].cuda


def torch_figures(torch_index: int) -> tuple:
    """(allocated, reserved, max_allocated) of torch's allocator on ``cuda:torch_index``; zeros when
    CUDA is not initialised (torch then holds nothing), Nones when torch cannot answer."""
    cuda = initialised_cuda()
    if cuda is None:
        return 0, 0, 0
    try:
        return (int(cuda.memory_allocated(torch_index)), int(cuda.memory_reserved(torch_index)),
                int(cuda.max_memory_allocated(torch_index)))
    except Exception:  # noqa: BLE001 - e.g. the GPU fell off the bus: the panel shows N/A
        return None, None, None


def _nvml_figures(nvml_index: int, pid: int, mig_uuid: Optional[str] = None) -> tuple:
    """(used, total, this process, other processes, problems) from NVML, for the GPU or the MIG instance
    ``mig_uuid``; NA/None where it cannot say. When NVML lists processes, not this one, and PIDs that do
    not exist here (a container: NVML gives the host's PIDs), this process's share and the others' are
    unknown (None), not 0 and everything."""
    from ..gpus import nvml

    problems = []
    try:
        figures = nvml.memory(nvml_index, mig_uuid)
        used, total = figures if isinstance(figures, tuple) else (figures, figures)
    except Exception as exc:  # noqa: BLE001 - nvml.py should not raise; if it does, show it
        used = total = None
        problems.append(f"NVML memory query failed: {exc}")
    try:
        procs, problem = nvml.processes(nvml_index, mig_uuid)
    except Exception as exc:  # noqa: BLE001
        procs, problem = [], None
        problems.append(f"NVML process query failed: {exc}")
    if problem is not None:
        if not procs:  # no list at all: this process's share and the others' are unknown
            problems.append(_problem_text(problem))
            return used, total, None, None, tuple(problems)
        if getattr(problem, "code", "") != "not_supported":  # one of two lists failed
            problems.append(_problem_text(problem))
    by_pid: dict = {}
    for proc in procs:  # one process may appear as compute and graphics: count it once
        amount = getattr(proc, "used_memory", None)
        if is_na(amount):
            continue
        by_pid[proc.pid] = max(by_pid.get(proc.pid, 0), int(amount))
    mine = by_pid.pop(pid, None)
    if mine is None and procs and not all(_pid_exists(proc.pid) for proc in procs):
        problems.append("this process is not in NVML's process list (another PID namespace, e.g. a "
                        "container, where NVML lists the host's PIDs): its share is N/A")
        return used, total, None, None, tuple(problems)
    return used, total, mine if mine is not None else 0, sum(by_pid.values()), tuple(problems)


def _pid_exists(pid: int) -> bool:
    """Whether ``pid`` names a process in this PID namespace (NVML lists the host's PIDs in a container)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _problem_text(problem: Any) -> str:
    message = getattr(problem, "message", str(problem))
    hint = getattr(problem, "hint", "")
    return f"NVML: {message}" + (f" ({hint})" if hint else "")


def collect(targets: Sequence[GPUTarget], pid: Optional[int] = None) -> MemorySnapshot:
    """Take one sample of host memory and every target GPU. Never raises for a lost GPU or a broken
    NVML: those become ``problems`` / ``status`` lines."""
    pid = os.getpid() if pid is None else pid
    status = []
    nvml_ok = False
    if any(t.nvml_index is not None for t in targets):
        try:
            from ..gpus import nvml

            problem = nvml.status()
        except Exception as exc:  # noqa: BLE001
            problem = f"NVML unavailable: {exc}"
        if problem is None:
            nvml_ok = True
        else:
            status.append(_problem_text(problem) if not isinstance(problem, str) else problem)
    state = cuda_state()
    gpus = []
    for target in targets:
        used = total = process = others = None
        problems: tuple = ()
        if nvml_ok and target.nvml_index is not None:
            used, total, process, others, problems = _nvml_figures(target.nvml_index, pid, target.mig_uuid)
        allocated = reserved = peak = None
        if target.torch_index is not None:
            allocated, reserved, peak = torch_figures(target.torch_index)
        gpus.append(GPUMemory(target, used, total, process, others, allocated, reserved, peak, problems))
    return MemorySnapshot(time.monotonic(), time.time(), host_memory(), tuple(gpus), state, tuple(status))


def empty_cache() -> bool:
    """Give torch's cached GPU memory back to the driver; False (and nothing done) when CUDA is not
    initialised in this process."""
    cuda = initialised_cuda()
    if cuda is None:
        return False
    cuda.empty_cache()
    return True
