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


def _hooks(module: Any) -> list:
    """The accelerate hooks on ``module`` (its ``_hf_hook``, a SequentialHook's parts), read from the
    instance dict so that a module without one costs a dict lookup and no ``__getattr__`` miss."""
    hook = module.__dict__.get("_hf_hook")
    if hook is None:
        return []
    return list(getattr(hook, "hooks", None) or [hook])


def offload_place(module: Any, name: str) -> Optional[str]:
    """Where accelerate keeps the weights of ``module.<name>`` when they are offloaded (the module's
    own tensor is then on meta and the hook loads the weights for each forward): 'cpu' (a state dict
    in memory) or 'disk' (an offload folder); None when the module's hook does not offload."""
    for hook in _hooks(module):
        if not getattr(hook, "offload", False):
            continue
        weights = getattr(hook, "weights_map", None)
        data = getattr(weights, "dataset", weights)
        key = getattr(weights, "prefix", "") + name
        if isinstance(data, dict):
            return "cpu"
        in_memory = getattr(data, "state_dict", None)
        if isinstance(in_memory, dict) and key in in_memory:
            return "cpu"
        index = getattr(data, "index", None)
        if isinstance(index, dict) and key in index:
            return "disk"
        return "cpu"
    return None


def offload_map(module: Any) -> dict:
    """{id(tensor): 'cpu' | 'disk'} for the meta tensors of ``module``'s tree that stand in for weights
    accelerate offloads; empty (one dict lookup per module) for a model without hooks."""
    found: dict = {}
    for mod in module.modules():
        if "_hf_hook" not in mod.__dict__:
            continue
        for table in (mod._parameters, mod._buffers):
            for name, tensor in table.items():
                if tensor is not None and tensor.is_meta:
                    place = offload_place(mod, name)
                    if place is not None:
                        found[id(tensor)] = place
    return found


def execution_device(module: Any) -> Optional[str]:
    """The device accelerate runs ``module``'s forward on (its hook's execution device), or None."""
    for hook in _hooks(module):
        device = getattr(hook, "execution_device", None)
        if device is not None:
            return device_str(device) if not isinstance(device, int) else f"cuda:{device}"
    return None


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


# How far the namespace walk looks below a name (``trainer.model``, ``batch[0]['x']``,
# ``cfg.data.train[3]``), how many items of one container or attributes of one object it reads, and how
# many objects it visits in all: enough for the objects users keep, bounded so a namespace holding a
# list of a million floats or a deep graph costs no more than a few milliseconds.
WALK_DEPTH = 3
WALK_WIDTH = 1_000
WALK_LIMIT = 100_000
_CONTAINERS = (list, tuple, dict)
# Types whose instances the walk never looks into: code, classes, modules, IPython's own machinery.
_OPAQUE_MODULES = ("builtins", "IPython", "ipykernel", "ipywidgets", "traitlets", "types", "typing")
_WALK_TYPE: dict = {}


def _walkable(obj: Any) -> bool:
    """Whether ``obj`` is a user object (a ``Trainer``, a dataclass, a ``SimpleNamespace``, a
    DataLoader) whose instance attributes may hold tensors; cached per type."""
    typ = type(obj)
    try:
        return _WALK_TYPE[typ]
    except KeyError:
        pass
    except TypeError:
        return False
    import types

    module = getattr(typ, "__module__", "") or ""
    walkable = (
        (typ is types.SimpleNamespace or module.split(".")[0] not in _OPAQUE_MODULES)
        and not issubclass(typ, (type, types.ModuleType, types.FunctionType, types.MethodType,
                                 types.BuiltinFunctionType))
        and hasattr(typ, "__dict__")
    )
    _WALK_TYPE[typ] = walkable
    return walkable


def _attributes(obj: Any) -> Optional[dict]:
    """The instance ``__dict__`` of ``obj``, read without running its ``__getattr__`` or properties."""
    try:
        found = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return found if type(found) is dict else None


class Walk:
    """The bounded walk over a namespace: (name, object, kind) for every tensor, module and optimizer
    bound to a public name, or held (``WALK_DEPTH`` levels deep) in a list, tuple or dict or as an
    attribute of a user object. Records what it did not look into in ``cut``. Keeps nothing once
    iterated but names and counts."""

    def __init__(self, ns: Mapping[str, Any], depth: int = WALK_DEPTH, width: int = WALK_WIDTH,
                 limit: int = WALK_LIMIT) -> None:
        self.ns = ns
        self.depth, self.width, self.limit = depth, width, limit
        self.visited = 0
        self.cut: list = []  # (name, why) for what the limits left out

    def __iter__(self) -> Iterator[tuple[str, Any, str]]:
        kinds = _KIND_BY_TYPE
        seen: set = set()  # containers, user objects, modules and optimizers already walked (cycles)
        for name, obj in list(self.ns.items()):
            if name[:1] == "_" or name in IPYTHON_NAMES:
                continue
            typ = type(obj)
            kind = kinds[typ] if typ in kinds else kind_of(obj)
            if kind == "tensor":
                yield name, obj, kind
            elif kind is not None:
                seen.add(id(obj))
                yield name, obj, kind
            elif typ in _CONTAINERS or _walkable(obj):
                yield from self._inside(name, obj, self.depth, seen)

    def _inside(self, name: str, obj: Any, depth: int, seen: set) -> Iterator[tuple[str, Any, str]]:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, _CONTAINERS):
            size = len(obj)
            items: Any = _container_items(name, obj)
        else:
            attrs = _attributes(obj)
            if not attrs:
                return
            size = len(attrs)
            items = ((f"{name}.{key}", value) for key, value in list(attrs.items())
                     if type(key) is str and key[:2] != "__")
        if size == 0:
            return
        if depth == 0:
            self.cut.append((name, f"deeper than {self.depth} levels"))
            return
        if size > self.width:
            self.cut.append((name, f"{size:,} items, the first {self.width:,} looked into"))
        for index, (sub, item) in enumerate(items):
            if index >= self.width:
                break
            self.visited += 1
            if self.visited > self.limit:
                self.cut.append((name, f"stopped after {self.limit:,} objects"))
                return
            kind = kind_of(item)
            if kind == "tensor":
                yield sub, item, kind
            elif kind is not None:
                if id(item) not in seen:
                    seen.add(id(item))
                    yield sub, item, kind
            elif type(item) in _CONTAINERS or _walkable(item):
                yield from self._inside(sub, item, depth - 1, seen)


def _placeables(ns: Mapping[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """(name, object, kind) for every placeable object of ``ns``: bound to a public name, or held in
    containers and user objects below one (see :class:`Walk`)."""
    return iter(Walk(ns))


def grad_of(tensor: Any) -> Any:
    """``tensor.grad`` for a leaf tensor (None otherwise), read without the warning a non-leaf gives."""
    try:
        return tensor.grad if tensor.is_leaf else None
    except (RuntimeError, AttributeError):
        return None


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
    rank = {"cpu": 1, "disk": 2, "meta": 3}.get(kind, 0)
    return (rank, kind, int(index) if index.isdigit() else -1)


def _grad_state(trainable: int, total: int) -> str:
    """The 'grad' / 'trainable' cell: 'yes', 'no', the trainable share ('25 %'), or '-' without elements."""
    if total == 0:
        return "-"
    if trainable == total:
        return "yes"
    return "no" if trainable == 0 else f"{100 * trainable / total:.0f} %"

