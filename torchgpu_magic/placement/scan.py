"""The namespace scan: the per-cell snapshot behind ``--watch`` and ``%%ontorch``'s footer, and the
``--watch`` line (the ``%whereis`` table is in :mod:`.namespace`).

Snapshots and reports hold names, strings, numbers and ``id()`` values, never the objects, so keeping
one around pins no GPU memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .common import (
    _KIND_BY_TYPE,
    IPYTHON_NAMES,
    _container_items,
    _module_tensors,
    _optimizer_tensors,
    _sep,
    device_str,
    devices_of,
    dtype_str,
    fmt_count,
    kind_of,
    shape_str,
    storage_key,
    tensor_nbytes,
)

# Containers looked into (one level deep) by the per-cell snapshot only when this small, so a list of a
# million floats in the namespace never slows every cell down; the full %whereis table looks into all.
SNAPSHOT_CONTAINER_LIMIT = 64
_UNSEEN = object()  # a type kind_of has not classified yet


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
    if kind == "tensor":  # the same object at the same version counter is unchanged
        return (id(obj), obj._version, obj.device, obj.dtype, obj.shape)
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
    as ``{name: Placed}`` (shared with the next call's cache: read it, do not change it). Never keeps a
    reference to the objects.

    Fast because an unchanged tensor under an unchanged name reuses the previous snapshot's entry
    after comparing its id and version counter (in-place ops, ``resize_`` and ``set_`` bump the
    counter; a new object under the name has a new id). ``x.data = ...`` bumps nothing and is not
    seen until the name is rebound.
    """
    old = _CACHE.entries
    new: dict = {}
    fresh = False  # whether any entry differs from the last snapshot's
    kind_by_type = _KIND_BY_TYPE.get
    old_get = old.get
    containers = (list, tuple, dict)
    skip = IPYTHON_NAMES
    for name, obj in list(ns.items()):
        kind = kind_by_type(type(obj), _UNSEEN)
        if kind is _UNSEEN:
            kind = kind_of(obj)
        if kind is None and type(obj) not in containers:
            continue
        if name[:1] == "_" or name in skip:
            continue
        if kind == "tensor":
            cached = old_get(name)
            if cached is not None:
                fp = cached.fingerprint
                try:
                    if fp[0] == id(obj) and fp[1] == obj._version:
                        new[name] = cached
                        continue
                except (RuntimeError, AttributeError, TypeError):
                    continue
            _snap_one(name, obj, kind, old, new, new)
            fresh = fresh or new.get(name) is not old.get(name)
        elif kind is not None:
            _snap_one(name, obj, kind, old, new, new)
            fresh = fresh or new.get(name) is not old.get(name)
        elif kind is None and 0 < len(obj) <= SNAPSHOT_CONTAINER_LIMIT:
            for sub, item in _container_items(name, obj):
                item_kind = kind_of(item)
                if item_kind is not None:
                    _snap_one(sub, item, item_kind, old, new, new)
                    fresh = fresh or new.get(sub) is not old.get(sub)
    if not fresh and len(new) == len(old):
        return old  # nothing changed: the same dict, which changed() recognises at once
    _CACHE.entries = new
    return new


def changed(before: Mapping[str, Placed], after: Mapping[str, Placed]) -> list:
    """The entries of ``after`` that are new or whose fingerprint differs from ``before``'s, in
    ``after``'s order."""
    if after is before:
        return []
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
