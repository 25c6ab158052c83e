"""CUDA's kernel choices where they change what a step allocates, made at the level where torch makes them
(the dispatcher), for a prediction that runs on fake cpu tensors standing in for CUDA.

A ``TorchFunctionMode`` sees only the calls a cell makes itself: the attention inside
``F.multi_head_attention_forward`` or a transformers model is a call from torch's own Python, past the
mode, and an op's autocast happens in the dispatcher. So each choice is made by a Python kernel that
torch's Python dispatcher runs at the dispatch key where CUDA's own kernel would choose
(:class:`~torchgpu_magic.torchapi.PythonKernels`, registered for the prediction's duration and consulted
only in its thread), whichever way the op was reached (``F.scaled_dot_product_attention``,
``nn.MultiheadAttention``, ``nn.Transformer*``, a transformers model):

- **Autocast.** ``torch.autocast('cuda')`` turns on torch's own CUDA autocast state, and the
  ``AutocastCUDA`` dispatch key joins the cpu tensors' keys (:func:`kernels`). The ops with a CUDA autocast
  kernel (read from the dispatcher's registrations: aten/src/ATen/autocast_mode.cpp's ``KERNEL_CUDA``
  lists) get a Python kernel at that key that casts their arguments as CUDA's would, learnt by calling
  torch's own ``AutocastCUDA`` kernel once per op and argument dtypes on data-less CUDA-shaped tensors
  (:func:`cuda_casts`) and watching which arguments it casts to what (and whether it adds ``dtype=``,
  as for ``softmax`` / ``sum``): pow, exp, softmax, layer_norm... stay in fp32 as on CUDA, not cpu's
  lists. Casts of leaf tensors that require grad (the weights) are kept until the autocast region ends,
  as autocast's weight cache keeps them.
- **Attention.** ``scaled_dot_product_attention`` (its ``CompositeImplicitAutograd`` kernel) runs the
  backend CUDA's ``select_sdp_backend`` would pick (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp):
  in the priority order cuDNN (where it is preferred: Hopper and Blackwell with a cuDNN newer than 9.15 in
  this torch), flash, memory-efficient, math, each where its constraints hold (dtype, head size,
  alignment, mask, causal shape, GPU generation, the user's ``sdpa_kernel`` / ``enable_*_sdp`` choices).
  The fused kernels keep the output and its log-sum-exp for the backward, never the attention matrix
  or a dropout mask.
- **Dropout.** ``dropout`` (``CompositeImplicitAutograd``) runs CUDA's fused ``native_dropout`` in
  training (Dropout.cpp ``is_fused_kernel_acceptable``): a one-byte mask, not a full-size scaled copy.

torch is imported inside the functions: importing this module costs nothing.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Optional

from ..torchapi import (
    OutsideModes,
    PythonKernels,
    argument_names,
    disabled_torch_function,
    dispatch_key_excluded,
    dispatch_key_included,
    ops_with_kernel,
    redispatch,
    tree_flatten,
    tree_unflatten,
    wrapper_tensor,
)

AUTOCAST_KEY = "AutocastCUDA"
COMPOSITE_KEY = "CompositeImplicitAutograd"


class _Reached(Exception):
    """Raised in a probe when the autocast kernel calls the op itself: its casts are done."""


class Casts:
    """What CUDA's autocast kernel does to one call, by the op's argument names: ``dtypes`` (a tensor
    argument, or (a tensor-list argument, index) -> the dtype it is cast to) and ``added`` (arguments it
    adds to the call, as ``dtype=torch.float32`` for ``sum`` and ``softmax``)."""

    def __init__(self) -> None:
        self.dtypes: dict = {}
        self.added: dict = {}


def _by_name(op: Any, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by the names of ``op``'s schema."""
    return {**dict(zip(argument_names(op), args)), **kwargs}


