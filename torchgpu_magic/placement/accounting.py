"""The one account of an object's tensors, which every placement view reads: the ``%whereis`` table and
its totals, the module and optimizer reports, ``%%ontorch``'s footer and ``--move``, the mismatch
diagnosis, and the out-of-memory report's "who holds memory, by name".

:func:`account` takes a tensor, an ``nn.Module`` or an optimizer and returns an :class:`Account`: every
storage it holds, once, with the device the memory is on and its **role**

- ``tensor`` (a plain tensor's data), ``parameter``, ``buffer`` (a module's), ``gradient`` (``.grad``),
- ``state`` (an optimizer's per-parameter state, e.g. Adam's moments), ``step`` (its step counters),

and from those the devices the object lives on (:attr:`Account.devices`), the bytes per device and role
(:meth:`Account.by_role`), the parts torch keeps off those devices on purpose (:attr:`Account.kept_off`,
the rules are :mod:`.bydesign`'s) and optimizer state that is not where torch needs it
(:attr:`Account.misplaced`). The rules, once: bytes are storage bytes, each storage counted once per
object (views and tied weights share one); an optimizer's parameters belong to their module and count
there, not to the optimizer; a part kept off the object's devices on purpose (Adam's ``step`` on cpu
beside state on a GPU) is neither where the object lives nor in that device's bytes, and every view says
so in words.

An account holds numbers, strings and storage keys, never a tensor. torch is imported lazily.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Iterator, NamedTuple, Optional

from . import bydesign
from .kinds import (
    device_names,
    device_order,
    device_str,
    dtype_str,
    grad_of,
    kind_of,
    storage_key,
    storage_keys,
    tensor_nbytes,
    torch_module,
)
from .offload import offload_places
from .tree import ModuleNode, Walk

_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class Share:
    """What an object holds on one device: ``nbytes`` of its own storages there (roles other than
    gradient, each storage once), ``grad_bytes`` of gradients there, and for modules the parameter
    elements (``numel``, of which ``trainable``) and dtypes (names) of the tensors there."""

    __slots__ = ("device", "nbytes", "grad_bytes", "numel", "trainable", "dtypes")

    def __init__(self, device: str) -> None:
        self.device = device
        self.nbytes = self.grad_bytes = self.numel = self.trainable = 0
        self.dtypes: set = set()


@dataclass(repr=False)
class Account:
    """What one tensor, module or optimizer holds, as numbers (see the module's docstring for the rules).

    ``storages`` maps each storage key to (device, role, bytes); ``shares`` has a :class:`Share` per device
    the object lives on (and per device holding only its gradients); ``kept_off`` lists (role, device,
    bytes, why) for parts torch keeps off the object's devices on purpose; ``misplaced`` lists (what,
    device, expected device) for optimizer state that is not where torch needs it. For a module ``tree``
    is the :class:`ModuleNode` of its root and ``hooks`` accelerate's (execution device, offload places)
    per hooked module; for an optimizer ``params`` counts parameter tensors and ``groups`` has per group
    (parameters, their devices, state devices, state bytes); for a tensor ``view_bytes`` is its own view's
    bytes and ``why`` says why it is on the cpu on purpose (an RNG state, pinned memory), if it is."""

    kind: str
    what: str
    devices: tuple
    storages: dict
    shares: dict
    kept_off: list = field(default_factory=list)
    misplaced: list = field(default_factory=list)
    params: int = 0
    groups: list = field(default_factory=list)
    tree: Optional[ModuleNode] = None
    hooks: list = field(default_factory=list)
    view_bytes: int = 0
    why: Optional[str] = None

    def by_role(self) -> dict:
        """{(device, role): bytes} of every storage held, each counted once; parts kept off the object's
        devices on purpose included, under their own device and role."""
        out: dict = {}
        for device, role, size in self.storages.values():
            out[(device, role)] = out.get((device, role), 0) + size
        return out

    def nbytes(self, gradients: bool = False) -> int:
        """Bytes of its own storages on all its devices: what the reports show as its bytes. Gradients
        (with ``gradients=True``: them alone) and parts kept off its devices on purpose are not in it."""
        return sum(s.grad_bytes if gradients else s.nbytes for s in self.shares.values())

    def to_dict(self) -> dict:
        """Plain data: kind, class, devices, bytes per device and role, and what is kept off or misplaced."""
        return {"kind": self.kind, "what": self.what, "devices": list(self.devices),
                "bytes": {d: s.nbytes for d, s in self.shares.items()},
                "gradient_bytes": {d: s.grad_bytes for d, s in self.shares.items() if s.grad_bytes},
                "by_role": [{"device": d, "role": r, "bytes": b} for (d, r), b in self.by_role().items()],
                "kept_off": [{"role": r, "device": d, "bytes": b, "why": w} for r, d, b, w in self.kept_off],
                "misplaced": [{"what": w, "device": d, "expected": e} for w, d, e in self.misplaced]}


def account(obj: Any, gradients: bool = True) -> Optional[Account]:
    """The :class:`Account` of a tensor, module or optimizer; None for anything else. ``gradients=False``
    leaves gradients out (the module report, which does not show them, is the hot path of ``%whereis
    MODEL``). Reads only; keeps nothing."""
    kind = kind_of(obj)
    if kind == "tensor":
        return _tensor_account(obj, gradients)
    if kind == "module":
        return _module_account(obj, gradients)
    if kind == "optimizer":
        return _optimizer_account(obj)
    return None


def devices_of(obj: Any) -> tuple:
    """The devices (sorted strings) a tensor, module or optimizer lives on, from its :func:`account`;
    ``()`` for anything else or a module without tensors."""
    found = account(obj, gradients=False)
    return found.devices if found is not None else ()


def _share(shares: dict, device: str) -> Share:
    share = shares.get(device)
    if share is None:
        share = shares[device] = Share(device)
    return share


def _shares(storages: dict, devices: Any) -> dict:
    """A :class:`Share` per device of ``devices`` (where the object lives) and per device holding its
    gradients, with the bytes of ``storages`` there; storages on other devices (parts kept off on
    purpose) are in no share."""
    shares = {device: Share(device) for device in _ordered(devices)}
    for device, role, size in storages.values():
        if role == "gradient":
            _share(shares, device).grad_bytes += size
        elif device in devices:
            _share(shares, device).nbytes += size
    return shares


class TensorFacts(NamedTuple):
    """A plain tensor's account in one tuple, for the views that read thousands of them (the namespace
    table): its device, storage key and bytes, its own view's bytes, its gradient's (key, device, bytes)
    or None, whether it is pinned ('yes' / 'no' / '-'), and why it is on the cpu on purpose (or None)."""

    device: str
    key: tuple
    nbytes: int
    view_bytes: int
    grad: Optional[tuple]
    pinned: str
    why: Optional[str]


def tensor_facts(tensor: Any, gradients: bool = True) -> TensorFacts:
    """The :class:`TensorFacts` of a tensor: what :func:`account` says of it, without the objects."""
    columns = tensor_columns([tensor], gradients)
    return TensorFacts(*(column[0] for column in columns[:len(TensorFacts._fields)]))


class TensorColumns(NamedTuple):
    """:class:`TensorFacts` of many tensors as columns (lists in the tensors' order), plus their dtypes,
    shapes and ``requires_grad``: what the namespace table reads for 10,000 tensors at once."""

    devices: list
    keys: list
    nbytes: list
    view_bytes: list
    grads: list
    pinned: list
    why: list
    dtypes: list
    shapes: list
    requires_grad: list


def tensor_columns(tensors: list, gradients: bool = True) -> TensorColumns:
    """The facts of ``tensors`` read at once, as :func:`~.kinds.storage_keys` reads their storages; the
    rare parts (gradients, pinned memory, RNG states) only for the tensors they can concern."""
    torch = torch_module()
    devices = device_names(tensors)
    keys, sizes = storage_keys(tensors)
    try:
        views = list(map(operator.mul, map(torch.Tensor.nelement, tensors),
                         map(torch.Tensor.element_size, tensors)))
    except (RuntimeError, TypeError, NotImplementedError, AttributeError):
        views = list(map(tensor_nbytes, tensors))
    dtypes = list(map(_DTYPE, tensors))
    requires_grad = list(map(_REQUIRES_GRAD, tensors))
    grads: list = [None] * len(tensors)
    if gradients and any(requires_grad):
        for index in compress(range(len(tensors)), requires_grad):
            found = grad_of(tensors[index])
            if found is not None:
                gkey, gsize = storage_key(found)
                grads[index] = (gkey, device_str(found.device), gsize)
    maybe_pinned = bydesign.pinned_possible()
    pinned = [("no" if d == "cpu" else "-") for d in devices] if not maybe_pinned else [
        bydesign.pinned(t, d) for t, d in zip(tensors, devices)]
    uint8 = torch.uint8
    why = [bydesign.tensor_why(tensor, device, pin) if dtype is uint8 or pin == "yes" else None
           for tensor, device, dtype, pin in zip(tensors, devices, dtypes, pinned)]
    shapes = list(map(_SHAPE, tensors))
    return TensorColumns(devices, keys, sizes, views, grads, pinned, why, dtypes, shapes, requires_grad)


def _tensor_account(tensor: Any, gradients: bool) -> Account:
    facts = tensor_facts(tensor, gradients)
    device = facts.device
    storages = {facts.key: (device, "tensor", facts.nbytes)}
    if facts.grad is not None and facts.grad[0] not in storages:
        storages[facts.grad[0]] = (facts.grad[1], "gradient", facts.grad[2])
    shares = _shares(storages, (device,))
    share = shares[device]
    share.numel = tensor.nelement()
    share.trainable = share.numel if tensor.requires_grad else 0
    share.dtypes.add(dtype_str(tensor.dtype))
    return Account("tensor", type(tensor).__name__, (device,), storages, shares,
                   view_bytes=facts.view_bytes, why=facts.why)


def _module_account(module: Any, gradients: bool) -> Account:
    walk = Walk(module, gradients)
    tree, storages = walk.tree, walk.storages
    if len(tree.devices) == 1 and not walk.grads:  # the common case: the whole tree on one device
        device = next(iter(tree.devices))
        share = Share(device)
        share.nbytes = tree.nbytes
        shares = {device: share}
    else:
        shares = _shares(storages, tree.devices)
    if len(tree.devices) == 1:
        share = shares[next(iter(tree.devices))]
        share.numel, share.trainable = tree.params, tree.trainable
        share.dtypes = {dtype_str(d) for d in tree.dtypes}
    elif tree.devices:
        _split_shares(module, shares)
    return Account("module", type(module).__name__, _ordered(tree.devices), storages, shares, tree=tree,
                   hooks=walk.hooks)


def _split_shares(module: Any, shares: dict) -> None:
    """Parameter elements, trainable elements and dtypes per device, for a module split across devices
    (a second, rarer pass: the walk keeps them for the whole tree only)."""
    for mod in module.modules():
        places = offload_places(mod)
        for table, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                device = places.get(name) or device_str(tensor.device)
                share = _share(shares, device)
                dtype = tensor.dtype  # a buffer's only when floating or complex, as the walk shows them
                if is_param or dtype.is_floating_point or dtype.is_complex:
                    share.dtypes.add(dtype_str(dtype))
                if is_param:
                    numel = tensor.nelement()
                    share.numel += numel
                    if tensor.requires_grad:
                        share.trainable += numel


def optimizer_tensors(optimizer: Any) -> Iterator[tuple]:
    """(group index, parameter, state key, tensor) for every tensor of an optimizer's state, including
    tensors in lists (L-BFGS keeps its history that way). Parameters without state yield nothing."""
    torch = torch_module()
    state = optimizer.state
    for index, group in enumerate(optimizer.param_groups):
        for param in group.get("params", ()):
            values = state.get(param) if state else None
            if not isinstance(values, dict):
                continue
            for key, value in values.items():
                if isinstance(value, torch.Tensor):
                    yield index, param, key, value
                elif isinstance(value, (list, tuple)):
                    for item in value:
                        if isinstance(item, torch.Tensor):
                            yield index, param, key, item


def _optimizer_account(optimizer: Any) -> Account:
    groups = optimizer.param_groups
    param_devices = [{device_str(p.device) for p in group.get("params", ())} for group in groups]
    storages: dict = {}
    state_devices: list = [set() for _ in groups]
    state_bytes = [0] * len(groups)
    steps: list = []  # (group, storage key, device, bytes, whether it belongs on its parameter's device)
    misplaced: list = []
    for index, param, key, tensor in optimizer_tensors(optimizer):
        device = device_str(tensor.device)
        home = device_str(param.device)
        skey, size = storage_key(tensor)
        if bydesign.is_step(key, tensor):
            on_param = bydesign.step_on_param_device(groups[index])
            steps.append((index, skey, device, size, on_param))
            if on_param and device != home:
                misplaced.append((key, device, home))
            continue
        if skey not in storages:
            storages[skey] = (device, "state", size)
            state_bytes[index] += size
        state_devices[index].add(device)
        if device != home:
            misplaced.append((key, device, home))
    placed = set().union(*param_devices, *state_devices)
    kept: dict = {}
    for index, skey, device, size, on_param in steps:
        if skey in storages:
            continue
        storages[skey] = (device, "step", size)
        if device == "cpu" and not on_param and placed and device not in placed:
            kept[device] = kept.get(device, 0) + size  # beside state elsewhere: where torch keeps it
        else:
            placed.add(device)
            state_bytes[index] += size
    group_rows = [(len(g.get("params", ())), _ordered(p), _ordered(s), b)
                  for g, p, s, b in zip(groups, param_devices, state_devices, state_bytes)]
    kept_off = [("step", device, size, bydesign.STEP_WHY) for device, size in sorted(kept.items())]
    return Account("optimizer", type(optimizer).__name__, _ordered(placed), storages,
                   _shares(storages, placed), kept_off, misplaced, params=sum(n for n, *_ in group_rows),
                   groups=group_rows)


def _ordered(devices: Any) -> tuple:
    """Device names in report order: accelerators, then cpu, disk, meta."""
    return tuple(sorted(devices, key=device_order))


def grad_state(trainable: int, total: int) -> str:
    """The 'grad' / 'trainable' cell: 'yes', 'no', the trainable share ('25 %'), or '-' without elements."""
    if total == 0:
        return "-"
    if trainable == total:
        return "yes"
    return "no" if trainable == 0 else f"{100 * trainable / total:.0f} %"
