"""The reference `%%cudamem --predict cuda` is held against: the cell run for real, on cpu tensors, made to
take CUDA's kernel choices where they change what is allocated, accounted as the CUDA caching allocator
would hand the memory out, plus the allowances that lie inside the allocator.

How it is built (each step is what a CUDA GPU would do differently from a plain cpu run, and nothing
else; none of it goes through the prediction's fake tensors or its emulated kernels in
torchgpu_magic/cudamem/cudakernels.py):

- **Real tensors, real kernels.** The setup and the cell run on real cpu tensors (in the tests, in a fresh
  Python process: hundreds of MiB freed in the test process would raise glibc's mmap threshold and spoil
  the RSS figures of later tests). Every storage the run allocates and frees is seen by torch's
  MemTracker (torchgpu_magic.cudamem.run.run_tracked, the tracker ``%%cudamem`` measures with) and
  handed, block by block, to the model of the CUDA caching allocator (cudamem/allocator.py), as a
  measured ``%%cudamem cuda`` run is: the allocator's rounding and segments are the same on both sides,
  so what is compared is what the step allocates.
- **Attention.** CUDA runs ``scaled_dot_product_attention`` with a fused kernel for the cells used here
  (head size 64, no mask: flash attention for bf16, memory-efficient attention for fp32, on sm_90), and a
  fused kernel keeps only its output and a float32 log-sum-exp per query row for the backward, and
  regenerates its dropout from the random seed instead of keeping a mask. cpu's own fused kernel,
  ``_scaled_dot_product_flash_attention_for_cpu``, keeps the same two tensors (the efficient kernel pads
  the log-sum-exp rows to a multiple of 32: the sequences here are), but takes no dropout: the
  reference calls it with dropout 0, which allocates what CUDA's kernel allocates with dropout (values
  differ, memory does not). Its output follows the query's memory layout, as CUDA's flash kernel's
  does (``empty_like`` of the query); CUDA's memory-efficient kernel allocates its output as (batch,
  seq, heads, dim), so that ``nn.MultiheadAttention``'s ``permute(...).contiguous()`` after it copies: for
  fp32 the reference keeps that layout (an autograd function around the cpu kernel saving the output so
  laid out). ``F.scaled_dot_product_attention`` is replaced for the run (so also where
  ``F.multi_head_attention_forward`` calls it, by its module global); cpu's math path, which keeps the
  attention matrix and a dropout mask, never runs.
- **Dropout.** CUDA's ``dropout`` in training is the fused ``native_dropout``, which keeps a one-byte
  mask; cpu's keeps a scaled float copy. ``F.dropout`` is replaced by ``torch.native_dropout``, whose cpu
  kernel keeps the same one-byte mask.
- **Autocast.** ``torch.autocast('cuda', dtype)`` becomes ``torch.autocast('cpu', dtype)``. For the ops
  the cells here run under it, cpu's and CUDA's autocast lists agree (aten/src/ATen/autocast_mode.cpp):
  ``linear``, ``addmm`` and ``scaled_dot_product_attention`` in lower precision on both; ``layer_norm``
  is fp32 on CUDA and listless on cpu, but its input is the float32 residual sum on both; ``relu``,
  ``add`` and ``dropout`` have no policy on either. (A cell whose ops the lists treat differently, such as
  ``pow`` or ``softmax``, is not one to use this reference for.)
- **Optimizer.** AdamW is given ``foreach=True``, its implementation on CUDA tensors (cpu's default is
  the per-parameter loop).
- **Allowances inside the allocator**: the cuBLAS workspace of the thread that runs the forward, allocated
  through the caching allocator at its first matrix product, and the one of autograd's device thread at
  the first product of the backward (a workspace per cuBLAS handle and stream: each thread has its own
  handle; aten/src/ATen/cuda/CublasHandlePool.cpp), each 32 MiB on sm_90 (``:4096:8``), cuBLASLt sharing
  them (unified by default since pytorch/pytorch#168175). The CUDA context lies beside the allocator and
  is the same figure on both sides, so it is left out of the comparison.

:func:`measure` runs one cell in a namespace (the benchmark's way, on the live objects); :func:`start`
and :func:`finish` (or :func:`reference`) run (setup, cell) pairs in a fresh process (the tests' way).
Each gives the peak allocated, the peak reserved and the categories at the peak.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

MIB = 2**20
CUBLAS_WORKSPACE = 32 * MIB  # sm_90's default (CUBLAS_WORKSPACE_CONFIG :4096:8)


def _fused_attention() -> tuple:
    """(``F.scaled_dot_product_attention`` taking CUDA's fused kernels' memory, ``F.dropout`` taking
    CUDA's fused dropout's), built on cpu kernels."""
    import torch

    aten = torch.ops.aten
    dropout_before = torch.nn.functional.dropout

    class Efficient(torch.autograd.Function):
        """cpu's flash kernel, keeping what CUDA's memory-efficient kernel keeps: its output laid out as
        that kernel allocates it, (batch, seq, heads, dim) in memory, and the log-sum-exp."""

        @staticmethod
        def forward(ctx: Any, query: Any, key: Any, value: Any, is_causal: bool, scale: Any) -> Any:
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                                        scale=scale)
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
            ctx.save_for_backward(query, key, value, out, lse)
            ctx.is_causal, ctx.scale = is_causal, scale
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            query, key, value, out, lse = ctx.saved_tensors
            grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad.contiguous(), query, key, value, out, lse, 0.0, ctx.is_causal, scale=ctx.scale)
            return (*grads, None, None)

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
        fused = attn_mask is None and query.shape[-1] % 8 == 0 and query.shape[-2] % 32 == 0
        assert fused, "not a case CUDA runs with a fused kernel that this reference takes"
        if query.dtype in (torch.float16, torch.bfloat16):  # flash: its output follows the query's layout
            return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                                    scale=scale)[0]
        return Efficient.apply(query, key, value, is_causal, scale)

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and not inplace and 0 < p < 1 and input.numel():
            return torch.native_dropout(input, p, True)[0]
        return dropout_before(input, p, training, inplace)

    return sdpa, dropout


def measure(ns: dict, cell: str, workspace: int = CUBLAS_WORKSPACE) -> dict:
    """Run ``cell`` for real in namespace ``ns`` (real cpu tensors; every model, optimizer and tensor in
    it counts as held before the cell), as described above: ``peak``, ``reserved_peak`` (bytes),
    ``categories`` at the peak, the ``workspaces`` allocated (by thread)."""
    import torch
    import torch.nn.functional as F

    from torchgpu_magic.cudamem.allocator import CachingAllocatorModel, Ledger
    from torchgpu_magic.cudamem.run import find_objects, run_tracked

    for value in ns.values():
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                group["foreach"] = True
    code = compile(cell.replace("autocast('cuda'", "autocast('cpu'"), "<cell>", "exec")
    objects = find_objects([(k, v) for k, v in ns.items() if not k.startswith("_")])
    added: list = []

    def on_matmul(ledger: Any) -> None:
        thread = "autograd's thread" if ledger.where()[0] == "backward" else "the cell's thread"
        if thread not in added:
            added.append(thread)
            ledger.add(("workspace", thread), workspace, "workspaces")

    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = _fused_attention()
    try:
        ledgers, _, _ = run_tracked(lambda: exec(code, ns), objects,
                                    lambda name: Ledger(CachingAllocatorModel()), on_matmul)
    finally:
        F.scaled_dot_product_attention, F.dropout = saved
    ledger = ledgers["cpu"]
    return {"peak": ledger.peak, "reserved_peak": ledger.reserved_peak, "categories": ledger.peak_categories,
            "workspaces": added}


_PROGRAM = r"""
import json, sys
import cuda_reference

