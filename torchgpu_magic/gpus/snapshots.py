"""What NVML says about a GPU, as plain records: :data:`NA` for what a GPU or driver cannot say, one
:class:`GPUSnapshot` per GPU (with its :class:`MigSnapshot` instances) and :class:`ProcessInfo` per
process. Standard library only; :mod:`torchgpu_magic.gpus.nvml` fills them and re-exports the names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["NA", "GPUSnapshot", "MigSnapshot", "ProcessInfo"]


class _NAType:
    """'Not available': what a GPU or driver cannot say. Falsy, prints as ``N/A``, one instance."""

    _instance: Optional[_NAType] = None
    _is_na = True

    def __new__(cls) -> _NAType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return "N/A"

    def __repr__(self) -> str:
        return "NA"

    def __reduce__(self) -> str:
        return "NA"


NA = _NAType()


@dataclass
class MigSnapshot:
    """One MIG instance of a GPU in MIG mode."""

    index: int
    uuid: Any = NA
    name: Any = NA
    memory_total: Any = NA
    memory_used: Any = NA
    gpu_instance_id: Any = NA
    compute_instance_id: Any = NA


@dataclass
class GPUSnapshot:
    """Everything NVML says about one physical GPU at one moment; each field a value or :data:`NA`.

    Units: bytes for memory, percent for utilisation, °C, watts, MHz.
    """

    index: int
    name: Any = NA
    uuid: Any = NA
    pci_bus_id: Any = NA
    compute_capability: Any = NA
    memory_total: Any = NA
    memory_used: Any = NA
    memory_free: Any = NA
    utilization_gpu: Any = NA
    utilization_memory: Any = NA
    temperature: Any = NA
    power_draw: Any = NA
    power_limit: Any = NA
    clock_sm: Any = NA
    clock_memory: Any = NA
    clock_sm_max: Any = NA
    clock_memory_max: Any = NA
    pcie_generation: Any = NA
    pcie_width: Any = NA
    pcie_generation_max: Any = NA
    pcie_width_max: Any = NA
    persistence_mode: Any = NA
    mig_mode: Any = NA
    mig_mode_pending: Any = NA
    mig_devices: list = field(default_factory=list)
    not_supported: list = field(default_factory=list)
    problems: list = field(default_factory=list)


@dataclass
class ProcessInfo:
    """A process using a GPU, as NVML lists it (PIDs are the host's when run inside a container)."""

    pid: int
    name: Any = NA
    used_memory: Any = NA
    kind: str = "compute"
