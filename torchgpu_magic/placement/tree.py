"""The one walk of a module tree that :func:`~.accounting.account` makes: every parameter and buffer with
its device, dtype, elements and storage, each tensor object counted in the first module holding it and
each storage once, folded into a :class:`ModuleNode` per module (its subtree's figures).

Written for speed, as it is the whole cost of ``%whereis MODEL``: a Python loop that reads seven torch
attributes per tensor costs about 1.5 us a tensor, three times a bare ``parameters()`` walk. Here the
tree is walked once to gather the tensors (one ``list.extend`` per module and table), the attributes are
read for all tensors at once (``map`` over torch's getters: tens of nanoseconds each), the first holder
of each tensor and of each storage is found with two dicts, and each module's figures are differences of
running sums over its subtree's slices (a subtree's parameters, and its buffers, are contiguous in
pre-order). Python-level work per tensor remains only where something is rare: tied weights, shared
storage, accelerate's offloaded weights, a model split across devices or dtypes.
"""
from __future__ import annotations

import functools
import operator
from itertools import accumulate, compress
from typing import Any

from .kinds import device_names, device_str, grad_of, storage_key, storage_keys, torch_module
from .offload import execution_device, offload_places

_NOT_NONE = functools.partial(operator.is_not, None)
_DTYPE = operator.attrgetter("dtype")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_EMPTY: frozenset = frozenset()
_NONE: tuple = ()  # a leaf's children and a node's notes until it has some: no list per module


class ModuleNode:
    """Placement facts of one module's subtree: its devices and dtypes, parameter and buffer elements,
    storage bytes (each storage counted in the first module holding it), trainable elements, notes (tied
    weights, accelerate), and the number of modules in it. ``children`` and ``notes`` are an empty tuple
    where there are none (most modules of a big model are leaves without notes): one object per module
    instead of three, which the garbage collector then walks after the report."""

    __slots__ = ("name", "cls", "children", "devices", "dtypes", "params", "buffers", "nbytes",
                 "trainable", "notes", "n_modules")

    def __init__(self, name: str, cls: str) -> None:
        self.name = name
        self.cls = cls
        self.children: Any = _NONE
        self.devices: Any = _EMPTY
        self.dtypes: Any = _EMPTY
        self.params = self.buffers = self.nbytes = self.trainable = 0
        self.notes: Any = _NONE
        self.n_modules = 1


def _running(values: Any) -> list:
    """Running sums with a leading 0: the sum over [a, b) is ``r[b] - r[a]``."""
    return list(accumulate(values, initial=0))


