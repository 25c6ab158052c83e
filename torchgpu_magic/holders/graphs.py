"""The tensors an autograd graph keeps alive, found without running anything.

A tensor with a ``grad_fn`` holds the graph that made it, and the graph holds every tensor its nodes saved
for backward: a ``total_loss += loss`` kept from step to step holds every step's activations. torch 2.13
exposes what a node saved as ``_raw_saved_<name>`` (``torch._C._autograd.SavedTensor``; see
``torch/autograd/graph.py`` and the generated ``python_functions``), whose ``.data`` is the stored tensor,
or what a ``saved_tensors_hooks`` pack function returned (``save_on_cpu`` keeps a (device, cpu tensor)
pair), *without* calling the unpack hook: reading ``_saved_<name>`` would unpack, which runs user code
and may copy to the device. Custom ``autograd.Function`` nodes keep ``_raw_saved_tensors`` and whatever
``ctx`` attributes the forward set (their ``__dict__``); ``AccumulateGrad`` nodes hold the leaf
(``.variable``). After ``backward()`` a saved tensor reads as None: it was freed.

The walk is bounded (:data:`NODE_LIMIT` nodes per call) and keeps the nodes it visited only while it runs.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

from ..caches import cache
from ..torchapi import saved_tensor_names

NODE_LIMIT = 50_000
_saved_names = cache(saved_tensor_names)  # node type -> its _raw_saved_* attribute names


class GraphWalk:
    """The tensors the graphs behind ``roots`` (tensors) save for backward, each yielded once per walk;
    ``nodes`` counts the nodes visited, ``cut`` is True when :data:`NODE_LIMIT` stopped the walk."""

    def __init__(self, roots: Iterable[Any], limit: int = NODE_LIMIT) -> None:
        self.roots = roots
        self.limit = limit
        self.nodes = 0
        self.cut = False

    def __iter__(self) -> Iterator[Any]:
        import torch

        tensor_type = torch.Tensor
        seen: set = set()  # the nodes themselves, alive while the walk runs (ids of dead ones are reused)
        stack = [getattr(root, "grad_fn", None) for root in self.roots]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            if self.nodes >= self.limit:
                self.cut = True
                break
            seen.add(node)
            self.nodes += 1
            for name in _saved_names(type(node)):
                try:
                    value = getattr(node, name)
                except RuntimeError:  # freed by backward()
                    continue
                for saved in value if isinstance(value, (list, tuple)) else (value,):
                    yield from _tensors_in(getattr(saved, "data", saved), tensor_type)
            variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf it accumulates into
            if isinstance(variable, tensor_type):
                yield variable
            extra = getattr(node, "__dict__", None)  # a custom Function's ctx attributes
            if extra:
                for value in list(extra.values()):
                    yield from _tensors_in(value, tensor_type)
            with contextlib.suppress(AttributeError, RuntimeError):
                stack.extend(fn for fn, _ in node.next_functions)


def _tensors_in(value: Any, tensor_type: type) -> Iterator[Any]:
    """``value`` if a tensor, else the tensors one level inside a tuple or list (a pack hook's result)."""
    if isinstance(value, tensor_type):
        yield value
    elif isinstance(value, (tuple, list)):
        yield from (item for item in value if isinstance(item, tensor_type))
