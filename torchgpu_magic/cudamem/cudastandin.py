"""Fake cpu tensors standing in for a device this torch cannot run fake tensors on (``cuda`` on a build
without CUDA), and the target's kernel choices where they change what is allocated.

On a build without CUDA the first autograd operation on a fake ``cuda`` tensor aborts the process, so a
prediction for ``cuda`` runs on fake cpu tensors, and :func:`guarded` makes sure no ``cuda`` tensor
is ever made: every device the cell names (``device='cuda'``, ``.to('cuda')``, ``.cuda()``,
``torch.device('cuda')``, ``torch.set_default_device('cuda')``) is read as the stand-in, at the level of
Python calls (before torch would try to initialise CUDA) and again at the level of the operators they
run; a ``cuda`` tensor that still appeared would stop the run with an exception before any operation
used it. ``torch.autocast('cuda', ...)`` becomes autocast on the stand-in with the same dtype. Whatever
the target, a device fake tensors cannot live on here (``cuda`` in a prediction for cpu) is refused the
same way, in one line.

Where cpu and CUDA kernels allocate differently, the CUDA choice is emulated (the emulated operators
have shape functions, so they run on fake cpu tensors as on fake CUDA ones): dropout keeps a one-byte
mask (CUDA's fused ``native_dropout``) rather than a full-size scaled copy, and
``scaled_dot_product_attention`` runs flash attention (half precision, no mask; Ampere or newer) or
memory-efficient attention, in torch's priority order, rather than cpu's choice (which keeps the whole
attention matrix when there is dropout).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from ..torchapi import dispatch_mode_base, torch_function_disabled


class StrayDeviceError(RuntimeError):
    """A device fake tensors cannot live on here was named, or a tensor of one appeared; raised before
    anything uses it."""


def _tensors(values: Any) -> Iterator[Any]:
    import torch

    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


class _Devices:
    """The device rules of one fake run: ``remap`` (the target's type, when cpu stands in for it) is read
    as ``run_on``; any other type but those ``allowed`` is refused before a tensor of it exists."""

    def __init__(self, remap: Optional[str], run_on: str, allowed: set, target: str) -> None:
        import torch

        self.remap, self.run_on, self.allowed, self.target = remap, torch.device(run_on), allowed, target

    def _refuse(self, kind: str, where: Any) -> None:
        name = str(getattr(where, "__qualname__", where)).replace("TensorBase.", "Tensor.")
        raise StrayDeviceError(
            f"the cell puts tensors on {kind} ({name}), where fake tensors "
            f"cannot live on this torch; predicting for {self.target}, it follows only {self.target}"
            + ("" if kind == self.target else f" (predict for {kind} with --predict {kind})"))

    def device(self, value: Any, where: Any, loose: bool = True) -> Any:
        """``value`` with the remapped type read as ``run_on``; a refused type raises."""
        kind = _kind_of(value, loose)
        if kind is None:
            return value
        if kind == self.remap:
            return self.run_on
        if kind not in self.allowed:
            self._refuse(kind, where)
        return value

    def check(self, values: Any, where: Any) -> None:
        for tensor in _tensors(values):
            kind = tensor.device.type
            if kind not in self.allowed or kind == self.remap:
                self._refuse(kind, where)


def _kind_of(value: Any, loose: bool) -> Optional[str]:
    """The device type ``value`` names: a torch.device, and, when ``loose`` (an argument that can only be
    a device, as ``Tensor.to``'s first), a string ('cuda:1') or an int (``to(0)`` means cuda:0)."""
    import torch

    if isinstance(value, torch.device):
        return value.type
    if loose and isinstance(value, str):
        try:
            return torch.device(value.strip()).type
        except RuntimeError:
            return None
    if loose and isinstance(value, int) and not isinstance(value, bool):
        return "cuda"
    return None


def _function_mode(rules: _Devices, emulate: Optional[dict]) -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    emulated = dict(emulate or {})

    class StandIn(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                if rules.remap == "cuda":
                    return args[0]  # already where the target keeps it
                rules.device("cuda", func)
            if func is torch.Tensor.cpu and rules.remap is not None:
                return args[0]  # a copy to the host: not on the target, and cpu is the stand-in
            handler = emulated.get(func)
            if handler is not None:
                rules.check(args, func)
                return handler(*args, **kwargs)
            if "device" in kwargs:
                kwargs["device"] = rules.device(kwargs["device"], func)
            to = func is torch.Tensor.to
            args = tuple(rules.device(a, func, loose=to and i == 1) for i, a in enumerate(args))
            rules.check(args, func)
            with torch_function_disabled():
                out = func(*args, **kwargs)
            rules.check(out if isinstance(out, (list, tuple)) else (out,), func)
            return out

    return StandIn()


def _dispatch_mode(rules: _Devices) -> Any:
    class StandInOps(dispatch_mode_base()):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if kwargs.get("device") is not None:
                kwargs["device"] = rules.device(kwargs["device"], func)
            out = func(*args, **kwargs)
            rules.check(out if isinstance(out, (list, tuple)) else (out,), func)
            return out

    return StandInOps()


@contextlib.contextmanager
def _autocast_as(kind: str, run_on: str) -> Iterator[None]:
    """``torch.autocast(kind, dtype)`` (and ``torch.cuda.amp.autocast``) as autocast on ``run_on`` with
    the dtype the target would use, for the duration; torch's class is restored afterwards."""
    import torch
    from torch.amp import autocast_mode

    cls = autocast_mode.autocast
    original = cls.__init__

    def init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True,
             cache_enabled: Any = None) -> None:
        if isinstance(device_type, str) and device_type == kind:
            dtype = torch.get_autocast_dtype(kind) if dtype is None else dtype
            device_type = torch.device(run_on).type
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original


def cuda_kernels(run_on: str, cc: Optional[tuple]) -> dict:
    """The functions whose CUDA kernels allocate differently from cpu's, as CUDA would run them."""
    import torch
    import torch.nn.functional as F

    device_type = torch.device(run_on).type

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and not inplace and 0 < p < 1 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return F.dropout(input, p, training, inplace)

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
        plain = query.dim() == 4 and key.dim() == 4 and value.dim() == 4 and attn_mask is None \
            and not enable_gqa and query.shape[1] == key.shape[1] == value.shape[1]
        if plain:
            if torch.is_autocast_enabled(device_type):
                low = torch.get_autocast_dtype(device_type)
                query, key, value = (t.to(low) for t in (query, key, value))
            head = query.shape[-1]
            if query.dtype in (torch.float16, torch.bfloat16) and head % 8 == 0 and head <= 256 \
                    and value.shape[-1] == head and (cc is None or cc >= (8, 0)):
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale)[0]
            if query.dtype in (torch.float32, torch.float16, torch.bfloat16):
                grad = query.requires_grad or key.requires_grad or value.requires_grad
                return torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, None, grad, dropout_p, is_causal, scale=scale)[0]
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    return {F.dropout: dropout, F.scaled_dot_product_attention: sdpa}


@contextlib.contextmanager
def guarded(kind: str, run_on: str, native: bool, cc: Optional[tuple]) -> Iterator[None]:
    """Run a block of a prediction for ``kind`` on fake ``run_on`` tensors. Fake tensors are allowed on
    cpu and meta, and on the target where it runs natively; any other device the cell names is refused
    in one line before a tensor of it exists. Where ``run_on`` stands in for the target (not
    ``native``), the target's device names, autocast and, for ``cuda``, the kernels of
    :func:`cuda_kernels` are remapped. Enter it inside the ``FakeTensorMode``, so that its
    operator-level mode sits above fake mode."""
    rules = _Devices(None if native else kind, run_on, {"cpu", "meta"} | ({kind} if native else set()),
                     kind)
    emulate = cuda_kernels(run_on, cc) if kind == "cuda" and not native else None
    with contextlib.ExitStack() as stack:
        if not native:
            stack.enter_context(_autocast_as(kind, run_on))
        stack.enter_context(_function_mode(rules, emulate))
        stack.enter_context(_dispatch_mode(rules))
        yield
