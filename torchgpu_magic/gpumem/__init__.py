"""``%gpumem``'s core: this process's memory seen by the driver (NVML, AMD SMI, MPS's driver-allocated
memory) and torch's allocator, sampled and kept per cell.

- :mod:`.figures`: one sample of host memory and every watched GPU (NVML's view and torch's allocator,
  side by side, with the gaps between them), and the GPUs to watch;
- :mod:`.records`: the per-cell records (time, RSS and its peak, each GPU's peak) and their table;
- :mod:`.sampler`: the thread that samples on a drift-free schedule, and the per-cell log that takes a
  record around every cell;
- :mod:`.growth`: a cell whose re-runs grow memory, flagged with the names that grew;
- :mod:`.panel`: the ipywidgets view over a sampler (the package's only importer of ipywidgets, imported
  by name where a panel is shown: ``from torchgpu_magic.gpumem import panel``).

The names callers use are re-exported here from the first three; :mod:`.growth` and :mod:`.panel` are
imported by name where they are used. Nothing here initialises CUDA (see :mod:`torchgpu_magic.accelerators`)
or imports torch, IPython or ``%%cudamem``'s code.
"""
from __future__ import annotations

from .figures import (
    GPUMemory,
    GPUTarget,
    MemorySnapshot,
    accelerator_targets,
    collect,
    nvml_targets,
    targets_from,
)
from .records import CellGPU, CellRecord, CellRecords
from .sampler import (
    DEFAULT_INTERVAL,
    HISTORY_SECONDS,
    MAX_INTERVAL,
    MIN_INTERVAL,
    THREAD_NAME,
    CellLog,
    Sampler,
    validate_interval,
)

__all__ = [
    "DEFAULT_INTERVAL", "HISTORY_SECONDS", "MAX_INTERVAL", "MIN_INTERVAL", "THREAD_NAME", "CellGPU",
    "CellLog", "CellRecord", "CellRecords", "GPUMemory", "GPUTarget", "MemorySnapshot", "Sampler",
    "accelerator_targets", "collect", "nvml_targets", "targets_from", "validate_interval",
]