@functools.cache
def _probe_class() -> type:
    """A tensor on ``cuda:0`` with a shape and a dtype and no data (it never needs a GPU), for calling torch's
    ``AutocastCUDA`` kernel: a cast of it gives another, and any other op that reaches it ends the probe."""
    import torch

    class CudaShaped(torch.Tensor):
        __torch_function__ = disabled_torch_function()

        @staticmethod
        def __new__(cls, meta: Any) -> Any:
            return wrapper_tensor(cls, meta, torch.device("cuda", 0))

        def __init__(self, meta: Any) -> None:
            self.meta = meta

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and isinstance(args[0], cls):
                return cls(torch.empty_like(args[0].meta, dtype=kwargs.get("dtype") or args[0].dtype))
            raise _Reached

    return CudaShaped


def cuda_casts(op: Any, args: tuple, kwargs: dict) -> Casts:
    """How torch's own ``AutocastCUDA`` kernel for ``op`` casts a call with arguments like these (their
    shapes and dtypes; their values are not read), under the CUDA autocast dtype set now: the kernel is
    called on data-less CUDA-shaped tensors, and the arguments it then calls ``op`` with are read where
    that call arrives (a Python kernel at ``AutogradCUDA``, the next key), before ``op`` itself runs: a
    composite op's own casts inside (the math attention's upcast) are not autocast's. A kernel that
    refuses the data-less tensors leaves the call uncast."""
    import torch

    def shaped(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not value.is_nested:
            return probe(torch.empty(value.shape, dtype=value.dtype, device="meta"))
        return value

    probe = _probe_class()
    flat, spec = tree_flatten(args)
    called: dict = {}

    def reached(*c_args: Any, **c_kwargs: Any) -> Any:
        called.update(args=c_args, kwargs=c_kwargs)
        raise _Reached

    with OutsideModes(), PythonKernels({(op, "AutogradCUDA"): reached}):
        p_args = tree_unflatten([shaped(v) for v in flat], spec)  # made outside the fake and tracking modes
        p_kwargs = {k: shaped(v) for k, v in kwargs.items()}
        try:
            redispatch(op, AUTOCAST_KEY, p_args, p_kwargs)
        except _Reached:
            pass
        except Exception:  # noqa: BLE001 - the kernel needed more than shapes: no casts learnt
            called.clear()
    casts = Casts()
    if not called:
        return casts
    before, after = _by_name(op, args, kwargs), _by_name(op, called["args"], called["kwargs"])
    for name, now in after.items():
        was = before.get(name)
        if isinstance(now, torch.Tensor) and isinstance(was, torch.Tensor) and now.dtype != was.dtype:
            casts.dtypes[name] = now.dtype
        elif isinstance(now, (list, tuple)) and isinstance(was, (list, tuple)):
            for i, (w, n) in enumerate(zip(was, now)):
                if isinstance(w, torch.Tensor) and isinstance(n, torch.Tensor) and n.dtype != w.dtype:
                    casts.dtypes[(name, i)] = n.dtype
        elif was is None and isinstance(now, torch.dtype):
            casts.added[name] = now
    return casts


class Autocast:
    """The Python kernels that cast as CUDA's autocast does (one per op with an ``AutocastCUDA`` kernel),
    with the casts learnt per op and argument dtypes, and the weight cache of the current region."""

    def __init__(self) -> None:
        self.learnt: dict = {}
        # (id(weight), dtype) -> (weight, cast): kept until the region ends (``torch.clear_autocast_cache``)
        self.weights: dict = {}

    def kernel(self, op: Any) -> Any:
        import torch

        def autocast_cuda(*args: Any, **kwargs: Any) -> Any:
            key = (op, torch.get_autocast_dtype("cuda"), len(args), tuple(kwargs),
                   tuple(t.dtype if isinstance(t, torch.Tensor) else type(t)
                         for t in tree_flatten((args, kwargs))[0]))
            casts = self.learnt.get(key)
            if casts is None:
                casts = self.learnt[key] = cuda_casts(op, args, kwargs)
            if casts.dtypes or casts.added:
                args, kwargs = self.apply(op, casts, args, kwargs)
            with dispatch_key_excluded(AUTOCAST_KEY):
                return op(*args, **kwargs)

        return autocast_cuda

    def apply(self, op: Any, casts: Casts, args: tuple, kwargs: dict) -> tuple:
        """``(args, kwargs)`` with ``casts`` applied: arguments cast where they are, additions as keywords."""
        names = argument_names(op)
        args, kwargs = list(args), dict(kwargs)
        for where, dtype in casts.dtypes.items():
            name, index = where if isinstance(where, tuple) else (where, None)
            holder, slot = (args, names.index(name)) if names.index(name) < len(args) else (kwargs, name)
            value = holder[slot]
            if index is None:
                holder[slot] = self.cast(value, dtype)
            else:
                holder[slot] = type(value)(self.cast(v, dtype) if i == index else v
                                           for i, v in enumerate(value))
        kwargs.update(casts.added)
        return tuple(args), kwargs

    def cast(self, tensor: Any, dtype: Any) -> Any:
        """``tensor`` in ``dtype``; a weight's cast is made once per region (autocast's cache)."""
        import torch

        if tensor.dtype == dtype:
            return tensor
        cached = tensor.is_leaf and tensor.requires_grad and torch.is_autocast_cache_enabled()
        if not cached:
            return tensor.to(dtype)
        key = (id(tensor), dtype)
        if key not in self.weights:
            self.weights[key] = (tensor, tensor.to(dtype))
        return self.weights[key][1]


# ---- attention ---------------------------------------------------------------------------------------------
def _cudnn_preferred(cc: Optional[tuple]) -> bool:
    """Whether torch puts cuDNN attention first on this GPU generation (sdp_utils.cpp
    ``check_prefer_cudnn_attention``: sm90 / sm10x with a cuDNN newer than 9.15); unknown counts as no."""
    import torch

    try:
        version = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - a torch without cuDNN
        version = None
    return cc is not None and cc[0] in (9, 10) and version is not None and version > 91500


def _low(dtype: Any) -> bool:
    import torch

    return dtype in (torch.float16, torch.bfloat16)


def choose_backend(query: Any, key: Any, value: Any, mask: Any, dropout_p: float, is_causal: bool,
                   cc: Optional[tuple], requires_grad: bool) -> str:
    """'cudnn', 'flash', 'efficient' or 'math': the backend CUDA's ``select_sdp_backend`` picks for these
    inputs on GPU generation ``cc`` (None: Ampere or newer), honouring the user's enabled backends."""
    import torch

    cuda = torch.backends.cuda
    cc = cc or (8, 0)
    dense = all(t.dim() == 4 and not t.is_nested and t.stride(-1) == 1 for t in (query, key, value))
    d_q, d_k, d_v = query.shape[-1], key.shape[-1], value.shape[-1]
    ampere = cc >= (8, 0)

    def cudnn() -> bool:  # asked only where preferred: sm90 / sm10x, whose head size limit is 256
        return (cuda.cudnn_sdp_enabled() and dense and _low(query.dtype) and key.shape[-2] != 1
                and dropout_p * 16 == int(dropout_p * 16) and d_q <= 256 and d_v <= 256 and d_q % 8 == 0
                and d_v % 8 == 0)

    def flash() -> bool:
        sm86_89 = (8, 6) <= cc <= (8, 9) or (12, 0) <= cc <= (12, 1)
        backward_ok = not (requires_grad and sm86_89 and d_q > 192 and (dropout_p > 0 or d_q <= 224))
        return (cuda.flash_sdp_enabled() and dense and mask is None and d_q == d_k == d_v and d_q <= 256
                and (8, 0) <= cc <= (12, 1) and backward_ok and _low(query.dtype)
                and (not is_causal or query.shape[-2] == key.shape[-2]))

    def efficient() -> bool:
        dtypes = (torch.float16, torch.float32, torch.bfloat16) if ampere else (torch.float16, torch.float32)
        alignment = (8 if _low(query.dtype) else 4) if ampere else (8 if _low(query.dtype) else 1)
        return (cuda.mem_efficient_sdp_enabled() and dense and (5, 0) <= cc <= (12, 1) and d_q == d_k
                and d_q % alignment == 0 and d_v % alignment == 0 and query.dtype in dtypes)

    order = ("cudnn", "flash", "efficient") if _cudnn_preferred(cc) else ("flash", "efficient")
    choices = {"cudnn": cudnn, "flash": flash, "efficient": efficient}
    return next((name for name in order if choices[name]()), "math")


def _additive(mask: Any, dtype: Any) -> Any:
    """A boolean mask as the additive bias the fused kernels take (attention.cpp
    ``convert_boolean_attn_mask``: 0 where attended, -inf elsewhere)."""
    import torch

    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros((), dtype=dtype).expand(mask.shape).masked_fill(mask.logical_not(), float("-inf"))


def attention_kernel(cc: Optional[tuple]) -> Any:
    """``scaled_dot_product_attention`` as CUDA runs it on GPU generation ``cc``."""
    import torch

    aten = torch.ops.aten

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        backend = choose_backend(query, key, value, attn_mask, dropout_p, is_causal, cc, grad)
        if backend == "efficient" and enable_gqa and key.shape[1] != query.shape[1]:
            repeat = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
        if backend == "flash":
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                            scale=scale)[0]
        bias = _additive(attn_mask, query.dtype)
        if backend == "cudnn":
            return aten._scaled_dot_product_cudnn_attention(query, key, value, bias, grad, dropout_p,
                                                            is_causal, False, scale=scale)[0]
        if backend == "efficient":
            return aten._scaled_dot_product_efficient_attention(query, key, value, bias, grad, dropout_p,
                                                                is_causal, scale=scale)[0]
        upcast = _low(query.dtype) and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
        q, k, v = (t.float() for t in (query, key, value)) if upcast else (query, key, value)
        out = aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, None,
                                                      scale=scale, enable_gqa=enable_gqa)[0]
        return out.to(query.dtype) if upcast else out

    return sdpa


