"""The names a cell uses, and fake copies of them for a prediction.

:func:`names_read` reads a cell's code without running it: the names it reads, and, through the functions
defined in the notebook that it calls, the globals those read. :func:`fake_namespace` copies the values of
those names with ``copy.deepcopy`` while a ``TorchFunctionMode`` turns every tensor met on the way into a
``FakeTensor`` (shapes, dtypes and storages sharing as in the original, no memory) on the device the
prediction runs on. One memo for all names keeps the objects' links (an optimizer's parameters are its
model's), the copies of notebook functions read their globals from the copies, and nothing of the user's
is moved or changed: the user's tensors are only read for their metadata (and a 0-dim cpu tensor, an
optimizer's ``step``, for its value).
"""
from __future__ import annotations

import ast
import copy
import dis
import types
from typing import Any, Mapping, Optional

from ..errors import MagicInputError
from ..torchapi import STORAGE_ID, fake_tensor_class, tensor_base_clone, torch_function_disabled
from .run import find_objects


class CopyError(MagicInputError):
    """A value the cell uses cannot be copied for a prediction; the message says which and why."""


def _code_globals(code: types.CodeType) -> set:
    """The global names ``code`` (and the code nested in it) reads or writes."""
    found = {instr.argval for instr in dis.get_instructions(code)
             if instr.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL")}
    nested = (_code_globals(const) for const in code.co_consts if isinstance(const, types.CodeType))
    return found.union(*nested)


def is_notebook_function(value: Any, ns: Mapping[str, Any]) -> bool:
    """A function defined in the notebook: its globals are the user's namespace."""
    return isinstance(value, types.FunctionType) and value.__globals__ is ns


def names_read(tree: ast.AST, ns: Mapping[str, Any]) -> list:
    """The names of ``ns`` the cell reads (not those it assigns before reading them), and the globals
    read by the notebook functions it uses, transitively; in a stable order."""
    wanted: set = set()
    assigned: set = set()  # names a top-level statement assigned before any later one reads them
    for statement in getattr(tree, "body", [tree]):
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store) and node.id not in assigned:
                wanted.add(node.id)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                wanted.add(node.target.id)
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            assigned.update(t.id for t in targets if isinstance(t, ast.Name))
    seen: set = set()
    todo = sorted(wanted)
    while todo:
        name = todo.pop()
        if name in seen or name not in ns:
            continue
        seen.add(name)
        value = ns[name]
        if is_notebook_function(value, ns):
            todo.extend(sorted(_code_globals(value.__code__) - seen))
    return sorted(seen)


class _Copier:
    """Makes the fake tensors of a copy: one per real tensor, views of one fake base per real storage."""

    def __init__(self, fake_mode: Any, device: str, resize: Mapping[int, int]) -> None:
        self.fake_mode = fake_mode
        self.device = device
        self.resize = resize
        self.bases: dict = {}
        self.made: dict = {}  # id(real) -> (real, fake): the real kept alive while copying only

    def fake_of(self, tensor: Any) -> Any:
        import torch

        if isinstance(tensor, fake_tensor_class()):
            return tensor
        hit = self.made.get(id(tensor))
        if hit is not None:
            return hit[1]
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise CopyError(f"a {tensor.layout} {'quantized ' * tensor.is_quantized}tensor of shape "
                            f"{tuple(tensor.shape)}: --predict copies dense tensors only")
        scalar = tensor.dim() == 0 and tensor.device.type == "cpu" and not tensor.requires_grad
        value = tensor.item() if scalar else None  # read before fake mode: it refuses real tensors
        with self.fake_mode, torch.no_grad():
            fake = self._make(tensor, value)
            if tensor.requires_grad and (fake.is_floating_point() or fake.is_complex()):
                fake.requires_grad_(True)
        self.made[id(tensor)] = (tensor, fake)
        grad = tensor.grad if tensor.is_leaf else None
        if grad is not None:
            if id(tensor) in self.resize:
                with self.fake_mode:
                    fake.grad = torch.empty_like(fake)
            else:
                fake.grad = self.fake_of(grad)
        return fake

    def _make(self, tensor: Any, value: Any) -> Any:
        import torch

        if value is not None:
            # torch keeps scalars such as an optimizer's step on the cpu and reads them (.item()); a
            # fake made from a Python number keeps its value, so such reads work on the copy.
            return torch.tensor(value, dtype=tensor.dtype)
        if id(tensor) in self.resize:
            shape = (self.resize[id(tensor)], *tensor.shape[1:])
            return torch.empty(shape, dtype=tensor.dtype, device=self.device)
        storage = tensor.untyped_storage()
        key = STORAGE_ID(storage)
        base = self.bases.get(key)
        if base is None:
            base = self.bases[key] = torch.empty(storage.nbytes(), dtype=torch.uint8, device=self.device)
        usable = base.numel() - base.numel() % tensor.element_size()
        typed = (base if usable == base.numel() else base[:usable]).view(tensor.dtype)
        return typed.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset()).detach()


