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
from ..render import fmt_bytes
from .accounting import account, optimizer_tensors
from .bydesign import holder_why, is_step, step_on_param_device
from .kinds import kind_of, storage_key, tensor_nbytes

DISCARD_FLAG = "--discard-data"
"""The option of ``%%ontorch`` that allows a move to meta (shown in the refusal)."""


def not_movable(name: str, obj: Any) -> str:
    """Why ``--move`` does not take ``obj`` (one line): a GradScaler needs no move; anything else is not a
    tensor, module or optimizer."""
    if holder_why(obj) is not None:
        return (f"{name} is a {type(obj).__name__}, which needs no move: it copies its scale to each "
                "output's device when used; --move takes tensors, nn.Modules and optimizers")
    return f"{name} is a {type(obj).__name__}; --move takes tensors, nn.Modules and optimizers"


def move(targets: list, device: Any, discard_data: bool = False,
         ns: Optional[Mapping[str, Any]] = None) -> list:
    """Move ``targets`` ([(name, object)]: tensors, modules, optimizers' state) to ``device``; return
    [(name, object to bind, bytes moved, note)] in the same order. The bytes are those the object's
    :func:`~.accounting.account` counts as its own (storages once, gradients apart) that were not on
    ``device``: the figure ``%whereis`` shows for it. The note says what stays where torch keeps it (an
    optimizer's step counters on the cpu), or is ''.

    Modules move in place; a plain tensor cannot, so the new tensor must be bound to its name (the
    ``x = x.to(device)`` idiom); a lone parameter is swapped in place where torch allows it. An
    optimizer's state moves the way ``Optimizer.load_state_dict`` places it (``step`` stays unless the
    group is capturable or fused), and it follows its module's parameters when they are replaced.
    ``ns`` (the user namespace) is searched for optimizers that hold such parameters without being
    moved. Raises :class:`MagicInputError` (one line, nothing changed) for anything it cannot do.
    """
    import torch

    device = torch.device(device)
    kinds = [kind_of(obj) for _, obj in targets]
    if None in kinds:
        name, obj = targets[kinds.index(None)]
        raise MagicInputError(f"--move: {not_movable(name, obj)}")
    _refuse_what_cannot_move(targets, kinds, device, discard_data)
    if _replaces_parameters(device) and ns is not None:
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
    moved_bytes = {name: _bytes_off(module, device) for name, module in modules}
    done = 0
    try:
        for _, module in modules:
            module.to(device)
            done += 1
    except Exception as exc:  # noqa: BLE001 - restore every module, then report in one line
        for slots in saved[: done + 1]:
            _restore(slots)
        raise MagicInputError(f"could not move {modules[done][0]} to {device} ({_why(exc)}); nothing was "
                              "moved") from None
    replaced = {id(old): mod_table[key] for slots in saved for mod_table, key, old, _data, _grad in slots
                if old is not None and mod_table[key] is not old}
    # 3. Bind: optimizers re-pointed and their state moved; tensors replaced.
    result = []
    for (name, obj), kind in zip(targets, kinds):
        if kind == "module":
            result.append((name, obj, moved_bytes[name], ""))
        elif kind == "optimizer":
            _repoint(obj, replaced)
            state, nbytes, stays = new_state[name]
            for param, values in state.items():
                obj.state[replaced.get(id(param), param)].update(values)
            result.append((name, obj, nbytes, stays))
        elif name not in new_tensors:
            result.append((name, obj, 0, ""))
        elif isinstance(obj, torch.nn.Parameter):
            result.append((name, _set_parameter(obj, new_tensors[name]), tensor_nbytes(obj), ""))
        else:
            result.append((name, new_tensors[name], tensor_nbytes(obj), ""))
    return result


