"""What the placement modules share: the kinds of objects placement reports on, the cheap facts of one
object (devices, dtype, storage, bytes), the walks over a module's or an optimizer's tensors and over
a namespace, the static attribute lookup, and small formatting helpers.

Only reads, never keeps an object. torch is imported lazily, on first use. The per-type and
per-device caches live here once, shared by every module of the package.
"""
from __future__ import annotations

import sys
from typing import Any, Iterator, Mapping, Optional

_TORCH: Any = None
_KIND_BY_TYPE: dict = {}
_DEVICE_STR: dict = {}
_DTYPE_STR: dict = {}
# Names IPython itself binds in the user namespace; ``Out`` is read separately, as the output cache.
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


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


# ---------------------------------------------------------------------------------------------------
# Walking a namespace without running code
# ---------------------------------------------------------------------------------------------------


def _container_items(name: str, container: Any) -> Iterator[tuple[str, Any]]:
    """(display name, item) one level inside a list, tuple or dict: ``batch[0]``, ``d['w']``."""
    if isinstance(container, dict):
        for key, item in list(container.items()):
            if isinstance(key, (str, int, float, bool)) or key is None:
                yield f"{name}[{key!r}]", item
    else:
        for index, item in enumerate(container):
            yield f"{name}[{index}]", item


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
    """'a, b' for table cells; '-' when there is nothing to list."""
    return ", ".join(items) if items else "-"


def _sep() -> str:
    """'·' where stdout can print it, '|' elsewhere (like render.MICRO's 'µs' / 'us')."""
    from .. import render

    return "·" if render.MICRO == "µs" else "|"


def is_floating(tensor: Any) -> bool:
    """Whether ``tensor`` holds floating or complex values (whose dtype is worth a column: the dtypes
    of integer buffers such as BatchNorm's counter are left out); False when it cannot say."""
    try:
        return bool(tensor.is_floating_point() or tensor.is_complex())
    except (RuntimeError, AttributeError):
        return False


def _device_order(device: str) -> tuple:
    """Sort key listing accelerators first (by type, then index), then cpu, then meta."""
    kind, _, index = device.partition(":")
    rank = {"cpu": 1, "meta": 3}.get(kind, 0)
    return (rank, kind, int(index) if index.isdigit() else -1)


def _grad_state(trainable: int, total: int) -> str:
    """The 'grad' / 'trainable' cell: 'yes', 'no', the trainable share ('25 %'), or '-' without elements."""
    if total == 0:
        return "-"
    if trainable == total:
        return "yes"
    return "no" if trainable == 0 else f"{100 * trainable / total:.0f} %"

