"""The roofline's counts (timing/counting.py) on real torch ops: FLOPs exact against the analytic figures
for matmul, bmm, conv2d, linear, scaled_dot_product_attention and a small MLP training step; the bytes
each op reads and writes exact for an elementwise add and a matmul, and the rules behind them (views and
allocations free, in-place ops, out=, overwrites, indexed writes, broadcasts, one read per tensor per op);
the ops FlopCounterMode cannot count named; precision per op; torch.compile'd code counted eagerly."""
from __future__ import annotations

import contextlib
import functools

import pytest
import torch
import torch.nn.functional as F

from torchgpu_magic.timing import counting


def count(fn):
    return counting.count(fn, contextlib.nullcontext)


def flops(counts, where="cpu"):
    return sum(n for (w, _), n in counts.flops.items() if w == where)


# ---- FLOPs against the analytic figures -----------------------------------------------------------------
def test_matmul_counts_2mkn_flops_and_reads_both_writes_the_product():
    m, k, n = 64, 32, 48
    a, b = torch.randn(m, k), torch.randn(k, n)
    counts = count(lambda: a @ b)
    assert counts.flops == {("cpu", "fp32"): 2 * m * k * n}
    assert counts.bytes == {"cpu": (m * k + k * n + m * n) * 4}
    assert counts.uncounted == {}


def test_batched_matmul_counts_2bmkn():
    bsz, m, k, n = 3, 16, 8, 24
    a, b = torch.randn(bsz, m, k), torch.randn(bsz, k, n)
    assert flops(count(lambda: torch.bmm(a, b))) == 2 * bsz * m * k * n
    assert flops(count(lambda: a @ b)) == 2 * bsz * m * k * n  # matmul of 3-d tensors is a bmm


def test_conv2d_counts_two_flops_per_multiply_add():
    conv = torch.nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1, bias=False)
    image = torch.randn(2, 3, 17, 17)
    out = (17 + 2 * 1 - 3) // 2 + 1  # 9
    with torch.no_grad():
        counts = count(lambda: conv(image))
    assert flops(counts) == 2 * 2 * 8 * out * out * 3 * 3 * 3


def test_linear_counts_2bio_under_inference_mode_too():
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(10, 64)
    with torch.no_grad():
        assert flops(count(lambda: layer(x))) == 2 * 10 * 64 * 32
    with torch.inference_mode():  # aten.linear reaches the counters whole: FlopCounterMode decomposes it
        assert flops(count(lambda: layer(x))) == 2 * 10 * 64 * 32


def test_scaled_dot_product_attention_counts_both_products_on_cpu():
    """torch has the formula but registers none for the CPU flash-attention op; the counters add it."""
    b, h, s, d = 2, 4, 32, 16
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    counts = count(lambda: F.scaled_dot_product_attention(q, k, v))
    assert flops(counts) == 2 * (2 * b * h * s * s * d)  # q @ k^T, then scores @ v
    assert counts.uncounted == {}


def test_scaled_dot_product_attention_backward_is_counted_too():
    b, h, s, d = 1, 2, 16, 8
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    counts = count(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    forward = 2 * (2 * b * h * s * s * d)
    assert flops(counts) == forward + 5 * (2 * b * h * s * s * d)  # torch's backward: 5 products


def test_a_small_mlp_training_step_counts_forward_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)

    def step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    counts = count(step)
    first, second = 2 * 32 * 64 * 128, 2 * 32 * 128 * 10
    # forward: both layers; backward: the second layer's input and weight gradients, the first layer's
    # weight gradient only (x needs no gradient)
    assert flops(counts) == 2 * first + 3 * second
    assert "aten.relu" in counts.uncounted and "aten.threshold_backward" in counts.uncounted


# ---- bytes: each op's reads and writes ------------------------------------------------------------------
def test_elementwise_add_reads_two_and_writes_one():
    n = 10_000
    x, y = torch.randn(n), torch.randn(n)
    counts = count(lambda: x + y)
    assert counts.bytes == {"cpu": 3 * n * 4} and flops(counts) == 0
    assert counts.uncounted == {"aten.add": 1}


