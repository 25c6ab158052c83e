"""This process's host memory: resident set size (RSS), its high-water mark, the system's memory, the
limits this process runs under, and the garbage collector paused while a report walks or a measurement
samples (:func:`gc_paused`).

Every room that speaks of host memory reads it here (``%gpumem``'s samples and per-cell records, the
out-of-memory explanation, ``%gpumem free``, ``%%cudamem``'s host capacity), so they agree on one reading.
/proc is read directly on Linux (cheap enough to read around every cell), psutil elsewhere; psutil is
imported lazily. Standard library plus psutil.

What the system has available is not what this process may take: a container or a pod runs it in a
cgroup whose memory limit is usually far below the machine's RAM (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``, each level of the hierarchy counting), and ``ulimit -v`` / ``ulimit -d`` cap
its address space (``RLIMIT_AS``) or data (``RLIMIT_DATA``). :func:`memory_limits` reads them all;
:func:`host_memory` names the one that leaves the least.
"""
from __future__ import annotations

import gc
import os
from contextlib import closing, contextmanager, suppress
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Optional


@dataclass(frozen=True)
class HostMemory:
    """This process's resident memory and the system's, in bytes. ``peak_rss`` is the kernel's
    high-water mark (VmHWM) since the last reset, None where the OS does not say. ``available`` and
    ``total`` are the system's; ``limit`` is the limit on this process that leaves it less than that
    (a cgroup's, ``ulimit -v``'s), None where none does: :attr:`usable` is what it may still take."""

    rss: int
    available: int
    total: int
    peak_rss: Optional[int] = None
    limit: Optional[MemoryLimit] = None

    @property
    def usable(self) -> int:
        """What this process may still allocate: the system's available memory, or less under a limit."""
        return self.available if self.limit is None else min(self.available, self.limit.available)

    @property
    def capacity(self) -> int:
        """The most this process may hold: the system's RAM, or the limit's size when it is smaller."""
        return self.total if self.limit is None else min(self.total, self.limit.limit)


def host_memory() -> Optional[HostMemory]:
    """RSS and system memory from psutil, peak RSS from /proc (Linux), and the limit that binds (see
    :func:`memory_limits`); None if psutil cannot say."""
    try:
        import psutil

        rss = psutil.Process().memory_info().rss
        vm = psutil.virtual_memory()
    except Exception:  # noqa: BLE001 - an unreadable /proc must not break a sample
        return None
    return HostMemory(rss=int(rss), available=int(vm.available), total=int(vm.total), peak_rss=peak_rss(),
                      limit=binding_limit(memory_limits(), int(vm.available), int(vm.total)))


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
                with suppress(OSError):
                    os.close(fd)
        self._fds = {}


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def peak_rss() -> Optional[int]:
    """The kernel's resident-set high-water mark (VmHWM) in bytes since the last reset, or None off Linux."""
    with closing(HostCounters()) as counters:
        return counters.rss_and_peak()[1]


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write '5' to /proc/self/clear_refs); False where
    that is not possible, and a per-cell peak RSS then reads N/A rather than a lifetime maximum."""
    with closing(HostCounters()) as counters:
        return counters.reset_peak()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a report's walk, and back as it was after, however the
    walk ends (``%%cudatime`` does the same while sampling). A report over 10,000 tensors makes tens of
    thousands of small objects, and each 700 allocations set off a collection that traverses every
    object of the process: with the model and the namespace alive, that was about two thirds of the
    walk. Nothing the walk makes is cyclic garbage, so nothing is left for later but what the program
    itself made meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---- the limits this process runs under -----------------------------------------------------------------
_UNLIMITED = 2 ** 62  # cgroup v1 writes "no limit" as 9223372036854771712 (PAGE_COUNTER_MAX pages)


@dataclass(frozen=True)
class MemoryLimit:
    """One limit on this process's memory: ``name`` says what sets it ('the cgroup's memory.max',
    'ulimit -v (RLIMIT_AS)'), ``where`` the cgroup or '' for an rlimit, ``limit`` its size in bytes,
    ``used`` what counts against it now (the cgroup's usage less its inactive file cache, which the
    kernel reclaims first, as ``docker stats`` counts it; the process's address space for RLIMIT_AS,
    its data for RLIMIT_DATA)."""

    name: str
    where: str
    limit: int
    used: int

    @property
    def available(self) -> int:
        """What is left under this limit."""
        return max(0, self.limit - self.used)

    def describe(self) -> str:
        """'the cgroup's memory.max (8.00 GiB, 6.20 GiB used; /sys/fs/cgroup/memory.max)'."""
        from .render import fmt_bytes

        where = f"; {self.where}" if self.where else ""
        return f"{self.name} ({fmt_bytes(self.limit)}, {fmt_bytes(self.used)} used{where})"

    def to_dict(self) -> dict:
        return dict(asdict(self), available=self.available)


