"""What NVML says a GPU's processes hold: this process's share and the others', and whether NVML's
process list can be read here at all (a container without ``--pid=host`` sees the host's PIDs).

``%gpumem``'s samples, the out-of-memory explanation's device state and ``%gpumem free`` all read a
GPU's per-process figures here, so they agree on who "this process" and "the others" are.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from ..render import fmt_bytes, is_na
from . import nvml


def process_figures(nvml_index: int, pid: int, mig_uuid: Optional[str] = None) -> tuple:
    """(used, total, this process, other processes, problems) from NVML, for the GPU or the MIG instance
    ``mig_uuid``; NA/None where it cannot say. When NVML lists processes, not this one, and PIDs that do
    not exist here (a container: NVML gives the host's PIDs), this process's share and the others' are
    unknown (None), not 0 and everything; so is a figure NVML lists a process without (MIG mode)."""
    problems = []
    used, total = nvml.memory(nvml_index, mig_uuid)  # neither raises: NA figures, a problem returned
    procs, problem = nvml.processes(nvml_index, mig_uuid)
    if problem is not None and (not procs or problem.code != "not_supported"):  # none, or one of two lists
        problems.append(problem_text(problem))
    if problem is not None and not procs:  # no list at all: this process's share and the others' are unknown
        return used, total, None, None, tuple(problems)
    # nvml.processes lists each PID once (compute and graphics merged); without a figure in MIG mode for
    # a user without privileges
    unmeasured = {proc.pid for proc in procs if is_na(proc.used_memory)}
    by_pid = {proc.pid: int(proc.used_memory) for proc in procs if not is_na(proc.used_memory)}
    if foreign_pids(procs, pid):
        problems.append(foreign_note(procs))
        return used, total, None, None, tuple(problems)
    mine = by_pid.pop(pid, 0)
    if unmeasured:
        problems.append(f"NVML lists {len(unmeasured)} process{'es' if len(unmeasured) != 1 else ''} here "
                        "without their memory (MIG mode gives none to a user without privileges): "
                        + ("this process's share and " if pid in unmeasured else "")
                        + "what other processes hold are N/A")
    others = None if unmeasured - {pid} else sum(by_pid.values())
    return used, total, None if pid in unmeasured else mine, others, tuple(problems)


def foreign_pids(procs: Sequence[Any], pid: int) -> bool:
    """Whether NVML's process list ``procs`` names processes of another PID namespace: this process
    (``pid``) is not in it and some PID in it does not exist here. That is a container
    started without ``--pid=host``: NVML lists the host's PIDs, so this process is not found by its own
    PID and nobody in the list can be told apart from it. The one check every report that reads NVML's
    process list makes before it names "other processes" or "this process"."""
    return (bool(procs) and not any(proc.pid == pid for proc in procs)
            and not all(_pid_exists(proc.pid) for proc in procs))


def foreign_note(procs: Sequence[Any]) -> str:
    """What NVML can and cannot tell when its list ``procs`` names another PID namespace's processes: how
    many it lists and what they hold, but not which is this one, so neither this process's share nor
    what other processes hold."""
    shown = ", ".join(f"{p.pid}" + ("" if is_na(p.used_memory) else f" {fmt_bytes(int(p.used_memory))}")
                      for p in list(procs)[:4])
    more = f" and {len(procs) - 4} more" if len(procs) > 4 else ""
    return (f"NVML lists {len(procs)} process{'es' if len(procs) != 1 else ''} under the host's PIDs "
            f"({shown}{more}): this kernel runs in another PID namespace (a container without --pid=host), "
            "so NVML cannot tell which is this process: its share, and what other processes hold, are N/A "
            "here (nvidia-smi on the host, or a container started with --pid=host, names them)")


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
    """An :class:`~.snapshots.NVMLProblem` as one line: its message and hint."""
    return f"NVML: {problem.message} ({problem.hint})"
