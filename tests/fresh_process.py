"""Run code in a fresh Python process with a real IPython shell and the extension loaded, for `gpu` tests
of what a magic does to CUDA state: only a process that has not touched CUDA yet can show that a step
created no CUDA context. The prelude defines ``ip`` (the shell), ``cell(code)`` (run a cell, raise its
error), ``contexts()`` (GPUs where this process holds a primary context) and ``nvml_pids()`` (GPUs
whose NVML process list names this process)."""
from __future__ import annotations

import os
import subprocess
import sys

PRELUDE = '''
import os
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
    from torchgpu_magic.gpus import nvml
    return [i for i in range(nvml.device_count())
            if any(p.pid == os.getpid() for p in nvml.processes(i)[0])]
'''


def run_fresh(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run :data:`PRELUDE` and then ``code`` in a new interpreter importing this checkout's package."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=root)
