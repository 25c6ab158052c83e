"""The namespace scan: the per-cell snapshot behind ``--watch`` and ``%%ontorch``'s footer, the
``--watch`` line and the footer's line (the ``%whereis`` table is in :mod:`.table`).

Snapshots and reports hold names, strings, numbers and ``id()`` values, never the objects, so keeping
one around pins no GPU memory.
"""
from __future__ import annotations

import operator
import re
import types
from itertools import compress
from operator import ne
from typing import Any, Mapping, NamedTuple, Optional

from ..render import fmt_count, separator
from .accounting import account, optimizer_tensors
from .bydesign import LOADER_WHY, loader_names, tensor_why
from .kinds import device_str, dtype_str, kind_of, shape_str, tensor_nbytes
from .names import resolve
from .walk import CONTAINERS, IPYTHON_NAMES, container_items

# Containers looked into (one level deep) by the per-cell snapshot only when this small, so a list of a
# million floats in the namespace never slows every cell down; the full %whereis table looks into all.
SNAPSHOT_CONTAINER_LIMIT = 64


class Placed(NamedTuple):
    """What a name pointed to at snapshot time; holds no reference to the object itself.

    ``fingerprint`` changes when the object is replaced, moved, reshaped or changes dtype. A named tuple:
    one is made for each name a cell binds, before ``--watch``'s line and ``%%ontorch``'s footer."""

    name: str
    kind: str
    devices: tuple
    summary: str
    nbytes: int
    fingerprint: tuple


def _placed(name: str, obj: Any, kind: str, fingerprint: tuple) -> Placed:
    if kind == "tensor":  # the hot path of the footer and --watch: the account's figures, read directly
        summary = f"{dtype_str(obj.dtype)} {shape_str(tuple(obj.shape))}"
        return Placed(name, kind, (device_str(obj.device),), summary, tensor_nbytes(obj), fingerprint)
    acc = account(obj, gradients=False)
    count = fmt_count(acc.tree.params) if kind == "module" else acc.params
    summary = f"{type(obj).__name__} {count} params"
    return Placed(name, kind, acc.devices, summary, acc.nbytes(), fingerprint)


class SnapshotCache:
    """What one caller's last :func:`namespace_snapshot` saw, so that the next one re-examines only
    the names that changed: an unchanged tensor costs its ``id()`` and ``_version``, read for the whole
    namespace at C speed (``map``), and no Python-level work at all.

    Holds names, ``id()`` values, version counters and :class:`Placed` entries, never the objects.
    Each caller that snapshots one namespace again and again (``--watch``) keeps its own, so snapshots
    of other mappings in between (``%%ontorch``'s footer) do not make it start over.
    """

    def __init__(self) -> None:
        self.entries: dict = {}  # the last snapshot, {entry name: Placed}, as returned
        self.keys: list = []  # every name of the namespace, in its order
        self.ids: list = []  # id() of each one's object
        self.tensors: list = []  # the names bound directly to a readable tensor
        self.versions: list = []  # each one's _version
        self.produced: dict = {}  # name: the entry names it gave ('x',) or ('batch[0]', 'batch[1]')
        self.rescan: set = set()  # names bound to modules, optimizers, containers: changed in place unseen


_CACHE = SnapshotCache()
_VERSION = operator.attrgetter("_version")


def _fingerprint(obj: Any, kind: str) -> tuple:
    """What changes when the object is replaced or placed anew. A tensor: the same object at the same
    version counter is unchanged. A module: any of its parameters or buffers moved, changed dtype or
    shape, or tensors added or removed. An optimizer: its parameters' devices, then its state tensors'
    keys, devices and dtypes."""
    if kind == "tensor":
        return (id(obj), obj._version, obj.device, obj.dtype, obj.shape)
    if kind == "module":
        return (id(obj), hash(tuple((t.device, t.dtype, t.shape) for mod in obj.modules()
                                    for table in (mod._parameters, mod._buffers)
                                    for t in table.values() if t is not None)))
    params = tuple(p.device for group in obj.param_groups for p in group.get("params", ()))
    state = tuple((key, t.device, t.dtype) for _, _, key, t in optimizer_tensors(obj))
    return (id(obj), hash(params + state))