@pytest.mark.parametrize(("code", "expected"), [
    ("x.add_(y)", 3),  # reads x and y, writes x
    ("torch.add(x, y, out=z)", 3),  # reads x and y, writes z (never reads it)
    ("z.copy_(y)", 2),  # copy_ overwrites z without reading it
    ("x + x", 2),  # one tensor is read once per op
    ("x.t().unsqueeze(0)[0]", 0),  # views move nothing
    ("torch.empty(1000)", 0),  # an allocation writes nothing
    ("z.zero_()", 1),  # writes only
])
def test_byte_rules(code, expected):
    x, y, z = torch.randn(1000), torch.randn(1000), torch.randn(1000)
    if code.startswith("x.t()"):  # a 2-d tensor to transpose
        x = torch.randn(10, 100)
    counts = count(lambda: eval(code, {"torch": torch, "x": x, "y": y, "z": z}))
    assert counts.bytes.get("cpu", 0) == expected * 1000 * 4


def test_a_broadcast_operand_counts_its_distinct_elements_once():
    x, one = torch.randn(1000), torch.randn(1)
    assert count(lambda: x * one.expand(1000)).bytes == {"cpu": (1000 + 1 + 1000) * 4}


def test_an_indexed_write_is_charged_for_what_it_reads_only():
    x, index, values = torch.zeros(1000), torch.arange(10), torch.ones(10)
    counts = count(lambda: x.index_put_((index,), values))
    assert counts.bytes == {"cpu": 10 * 8 + 10 * 4}  # the indices and the values, not all of x


def test_bytes_and_flops_are_kept_by_device():
    x = torch.randn(100)
    m = torch.ones(4, device="meta")
    counts = count(lambda: (m * m, x * x))
    assert counts.bytes == {"meta": 2 * 4 * 4, "cpu": 2 * 100 * 4}


# ---- the same FLOPs as FlopCounterMode, without its cost ---------------------------------------------------
def _mlp_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    return lambda: model(x).square().mean().backward()


CASES = {
    "matmul": lambda: (lambda a, b: lambda: a @ b)(torch.randn(5, 7), torch.randn(7, 3)),
    "bmm": lambda: (lambda a: lambda: a @ a.transpose(1, 2))(torch.randn(2, 5, 7)),
    "conv": lambda: (lambda c, i: lambda: c(i))(torch.nn.Conv2d(2, 4, 3), torch.randn(1, 2, 9, 9)),
    "linear under inference_mode": lambda: (lambda layer, x: lambda: _inference(layer, x))(
        torch.nn.Linear(6, 5), torch.randn(3, 6)),
    "mlp step": _mlp_step,
}


def _inference(layer, x):
    with torch.inference_mode():
        return layer(x)


@pytest.mark.parametrize("case", CASES)
def test_flops_equal_flop_counter_modes_own_count(case):
    from torch.utils.flop_counter import FlopCounterMode

    fn = CASES[case]()
    with FlopCounterMode(display=False) as reference:
        fn()
    assert flops(count(fn)) == reference.get_total_flops() > 0


@pytest.mark.fresh_process
def test_counting_does_not_import_dynamo():
    """FlopCounterMode's own mode imports torch._dynamo on first use (seconds); the counter does not."""
    import subprocess
    import sys

    code = ("import contextlib, sys, torch\nfrom torchgpu_magic.timing import counting\n"
            "a = torch.randn(8, 8)\nc = counting.count(lambda: a @ a, contextlib.nullcontext)\n"
            "assert sum(c.flops.values()) == 1024, c\nassert 'torch._dynamo' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.fresh_process
def test_a_cuda_build_without_triton_gets_no_triton_warning_from_the_counter():
    """torch's flop counter logs "triton not found" at import on a CUDA build without triton (Windows):
    the counter never looks into Triton kernels, so the user's first %%cudatime must not show it."""
    import subprocess
    import sys

    code = ("import logging, sys, torch\nsys.modules['triton'] = None  # not importable, as on Windows\n"
            "torch.version.cuda = '13.0'\nfrom torchgpu_magic.timing import counting\n"
            "assert logging.getLogger('torch.utils.flop_counter').level == logging.NOTSET\n"
            "print('imported')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]
    assert "triton" not in done.stderr, done.stderr


def test_the_watch_and_the_counter_share_one_dispatch_base(monkeypatch):
    """observe's first-run watch and the roofline's counter are one kind of mode (torchapi.py): no
    torch._dynamo import for either; on a torch without the C layer that marks their code as never
    compiled, the watch keeps torch's wrapper (compiled code in the first run must not trace into it) and
    the counter, whose run never compiles, still keeps out of it."""
    from torchgpu_magic import torchapi
    from torchgpu_magic.timing import observe

    base = torchapi.dispatch_mode_base()
    assert issubclass(counting.OpCounter, base) and issubclass(observe._mode_class(), base)
    assert not counting.OpCounter._should_skip_dynamo() and not observe._mode_class()._should_skip_dynamo()
    fresh = functools.cache(torchapi.dispatch_mode_base.__wrapped__)  # made anew, the session's kept
    monkeypatch.setattr(torchapi, "dispatch_mode_base", fresh)
    monkeypatch.setattr(torchapi, "dynamo_skip", lambda: None)
    older = torchapi.dispatch_mode_base()

    class Watching(older):
        pass

    class Counting(older):
        never_compiles = True

    assert Watching._should_skip_dynamo() and not Counting._should_skip_dynamo()


def test_an_ops_tensors_are_found_in_lists_dicts_and_deeper():
    from torchgpu_magic.timing.observe import tensors_in

    a, b, c, d = (torch.zeros(1) for _ in range(4))
    found = tensors_in((a, [b, None], 3), {"weight": c, "nested": [(d,)]}, a)
    assert [id(t) for t in found] == [id(a), id(b), id(c), id(d), id(a)]


# ---- precision, names, compile ---------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "kind"), [(torch.bfloat16, "bf16"), (torch.float16, "fp16"),
                                             (torch.float64, "fp64"), (torch.float32, "fp32")])