out = []
for setup, cell in json.loads(sys.stdin.read()):
    ns = {}
    exec(setup, ns)
    out.append(cuda_reference.measure(ns, cell))
print("REFERENCE " + json.dumps(out))
"""


def start(jobs: list) -> subprocess.Popen:
    """Start the reference runs of ``jobs`` ((setup code, cell code) pairs) in a fresh process; collect
    them with :func:`finish`. Starting early lets the predictions run meanwhile (they use one core)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-c", _PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path},
                            cwd=os.path.dirname(here))
    proc.stdin.write(json.dumps(jobs))
    proc.stdin.close()
    return proc


def finish(proc: subprocess.Popen, timeout: float = 600) -> list:
    """The reference figures of the jobs given to :func:`start`, in order."""
    stdout = proc.stdout.read()
    stderr = proc.stderr.read()
    proc.wait(timeout)
    line = next((ln for ln in stdout.splitlines() if ln.startswith("REFERENCE ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"the reference run failed ({proc.returncode}): {stderr[-3000:]}")
    return json.loads(line[len("REFERENCE "):])


def reference(jobs: list) -> list:
    """The reference figures of ``jobs`` ((setup code, cell code) pairs): per job a dict of ``peak``,
    ``reserved_peak`` (bytes) and ``categories`` at the peak."""
    return finish(start(jobs))