def _snap_one(name: str, obj: Any, kind: str, old: Mapping[str, Placed]) -> Optional[Placed]:
    """``old``'s entry for ``name`` while its fingerprint still holds, else a new one; None for an
    object that cannot be read (half-initialised or exotic)."""
    cached = old.get(name)
    try:
        fingerprint = _fingerprint(obj, kind)
        if cached is None or cached.fingerprint != fingerprint:
            cached = _placed(name, obj, kind, fingerprint)
    except (RuntimeError, AttributeError, TypeError):
        return None
    return cached


def _examine(name: str, obj: Any, old: Mapping[str, Placed]) -> tuple:
    """What one name of the namespace gives the snapshot: ``(entries, version, rescan)``, the
    ``(entry name, Placed)`` pairs, the tensor's version counter when ``name`` is bound to a tensor
    (None otherwise), and whether the next snapshot must look at it again even when it is still bound
    to the same object (modules, optimizers and containers change in place without a version
    counter; an unreadable tensor is retried)."""
    if name[:1] == "_" or name in IPYTHON_NAMES:
        return (), None, False
    kind = kind_of(obj)
    if kind == "tensor":
        placed = _snap_one(name, obj, kind, old)
        if placed is None:
            return (), None, True
        return ((name, placed),), placed.fingerprint[1], False
    if kind is not None:
        placed = _snap_one(name, obj, kind, old)
        return (((name, placed),) if placed is not None else ()), None, True
    if type(obj) not in CONTAINERS:
        return (), None, False
    found = []
    if 0 < len(obj) <= SNAPSHOT_CONTAINER_LIMIT:
        for sub, item in container_items(name, obj):
            item_kind = kind_of(item)
            if item_kind is not None:
                placed = _snap_one(sub, item, item_kind, old)
                if placed is not None:
                    found.append((sub, placed))
    return tuple(found), None, True


