"""Walking a namespace without running code: every tensor, module and optimizer bound to a user's name
or held below one (in lists, tuples and dicts, as attributes of user objects), bounded in depth, width and
count; and the static attribute lookup ``%whereis NAME.attr`` and the diagnosis use.
"""
from __future__ import annotations

import types
from itertools import islice
from typing import Any, Iterator, Mapping, Optional

from ..caches import table
from .bydesign import holder_why
from .kinds import KIND_OF_TYPE, kind_of

# Names IPython itself binds in the user namespace; ``Out`` is read separately, as the output cache.
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def container_items(name: str, container: Any) -> Iterator[tuple[str, Any]]:
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
CONTAINERS = (list, tuple, dict)  # the container types the walks here look into
# Types whose instances the walk never looks into: code, classes, modules, IPython's own machinery, and
# this package's own result objects (``r = %gpumem free -o``), which hold names, strings and numbers and
# are not the user's memory.
_OPAQUE_MODULES = ("builtins", "IPython", "ipykernel", "ipywidgets", "traitlets", "types", "typing",
                   "torchgpu_magic")
_WALK_TYPE = table()  # per type: whether the walk looks into its instances
_HOLDER_WHY = table()  # per type: bydesign.holder_why of its instances (None for most)


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
    attribute of a user object. Records what it did not look into in ``cut``, and in ``why`` the names of
    tensors held by objects that keep them anywhere on purpose (a GradScaler's scale). Keeps nothing
    once iterated but names, reasons and counts."""

    def __init__(self, ns: Mapping[str, Any]) -> None:
        self.ns = ns
        self.visited = 0
        self.cut: list = []  # (name, why) for what the limits left out
        self.why: dict = {}  # name: why its tensor is fine on any device (bydesign.holder_why)

    def __iter__(self) -> Iterator[tuple[str, Any, str]]:
        kinds = KIND_OF_TYPE
        seen: set = set()  # containers, user objects, modules and optimizers already walked (cycles)
        for name, obj in list(self.ns.items()):
            if name[:1] == "_" or name in IPYTHON_NAMES:
                continue
            typ = type(obj)
            try:
                kind = kinds[typ]
            except (KeyError, TypeError):  # a type not seen yet, or an unhashable metaclass's instance
                kind = kind_of(obj)
            if kind == "tensor":
                yield name, obj, kind
            elif kind is not None:
                seen.add(id(obj))
                yield name, obj, kind
            elif typ in CONTAINERS or _walkable(obj):
                yield from self._inside(name, obj, WALK_DEPTH, seen)

    def _inside(self, name: str, obj: Any, depth: int, seen: set) -> Iterator[tuple[str, Any, str]]:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        held = None
        if isinstance(obj, CONTAINERS):
            size = len(obj)
            items: Any = container_items(name, obj)
        else:
            attrs = _attributes(obj)
            if not attrs:
                return
            held = _HOLDER_WHY.get(type(obj), False)
            if held is False:
                held = _HOLDER_WHY[type(obj)] = holder_why(obj)
            size = len(attrs)
            items = ((f"{name}.{key}", value) for key, value in list(attrs.items())
                     if type(key) is str and key[:2] != "__")
        if size == 0:
            return
        if depth == 0:
            self.cut.append((name, f"deeper than {WALK_DEPTH} levels"))
            return
        if size > WALK_WIDTH:
            self.cut.append((name, f"{size:,} items, the first {WALK_WIDTH:,} looked into"))
        for sub, item in islice(items, WALK_WIDTH):
            self.visited += 1
            if self.visited > WALK_LIMIT:
                self.cut.append((name, f"stopped after {WALK_LIMIT:,} objects"))
                return
            kind = kind_of(item)
            if kind == "tensor":
                if held:
                    self.why[sub] = held
                yield sub, item, kind
            elif kind is not None:
                if id(item) not in seen:
                    seen.add(id(item))
                    yield sub, item, kind
            elif type(item) in CONTAINERS or _walkable(item):
                yield from self._inside(sub, item, depth - 1, seen)


def static_attr(obj: Any, attr: str) -> Any:
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
