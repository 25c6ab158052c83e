"""Where tensors, modules and optimizers live: the core of ``%whereis`` and the mixed-device diagnosis.

Nothing here moves a tensor, runs ``forward`` or evaluates user code: objects are only inspected
(devices, dtypes, shapes, storage sizes). Nothing here keeps a user object alive either: snapshots and
reports hold names, strings, numbers and ``id()`` values, never the objects, so a report can be kept
around without pinning GPU memory. torch is imported lazily, on first use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

# ---------------------------------------------------------------------------------------------------
# Kinds of objects and the cheap per-object facts
# ---------------------------------------------------------------------------------------------------

_TORCH: Any = None
_KIND_BY_TYPE: dict = {}
_DEVICE_STR: dict = {}
_DTYPE_STR: dict = {}
# Containers looked into (one level deep) by the per-cell snapshot only when this small, so a list of a
# million floats in the namespace never slows every cell down; the full %whereis table looks into all.
SNAPSHOT_CONTAINER_LIMIT = 64
# Names IPython itself binds in the user namespace; ``Out`` is read separately, as the output cache.
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def _torch() -> Any:
    global _TORCH
    if _TORCH is None:
        import torch
        import torch.optim

        _TORCH = torch
    return _TORCH


def kind_of(obj: Any) -> Optional[str]:
    """'tensor', 'module' or 'optimizer' for the objects placement reports on; None for the rest.

    Cached per type, so the namespace scan costs one dict lookup per object.
    """
    typ = type(obj)
    try:
        return _KIND_BY_TYPE[typ]
    except KeyError:
        pass
    except TypeError:  # unhashable metaclass instance: not one of ours
        return None
    torch = _torch()
    kind: Optional[str] = None
    if issubclass(typ, torch.Tensor):
        kind = "tensor"
    elif issubclass(typ, torch.nn.Module):
        kind = "module"
    elif issubclass(typ, torch.optim.Optimizer):
        kind = "optimizer"
    _KIND_BY_TYPE[typ] = kind
    return kind


def device_str(device: Any) -> str:
    """``str(torch.device)``, cached: 'cpu', 'cuda:0', 'meta'."""
    try:
        return _DEVICE_STR[device]
    except KeyError:
        text = str(device)
        if len(_DEVICE_STR) < 256:
            _DEVICE_STR[device] = text
        return text


def dtype_str(dtype: Any) -> str:
    """'float32' for ``torch.float32`` (cached)."""
    try:
        return _DTYPE_STR[dtype]
    except KeyError:
        text = _DTYPE_STR[dtype] = str(dtype).replace("torch.", "")
        return text


def _module_tensors(module: Any) -> Iterator[tuple[str, Any, bool]]:
    """(qualified name, tensor, is_parameter) for every parameter and buffer of ``module``, each
    tensor object once (tied weights appear under their first name)."""
    seen: set = set()
    stack = [("", module)]
    while stack:
        prefix, mod = stack.pop()
        for table, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, tensor in table.items():
                if tensor is None or id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                yield prefix + name, tensor, is_param
        children = [(prefix + name + ".", child) for name, child in mod._modules.items() if child is not None]
        stack.extend(reversed(children))


def _optimizer_tensors(optimizer: Any) -> Iterator[tuple[Any, bool]]:
    """(tensor, is_state) for the parameters of ``optimizer`` and the tensors in its state."""
    torch = _torch()
    for group in optimizer.param_groups:
        for param in group.get("params", ()):
            yield param, False
    for state in optimizer.state.values():
        if isinstance(state, dict):
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield value, True


def devices_of(obj: Any) -> tuple[str, ...]:
    """The devices (sorted strings) a tensor, module (parameters and buffers) or optimizer
    (parameters and state) lives on; ``()`` for anything else or a module without tensors."""
    kind = kind_of(obj)
    if kind == "tensor":
        return (device_str(obj.device),)
    if kind == "module":
        devices = {t.device for _, t, _ in _module_tensors(obj)}
    elif kind == "optimizer":
        devices = {t.device for t, _ in _optimizer_tensors(obj)}
    else:
        return ()
    return tuple(sorted({device_str(d) for d in devices}))


def tensor_nbytes(tensor: Any) -> int:
    """Bytes of the elements ``tensor`` addresses (its own view: numel × element size)."""
    try:
        return int(tensor.nelement()) * int(tensor.element_size())
    except (RuntimeError, TypeError, NotImplementedError):
        return 0


def storage_key(tensor: Any) -> tuple:
    """(key, bytes) of the memory behind ``tensor``: views and tied weights share one key, so totals
    count their storage once. Tensors without real storage (meta, sparse, subclasses) get a key of
    their own and their view's size."""
    try:
        if tensor.layout is _torch().strided and not tensor.is_meta:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr:
                nbytes = int(storage.nbytes())
                return ("s", tensor.device, ptr, nbytes), nbytes
    except (RuntimeError, TypeError, NotImplementedError, AttributeError):
        pass
    return ("t", id(tensor)), tensor_nbytes(tensor)