def _refuse_what_cannot_move(targets: list, kinds: list, device: Any, discard_data: bool) -> None:
    """Out of meta: nothing to copy. Into meta: every value dropped, allowed only with DISCARD_FLAG."""
    from_meta = [(name, kind) for (name, obj), kind in zip(targets, kinds)
                 if device.type != "meta" and any(t.is_meta for t in _tensors(obj, kind))]
    if from_meta:
        what = ", ".join(name for name, _ in from_meta)
        how = "; ".join(_create_there(name, kind, device) for name, kind in from_meta)
        raise MagicInputError(
            f"--move: {what} {'is' if len(from_meta) == 1 else 'are'} on meta, which holds no values to copy "
            f"to {device}; create {'it' if len(from_meta) == 1 else 'them'} there instead: {how}")
    if device.type == "meta" and not discard_data:
        losing = [name for (name, obj), kind in zip(targets, kinds)
                  if any(not t.is_meta for t in _tensors(obj, kind))]
        if losing:
            its = "its" if len(losing) == 1 else "their"
            raise MagicInputError(
                f"--move: moving {', '.join(losing)} to meta would drop {its} values (meta keeps shapes "
                f"only; nothing can move back); add {DISCARD_FLAG} to do it anyway")


def _create_there(name: str, kind: str, device: Any) -> str:
    """How to make an object on ``device`` that is on meta now, in the words for its kind."""
    if kind == "module":
        return f"{name}.to_empty(device='{device}'), then load its weights"
    if kind == "optimizer":
        return f"create {name} again over parameters on {device} (its state is made by the first step())"
    return f"{name} = torch.empty({name}.shape, dtype={name}.dtype, device='{device}'), then fill it"


def _refuse_stranded_optimizers(targets: list, kinds: list, ns: Mapping[str, Any]) -> None:
    """An optimizer in the namespace holding parameters of a module the move replaces must move too."""
    moving_opts = {id(obj) for (_, obj), kind in zip(targets, kinds) if kind == "optimizer"}
    params = {id(p): name for (name, obj), kind in zip(targets, kinds) if kind == "module"
              for p in obj.parameters()}
    if not params:
        return
    for opt_name, value in list(ns.items()):
        if opt_name[:1] == "_" or kind_of(value) != "optimizer" or id(value) in moving_opts:
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
    """The tensors a move of ``obj`` would carry: a tensor itself, a module's parameters and buffers, an
    optimizer's state but the step counters torch keeps where they are."""
    if kind == "tensor":
        return [obj]
    if kind == "module":
        return list(obj.parameters()) + list(obj.buffers())
    return [t for index, _, key, t in optimizer_tensors(obj)
            if not _stays(obj.param_groups[index], key, t)]


def _stays(group: Any, key: Any, tensor: Any) -> bool:
    """Whether an optimizer state tensor stays where it is on a move: step counters, as
    ``Optimizer.load_state_dict`` places them, unless the group is capturable or fused."""
    return is_step(key, tensor) and not step_on_param_device(group)


def _bytes_off(obj: Any, device: Any) -> int:
    """Bytes of ``obj``'s own storages (its account's, gradients apart) not on ``device`` yet."""
    where = str(device)
    acc = account(obj, gradients=False)
    return sum(size for on, role, size in acc.storages.values() if role != "gradient" and on != where)


def _moved_state(optimizer: Any, device: Any) -> tuple:
    """({param: {key: new tensor}}, bytes moved, note) for the optimizer's state tensors not yet on
    ``device``; step counters stay where torch keeps them, and the note says how many bytes stayed."""
    moved: dict = {}
    sizes: dict = {}
    stay: dict = {}
    for index, param, key, value in optimizer_tensors(optimizer):
        if _on(value, device) or isinstance(optimizer.state[param][key], (list, tuple)):
            continue
        skey, size = storage_key(value)
        if _stays(optimizer.param_groups[index], key, value):
            stay[skey] = (str(value.device), size)
            continue
        moved.setdefault(param, {})[key] = value.to(device)
        sizes[skey] = size
    kept = {}
    for where, size in stay.values():
        kept[where] = kept.get(where, 0) + size
    note = "; ".join(f"its {fmt_bytes(size)} of step counters stay on {where}, as torch keeps them"
                     for where, size in kept.items())
    return moved, sum(sizes.values()), note


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


def _on(tensor: Any, device: Any) -> bool:
    here = tensor.device
    return here.type == device.type and (device.index is None or here.index in (None, device.index))


def _why(exc: BaseException) -> str:
    """The first line of an exception, for a one-line message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
