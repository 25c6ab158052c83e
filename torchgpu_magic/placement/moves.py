"""Moving existing objects to a device, all or nothing: ``%%ontorch --move``.

A move checks everything first and refuses, in one line, what would lose data or cannot work: to
``meta`` (which keeps shapes and drops every value) unless asked for explicitly, out of ``meta`` (there is
nothing to copy), or leaving an optimizer pointing at parameters the move replaces. Then it moves, and
when anything fails half-way (out of memory on the target, say) it puts every module back as it was,
so a failed move changes nothing.

Modules move through ``Module.to`` (its ``_apply`` hooks, RNN weight flattening and accelerate's
overrides run as usual). Where torch replaces a parameter rather than swapping its data (cpu to meta),
an optimizer moved with the module is re-pointed at the new parameters, its state re-keyed, as if it
had been created after the move.

torch is imported inside the functions, so importing this module stays cheap.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..errors import MagicInputError

DISCARD_FLAG = "--discard-data"
"""The option of ``%%ontorch`` that allows a move to meta (shown in the refusal)."""


def movable_kind(obj: Any) -> Optional[str]:
    """'tensor', 'module' or 'optimizer' for what :func:`move` can move; None for anything else."""
    import torch

    if isinstance(obj, torch.Tensor):
        return "tensor"
    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    return None


def move(targets: list, device: Any, discard_data: bool = False,
         ns: Optional[Mapping[str, Any]] = None) -> list:
    """Move ``targets`` ([(name, object)]: tensors, modules, optimizers' state) to ``device``; return
    [(name, object to bind, bytes moved)] in the same order.

    Modules move in place; a plain tensor cannot, so the new tensor must be bound to its name (the
    ``x = x.to(device)`` idiom); a lone parameter is swapped in place where torch allows it. An
    optimizer's state moves the way ``Optimizer.load_state_dict`` places it (``step`` stays unless the
    group is capturable or fused), and it follows its module's parameters when they are replaced.
    ``ns`` (the user namespace) is searched for optimizers that hold such parameters without being
    moved. Raises :class:`MagicInputError` (one line, nothing changed) for anything it cannot do.
    """
    import torch

    device = torch.device(device)
    kinds = []
    for name, obj in targets:
        kind = movable_kind(obj)
        if kind is None:
            raise MagicInputError(f"cannot move {name}, a {type(obj).__name__}: --move takes tensors, "
                                  "nn.Modules and optimizers")
        kinds.append(kind)
    _refuse_what_cannot_move(targets, kinds, device, discard_data)
    replacing = _replaces_parameters(device)
    if replacing and ns is not None:
        _refuse_stranded_optimizers(targets, kinds, ns)
    # 1. New tensors and optimizer state, computed before anything is changed.
    new_tensors: dict = {}
    new_state: dict = {}
    try:
        for (name, obj), kind in zip(targets, kinds):
            if kind == "tensor" and not _on(obj, device):
                source = obj.data if isinstance(obj, torch.nn.Parameter) else obj
                new_tensors[name] = source.to(device)
            elif kind == "optimizer":
                new_state[name] = _moved_state(obj, device)
    except Exception as exc:  # noqa: BLE001 - out of memory, a backend's refusal: one line, nothing moved
        raise MagicInputError(f"could not move {name} to {device} ({_why(exc)}); nothing was moved") from None
    # 2. Modules, through Module.to, all put back if one fails.
    modules = [(name, obj) for (name, obj), kind in zip(targets, kinds) if kind == "module"]
    saved = [_slots(module) for _, module in modules]
    moved_bytes: dict = {}
    done = 0
    try:
        for name, module in modules:
            moved_bytes[name] = sum(_nbytes(t) for t in _unique_tensors(module) if not _on(t, device))
            module.to(device)
            done += 1
    except Exception as exc:  # noqa: BLE001 - restore every module, then report in one line
        for slots in saved[: done + 1]:
            _restore(slots)
        raise MagicInputError(f"could not move {name} to {device} ({_why(exc)}); nothing was moved") from None
    replaced = {id(old): mod_table[key] for slots in saved for mod_table, key, old, _data, _grad in slots
                if old is not None and mod_table[key] is not old}
    # 3. Bind: optimizers re-pointed and their state moved; tensors replaced.
    result = []
    for (name, obj), kind in zip(targets, kinds):
        if kind == "module":
            result.append((name, obj, moved_bytes[name]))
        elif kind == "optimizer":
            _repoint(obj, replaced)
            state, nbytes = new_state[name]
            for param, values in state.items():
                obj.state[replaced.get(id(param), param)].update(values)
            result.append((name, obj, nbytes))
        elif name not in new_tensors:
            result.append((name, obj, 0))
        elif isinstance(obj, torch.nn.Parameter):
            result.append((name, _set_parameter(obj, new_tensors[name]), _nbytes(obj)))
        else:
            result.append((name, new_tensors[name], _nbytes(obj)))
    return result


def _refuse_what_cannot_move(targets: list, kinds: list, device: Any, discard_data: bool) -> None:
    """Out of meta: nothing to copy. Into meta: every value dropped, allowed only with DISCARD_FLAG."""
    from_meta = [name for (name, obj), kind in zip(targets, kinds)
                 if device.type != "meta" and any(t.is_meta for t in _tensors(obj, kind))]
    if from_meta:
        what = ", ".join(from_meta)
        raise MagicInputError(
            f"--move: {what} {'is' if len(from_meta) == 1 else 'are'} on meta, which holds no values to copy "
            f"to {device}; create {'it' if len(from_meta) == 1 else 'them'} there instead (a module: "
            f"{from_meta[0]}.to_empty(device='{device}'), then load its weights)")
    if device.type == "meta" and not discard_data:
        losing = [name for (name, obj), kind in zip(targets, kinds)
                  if any(not t.is_meta for t in _tensors(obj, kind))]
        if losing:
            its = "its" if len(losing) == 1 else "their"
            raise MagicInputError(
                f"--move: moving {', '.join(losing)} to meta would drop {its} values (meta keeps shapes "
                f"only; nothing can move back); add {DISCARD_FLAG} to do it anyway")


def _refuse_stranded_optimizers(targets: list, kinds: list, ns: Mapping[str, Any]) -> None:
    """An optimizer in the namespace holding parameters of a module the move replaces must move too."""
    moving_opts = {id(obj) for (_, obj), kind in zip(targets, kinds) if kind == "optimizer"}
    params: dict = {}
    for (name, obj), kind in zip(targets, kinds):
        if kind == "module":
            params.update((id(p), name) for p in obj.parameters())
    if not params:
        return
    for opt_name, value in list(ns.items()):
        if opt_name[:1] == "_" or movable_kind(value) != "optimizer" or id(value) in moving_opts:
            continue
        for group in value.param_groups:
            owner = next((params[id(p)] for p in group.get("params", ()) if id(p) in params), None)
            if owner is not None:
                raise MagicInputError(
                    f"--move: {opt_name} holds parameters of {owner}, which this move replaces; move them "
                    f"together (--move {owner},{opt_name}) so {opt_name} follows them")


def _replaces_parameters(device: Any) -> bool:
    """Whether ``Module.to(device)`` replaces parameters instead of swapping their data in place (to or
    from meta, or when torch is told to overwrite them on conversion)."""
    import torch

    return device.type == "meta" or bool(torch.__future__.get_overwrite_module_params_on_conversion())


def _tensors(obj: Any, kind: str) -> list:
    if kind == "tensor":
        return [obj]
    if kind == "module":
        return _unique_tensors(obj)
    import torch

    return [v for state in obj.state.values() if isinstance(state, dict)
            for v in state.values() if isinstance(v, torch.Tensor)]


def _moved_state(optimizer: Any, device: Any) -> tuple:
    """({param: {key: new tensor}}, bytes) for the optimizer's state tensors not yet on ``device``."""
    import torch

    moved: dict = {}
    total = 0
    for group in optimizer.param_groups:
        keep_step = not (group.get("capturable") or group.get("fused"))
        for param in group.get("params", ()):
            state = optimizer.state.get(param)
            if not isinstance(state, dict):
                continue
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) or _on(value, device) or (key == "step" and keep_step):
                    continue
                moved.setdefault(param, {})[key] = value.to(device)
                total += _nbytes(value)
    return moved, total


