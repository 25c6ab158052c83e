"""The namespace scan: the per-cell snapshot behind ``--watch`` and ``%%ontorch``'s footer, and the
``%whereis`` table of everything placeable in a namespace, grouped by device.

Snapshots and reports hold names, strings, numbers and ``id()`` values, never the objects, so keeping
one around pins no GPU memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from .common import (
    _KIND_BY_TYPE,
    IPYTHON_NAMES,
    _container_items,
    _device_order,
    _grad_state,
    _join,
    _module_tensors,
    _optimizer_tensors,
    _pinned,
    _placeables,
    _sep,
    device_str,
    devices_of,
    dtype_str,
    fmt_count,
    is_floating,
    kind_of,
    shape_str,
    storage_key,
    tensor_nbytes,
)

# Containers looked into (one level deep) by the per-cell snapshot only when this small, so a list of a
# million floats in the namespace never slows every cell down; the full %whereis table looks into all.
SNAPSHOT_CONTAINER_LIMIT = 64


# ---------------------------------------------------------------------------------------------------
# Namespace snapshots (the contract used by --watch and by %%ontorch's footer)
# ---------------------------------------------------------------------------------------------------


def _module_sig(module: Any) -> tuple:
    """A hashable summary of a module's placement that changes when any of its parameters or
    buffers moves, changes dtype or shape, or when tensors are added or removed."""
    return tuple((t.device, t.dtype, t.shape) for _, t, _ in _module_tensors(module))


def _optimizer_sig(optimizer: Any) -> tuple:
    return tuple((t.device, t.dtype, is_state) for t, is_state in _optimizer_tensors(optimizer))


@dataclass(frozen=True)
class Placed:
    """What a name pointed to at snapshot time; holds no reference to the object itself.

    ``fingerprint`` changes when the object is replaced, moved, reshaped or changes dtype.
    """

    name: str
    kind: str
    devices: tuple
    summary: str
    nbytes: int
    fingerprint: tuple


def _placed(name: str, obj: Any, kind: str, fingerprint: tuple) -> Placed:
    if kind == "tensor":
        shape = tuple(obj.shape)
        summary = f"{dtype_str(obj.dtype)} {shape_str(shape)}"
        return Placed(name, kind, (device_str(obj.device),), summary, tensor_nbytes(obj), fingerprint)
    if kind == "module":
        seen: dict = {}
        numel = 0
        for _, tensor, is_param in _module_tensors(obj):
            key, size = storage_key(tensor)
            seen[key] = size
            if is_param:
                numel += tensor.nelement()
        summary = f"{type(obj).__name__} {fmt_count(numel)} params"
        return Placed(name, kind, devices_of(obj), summary, sum(seen.values()), fingerprint)
    seen = {}
    n_params = 0
    for tensor, is_state in _optimizer_tensors(obj):
        if is_state:
            key, size = storage_key(tensor)
            seen[key] = size
        else:
            n_params += 1
    summary = f"{type(obj).__name__} {n_params} params"
    return Placed(name, kind, devices_of(obj), summary, sum(seen.values()), fingerprint)


class _SnapshotCache:
    """Per-name memo of the last :class:`Placed`, so an unchanged tensor costs a few attribute reads.

    Holds ids and strings only. Entries for names no longer seen are dropped at each snapshot.
    """

    def __init__(self) -> None:
        self.entries: dict = {}


_CACHE = _SnapshotCache()


def _fingerprint(obj: Any, kind: str) -> tuple:
    if kind == "tensor":
        return (id(obj), obj.device, obj.dtype, obj.shape)
    if kind == "module":
        return (id(obj), hash(_module_sig(obj)))
    return (id(obj), hash(_optimizer_sig(obj)))


def _snap_one(name: str, obj: Any, kind: str, old: dict, new: dict, out: dict) -> None:
    cached = old.get(name)
    try:
        fingerprint = _fingerprint(obj, kind)
        if cached is None or cached.fingerprint != fingerprint:
            cached = _placed(name, obj, kind, fingerprint)
    except (RuntimeError, AttributeError, TypeError):  # half-initialised or exotic objects
        return
    new[name] = out[name] = cached


def namespace_snapshot(ns: Mapping[str, Any]) -> dict:
    """The tensors, nn.Modules and optimizers bound to names in ``ns`` (names starting with ``_``
    skipped), and those one level inside small lists, tuples and dicts (``batch[0]``, ``d['w']``),
    as ``{name: Placed}``. Never keeps a reference to the objects.

    Fast because an unchanged tensor under an unchanged name reuses the previous snapshot's entry
    after comparing four fields in place (1,000 tensors: well under a millisecond).
    """
    old = _CACHE.entries
    new: dict = {}
    kinds = _KIND_BY_TYPE
    containers = (list, tuple, dict)
    for name, obj in list(ns.items()):
        if name[:1] == "_" or name in IPYTHON_NAMES:
            continue
        typ = type(obj)
        kind = kinds[typ] if typ in kinds else kind_of(obj)
        if kind == "tensor":
            cached = old.get(name)
            if cached is not None:
                fp = cached.fingerprint
                try:
                    if (
                        fp[0] == id(obj)
                        and len(fp) == 4
                        and fp[2] is obj.dtype
                        and fp[1] == obj.device
                        and fp[3] == obj.shape
                    ):
                        new[name] = cached
                        continue
                except (RuntimeError, AttributeError, TypeError):
                    continue
            _snap_one(name, obj, kind, old, new, new)
        elif kind is not None:
            _snap_one(name, obj, kind, old, new, new)
        elif typ in containers and 0 < len(obj) <= SNAPSHOT_CONTAINER_LIMIT:
            for sub, item in _container_items(name, obj):
                item_kind = kind_of(item)
                if item_kind is not None:
                    _snap_one(sub, item, item_kind, old, new, new)
    _CACHE.entries = new
    return dict(new)


def changed(before: Mapping[str, Placed], after: Mapping[str, Placed]) -> list:
    """The entries of ``after`` that are new or whose fingerprint differs from ``before``'s, in
    ``after``'s order."""
    result = []
    for name, placed in after.items():
        prior = before.get(name)
        if prior is placed:
            continue
        if prior is None or prior.fingerprint != placed.fingerprint:
            result.append(placed)
    return result


