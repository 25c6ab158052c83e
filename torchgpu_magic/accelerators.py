"""The device layer: what torch's accelerator can say, asked without side effects.

Every room asks here, not ``torch.cuda`` directly, whether CUDA is initialised in this process, for the
caching allocator's figures and to give its cache back, so that no sampler, report or explanation creates
a CUDA context just to look: torch is only asked when it is already imported, and the allocator only
when CUDA is already initialised. torch is never imported here.
"""
from __future__ import annotations

import sys
from typing import Any

from .caches import table

_CPU_ONLY = table()  # {torch module: True} for a torch seen to be built without CUDA or ROCm


def cuda_state() -> str:
    """How much torch can tell without side effects: "not imported", "no CUDA", "not initialised" or
    "initialised". Asked around every cell, so cheap: ``is_initialized`` first, and a CPU-only build's
    answer remembered (``is_available`` there costs tens of microseconds, a failed attribute lookup in
    ``torch._C``)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "not imported"
    if torch in _CPU_ONLY:
        return "no CUDA"
    try:
        if torch.cuda.is_initialized():
            return "initialised"
        if torch.cuda.is_available():
            return "not initialised"
        version = torch.version
        if getattr(version, "cuda", None) is None and getattr(version, "hip", None) is None:
            _CPU_ONLY[torch] = True
        return "no CUDA"
    except Exception:  # noqa: BLE001 - a half-imported or broken torch: say so, never raise
        return "no CUDA"


def initialised_cuda() -> Any:
    """``torch.cuda`` when torch is imported and CUDA initialised in this process, else None: the one
    way into torch's allocator here and in the sampler, so that neither initialises CUDA."""
    if cuda_state() != "initialised":
        return None
    return sys.modules["torch"].cuda


def torch_figures(torch_index: int) -> tuple:
    """(allocated, reserved, max_allocated) of torch's allocator on ``cuda:torch_index``; zeros when
    CUDA is not initialised (torch then holds nothing), Nones when torch cannot answer."""
    cuda = initialised_cuda()
    if cuda is None:
        return 0, 0, 0
    try:
        return (int(cuda.memory_allocated(torch_index)), int(cuda.memory_reserved(torch_index)),
                int(cuda.max_memory_allocated(torch_index)))
    except Exception:  # noqa: BLE001 - e.g. the GPU fell off the bus: the panel shows N/A
        return None, None, None



def empty_cache() -> bool:
    """Give torch's cached GPU memory back to the driver; False (and nothing done) when CUDA is not
    initialised in this process."""
    cuda = initialised_cuda()
    if cuda is None:
        return False
    cuda.empty_cache()
    return True
