"""What ``%%cudatime``'s two dispatch modes share: :mod:`.observe`'s first-run watch (which device a cell
touched) and :mod:`.counting`'s op counter (the roofline's FLOPs and bytes). Both are subclasses of
:func:`torchgpu_magic.torchapi.dispatch_mode_base` (no ``torch._dynamo`` import), see every aten op a run
of the cell makes, and read its tensors the same way: :func:`tensors_in`. aten schemas nest tensors at most
a list deep (``Tensor[]``, ``Tensor?[]``); anything deeper is flattened by pytree.

torch is imported lazily, on first use.
"""
from __future__ import annotations

from typing import Any


def tensors_in(*values: Any) -> list:
    """The tensors among an op's positional arguments, keyword arguments (a dict: its values) and results,
    in order."""
    import torch

    found = []
    for value in values:
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) \
            else (value,)
        for item in items:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, (list, tuple, dict)):
                from ..torchapi import tree_leaves

                found += [leaf for leaf in tree_leaves(item) if isinstance(leaf, torch.Tensor)]
    return found
