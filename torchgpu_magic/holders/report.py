"""``%gpumem holders``' report, and the "who holds it" part of the out-of-memory explanation: per device,
every holder :func:`torchgpu_magic.holders.holdings.collect` found with bytes there, largest first, beside
torch's cache (reserved but unallocated, and whether it is fragmented), the other processes on the device,
and what no name reaches (allocated, or on the cpu the process's RSS, beyond what the holders count).

A storage is counted once, under the first holder reaching it; the others that hold it too are named in
brackets: ``x (also y, Out[3])``. Reports hold names, strings and numbers.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Optional

from ..host import gc_paused
from ..render import LinesReport, Table, fmt_bytes, html_lines
from . import devicestate
from .holdings import collect

TOP = 15  # rows shown per device; the rest in one line
ALSO = 2  # other holders named beside one
_ROLE_WORDS = {"parameter": "parameters", "buffer": "buffers", "gradient": "gradients", "state": "state",
               "step": "step counters", "saved": "saved for backward", "tensor": "data"}
_HELD_BY = {"name": "your name", "output": "output history", "traceback": "the failed cell's traceback",
            "graph": "an autograd graph", "cache": "torch's allocator", "process": "another process",
            "rest": "-"}
# The cache is fragmented when its largest free block is below this share of its free total.
FRAGMENTED = 0.5


class Row(NamedTuple):
    """One holder on one device: its name, where it holds from (``source``), the bytes counted under it,
    what it is (a tensor's (dtype, shape) until shown: :func:`what_text`), those bytes by role, and the
    other holders of the same storages."""

    name: str
    source: str
    nbytes: int
    what: Any
    parts: dict
    also: tuple = ()

    def label(self) -> str:
        """'x (also y, Out[3])'."""
        if not self.also:
            return self.name
        shown = list(self.also[:ALSO]) + ([f"{len(self.also) - ALSO} more"] if len(self.also) > ALSO else [])
        return f"{self.name} (also {', '.join(shown)})"

    def description(self) -> str:
        """What it is, with its bytes by role when it holds more than one kind: 'Sequential: parameters
        4.00 MiB, gradients 4.00 MiB'."""
        what = what_text(self.what)
        parts = {r: b for r, b in self.parts.items() if b}
        if len(parts) < 2 and set(parts) <= {"tensor", "saved"}:
            return what
        spelled = ", ".join(f"{_ROLE_WORDS.get(r, r)} {fmt_bytes(b)}" for r, b in parts.items())
        return f"{what}: {spelled}" if what else spelled

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "bytes": self.nbytes, "what": what_text(self.what),
                "parts": dict(self.parts), "also": list(self.also)}


def what_text(what: Any) -> str:
    """A holder's description as text: a tensor's (dtype, shape) as 'tensor float32 (4, 8)'."""
    if isinstance(what, tuple):
        from ..placement import dtype_str, shape_str

        return f"tensor {dtype_str(what[0])} {shape_str(tuple(what[1]))}"
    return what


@dataclass(repr=False)
class DeviceHolders(LinesReport):
    """Who holds memory on one device: ``rows`` largest first (the holders, torch's cache, other
    processes; what no name reaches last), ``counted`` the bytes the holders reach there, ``state`` the
    device read live, ``cut`` what the walks left out."""

    device: str
    rows: list
    counted: int
    state: devicestate.DeviceState
    cut: list = field(default_factory=list)
    top: int = TOP

    def headline(self) -> str:
        named = [r for r in self.rows if r.source in _NAMED]
        n = len(named)
        head = (f"{self.device}: {fmt_bytes(self.counted)} held by {n} holder{'s' if n != 1 else ''} "
                "(each storage counted once)")
        return head + (f"; {self.live()}" if self.live() else "")

    def live(self) -> str:
        """The device now: 'this process 3.1 GiB RSS, 12.4 GiB of 15.6 GiB available' on cpu; 'allocated
        8.0 GiB, reserved 10 GiB, 1.2 GiB free of 80 GiB' on a GPU."""
        s = self.state
        if s.kind == "cpu":
            if s.process is None:
                return ""
            return (f"this process {fmt_bytes(s.process)} RSS, {fmt_bytes(s.free)} of {fmt_bytes(s.total)} "
                    "available")
        parts = []
        if s.allocated is not None:
            parts.append(f"allocated {fmt_bytes(s.allocated)}, reserved {fmt_bytes(s.reserved)}")
        if s.free is not None:
            parts.append(f"{fmt_bytes(s.free)} free of {fmt_bytes(s.total)}")
        return ", ".join(parts)

    def table(self) -> Table:
        table = Table(["holder", "bytes", "what", "held by"], align="lrll")
        shown = self.rows if self.top is None else self.rows[: self.top]
        for row in shown:
            table.add(row.label(), fmt_bytes(row.nbytes), row.description(), _HELD_BY.get(row.source, ""))
        rest = self.rows[len(shown):]
        if rest:
            table.add(f"... and {len(rest):,} more", fmt_bytes(sum(r.nbytes for r in rest)), "", "")
        return table

    def notes(self) -> list:
        lines = list(self.state.notes)
        if self.cut:
            shown = "; ".join(f"{name} ({why})" for name, why in self.cut[:3])
            lines.append(f"Not looked into: {shown}" + (f"; and {len(self.cut) - 3} more" if len(self.cut) > 3
                                                        else ""))
        return lines

    def lines(self) -> list:
        return [self.headline()] + self.table().to_text(indent="  ").splitlines() + self.notes()

    def _repr_html_(self) -> str:
        return (f"<div><b>{html.escape(self.headline())}</b>" + self.table().to_html()
                + html_lines(self.notes()) + "</div>")

    def to_dict(self) -> dict:
        return {"device": self.device, "counted": self.counted, "rows": [r.to_dict() for r in self.rows],
                "state": self.state.to_dict(), "cut": [list(c) for c in self.cut]}


