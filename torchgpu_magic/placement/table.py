"""The ``%whereis`` table: everything placeable in a namespace (names, containers and user objects
walked to a bounded depth), grouped by device, with gradients counted, filtered by device, sorted and
cut to the top rows so that 10,000 tensors are not 10,000 lines.

Reports hold names, strings and numbers, never the objects.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, NamedTuple, Optional

from ..caches import table
from ..host import gc_paused
from ..render import Lines, Report, Reportable, Table, fmt_bytes, fmt_count, join_cells
from .accounting import account, grad_state, optimizer_tensors, tensor_columns
from .kinds import device_order, dtype_str, kind_of, shape_str
from .walk import CONTAINERS, Walk, container_items

# Rows shown per device when no --top is given: a namespace of a few hundred objects shows whole, one
# of 10,000 tensors shows its first rows and one line for the rest.
DEFAULT_TOP = 100
_SHAPES = table()  # torch.Size: its text, '(4, 8)' (a notebook has few distinct shapes)


class Row(NamedTuple):
    """One line of the namespace table: an object (or the part of a split module) on one device.
    ``grad_bytes`` are the gradients (``.grad``) it holds on that device, counted apart from ``nbytes``;
    ``keys`` the storages behind the row (for the "... and N more" line; not in ``to_dict``). A named
    tuple: a table of 10,000 tensors makes 10,000 of them."""

    name: str
    what: str
    device: str
    dtype: str
    shape: str
    nbytes: int
    grad: str
    pinned: str
    note: str
    grad_bytes: int = 0
    keys: tuple = ()

    def to_dict(self) -> dict:
        """The row as plain data."""
        out = self._asdict()
        del out["keys"]
        return out


@dataclass(repr=False)
class NamespaceReport(Reportable):
    """The tensors, modules and optimizers of a namespace, grouped by device, with per-device totals
    (each storage counted once, gradients included) and what only IPython's output cache keeps alive.
    ``top`` rows per device are shown (None: all); ``cut`` lists what the walk did not look into."""

    rows: list
    totals: dict
    counts: dict
    out_only_bytes: int
    out_only_names: list
    grad_totals: dict = field(default_factory=dict)
    top: Optional[int] = DEFAULT_TOP
    cut: list = field(default_factory=list)
    sizes: dict = field(default_factory=dict)  # {storage key: bytes}, for the rows not shown
    device: Optional[str] = None  # the --device filter
    elsewhere: dict = field(default_factory=dict)  # {device: objects} left out by a device filter

    def tables(self) -> list:
        tables = []
        for device in sorted(self.totals, key=device_order):
            rows = [r for r in self.rows if r.device == device]
            n = self.counts.get(device, 0)
            count = f"{device}: {n} object{'s' if n != 1 else ''}, "
            grads = self.grad_totals.get(device, 0)
            if device == "meta":
                size = fmt_bytes(self.totals[device])
                title = count + f"no memory (meta tensors have no data; {size} if materialised)"
            else:
                of_which = f", of which gradients {fmt_bytes(grads)}" if grads else ""
                title = count + f"{fmt_bytes(self.totals[device])}{of_which} (shared storage counted once)"
            table = Table(["name", "what", "dtype", "shape", "bytes", "grad bytes", "grad", "pinned", "note"],
                          align="llllrrlll", title=title)
            shown = rows if self.top is None else rows[: self.top]
            for r in shown:
                table.add(r.name, r.what, r.dtype, r.shape, fmt_bytes(r.nbytes),
                          fmt_bytes(r.grad_bytes) if r.grad_bytes else "-", r.grad, r.pinned, r.note)
            if len(shown) < len(rows):
                rest = rows[len(shown):]
                table.add(f"... and {len(rest):,} more", "", "", "", fmt_bytes(self.rest_bytes(shown, rest)),
                          "", "", "", "--top N, or --top 0: all")
            tables.append(table)
        return tables

    def rest_bytes(self, shown: list, rest: list) -> int:
        """The memory the rows not shown hold beyond what the shown rows hold: each storage once, so
        views and aliases of a shown tensor add nothing (the device total minus the shown rows')."""
        seen = {key for row in shown for key in row.keys}
        rest_keys = dict.fromkeys(key for row in rest for key in row.keys if key not in seen)
        return sum(self.sizes.get(key, 0) for key in rest_keys)

    def footer(self) -> list:
        if not self.rows and self.elsewhere:
            where = ", ".join(f"{d} ({n} object{'s' if n != 1 else ''})"
                              for d, n in sorted(self.elsewhere.items(), key=lambda kv: device_order(kv[0])))
            return [f"Nothing on {self.device}; the namespace's tensors, modules and optimizers are on "
                    f"{where}."]
        if not self.rows:
            return ["No tensors, modules or optimizers in the namespace."]
        lines = []
        if self.out_only_names:
            lines.append(
                f"Only IPython's output cache keeps {join_cells(self.out_only_names)} alive "
                f"({fmt_bytes(self.out_only_bytes)}): `%reset -f out` frees them."
            )
        if self.cut:
            shown = "; ".join(f"{name} ({why})" for name, why in self.cut[:5])
            more = f"; and {len(self.cut) - 5} more" if len(self.cut) > 5 else ""
            lines.append(f"Not looked into: {shown}{more}. Name an object to see it: %whereis NAME.")
        return lines

    def report(self) -> Report:
        """A table per device, then the footer."""
        return Report([*self.tables(), Lines(self.footer())], gap=True)

    def to_dict(self) -> dict:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "totals": dict(self.totals),
            "grad_totals": dict(self.grad_totals),
            "out_only_bytes": self.out_only_bytes,
            "out_only_names": list(self.out_only_names),
            "cut": [list(c) for c in self.cut],
        }


