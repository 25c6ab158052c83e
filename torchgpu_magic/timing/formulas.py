"""FLOP formulas the roofline adds to those of torch's ``FlopCounterMode``.

- **Causal attention.** torch's attention formulas (torch/utils/flop_counter.py: ``sdpa_flop``,
  ``_flash_attention_forward_flop``... "NB: We aren't accounting for causal attention here") count every
  (query, key) pair. The flash, memory-efficient and cuDNN kernels skip the tiles a causal mask hides, so
  their work follows the pairs that are attended. The count here follows the same convention: FLOPs in
  proportion to the attended pairs, s_q (s_q + 1) / 2 of s_q x s_k for a square causal mask (FlashAttention's
  own benchmarks count causal attention as half of full attention: the same figure, to one row). Causal
  means ``is_causal=True`` (torch's mask is top-left aligned: query i sees keys 0..i), the memory-efficient
  kernel's ``custom_mask_type`` (1 top-left, 2 bottom-right), or an explicit mask whose values are a
  causal triangle for every batch and head (a boolean mask, or an additive one whose hidden entries are
  -inf or below half of the dtype's lowest value, as transformers builds them), recognised from its values
  in the counting run. A kernel given an explicit mask computes every tile all the same; the count is the
  useful work, so achieved FLOP/s stay comparable between the two ways of asking for causal attention.
  Sliding windows (``window_size``) are not taken into account: such attention is counted as causal or full.
- **CPU flash attention**, for which torch has the formula but registers none.
- **The fused ops torch's ``nn`` modules run in eval mode** (under ``torch.no_grad()``, on their fast
  paths), which have no formula in torch: ``_native_multi_head_attention`` (``nn.MultiheadAttention``),
  ``_transformer_encoder_layer_fwd`` (``nn.TransformerEncoderLayer`` / ``TransformerEncoder``, dense or
  nested), ``mkldnn_rnn_layer`` (cpu ``nn.LSTM`` / ``nn.GRU``), ``_cudnn_rnn`` (the same on CUDA), and the
  matrix ops a module can reach without a formula in torch (``_addmm_activation``, ``addmv``, ``mv``,
  ``dot``, ``vdot``, ``addbmm``, ``_int_mm``). Each counts its matrix products and attention as torch's own
  formulas count them: 2 FLOPs per multiply-add, elementwise work (norms, activations, gates) not counted.
- :data:`UNCOUNTED_MATMULS`: fused ops known to do matrix products that no formula here counts; where one
  ran, the roofline says the FLOPs are not counted rather than showing an intensity of zero.

torch is imported inside the functions; its flop_counter module only when a registry is built (its import
logs a warning about triton, which :mod:`.counting` silences first).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional

from ..torchapi import argument_names

UNCOUNTED_MATMULS = frozenset({
    "aten._grouped_mm", "aten._scaled_grouped_mm", "aten._scaled_grouped_mm_v2", "aten._weight_int4pack_mm",
    "aten._weight_int4pack_mm_for_cpu", "aten._weight_int8pack_mm", "aten._cslt_sparse_mm",
    "aten._sparse_semi_structured_linear", "aten._sparse_semi_structured_mm",
    "aten._sparse_semi_structured_addmm", "aten.miopen_rnn", "aten._triton_multi_head_attention",
    "aten._triton_scaled_dot_attention", "aten.mkldnn_linear", "aten._mkldnn_convolution",
})
"""Ops that do matrix products (or convolutions) for which neither torch nor this module has a formula."""

# The attention ops whose FLOPs follow the attended pairs, with where their sequence lengths are: 'bhsd'
# (batch, heads, seq, dim: the scaled_dot_product_* ops) or 'bshd' (the flash / efficient kernels'
# own ops, whose q/k are batch, seq, heads, dim).
ATTENTION = {
    "_scaled_dot_product_flash_attention": "bhsd", "_scaled_dot_product_flash_attention_backward": "bhsd",
    "_scaled_dot_product_efficient_attention": "bhsd",
    "_scaled_dot_product_efficient_attention_backward": "bhsd",
    "_scaled_dot_product_cudnn_attention": "bhsd", "_scaled_dot_product_cudnn_attention_backward": "bhsd",
    "_scaled_dot_product_flash_attention_for_cpu": "bhsd",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "bhsd",
    "_flash_attention_forward": "bshd", "_flash_attention_backward": "bshd",
    "_efficient_attention_forward": "bshd", "_efficient_attention_backward": "bshd",
}
_MASK_TYPES = {1: 0, 2: None}  # the efficient kernel's custom_mask_type -> diagonal (None: bottom-right)
NEEDS_OP = "needs_op"
"""The attribute marking a formula that takes the op overload as its first argument."""


def attended_pairs(s_q: int, s_k: int, diagonal: Optional[int] = 0) -> int:
    """How many (query, key) pairs a causal mask of ``s_q`` x ``s_k`` leaves: query i sees keys
    0..i + ``diagonal`` (0: torch's top-left ``is_causal``; None: bottom-right, diagonal s_k - s_q)."""
    first = (s_k - s_q if diagonal is None else diagonal) + 1  # keys the first query sees, before clamping
    lo = min(max(0, 1 - first), s_q)  # queries before lo see nothing
    hi = max(min(s_q, s_k + 1 - first), lo)  # queries from hi on see every key
    return (hi - lo) * first + (lo + hi - 1) * (hi - lo) // 2 + (s_q - hi) * s_k


def _causal_mask_diagonal(mask: Any, s_q: int, s_k: int, triangles: dict) -> Optional[int]:
    """0 where ``mask`` (boolean: True attends; or additive) is torch's causal triangle for every batch and
    head, else None. Reads its values: a mask without any (a fake or meta tensor) is not recognised.
    ``triangles`` keeps the triangle each shape and device was compared with, for the run."""
    import torch

    try:
        if mask is None or mask.dim() < 2 or tuple(mask.shape[-2:]) != (s_q, s_k):
            return None
        with torch.no_grad():
            # an additive mask hides with -inf, or transformers' finfo.min
            keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
            where = ("triangle", s_q, s_k, mask.device)
            if where not in triangles:
                triangles[where] = torch.ones(s_q, s_k, dtype=torch.bool, device=mask.device).tril()
            return 0 if bool(torch.equal(keep, triangles[where].expand_as(keep))) else None
    except Exception:  # noqa: BLE001 - no values to read (fake, meta), or an odd mask: counted full
        return None


def _causal(name: str, base: Callable[..., int], masks: dict, causal: Counter) -> Callable[..., int]:
    """torch's attention formula ``base`` for op ``name``, times the share of pairs a causal mask leaves.
    The formula takes the op overload first (:data:`NEEDS_OP`: its schema names the arguments); ``masks``
    keeps what each explicit mask was found to be, for the run (with the mask, so that its id is not
    reused by another tensor meanwhile: a boolean mask, which attention converts to a new additive one at
    each call, is read at each call) and the triangles compared with; ``causal`` counts the calls counted
    as causal, by op name."""
    layout = ATTENTION[name]

    def formula(func: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        flops = base(*args, out_val=out_val, **kwargs)
        bound = {**dict(zip(argument_names(func), args)), **kwargs}  # the arguments by their schema names
        query, key = bound.get("query"), bound.get("key")
        if query is None or key is None or query.is_nested or key.is_nested:
            return flops
        if bound.get("cum_seq_q") is not None or bound.get("cu_seqlens_q") is not None:
            return flops  # packed sequences of different lengths: counted full
        seq = -2 if layout == "bhsd" else 1
        s_q, s_k = int(query.shape[seq]), int(key.shape[seq])
        diagonal: Any = False
        if bound.get("is_causal"):
            diagonal = 0
        elif bound.get("custom_mask_type") in _MASK_TYPES:
            diagonal = _MASK_TYPES[bound["custom_mask_type"]]
        else:
            mask = bound.get("attn_mask", bound.get("attn_bias", bound.get("bias")))
            if mask is not None:
                if id(mask) not in masks:
                    masks[id(mask)] = (mask, _causal_mask_diagonal(mask, s_q, s_k, masks))
                found = masks[id(mask)][1]
                diagonal = found if found is not None else False
        if diagonal is False or not s_q or not s_k:
            return flops
        causal[f"aten.{name}"] += 1
        return flops * attended_pairs(s_q, s_k, diagonal) // (s_q * s_k)

    setattr(formula, NEEDS_OP, True)
    return formula


# ---- fused ops -------------------------------------------------------------------------------------------
def _tokens_and_lengths(x: Any) -> tuple:
    """(tokens, [sequence lengths]) of a (batch, seq, feature) tensor, or a nested one of sequences."""
    if x.is_nested:
        lengths = [int(t.shape[0]) for t in x.unbind()]
        return sum(lengths), lengths
    batch, seq = int(x.shape[0]), int(x.shape[1])
    return batch * seq, [seq] * batch


def _multi_head_attention(query: Any, key: Any, value: Any, embed_dim: int, num_head: int, *args: Any,
                          out_val: Any = None, **kwargs: Any) -> int:
    """``_native_multi_head_attention``: the q, k, v and output projections and the attention itself."""
    tokens_q, lengths_q = _tokens_and_lengths(query)
    tokens_k, lengths_k = _tokens_and_lengths(key)
    projections = 2 * embed_dim * embed_dim * (2 * tokens_q + 2 * tokens_k)
    attention = sum(4 * q * k * embed_dim for q, k in zip(lengths_q, lengths_k))
    return projections + attention


def _encoder_layer(src: Any, embed_dim: int, num_heads: int, qkv_weight: Any, *args: Any,
                   out_val: Any = None, **kwargs: Any) -> int:
    """``_transformer_encoder_layer_fwd``: self-attention (qkv and output projections, attention) and the
    two feed-forward linears."""
    bound = dict(zip(("qkv_bias", "proj_weight", "proj_bias", "use_gelu", "norm_first", "eps",
                      "norm_weight_1", "norm_bias_1", "norm_weight_2", "norm_bias_2", "ffn_weight_1"), args))
    ffn = bound.get("ffn_weight_1", kwargs.get("ffn_weight_1"))
    tokens, lengths = _tokens_and_lengths(src)
    hidden = int(ffn.shape[0]) if ffn is not None else 0
    return (2 * tokens * embed_dim * 4 * embed_dim + sum(4 * n * n * embed_dim for n in lengths)
            + 2 * 2 * tokens * embed_dim * hidden)


def _rnn_layer(input: Any, weight0: Any, weight1: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """``mkldnn_rnn_layer`` (one layer, one direction): input and hidden weights over every step."""
    steps = int(input.shape[0]) * (int(input.shape[1]) if input.dim() == 3 else 1)
    return 2 * steps * (weight0.numel() + weight1.numel())


_GATES = {0: 1, 1: 1, 2: 4, 3: 3}  # cuDNN's RNN modes: RNN_RELU, RNN_TANH, LSTM, GRU


def _cudnn_rnn(input: Any, weight: Any, weight_stride0: int, weight_buf: Any, hx: Any, cx: Any, mode: int,
               hidden_size: int, proj_size: int, num_layers: int, batch_first: bool, dropout: float,
               train: bool, bidirectional: bool, batch_sizes: Any, *args: Any, out_val: Any = None,
               **kwargs: Any) -> int:
    """``_cudnn_rnn``: each layer's input and recurrent products over every step, both directions, and the
    LSTM projection where there is one."""
    gates, dirs = _GATES.get(int(mode), 1), 2 if bidirectional else 1
    steps = int(input.shape[0]) if list(batch_sizes or []) else int(input.shape[0]) * int(input.shape[1])
    out = int(proj_size) or int(hidden_size)
    total = 0
    for layer in range(int(num_layers)):
        inputs = int(input.shape[-1]) if layer == 0 else out * dirs
        per_step = gates * hidden_size * (inputs + out) + (hidden_size * out if proj_size else 0)
        total += 2 * steps * dirs * per_step
    return total


def _mm(a: Any, b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """(m, k) @ (k, n): 2 m k n (``_int_mm``)."""
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _mv(a: Any, v: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return 2 * a.shape[0] * a.shape[1]


def _after_bias(formula: Callable[..., int]) -> Callable[..., int]:
    """``formula`` for an op that adds a bias, its first argument, to the same product (``addmv``;
    ``_addmm_activation``, a linear with its GELU / ReLU fused)."""
    return lambda bias, *args, **kwargs: formula(*args, **kwargs)


def _dot(a: Any, b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return 2 * a.numel()


def _addbmm(bias: Any, a: Any, b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """The batched products summed into one matrix: 2 b n m p."""
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


def _attention_cpu(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _attention_cpu_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None,
                            **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def registry(base: dict) -> tuple:
    """``(table, causal)``: torch's formula table ``base`` (op packet -> formula on raw args, as
    ``FlopCounterMode`` keeps it) with this module's formulas added and the attention ones made
    causal-aware, for one counting run (explicit masks are recognised once per run); ``causal`` counts,
    by op name, the attention calls that run counted as causal."""
    import torch

    aten = torch.ops.aten
    table = dict(base)
    added = {"_native_multi_head_attention": _multi_head_attention,
             "_transformer_encoder_layer_fwd": _encoder_layer, "mkldnn_rnn_layer": _rnn_layer,
             "_cudnn_rnn": _cudnn_rnn, "_scaled_dot_product_flash_attention_for_cpu": _attention_cpu,
             "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_cpu_backward,
             "_addmm_activation": _after_bias(_mm), "_int_mm": _mm, "mv": _mv, "addmv": _after_bias(_mv),
             "dot": _dot, "vdot": _dot, "addbmm": _addbmm}
    for name, formula in added.items():  # private ops a torch may rename or drop: each one skipped then
        if hasattr(aten, name):
            table.setdefault(getattr(aten, name), formula)
    masks: dict = {}
    causal: Counter = Counter()
    for name in ATTENTION:
        packet = getattr(aten, name, None)
        if packet is not None and packet in table:
            table[packet] = _causal(name, table[packet], masks, causal)
    return table, causal