def _module_sig(module: Any) -> tuple:
    """A hashable summary of a module's placement that changes when any of its parameters or
    buffers moves, changes dtype or shape, or when tensors are added or removed."""
    return tuple((t.device, t.dtype, t.shape) for _, t, _ in _module_tensors(module))


def _optimizer_sig(optimizer: Any) -> tuple:
    return tuple((t.device, t.dtype, is_state) for t, is_state in _optimizer_tensors(optimizer))


# ---------------------------------------------------------------------------------------------------
# Namespace snapshots (the contract used by --watch and by %%ontorch's footer)
# ---------------------------------------------------------------------------------------------------


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


def _container_items(name: str, container: Any) -> Iterator[tuple[str, Any]]:
    """(display name, item) one level inside a list, tuple or dict: ``batch[0]``, ``d['w']``."""
    if isinstance(container, dict):
        for key, item in list(container.items()):
            if isinstance(key, (str, int, float, bool)) or key is None:
                yield f"{name}[{key!r}]", item
    else:
        for index, item in enumerate(container):
            yield f"{name}[{index}]", item


# ---------------------------------------------------------------------------------------------------
# Small formatting helpers
# ---------------------------------------------------------------------------------------------------


def shape_str(shape: tuple) -> str:
    """'(3, 4)'; '()' for a scalar."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def fmt_count(n: int) -> str:
    """Parameter counts the way model cards write them: 4, 1.2K, 7.0M, 1.3B."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def _join(items: Any) -> str:
    return ", ".join(items) if items else "-"


def _sep() -> str:
    """'·' where stdout can print it, '|' elsewhere (like render.MICRO's 'µs' / 'us')."""
    from . import render

    return "·" if render.MICRO == "µs" else "|"


def is_floating(tensor: Any) -> bool:
    try:
        return bool(tensor.is_floating_point() or tensor.is_complex())
    except (RuntimeError, AttributeError):
        return False


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
        from .render import Table, fmt_bytes

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
        from .render import fmt_bytes

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
        from .render import html_lines

        return "".join(t.to_html() for t in self.tables()) + html_lines(self.footer())

    def to_dict(self) -> dict:
        return {
            "rows": [r.__dict__.copy() for r in self.rows],
            "totals": dict(self.totals),
            "out_only_bytes": self.out_only_bytes,
            "out_only_names": list(self.out_only_names),
        }


def _device_order(device: str) -> tuple:
    kind, _, index = device.partition(":")
    rank = {"cpu": 1, "meta": 3}.get(kind, 0)
    return (rank, kind, int(index) if index.isdigit() else -1)


