"""The roofline's counts (timing/counting.py) on real torch ops: FLOPs exact against the analytic figures
for matmul, bmm, conv2d, linear, scaled_dot_product_attention and a small MLP training step; the byte
lower bound exact for an elementwise add and a matmul, and the rules behind it (views and allocations
free, in-place ops, out=, overwrites, indexed writes, broadcasts, one read per tensor per op); the ops
FlopCounterMode cannot count named; precision per op; torch.compile'd code counted eagerly."""
from __future__ import annotations

import contextlib

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


# ---- bytes: the lower bound -----------------------------------------------------------------------------
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
    monkeypatch.setattr(torchapi, "_DISPATCH_BASE", [])
    monkeypatch.setattr(torchapi, "dynamo_skip", lambda: None)
    older = torchapi.dispatch_mode_base()

    class Watching(older):
        pass

    class Counting(older):
        never_compiles = True

    assert Watching._should_skip_dynamo() and not Counting._should_skip_dynamo()


def test_an_ops_tensors_are_found_in_lists_dicts_and_deeper():
    from torchgpu_magic.timing.dispatch import tensors_in

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