def namespace_snapshot(ns: Mapping[str, Any], cache: Optional[SnapshotCache] = None) -> dict:
    """The tensors, nn.Modules and optimizers bound to names in ``ns`` (names starting with ``_``
    skipped), and those one level inside small lists, tuples and dicts (``batch[0]``, ``d['w']``),
    as ``{name: Placed}`` in ``ns``'s order (shared with the next call: read it, do not change it).
    Never keeps a reference to the objects.

    Incremental, through ``cache`` (a module-wide one by default): only names bound anew, tensors
    whose version counter moved (in-place ops, ``resize_`` and ``set_`` bump it) and the modules,
    optimizers and containers (which change in place without one) are looked at; when nothing changed
    the previous snapshot's dict itself is returned, which :func:`changed` recognises at once.
    ``x.data = ...`` bumps nothing and is not seen until the name is rebound.
    """
    cache = _CACHE if cache is None else cache
    keys, ids = list(ns), list(map(id, ns.values()))
    kept = cache.tensors
    gone: Any = ()
    if keys == cache.keys and ids == cache.ids:  # the same objects under the same names
        stale: set = set()
    elif keys[:len(cache.keys)] == cache.keys:  # names only added (a cell's usual change): by position
        stale = set(compress(keys, map(ne, ids, cache.ids)))
        stale.update(keys[len(cache.keys):])
        if not stale.isdisjoint(kept):
            kept = [name for name in kept if name not in stale]
    else:
        now, before = dict(zip(keys, ids)), dict(zip(cache.keys, cache.ids))
        stale = {name for name, _ in now.items() - before.items()}  # new, or bound to another object
        gone = before.keys() - now.keys()
        dropped = stale.union(gone)
        if not dropped.isdisjoint(kept):
            kept = [name for name in kept if name not in dropped]
    try:
        versions = list(map(_VERSION, map(ns.__getitem__, kept)))
    except Exception:  # noqa: BLE001 - a tensor subclass whose counter fails: look at each one
        kept, versions, bumped = [], [], set(kept)
    else:
        if kept is cache.tensors:
            bumped = () if versions == cache.versions else {
                name for name, v, w in zip(kept, versions, cache.versions) if v != w}
        else:
            prior_versions = dict(zip(cache.tensors, cache.versions))
            bumped = {name for name, v in zip(kept, versions) if prior_versions[name] != v}
    todo = stale.union(bumped, cache.rescan.difference(gone))
    if todo:  # the names looked at again are added back to the tensors below
        pairs = [(name, v) for name, v in zip(kept, versions) if name not in bumped]
        kept, versions = [name for name, _ in pairs], [v for _, v in pairs]

    old = cache.entries
    produced = cache.produced
    entries: Optional[dict] = None  # a copy of ``old``, made at the first difference
    reorder = False
    rescan = set()
    for name in todo:
        found, version, again = _examine(name, ns[name], old)
        if version is not None:
            kept.append(name)
            versions.append(version)
        if again:
            rescan.add(name)
        names = tuple(sub for sub, _ in found)
        prior = produced.get(name, ())
        if names == prior and all(old[sub] is placed for sub, placed in found):
            continue
        if entries is None:
            entries, produced = dict(old), dict(produced)
        if names != prior:
            for sub in prior:
                del entries[sub]
            if names:
                produced[name] = names
                reorder = True
            else:
                del produced[name]
        entries.update(found)
    for name in gone:
        if name in produced:
            if entries is None:
                entries, produced = dict(old), dict(produced)
            for sub in produced.pop(name):
                del entries[sub]
    if reorder:  # something appeared: put the entries in the namespace's order again
        entries = {sub: entries[sub] for name in keys if name in produced for sub in produced[name]}
    cache.keys, cache.ids, cache.tensors, cache.versions, cache.rescan = keys, ids, kept, versions, rescan
    if entries is None:
        return old  # nothing changed: the same dict
    cache.entries, cache.produced = entries, produced
    return entries


def changed(before: Mapping[str, Placed], after: Mapping[str, Placed]) -> list:
    """The entries of ``after`` that are new or whose fingerprint differs from ``before``'s, in
    ``after``'s order."""
    if after is before:
        return []
    return [placed for name, placed in after.items()
            if (prior := before.get(name)) is not placed
            and (prior is None or prior.fingerprint != placed.fingerprint)]


def watch_line(changes: list, before: Mapping[str, Placed]) -> str:
    """One compact line for ``--watch``: ``whereis: new x cpu float32 (3,) | moved model cpu→meta``."""
    sep = f" {separator()} "
    arrow = "→" if separator() == "·" else "->"
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


def changed_elsewhere(before: Mapping[str, Placed], touched: Mapping[str, Any], device: Any,
                      cache: Optional[SnapshotCache] = None) -> list:
    """What :func:`changed` says of ``touched`` against ``before``, less the plain tensors already on
    ``device``: the footer names only what is elsewhere, and a tensor on the device costs one read of
    its device here instead of a snapshot entry (after a busy cell each read of a tensor misses the
    CPU's caches)."""
    here = str(device)
    if here in ("cpu", "meta"):  # a flag read, where .device would make a torch.device per tensor
        flag = "is_cpu" if here == "cpu" else "is_meta"
        rest = {name: obj for name, obj in touched.items()
                if kind_of(obj) != "tensor" or not getattr(obj, flag)}
    else:
        rest = {name: obj for name, obj in touched.items()
                if kind_of(obj) != "tensor" or device_str(obj.device) != here}
    return changed(before, namespace_snapshot(rest, cache)) if rest else []


FOOTER_SKIPS = "the default device skips from_numpy, torch.Tensor(), torch.normal, device= and older objects"


