"""``%gpumem`` and ``%%cudamem`` on a real GPU: ``%gpumem``'s figures against torch's allocator and NVML's
process list; a real CUDA out-of-memory explained (holders named, this process found) and ``%gpumem
free`` giving back what it says; ``%%cudamem --predict cuda`` against the measured peak of the same
GPT-2-sized step, fp32 and bf16 autocast. Each measures through the shell and hands its figures to a
verdict function the tests call with figures that miss.
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional

from ..render import fmt_bytes
from .outcome import SKIPPED, Outcome, Skip, judged, within, worst
from .probe import MiB, Probe, smi_process_mib

PREDICT_TOLERANCE = 0.05
TENSOR_BYTES = 256 * MiB
OOM_ASK = 512 * MiB

# GPT-2 124M's shapes (``transformers.GPT2Config()``'s defaults) in plain torch, for a machine without
# transformers: tied embeddings, pre-LayerNorm blocks, causal attention, a 4x GELU MLP, dropout 0.1.
GPT2_IN_TORCH = '''
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.c_attn(self.ln_1(x)).split(d, dim=2))
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop(self.attn_proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, positions=1024, d=768, layers=12, heads=12, p=0.1):
        super().__init__()
        self.wte, self.wpe, self.drop = nn.Embedding(vocab, d), nn.Embedding(positions, d), nn.Dropout(p)
        self.h = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


model = GPT2().cuda()
vocab = 50257
loss_of = lambda model, ids: model(ids)
'''
GPT2_FROM_CONFIG = '''
import torch
import transformers

config = transformers.GPT2Config()
model = transformers.GPT2LMHeadModel(config).cuda()
vocab = config.vocab_size
loss_of = lambda model, ids: model(input_ids=ids, labels=ids).loss
'''
STEP = {"fp32": "loss = loss_of(model, ids)\n",
        "bf16 autocast": "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
                         "    loss = loss_of(model, ids)\n"}
STEP_TAIL = "loss.backward()\nopt.step()\nopt.zero_grad()\ndel loss"


# ---- %gpumem's figures ---------------------------------------------------------------------------------
def gpumem_figures(probe: Probe) -> Outcome:
    """``%gpumem --text``'s snapshot with 256 MiB allocated: allocated and reserved against torch's own,
    this process's figure against NVML's process list (through ``nvidia-smi``)."""
    import torch

    index = probe.cuda()
    probe.cell(f"x = torch.empty({TENSOR_BYTES}, dtype=torch.uint8, device='cuda')\ntorch.cuda.synchronize()")
    with probe.displayed() as shown:
        probe.shell.run_line_magic("gpumem", "--text")
    allocated, reserved = torch.cuda.memory_allocated(index), torch.cuda.memory_reserved(index)
    try:
        listed: Optional[dict] = smi_process_mib(os.getpid())
    except Skip as exc:
        listed, why = None, str(exc)
    else:
        why = "" if listed else "NVML's process list has no entry for this PID (a container's PID namespace?)"
    probe.shell.run_line_magic("gpumem", "stop")
    snapshots = [s for s in shown if hasattr(s, "gpus")]
    if not snapshots:
        raise RuntimeError(f"%gpumem --text displayed no snapshot (it showed {shown!r})")
    gpu = next(g for g in snapshots[0].gpus if g.target.torch_index == index)
    probe.say(f"%gpumem: {gpu.to_dict()}; torch allocated {allocated}, reserved {reserved}; "
              f"nvidia-smi {listed}")
    uuid = str(torch.cuda.get_device_properties(index).uuid)  # torch prints it without 'GPU-' / 'MIG-'
    process_mib = next((mib for key, mib in (listed or {}).items() if key.endswith(uuid)), None)
    if listed and process_mib is None:
        why = f"NVML's process list names this PID on other GPUs only ({', '.join(listed)})"
    return judge_gpumem(gpu.allocated, gpu.reserved, gpu.process, allocated, reserved, process_mib, why)


def judge_gpumem(allocated: Any, reserved: Any, process: Any, torch_allocated: int, torch_reserved: int,
                 nvml_process_mib: Optional[float], why_no_nvml: str) -> Outcome:
    """Allocated and reserved equal to torch's; this process's figure within 1 MiB of NVML's list (not
    checked, and said so, where the list does not name this process)."""
    parts = [judged(allocated == torch_allocated and reserved == torch_reserved,
                    f"allocated {fmt_bytes(allocated)} / reserved {fmt_bytes(reserved)} vs torch's "
                    f"{fmt_bytes(torch_allocated)} / {fmt_bytes(torch_reserved)}", "equal")]
    if nvml_process_mib is None:
        parts.append(Outcome(SKIPPED, why=f"this process's figure: {why_no_nvml}"))
    else:
        mib = None if process is None else process / MiB
        parts.append(judged(mib is not None and within(mib, nvml_process_mib, 1),
                            f"this process {fmt_bytes(process)} vs NVML's process list "
                            f"{nvml_process_mib:.0f} MiB",
                            "+- 1 MiB"))
    return worst(parts)


# ---- a real out-of-memory -----------------------------------------------------------------------------
def out_of_memory(probe: Probe) -> Outcome:
    """Fill the GPU with 256 MiB tensors in ``hog``; a 512 MiB allocation then fails and is explained
    (``cuda:N``, 512 MiB asked, ``hog`` named with its bytes, this process's figure read). Then a
    function fails holding 60 % of what is free in a local kept by the traceback: ``%gpumem free`` says
    what it gave back, which must be what torch's allocator then gave the driver back (the drop in its
    reserved memory: the traceback's tensors and the cache they fall into; the drop in allocated memory
    misses the cache's share), and the same allocation succeeds."""
    import torch

    index = probe.cuda()
    device = f"cuda:{index}"
    probe.cell("hog = []\nwhile True:\n    try:\n"
               f"        hog.append(torch.empty({TENSOR_BYTES}, dtype=torch.uint8, device='cuda'))\n"
               "    except torch.OutOfMemoryError:\n        break\n")
    out, result = probe.captured(f"x = torch.empty({OOM_ASK}, dtype=torch.uint8, device='cuda')")
    raised = isinstance(result.error_in_exec, torch.OutOfMemoryError)
    explained = re.split(r"^-{20,}$", out.stdout, maxsplit=1, flags=re.M)[0].strip()
    holders = probe.shell.run_line_magic("gpumem", f"holders {device} -o").section(device)
    hog = next((row.nbytes for row in holders.rows if row.name == "hog"), None)
    hog_bytes = sum(t.numel() for t in probe.shell.user_ns["hog"])
    process = holders.state.process
    probe.cell("del hog\ntorch.cuda.empty_cache()")
    free, _ = torch.cuda.mem_get_info(index)
    held = int(free * 0.6) // 4 * 4
    _, result = probe.captured(f"def step(n):\n"
                               f"    acts = torch.empty({held}, dtype=torch.uint8, device='cuda')\n"
                               f"    more = torch.empty(n, dtype=torch.uint8, device='cuda')\nstep({held})")
    second = isinstance(result.error_in_exec, torch.OutOfMemoryError)
    before = torch.cuda.memory_reserved(index)
    with probe.displayed():
        report = probe.shell.run_line_magic("gpumem", "free -o")
    probe.say(report.to_text())
    dropped = before - torch.cuda.memory_reserved(index)
    said = report.total().get(device, 0)
    probe.captured(f"retry = torch.empty({held}, dtype=torch.uint8, device='cuda')")
    retried = "retry" in probe.shell.user_ns
    return judge_oom(device, raised, explained, hog, hog_bytes, process, second, held, said, dropped, retried)


def judge_oom(device: str, raised: bool, explained: str, hog_row: Optional[int], hog_bytes: int,
              process: Optional[int], second: bool, held: int, said: int, dropped: int,
              retried: bool) -> Outcome:
    """The explanation's headline and holders, this process's figure, and ``%gpumem free``'s word against
    the allocator's (within 1 MiB) and the retry."""
    head = explained.splitlines()[0] if explained else "(no explanation printed)"
    expected = f"gpumem: out of memory on {device}: asked {fmt_bytes(OOM_ASK)}"
    parts = [
        judged(raised and head.startswith(expected),
               f"explained: {head[:120]}", f"starts '{expected}'",
               "" if raised else "the allocation did not raise torch.OutOfMemoryError"),
        judged(hog_row == hog_bytes, f"holder hog {fmt_bytes(hog_row)} of {fmt_bytes(hog_bytes)} held",
               "named with every byte"),
        judged(process is not None, f"this process's figure {fmt_bytes(process)}", "read from NVML",
               "NVML gave no figure for this process"),
        judged(second and within(said, dropped, MiB) and said >= held and retried,
               f"%gpumem free gave back {fmt_bytes(said)}, torch's reserved memory fell {fmt_bytes(dropped)} "
               f"({fmt_bytes(held)} held by the traceback); the same allocation then "
               f"{'succeeded' if retried else 'failed'}", "said = fall +- 1 MiB, >= held, retry succeeds",
               "" if second else "the second allocation did not run out of memory"),
    ]
    return worst(parts)


# ---- %%cudamem --predict cuda -------------------------------------------------------------------------
def cudamem_prediction(probe: Probe) -> Outcome:
    """``%%cudamem --predict cuda`` against ``%%cudamem cuda``'s measured peak (torch's own
    ``max_memory_allocated`` for the step) of a GPT-2 124M AdamW step, batch 8 x 512, fp32 and under bf16
    autocast; the model from ``transformers.GPT2Config()``, or the same shapes in plain torch where
    transformers is not installed (said in the figure)."""
    probe.cuda()
    try:
        import transformers  # noqa: F401 - only whether it is there
        source, built = GPT2_FROM_CONFIG, "transformers.GPT2Config()"
    except ImportError:
        source, built = GPT2_IN_TORCH, "GPT-2 124M's shapes in plain torch (transformers is not installed)"
    probe.cell(source + "opt = torch.optim.AdamW(model.parameters())\n"
                        "ids = torch.randint(0, vocab, (8, 512), device='cuda')")
    rows = []
    for precision, head in STEP.items():
        step = head + STEP_TAIL
        probe.cell(step)  # optimizer state created, workspaces allocated: the step as from its second run
        predicted = probe.shell.run_cell_magic("cudamem", "--predict cuda -o -q", step)
        measured = probe.shell.run_cell_magic("cudamem", "cuda -o -q", step)
        own = measured.torch_max_allocated
        probe.say(f"{precision}: predicted peak {predicted.peak}, measured {measured.peak}, torch's {own}")
        rows.append((precision, predicted.peak, own))
    return judge_prediction(rows, built)


def judge_prediction(rows: list, built: str) -> Outcome:
    """``rows``: (precision, predicted peak, measured peak); each within 5 %."""
    parts = []
    for precision, predicted, measured in rows:
        against = (f" vs measured {fmt_bytes(measured)} ({(predicted / measured - 1) * 100:+.1f} %)"
                   if measured else ", nothing measured")
        parts.append(judged(bool(measured) and within(predicted / measured, 1, PREDICT_TOLERANCE),
                            f"{precision}: predicted {fmt_bytes(predicted)}{against}", "within 5 %"))
    outcome = worst(parts)
    outcome.figure = f"{built}, AdamW, batch 8 x 512: {outcome.figure}"
    return outcome