def _copy_mode(copier: _Copier) -> Any:
    """A TorchFunctionMode that makes ``deepcopy`` of tensors (and the ``clone`` a Parameter's deepcopy
    calls) return fakes from ``copier``; everything else runs as usual."""
    import torch
    from torch.overrides import TorchFunctionMode

    clone = tensor_base_clone()

    class CopyToFake(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.Tensor.__deepcopy__:
                tensor, memo = args
                if id(tensor) not in memo:
                    memo[id(tensor)] = copier.fake_of(tensor)
                return memo[id(tensor)]
            if func is clone:
                return copier.fake_of(args[0])
            with torch_function_disabled():
                return func(*args, **kwargs)

    return CopyToFake()


def _rebind(func: types.FunctionType, ns: dict) -> types.FunctionType:
    """A copy of a notebook function whose globals are ``ns`` (the copies), not the user's namespace."""
    out = types.FunctionType(func.__code__, ns, func.__name__, func.__defaults__, func.__closure__)
    out.__kwdefaults__ = func.__kwdefaults__
    out.__dict__.update(func.__dict__)
    out.__qualname__, out.__doc__, out.__module__ = func.__qualname__, func.__doc__, func.__module__
    return out


def fake_namespace(ns: Mapping[str, Any], names: list, fake_mode: Any, device: str,
                   resize: Optional[Mapping[int, int]] = None) -> tuple:
    """``(namespace, copies)``: a new namespace holding fake copies of ``ns[name]`` for ``names``, the
    tensors in them on ``device`` (``resize`` maps ``id(tensor)`` to a new first dimension, for
    ``--fit``); and ``[(name, copy)]`` of what was copied. Python modules, classes and builtins are
    shared; notebook functions are rebound to the new namespace; what ``deepcopy`` refuses is shared
    when it holds no tensor, module or optimizer (a custom operator, a lock), else a :class:`CopyError`
    naming it."""
    out: dict = {"__builtins__": ns.get("__builtins__", __builtins__),
                 "__name__": ns.get("__name__", "__main__")}
    copier = _Copier(fake_mode, device, resize or {})
    memo: dict = {}
    for name in names:
        value = ns[name]
        if isinstance(value, types.ModuleType):
            memo[id(value)] = value
        elif is_notebook_function(value, ns):
            memo[id(value)] = _rebind(value, out)
    copies = []
    try:
        with _copy_mode(copier):
            for name in names:
                try:
                    out[name] = copy.deepcopy(ns[name], memo)
                except MagicInputError as exc:
                    raise CopyError(f"cannot copy {name} for a prediction: {exc}") from None
                except Exception as exc:  # noqa: BLE001 - whatever deepcopy refuses: shared, or one line
                    if find_objects([(name, ns[name])]):
                        first = str(exc).splitlines()[0] if str(exc) else ""
                        raise CopyError(f"cannot copy {name} for a prediction ({type(exc).__name__}: "
                                        f"{first}); --predict copies the models, optimizers, tensors and "
                                        f"plain values a cell uses") from None
                    out[name] = ns[name]  # holds no tensor (a custom op, a lock): shared as it is
                copies.append((name, out[name]))
            _copy_grads(memo, copier)
    finally:
        copier.made.clear()
    return out, copies


def _copy_grads(memo: dict, copier: _Copier) -> None:
    """Give each copied parameter its original's gradient: a Parameter's ``deepcopy`` copies its data
    (through ``clone``, which gives the fake) but not its ``.grad``. ``deepcopy`` keeps the originals it
    copied in ``memo[id(memo)]``."""
    import torch

    for original in memo.get(id(memo), []):
        if isinstance(original, torch.Tensor) and original.is_leaf and original.grad is not None:
            fake = memo.get(id(original))
            if fake is not None and fake.grad is None:
                fake.grad = copier.fake_of(original.grad)


def mark_target(copies: list, foreach: bool) -> None:
    """Set ``foreach`` on every copied optimizer's parameter groups where the user left it to torch
    (None) and no fused or differentiable implementation was asked for: True where torch would use its
    foreach kernels on the target (a GPU), False elsewhere."""
    for _, opt, kind in find_objects(copies):
        if kind != "optimizer" or "foreach" not in getattr(opt, "defaults", {}):
            continue
        for group in opt.param_groups:
            if group.get("foreach") is None and not group.get("fused") and not group.get("differentiable"):
                group["foreach"] = foreach