def footer_line(device: Any, changes: list, ns: Mapping[str, Any], cell: str = "") -> str:
    """``%%ontorch``'s footer: the device that ran the cell, and the new or changed objects (``changes``,
    from :func:`changed`) that are not on it. Tensors on the cpu on purpose are said apart, as such: RNG
    states, pinned host buffers, and the batches ``cell`` takes from a DataLoader (only these few
    names are looked up again in ``ns``, and only when something is elsewhere)."""
    here = str(device)
    elsewhere: list = []
    by_design: dict = {}  # why: [names]
    loaders: Optional[set] = None
    for placed in changes:
        if not placed.devices or placed.devices == (here,):
            continue
        why = None
        if placed.kind == "tensor" and placed.devices == ("cpu",):
            try:
                why = tensor_why(resolve(placed.name, ns), "cpu")
            except Exception:  # noqa: BLE001 - a name gone or unreadable: said as it is
                why = None
            if why is None:
                loaders = loader_names(cell, ns) if loaders is None else loaders
                if placed.name.split("[")[0].split(".")[0] in loaders:
                    why = LOADER_WHY
        if why is None:
            elsewhere.append(placed)
        else:
            by_design.setdefault(why, []).append(placed.name)
    line = f"%%ontorch: ran on {here}"
    if elsewhere:
        shown = [f"{p.name} ({'+'.join(p.devices)}, {p.summary})" for p in elsewhere[:5]]
        more = f" and {len(elsewhere) - 5} more" if len(elsewhere) > 5 else ""
        line += f"; not on {here}: {', '.join(shown)}{more} ({FOOTER_SKIPS})"
    if by_design:
        line += "; on cpu by design: " + "; ".join(f"{', '.join(names)} ({why})"
                                                  for why, names in by_design.items())
    return line


# Names whose use lets a cell bind or change names the footer cannot see in its code: the namespace
# itself (globals, vars, sys.modules['__main__']), exec and eval, IPython (magics become get_ipython()
# calls), setattr on a module. A cell that uses any of them is watched whole.
_DYNAMIC = frozenset({"globals", "vars", "locals", "exec", "eval", "execfile", "compile", "get_ipython",
                      "setattr", "delattr", "__dict__", "__builtins__", "__import__", "importlib", "runpy",
                      "sys", "builtins", "user_ns"})


def names_bound(codes: list, source: str, ns: Mapping[str, Any], depth: int = 2) -> Optional[set]:
    """The names a cell compiled to ``codes`` can bind or change: those its code mentions (every global
    it loads, stores or deletes, and attribute names), with the functions and classes it defines, and
    the code of the notebook's own functions, classes and objects it calls (``__main__``'s, ``depth``
    calls deep: a helper that sets ``global model`` or moves ``model`` names it). None when the cell can
    reach names its code does not mention (``exec``, ``globals()``, a magic, ``import *``): then the
    caller watches the whole namespace. ``source`` is the cell's (transformed) text, where ``import *``
    is looked for. Reads code only; runs nothing."""
    if "*" in source and re.search(r"\bimport\s+\*", source):
        return None
    names: set = set()
    seen: set = set()
    stack = [(code, depth) for code in codes]
    while stack:
        code, left = stack.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        mentioned = code.co_names
        if not _DYNAMIC.isdisjoint(mentioned):
            return None
        names.update(mentioned)
        stack.extend((const, left) for const in code.co_consts if isinstance(const, types.CodeType))
        if left <= 0:
            continue
        for name in mentioned:
            obj = ns.get(name)
            if obj is None:
                continue
            owner = obj if isinstance(obj, type) else type(obj)
            if isinstance(obj, types.FunctionType):
                if getattr(obj, "__module__", None) == "__main__":
                    stack.append((obj.__code__, left - 1))
            elif getattr(owner, "__module__", None) == "__main__":  # a class of the notebook, or its object
                stack.extend((member.__code__, left - 1) for klass in owner.__mro__
                             if getattr(klass, "__module__", None) == "__main__"
                             for member in vars(klass).values() if isinstance(member, types.FunctionType))
    return names
