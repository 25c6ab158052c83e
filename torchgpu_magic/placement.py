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
# Containers looked into (one level deep) by the per-cell snapshot only when this small, so a list of a
# million floats in the namespace never slows every cell down; the full %whereis table looks into all.
SNAPSHOT_CONTAINER_LIMIT = 64


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
    """'float32' for ``torch.float32``."""
    return str(dtype).replace("torch.", "")


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
        if tensor.is_meta or tensor.layout != _torch().strided:
            raise NotImplementedError
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        nbytes = int(storage.nbytes())
        if ptr == 0:
            raise NotImplementedError
        return ("s", device_str(tensor.device), ptr, nbytes), nbytes
    except (RuntimeError, TypeError, NotImplementedError, AttributeError):
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
        if name[:1] == "_":
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
