"""This process's host memory: resident set size (RSS), its high-water mark, the system's memory, and
the garbage collector paused while a report walks or a measurement samples (:func:`gc_paused`).

Every room that speaks of host memory reads it here (``%gpumem``'s samples and per-cell records, the
out-of-memory explanation, ``%gpumem free``, ``%%cudamem``'s host capacity), so they agree on one reading.
/proc is read directly on Linux (cheap enough to read around every cell), psutil elsewhere; psutil is
imported lazily. Standard library plus psutil.
"""
from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional


@dataclass(frozen=True)
class HostMemory:
    """This process's resident memory and the system's, in bytes. ``peak_rss`` is the kernel's
    high-water mark (VmHWM) since the last reset, None where the OS does not say."""

    rss: int
    available: int
    total: int
    peak_rss: Optional[int] = None



def host_memory() -> Optional[HostMemory]:
    """RSS and system memory from psutil, peak RSS from /proc (Linux); None if psutil cannot say."""
    try:
        import psutil

        rss = psutil.Process().memory_info().rss
        vm = psutil.virtual_memory()
    except Exception:  # noqa: BLE001 - an unreadable /proc must not break a sample
        return None
    return HostMemory(rss=int(rss), available=int(vm.available), total=int(vm.total), peak_rss=peak_rss())


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


def peak_rss() -> Optional[int]:
    """The kernel's resident-set high-water mark (VmHWM) in bytes since the last reset, or None off Linux."""
    counters = HostCounters()
    try:
        return counters.rss_and_peak()[1]
    finally:
        counters.close()


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write '5' to /proc/self/clear_refs); False where
    that is not possible, and a per-cell peak RSS then reads N/A rather than a lifetime maximum."""
    counters = HostCounters()
    try:
        return counters.reset_peak()
    finally:
        counters.close()


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
