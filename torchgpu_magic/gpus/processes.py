"""What NVML says a GPU's processes hold: this process's share and the others', and whether NVML's
process list can be read here at all (a container without ``--pid=host`` sees the host's PIDs).

``%gpumem``'s samples, the out-of-memory explanation's device state and ``%gpumem free`` all read a
GPU's per-process figures here, so they agree on who "this process" and "the others" are.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from ..render import is_na
from . import nvml


def process_figures(nvml_index: int, pid: int, mig_uuid: Optional[str] = None) -> tuple:
    """(used, total, this process, other processes, problems) from NVML, for the GPU or the MIG instance
    ``mig_uuid``; NA/None where it cannot say. When NVML lists processes, not this one, and PIDs that do
    not exist here (a container: NVML gives the host's PIDs), this process's share and the others' are
    unknown (None), not 0 and everything."""
    problems = []
    used, total = nvml.memory(nvml_index, mig_uuid)  # neither raises: NA figures, a problem returned
    procs, problem = nvml.processes(nvml_index, mig_uuid)
    if problem is not None:
        if not procs:  # no list at all: this process's share and the others' are unknown
            problems.append(problem_text(problem))
            return used, total, None, None, tuple(problems)
        if getattr(problem, "code", "") != "not_supported":  # one of two lists failed
            problems.append(problem_text(problem))
    by_pid: dict = {}
    for proc in procs:  # one process may appear as compute and graphics: count it once
        amount = getattr(proc, "used_memory", None)
        if is_na(amount):
            continue
        by_pid[proc.pid] = max(by_pid.get(proc.pid, 0), int(amount))
    mine = by_pid.pop(pid, None)
    if mine is None and foreign_pids(procs):
        problems.append("this process is not in NVML's process list (another PID namespace, e.g. a "
                        "container, where NVML lists the host's PIDs): its share is N/A")
        return used, total, None, None, tuple(problems)
    return used, total, mine if mine is not None else 0, sum(by_pid.values()), tuple(problems)


def foreign_pids(procs: Sequence[Any]) -> bool:
    """Whether NVML's process list ``procs`` names processes of another PID namespace: some PID in it does
    not exist here. That is a container started without ``--pid=host``: NVML lists the host's PIDs, so
    this process is not found by its own PID and nobody in the list can be told apart from it. The one
    check every report that reads NVML's process list makes before it names "other processes"."""
    return bool(procs) and not all(_pid_exists(proc.pid) for proc in procs)


def _pid_exists(pid: int) -> bool:
    """Whether ``pid`` names a process in this PID namespace (NVML lists the host's PIDs in a container)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def problem_text(problem: Any) -> str:
    """An NVML problem (a :class:`~.nvml.Problem` or a string) as one line: its message and hint."""
    message = getattr(problem, "message", str(problem))
    hint = getattr(problem, "hint", "")
    return f"NVML: {message}" + (f" ({hint})" if hint else "")
