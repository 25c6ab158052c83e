"""``%gpumem holders``' report, and the "who holds it" part of the out-of-memory explanation: per device,
every holder :func:`torchgpu_magic.holders.holdings.collect` found with bytes there, beside torch's cache
(reserved but unallocated, and whether it is fragmented), the other processes on the device, what the
device holds outside torch's allocator (the CUDA context, and in a container the processes NVML cannot
tell from this one), and what no name reaches: on the cpu the rest of the process's RSS; on a GPU the
tensors torch allocated that no holder counts, apart from the allocator's rounding (allocated less
requested) and cuBLAS's workspaces (blocks of exactly the workspace size no holder counts), which are
torch's, not the user's. Every row is sorted by its bytes before the table is cut to its first rows, so
the largest is never folded away.

A storage is counted once, under the first holder reaching it; the others that hold it too are named in
brackets: ``x (also y, Out[3])``. Tables fit a 100-column terminal: the "what" column comes last and
wraps. Reports hold names, strings and numbers.
"""
from __future__ import annotations

import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Optional

from .. import accelerators
from ..accelerators import initialised_cuda
from ..host import gc_paused
from ..placement.kinds import device_order, dtype_str, shape_str
from ..render import Lines, Report, Reportable, Table, fmt_bytes
from ..torchapi import cublas_workspace_sizes
from . import devicestate
from .holdings import collect

TOP = 15  # rows shown per device; the rest in one line
ALSO = 2  # other holders named beside one
WIDTH = 100  # a table's text fits this many columns (a terminal's)
HOLDER_WIDTH = 40  # the holder column's most; longer names are shortened in the middle
_ROLE_WORDS = {"parameter": "parameters", "buffer": "buffers", "gradient": "gradients", "state": "state",
               "step": "step counters", "saved": "saved for backward", "tensor": "data"}
_HELD_BY = {"name": "your name", "output": "output history", "traceback": "a traceback",
            "graph": "autograd graph", "cache": "torch's cache", "process": "another process",
            "outside": "this process", "unknown": "unknown (NVML)", "torch": "torch", "rest": "-"}
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

    def label(self, short: bool = False) -> str:
        """'x (also y, Out[3])'; ``short``: the first other holder and how many more, 'x (also y, 2 more)'."""
        if not self.also:
            return self.name
        named = 1 if short else ALSO
        more = len(self.also) - named
        shown = list(self.also[:named]) + ([f"{more} more"] if more > 0 else [])
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
        return f"tensor {dtype_str(what[0])} {shape_str(tuple(what[1]))}"
    return what


@dataclass
class HolderTable(Table):
    """A holders' table; its text, shown indented by two, fits :data:`WIDTH` columns: cells of the first
    column longer than :data:`HOLDER_WIDTH` shortened in the middle ('a_very_lo...name'), the last column
    (free text) wrapped under itself. Its HTML keeps every cell whole."""

    def to_text(self) -> str:
        rows = [[str(c) for c in self.headers]] + [[str(c) for c in row] for row in self.rows]
        for row in rows[1:]:
            if len(row[0]) > HOLDER_WIDTH:
                keep = HOLDER_WIDTH - 3
                row[0] = row[0][: keep - keep // 3] + "..." + row[0][len(row[0]) - keep // 3:]
        aligns = self._aligns()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lead = sum(widths) + 2 * len(widths)
        last = max(20, WIDTH - 2 - lead)
        widths.append(min(last, max(len(r[-1]) for r in rows)))
        out = []
        for number, row in enumerate(rows):
            # '32.0 MiB' stays whole
            glued = re.sub(r"(\d) (?=(?:[KMGTP]i)?B\b|bytes\b)", "\\1\x00", row[-1])
            wrapped = [line.replace("\x00", " ")
                       for line in textwrap.wrap(glued, last, break_on_hyphens=False)] or [""]
            cells = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row[:-1], widths, aligns)]
            out.append("  ".join(cells + [wrapped[0]]).rstrip())
            out.extend(" " * lead + more for more in wrapped[1:])
            if number == 0:
                out.append("  ".join("-" * w for w in widths))
        return "\n".join(out)


def _wrapped(text: str) -> str:
    """``text`` in lines of at most :data:`WIDTH` columns, the later ones indented by two."""
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False))