class Walk:
    """One walk of ``root`` (see the module's docstring). After construction: ``tree`` (the root's
    :class:`ModuleNode`), ``storages`` ({storage key: (device, role, bytes)}, gradients included with
    ``gradients``), ``grads`` (whether any gradient was found) and ``hooks`` ((execution device, offload
    places) per module accelerate hooked). Holds no tensor once built."""

    def __init__(self, root: Any, gradients: bool = True) -> None:
        self.hooks: list = []
        self.grads = False
        self.storages: dict = {}
        self._places: dict = {}  # id(module): where accelerate keeps its offloaded weights
        params: list = []
        buffers: list = []
        counts: list = []  # per module in pre-order: (its parameters, its buffers)
        hooked: list = []  # (module, its first parameter's index, its first buffer's index)
        self._gather(root, params, buffers, counts, hooked)
        facts = self._read(params, buffers, hooked, gradients)
        self.tree = self._nodes(root, counts, facts)

    @staticmethod
    def _gather(root: Any, params: list, buffers: list, counts: list, hooked: list) -> None:
        """Every module's parameters and buffers (Nones left out), in pre-order."""
        add_params, add_buffers, count = params.extend, buffers.extend, counts.append
        stack = [root]
        pop, push = stack.pop, stack.extend
        while stack:
            module = pop()
            p0, b0 = len(params), len(buffers)
            if "_hf_hook" in module.__dict__:  # set by accelerate; no Module.__getattr__ miss per module
                hooked.append((module, p0, b0))
            table = module._parameters
            if table:
                add_params(filter(_NOT_NONE, table.values()))
            table = module._buffers
            if table:
                add_buffers(filter(_NOT_NONE, table.values()))
            count((len(params) - p0, len(buffers) - b0))
            children = module._modules
            if children:
                push(reversed([child for child in children.values() if child is not None]))

    def _read(self, params: list, buffers: list, hooked: list, gradients: bool) -> dict:
        """Read every tensor's facts at once (parameters, then buffers, in one index space); return the
        running sums and lists the nodes are read from."""
        torch = torch_module()
        tensors = params + buffers
        n, n_params = len(tensors), len(params)
        span = range(n)
        names = device_names(tensors)
        for module, p0, b0 in hooked:  # accelerate's offloaded weights: named where the hook keeps them
            self._places[id(module)] = self._offloaded(module, p0, n_params + b0, names)
        dtypes = list(map(_DTYPE, tensors))
        numels = list(map(torch.Tensor.nelement, tensors))
        keys, sizes = storage_keys(tensors)
        first_in = dict(zip(reversed(keys), reversed(span)))
        roles = ["parameter"] * n_params + ["buffer"] * (n - n_params)
        ties = False
        if len(first_in) < n:  # shared storage (tied weights among it): counted at its first holder only
            ids = list(map(id, tensors))
            first_of = dict(zip(reversed(ids), reversed(span)))
            ties = len(first_of) < n
            counted = list(map(operator.eq, map(first_of.__getitem__, ids), span))  # False: a tied weight
            owns = list(map(operator.and_, map(operator.eq, map(first_in.__getitem__, keys), span), counted))
            self.storages = dict(zip(compress(keys, owns), zip(compress(names, owns), compress(roles, owns),
                                                                compress(sizes, owns))))
            sizes = list(map(operator.mul, sizes, owns))
            numels = list(map(operator.mul, numels, counted))
        else:
            self.storages = dict(zip(keys, zip(names, roles, sizes)))
        param_dtypes, buffer_dtypes = set(dtypes[:n_params]), set(dtypes[n_params:])
        floating = {d: d.is_floating_point or d.is_complex for d in buffer_dtypes}  # a buffer's is shown
        shown = [True] * n_params + list(map(floating.__getitem__, dtypes[n_params:]))
        trainable = map(operator.mul, numels[:n_params], map(_REQUIRES_GRAD, params))
        if gradients:
            self._gradients(compress(params, map(_REQUIRES_GRAD, params)))
        unique_devices = set(names)
        unique_dtypes = param_dtypes.union(d for d, show in floating.items() if show)
        return {
            "n_params": n_params, "numels": _running(numels), "trainable": _running(trainable),
            "bytes": _running(sizes), "shown": _running(shown), "ties": ties,
            "devices": frozenset(unique_devices), "dtypes": frozenset(unique_dtypes),
            "uniform": len(unique_devices) <= 1 and len(unique_dtypes) <= 1,
            "names": names, "dtype_list": dtypes, "shown_list": shown,
        }

    @staticmethod
    def _offloaded(module: Any, p0: int, b0: int, names: list) -> set:
        """Rename the meta tensors of a hooked module whose weights accelerate keeps elsewhere to that
        place ('cpu' or 'disk'); the places found."""
        found = offload_places(module)
        for table, start in ((module._parameters, p0), (module._buffers, b0)):
            held = [key for key, tensor in table.items() if tensor is not None]
            for index, key in enumerate(held, start):
                if key in found:
                    names[index] = found[key]
        return set(found.values())

    def _gradients(self, params: Any) -> None:
        """Put the gradients of trainable parameters into ``storages`` (role gradient)."""
        storages = self.storages
        for param in params:
            grad = grad_of(param)
            if grad is None:
                continue
            key, size = storage_key(grad)
            if key not in storages:
                storages[key] = (device_str(grad.device), "gradient", size)
                self.grads = True

    def _nodes(self, root: Any, counts: list, facts: dict) -> ModuleNode:
        """The tree of nodes, in the order the tensors were gathered; each node's figures read off the
        running sums over its subtree's slices."""
        numels, trainable, nbytes, shown = facts["numels"], facts["trainable"], facts["bytes"], facts["shown"]
        n_params, uniform = facts["n_params"], facts["uniform"]
        devices, dtypes = facts["devices"], facts["dtypes"]
        names, dtype_list, shown_list = facts["names"], facts["dtype_list"], facts["shown_list"]
        next_count = iter(counts).__next__
        at = [0, 0]  # the next parameter's and buffer's index

        def node(name: str, module: Any) -> ModuleNode:
            here = ModuleNode(name, type(module).__name__)
            own_params, own_buffers = next_count()
            p0, b0 = at
            at[0], at[1] = p0 + own_params, b0 + own_buffers
            if "_hf_hook" in module.__dict__:
                self._hook_notes(here, module)
            children = module._modules
            if children:
                prefix = name + "." if name else ""
                here.children = subs = []
                n_modules = 1
                for child_name, child in children.items():
                    if child is not None:
                        sub = node(prefix + child_name, child)
                        subs.append(sub)
                        n_modules += sub.n_modules
                here.n_modules = n_modules
            p1, b1 = at
            b0 += n_params
            b1 += n_params
            here.params = numels[p1] - numels[p0]
            here.buffers = numels[b1] - numels[b0]
            here.trainable = trainable[p1] - trainable[p0]
            here.nbytes = nbytes[p1] - nbytes[p0] + nbytes[b1] - nbytes[b0]
            if p1 > p0 or b1 > b0:
                if uniform:
                    here.devices = devices
                    if p1 > p0 or shown[b1] > shown[b0]:
                        here.dtypes = dtypes
                else:  # several devices or dtypes in the model: this node's, from slices of the lists
                    here.devices = {*names[p0:p1], *names[b0:b1]}
                    here.dtypes = {*dtype_list[p0:p1], *compress(dtype_list[b0:b1], shown_list[b0:b1])}
            return here

        tree = node("", root)
        # the recursive closure refers to itself through its cell: left so, that cycle would keep the
        # whole walk (every node, every storage tuple) for the garbage collector to find, a full pass
        # over tens of thousands of objects after each report
        node = None
        if facts["ties"]:  # tied weights: say where each is counted
            self._tie_notes(root, tree)
        return tree

    def _hook_notes(self, node: ModuleNode, module: Any) -> None:
        places = self._places.get(id(module), set())
        runs_on = execution_device(module)
        self.hooks.append((runs_on, places))
        if places:
            node.notes = [*node.notes, f"accelerate: weights on {'+'.join(sorted(places))}, loaded onto "
                                       f"{runs_on} for each forward"]
        elif runs_on is not None and (module._parameters or module._buffers):
            node.notes = [*node.notes, f"accelerate: runs on {runs_on}"]

    @staticmethod
    def _tie_notes(root: Any, tree: ModuleNode) -> None:
        """'weight tied to transformer.wte.weight (counted there)' on each later holder of a tensor (the
        rare path: the tree is walked again, by name)."""
        nodes = {}
        stack = [tree]
        while stack:
            here = stack.pop()
            nodes[here.name] = here
            stack.extend(here.children)
        firsts: dict = {}  # id(tensor): the qualified name of its first holder
        for module_name, module in root.named_modules(remove_duplicate=False):
            prefix = module_name + "." if module_name else ""
            for table in (module._parameters, module._buffers):
                for key, tensor in table.items():
                    if tensor is None:
                        continue
                    first = firsts.setdefault(id(tensor), prefix + key)
                    if first != prefix + key and module_name in nodes:
                        holder = nodes[module_name]
                        holder.notes = [*holder.notes, f"{key} tied to {first} (counted there)"]