def _placeables(ns: Mapping[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """(name, object, kind) for every placeable object bound to a public name of ``ns`` or one level
    inside a list, tuple or dict bound to one."""
    kinds = _KIND_BY_TYPE
    for name, obj in list(ns.items()):
        if name[:1] == "_" or name in IPYTHON_NAMES:
            continue
        typ = type(obj)
        kind = kinds[typ] if typ in kinds else kind_of(obj)
        if kind is not None:
            yield name, obj, kind
        elif typ in (list, tuple, dict):
            for sub, item in _container_items(name, obj):
                item_kind = kind_of(item)
                if item_kind is not None:
                    yield sub, item, item_kind


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
    pinned = "-"
    if device == "cpu":
        try:
            pinned = "yes" if tensor.is_pinned() else "no"
        except RuntimeError:
            pinned = "no"
    return Row(
        name, "tensor", device, dtype_str(tensor.dtype), shape_str(tuple(tensor.shape)),
        tensor_nbytes(tensor), "yes" if tensor.requires_grad else "no", pinned, note,
    )


def _grad_state(trainable: int, total: int) -> str:
    if total == 0:
        return "-"
    if trainable == total:
        return "yes"
    return "no" if trainable == 0 else f"{100 * trainable / total:.0f} %"


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


# ---------------------------------------------------------------------------------------------------
# %whereis NAME: one object in detail
# ---------------------------------------------------------------------------------------------------


@dataclass(repr=False)
class Lines:
    """A report that is a few lines of text (a tensor's one line, a note)."""

    lines: list

    def to_text(self) -> str:
        return "\n".join(self.lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        from .render import html_lines

        return html_lines(self.lines)

    def to_dict(self) -> dict:
        return {"lines": list(self.lines)}


def tensor_line(name: str, tensor: Any, ns: Optional[Mapping[str, Any]] = None) -> Lines:
    """``x · cpu · float32 · (3, 4) · 48 B · requires_grad · pinned · shares storage with y``."""
    from .render import fmt_bytes

    row = _tensor_row(name, tensor)
    parts = [name, row.device, row.dtype, row.shape, fmt_bytes(row.nbytes)]
    if tensor.requires_grad:
        parts.append("requires_grad")
    if row.pinned == "yes":
        parts.append("pinned")
    if type(tensor).__name__ == "Parameter":
        parts.append("Parameter")
    key, size = storage_key(tensor)
    if key[0] == "s" and size != row.nbytes:
        parts.append(f"a view of a {fmt_bytes(size)} storage")
    if ns is not None and key[0] == "s":
        others = [n for n, obj, kind in _placeables(ns) if kind == "tensor" and obj is not tensor
                  and storage_key(obj)[0] == key]
        if others:
            parts.append("shares storage with " + ", ".join(others[:5]) + (" ..." if len(others) > 5 else ""))
    if row.device == "meta":
        parts.append("meta: no data")
    return Lines([f" {_sep()} ".join(parts)])


@dataclass(frozen=True)
class ModuleRow:
    """One (possibly collapsed) line of a module's placement table."""

    name: str
    what: str
    devices: str
    dtypes: str
    params: int
    buffers: int
    nbytes: int
    trainable: str
    note: str


class _Node:
    """Placement facts of one module's subtree, computed bottom-up in one pass."""

    __slots__ = ("name", "cls", "children", "devices", "dtypes", "params", "buffers", "nbytes",
                 "trainable", "notes", "n_modules")

    def __init__(self, name: str, cls: str) -> None:
        self.name = name
        self.cls = cls
        self.children: list = []
        self.devices: set = set()
        self.dtypes: set = set()
        self.params = 0
        self.buffers = 0
        self.nbytes = 0
        self.trainable = 0
        self.notes: list = []
        self.n_modules = 1

    def signature(self) -> tuple:
        return (self.cls, frozenset(self.devices), frozenset(self.dtypes), self.grad(), tuple(self.notes),
                self.params, self.buffers)

    def grad(self) -> str:
        return _grad_state(self.trainable, self.params)

    def uniform(self) -> bool:
        return len(self.devices) <= 1 and len(self.dtypes) <= 1 and "%" not in self.grad()


def _hook_notes(hook: Any) -> list:
    """What an accelerate hook (a module's ``_hf_hook``) says about where the module runs and where
    its weights are."""
    hooks = getattr(hook, "hooks", None) or [hook]
    notes = []
    for h in hooks:
        parts = [type(h).__name__]
        execution = getattr(h, "execution_device", None)
        if execution is not None:
            parts.append(f"runs on {execution}")
        if getattr(h, "offload", False):
            parts.append("weights offloaded")
        notes.append("accelerate hook " + " ".join(parts))
    return notes


def _build_tree(name: str, module: Any, seen: set, keys: dict) -> _Node:
    """The placement facts of ``module``'s subtree, bottom-up; each tensor object counted in the first
    module that holds it, each storage once (``keys``). Written for speed: 10,000 tensors in tens of ms."""
    node = _Node(name, type(module).__name__)
    hook = module.__dict__.get("_hf_hook")  # set by accelerate; no Module.__getattr__ miss per module
    if hook is not None:
        node.notes.extend(_hook_notes(hook))
    devices, dtypes = node.devices, node.dtypes
    params = buffers = nbytes = trainable = 0
    for table, is_param in ((module._parameters, True), (module._buffers, False)):
        for tensor in table.values():
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            dev = tensor.device
            device = _DEVICE_STR.get(dev) or device_str(dev)
            devices.add(device)
            if is_param or is_floating(tensor):
                dtypes.add(tensor.dtype)
            key, size = storage_key(tensor)
            if key not in keys:
                keys[key] = (device, size)
                nbytes += size
            numel = tensor.nelement()
            if is_param:
                params += numel
                if tensor.requires_grad:
                    trainable += numel
            else:
                buffers += numel
    n_modules = 1
    children = node.children
    prefix = name + "." if name else ""
    for child_name, child in module._modules.items():
        if child is None:
            continue
        sub = _build_tree(prefix + child_name, child, seen, keys)
        children.append(sub)
        if not sub.devices <= devices:
            devices |= sub.devices
        if not sub.dtypes <= dtypes:
            dtypes |= sub.dtypes
        params += sub.params
        buffers += sub.buffers
        nbytes += sub.nbytes
        trainable += sub.trainable
        n_modules += sub.n_modules
    node.params, node.buffers, node.nbytes, node.trainable, node.n_modules = (
        params, buffers, nbytes, trainable, n_modules)
    return node


class _TableReport:
    """A report shown as header lines, one table, and flag lines; subclasses provide ``table()``."""

    header: list
    flags: list

    def table(self) -> Any:
        raise NotImplementedError

    def to_text(self) -> str:
        return "\n".join(self.header + [self.table().to_text()] + self.flags)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        from .render import html_lines

        return html_lines(self.header) + self.table().to_html() + html_lines(self.flags)


@dataclass(repr=False)
class ModuleReport(_TableReport):
    """A module's placement: one row per module, uniform subtrees collapsed, runs of identical
    siblings merged, split modules and meta / offloaded parameters flagged."""

    name: str
    header: list
    rows: list
    flags: list

    def table(self) -> Any:
        from .render import Table, fmt_bytes

        headers = ["module", "class", "devices", "dtypes", "params", "buffers", "bytes", "trainable", "note"]
        table = Table(headers, align="llllrrrll")
        for r in self.rows:
            table.add(r.name, r.what, r.devices, r.dtypes, fmt_count(r.params), fmt_count(r.buffers),
                      fmt_bytes(r.nbytes), r.trainable, r.note)
        return table

    def to_dict(self) -> dict:
        rows = [r.__dict__.copy() for r in self.rows]
        return {"name": self.name, "header": list(self.header), "rows": rows, "flags": list(self.flags)}


MAX_MODULE_ROWS = 200


def _dtypes(dtypes: set) -> str:
    return _join(sorted(dtype_str(d) for d in dtypes))


def _node_row(node: _Node, collapsed: bool) -> ModuleRow:
    notes = list(node.notes)
    if len(node.devices) > 1:
        notes.append("split across " + ", ".join(sorted(node.devices, key=_device_order)))
    if "meta" in node.devices:
        notes.append("meta params: no data")
    if node.children and collapsed:
        notes.append(f"+{node.n_modules - 1} submodules, same placement")
    return ModuleRow(
        node.name, node.cls, _join(sorted(node.devices, key=_device_order)), _dtypes(node.dtypes),
        node.params, node.buffers, node.nbytes, node.grad(), "; ".join(notes),
    )


def _emit(node: _Node, rows: list, expand: bool) -> None:
    """Rows for ``node``; its children listed when ``expand`` or the subtree is not uniform, runs of
    consecutive siblings with the same class and placement merged into one row."""
    if not node.children or not (expand or not node.uniform()):
        rows.append((node, True))
        return
    rows.append((node, False))
    i = 0
    children = node.children
    while i < len(children):
        j = i + 1
        sig = children[i].signature()
        if children[i].uniform():
            while j < len(children) and children[j].uniform() and children[j].signature() == sig:
                j += 1
        if j - i > 1:
            rows.append(children[i:j])
        else:
            _emit(children[i], rows, False)
        i = j


def module_report(name: str, module: Any) -> ModuleReport:
    """Where ``module``'s parameters and buffers are, module by module. Never runs forward and never
    moves anything."""
    torch = _torch()
    from .render import fmt_bytes

    header = []
    inner = module
    if isinstance(module, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        raw_ids = getattr(module, "device_ids", None) or []
        ids = [f"cuda:{d}" if isinstance(d, int) else str(d) for d in raw_ids]
        out = getattr(module, "output_device", None)
        out = f"cuda:{out}" if isinstance(out, int) else out
        kind = "DataParallel" if isinstance(module, torch.nn.DataParallel) else "DistributedDataParallel"
        if kind == "DataParallel" and not ids:
            where = "no GPU visible, so it runs .module as is"
        elif kind == "DataParallel":
            where = f"replicates .module onto {', '.join(ids)} at each forward, outputs gathered on {out}"
        else:
            where = f"one process per device, device_ids {', '.join(ids) or 'None'}, output_device {out}"
        header.append(f"{name} is a {kind} wrapper: {where}; the parameters below live on {name}.module.")
    elif type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod"):
        header.append(f"{name} is a torch.compile wrapper; the parameters below belong to ._orig_mod.")
    keys: dict = {}
    tree = _build_tree("", inner, set(), keys)
    tree.name = name
    totals: dict = {}
    for device, size in keys.values():
        totals[device] = totals.get(device, 0) + size
    where = ", ".join(f"{fmt_bytes(totals[d])} on {d}" for d in sorted(totals, key=_device_order))
    header.append(f"{name}: {tree.cls}, {fmt_count(tree.params)} params, {where}" if totals
                  else f"{name}: {tree.cls}, no parameters or buffers")
    flat: list = []
    _emit(tree, flat, True)
    rows = []
    for item in flat[:MAX_MODULE_ROWS]:
        if isinstance(item, list):  # a run of alike siblings: layers.0..11
            first, count = item[0], len(item)
            rows.append(ModuleRow(
                f"{first.name}..{item[-1].name.rsplit('.', 1)[-1]}", f"{count} × {first.cls}",
                _join(sorted(first.devices, key=_device_order)), _dtypes(first.dtypes),
                first.params * count, first.buffers * count, sum(n.nbytes for n in item), first.grad(),
                "; ".join(first.notes),
            ))
        else:
            rows.append(_node_row(*item))
    flags = []
    if len(flat) > MAX_MODULE_ROWS:
        flags.append(f"... {len(flat) - MAX_MODULE_ROWS} more rows not shown")
    split = [r.name for r in rows if "split across" in r.note and r.name != name]
    if len(tree.devices) > 1:
        flags.append(f"{name} is split across {', '.join(sorted(tree.devices, key=_device_order))}"
                     + (f" (inside: {', '.join(split[:5])})" if split else "")
                     + ": inputs must be on the device of the layer that reads them.")
    if "meta" in tree.devices:
        flags.append("Parameters on meta have no data: materialise them (module.to_empty(device=...) then "
                     "load_state_dict), or check the loading options (device_map, low_cpu_mem_usage).")
    return ModuleReport(name, header, rows, flags)


@dataclass(repr=False)
class OptimizerReport(_TableReport):
    """Where an optimizer's state lives compared with its parameters, per parameter group."""

    name: str
    header: list
    rows: list
    flags: list

    def table(self) -> Any:
        from .render import Table, fmt_bytes

        table = Table(["group", "params", "param devices", "state devices", "state bytes"], align="rrllr")
        for group, n, pdev, sdev, nbytes in self.rows:
            table.add(group, n, pdev, sdev, fmt_bytes(nbytes))
        return table

    def to_dict(self) -> dict:
        return {"name": self.name, "header": list(self.header), "rows": [list(r) for r in self.rows],
                "flags": list(self.flags)}


def optimizer_report(name: str, optimizer: Any) -> OptimizerReport:
    """Per parameter group: how many parameters, on which devices, and where their state tensors
    (momentum, Adam's moments...) are; flags state that is not where its parameter is."""
    torch = _torch()
    rows = []
    misplaced = 0
    total_state = 0
    state = optimizer.state
    for index, group in enumerate(optimizer.param_groups):
        params = list(group.get("params", ()))
        pdev: set = set()
        sdev: set = set()
        keys: dict = {}
        for param in params:
            pd = device_str(param.device)
            pdev.add(pd)
            for value in (state.get(param) or {}).values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    sd = device_str(value.device)
                    sdev.add(sd)
                    if sd != pd:
                        misplaced += 1
                    key, size = storage_key(value)
                    keys[key] = size
        total_state += sum(keys.values())
        state_devices = _join(sorted(sdev, key=_device_order)) if sdev else "(no state yet)"
        rows.append((index, len(params), _join(sorted(pdev, key=_device_order)), state_devices,
                     sum(keys.values())))
    from .render import fmt_bytes

    header = [f"{name}: {type(optimizer).__name__}, {len(optimizer.param_groups)} param group(s), "
              f"state {fmt_bytes(total_state)}"]
    flags = []
    if not state:
        flags.append("No state yet: it is created on the parameters' devices by the first step().")
    if misplaced:
        flags.append(
            f"{misplaced} state tensor(s) are not on their parameter's device (the model was moved after the "
            "optimizer stepped): step() will fail. Recreate the optimizer after moving the model, or load "
            "its state_dict after the move (load_state_dict moves state to each parameter's device)."
        )
    return OptimizerReport(name, header, rows, flags)


def describe(name: str, obj: Any, ns: Optional[Mapping[str, Any]] = None) -> Any:
    """The ``%whereis NAME`` report for one object: a line for a tensor, a table for a module or an
    optimizer. Raises MagicInputError for anything else."""
    from .errors import MagicInputError

    kind = kind_of(obj)
    if kind == "tensor":
        return tensor_line(name, obj, ns)
    if kind == "module":
        return module_report(name, obj)
    if kind == "optimizer":
        return optimizer_report(name, obj)
    raise MagicInputError(f"{name} is a {type(obj).__name__}, not a tensor, nn.Module or optimizer")


def placement_line(obj: Any) -> str:
    """One line saying where a tensor or module is: ``Linear · cuda:0 · float32 · 4 params · 16 B``."""
    from .render import fmt_bytes

    sep = f" {_sep()} "
    kind = kind_of(obj)
    if kind == "tensor":
        return sep.join([type(obj).__name__, device_str(obj.device), dtype_str(obj.dtype),
                         shape_str(tuple(obj.shape)), fmt_bytes(tensor_nbytes(obj))])
    keys: dict = {}
    dtypes: set = set()
    numel = 0
    for _, tensor, is_param in _module_tensors(obj):
        key, size = storage_key(tensor)
        keys[key] = size
        if is_param:
            numel += tensor.nelement()
            dtypes.add(dtype_str(tensor.dtype))
    devices = "+".join(sorted(devices_of(obj), key=_device_order)) or "no tensors"
    return sep.join([type(obj).__name__, devices, "+".join(sorted(dtypes)) or "-",
                     f"{fmt_count(numel)} params", fmt_bytes(sum(keys.values()))])


# ---------------------------------------------------------------------------------------------------
# Resolving NAME without evaluating code
# ---------------------------------------------------------------------------------------------------

_INDEXABLE = ("ModuleList", "Sequential", "ModuleDict", "ParameterList", "ParameterDict")


def _static_attr(obj: Any, attr: str) -> Any:
    """``obj.attr`` without running code: a module's parameters/buffers/submodules, or a value found
    by ``inspect.getattr_static`` that is not a property or other descriptor."""
    import inspect

    if kind_of(obj) == "module":
        for table in ("_parameters", "_buffers", "_modules"):
            found = obj.__dict__.get(table, {})
            if attr in found:
                return found[attr]
    value = inspect.getattr_static(obj, attr)
    in_instance = attr in getattr(obj, "__dict__", {})
    if hasattr(type(value), "__get__") and not isinstance(value, type) and not in_instance:
        raise AttributeError(f"computed by code ({type(value).__name__}); %whereis does not run code")
    return value


_NAME_FORMS = "use NAME, NAME.attr, NAME[0] or NAME['key']"
_CONSTANT_INDEX = "only constant indices (0, -1, 'key') are allowed"


def resolve(expr: str, ns: Mapping[str, Any]) -> Any:
    """The object ``expr`` names in ``ns``: a name, attributes (``model.encoder``) and constant
    indices (``batch[0]``, ``d['w']``, ``model.layers[-1]``). Never evaluates code; raises
    MagicInputError (with close matches) for anything else."""
    import ast

    from .errors import MagicInputError

    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        raise MagicInputError(f"{expr!r} is not a name; {_NAME_FORMS}") from None

    def walk(node: Any) -> Any:
        if isinstance(node, ast.Name):
            if node.id not in ns:
                raise MagicInputError(f"name {node.id!r} is not defined{_did_you_mean(node.id, ns)}")
            return ns[node.id]
        if isinstance(node, ast.Attribute):
            base = walk(node.value)
            try:
                return _static_attr(base, node.attr)
            except AttributeError as exc:
                missing = f"{type(base).__name__} has no such attribute"
                detail = str(exc) if "run code" in str(exc) else missing
                raise MagicInputError(f"{ast.unparse(node)}: {detail}") from None
        if isinstance(node, ast.Subscript):
            base = walk(node.value)
            where = ast.unparse(node)
            try:
                key = ast.literal_eval(node.slice)
            except ValueError:
                raise MagicInputError(f"{where}: {_CONSTANT_INDEX}") from None
            if not isinstance(key, (int, str)) or isinstance(key, bool):
                raise MagicInputError(f"{where}: {_CONSTANT_INDEX}")
            if not isinstance(base, (list, tuple, dict)) and type(base).__name__ not in _INDEXABLE:
                raise MagicInputError(
                    f"{where}: %whereis indexes lists, tuples, dicts and module containers, "
                    f"not {type(base).__name__}"
                )
            try:
                return base[key]
            except (IndexError, KeyError, TypeError) as exc:
                raise MagicInputError(f"{where}: no such item ({type(exc).__name__})") from None
        raise MagicInputError(f"{expr!r} is not a name; {_NAME_FORMS}")

    return walk(tree)


def _did_you_mean(name: str, ns: Mapping[str, Any]) -> str:
    import difflib

    candidates = [n for n, _, _ in _placeables(ns) if "[" not in n]
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + ", ".join(close) + "?"
    if candidates:
        return "; tensors/modules/optimizers here: " + ", ".join(sorted(candidates)[:8])
    return "; no tensors, modules or optimizers are defined yet"


# ---------------------------------------------------------------------------------------------------
# The mixed-device diagnosis
# ---------------------------------------------------------------------------------------------------

_DEV = r"([a-z]+(?::\d+)?)"
# torch's wordings for "these tensors are on different devices", current and older, with the groups
# that name the devices (an older "torch.cuda.FloatTensor" names a device type by its 'cuda.').
_MISMATCH = [
    rf"Expected all tensors to be on the same device, but found at least two devices, {_DEV} and {_DEV}",
    rf"Expected all tensors to be on the same device, but got \w+ is on {_DEV}, different from other tensors "
    rf"on {_DEV}",
    r"Expected all tensors to be on the same device",
    rf"Tensor on device {_DEV} is not on the expected device {_DEV}",
    r"Expected object of device type (\w+) but got device type (\w+)",
    r"Expected object of type torch\.((?:cuda\.)?)\w+ but found type torch\.((?:cuda\.)?)\w+",
    r"Input type \(torch\.((?:cuda\.)?)\w+\) and weight type \(torch\.((?:cuda\.)?)\w+\) should be the same",
    r"Tensor for argument #\d+ '\w+' is on (CPU|GPU), but expected (?:it|them) to be on (CPU|GPU)",
    r"Expected a '(\w+)' device type for generator but found '(\w+)'",
    r"indices should be either on cpu or on the same device as the indexed tensor \(([a-z:0-9]+)\)",
]


def mismatch_devices(exc: BaseException) -> Optional[tuple]:
    """The devices a device-mismatch ``RuntimeError`` names (possibly ``()``), or None when ``exc``
    is not one. "Input type ... and weight type ... should be the same" counts only when the two
    types differ in device (the same words are used for a dtype mismatch)."""
    import re

    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    for pattern in _MISMATCH:
        found = re.search(pattern, text)
        if found is None:
            continue
        groups = [g for g in found.groups() if g is not None]
        if pattern.startswith(r"Expected object of type") or pattern.startswith(r"Input type"):
            devices = tuple("cuda" if g else "cpu" for g in groups)
            if len(set(devices)) < 2:
                return None
            return devices
        names = {"CPU": "cpu", "GPU": "cuda"}
        return tuple(names.get(g, g) for g in groups)
    return None


@dataclass(frozen=True)
class Culprit:
    """A name the failing cell used, and where its object lives (strings only)."""

    name: str
    kind: str
    devices: tuple
    summary: str
    on_failing_line: bool


@dataclass(repr=False)
class Diagnosis:
    """What a device-mismatch error involved: the names on the failing line and in the cell that
    refer to tensors or modules, their devices, and the line that fixes it. Strings only."""

    devices: tuple
    line: str
    lineno: Optional[int]
    culprits: list
    fixes: list

    def lines(self) -> list:
        devices = f" ({', '.join(self.devices)})" if self.devices else ""
        out = [f"whereis: a device mismatch{devices}: the tensors of one operation must be on one device."]
        on_line = [c for c in self.culprits if c.on_failing_line]
        elsewhere = [c for c in self.culprits if not c.on_failing_line]
        if self.line:
            where = f"line {self.lineno}" if self.lineno else "the failing line"
            out.append(f"On {where}: {self.line.strip()}")
        for title, group in (("  used there:", on_line), ("  elsewhere in the cell:", elsewhere)):
            if group:
                out.append(title)
                width = max(len(c.name) for c in group)
                for c in group:
                    out.append(f"    {c.name.ljust(width)}  {'+'.join(c.devices) or '-':<10}  {c.summary}")
        for fix in self.fixes:
            out.append("Fix: " + fix)
        return out

    def to_text(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        from .render import html_lines

        return html_lines(self.lines())

    def to_dict(self) -> dict:
        return {"devices": list(self.devices), "line": self.line, "lineno": self.lineno,
                "culprits": [c.__dict__.copy() for c in self.culprits], "fixes": list(self.fixes)}


def _name_chains(source: str) -> list:
    """Dotted names (``x``, ``model.encoder``, ``self.fc``) in ``source``, in order, without strings
    and comments; IPython syntax that does not tokenize falls back to a regular expression."""
    import io
    import re
    import tokenize

    chains: list = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", source)
    current: list = []
    expect_name = True
    for tok in tokens:
        if tok.type == tokenize.NAME and expect_name:
            current.append(tok.string)
            expect_name = False
        elif tok.type == tokenize.OP and tok.string == "." and current and not expect_name:
            expect_name = True
        else:
            if current:
                chains.append(".".join(current))
            current, expect_name = [], True
            if tok.type == tokenize.NAME:
                current, expect_name = [tok.string], False
    if current:
        chains.append(".".join(current))
    return chains


def _resolve_chain(chain: str, scopes: list) -> list:
    """(name, object) for each prefix of ``chain`` that resolves, without running code, to a tensor,
    module or optimizer in the first scope binding its head."""
    parts = chain.split(".")
    for scope in scopes:
        if parts[0] in scope:
            obj = scope[parts[0]]
            break
    else:
        return []
    found = []
    if kind_of(obj) is not None:
        found.append((parts[0], obj))
    for i, part in enumerate(parts[1:], start=2):
        try:
            obj = _static_attr(obj, part)
        except (AttributeError, TypeError):
            break
        if kind_of(obj) is not None:
            found.append((".".join(parts[:i]), obj))
    return found


def _culprit(name: str, obj: Any, on_line: bool) -> Culprit:
    kind = kind_of(obj)
    if kind == "tensor":
        summary = f"tensor {dtype_str(obj.dtype)} {shape_str(tuple(obj.shape))}"
    else:
        summary = f"{type(obj).__name__} ({kind})"
    return Culprit(name, kind or "", devices_of(obj), summary, on_line)


def _fixes(found: list) -> list:
    """The lines that would fix the mismatch: move tensors to their module's device, or to the
    accelerator the other tensors are on."""
    modules = [(n, o) for n, o in found if kind_of(o) == "module"]
    tensors = [(n, o) for n, o in found if kind_of(o) == "tensor"]
    fixes = []
    for name, module in modules:
        where = devices_of(module)
        if len(where) > 1:
            fixes.append(f"{name} is split across {', '.join(where)}: move all of it with "
                         f"{name}.to(device), or give each part inputs on its own device.")
            return fixes
    if modules:
        name, module = modules[0]
        target = devices_of(module)
        if target:
            for tname, tensor in tensors:
                if device_str(tensor.device) != target[0] and "." not in tname:
                    fixes.append(f"{tname} = {tname}.to(next({name}.parameters()).device)")
            if target[0] == "meta":
                fixes.append(f"{name} is on meta (no data): it cannot compute; load its weights onto a real "
                             f"device ({name}.to_empty(device=...) then load_state_dict).")
        if fixes:
            return fixes
    on = [device_str(t.device) for _, t in tensors]
    # The accelerator is where work is meant to run (meta stands in for one on CPU-only machines).
    accelerators = [d for d in on if d != "cpu"]
    target = accelerators[0] if accelerators else (on[0] if on else "")
    ref = next((n for n, t in tensors if device_str(t.device) == target), None)
    for tname, tensor in tensors:
        if device_str(tensor.device) != target and ref is not None and "." not in tname:
            fixes.append(f"{tname} = {tname}.to({ref}.device)")
    if not fixes:
        fixes.append("move every tensor of the failing operation to one device with .to(device) "
                     "(a module's device: next(model.parameters()).device).")
    return fixes


def diagnose(
    exc: BaseException,
    cell_source: str,
    user_ns: Mapping[str, Any],
    is_cell_file: Any,
) -> Optional[Diagnosis]:
    """A :class:`Diagnosis` of ``exc`` when it is a device-mismatch error, else None.

    The failing line is the deepest traceback frame whose file ``is_cell_file(filename)`` accepts
    (a notebook cell); its names are resolved in that frame's locals and globals, the cell's other
    names in ``user_ns``. Only static lookups: no code is evaluated, nothing is kept.
    """
    import linecache

    devices = mismatch_devices(exc)
    if devices is None:
        return None
    frame = None
    lineno = None
    tb = exc.__traceback__
    while tb is not None:
        if is_cell_file(tb.tb_frame.f_code.co_filename):
            frame, lineno = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    line = ""
    found_line: list = []
    if frame is not None:
        line = linecache.getline(frame.f_code.co_filename, lineno or 0)
        scopes = [frame.f_locals, frame.f_globals, user_ns]
        for chain in _name_chains(line.strip()):
            found_line.extend(_resolve_chain(chain, scopes))
    frame = tb = None  # drop the frames: the diagnosis keeps strings only
    found_cell: list = []
    for chain in _name_chains(cell_source):
        found_cell.extend(_resolve_chain(chain, [user_ns]))
    culprits = []
    seen: set = set()
    involved: list = []
    for on_line, group in ((True, found_line), (False, found_cell)):
        for name, obj in group:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            culprits.append(_culprit(name, obj, on_line))
            if on_line or not found_line:
                involved.append((name, obj))
    fixes = _fixes(involved)
    return Diagnosis(tuple(devices), line.rstrip("\n"), lineno, culprits, fixes)


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
