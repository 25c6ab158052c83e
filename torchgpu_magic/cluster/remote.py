"""What runs on each engine or worker: small functions that return plain data (``to_dict()`` results,
numbers, strings), never live objects, so nothing of the engine's torch state travels back.

:func:`call` is the one entry the bridge ships; it reports the engine's host and PID, says so plainly when
torch or a function fails, and finds the function by name so that the bridge sends only a dotted path.
The engine's namespace (for ``%whereis`` and ``%%cudatime``) is the IPython shell's user namespace on an
ipyparallel engine and ``__main__`` on a Dask worker.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Optional

from ..devices import LOCAL_RANK_VARS, ORDER_VAR


def call(target: str, args: tuple, kwargs: dict) -> dict:
    """Run ``remote.<target>(*args, **kwargs)`` here; ``{'ok', 'value' | 'problem', 'message', 'host',
    'pid'}``. Never raises: a failure is data the notebook shows in this engine's row."""
    out: dict = {"host": socket.gethostname(), "pid": os.getpid(), "ok": False}
    try:
        import torch  # noqa: F401 - every function here needs it; say so once, plainly
    except ImportError as exc:
        out.update(problem="no_torch", message=f"{type(exc).__name__}: {exc}")
        return out
    func = globals().get(target)
    if target.startswith("_") or not callable(func) or target == "call":
        out.update(problem="error", message=f"no engine function {target!r} (this engine's torchgpu_magic "
                                            "is another version?)")
        return out
    try:
        out.update(ok=True, value=func(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the notebook shows it in this engine's row
        out.update(problem="error", message=f"{type(exc).__name__}: {exc}")
    return out


def namespace() -> dict:
    """The engine's user namespace: IPython's on an ipyparallel engine, else ``__main__``'s."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        return shell.user_ns
    return vars(sys.modules["__main__"])


def ping() -> dict:
    """Nothing but the envelope: the bare round trip the benchmarks compare with."""
    return {}


def gpuinfo(show_processes: bool = True) -> dict:
    """This engine's ``%gpuinfo`` report as data, plus what a cluster view needs besides: the GPUs its
    PID uses (from NVML's process lists), torch's current CUDA device, the local-rank variables."""
    import torch

    from .. import __version__
    from ..gpus import inventory

    report = inventory.build_report(show_processes=True)
    pid = os.getpid()
    using = [g.nvml_index for g in report.gpus if any(p.pid == pid for p in g.processes)]
    current = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        current = torch.cuda.current_device()
    data = report.to_dict()
    if not show_processes:
        for gpu in data["gpus"]:
            gpu["processes"] = []
    data.update(using=using, current_device=current, package=__version__,
                local_rank={name: os.environ[name] for name in LOCAL_RANK_VARS if name in os.environ})
    return data


def whereis(names: Optional[list] = None) -> dict:
    """Where each tensor / module / optimizer of the engine's namespace lives (or only ``names``):
    ``{name: {'kind', 'devices', 'summary'}}``, plus ``missing`` for names not found."""
    from .. import placement

    ns = namespace()
    missing = []
    if names:
        found = {}
        for name in names:
            try:
                obj = placement.resolve(name, ns)
            except Exception as exc:  # noqa: BLE001 - a name this engine lacks is a row, not a failure
                missing.append(f"{name} ({exc})")
                continue
            found[name] = {"kind": placement.kind_of(obj) or type(obj).__name__,
                           "devices": list(placement.devices_of(obj)),
                           "summary": placement.placement_line(obj)}
        return {"names": found, "missing": missing}
    snap = placement.namespace_snapshot(ns)
    return {"names": {name: {"kind": p.kind, "devices": list(p.devices), "summary": p.summary}
                      for name, p in snap.items()}, "missing": missing}


def cudatime(setup: str, body: str, options: dict, device: Optional[str] = None) -> dict:
    """``%%cudatime`` of ``body`` (after ``setup``) in the engine's namespace, as
    ``TimingResult.to_dict()``. The source is transformed by the engine's IPython where there is one."""
    from .. import devices, timing

    ns = namespace()
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        setup = shell.transform_cell(setup) if setup.strip() else ""
        body = shell.transform_cell(body)
    opts = timing.Options(**options)
    target = devices.resolve(device) if device else timing.timing_device()
    compiled = timing.compile_cell(body, ns, setup, "<cudatime --cluster>")
    return timing.time_cell(compiled, target, opts, show_output=False, follow_cuda=device is None).to_dict()


def memory_sample(peaks: bool = False) -> dict:
    """One memory sample of this engine: ``MemorySnapshot.to_dict()`` over the GPUs torch uses here
    (all NVML sees when CUDA is not initialised); with ``peaks``, also :func:`cell_peaks` (which resets
    them) under ``'cell_peaks'``, so that a tick after a notebook cell is still one call per engine."""
    from .. import memory
    from ..gpus import inventory, nvml

    targets = []
    if memory.cuda_state() == "initialised":
        targets = memory.targets_from(inventory.gpu_map())
    elif nvml.status() is None:
        targets = [memory.GPUTarget(None, i, str(nvml.gpu_snapshot(i, identity_only=True).name))
                   for i in range(nvml.device_count())]
    sample = memory.collect(targets).to_dict()
    if peaks:
        sample["cell_peaks"] = cell_peaks()
    return sample


def cell_peaks(reset: bool = True) -> dict:
    """The peaks since the last call (a notebook cell): torch's peak allocated bytes per CUDA device
    and the process's peak RSS; reset afterwards so the next call sees the next cell only."""
    import torch

    from .. import memory

    gpus = {}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            gpus[f"cuda:{index}"] = int(torch.cuda.max_memory_allocated(index))
            if reset:
                torch.cuda.reset_peak_memory_stats(index)
    rss = memory.peak_rss()
    if reset:
        memory.reset_peak_rss()
    return {"gpus": gpus, "peak_rss": rss}


def local_device(orders: Optional[dict] = None) -> dict:
    """What ``%%ontorch local`` picks on this engine, and how. ``orders`` maps 'host:pid' to an engine's
    position among the engines on its host (worked out by the notebook); this engine's is kept in
    ``TORCHGPU_MAGIC_LOCAL_RANK`` for later ``local`` specs when no launcher variable names its rank."""
    from .. import devices

    order = (orders or {}).get(f"{socket.gethostname()}:{os.getpid()}")
    if order is not None and not any(name in os.environ for name in LOCAL_RANK_VARS):
        os.environ[ORDER_VAR] = str(order)
    device, how = devices.local_device()
    return {"device": str(device), "how": how}