@dataclass(repr=False)
class DeviceHolders(Reportable):
    """Who holds memory on one device: ``rows`` largest first (the holders, torch's cache, other
    processes; what no name reaches last), ``counted`` the bytes the holders reach there, ``state`` the
    device read live, ``cut`` what the walks left out."""

    device: str
    rows: list
    counted: int
    state: devicestate.DeviceState
    cut: list = field(default_factory=list)

    def headline(self) -> str:
        n = sum(r.source in _NAMED for r in self.rows)
        live = self.live()
        head = (f"{self.device}: {fmt_bytes(self.counted)} held by {n} holder{'s' if n != 1 else ''} "
                "(each storage counted once)")
        return head + (f"; {live}" if live else "")

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

    def table(self) -> HolderTable:
        """The rows, largest first, cut to :data:`TOP` (the rest in one line); "what" last."""
        table = HolderTable(["holder", "bytes", "held by", "what"], align="lrll")
        shown = self.rows[:TOP]
        for row in shown:
            label = row.label()
            if len(label) > HOLDER_WIDTH:
                label = row.label(short=True)
            table.add(label, fmt_bytes(row.nbytes), _HELD_BY.get(row.source, ""), row.description())
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

    def report(self) -> Report:
        """The headline, the table under it indented, the notes; lines wrapped to :data:`WIDTH` in text."""
        return Report([Report([self.table()], indent="  "), Lines([_wrapped(n) for n in self.notes()])],
                      title=_wrapped(self.headline()))

    def to_dict(self) -> dict:
        return {"device": self.device, "counted": self.counted, "rows": [r.to_dict() for r in self.rows],
                "state": self.state.to_dict(), "cut": [list(c) for c in self.cut]}


@dataclass(repr=False)
class HoldersReport(Reportable):
    """``%gpumem holders``: a :class:`DeviceHolders` per device (``-o`` returns this; ``to_dict()``)."""

    devices: list

    def section(self, device: str) -> Optional[DeviceHolders]:
        return next((d for d in self.devices if d.device == device), None)

    def report(self) -> Report:
        if not self.devices:
            return Report([Lines(["%gpumem holders: no tensor, module or optimizer holds memory on any "
                                  "device"])])
        return Report([d.report() for d in self.devices], gap=True)

    def to_dict(self) -> dict:
        return {"devices": [d.to_dict() for d in self.devices]}


_NAMED = ("name", "output", "traceback", "graph")


def holders_report(ns: Mapping[str, Any], device: Optional[str] = None,
                   tracebacks: Iterable[Any] = ()) -> HoldersReport:
    """``%gpumem holders [DEVICE]``: who holds memory on ``device``, or on every device where the holders
    reach memory or torch has allocated some (CUDA GPUs, once CUDA is initialised). Reads only."""
    with gc_paused():
        holdings = collect(ns, tracebacks)
        devices = [device] if device is not None else _devices_in_use(holdings)
        return HoldersReport([device_holders(holdings, d) for d in devices])


def _devices_in_use(holdings: Any) -> list:
    """The devices the holders reach, and every accelerator device where torch has memory allocated (a lost
    GPU's left out: the ones the holders reach are still listed)."""
    allocated = devicestate.used_devices(accelerators.allocated)
    found = set(holdings.devices()) | {accelerators.device_label(kind, i) for kind, i in allocated}
    return sorted(found, key=device_order)


def device_holders(holdings: Any, device: str,
                   state: Optional[devicestate.DeviceState] = None) -> DeviceHolders:
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
            rows.append(Row(h.name, h.source, sum(roles.values()), h.what, roles,
                            tuple(also.get(h.index, ()))))
    rows.extend(_device_rows(state))
    rows.extend(_unreached(state, counted, _workspaces(holdings, device, state)))
    rows.sort(key=lambda r: -r.nbytes)  # after every row is in: the largest is never folded away
    return DeviceHolders(state.device, rows, counted, state, list(holdings.cut))


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
    """Torch's cache, the other processes on a GPU, and what this process (or, in a container, NVML's
    unrecognisable processes) hold outside torch's allocator, as rows."""
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
    if (state.outside or 0) > 0:
        source, what = _outside(state)
        rows.append(Row("outside torch's allocator", source, state.outside, what, {}))
    return rows