@dataclass(repr=False)
class HoldersReport:
    """``%gpumem holders``: a :class:`DeviceHolders` per device (``-o`` returns this; ``to_dict()``)."""

    devices: list

    def section(self, device: str) -> Optional[DeviceHolders]:
        return next((d for d in self.devices if d.device == device), None)

    def to_text(self) -> str:
        if not self.devices:
            return "%gpumem holders: no tensor, module or optimizer holds memory on any device"
        return "\n\n".join(d.to_text() for d in self.devices)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        if not self.devices:
            return html_lines([self.to_text()])
        return "".join(d._repr_html_() for d in self.devices)

    def to_dict(self) -> dict:
        return {"devices": [d.to_dict() for d in self.devices]}


_NAMED = ("name", "output", "traceback", "graph")


def holders_report(ns: Mapping[str, Any], device: Optional[str] = None, tracebacks: Iterable[Any] = (),
                   top: Optional[int] = TOP) -> HoldersReport:
    """``%gpumem holders [DEVICE]``: who holds memory on ``device``, or on every device where the holders
    reach memory or torch has allocated some (CUDA GPUs, once CUDA is initialised). Reads only."""
    with gc_paused():
        holdings = collect(ns, tracebacks)
        devices = [device] if device is not None else _devices_in_use(holdings)
        return HoldersReport([device_holders(holdings, d, top=top) for d in devices])


def _devices_in_use(holdings: Any) -> list:
    """The devices the holders reach, and every CUDA GPU where torch has memory allocated."""
    from ..accelerators import initialised_cuda
    from ..placement.kinds import device_order

    found = set(holdings.devices())
    cuda = initialised_cuda()
    if cuda is not None:
        try:
            found.update(f"cuda:{i}" for i in range(cuda.device_count()) if cuda.memory_allocated(i))
        except Exception:  # noqa: BLE001 - a lost GPU: the ones the holders reach are still listed
            pass
    return sorted(found, key=device_order)


def device_holders(holdings: Any, device: str, state: Optional[devicestate.DeviceState] = None,
                   top: Optional[int] = TOP) -> DeviceHolders:
    """The :class:`DeviceHolders` of ``device`` from :func:`~.holders.collect`'s holdings; ``state`` is
    read live when not given."""
    state = devicestate.read(device) if state is None else state
    also: dict = {}
    counted = 0
    names = [None if h.library else h.name for h in holdings.holders]  # torch's frames: never 'also'

    more = holdings.more
    for key, (where, size, first, _) in holdings.storages.items():
        if where != device:
            continue
        counted += size
        others = more.get(key)
        if others:
            listed = also.setdefault(first, [])
            listed.extend(names[i] for i in others if names[i] is not None and names[i] not in listed)
    rows = []
    for h in holdings.holders:
        roles = h.counted.get(device) if h.counted else None
        if roles:
            rows.append(Row(h.name, h.source, sum(roles.values()), h._what, roles,
                            tuple(also.get(h.index, ()))))
    rows.extend(_device_rows(state))
    rows.sort(key=lambda r: -r.nbytes)
    rest = _rest(state, counted)
    if rest is not None:
        rows.append(rest)
    return DeviceHolders(state.device, rows, counted, state, list(holdings.cut), top)


def fragmented(state: devicestate.DeviceState, asked: Optional[int] = None) -> bool:
    """Whether torch's cache on the device is fragmented: its largest free block is far below its free
    total (under :data:`FRAGMENTED` of it), or below ``asked`` while the total would hold it."""
    cache, largest = state.cache, state.largest_free_block
    if not cache or largest is None:
        return False
    if asked is not None and largest < asked <= cache:
        return True
    return largest < FRAGMENTED * cache


def _device_rows(state: devicestate.DeviceState) -> list:
    """Torch's cache and the other processes on a GPU, as rows."""
    rows = []
    cache = state.cache
    if cache:
        what = f"reserved {fmt_bytes(state.reserved)} - allocated {fmt_bytes(state.allocated)}"
        if state.largest_free_block is not None:
            what += f"; largest free block {fmt_bytes(state.largest_free_block)}"
            if fragmented(state):
                what += " (fragmented)"
        rows.append(Row("torch's cache", "cache", cache, what, {}))
    for pid, name, size in state.others:
        rows.append(Row(f"pid {pid}" + (f" {name}" if name else ""), "process", size, "NVML", {}))
    return rows


def _rest(state: devicestate.DeviceState, counted: int) -> Optional[Row]:
    """What the device holds for this process beyond the holders: allocated memory no name reaches (a
    GPU), or the rest of the process's RSS (cpu: Python objects, libraries, tensors no name reaches)."""
    if state.kind == "cpu":
        if state.process is None or state.process <= counted:
            return None
        return Row("the rest of this process", "rest", state.process - counted,
                   "Python, libraries, and memory no name here reaches", {})
    if state.allocated is None or state.allocated <= counted:
        return None
    return Row("no name reaches", "rest", state.allocated - counted,
               "allocated by tensors no name, output or frame here holds", {})
