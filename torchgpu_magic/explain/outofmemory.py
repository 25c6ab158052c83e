"""The out-of-memory explanation shown above the traceback: on the device that failed, what was asked and
what is free (from the message, and read live), the user's failing line, who holds that device's memory
by name, largest first (:mod:`.report`), and what to do, in the order of what it frees, each with
its number. Nothing is advised that would not free memory here (no ``empty_cache()`` for this process:
torch's allocator already returned its whole free segments and retried before it raised; what is left in
its cache are fragments).

Read-only: it deletes, moves and keeps nothing (the report holds names, strings and numbers).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

from ..holders import devicestate
from ..holders.holdings import Holdings, Released, collect
from ..holders.report import DeviceHolders, device_holders, fragmented, nvml_unknown
from ..host import gc_paused
from ..render import Lines, Report, Reportable, fmt_bytes
from .failing import FailingLine, failing_line
from .oomerror import oom_facts

DEL_LINES = 3  # `del` advice for the largest few names; %gpumem holders lists every one


@dataclass(repr=False)
class OOMExplanation(Reportable):
    """What an out-of-memory error asked on ``device``, who holds that device's memory (``holders``) and
    the advice, largest first (``advice``: (bytes or None, line)); ``too_big`` when the request alone is
    more than the device has in all. ``facts`` is the message read by
    :func:`torchgpu_magic.explain.oomerror.oom_facts`, ``failing`` the user's failing line
    (:class:`torchgpu_magic.explain.failing.FailingLine`, empty when no cell's frame is in the traceback)."""

    device: str
    facts: Any
    holders: DeviceHolders
    advice: list
    too_big: bool = False
    failing: FailingLine = field(default_factory=FailingLine)

    def headline(self) -> str:
        facts, state = self.facts, self.holders.state
        parts = [f"asked {fmt_bytes(facts.asked)}" if facts.asked is not None else "the size asked is not in "
                 "the message"]
        if facts.free is not None:
            parts.append(f"{fmt_bytes(facts.free)} free when it failed")
        if state.free is not None:
            word = "available" if state.kind == "cpu" else "free"
            parts.append(f"{fmt_bytes(state.free)} {word} now, of {fmt_bytes(state.total)}")
        elif facts.total is not None:
            parts.append(f"of {fmt_bytes(facts.total)} in all")
        if state.limit:
            parts.append(f"under {state.limit}")
        if facts.limit is not None:
            parts.append(f"this process may use {fmt_bytes(facts.limit)}")
        return f"gpumem: out of memory on {self.device}: " + "; ".join(parts)

    def report(self) -> Report:
        """The headline, the failing line, who holds the device's memory, the advice numbered."""
        holders = Report([self.holders.table(), Lines(self.holders.notes())],
                         title=f"Who holds {self.device} memory, largest first:", indent="  ")
        advice = Report([Lines([f"{i}. {line}" for i, (_, line) in enumerate(self.advice, 1)])],
                        title="What to do:" if self.too_big else "What to do, largest first:", indent="  ")
        return Report([Lines(self.failing.lines()), holders, advice if self.advice else None],
                      title=self.headline())

    def to_dict(self) -> dict:
        return {"device": self.device, "facts": self.facts.to_dict(), "failing": self.failing.to_dict(),
                "holders": self.holders.to_dict(),
                "advice": [{"bytes": b, "text": t} for b, t in self.advice], "too_big": self.too_big}


@gc_paused()
def explain(exc: BaseException, ns: Mapping[str, Any], tracebacks: Iterable[Any] = (),
            cell_source: str = "", is_cell_file: Optional[Callable[[str], bool]] = None,
            ) -> Optional[OOMExplanation]:
    """The :class:`OOMExplanation` of ``exc`` when it is an out-of-memory error, else None. ``ns`` is the
    user namespace, ``tracebacks`` what keeps the failed cell's frames alive beyond the exception itself
    and ``sys.last_*`` (IPython's references), ``cell_source`` the failed cell's text, ``is_cell_file``
    which file names are notebook cells (for the failing line; without it, none is shown). The garbage
    collector is paused meanwhile (:func:`~torchgpu_magic.host.gc_paused`)."""
    facts = oom_facts(exc)
    if facts is None:
        return None
    failing = failing_line(exc, is_cell_file) if is_cell_file is not None else FailingLine()
    holdings = collect(ns, [exc, *tracebacks])
    state = devicestate.read(facts.device or "cpu")
    device = state.device
    holders = device_holders(holdings, device, state)
    total = state.total if state.total is not None else facts.total
    if state.kind == "mps" and facts.limit is not None:  # the allocator's high watermark is MPS's cap
        total = facts.limit
    too_big = facts.asked is not None and total is not None and facts.asked > total
    advice = _ask_less(facts, holdings, device, state, cell_source) + mps_watermark(facts, state)
    if too_big:
        has = (f"this process may use on {device} ({fmt_bytes(total)}, {state.limit})" if state.limit
               else f"{device} has in all ({fmt_bytes(total)})")
        advice.insert(0, (None, f"the request alone ({fmt_bytes(facts.asked)}) is more than {has}: nothing "
                                "freed here makes room. Look at the size asked (a shape or dtype larger "
                                "than meant?), or ask for less"))
    else:
        advice = _freeing(holdings, device, state, facts, cell_source) + advice
    return OOMExplanation(device, facts, holders, advice, too_big, failing)


def _freeing(holdings: Holdings, device: str, state: Any, facts: Any, source: str) -> list:
    """The advice that frees memory on ``device`` now, largest first, each with its bytes."""
    freed = Released(holdings, device)
    advice: list = []
    if freed.free:
        sources = (("the failed cell's traceback", freed.traceback), ("the output history", freed.output))
        parts = [f"{words} {fmt_bytes(size)}" for words, size in sources if size]
        advice.append((freed.free, f"%gpumem free gives back {fmt_bytes(freed.free)} without touching your "
                                   "names: " + ", ".join(parts)))
    graphs = {h.root for h in holdings.holders if h.scalar}  # their .item() advice says more than del
    alone = sorted(((-size, name) for name, size in freed.alone.items() if name not in graphs))[:DEL_LINES]
    shared = sorted(((-size, name) for name, size in freed.with_free.items()
                     if name not in graphs and name not in freed.alone))[:DEL_LINES]
    dels = [(-size, f"del {name} frees {fmt_bytes(-size)}") for size, name in alone]
    dels += [(-size, f"del {name}, with %gpumem free (its traceback or output holds it too), frees "
                     f"{fmt_bytes(-size)}") for size, name in shared]
    dels.sort(key=lambda d: -d[0])  # stable: by name for equal sizes
    advice.extend(dels[:DEL_LINES])
    advice.extend(_graph_advice(holdings, device, source))
    advice.extend(_gradients(holdings, device))
    if state.kind == "cuda" and fragmented(state, facts.asked) and "expandable_segments:True" not in (
            os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")):
        advice.append((state.cache, f"torch's cache holds {fmt_bytes(state.cache)} in pieces (largest free "
                                    f"block {fmt_bytes(state.largest_free_block)}): start the kernel with "
                                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so that it grows "
                                    "segments instead of splitting them"))
    others = sum(size for _, _, size in state.others)
    if others:
        listed = ", ".join(f"pid {pid} {name}".strip() for pid, name, _ in state.others[:3])
        advice.append((others, f"other processes hold {fmt_bytes(others)} of {device} ({listed}): stop them, "
                               "or use another GPU"))
    advice.extend(_unknown_processes(state))
    advice.sort(key=lambda a: -(a[0] or 0))
    return advice


def _unknown_processes(state: Any) -> list:
    """In a container without ``--pid=host`` NVML lists the host's PIDs, this process among them under a
    number it cannot recognise: where it lists more than one, what other processes hold is at most the
    device's memory in use beyond torch's reserved memory here (that also holds this process's CUDA
    context). Said with that bound and how to learn more; never "stop them", which may be this kernel."""
    several, many, pids = nvml_unknown(state, several_first=True)
    beyond = state.outside
    if not many or (beyond or 0) <= 0:
        return []
    if several:
        why = (f"NVML lists {many} under the host's PIDs ({pids}) and cannot tell which is this kernel (a "
               "container without --pid=host); nvidia-smi on the host names them")
    else:
        why = (f"NVML lists {many} other process{'es' if many != 1 else ''} here ({pids}) without their "
               "memory (MIG mode gives none to a user without privileges)")
    return [(beyond, f"up to {fmt_bytes(beyond)} of {state.device} is held outside torch here, by this "
                     f"process's CUDA context and other processes: {why}. If another job holds the GPU, use "
                     "another GPU or wait for it")]


def _graph_advice(holdings: Holdings, device: str, source: str) -> list:
    """A loss summed as a tensor keeps every step's graph: ``.item()``; an evaluation cell's graphs:
    ``torch.no_grad()``."""
    advice = []
    graphs = {h.root: h for h in holdings.holders if h.source == "graph"}
    for h in holdings.holders:
        if h.source == "name" and h.scalar and h.root in graphs:
            freed = holdings.freed_by({graphs[h.root].index}).get(device, 0)
            if freed:
                advice.append((freed, f"{h.root} keeps the autograd graph of every step summed into it "
                                      f"({fmt_bytes(freed)} saved for backward): add loss.item() (a float) "
                                      f"instead; now, {h.root} = {h.root}.detach() frees it"))
    saved = sum(h.nbytes(device) for h in holdings.holders if h.source == "graph")
    if saved and "backward" not in source:
        advice.append((saved, f"this cell does no backward(): run it under torch.no_grad() (or "
                              f"torch.inference_mode()) and nothing is saved for backward "
                              f"({fmt_bytes(saved)} is now)"))
    return advice


def _gradients(holdings: Holdings, device: str) -> list:
    """The gradients of your models' and optimizers' parameters (``.grad``, which ``zero_grad()`` sets to
    None between steps, whoever holds the parameters). An optimizer holding them is named before the
    module: its ``zero_grad`` is the one a training loop calls."""
    holders = holdings.holders
    freed: dict = {}  # the name whose zero_grad frees them -> bytes
    for key, (where, size, first, role) in holdings.storages.items():
        if where != device or role != "gradient" or holders[first].kind not in ("module", "optimizer") \
                or holders[first].source != "name":
            continue
        owners = [holders[i] for i in holdings.owners(key)]
        owner = next((h for h in owners if h.kind == "optimizer" and h.source == "name"), owners[0])
        freed[owner.root] = freed.get(owner.root, 0) + size
    return [(size, f"{name}.zero_grad(set_to_none=True) (set_to_none=True is the default since torch 2.0) "
                   f"frees the gradients after each step: {fmt_bytes(size)} now")
            for name, size in freed.items()]


def mps_watermark(facts: Any, state: Any) -> list:
    """MPS's allocator refuses past its high watermark (1.7 x Metal's working-set limit unless
    PYTORCH_MPS_HIGH_WATERMARK_RATIO says otherwise): raising it is advice only with its risk, and none
    where the Mac's memory could not hold the request anyway."""
    if state.kind != "mps" or facts.limit is None:
        return []
    from ..gpus.apple import mac_facts

    mac = mac_facts(torch_has_mps=True)
    memory = mac.memory if mac is not None else None
    needed = (state.allocated or 0) + (facts.asked or 0)
    if memory is not None and needed > memory:
        return [(None, f"the Mac has {fmt_bytes(memory)} of unified memory in all, less than the "
                       f"{fmt_bytes(needed)} allocated and asked: no allocator limit (PYTORCH_MPS_HIGH_"
                       "WATERMARK_RATIO) makes room; ask for less")]
    limit = f"working-set limit ({fmt_bytes(state.total)})" if state.total else "working-set limit"
    return [(None, f"PYTORCH_MPS_HIGH_WATERMARK_RATIO, set before torch is imported (restart the kernel), "
                   f"raises the allocator's limit of {fmt_bytes(facts.limit)} (its ratio to Metal's "
                   f"{limit}; 1.7 by default, 0.0 for none). Only with its risk: past that limit macOS "
                   "pages GPU memory out, everything slows down, and with no limit the whole system can "
                   "hang (torch's own words: 'may cause system failure'). Asking for less is safer")]


def _ask_less(facts: Any, holdings: Holdings, device: str, state: Any, source: str = "") -> list:
    """What makes the failing request smaller, with numbers: a smaller batch (where the failure is a
    model's: inside a module's forward, or with activations saved for a backward), mixed precision for
    the activations, activation checkpointing. A bare ``torch.empty(2**50)`` has no batch to halve: a
    failure is a model's when it failed inside a module's method, or the cell runs a backward, or
    autograd graphs hold activations on the device."""
    advice = []
    if facts.asked is not None and (holdings.module_frames or "backward" in source or any(
            h.source == "graph" and h.nbytes(device) for h in holdings.holders)):
        half = facts.asked // 2
        advice.append((half, f"a smaller batch: the failing allocation asked {fmt_bytes(facts.asked)}; half "
                             f"the batch asks about {fmt_bytes(half)}"))
    activations = [h for h in holdings.holders if h.source in ("traceback", "graph")]
    import torch

    fp32 = sum(h.activations(device, torch.float32) for h in activations)
    if fp32 and state.kind in ("cuda", "xpu", "mps"):
        kind = state.kind
        advice.append((fp32 // 2, f"mixed precision: with torch.autocast('{kind}', dtype=torch.bfloat16) the "
                                  f"{fmt_bytes(fp32)} of float32 activations held now take about "
                                  f"{fmt_bytes(fp32 // 2)}"))
    frames = {h.root for h in holdings.holders if h.source == "traceback"}
    saved = sum(h.nbytes(device) for h in holdings.holders if h.source == "graph" and h.root in frames)
    if saved and holdings.module_frames:
        where = holdings.module_frames[-1]
        advice.append((saved, "activation checkpointing (torch.utils.checkpoint.checkpoint around the blocks "
                              f"{where} runs) keeps only each block's input for backward, not the "
                              f"{fmt_bytes(saved)} saved now"))
    advice.sort(key=lambda a: -(a[0] or 0))
    return advice
