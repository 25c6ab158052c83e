"""The accounting of an object's tensors, which every placement view reads: what kind of object it is
(tensor, module, optimizer), the tensors it holds (a module's parameters and buffers, an optimizer's
parameters and state), their devices, dtypes and bytes, and the storage behind each, so that views and
tied weights are counted once.

Only reads, never keeps an object. torch is imported lazily, on first use. The per-type and per-device
caches live here once, shared by every module of the package.
"""
from __future__ import annotations

import sys
from typing import Any, Iterator, Optional

_TORCH: Any = None
_KIND_BY_TYPE: dict = {}
_DEVICE_STR: dict = {}
_DTYPE_STR: dict = {}


def _torch() -> Any:
    """The torch module, imported on first use so that importing the package stays free."""
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
    """(key, bytes) of the memory behind ``tensor``: views and tied weights share one key (the address
    of torch's storage object, unique while it lives), so totals count their storage once. Tensors
    without a storage (sparse, some subclasses) get a key of their own and their view's size.

    Two C calls on the common path: this runs once per tensor of every report."""
    try:
        storage = tensor.untyped_storage()
        return ("s", storage._cdata), int(storage.nbytes())
    except (RuntimeError, TypeError, NotImplementedError, AttributeError):
        return ("t", id(tensor)), tensor_nbytes(tensor)


def module_totals(module: Any) -> tuple[int, int, set]:
    """A module's parameter count, its bytes with shared storage counted once (tied weights), and the
    dtypes of its parameters: the one-line summary ``%whereis`` and the ``--watch`` snapshot both give."""
    sizes: dict = {}
    dtypes: set = set()
    numel = 0
    for _, tensor, is_param in _module_tensors(module):
        key, size = storage_key(tensor)
        sizes[key] = size
        if is_param:
            numel += tensor.nelement()
            dtypes.add(tensor.dtype)
    return numel, sum(sizes.values()), dtypes


def _pinned(tensor: Any, device: str) -> str:
    """'yes' / 'no' for a CPU tensor in page-locked memory or not; '-' on other devices, where it
    means nothing. ``device`` is ``device_str(tensor.device)``, which the callers already have."""
    if device != "cpu":
        return "-"
    # torch's is_pinned asks cudaPointerGetAttributes, which creates a CUDA context on the current GPU
    # when none has one yet. Pinned memory comes from a CUDA context, so without one the answer is no.
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized() or not any(
                torch._C._cuda_hasPrimaryContext(i) for i in range(torch.cuda.device_count())):
            return "no"
        return "yes" if tensor.is_pinned() else "no"
    except (RuntimeError, AttributeError):
        return "no"


def grad_of(tensor: Any) -> Any:
    """``tensor.grad`` for a leaf tensor (None otherwise), read without the warning a non-leaf gives."""
    try:
        return tensor.grad if tensor.is_leaf else None
    except (RuntimeError, AttributeError):
        return None


def is_floating(tensor: Any) -> bool:
    """Whether ``tensor`` holds floating or complex values (whose dtype is worth a column: the dtypes
    of integer buffers such as BatchNorm's counter are left out); False when it cannot say."""
    try:
        return bool(tensor.is_floating_point() or tensor.is_complex())
    except (RuntimeError, AttributeError):
        return False