def _dropout(input: Any, p: float, train: bool) -> Any:
    """``dropout`` as CUDA runs it: the fused ``native_dropout`` (a one-byte mask) in training with
    0 < p < 1, else what ``_dropout_impl`` does (the input itself, or zeros for p = 1)."""
    import torch

    if not train or p == 0 or input.numel() == 0:
        return input
    if p == 1:
        return input.mul(torch.zeros((), dtype=input.dtype))
    return torch.ops.aten.native_dropout(input, p, True)[0]


@contextlib.contextmanager
def kernels(cc: Optional[tuple]) -> Iterator[Autocast]:
    """For the duration, in this thread: CUDA's attention and dropout kernels for
    ``scaled_dot_product_attention`` and ``dropout`` on GPU generation ``cc``, and CUDA's autocast casts
    for every op torch's CUDA autocast handles (active while ``torch.autocast('cuda')`` is). Yields the
    :class:`Autocast` whose weight cache the caller clears when an autocast region ends."""
    import torch

    aten = torch.ops.aten
    autocast = Autocast()
    table = {(op, AUTOCAST_KEY): autocast.kernel(op) for op in ops_with_kernel(AUTOCAST_KEY)}
    table[(aten.scaled_dot_product_attention.default, COMPOSITE_KEY)] = attention_kernel(cc)
    table[(aten.dropout.default, COMPOSITE_KEY)] = _dropout
    with PythonKernels(table, eager=True), dispatch_key_included(AUTOCAST_KEY):
        yield autocast