def _out_cache_items(ns: Mapping[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """(name, object, kind) for what IPython's output cache holds: ``Out[N]`` (also bound to
    ``_N``), and ``_``, ``__``, ``___`` when they are not in ``Out``; one level into containers."""
    out = ns.get("Out")
    cached = sorted(out.items(), key=lambda kv: str(kv[0])) if isinstance(out, dict) else []
    entries = [(f"Out[{key}]", value) for key, value in cached]
    entries += [(name, ns[name]) for name in ("_", "__", "___") if name in ns]
    seen: set = set()
    for name, obj in entries:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = kind_of(obj)
        if kind is not None:
            yield name, obj, kind
        elif type(obj) in CONTAINERS:
            for sub, item in container_items(name, obj):
                item_kind = kind_of(item)
                if item_kind is not None:
                    yield sub, item, item_kind


class _Tally:
    """Storage keys seen so far: {key: (device, bytes)} for data and for gradients, so a storage shared
    by two names (or a gradient seen through a module and a tensor) counts once."""

    def __init__(self) -> None:
        self.data: dict = {}
        self.grads: dict = {}

    def take(self, acc: Any) -> None:
        """Count an object's :class:`~.accounting.Account`: its storages where it lives, and its gradients;
        parts kept off its devices on purpose stay out of the device totals (its row's note says so)."""
        placed = acc.devices
        for key, (device, role, size) in acc.storages.items():
            if role == "gradient":
                self.grads[key] = (device, size)
            elif device in placed:
                self.data[key] = (device, size)


def _keys_on(acc: Any, device: str) -> tuple:
    return tuple(key for key, (where, _, _) in acc.storages.items() if where == device)


def _tensor_row(name: str, columns: Any, index: int, tally: _Tally, notes: list) -> Row:
    """A tensor's row from its facts (:func:`~.accounting.tensor_columns`, its account read for speed)."""
    device, key, nbytes = columns.devices[index], columns.keys[index], columns.nbytes[index]
    tally.data[key] = (device, nbytes)
    keys: tuple = (key,)
    grad_bytes = 0
    grad = columns.grads[index]
    if grad is not None:
        gkey, gdevice, grad_bytes = grad
        tally.grads[gkey] = (gdevice, grad_bytes)
        keys = (key, gkey)
    why = columns.why[index]
    if why:
        notes.append(why)
    if device == "meta":
        notes.append("meta: no data")
    shape = columns.shapes[index]
    shown = _SHAPES.get(shape)
    if shown is None:
        shown = shape_str(tuple(shape))
        if len(_SHAPES) < 4096:
            _SHAPES[shape] = shown
    return Row(name, "tensor", device, dtype_str(columns.dtypes[index]), shown, columns.view_bytes[index],
               "yes" if columns.requires_grad[index] else "no", columns.pinned[index],
               "; ".join(filter(None, notes)) if any(notes) else "", grad_bytes, keys)


def _module_rows(name: str, module: Any, tally: _Tally, note: str) -> list:
    """One row per device the module lives on, with the bytes on that device (storage deduplicated
    within the module) and its parameters' gradients."""
    acc = account(module)
    tally.take(acc)
    what = type(module).__name__
    if not acc.devices:
        return [Row(name, what, "(no tensors)", "-", "0 params", 0, "-", "-", note)]
    notes = [note] if note else []
    if len(acc.devices) > 1:
        notes.append("split across " + ", ".join(acc.devices))
    offloaded = {place for _, places in acc.hooks for place in places}
    rows = []
    for device in acc.devices:
        share = acc.shares[device]
        row_notes = list(notes)
        if device == "meta":
            row_notes.append("meta: no data")
        elif device in offloaded:
            row_notes.append(f"offloaded by accelerate to {device}")
        rows.append(Row(
            name, what, device, join_cells(sorted(share.dtypes)), f"{fmt_count(share.numel)} params",
            share.nbytes,
            grad_state(share.trainable, share.numel), "-", "; ".join(row_notes), share.grad_bytes,
            _keys_on(acc, device),
        ))
    return rows


def _optimizer_rows(name: str, optimizer: Any, tally: _Tally, note: str) -> list:
    acc = account(optimizer)
    tally.take(acc)
    what = type(optimizer).__name__
    notes = [note] if note else []
    with_state = [d for d in acc.devices if acc.shares[d].nbytes]
    if not with_state:
        notes.append("no state yet (created by the first step())")
        return [Row(name, what, d, "-", f"{acc.params} params", 0, "-", "-", "; ".join(notes))
                for d in acc.devices or ["(no params)"]]
    if acc.misplaced:
        params = sorted({expected for _, _, expected in acc.misplaced}, key=device_order)
        notes.append(f"state not on its params' device ({join_cells(params)}): step() will fail")
    # '+16 B of step counters on cpu, where torch keeps them ...' on the first row, for what it keeps off
    kept = [f"+{fmt_bytes(size)} of step counters on {device}, {why}"
            for _, device, size, why in acc.kept_off]
    return [Row(name, what, device, "-", f"{acc.params} params, state", acc.shares[device].nbytes, "-", "-",
                "; ".join(notes + (kept if index == 0 else [])), 0, _keys_on(acc, device))
            for index, device in enumerate(with_state)]


@gc_paused()
def namespace_report(
    ns: Mapping[str, Any],
    device: Optional[str] = None,
    sort: Optional[str] = None,
    top: Optional[int] = DEFAULT_TOP,
) -> NamespaceReport:
    """Everything placeable in ``ns`` (a shell's user namespace, with its ``Out`` cache), grouped by
    device; only ``device``'s table when given; rows by size (data + gradients) with ``sort='bytes'``,
    by name with ``sort='name'``, else in namespace order; ``top`` rows per device (None: all). Reads
    only; keeps no reference. The garbage collector is paused during the walk
    (:func:`~torchgpu_magic.host.gc_paused`)."""
    rows: list = []
    tally = _Tally()
    tensor_names: dict = {}
    walk = Walk(ns)
    found = list(walk)
    _add_rows(found, tally, rows, "", tensor_names, walk.why)
    user_ids = {id(obj) for _, obj, _ in found}
    # A submodule, parameter or state tensor of a named object is not "only in Out".
    for _name, obj, kind in found:
        if kind == "module":
            user_ids.update(map(id, obj.parameters()))
            user_ids.update(map(id, obj.buffers()))
            user_ids.update(map(id, obj.modules()))
        elif kind == "optimizer":
            user_ids.update(id(t) for *_, t in optimizer_tensors(obj))
    user_keys = set(tally.data) | set(tally.grads)
    out_tally = _Tally()
    out_items = []
    for name, obj, kind in _out_cache_items(ns):
        if id(obj) not in user_ids:
            user_ids.add(id(obj))
            out_items.append((name, obj, kind))
    out_names = [name for name, _, _ in out_items]
    _add_rows(out_items, out_tally, rows, "only in Out", tensor_names, {})
    out_only = {k: v for table in (out_tally.data, out_tally.grads) for k, v in table.items()
                if k not in user_keys}
    tally.data.update(out_tally.data)
    tally.grads.update(out_tally.grads)
    totals: Counter = Counter()
    grad_totals: Counter = Counter()
    for where, size in tally.data.values():
        totals[where] += size
    for key, (where, size) in tally.grads.items():
        if key not in tally.data:  # a gradient that is also a named tensor counts once
            totals[where] += size
            grad_totals[where] += size
    counts = Counter(row.device for row in rows)
    totals.update(dict.fromkeys(counts, 0))  # a row's device holding no bytes too ('(no tensors)')
    sizes = {key: size for table in (tally.grads, tally.data) for key, (_, size) in table.items()}
    elsewhere: dict = {}
    if device is not None:
        elsewhere = {d: n for d, n in counts.items() if d != device}
        rows = [r for r in rows if r.device == device]
        totals, counts, grad_totals = ({d: n for d, n in figures.items() if d == device}
                                       for figures in (totals, counts, grad_totals))
    if sort == "bytes":
        rows.sort(key=lambda r: r.nbytes + r.grad_bytes, reverse=True)
    elif sort == "name":
        rows.sort(key=lambda r: r.name)
    return NamespaceReport(rows, totals, counts, sum(size for _, size in out_only.values()), out_names,
                           grad_totals, top, walk.cut, sizes, device, elsewhere)


def _add_rows(found: list, tally: _Tally, rows: list, note: str, tensor_names: dict, why: Mapping) -> None:
    """The rows of ``found`` ((name, object, kind) each), its tensors' facts read at once
    (:func:`~.accounting.tensor_columns`); ``why`` has the reason a tensor is fine on any device, by name."""
    tensors = [obj for _, obj, kind in found if kind == "tensor"]
    facts = tensor_columns(tensors) if tensors else None
    at = -1  # the tensor's position in ``facts``
    for name, obj, kind in found:
        try:
            if kind == "tensor":
                at += 1
                key = facts.keys[at]
                first, first_id = tensor_names.setdefault(key, (name, id(obj)))  # the storage's first name
                shared = ""
                if first != name:
                    shared = ("same tensor as " if first_id == id(obj) else "shares storage with ") + first
                rows.append(_tensor_row(name, facts, at, tally, [note, shared, why.get(name, "")]))
            elif kind == "module":
                rows.extend(_module_rows(name, obj, tally, note))
            else:
                rows.extend(_optimizer_rows(name, obj, tally, note))
        except (RuntimeError, AttributeError, TypeError):  # an exotic object we cannot read: leave it out
            continue