def _outside(state: devicestate.DeviceState) -> tuple:
    """(held by, what) of what the GPU holds beyond torch's reserved memory and the other processes NVML
    names: this process's CUDA context and libraries' own allocations; in a container (NVML listing the
    host's PIDs) also whatever other processes hold, which NVML cannot tell apart from this one there."""
    if len(state.foreign) == 1:
        return "outside", (f"this process's CUDA context and libraries' own allocations: NVML lists one "
                           f"process, under the host's PID {state.foreign[0][0]}: this one")
    several, many, pids = nvml_unknown(state)
    if several:
        return "unknown", (f"this process's CUDA context, and other processes: NVML lists {many} under the "
                           f"host's PIDs ({pids}) and cannot tell which is this one")
    if many:
        return "unknown", (f"this process's CUDA context, and {many} other process{'es' if many != 1 else ''}"
                           f" ({pids}) NVML lists here without their memory (MIG mode gives none to a user "
                           "without privileges)")
    return "outside", "this process's CUDA context and libraries' own allocations (NCCL, cuDNN, ...)"


def nvml_unknown(state: devicestate.DeviceState, several_first: bool = False) -> tuple:
    """(several, how many, their first PIDs) of the processes NVML lists on a GPU that no figure here tells
    apart: several under the host's PIDs (``foreign``), or others listed without their memory
    (``unmeasured``); ``several_first`` picks where both are. (False, 0, '') for neither."""
    several = len(state.foreign) > 1 and (several_first or not state.unmeasured)
    rows = state.foreign if several else state.unmeasured
    return several, len(rows), ", ".join(str(row[0]) for row in rows[:4])


def _workspaces(holdings: Any, device: str, state: devicestate.DeviceState) -> int:
    """Bytes of cuBLAS's workspaces on a CUDA ``device``: torch's allocator holds one block of exactly
    the workspace size per (cuBLAS handle, stream) that ran a matrix product; those blocks no holder
    counts (a tensor of the same size may hold one of them) are the workspaces. 0 where torch cannot
    say (a CPU build, another allocator backend)."""
    if state.kind != "cuda" or not state.allocated:
        return 0
    sizes = cublas_workspace_sizes()
    if not sizes:
        return 0
    cuda = initialised_cuda()
    index = int(device.partition(":")[2] or 0)
    found = (devicestate.allocator_blocks(cuda, index) if cuda is not None else None) or ()
    blocks = Counter(block.get("requested_size") for block in found
                     if block.get("state") == "active_allocated" and block.get("requested_size") in sizes)
    counted = Counter(size for where, size, _, _ in holdings.storages.values()
                      if where == device and size in blocks)
    return sum(size * max(0, n - counted[size]) for size, n in blocks.items())


def _unreached(state: devicestate.DeviceState, counted: int, workspaces: int) -> list:
    """What the device holds for this process beyond the holders. On the cpu the rest of the process's
    RSS (Python objects, libraries, tensors no name reaches). On a GPU, of what torch allocated beyond
    what the holders count: the allocator's rounding of each block up to 512 bytes (allocated less
    requested), cuBLAS's workspaces, and what is left, tensors no name, output or frame here holds."""
    if state.kind == "cpu":
        if state.process is None or state.process <= counted:
            return []
        return [Row("the rest of this process", "rest", state.process - counted,
                    "Python, libraries, and memory no name here reaches", {})]
    if state.allocated is None:
        return []
    rows = []
    requested = state.requested if state.requested is not None else state.allocated
    rounding = state.allocated - requested
    if rounding > 0:
        rows.append(Row("torch's rounding", "torch", rounding,
                        "the allocator rounds every block up to a multiple of 512 bytes", {}))
    if workspaces:
        rows.append(Row("cuBLAS workspaces", "torch", workspaces,
                        "one per cuBLAS handle and stream that ran a matrix product; torch.cuda."
                        "empty_cache() does not free them", {}))
    unreached = requested - counted - workspaces
    if unreached > 0:
        rows.append(Row("no name reaches", "rest", unreached,
                        "tensors no name, output or frame here holds (another thread's, a C extension's, "
                        "a reference cycle's)", {}))
    return rows
