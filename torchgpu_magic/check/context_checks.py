"""The machine and what asks it nothing: torch, CUDA and driver versions; ``%gpuinfo`` against
``nvidia-smi`` read the moment before and after; and no CUDA context created by the steps a user takes
without asking for the GPU, each in a fresh process (a context costs hundreds of MiB on every GPU it
lands on, and only a process that has not touched CUDA can show that a step created none).
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any, Optional

from .outcome import INFO, Outcome, Skip, judged, within
from .probe import MiB, Probe, smi_gpus

LIBRARIES = ("ipython", "nvidia-ml-py", "triton", "pytest", "numpy", "ipykernel", "nbclient", "transformers")
UTILISATION_POINTS = 10  # utilisation is a rate NVML averages over its own period: read twice, it moves
FRESH_TIMEOUT_S = 75  # each fresh process; the step's own limit is 90 s

# Each step a user may take without asking for the GPU, as cells of a fresh shell.
NO_CONTEXT_STEPS = {
    "%gpuinfo": "cell('%gpuinfo')",
    "%gpumem": "cell('%gpumem --text')\ncell('y = [1] * 10')\ncell('%gpumem stop')",
    "%whereis": "cell('t = torch.ones(4)\\nm = torch.nn.Linear(2, 2)')\ncell('%whereis')\n"
                "cell('%whereis t m')",
    "%%ontorch cpu": "cell('%%ontorch cpu\\nz = torch.ones(3) + 1')",
    "%%cudatime on a cpu cell": "cell('%%cudatime -r 3 --max-time 1\\ntorch.ones(8) * 2')",
    "%%cudatime on a cpu cell after %gpuinfo":
        "cell('%gpuinfo')\nr = cell('%%cudatime -o -q -r 3 --max-time 1\\ntorch.ones(8) * 2')\n"
        "assert r.device == 'cpu', r.device",
    "%%cudamem --predict cuda": "cell('m = torch.nn.Linear(64, 64)\\nx = torch.randn(8, 64)')\n"
                                "cell('%%cudamem --predict cuda -q\\nm(x).sum().backward()')",
}
FRESH_PRELUDE = '''
import os
import torch
from IPython.core.interactiveshell import InteractiveShell

ip = InteractiveShell.instance()
ip.run_line_magic("colors", "nocolor")
ip.run_line_magic("load_ext", "torchgpu_magic")
ip.user_ns["torch"] = torch


def cell(code):
    result = ip.run_cell(code)
    result.raise_error()
    return result.result


'''
FRESH_EPILOGUE = '''
from torchgpu_magic.gpus import nvml
contexts = [i for i in range(torch.cuda.device_count()) if torch._C._cuda_hasPrimaryContext(i)]
listed = [i for i in range(nvml.device_count()) if any(p.pid == os.getpid() for p in nvml.processes(i)[0])]
print("CONTEXTS", contexts, "NVML", listed)
'''


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions(probe: Probe) -> Outcome:
    """torch, CUDA, cuDNN, the driver and the GPUs, and the libraries the checks use (an ``info`` step)."""
    import torch

    from .. import __version__
    from ..gpus import nvml

    driver, cuda_driver = nvml.driver_version(), nvml.cuda_driver_version()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    props = [torch.cuda.get_device_properties(i) for i in range(count)]
    gpus = [f"cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, sm_{p.major}{p.minor}"
            for i, p in enumerate(props)]
    build = f"CUDA {torch.version.cuda}" if torch.backends.cuda.is_built() else (
        f"a CPU build (torch.version.cuda says {torch.version.cuda})")
    figure = (f"torch {torch.__version__}, {build}, driver {driver} (supports CUDA {cuda_driver}), "
              f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}" + (f": {gpus[0]}" if len(gpus) == 1 else ""))
    details = gpus if len(gpus) > 1 else []
    details += [f"cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'none'}",
                f"Python {platform.python_version()} ({sys.executable}), {platform.platform()}",
                f"torchgpu_magic {__version__}, " + ", ".join(f"{n} {_version(n)}" for n in LIBRARIES),
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}"]
    probe.say("\n".join([figure, *details]))
    return Outcome(INFO, figure, details=details)


# ---- %gpuinfo against nvidia-smi ---------------------------------------------------------------------------
def gpuinfo_vs_smi(probe: Probe) -> Outcome:
    """``%gpuinfo -o``'s used memory and utilisation per GPU against ``nvidia-smi`` read just before and
    just after the report (the figure must match one of the two readings)."""
    before = smi_gpus()
    with probe.displayed():
        report = probe.shell.run_line_magic("gpuinfo", "-o")
    after = smi_gpus()
    whole = [e for e in report.gpus if e.nvml_index is not None and not getattr(e.mapping, "mig", False)]
    rows = [(e.nvml_index, _plain(e.snapshot.memory_used), _plain(e.snapshot.utilization_gpu),
             before.get(e.nvml_index), after.get(e.nvml_index)) for e in whole]
    probe.say(f"%gpuinfo: {rows}")
    if not rows:
        raise Skip("%gpuinfo shows no whole GPU from NVML to compare (none, or MIG slices only)")
    return judge_gpuinfo(rows)


def _plain(value: Any) -> Optional[float]:
    """A figure of the report, None for N/A."""
    return None if value is None or getattr(value, "_is_na", False) else float(value)


def judge_gpuinfo(rows: list) -> Outcome:
    """``rows``: (nvml index, used bytes, utilisation %, smi before, smi after), each smi reading
    (used MiB, utilisation %) or None. Memory within 1 MiB and utilisation within 10 points of one reading."""
    lines, misses = [], []
    for index, used, util, *readings in rows:
        readings = [r for r in readings if r is not None]
        mib = None if used is None else used / MiB
        memory_ok = mib is not None and any(r[0] is not None and within(mib, r[0], 1) for r in readings)
        util_ok = util is not None and any(r[1] is not None and within(util, r[1], UTILISATION_POINTS)
                                           for r in readings)
        shown = " / ".join(f"{r[0]:.0f} MiB, {r[1]:.0f} %" for r in readings if None not in r)
        lines.append(f"GPU {index}: {mib if mib is None else round(mib, 1)} MiB, {util} % vs nvidia-smi "
                     f"{shown}")
        if not (memory_ok and util_ok):
            misses.append(f"GPU {index} {'memory' if not memory_ok else 'utilisation'}")
    return judged(not misses, "; ".join(lines), "memory +- 1 MiB, utilisation +- 10 points of nvidia-smi",
                  f"outside: {', '.join(misses)}", lines)


# ---- no CUDA context from steps that do not use the GPU ----------------------------------------------------
def no_context(probe: Probe) -> Outcome:
    """Each of :data:`NO_CONTEXT_STEPS` in a fresh process at once: none may hold a primary context on any
    GPU nor appear in NVML's process lists afterwards."""
    probe.cuda_build()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    running = {name: subprocess.Popen([sys.executable, "-c", FRESH_PRELUDE + code + "\n" + FRESH_EPILOGUE],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
               for name, code in NO_CONTEXT_STEPS.items()}
    found = {}
    for name, process in running.items():
        try:
            output, _ = process.communicate(timeout=FRESH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            output += f"\n(killed after {FRESH_TIMEOUT_S} s)"
        probe.say(f"---- {name} (exit status {process.returncode})\n{output.rstrip()}")
        marker = next((line for line in reversed(output.splitlines()) if line.startswith("CONTEXTS ")), None)
        found[name] = (process.returncode, marker)
    return judge_no_context(found)


def judge_no_context(found: dict) -> Outcome:
    """``found``: step -> (exit status, its ``CONTEXTS [...] NVML [...]`` line or None)."""
    clean = "CONTEXTS [] NVML []"
    bad = {name: (code, line) for name, (code, line) in found.items() if code != 0 or line != clean}
    lines = [f"{name}: {line or f'no result (exit status {code})'}" for name, (code, line) in found.items()]
    why = "; ".join(f"{name}: {line or f'failed (exit status {code}), see the log'}"
                    for name, (code, line) in bad.items())
    return judged(not bad, f"{len(found) - len(bad)} of {len(found)} steps left no context and no NVML entry",
                  "no primary context, no NVML process entry, for every step", why, lines)

