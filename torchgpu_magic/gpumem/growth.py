"""Memory that grows cell after cell: the re-run leak (PyTorch issue 22684, "Memory leak in Jupyter Nb
when re-executing the same cell"). When the per-cell records show a device's memory growing over
:data:`RUNS` consecutive runs of the same cell, say which names grew and by how much, once.

To name what grew, the bytes each user name holds (with the autograd graph it keeps) are read after a
run of the same cell that grew, from the second run on, through :func:`~.holders.collect`; a cell that
does not grow, or a new cell, costs nothing but a hash of its text. Holds names and numbers only.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..holders.holdings import collect
from ..render import fmt_bytes

RUNS = 3  # consecutive runs of one cell that each grew, before the warning
MIN_GROWTH = 1024 * 1024  # what one run must add to a device to count as growing (RSS moves by pages)
NAMES_SHOWN = 3


def _growth(record: Any) -> dict:
    """{device: bytes} a record's cell added: host RSS as 'cpu', each GPU's allocated bytes."""
    out = {}
    if record.rss_delta is not None:
        out["cpu"] = record.rss_delta
    for gpu in record.gpus:
        out[gpu.label] = gpu.delta
    return out


def name_bytes(ns: Mapping[str, Any]) -> dict:
    """{name: {device: bytes}} of every user name: what it reaches (storages an earlier name also holds
    included), with the autograd graph it holds."""
    holdings = collect(ns, tracebacks=())
    out: dict = {}
    for h in holdings.holders:
        if h.source not in ("name", "graph"):
            continue
        mine = out.setdefault(h.root, {})
        for table in (h.counted, h.shared):
            for device, value in (table or {}).items():
                size = sum(value.values()) if isinstance(value, dict) else value
                mine[device] = mine.get(device, 0) + size
    return out


class GrowthWatch:
    """Fed each cell's record and text (:meth:`observe`); answers a warning line when the same cell has
    grown a device's memory :data:`RUNS` runs in a row, naming the names that grew, once per streak."""

    def __init__(self) -> None:
        self._cell: Optional[int] = None
        self._streak = 0
        self._devices: dict = {}  # device -> bytes grown over the streak
        self._first: Optional[dict] = None  # name_bytes after the streak's first repeated run
        self._warned = False

    def observe(self, record: Any, source: str, ns: Mapping[str, Any]) -> Optional[str]:
        """The warning for this cell's record, or None."""
        cell = hash(source.strip())
        grew = {d: b for d, b in _growth(record).items() if b is not None and b >= MIN_GROWTH}
        if cell != self._cell or not grew:
            self._cell, self._streak, self._devices, self._first, self._warned = cell, 0, {}, None, False
            if grew and source.strip():  # a first run: count it, snapshot from the next one on
                self._streak, self._devices = 1, dict(grew)
            return None
        self._streak += 1
        for device, size in grew.items():
            self._devices[device] = self._devices.get(device, 0) + size
        if self._warned:
            return None
        now = name_bytes(ns)
        if self._first is None:
            self._first = now
            return None
        if self._streak < RUNS:
            return None
        self._warned = True
        return self._line(record, now)

    def _line(self, record: Any, now: dict) -> str:
        cell = "" if record.number is None else f"In[{record.number}] "
        devices = ", ".join(f"{d} +{fmt_bytes(b)}" for d, b in self._devices.items())
        deltas = ((sum(by_device.values()) - sum(self._first.get(name, {}).values()), name)
                  for name, by_device in now.items())
        grown = sorted((pair for pair in deltas if pair[0] > 0), reverse=True)
        runs = f"{self._streak} runs in a row"
        if not grown:
            names = ("no name grew: something else keeps a reference each run (%gpumem holders shows who "
                     "holds the memory)")
        else:
            shown = ", ".join(f"{name} +{fmt_bytes(delta)}" for delta, name in grown[:NAMES_SHOWN])
            more = f" and {len(grown) - NAMES_SHOWN} more" if len(grown) > NAMES_SHOWN else ""
            names = f"names that grew since the second run: {shown}{more}"
        return f"[gpumem] {cell}memory grew on each of {runs} of this cell ({devices}); {names}"
