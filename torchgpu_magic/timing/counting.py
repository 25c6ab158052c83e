"""What one run of a cell does, counted for the roofline: its FLOPs and a lower bound on the bytes it moves.

One extra, untimed run of the cell (never a timing sample) runs under two dispatch modes. torch's own
``FlopCounterMode`` counts FLOPs: matmuls, convolutions and attention, by torch's formulas (plus the CPU
flash-attention kernel, for which torch has the formula but registers none). Above it, a
``TorchDispatchMode`` of ours sees every aten op: it attributes each op's FLOPs to the op's device and
precision, names the arithmetic ops FlopCounterMode has no formula for, and adds up the bytes each op
reads (its tensor inputs) and writes (its tensor outputs). That sum is a lower bound on memory traffic:
each tensor is counted once per op (``x + x`` reads ``x`` once), views, allocations and metadata ops are
free, an op that overwrites an argument (``copy_``, ``fill_``) does not read it, an indexed write
(``index_put_``, ``scatter_``) is charged only for what it reads, and re-reads by tiled kernels, cache
misses and spills are not seen.

The run happens under ``torch.compiler.set_stance("force_eager")``: a ``torch.compile``'d function runs
its eager ops for the count, so fused kernels are counted as the ops they fuse. Work outside torch's
dispatcher (CUDA graph replays, hand-launched kernels) is not seen at all. Imports torch: import this
module only to count.
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, flop_registry

aten = torch.ops.aten

# Ops that move no data: their outputs alias their inputs (schema views are found by ``is_view``) or
# only change metadata.
FREE = frozenset({"_unsafe_view", "_reshape_alias", "alias", "lift_fresh", "set_", "resize_",
                  "resize_as_", "_resize_output_", "record_stream", "_version", "_has_same_storage_numel"})
# In-place ops that overwrite an argument without reading it.
OVERWRITE = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_",
                       "exponential_", "geometric_", "cauchy_", "log_normal_", "_foreach_copy_",
                       "_foreach_zero_"})
# In-place ops that write only the indexed part of an argument: it is charged nothing.
PARTIAL = frozenset({"index_put_", "_index_put_impl_", "index_copy_", "index_fill_", "index_add_",
                     "index_reduce_", "scatter_", "scatter_add_", "scatter_reduce_", "put_",
                     "masked_scatter_", "_unsafe_index_put"})
# Ops without arithmetic (copies, gathers, fills, random numbers): not named as uncounted FLOPs.
MOVES = frozenset({
    "_to_copy", "clone", "_copy_from", "_copy_from_and_resize", "contiguous", "cat", "stack", "zeros",
    "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full",
    "scalar_tensor", "arange", "index", "_unsafe_index", "index_select", "gather", "scatter", "index_put",
    "masked_select", "masked_fill", "masked_fill_", "nonzero", "where", "_local_scalar_dense",
    "constant_pad_nd", "flip", "roll", "repeat", "embedding", "slice_scatter", "select_scatter",
    "diagonal_scatter", "as_strided_scatter", "randn", "rand", "randint", "randperm", "randn_like",
    "rand_like", "randint_like", "lift_fresh_copy", "detach_copy", "alias_copy", "_pin_memory",
    "expand_copy", "permute_copy", "view_copy", "t_copy", "transpose_copy", "split_with_sizes_copy",
    "unbind_copy", "empty_like", "tril_indices", "triu_indices", "one_hot",
}) | OVERWRITE | PARTIAL
CONVOLUTIONS = ("conv", "cudnn_convolution", "mkldnn_convolution")
_PRECISION = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_PRECISION.update({getattr(torch, n): "fp8" for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                      "float8_e5m2fnuz") if hasattr(torch, n)})


@dataclass
class Counts:
    """One run's counts: ``flops`` by (device type, precision), ``bytes`` (lower bound) by device type,
    how many aten ops ran, the arithmetic ops FlopCounterMode has no formula for (name -> calls), the
    higher-order ops whose bytes are not seen (name -> calls),
    whether ``torch.compile`` has compiled code in this process (run eagerly for the count), and how
    long the counting run took (seconds)."""

    flops: dict = field(default_factory=dict)
    bytes: dict = field(default_factory=dict)
    ops: int = 0
    uncounted: dict = field(default_factory=dict)
    opaque: dict = field(default_factory=dict)
    compiled: bool = False
    seconds: float = 0.0


def precision(func: Any, tensors: list, cuda: bool) -> str:
    """The precision an op computes in: that of its first floating-point input ('fp32' becomes 'tf32'
    on CUDA where torch lets cuBLAS / cuDNN use TF32 for this kind of op), or the dtype's name."""
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), tensors[0].dtype if tensors else None)
    name = _PRECISION.get(dtype) or str(dtype).replace("torch.", "")
    if name == "fp32" and cuda:
        packet = func.overloadpacket.__name__
        conv = any(word in packet for word in CONVOLUTIONS)
        if conv and torch.backends.cudnn.allow_tf32 or not conv and torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
    return name


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes of the distinct elements ``t`` addresses (a broadcast dimension, stride 0, counts once);
    0 for layouts without strides (sparse, MKL-DNN), which is still a lower bound."""
    if t.layout != torch.strided:
        return 0
    elements = 1
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return 0
        if stride != 0:
            elements *= size
    return elements * t.element_size()


def _key(t: torch.Tensor) -> tuple:
    """Identity of the memory ``t`` addresses, so one tensor is counted once per op."""
    try:
        return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
    except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass): the object itself
        return (id(t),)


def _tensors(value: Any) -> list:
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


class OpCounter(TorchDispatchMode):
    """Sees every aten op of the counting run (above torch's ``FlopCounterMode``, ``flop_counter``) and
    adds each to ``counts``: its FLOPs by device and precision, its bytes read and written, and its name
    when it does arithmetic FlopCounterMode cannot count."""

    def __init__(self, flop_counter: FlopCounterMode) -> None:
        super().__init__()
        self.flop_counter = flop_counter
        self.counts = Counts()

    supports_higher_order_operators = True  # cond, flex_attention...: passed on to FlopCounterMode

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        before = self.flop_counter.get_total_flops()
        out = func(*args, **kwargs)
        flops = self.flop_counter.get_total_flops() - before
        if isinstance(func, torch._ops.HigherOrderOperator):
            self.add_opaque(str(func.name()), _tensors((args, kwargs)), _tensors(out), flops)
        else:
            self.add(func, args, kwargs, out, flops)
        return out

    def add_opaque(self, name: str, inputs: list, outputs: list, flops: int) -> None:
        """A higher-order op (``torch.cond``, ``flex_attention``): its FLOPs as FlopCounterMode counted
        them; the ops inside it are not seen, so its bytes are not counted."""
        counts = self.counts
        counts.ops += 1
        counts.opaque[name] = counts.opaque.get(name, 0) + 1
        if flops:
            where = (outputs or inputs)[0].device.type if (outputs or inputs) else "cpu"
            kind = _PRECISION.get(next((t.dtype for t in inputs if t.is_floating_point()), None), "other")
            counts.flops[(where, kind)] = counts.flops.get((where, kind), 0) + flops

    def add(self, func: Any, args: Any, kwargs: dict, out: Any, flops: int) -> None:
        """Count one op that ran: ``flops`` as FlopCounterMode counted them, ``out`` what it returned."""
        counts = self.counts
        counts.ops += 1
        name = func.overloadpacket.__name__
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        if flops:
            where = (outputs or inputs)[0].device.type if (outputs or inputs) else "cpu"
            kind = precision(func, inputs, where == "cuda")
            counts.flops[(where, kind)] = counts.flops.get((where, kind), 0) + flops
        elif func.overloadpacket not in flop_registry and name not in MOVES and name not in FREE \
                and not func.is_view and not name.startswith(("empty", "new_empty", "_empty")) and inputs:
            label = str(func.overloadpacket)
            counts.uncounted[label] = counts.uncounted.get(label, 0) + 1
        if func.is_view or name in FREE:
            return
        mutated = self._mutated(func, args, kwargs)
        mutated_keys = {_key(t) for t in mutated}
        reads_mutated = torch.Tag.inplace in func.tags and name not in OVERWRITE and name not in PARTIAL
        reads = {}
        for t in inputs:
            if reads_mutated or _key(t) not in mutated_keys:
                reads.setdefault(_key(t), t)
        writes = {}
        if not name.startswith(("empty", "new_empty", "_empty")):
            for t in outputs + mutated:
                if name not in PARTIAL or _key(t) not in mutated_keys:
                    writes.setdefault(_key(t), t)
        for t in list(reads.values()) + list(writes.values()):
            where = t.device.type
            counts.bytes[where] = counts.bytes.get(where, 0) + tensor_bytes(t)

    @staticmethod
    def _mutated(func: Any, args: Any, kwargs: dict) -> list:
        """The tensors the op's schema says it writes to (``self`` of an in-place op, ``out=``)."""
        found = []
        for index, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[index] if index < len(args) else kwargs.get(arg.name)
                found += _tensors(value)
        return found


def _attention_cpu(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _attention_cpu_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any,
                            out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, query, key, value)


def _cpu_attention_formulas() -> dict:
    """torch's attention formulas for the CPU flash-attention ops, which FlopCounterMode leaves out."""
    ops = (("_scaled_dot_product_flash_attention_for_cpu", _attention_cpu),
           ("_scaled_dot_product_flash_attention_for_cpu_backward", _attention_cpu_backward))
    return {getattr(aten, name): formula for name, formula in ops if hasattr(aten, name)}


def compiled_code_exists() -> bool:
    """Whether ``torch.compile`` has compiled a graph in this process (never imports dynamo)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo_utils, "counters", None)
    return bool(counters and counters["stats"]["unique_graphs"])


def _eager() -> ContextManager[Any]:
    """``set_stance("force_eager")`` where dynamo is loaded (``torch.compile`` loads it; importing it
    here would cost seconds and compile nothing)."""
    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return stance("force_eager") if stance is not None else contextlib.nullcontext()


def count(run: Callable[[], Any], silence: Callable[[], ContextManager[Any]]) -> Counts:
    """Call ``run`` (one loop of the cell) once under the counters, silenced, with compiled functions
    running eagerly; return what it did. What ``run`` raises propagates."""
    flop_counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas())
    counter = OpCounter(flop_counter)
    start = time.perf_counter()
    with silence(), _eager(), flop_counter, counter:
        run()
    counter.counts.seconds = time.perf_counter() - start
    counter.counts.compiled = compiled_code_exists()
    return counter.counts