def watch_line(changes: list, before: Mapping[str, Placed]) -> str:
    """One compact line for ``--watch``: ``whereis: new x cpu float32 (3,) | moved model cpu→meta``."""
    sep = f" {_sep()} "
    arrow = "→" if _sep() == "·" else "->"
    parts = []
    for placed in changes:
        prior = before.get(placed.name)
        where = "+".join(placed.devices) or "-"
        if prior is None:
            parts.append(f"new {placed.name} {where} {placed.summary}")
        elif prior.devices != placed.devices:
            parts.append(f"moved {placed.name} {'+'.join(prior.devices) or '-'}{arrow}{where}")
        else:
            parts.append(f"changed {placed.name} {where} {placed.summary}")
    return "whereis: " + sep.join(parts)


# ---------------------------------------------------------------------------------------------------
# The namespace table: %whereis
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the namespace table: an object (or the part of a split module) on one device."""

    name: str
    what: str
    device: str
    dtype: str
    shape: str
    nbytes: int
    grad: str
    pinned: str
    note: str


@dataclass(repr=False)
class NamespaceReport:
    """The tensors, modules and optimizers of a namespace, grouped by device, with per-device totals
    (each storage counted once) and what only IPython's output cache keeps alive."""

    rows: list
    totals: dict
    counts: dict
    out_only_bytes: int
    out_only_names: list

    def tables(self) -> list:
        from ..render import Table, fmt_bytes

        tables = []
        for device in sorted(self.totals, key=_device_order):
            rows = [r for r in self.rows if r.device == device]
            count = f"{device}: {self.counts[device]} object{'s' if self.counts[device] != 1 else ''}, "
            if device == "meta":
                size = fmt_bytes(self.totals[device])
                title = count + f"no memory (meta tensors have no data; {size} if materialised)"
            else:
                title = count + f"{fmt_bytes(self.totals[device])} (shared storage counted once)"
            headers = ["name", "what", "dtype", "shape", "bytes", "grad", "pinned", "note"]
            table = Table(headers, align="llllrlll", title=title)
            for r in rows:
                table.add(r.name, r.what, r.dtype, r.shape, fmt_bytes(r.nbytes), r.grad, r.pinned, r.note)
            tables.append(table)
        return tables

    def footer(self) -> list:
        from ..render import fmt_bytes

        if not self.rows:
            return ["No tensors, modules or optimizers in the namespace."]
        lines = []
        if self.out_only_names:
            lines.append(
                f"Only IPython's output cache keeps {_join(self.out_only_names)} alive "
                f"({fmt_bytes(self.out_only_bytes)}): `%reset -f out` frees them."
            )
        return lines

    def to_text(self) -> str:
        parts = [t.to_text() for t in self.tables()]
        return "\n\n".join(parts + ["\n".join(self.footer())] if self.footer() else parts)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        from ..render import html_lines

        return "".join(t.to_html() for t in self.tables()) + html_lines(self.footer())

    def to_dict(self) -> dict:
        return {
            "rows": [r.__dict__.copy() for r in self.rows],
            "totals": dict(self.totals),
            "out_only_bytes": self.out_only_bytes,
            "out_only_names": list(self.out_only_names),
        }


