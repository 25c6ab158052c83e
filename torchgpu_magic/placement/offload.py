"""accelerate's offloading, read without running hooks: where the weights of a module dispatched with
``dispatch_model`` / ``cpu_offload`` really are (cpu, disk) while its own tensors are on meta, and the device
its forward runs on. A model without accelerate's hooks costs one dict lookup per module.
"""
from __future__ import annotations

from typing import Any, Optional


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
        in_memory = getattr(data, "state_dict", None)
        if isinstance(in_memory, dict) and key in in_memory:
            return "cpu"
        index = getattr(data, "index", None)
        if isinstance(index, dict) and key in index:
            return "disk"
        return "cpu"
    return None


def offload_places(module: Any) -> dict:
    """{tensor name: 'cpu' | 'disk'} for the meta tensors of one module (not its children) that stand in
    for weights accelerate offloads; empty (one dict lookup) for a module without a hook."""
    if "_hf_hook" not in module.__dict__:
        return {}
    found = {}
    for table in (module._parameters, module._buffers):
        for name, tensor in table.items():
            if tensor is not None and tensor.is_meta:
                place = offload_place(module, name)
                if place is not None:
                    found[name] = place
    return found


def execution_device(module: Any) -> Optional[str]:
    """The device accelerate runs ``module``'s forward on (its hook's execution device), or None."""
    for hook in _hooks(module):
        device = getattr(hook, "execution_device", None)
        if device is not None:
            return str(device) if not isinstance(device, int) else f"cuda:{device}"
    return None
