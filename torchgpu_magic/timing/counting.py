"""What one run of a cell does, counted for the roofline: its FLOPs and the bytes its ops read and write.

One extra, untimed run of the cell (never a timing sample) runs under :class:`OpCounter`, a
``TorchDispatchMode`` that sees every aten op. FLOPs are those of torch's ``FlopCounterMode``: its table
of formulas (matmuls, convolutions, attention), with :mod:`.formulas`' additions (causal attention by the
pairs it attends, the CPU flash-attention ops, the fused ops ``nn`` modules run in eval mode), applied the
way its dispatch mode applies them. Each op's FLOPs are kept by device and precision, an arithmetic op
without a formula is named, and an op known to do matrix products whose FLOPs are not counted is named
apart (the FLOP figure is then incomplete, not just a lower bound). Bytes are the sum of what each
op reads (its tensor inputs) and writes (its tensor outputs), each once: the traffic of the ops run one
by one with nothing kept in a cache between them. That is not a bound on the memory traffic either way:
data that stays in L2 from one op to the next (or from loop to loop) never reaches memory, so the real
traffic can be less; re-reads by tiled kernels, cache misses and spills make it more. Each tensor is
counted once per op (``x + x`` reads ``x`` once), views, allocations and metadata ops are free, an op that
overwrites an argument (``copy_``, ``fill_``) does not read it, and an indexed write (``index_put_``,
``scatter_``) is charged only for what it reads.

The run happens under ``torch.compiler.set_stance("force_eager")`` (where dynamo is loaded): a
``torch.compile``'d function runs its eager ops for the count, so fused kernels are counted as the ops
they fuse. A higher-order op (``torch.cond``, a Triton kernel) runs but is not looked into; work outside
torch's dispatcher (CUDA graph replays, hand-launched kernels) is not seen at all. Imports torch: import
this module only to count. Written and tested against torch 2.13: besides the public dispatch-mode API it
relies on ``FlopCounterMode(...).flop_registry``, ``torch.utils.flop_counter.sdpa_flop_count`` and
``TorchDispatchMode._should_skip_dynamo`` (through the base class the first-run watch of :mod:`.observe`
shares, as it shares its reading of an op's tensors); a torch without them turns the count into a note
(see :func:`~.roofline.attach`), never a failed measurement.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional

import torch

from ..torchapi import compiled_graphs, dispatch_mode_base, dynamo_loaded, is_higher_order_op, is_inplace
from .formulas import NEEDS_OP, UNCOUNTED_MATMULS, registry
from .observe import tensors_in

# A CUDA build without triton (Windows, some containers) logs "triton not found; flop counting will not
# work for triton kernels" when this module is first imported: into the user's first %%cudatime. The
# counter never looks into a Triton kernel (a higher-order op, named in a note), so it is not passed on.
_LOG = logging.getLogger("torch.utils.flop_counter")
_level = _LOG.level
_LOG.setLevel(logging.ERROR)
try:
    from torch.utils.flop_counter import FlopCounterMode
finally:
    _LOG.setLevel(_level)

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
    "unbind_copy", "empty_like", "tril_indices", "triu_indices", "one_hot", "_nested_tensor_from_mask",
    "_nested_tensor_from_mask_left_aligned", "to_padded_tensor",
}) | OVERWRITE | PARTIAL
# Queries of sizes and strides (they reach a mode for tensor subclasses): passed on, as FlopCounterMode does.
METADATA = frozenset({"sym_is_contiguous", "is_contiguous", "is_strides_like_format",
                      "is_non_overlapping_and_dense", "size", "sym_size", "stride", "sym_stride",
                      "storage_offset", "sym_storage_offset", "numel", "sym_numel", "dim", "layout"})
CONVOLUTIONS = ("conv", "cudnn_convolution", "mkldnn_convolution")
RNNS = ("_cudnn_rnn", "miopen_rnn")  # cuDNN's RNN kernels, ruled by its rnn TF32 setting
_PRECISION = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_PRECISION.update({getattr(torch, n): "fp8" for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                      "float8_e5m2fnuz") if hasattr(torch, n)})


@dataclass
class Counts:
    """One run's counts: ``flops`` by (device type, precision), ``bytes`` (read and written by the ops)
    by device type, how many aten ops ran, the arithmetic ops without a FLOP formula (name -> calls), the
    ops that do matrix products whose FLOPs are not counted (``unknown``: name -> calls; a fused op no
    formula covers, or one its formula could not read), the attention ops counted as causal (name ->
    calls), the higher-order ops not looked into (name -> calls), whether ``torch.compile`` has compiled
    code in this process (run eagerly for the count), and how long the counting run took (seconds)."""

    flops: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    ops: int = 0
    uncounted: Counter = field(default_factory=Counter)
    unknown: Counter = field(default_factory=Counter)
    causal: dict = field(default_factory=dict)
    opaque: Counter = field(default_factory=Counter)
    compiled: bool = False
    seconds: float = 0.0


def tf32_allowed() -> dict:
    """``{'matmul': bool, 'conv': bool, 'rnn': bool}``: whether torch lets cuBLAS (fp32 matmuls) and cuDNN
    (convolutions, RNNs) use TF32 now. The new setting (``torch.backends.cuda.matmul.fp32_precision``,
    ``torch.backends.cudnn.conv/rnn.fp32_precision``, which transformers' ``TrainingArguments(tf32=...)``
    sets) is read first, resolved as ``at::Context::float32Precision`` resolves it (the op's setting, else
    the CUDA backend's 'all', else the generic one): once it has been used, reading the legacy
    ``allow_tf32`` raises (torch checks that the two agree, aten/src/ATen/Context.cpp ``allowTF32CuBLAS``).
    The legacy flag is read only where every level of the new setting says 'none', and a read that fails
    counts as no TF32: a flag never costs the roofline."""
    out, backends = {}, torch.backends
    for op in ("matmul", "conv", "rnn"):
        try:
            holder = backends.cuda.matmul if op == "matmul" else getattr(backends.cudnn, op)
            levels = (holder.fp32_precision, backends.cudnn.fp32_precision, backends.fp32_precision)
            new = next((value for value in levels if value in ("tf32", "ieee")), None)
        except Exception:  # noqa: BLE001 - a setting this torch refuses: the legacy flag decides
            new = None
        try:
            legacy = backends.cuda.matmul if op == "matmul" else backends.cudnn
            out[op] = new == "tf32" if new is not None else bool(legacy.allow_tf32)
        except Exception:  # noqa: BLE001 - legacy and new settings disagree: no TF32 claimed
            out[op] = False
    return out


def precision(func: Any, tensors: list, cuda: bool, tf32: Optional[dict] = None) -> str:
    """The precision an op computes in: that of its first floating-point input ('fp32' becomes 'tf32'
    on CUDA where torch lets cuBLAS / cuDNN use TF32 for this kind of op: ``tf32``, from
    :func:`tf32_allowed`, read now when not given), or the dtype's name."""
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), tensors[0].dtype if tensors else None)
    name = _PRECISION.get(dtype) or str(dtype).replace("torch.", "")
    if name == "fp32" and cuda:
        packet = func.overloadpacket.__name__
        kind = ("rnn" if any(word in packet for word in RNNS) else
                "conv" if any(word in packet for word in CONVOLUTIONS) else "matmul")
        if (tf32 if tf32 is not None else tf32_allowed())[kind]:
            return "tf32"
    return name


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes of the distinct elements ``t`` addresses (a broadcast dimension, stride 0, counts once;
    a nested tensor, the elements of its sequences); 0 for layouts without strides (sparse, MKL-DNN):
    their bytes are not counted."""
    if t.layout != torch.strided:
        return 0
    if t.is_nested:  # TransformerEncoder's fast path: no sizes or strides, but its element count
        return t.numel() * t.element_size()
    if 0 in t.shape:
        return 0
    return math.prod(size for size, stride in zip(t.shape, t.stride()) if stride) * t.element_size()


def _key(t: torch.Tensor) -> tuple:
    """Identity of the memory ``t`` addresses, so one tensor is counted once per op."""
    try:
        return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
    except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass): the object itself
        return (id(t),)


@dataclass(frozen=True)
class _Rule:
    """What the counter needs to know of one op overload, worked out once per run."""

    name: str
    formula: Any
    free: bool  # a view or metadata change: no bytes
    allocates: bool  # empty*: its output is not written
    mutable: tuple  # (position, name) of the arguments the schema says it writes
    reads_mutated: bool  # an in-place op that reads what it writes (add_, not copy_ or index_put_)
    partial: bool  # an indexed write: the written argument is charged nothing
    named: bool  # arithmetic without a formula: named as uncounted
    matmul: bool  # a fused op known to do matrix products that no formula counts (formulas.UNCOUNTED_MATMULS)

    @classmethod
    def of(cls, func: Any, formulas: dict) -> _Rule:
        name = func.overloadpacket.__name__
        formula = formulas.get(func.overloadpacket)
        if getattr(formula, NEEDS_OP, False):
            formula = functools.partial(formula, func)
        free = func.is_view or name in FREE
        allocates = name.startswith(("empty", "new_empty", "_empty"))
        mutable = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                        if a.alias_info is not None and a.alias_info.is_write)
        reads = is_inplace(func) and name not in OVERWRITE and name not in PARTIAL
        named = formula is None and not free and not allocates and name not in MOVES
        matmul = formula is None and str(func.overloadpacket) in UNCOUNTED_MATMULS
        return cls(name, formula, free, allocates, mutable, reads, name in PARTIAL, named, matmul)


class OpCounter(dispatch_mode_base()):
    """Sees every aten op of the counting run and adds each to ``counts``: its FLOPs by device and
    precision (by ``formulas``: the op packet -> FLOP formula table of torch's ``FlopCounterMode``), its
    bytes read and written, and its name when it does arithmetic no formula counts.

    Why not FlopCounterMode's own dispatch mode beside this one: torch wraps a TorchDispatchMode's
    ``__torch_dispatch__`` in ``torch._disable_dynamo``, which imports ``torch._dynamo`` on first use,
    4 to 7 s on a busy 2-core machine, paid by a notebook's first ``%%cudatime``; this class keeps out of that
    wrapper (:func:`~torchgpu_magic.torchapi.dispatch_mode_base`, shared with the first-run watch), on any
    torch, because the counting run never compiles (see :func:`count`). The formulas and the rest of
    FlopCounterMode's dispatch (metadata ops passed on, composite ops decomposed so their parts are counted)
    are the same."""

    supports_higher_order_operators = True  # torch.cond, flex_attention...: run, and named as unseen
    never_compiles = True  # the counting run runs compiled code eagerly

    def __init__(self, formulas: dict) -> None:
        super().__init__()
        self.formulas = formulas
        self.counts = Counts()
        self.rules: dict = {}  # op overload -> _Rule
        self.leaves: set = set()  # op overloads without a decomposition
        self.tf32 = tf32_allowed()  # read once per run, not per op

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # A higher-order op (torch.cond, flex_attention, a Triton kernel) runs, but the ops inside it are not
        # seen one by one, so neither its FLOPs nor its bytes are counted.
        if is_higher_order_op(func):
            out = func(*args, **kwargs)
            self.counts.ops += 1
            self.counts.opaque[str(func.name())] += 1
            return out
        if func.overloadpacket.__name__ in METADATA:
            return NotImplemented
        rule = self.rules.get(func)
        if rule is None:
            rule = self.rules[func] = _Rule.of(func, self.formulas)
        if rule.formula is None and func not in self.leaves and func is not torch.ops.prim.device.default:
            with self:  # a composite op: count the ops it is made of (as FlopCounterMode does)
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
            self.leaves.add(func)  # no decomposition: never try again in this run
        out = func(*args, **kwargs)
        self.add(func, rule, args, kwargs, out)
        return out

    def add(self, func: Any, rule: _Rule, args: Any, kwargs: dict, out: Any) -> None:
        """Count one op that ran (``out`` is what it returned): its FLOPs by its formula, its bytes."""
        counts = self.counts
        counts.ops += 1
        inputs, outputs = tensors_in(args, kwargs), tensors_in(out)
        try:
            flops = rule.formula(*args, **kwargs, out_val=out) if rule.formula is not None else 0
        except Exception:  # noqa: BLE001 - a formula that cannot read these arguments: FLOPs unknown
            flops = None
        if flops:
            where = (outputs or inputs)[0].device.type if (outputs or inputs) else "cpu"
            kind = precision(func, inputs, where == "cuda", self.tf32)
            counts.flops[(where, kind)] += flops
        elif (flops is None or rule.matmul) and inputs:
            counts.unknown[str(func.overloadpacket)] += 1
        elif rule.named and inputs:
            counts.uncounted[str(func.overloadpacket)] += 1
        if rule.free:
            return
        mutated = tensors_in([args[i] if i < len(args) else kwargs.get(name) for i, name in rule.mutable])
        mutated_keys = {_key(t) for t in mutated}
        moved: dict = {}
        for t in inputs:
            key = _key(t)
            if rule.reads_mutated or key not in mutated_keys:
                moved.setdefault(("read",) + key, t)
        if not rule.allocates:
            for t in outputs + mutated:
                key = _key(t)
                if not rule.partial or key not in mutated_keys:
                    moved.setdefault(("write",) + key, t)
        for t in moved.values():
            counts.bytes[t.device.type] += tensor_bytes(t)


def _eager() -> ContextManager[Any]:
    """``set_stance("force_eager")`` where dynamo is loaded (``torch.compile`` loads it; importing it
    here would cost seconds and compile nothing)."""
    return torch.compiler.set_stance("force_eager") if dynamo_loaded() else contextlib.nullcontext()


def count(run: Callable[[], Any], silence: Callable[[], ContextManager[Any]]) -> Counts:
    """Call ``run`` (one loop of the cell) once under the counter, silenced, with compiled functions
    running eagerly; return what it did. What ``run`` raises propagates."""
    formulas, causal = registry(FlopCounterMode(display=False).flop_registry)
    counter = OpCounter(formulas)
    start = time.perf_counter()
    with silence(), _eager(), counter:
        run()
    counter.counts.seconds = time.perf_counter() - start
    counter.counts.compiled = compiled_graphs() > 0  # never imports dynamo
    counter.counts.causal = dict(causal)
    return counter.counts
