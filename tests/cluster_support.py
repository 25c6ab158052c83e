"""What the real-cluster tests share: engines that import this checkout, and a teardown that leaves no
process behind. Engines and workers inherit ``PYTHONPATH`` from the process that starts them, so the
package (and ``tests/``, whose helper functions engines import by name) is put there for the start."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

TESTS = str(Path(__file__).resolve().parent)
ROOT = str(Path(__file__).resolve().parent.parent)
REAP_SECONDS = 20


def children() -> set:
    """This process's descendants, less multiprocessing's resource tracker: spawning Dask's workers starts
    one per parent process, and it lives (idle) until that process exits, by design."""
    import psutil

    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(proc.cmdline()):
                out.add(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return out


@contextlib.contextmanager
def cluster_processes() -> Iterator[None]:
    """Start a cluster inside this: engines import this checkout, ``PYTHONPATH`` is restored after, and
    every process started inside is waited for (bounded), killed if still there, and fails the test."""
    import psutil

    before = children()
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS, env_path) if p)
    try:
        yield
    finally:
        os.environ["PYTHONPATH"] = env_path
        deadline = time.monotonic() + REAP_SECONDS
        while children() - before and time.monotonic() < deadline:
            time.sleep(0.2)
        left = children() - before
        for pid in left:  # only processes started inside
            psutil.Process(pid).kill()
        assert not left, f"cluster left processes behind: {left}"


def import_package() -> str:
    """On an engine: import torch and this package (so time limits measure our calls, not imports) and
    say which copy of the package it found."""
    import torch  # noqa: F401

    import torchgpu_magic

    return torchgpu_magic.__file__
