"""What ``%%cudatime``'s two dispatch modes share: :mod:`.observe`'s first-run watch (which device a cell
touched) and :mod:`.counting`'s op counter (the roofline's FLOPs and bytes).

Both see every aten op a run of the cell makes, and both need the same two things:

- the tensors among an op's arguments and results (:func:`tensors_in`): aten schemas nest them at most a
  list deep (``Tensor[]``, ``Tensor?[]``); anything deeper is flattened by pytree;
- a ``TorchDispatchMode`` that costs no ``torch._dynamo`` import (:func:`mode_base`). torch wraps a mode's
  ``__torch_dispatch__`` in ``torch._disable_dynamo``, which imports ``torch._dynamo`` at the first op:
  4 to 7 s on a busy 2-core machine, which a notebook's first ``%%cudatime`` would pay. The base class
  marks its subclasses' own code as never compiled through torch's C layer instead (what
  ``torch._dynamo.disable`` does for a function, without the import); on a torch without that layer
  torch's wrapper is kept, unless the subclass says its runs never compile (``never_compiles``).

torch is imported lazily, on first use.
"""
from __future__ import annotations

import types
from typing import Any, Callable, Optional

_BASE: Any = None  # the TorchDispatchMode subclass, made once on first use


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
                from torch.utils._pytree import tree_leaves

                found += [leaf for leaf in tree_leaves(item) if isinstance(leaf, torch.Tensor)]
    return found


def dynamo_skip() -> Optional[Callable[[types.CodeType], Any]]:
    """A function marking a code object, and all it calls, as never compiled by ``torch.compile``: what
    ``torch._dynamo.disable`` does for a function, through torch's C layer, so that ``torch._dynamo`` is not
    imported; None on a torch without that layer."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    except (ImportError, AttributeError, TypeError):
        return None
    return lambda code: set_code_exec_strategy(code, strategy)


def mode_base() -> type:
    """The ``TorchDispatchMode`` base class of both modes (made once): see the module's docstring."""
    global _BASE
    if _BASE is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        skip = dynamo_skip()

        class QuietMode(TorchDispatchMode):
            """A dispatch mode whose own code ``torch.compile`` never traces, without importing
            ``torch._dynamo`` to say so. A subclass whose runs never compile sets ``never_compiles``: it
            then keeps out of torch's wrapper even where its code cannot be marked."""

            never_compiles = False

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # asked by TorchDispatchMode.__init_subclass__: True wraps __torch_dispatch__ in
                # torch._disable_dynamo (and imports torch._dynamo at the first op)
                return skip is None and not cls.never_compiles

            def __init_subclass__(cls, **kwargs: Any) -> None:
                super().__init_subclass__(**kwargs)
                if skip is not None:
                    for value in vars(cls).values():
                        if isinstance(value, (classmethod, staticmethod)):
                            value = value.__func__
                        if isinstance(value, types.FunctionType):
                            skip(value.__code__)

        _BASE = QuietMode
    return _BASE
