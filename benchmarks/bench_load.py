"""Cost of `%load_ext torchgpu_magic` over a plain `import torch`, and `%gpuinfo` cold and warm.

Each figure comes from fresh subprocesses run alternately (A, B, A, B, ...) so both kinds see the same
machine state; medians are reported. Equal terms: every subprocess starts empty and holds the same
objects (torch, and the extension or not).

Targets: `%load_ext` (timed inside the process, after `import torch`) <= 30 ms with the package's
bytecode cached, as on a user's machine, and <= 20 ms with none (issue 30): where bytecode is never
written (`PYTHONDONTWRITEBYTECODE=1`, as on the CI machines) every module loading imports is compiled
from source each time. That row runs a copy of the package with no `__pycache__`, so a cache written by
an earlier run cannot stand in for the compile.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 7
TARGET_MS = 30.0
TARGET_NO_BYTECODE_MS = 20.0

_PRELUDE = """
import json, time
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
shell = InteractiveShell.instance()
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
"""

PLAIN = _PRELUDE + "print(json.dumps({'torch': t1 - t0, 'total': t1 - t0}))"

LOADED = _PRELUDE + """
shell.run_line_magic('load_ext', 'torchgpu_magic')
t2 = time.perf_counter()
print(json.dumps({'torch': t1 - t0, 'load_ext': t2 - t1, 'total': t2 - t0}))
"""

GPUINFO = _PRELUDE + """
shell.run_line_magic('load_ext', 'torchgpu_magic')
with capture_output():
    t2 = time.perf_counter()
    shell.run_line_magic('gpuinfo', '')
    t3 = time.perf_counter()
    warm = []
    for _ in range(10):
        s = time.perf_counter()
        shell.run_line_magic('gpuinfo', '')
        warm.append(time.perf_counter() - s)
warm.sort()
print(json.dumps({'cold': t3 - t2, 'warm': warm[len(warm) // 2]}))
"""


def _run(code: str, env: dict | None = None, cwd: Path = ROOT) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    plain, loaded, info, uncached = [], [], [], []
    copy = tempfile.mkdtemp()
    shutil.copytree(ROOT / "torchgpu_magic", Path(copy) / "torchgpu_magic",
                    ignore=shutil.ignore_patterns("__pycache__"))
    no_bytecode = {**os.environ, "PYTHONPATH": copy, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        for _ in range(REPEATS):
            plain.append(_run(PLAIN))
            loaded.append(_run(LOADED))
            info.append(_run(GPUINFO))
            # run from the copy's folder: `python -c` puts the working directory first on sys.path, and
            # from ROOT it would import ROOT's package, bytecode and all
            uncached.append(_run(LOADED, no_bytecode, Path(copy)))
    finally:
        shutil.rmtree(copy)
    med = statistics.median
    plain_total = med(r["total"] for r in plain) * 1e3
    loaded_total = med(r["total"] for r in loaded) * 1e3
    load_ext = med(r["load_ext"] for r in loaded) * 1e3
    cold = med(r["cold"] for r in info) * 1e3
    warm = med(r["warm"] for r in info) * 1e3
    bare = med(r["load_ext"] for r in uncached) * 1e3
    print(f"fresh subprocesses, {REPEATS} alternating repetitions each, medians; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"import torch                          {plain_total:8.1f} ms")
    print(f"import torch + %load_ext              {loaded_total:8.1f} ms")
    print(f"%load_ext alone (same processes)      {load_ext:8.1f} ms   target <= {TARGET_MS:.0f} ms: "
          f"{'met' if load_ext <= TARGET_MS else 'MISSED'}")
    print(f"%load_ext, no bytecode cached         {bare:8.1f} ms   target <= {TARGET_NO_BYTECODE_MS:.0f} ms: "
          f"{'met' if bare <= TARGET_NO_BYTECODE_MS else 'MISSED'}")
    print(f"difference of the medians             {loaded_total - plain_total:8.1f} ms "
          f"(ratio {loaded_total / plain_total:.3f})")
    print(f"%gpuinfo cold (first call)            {cold:8.1f} ms")
    print(f"%gpuinfo warm (median of 10)          {warm:8.1f} ms   cold/warm {cold / warm:.1f}x")


if __name__ == "__main__":
    main()