def test_flops_are_kept_by_precision(dtype, kind):
    a = torch.randn(8, 8, dtype=dtype)
    assert count(lambda: a @ a).flops == {("cpu", kind): 2 * 8 * 8 * 8}


def test_fp32_on_cuda_is_tf32_where_torch_lets_cublas_and_cudnn_use_it():
    mm, conv = torch.ops.aten.mm.default, torch.ops.aten.convolution.default
    a = [torch.randn(2, 2)]
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
        assert counting.precision(mm, a, cuda=True) == "fp32"
        assert counting.precision(conv, a, cuda=True) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert counting.precision(mm, a, cuda=True) == "tf32"
        assert counting.precision(mm, a, cuda=False) == "fp32"  # cpu has no TF32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_ops_without_arithmetic_are_not_named_as_uncounted():
    x = torch.randn(10, 10)
    counts = count(lambda: (x.clone(), x.t().contiguous(), torch.cat([x, x]), x[2:5], x.relu()))
    assert counts.uncounted == {"aten.relu": 1}


def test_a_higher_order_op_runs_and_is_named_as_not_looked_into():
    x = torch.randn(4, 4).abs()
    counts = count(lambda: torch.cond(x.sum() > 0, lambda t: t @ t, lambda t: t + 1, (x,)))
    assert counts.opaque == {"cond": 1} and flops(counts) == 0  # the matmul inside is not seen


def test_compiled_functions_run_eagerly_for_the_count():
    def body(t):
        return (t @ t).relu()

    compiled = torch.compile(body, backend="eager")
    x = torch.randn(16, 16)
    compiled(x)
    counts = count(lambda: compiled(x))
    assert counts.compiled and flops(counts) == 2 * 16 ** 3 and counts.uncounted == {"aten.relu": 1}


def test_what_the_run_raises_propagates_and_leaves_no_mode_behind():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    def broken():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        count(broken)
    assert _get_current_dispatch_mode_stack() == []


