"""The magics beyond one machine: the bridge to the ipyparallel engines or Dask workers users already run.

- :mod:`.bridge`: what the adapters share: one :class:`Reply` per engine, failures classified with their
  fix, the one-line :class:`ClusterGone` and :class:`ClusterInterrupted`.
- :mod:`.ipp_bridge`, :mod:`.dask_bridge`: run one engine-side function on every engine at once and
  gather plain data under a deadline, without queueing behind busy engines or waiting for hung ones.
- :mod:`.find`: the user's cluster object by name, or the one in the namespace; what a shell's bridges
  keep between calls (:class:`Kept`).
- :mod:`.remote`: the functions that run on the engines (imported there by name); :mod:`.dask_worker`:
  what runs them on a Dask worker (a thread per call, a deadline, interrupts).
- :mod:`.gpus`, :mod:`.timing`, :mod:`.placement`, :mod:`.memory`: the cluster-wide reports.

The functions here are what the magics call: each runs one engine function everywhere and builds its
report. ipyparallel and distributed are imported only when a cluster object of theirs is used.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from ..render import Report, Reportable, Table
from . import gpus, placement
from .bridge import DEFAULT_TIMEOUT, PROBLEMS, Bridge, ClusterGone, ClusterInterrupted, Reply
from .dask_bridge import DaskBridge
from .find import Kept, candidates, close_clients, connect, kind_of
from .ipp_bridge import IPyParallelBridge

__all__ = [
    "DEFAULT_TIMEOUT", "PROBLEMS", "Bridge", "ClusterGone", "ClusterInterrupted", "DaskBridge",
    "IPyParallelBridge", "Kept", "LocalAssignment", "Reply", "candidates", "close_clients", "connect",
    "gpu_report", "kind_of", "local_devices", "placement_report", "time_cell",
]


def gpu_report(bridge: Bridge, show_processes: bool = True, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """``%gpuinfo --cluster``: a :class:`~.gpus.ClusterGPUReport` over every engine."""
    return gpus.build(bridge.name, bridge.kind, bridge.run("gpuinfo", show_processes, timeout=timeout))


def placement_report(bridge: Bridge, names: Optional[Sequence[str]] = None,
                     timeout: float = DEFAULT_TIMEOUT) -> Any:
    """``%whereis --cluster [NAME...]``: a :class:`~.placement.ClusterPlacement` merged by name."""
    return placement.build(bridge.run("whereis", list(names or []), timeout=timeout))


def time_cell(bridge: Bridge, setup: str, body: str, options: dict, device: Optional[str] = None,
              timeout: Optional[float] = None) -> Any:
    """``%%cudatime --cluster``: the cell timed on every engine at once; a
    :class:`~.timing.ClusterTiming`. Without ``timeout``, the cell's own ``max_time`` plus a margin
    for warm-up and the first run."""
    from . import timing

    limit = timeout if timeout is not None else DEFAULT_TIMEOUT + 2 * float(options.get("max_time") or 10.0)
    return timing.build(bridge.run("cudatime", setup, body, options, device, timeout=limit))


class LocalAssignment(Reportable):
    """``%ontorch local --cluster``: what ``local`` means on each engine, and how it was chosen."""

    def __init__(self, rows: list) -> None:
        self.rows = rows  # [(label, host, device or '-', how or problem)]

    def report(self) -> Report:
        return Report([Table(["engine", "host", "local device", "how"], list(self.rows), align="llll",
                             title="%ontorch local on each engine")])

    def to_dict(self) -> dict:
        return {"rows": [dict(zip(("engine", "host", "device", "how"), row)) for row in self.rows]}


def local_devices(bridge: Bridge, timeout: float = DEFAULT_TIMEOUT) -> LocalAssignment:
    """Give each engine its order among the engines on its host (for engines no launcher gave a local
    rank) and report what ``local`` picks on each."""
    orders: dict = {}
    seen: Counter = Counter()
    for reply in bridge.run("ping", timeout=timeout):
        if reply.ok:
            orders[f"{reply.host}:{reply.pid}"] = seen[reply.host]
            seen[reply.host] += 1
    return LocalAssignment([(r.engine, r.host, r.value["device"], r.value["how"]) if r.ok
                            else (r.engine, r.host or "-", "-", r.error_text())
                            for r in bridge.run("local_device", orders, timeout=timeout)])
