"""Per-process memory for ``%gpumem``: the figures (:mod:`.figures`), the thread and per-cell log that
take them (:mod:`.sampler`), the per-cell records they keep (:mod:`.records`) and the ipywidgets view over
them (:mod:`.panel`). The public names of the first three are here; the panel, the package's only importer
of ipywidgets, is imported by name (``from torchgpu_magic.memory import panel``) where a panel is shown.

Who holds memory and what can be given back are imported by name too, where used: :mod:`.holders` (every
storage the names, the output history, a failed cell's frames and their autograd graphs keep alive,
counted once; :mod:`.graphs` walks a graph), :mod:`.devicestate` (a device read live),
:mod:`.holdersreport` (``%gpumem holders``), :mod:`.explain` (the out-of-memory explanation),
:mod:`.free` (``%gpumem free``) and :mod:`.growth` (a cell whose re-runs grow memory).

A cell's memory for ``%%cudamem``: the tracked run (:mod:`.tracking`, torch's MemTracker), the prediction
on fake tensors (:mod:`.prediction`, over :mod:`.fakecopy` and :mod:`.standin`), the target device and
its allowances (:mod:`.targets`), the accounting and the CUDA caching allocator's model
(:mod:`.allocator`), and the reports (:mod:`.cellmem`, whose classes are named here). Those modules import
torch only inside their functions.
"""
from __future__ import annotations

from .cellmem import CellMemory, FitResult, ModuleRow
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
    nvml_targets,
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
    "reset_peak_rss", "nvml_targets", "cuda_state", "torch_figures", "collect", "empty_cache",
    "MIN_INTERVAL", "MAX_INTERVAL", "DEFAULT_INTERVAL", "HISTORY_SECONDS", "THREAD_NAME", "validate_interval",
    "CellGPU", "CellRecord", "CellRecords", "CellLog", "Sampler", "CellMemory", "FitResult", "ModuleRow",
]