ROOT = "/"
"""Where :func:`memory_limits` reads ``proc/self/...`` and ``sys/fs/cgroup/...``: the file system's root
(a test points it at a scripted tree)."""
GETRLIMIT: Optional[Callable[[int], tuple]] = None
"""What :func:`memory_limits` asks for rlimits; None: ``resource.getrlimit`` (a test scripts it)."""


def memory_limits(root: Optional[str] = None, rlimits: Optional[Callable[[int], tuple]] = None) -> list:
    """Every :class:`MemoryLimit` this process runs under: its cgroup's memory limit and each of its
    ancestors' (v2 ``memory.max``; v1 ``memory.limit_in_bytes``), ``RLIMIT_AS`` and ``RLIMIT_DATA``.
    ``root`` is the file system's root (default :data:`ROOT`), ``rlimits`` what answers
    ``resource.getrlimit`` (default :data:`GETRLIMIT`). Never raises: what cannot be read is left out."""
    root = ROOT if root is None else root
    found = _cgroup_limits(root)
    try:
        import resource
    except ImportError:  # Windows: no rlimits
        return found
    rlimits = rlimits or GETRLIMIT or resource.getrlimit
    status = _read(os.path.join(root, "proc", "self", "status")) or ""
    for which, name, field in ((resource.RLIMIT_AS, "ulimit -v (RLIMIT_AS)", "VmSize"),
                               (resource.RLIMIT_DATA, "ulimit -d (RLIMIT_DATA)", "VmData")):
        try:
            soft = rlimits(which)[0]
        except (OSError, ValueError):
            continue
        if soft is None or soft < 0 or soft >= _UNLIMITED:  # RLIM_INFINITY is -1 in Python
            continue
        found.append(MemoryLimit(name, "", int(soft), _field(status, field) * 1024))  # status is in kB
    return found


def binding_limit(limits: list, available: int, total: int) -> Optional[MemoryLimit]:
    """The limit in ``limits`` that leaves the least, when it leaves less than the system's ``available``
    memory or is smaller than its ``total``; None when none binds."""
    binding = [lim for lim in limits if lim.available < available or lim.limit < total]
    return min(binding, key=lambda lim: (lim.available, lim.limit)) if binding else None


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _field(text: Optional[str], name: str) -> int:
    """A figure of a file of ``key value`` lines: ``/proc/self/status`` ('VmSize:  4096 kB') or a cgroup's
    ``memory.stat`` ('inactive_file 1234'); 0 where it is not there."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].rstrip(":") == name and parts[1].isdigit():
            return int(parts[1])
    return 0


def _cgroup_limits(root: str) -> list:
    """The memory limits of this process's cgroup and of each ancestor under the cgroup mount: v2 when
    ``/proc/self/cgroup`` has the unified line ``0::PATH`` and the v1 memory controller is not mounted,
    else v1's ``memory`` line. In a container the cgroup's path may name the host's hierarchy while the
    mount shows the container's own cgroup at its root: a path that is not under the mount is read at
    the mount's root."""
    text = _read(os.path.join(root, "proc", "self", "cgroup"))
    if not text:
        return []
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    base = os.path.join("sys", "fs", "cgroup")
    if v1 is not None and os.path.isdir(os.path.join(root, base, "memory")):
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        return _walk(root, os.path.join(base, "memory"), v1, files, "the cgroup's memory.limit_in_bytes (v1)")
    if v2 is not None:
        return _walk(root, base, v2, ("memory.max", "memory.current", "inactive_file"),
                     "the cgroup's memory.max")
    return []


def _walk(root: str, mount: str, path: str, files: tuple, name: str) -> list:
    """The limit of the cgroup at ``path`` under ``mount`` (relative to ``root``) and of each ancestor up
    to the mount; ``files`` are the limit's, the usage's and the inactive-cache field of memory.stat."""
    limit_file, usage_file, inactive = files
    here = os.path.normpath(os.path.join(mount, path.strip("/")))
    if not os.path.isfile(os.path.join(root, here, limit_file)):
        here = os.path.normpath(mount)
    found = []
    while True:
        raw = (_read(os.path.join(root, here, limit_file)) or "").strip()
        if raw.isdigit() and int(raw) < _UNLIMITED:
            usage = (_read(os.path.join(root, here, usage_file)) or "").strip()
            used = int(usage) if usage.isdigit() else 0
            used = max(0, used - _field(_read(os.path.join(root, here, "memory.stat")), inactive))
            found.append(MemoryLimit(name, "/" + os.path.join(here, limit_file), int(raw), used))
        if here == os.path.normpath(mount) or not here:
            return found
        here = os.path.dirname(here)
