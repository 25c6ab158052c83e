"""Per-process memory for ``%gpumem``: the figures (:mod:`.figures`), the thread and per-cell log that
take them (:mod:`.sampler`), the per-cell records they keep (:mod:`.records`) and the ipywidgets view over
them (:mod:`.panel`). The public names of the first three are here; the panel, the package's only importer
of ipywidgets, is imported by name (``from torchgpu_magic.memory import panel``) where a panel is shown.

Who holds memory and what can be given back are imported by name too, where used: :mod:`.holders` (every
storage the names, the output history, a failed cell's frames and their autograd graphs keep alive,
counted once; :mod:`.graphs` walks a graph), :mod:`.devicestate` (a device read live),
:mod:`.holdersreport` (``%gpumem holders``), :mod:`.explain` (the out-of-memory explanation),
:mod:`.free` (``%gpumem free``) and :mod:`.growth` (a cell whose re-runs grow memory).
"""
from __future__ import annotations

from .figures import (
    GPUMemory,
    GPUTarget,
    HostCounters,
    HostMemory,
    MemorySnapshot,
    collect,
    cuda_state,
    empty_cache,
    host_memory,
    peak_rss,
    reset_peak_rss,
    targets_from,
    torch_figures,
)
from .sampler import (
    DEFAULT_INTERVAL,
    HISTORY_SECONDS,
    MAX_INTERVAL,
    MIN_INTERVAL,
    THREAD_NAME,
    CellGPU,
    CellLog,
    CellRecord,
    CellRecords,
    Sampler,
    validate_interval,
)

__all__ = [
    "GPUTarget", "HostCounters", "HostMemory", "GPUMemory", "MemorySnapshot", "targets_from", "host_memory",
    "peak_rss",
    "reset_peak_rss", "cuda_state", "torch_figures", "collect", "empty_cache",
    "MIN_INTERVAL", "MAX_INTERVAL", "DEFAULT_INTERVAL", "HISTORY_SECONDS", "THREAD_NAME", "validate_interval",
    "CellGPU", "CellRecord", "CellRecords", "CellLog", "Sampler",
]
