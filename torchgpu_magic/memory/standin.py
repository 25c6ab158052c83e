"""Fake cpu tensors standing in for a device this torch cannot run fake tensors on (``cuda`` on a build
without CUDA), and the target's kernel choices where they change what is allocated.

On a build without CUDA the first autograd operation on a fake ``cuda`` tensor aborts the process, so a
prediction for ``cuda`` runs on fake cpu tensors, and :func:`standing_in` makes sure no ``cuda`` tensor
is ever made: every device the cell names (``device='cuda'``, ``.to('cuda')``, ``.cuda()``,
``torch.device('cuda')``, ``torch.set_default_device('cuda')``) is read as the stand-in, at the level of
Python calls (before torch would try to initialise CUDA) and again at the level of the operators they
run; a ``cuda`` tensor that still appeared would stop the run with an exception before any operation
used it. ``torch.autocast('cuda', ...)`` becomes autocast on the stand-in with the same dtype.

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


class StrayDeviceError(RuntimeError):
    """A tensor of the target's device appeared in a stand-in run; raised before anything uses it."""


def _tensors(values: Any) -> Iterator[Any]:
    import torch

    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _check(kind: str, values: Any, where: Any) -> None:
    for tensor in _tensors(values):
        if tensor.device.type == kind:
            raise StrayDeviceError(f"a {kind} tensor appeared ({getattr(where, '__name__', where)}); "
                                   f"--predict stops before anything uses it")


def _names_kind(value: Any, kind: str, loose: bool = True) -> bool:
    """Whether ``value`` names a device of type ``kind``: a torch.device, 'cuda', 'cuda:1' and, when
    ``loose`` (an argument that can only be a device, as ``Tensor.to``'s first), an int (``to(0)``)."""
    import torch

    if isinstance(value, torch.device):
        return value.type == kind
    if isinstance(value, str) and loose:
        return value.split(":")[0].strip().lower() == kind
    return loose and isinstance(value, int) and not isinstance(value, bool)


def _function_mode(kind: str, run_on: str, emulate: Optional[dict]) -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    emulated = dict(emulate or {})
    device = torch.device(run_on)

    class StandIn(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda or func is torch.Tensor.cpu:
                return args[0]  # already where the target keeps it (or, for .cpu(), not on the target)
            handler = emulated.get(func)
            if handler is not None:
                _check(kind, args, func)
                return handler(*args, **kwargs)
            if "device" in kwargs and _names_kind(kwargs["device"], kind):
                kwargs["device"] = device
            to = func is torch.Tensor.to
            args = tuple(device if _names_kind(a, kind, loose=to and i == 1) else a
                         for i, a in enumerate(args))
            _check(kind, args, func)
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            _check(kind, out if isinstance(out, (list, tuple)) else (out,), func)
            return out

    return StandIn()


def _dispatch_mode(kind: str, run_on: str) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    device = torch.device(run_on)

    class StandInOps(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if _names_kind(kwargs.get("device"), kind):
                kwargs["device"] = device
            out = func(*args, **kwargs)
            _check(kind, out if isinstance(out, (list, tuple)) else (out,), func)
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
def standing_in(kind: str, run_on: str, cc: Optional[tuple]) -> Iterator[None]:
    """Run a block on fake ``run_on`` tensors standing in for ``kind``: the device names remapped at
    both levels, autocast remapped, and for ``cuda`` the emulated kernels of :func:`cuda_kernels`. Enter
    it inside the ``FakeTensorMode``, so its operator-level mode sits above fake mode."""
    emulate = cuda_kernels(run_on, cc) if kind == "cuda" else None
    with _autocast_as(kind, run_on), _function_mode(kind, run_on, emulate), _dispatch_mode(kind, run_on):
        yield