def _out_cache_items(ns: Mapping[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """(name, object, kind) for what IPython's output cache holds: ``Out[N]`` (also bound to
    ``_N``), and ``_``, ``__``, ``___`` when they are not in ``Out``; one level into containers."""
    out = ns.get("Out")
    seen: set = set()
    entries: list = []
    if isinstance(out, dict):
        for key, value in sorted(out.items(), key=lambda kv: str(kv[0])):
            entries.append((f"Out[{key}]", value))
    for name in ("_", "__", "___"):
        if name in ns:
            entries.append((name, ns[name]))
    for name, obj in entries:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = kind_of(obj)
        if kind is not None:
            yield name, obj, kind
        elif type(obj) in (list, tuple, dict):
            for sub, item in _container_items(name, obj):
                item_kind = kind_of(item)
                if item_kind is not None:
                    yield sub, item, item_kind


def _tensor_row(name: str, tensor: Any, note: str = "") -> Row:
    device = device_str(tensor.device)
    return Row(
        name, "tensor", device, dtype_str(tensor.dtype), shape_str(tuple(tensor.shape)),
        tensor_nbytes(tensor), "yes" if tensor.requires_grad else "no", _pinned(tensor, device), note,
    )


def _module_rows(name: str, module: Any, keys: dict, note: str) -> list:
    """One row per device the module lives on, with the bytes on that device (storage deduplicated
    within the module); fills ``keys`` with {storage key: (device, bytes)}."""
    per_device: dict = {}
    for _, tensor, is_param in _module_tensors(module):
        key, size = storage_key(tensor)
        device = device_str(tensor.device)
        keys[key] = (device, size)
        info = per_device.setdefault(device, {"keys": {}, "dtypes": set(), "numel": 0, "trainable": 0})
        info["keys"][key] = size
        if is_floating(tensor) or is_param:
            info["dtypes"].add(dtype_str(tensor.dtype))
        if is_param:
            info["numel"] += tensor.nelement()
            if tensor.requires_grad:
                info["trainable"] += tensor.nelement()
    what = type(module).__name__
    if not per_device:
        return [Row(name, what, "(no tensors)", "-", "0 params", 0, "-", "-", note)]
    notes = [note] if note else []
    if len(per_device) > 1:
        notes.append("split across " + ", ".join(sorted(per_device, key=_device_order)))
    rows = []
    for device, info in per_device.items():
        row_notes = list(notes)
        if device == "meta":
            row_notes.append("meta: no data")
        rows.append(Row(
            name, what, device, _join(sorted(info["dtypes"])), f"{fmt_count(info['numel'])} params",
            sum(info["keys"].values()), _grad_state(info["trainable"], info["numel"]), "-",
            "; ".join(row_notes),
        ))
    return rows


def _optimizer_rows(name: str, optimizer: Any, keys: dict, note: str) -> list:
    per_device: dict = {}
    param_devices = set()
    n_params = 0
    for tensor, is_state in _optimizer_tensors(optimizer):
        device = device_str(tensor.device)
        if not is_state:
            param_devices.add(device)
            n_params += 1
            continue
        key, size = storage_key(tensor)
        keys[key] = (device, size)
        per_device.setdefault(device, {})[key] = size
    what = type(optimizer).__name__
    notes = [note] if note else []
    if not per_device:
        notes.append("no state yet (created by the first step())")
        return [Row(name, what, d, "-", f"{n_params} params", 0, "-", "-", "; ".join(notes))
                for d in sorted(param_devices, key=_device_order) or ["(no params)"]]
    if set(per_device) - param_devices:
        notes.append("state not on its params' device (" + _join(sorted(param_devices)) + ")")
    return [Row(name, what, device, "-", f"{n_params} params, state", sum(sizes.values()), "-", "-",
                "; ".join(notes)) for device, sizes in per_device.items()]


def namespace_report(ns: Mapping[str, Any]) -> NamespaceReport:
    """Everything placeable in ``ns`` (a shell's user namespace, with its ``Out`` cache), grouped by
    device. Reads only; keeps no reference to any object."""
    rows: list = []
    keys: dict = {}
    user_ids: set = set()
    tensor_names: dict = {}
    found = list(_placeables(ns))
    for name, obj, kind in found:
        user_ids.add(id(obj))
        _rows_for(name, obj, kind, keys, rows, "", tensor_names)
    # A submodule, parameter or state tensor of a named object is not "only in Out".
    for _name, obj, kind in found:
        if kind == "module":
            user_ids.update(id(t) for _, t, _ in _module_tensors(obj))
            user_ids.update(id(m) for m in obj.modules())
        elif kind == "optimizer":
            user_ids.update(id(t) for t, _ in _optimizer_tensors(obj))
    user_keys = set(keys)
    out_names: list = []
    out_keys: dict = {}
    for name, obj, kind in _out_cache_items(ns):
        if id(obj) in user_ids:
            continue
        user_ids.add(id(obj))
        out_names.append(name)
        _rows_for(name, obj, kind, out_keys, rows, "only in Out", tensor_names)
    out_only = {k: v for k, v in out_keys.items() if k not in user_keys}
    keys.update(out_keys)
    totals: dict = {}
    for device, size in keys.values():
        totals[device] = totals.get(device, 0) + size
    counts: dict = {}
    for row in rows:
        totals.setdefault(row.device, 0)
        counts[row.device] = counts.get(row.device, 0) + 1
    return NamespaceReport(rows, totals, counts, sum(size for _, size in out_only.values()), out_names)


def _rows_for(name: str, obj: Any, kind: str, keys: dict, rows: list, note: str, tensor_names: dict) -> None:
    try:
        if kind == "tensor":
            key, size = storage_key(obj)
            keys[key] = (device_str(obj.device), size)
            tensor_names.setdefault(key, []).append((name, id(obj)))
            first, first_id = tensor_names[key][0]
            row_note = note
            if first_id == id(obj) and first != name:
                row_note = "; ".join(filter(None, [note, "same tensor as " + first]))
            elif first != name:
                row_note = "; ".join(filter(None, [note, "shares storage with " + first]))
            rows.append(_tensor_row(name, obj, row_note))
        elif kind == "module":
            rows.extend(_module_rows(name, obj, keys, note))
        else:
            rows.extend(_optimizer_rows(name, obj, keys, note))
    except (RuntimeError, AttributeError, TypeError):  # an exotic object we cannot read: leave it out
        return

