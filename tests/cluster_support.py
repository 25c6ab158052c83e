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


def gpuinfo_here() -> tuple:
    """On an engine: whether torch sees a CUDA GPU there, and the first cause %gpuinfo gives there
    (message, fix; None where it gives none). The engines are processes of their own on this machine,
    which a simulated machine (it lives in the test process) does not reach."""
    import torch

    from torchgpu_magic.gpus.inventory import build_report

    diagnosis = build_report(show_processes=False).diagnosis
    first = (diagnosis[0].message, diagnosis[0].fix) if diagnosis else None
    return bool(torch.cuda.is_available()), first


def threads() -> set:
    """The idents of this process's live threads."""
    import threading

    return {t.ident for t in threading.enumerate()}


POOLS = ("Dask-Offload", "asyncio_")
"""Threads of a library's own pool, started on first use and kept by design: distributed's offload
executor (one thread per process) and the default executor of Dask's event loop (which in-process workers
use for name lookups), both kept while their loop lives: not ours, not one per call."""


def settle_threads(before: set, seconds: float = 10.0) -> list:
    """Wait (bounded) until no thread beyond ``before`` is alive (pool threads of :data:`POOLS` aside);
    the names of those still there."""
    import threading

    def extra() -> list:
        return [t.name for t in threading.enumerate()
                if t.ident not in before and not t.name.startswith(POOLS)]

    deadline = time.monotonic() + seconds
    while extra() and time.monotonic() < deadline:
        time.sleep(0.1)
    return extra()


@contextlib.contextmanager
def kernel() -> Iterator[tuple]:
    """A real IPython kernel running this Python, with this checkout importable (``PYTHONPATH``
    inherited): ``(KernelManager, client)``; shut down after, with its process gone."""
    import json
    import sys
    import tempfile

    from jupyter_client import KernelManager

    with tempfile.TemporaryDirectory(prefix="tgm-kernel-") as tmp:
        spec = Path(tmp, "kernels", "tgm-cluster-test")
        spec.mkdir(parents=True)
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "torchgpu_magic test", "language": "python"}))
        saved = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (tmp, saved) if p)
        manager = KernelManager(kernel_name="tgm-cluster-test")
        try:
            manager.start_kernel()
            client = manager.client()
            client.start_channels()
            try:
                client.wait_for_ready(timeout=120)
                yield manager, client
            finally:
                client.stop_channels()
        finally:
            manager.shutdown_kernel(now=True)
            if saved is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = saved


def execute(client, code: str, timeout: float = 120.0, msg_id: str = "") -> list:
    """Run ``code`` in the kernel (or, with ``msg_id``, collect a run already sent) and return its
    iopub outputs (stream, display, result, error contents, each with its ``msg_type``) once idle."""
    import queue

    msg_id = msg_id or client.execute(code)
    outputs = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no answer from the kernel in {timeout} s to {code!r}") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            return outputs
        if kind in ("stream", "display_data", "execute_result", "error"):
            outputs.append({"msg_type": kind, **msg["content"]})


def errors(outputs: list) -> list:
    return [o for o in outputs if o["msg_type"] == "error"]
