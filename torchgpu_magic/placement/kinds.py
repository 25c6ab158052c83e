"""What one tensor is, read cheaply and cached where torch allows: the kind of an object (tensor,
module, optimizer), device and dtype names, the storage behind a tensor and its bytes, its gradient.
The per-tensor reads :mod:`.accounting` builds every account from; torch is imported on first use.
"""
from __future__ import annotations

import operator
from typing import Any, Optional

from ..caches import cache, table
from ..torchapi import STORAGE_ID

KIND_OF_TYPE = table()
"""type -> :func:`kind_of` its instances (a walk over 10,000 objects reads it at C speed)."""
DEVICE_TEXT = table()
"""torch.device -> :func:`device_str` of it (read at C speed by the per-tensor walks)."""
_DEVICE = operator.attrgetter("device")


@cache
def torch_module() -> Any:
    """The torch module, imported on first use so that importing the package stays free."""
    import torch
    import torch.optim

    return torch


def kind_of(obj: Any) -> Optional[str]:
    """'tensor', 'module' or 'optimizer' for the objects placement reports on; None for the rest.
    Cached per type, so the namespace scan costs one dict lookup per object."""
    typ = type(obj)
    try:
        return KIND_OF_TYPE[typ]
    except KeyError:
        pass
    except TypeError:  # unhashable metaclass instance: not one of ours
        return None
    torch = torch_module()
    bases = (("tensor", torch.Tensor), ("module", torch.nn.Module), ("optimizer", torch.optim.Optimizer))
    kind = KIND_OF_TYPE[typ] = next((name for name, base in bases if issubclass(typ, base)), None)
    return kind


def device_str(device: Any) -> str:
    """``str(torch.device)``, cached: 'cpu', 'cuda:0', 'meta'."""
    try:
        return DEVICE_TEXT[device]
    except KeyError:
        text = str(device)
        if len(DEVICE_TEXT) < 256:
            DEVICE_TEXT[device] = text
        return text


@cache
def dtype_str(dtype: Any) -> str:
    """'float32' for ``torch.float32`` (cached)."""
    return str(dtype).replace("torch.", "")


def tensor_nbytes(tensor: Any) -> int:
    """Bytes of the elements ``tensor`` addresses (its own view: numel × element size)."""
    try:
        return int(tensor.nelement()) * int(tensor.element_size())
    except (RuntimeError, TypeError, NotImplementedError):
        return 0


def storage_key(tensor: Any) -> tuple:
    """(key, bytes) of the memory behind ``tensor``: views and tied weights share one key (an int, the
    address of torch's storage object, unique while it lives), so totals count their storage once.
    Tensors without a storage (sparse, some subclasses) get a key of their own, ``('t', id)``, and their
    view's size."""
    try:
        storage = tensor.untyped_storage()
        return STORAGE_ID(storage), int(storage.nbytes())
    except (RuntimeError, TypeError, NotImplementedError, AttributeError):
        return ("t", id(tensor)), tensor_nbytes(tensor)


def device_names(tensors: list) -> list:
    """:func:`device_str` of each tensor's device, read for the whole list at C speed (``map``) when every
    device is in :data:`DEVICE_TEXT` already, as it nearly always is."""
    devices = list(map(_DEVICE, tensors))
    names = list(map(DEVICE_TEXT.get, devices))
    return list(map(device_str, devices)) if None in names else names


def storage_keys(tensors: list) -> tuple:
    """:func:`storage_key` of each tensor as two lists, (keys, bytes): torch's getters mapped over the
    list (tens of nanoseconds a tensor, where a Python loop pays a microsecond). One tensor that cannot
    be read this way (sparse, some subclasses) sends the whole list through :func:`storage_key`."""
    torch = torch_module()
    try:
        storages = list(map(torch.Tensor.untyped_storage, tensors))
        return list(map(STORAGE_ID, storages)), list(map(torch.UntypedStorage.nbytes, storages))
    except (RuntimeError, TypeError, NotImplementedError, AttributeError):
        pairs = list(map(storage_key, tensors))
        return [key for key, _ in pairs], [size for _, size in pairs]


def grad_of(tensor: Any) -> Any:
    """``tensor.grad`` for a leaf tensor (None otherwise), read without the warning a non-leaf gives."""
    try:
        return tensor.grad if tensor.is_leaf else None
    except (RuntimeError, AttributeError):
        return None


def shape_str(shape: tuple) -> str:
    """'(3, 4)'; '()' for a scalar."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def device_order(device: str) -> tuple:
    """Sort key listing accelerators first (by type, then index), then cpu, then disk, then meta."""
    kind, _, index = device.partition(":")
    rank = {"cpu": 1, "disk": 2, "meta": 3}.get(kind, 0)
    return (rank, kind, int(index) if index.isdigit() else -1)