def _slots(module: Any) -> list:
    """(table, key, object, its data, its grad) for every parameter and buffer slot of the module tree:
    enough to put it back exactly after a failed ``Module.to``."""
    slots = []
    for mod in module.modules():
        for table in (mod._parameters, mod._buffers):
            for key, tensor in table.items():
                if tensor is None:
                    slots.append((table, key, None, None, None))
                else:
                    grad = tensor.grad if tensor.is_leaf else None
                    slots.append((table, key, tensor, tensor.data, grad))
    return slots


def _restore(slots: list) -> None:
    for table, key, tensor, data, grad in slots:
        table[key] = tensor
        if tensor is not None:
            tensor.data = data
            if tensor.is_leaf:
                tensor.grad = grad


def _repoint(optimizer: Any, replaced: dict) -> None:
    """Point the optimizer's groups and state at the parameters that replaced the old ones."""
    if not replaced:
        return
    for group in optimizer.param_groups:
        group["params"] = [replaced.get(id(p), p) for p in group["params"]]
    for old in [p for p in optimizer.state if id(p) in replaced]:
        optimizer.state[replaced[id(old)]] = optimizer.state.pop(old)


def _set_parameter(param: Any, data: Any) -> Any:
    """A lone parameter moved: its data swapped in place where torch allows it (cpu <-> cuda), as
    ``Module.to`` does, else a new Parameter (to meta)."""
    import torch

    try:
        param.data = data
    except RuntimeError:
        return torch.nn.Parameter(data, requires_grad=param.requires_grad)
    return param


def _unique_tensors(module: Any) -> list:
    return list(module.parameters()) + list(module.buffers())


def _on(tensor: Any, device: Any) -> bool:
    here = tensor.device
    return here.type == device.type and (device.index is None or here.index in (None, device.index))


def _nbytes(tensor: Any) -> int:
    return int(tensor.nelement()) * int(tensor.element_size())


def _why(exc: BaseException) -> str:
    """The first line of an exception, for a one-line message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
