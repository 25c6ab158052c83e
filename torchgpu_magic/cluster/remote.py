"""What runs on each engine or worker: small functions that return plain data (``to_dict()`` results,
numbers, strings), never live objects, so nothing of the engine's torch state travels back.

:func:`call` is the one entry (ipyparallel gets it as an :class:`Entry` object, by reference; a Dask
worker runs it through :func:`.dask_worker.dask_call`, in a thread under a deadline); it reports the
engine's host and PID, says so plainly when torch or a function fails, and finds the function by name,
so that only the name and the arguments travel.
The engine's namespace (for ``%whereis`` and ``%%cudatime``) is the IPython shell's user namespace on an
ipyparallel engine and ``__main__`` on a Dask worker.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any, Optional

from ..caches import table
from ..devices import LOCAL_RANK_VARS, ORDER_VAR


def call(target: str, args: tuple, kwargs: dict) -> dict:
    """Run ``remote.<target>(*args, **kwargs)`` here; ``{'ok', 'value' | 'problem', 'message', 'host',
    'pid', 'cpus', 'threads'}``. Never raises: a failure is data the notebook shows in this engine's row.
    ``cpus`` (the CPUs this process may run on) and ``threads`` (torch's intra-op threads) let the
    notebook see a host whose engines share too few cores."""
    out: dict = {"host": socket.gethostname(), "pid": os.getpid(), "ok": False, "cpus": _cpus()}
    try:
        import torch
    except ImportError as exc:
        out.update(problem="no_torch", message=f"{type(exc).__name__}: {exc}")
        return out
    out["threads"] = torch.get_num_threads()
    func = globals().get(target)
    if target.startswith("_") or not callable(func) or target in _NOT_TARGETS:
        out.update(problem="error", message=f"no engine function {target!r} (this engine's torchgpu_magic "
                                            "is another version?)")
        return out
    try:
        out.update(ok=True, value=func(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the notebook shows it in this engine's row
        out.update(problem="error", message=f"{type(exc).__name__}: {exc}")
    return out


class Entry:
    """:func:`call` as an object, for ipyparallel: it ships a plain function (or a partial of one) by
    value, its code serialised for every engine at every call (some 2.4 KB), but an instance of a class
    by reference (this module and the class name, some 70 bytes)."""

    __slots__ = ()

    def __call__(self, target: str, args: tuple, kwargs: dict) -> dict:
        return call(target, args, kwargs)


def _cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


CONTEXT = threading.local()  # .worker: the Dask worker the call in this thread runs for (dask_worker)


_NOT_TARGETS = ("call", "Entry", "table")  # callable, but not engine functions


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
    from .. import __version__, accelerators
    from ..gpus import inventory

    report = inventory.build_report(show_processes=True)
    pid = os.getpid()
    using = [g.nvml_index for g in report.gpus if any(p.pid == pid for p in g.processes)]
    current = accelerators.current_index("cuda") if accelerators.cuda_state() == "initialised" else None
    data = report.to_dict()
    if not show_processes:
        for gpu in data["gpus"]:
            gpu["processes"] = []
    data.update(using=using, current_device=current, package=__version__, dist=_dist(),
                local_rank={name: os.environ[name] for name in LOCAL_RANK_VARS if name in os.environ})
    return data


def _dist() -> Optional[dict]:
    """This engine's torch.distributed process group (rank, world size, backend), None without one."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "backend": str(dist.get_backend())}
    except Exception:  # noqa: BLE001 - a group being torn down: no rank to show
        return None


def whereis(names: Optional[list] = None) -> dict:
    """Where each tensor / module / optimizer of the engine's namespace lives (or only ``names``):
    ``{name: {'kind', 'devices', 'summary'}}``, plus ``missing`` for names not found."""
    from .. import placement

    ns = namespace()
    found: dict = {}
    objects: dict = {}
    missing = []
    if names:
        for name in names:
            try:
                objects[name] = placement.resolve(name, ns)
            except Exception as exc:  # noqa: BLE001 - a name this engine lacks is a row, not a failure
                missing.append(f"{name} ({exc})")
    else:
        found = {name: {"kind": p.kind, "devices": list(p.devices), "summary": p.summary}
                 for name, p in placement.namespace_snapshot(ns).items()}
        objects = {f"dask result {key}": obj for key, obj in _results() if placement.kind_of(obj)}
    for name, obj in objects.items():
        found[name] = {"kind": placement.kind_of(obj) or type(obj).__name__,
                       "devices": list(placement.devices_of(obj)), "summary": placement.placement_line(obj)}
    return {"names": found, "missing": missing}


def _results() -> list:
    """On a Dask worker: ``(key, value)`` of the task results it holds in memory (``worker.data``; the
    spilled ones stay on disk, unread), which hold tensors no name in ``__main__`` shows."""
    data = getattr(getattr(CONTEXT, "worker", None), "data", None)  # None off a Dask worker
    data = getattr(data, "fast", data)  # a SpillBuffer's in-memory part
    try:
        return list(data.items()) if data is not None else []
    except Exception:  # noqa: BLE001 - the store changed under us: the next call sees it
        return []


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


def memory_tick(reporters: Optional[dict] = None, cells: Optional[list] = None) -> dict:
    """One compact memory sample of this engine for ``%gpumem --cluster`` (a few hundred bytes):

    - ``rss``: the process's resident memory;
    - ``torch``: ``[[torch index, GPU UUID, allocated, reserved]]`` for the GPUs torch uses here (the
      current one, and any where its allocator holds memory); empty before CUDA is initialised;
    - ``gpus``: ``[[NVML index, UUID, name, used, total, utilisation %, {pid: bytes}]]`` for every GPU of
      this host, only from the engine the notebook picked to report its host (``reporters[host] ==
      pid``; every engine of a host not in ``reporters``), so a host's GPUs travel once per tick
      however many engines it runs;
    - ``cells`` is ``[panel token, number of notebook cells ended]``: when cells ended since this engine
      last said, ``cell_peaks`` (:func:`cell_peaks`, which resets them) and ``cells_from``, the count it
      last reported at: its peaks cover the cells after that one. An engine busy through several cells
      reports them all at once when it answers again.
    """
    from ..host import host_memory

    host = host_memory()
    out: dict = {"rss": host.rss if host is not None else None, "torch": _torch_devices()}
    monitored = _monitored(getattr(CONTEXT, "worker", None))
    if monitored:
        out["gpus"] = monitored
    elif reporters is None or reporters.get(socket.gethostname(), os.getpid()) == os.getpid():
        out["gpus"] = _host_gpus()
    if cells is not None:
        _cells(out, *cells)
    return out


def host_tick(pids: Optional[dict] = None) -> dict:
    """What one engine can say for its whole host without the other engines' help (so a busy engine's
    row stays current, and a host costs one call per tick however many engines it runs): ``gpus`` as in
    :func:`memory_tick` (each GPU's processes with their GPU memory), and ``rss``: ``{pid: resident
    bytes}`` for this host's engines in ``pids`` (``{host: [pid, ...]}``), read from the OS."""
    import psutil

    rss: dict = {}
    for pid in (pids or {}).get(socket.gethostname(), [os.getpid()]):
        try:
            rss[pid] = psutil.Process(pid).memory_info().rss
        except (psutil.Error, OSError):
            rss[pid] = None
    return {"gpus": _monitored(getattr(CONTEXT, "worker", None)) or _host_gpus(), "rss": rss}


_PANEL: dict = {"token": None, "seq": 0}  # the live panel's token and the cell count last reported


def _cells(out: dict, token: str, seq: int) -> None:
    if _PANEL["token"] != token:  # a new panel: its cells start now (or, busy until now, at its start)
        _PANEL.update(token=token, seq=0)
        if not seq:
            cell_peaks()
            return
    if seq > _PANEL["seq"]:
        out["cell_peaks"], out["cells_from"] = cell_peaks(), _PANEL["seq"]
        _PANEL["seq"] = seq


_UUIDS = table()  # torch index -> UUID (a device's never changes in a process)
_IDENTITY = table()  # NVML index -> (UUID, name)


def _torch_devices() -> list:
    from ..accelerators import initialised_cuda

    cuda = initialised_cuda()
    if cuda is None:
        return []
    rows = []
    current = cuda.current_device()
    for index in range(cuda.device_count()):
        reserved = int(cuda.memory_reserved(index))
        if reserved or index == current:
            if index not in _UUIDS:
                _UUIDS[index] = str(getattr(cuda.get_device_properties(index), "uuid", "") or "")
            rows.append([index, _UUIDS[index], int(cuda.memory_allocated(index)), reserved])
    return rows


def _monitored(worker: Any) -> Optional[list]:
    """A Dask worker's GPU as distributed's own NVML monitoring reads it (the figures its heartbeats
    carry: memory used and total, utilisation), in :func:`memory_tick`'s row shape; None where that
    monitoring is off (no pynvml, or ``distributed.diagnostics.nvml: False``)."""
    monitor = getattr(worker, "monitor", None)
    if not getattr(monitor, "gpu_name", None):
        return None
    quantities = getattr(monitor, "quantities", {})
    used, util = ((quantities.get(name) or [None])[-1] for name in ("gpu_memory_used", "gpu_utilization"))
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    index, uuid = (int(first), None) if first.isdigit() else (0, first)
    return [[index, uuid, monitor.gpu_name, used, monitor.gpu_memory_total, util, {os.getpid(): None}]]


def _host_gpus() -> list:
    from ..gpus import nvml
    from ..render import is_na

    def plain(value: Any) -> Any:
        return None if is_na(value) else value

    if nvml.status() is not None:
        return []
    rows = []
    for index in range(nvml.device_count()):
        if index not in _IDENTITY:
            snap = nvml.gpu_snapshot(index, identity_only=True)
            _IDENTITY[index] = (plain(snap.uuid), plain(snap.name))
        uuid, name = _IDENTITY[index]
        used, total = nvml.memory(index)
        procs, _ = nvml.processes(index)
        rows.append([index, uuid, name, plain(used), plain(total), plain(nvml.utilization(index)),
                     {p.pid: plain(p.used_memory) for p in procs}])
    return rows


def cell_peaks() -> dict:
    """The peaks since the last call (a notebook cell): torch's peak allocated bytes per accelerator
    device (where torch keeps one) and the process's peak RSS; reset afterwards so the next call sees
    the next cell only."""
    from .. import accelerators, host

    gpus = {}
    for kind in accelerators.initialised_kinds():
        for index in range(accelerators.device_count(kind)):
            peak = accelerators.peak((kind, index))
            if peak is not None:
                gpus[f"{kind}:{index}"] = int(peak)
                accelerators.reset_peak((kind, index))
    rss = host.peak_rss()
    host.reset_peak_rss()
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