@pytest.fixture
def fp32_settings():
    """torch's TF32 settings, new and legacy, put back as they were (the new ones to 'none')."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    for holder in (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn,
                   torch.backends.cudnn, torch.backends):
        holder.fp32_precision = "none"
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_the_new_fp32_precision_setting_decides_tf32_and_the_legacy_read_is_never_made(fp32_settings):
    """transformers' ``TrainingArguments(tf32=True)`` sets ``fp32_precision``; from then on torch raises
    when ``allow_tf32`` is read (issue 28, item 2)."""
    mm, conv = torch.ops.aten.mm.default, torch.ops.aten.convolution.default
    a = [torch.randn(2, 2)]
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    with pytest.raises(RuntimeError):
        _ = torch.backends.cuda.matmul.allow_tf32  # what the roofline used to read
    assert counting.tf32_allowed() == {"matmul": True, "conv": False, "rnn": True}  # rnn: torch's default
    assert counting.precision(mm, a, cuda=True) == "tf32"
    assert counting.precision(conv, a, cuda=True) == "fp32"
    torch.backends.cuda.matmul.fp32_precision = "none"  # says nothing: then the backend's, generic, legacy
    torch.backends.cudnn.fp32_precision = "ieee"
    assert counting.tf32_allowed()["matmul"] is False
    torch.backends.cudnn.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"
    assert counting.tf32_allowed()["matmul"] is True


def test_a_tf32_flag_that_cannot_be_read_costs_nothing(fp32_settings, monkeypatch):
    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("PyTorch is checking whether allow_tf32_new is enabled for cuBlas matmul")

    monkeypatch.setattr(torch.backends.cuda, "matmul", Broken())
    assert counting.tf32_allowed()["matmul"] is False
    a = torch.randn(8, 8)
    assert flops(count(lambda: a @ a)) == 2 * 8 ** 3


# ---- causal attention (issue 28, item 6) -----------------------------------------------------------------
ATTENTION_FULL = 4 * 2 * 4 * 256 * 256 * 64  # (2, 4, 256, 64): q @ k^T and scores @ v, 2 FLOPs per MAC
CAUSAL_SHARE = (256 * 257 // 2, 256 * 256)  # the pairs a 256 x 256 causal mask leaves


@pytest.mark.parametrize("s_q, s_k", [(1, 1), (5, 5), (3, 7), (7, 3), (64, 64), (10, 1)])
def test_attended_pairs_are_those_the_mask_leaves(s_q, s_k):
    from torchgpu_magic.timing import formulas

    for diagonal in (0, None):  # torch's is_causal (top-left), the efficient kernel's bottom-right
        offset = 0 if diagonal == 0 else s_k - s_q
        mask = torch.ones(s_q, s_k, dtype=torch.bool).tril(offset)
        assert formulas.attended_pairs(s_q, s_k, diagonal) == int(mask.sum()), (s_q, s_k, diagonal)


def test_causal_attention_counts_the_pairs_it_attends_not_the_full_square():
    """torch's formulas ignore is_causal (torch/utils/flop_counter.py): 134,217,728 FLOPs for (2, 4, 256,
    64) either way, and past 100 % the roofline blamed the clock."""
    q = torch.randn(2, 4, 256, 64)
    assert flops(count(lambda: F.scaled_dot_product_attention(q, q, q))) == ATTENTION_FULL
    causal = ATTENTION_FULL * CAUSAL_SHARE[0] // CAUSAL_SHARE[1]
    assert flops(count(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))) == causal
    g = q.clone().requires_grad_()
    backward = count(lambda: F.scaled_dot_product_attention(g, g, g, is_causal=True).sum().backward())
    assert flops(backward) == causal + causal * 5 // 2  # five products recomputed and propagated
    assert backward.causal == {"aten._scaled_dot_product_flash_attention_for_cpu": 1,
                               "aten._scaled_dot_product_flash_attention_for_cpu_backward": 1}


@pytest.mark.parametrize("mask", ["bool", "-inf", "finfo.min", "broadcast"])
def test_an_explicit_causal_mask_is_recognised_from_its_values(mask):
    q = torch.randn(2, 4, 256, 64)
    keep = torch.ones(256, 256, dtype=torch.bool).tril()
    masks = {"bool": keep, "-inf": torch.zeros(256, 256).masked_fill(~keep, float("-inf")),
             "finfo.min": torch.zeros(256, 256).masked_fill(~keep, torch.finfo(torch.float32).min),
             "broadcast": keep.expand(2, 1, 256, 256)}  # transformers' (batch, 1, q, k)
    counts = count(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=masks[mask]))
    assert flops(counts) == ATTENTION_FULL * CAUSAL_SHARE[0] // CAUSAL_SHARE[1]


def test_a_mask_that_is_not_causal_everywhere_counts_the_full_square():
    q = torch.randn(2, 4, 256, 64)
    padded = torch.ones(2, 1, 256, 256, dtype=torch.bool).tril()
    padded[1, :, :, 200:] = False  # the second sequence is padded: not the causal triangle
    assert flops(count(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=padded))) == ATTENTION_FULL
    ones = torch.ones(256, 256, dtype=torch.bool)
    assert flops(count(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=ones))) == ATTENTION_FULL


# ---- the fused ops nn modules run in eval mode (issue 28, item 7) ---------------------------------------
def _mha_flops(batch, q_len, k_len, dim):
    return 2 * dim * dim * (2 * batch * q_len + 2 * batch * k_len) + 4 * batch * q_len * k_len * dim


def test_multihead_attention_on_its_eval_fast_path_counts_projections_and_attention():
    """nn.MultiheadAttention in eval under no_grad runs one fused op, _native_multi_head_attention, which
    torch has no formula for: it counted 0 FLOPs ("intensity 0 FLOP/B")."""
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        counts = count(lambda: mha(x, x, x, need_weights=False))
    assert counts.flops == {("cpu", "fp32"): _mha_flops(2, 16, 16, 64)}
    assert not counts.uncounted and not counts.unknown


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_transformer_encoder_layers_on_their_fast_path_dense_and_nested():
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    x = torch.randn(2, 16, 64)
    ffn = 2 * 2 * 64 * 128
    with torch.no_grad():
        assert count(lambda: layer(x)).flops == {("cpu", "fp32"): _mha_flops(2, 16, 16, 64) + 2 * 16 * ffn}
        encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
        padding = torch.zeros(2, 16, dtype=torch.bool)
        padding[0, 10:] = True  # sequences of 10 and 16 tokens: the encoder runs them as a nested tensor
        counts = count(lambda: encoder(x, src_key_padding_mask=padding))
    per_layer = 2 * 26 * 64 * 256 + 4 * (10 * 10 + 16 * 16) * 64 + 26 * ffn
    assert counts.flops == {("cpu", "fp32"): 2 * per_layer} and counts.bytes["cpu"] > 0
    assert "aten._nested_tensor_from_mask" not in counts.uncounted  # a move, not arithmetic


def test_an_lstm_on_cpu_counts_its_input_and_recurrent_products():
    lstm = torch.nn.LSTM(64, 32, num_layers=2).eval()
    x = torch.randn(5, 3, 64)  # 5 steps, batch 3
    with torch.no_grad():
        counts = count(lambda: lstm(x))
    steps = 5 * 3
    assert counts.flops == {("cpu", "fp32"): 2 * steps * (4 * 32 * (64 + 32) + 4 * 32 * (32 + 32))}


def test_a_torch_without_one_of_the_private_ops_still_gets_the_others_formulas(monkeypatch):
    """The added formulas are for private aten ops a torch release may rename or drop: one missing is
    skipped, and every other op (and the causal attention wrapping) keeps its formula."""
    from torchgpu_magic.timing import formulas

    class Without:
        def __getattr__(self, name):
            if name in ("mkldnn_rnn_layer", dropped):
                raise AttributeError(name)
            return getattr(aten, name)

    aten = torch.ops.aten
    dropped = next(iter(formulas.ATTENTION))
    full = formulas.registry({})[0]
    monkeypatch.setattr(torch.ops, "aten", Without())
    table = formulas.registry({})[0]
    assert aten.mkldnn_rnn_layer in full and aten.mkldnn_rnn_layer not in table
    assert set(full) - set(table) <= {aten.mkldnn_rnn_layer, getattr(aten, dropped)}
    assert aten._cudnn_rnn in table and aten.addbmm in table


def test_cudnns_fused_rnn_counts_every_layer_direction_and_projection():
    from torchgpu_magic.timing import formulas

    formula = formulas.registry({})[0][torch.ops.aten._cudnn_rnn]
    x = torch.empty(7, 3, 16, device="meta")  # 7 steps, batch 3, 16 features
    lstm = formula(x, [], 0, None, None, None, 2, 32, 0, 2, False, 0.0, False, True, [], None)
    layer0, layer1 = 4 * 32 * (16 + 32), 4 * 32 * (2 * 32 + 32)
    assert lstm == 2 * 21 * 2 * (layer0 + layer1)
    projected = formula(x, [], 0, None, None, None, 2, 32, 8, 1, False, 0.0, False, False, [], None)
    assert projected == 2 * 21 * (4 * 32 * (16 + 8) + 32 * 8)
    packed = torch.empty(12, 16, device="meta")  # 12 tokens in all, as batch_sizes say
    gru = formula(packed, [], 0, None, None, None, 3, 32, 0, 1, False, 0.0, False, False, [5, 4, 3], None)
    assert gru == 2 * 12 * 3 * 32 * (16 + 32)


def test_a_fused_matrix_op_without_a_formula_is_named_and_its_flops_called_not_counted():
    from torchgpu_magic.timing import roofline

    x = torch.randn(8, 64)
    weight, scales = torch.randint(-128, 127, (32, 64), dtype=torch.int8), torch.rand(32)
    counts = count(lambda: (torch._weight_int8pack_mm(x, weight, scales), x @ x.T))
    assert counts.unknown == {"aten._weight_int8pack_mm": 1} and flops(counts) == 2 * 8 * 64 * 8
    rl = roofline.analyse(counts, "cpu", 1e-3, None)
    assert rl.intensity is None and rl.bound is None and rl.bytes > 0
    assert rl.line().startswith("8.19 MFLOP/s and more not counted (aten._weight_int8pack_mm), ")
    assert rl.short().startswith("FLOPs not counted, ")
    assert any("did matrix products whose FLOPs are not counted" in n for n in rl.notes)
