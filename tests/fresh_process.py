"""Run code in a fresh Python process with a real IPython shell and the extension loaded, for `gpu` tests
of what a magic does to CUDA state: only a process that has not touched CUDA yet can show that a step
created no CUDA context. The prelude defines ``ip`` (the shell), ``cell(code)`` (run a cell, raise its
error), ``contexts()`` (GPUs where this process holds a primary context) and ``nvml_pids()`` (GPUs
whose NVML process list names this process).

In a container without ``--pid=host`` NVML names processes by the host's PIDs, so this process is never
found by its own: there :func:`listed_here` takes any process NVML lists that it did not list when this
process started (before anything touched CUDA) as this one, which on a GPU the test has to itself is
exactly right, and a context created by the step is seen either way. Its failure mode is tested on the
simulated GPU (tests/test_simulated_memory.py)."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from typing import Any


def nvml_entries() -> dict:
    """{NVML index: set of PIDs in its compute and graphics process lists}."""
    from torchgpu_magic.gpus import nvml

    return {i: {p.pid for p in nvml.processes(i)[0]} for i in range(nvml.device_count())}


def listed_here(baseline: dict, now: dict, pid: Any = None) -> list:
    """The NVML indices whose list names this process: by its PID where NVML lists this PID namespace's
    processes, else (a container: NVML lists the host's PIDs) by a PID that was not there in
    ``baseline``, taken when this process started."""
    from torchgpu_magic.gpus.processes import foreign_pids

    pid = os.getpid() if pid is None else pid
    found = []
    for index, pids in now.items():
        listed = [type("P", (), {"pid": p})() for p in pids]
        if pid in pids or (foreign_pids(listed, pid) and pids - baseline.get(index, set())):
            found.append(index)
    return found

PRELUDE = '''
import os
from typing import Any

import torch
from IPython.core.interactiveshell import InteractiveShell

ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "torchgpu_magic")
ip.user_ns["torch"] = torch


def cell(code):
    result = ip.run_cell(code)
    result.raise_error()
    return result.result


def contexts():
    return [i for i in range(torch.cuda.device_count()) if torch._C._cuda_hasPrimaryContext(i)]


def nvml_pids():
    return listed_here(_BASELINE, nvml_entries())
''' + inspect.getsource(nvml_entries) + inspect.getsource(listed_here) + """
_BASELINE = nvml_entries()  # before anything touched CUDA
"""


def run_fresh(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run :data:`PRELUDE` and then ``code`` in a new interpreter importing this checkout's package."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=root)
