"""What NVML says about a GPU, and why it could not say it, as plain records: :data:`NA` for what a GPU or
driver cannot say, one :class:`GPUSnapshot` per GPU (with its :class:`MigSnapshot` instances),
:class:`ProcessInfo` per process, and :class:`NVMLProblem` for a failure: pynvml's exception class as a
short code with a hint a person can act on (model: nvitop's ``nvmlQuery``). Standard library only;
:mod:`torchgpu_magic.gpus.nvml` fills them and re-exports the names.

A hint holds only what is true wherever the problem occurs. What to do where NVML finds no driver depends
on the machine (no NVIDIA GPU, a GPU without a driver, a container started without it, WSL...), which
NVML cannot see: ``%gpuinfo``'s diagnosis (:mod:`torchgpu_magic.gpus.causes`) says that.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["NA", "GPUSnapshot", "MigSnapshot", "ProcessInfo", "HINTS", "NVMLProblem", "problem_from_error"]


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


@dataclass(frozen=True)
class NVMLProblem:
    """Why NVML could not answer: a short ``code``, NVML's ``message``, and a ``hint`` to act on."""

    code: str
    message: str
    hint: str


# ---- errors and hints ---------------------------------------------------------------------------

HINTS = {
    "library_not_found": (
        "The NVML library (libnvidia-ml.so.1 on Linux, nvml.dll on Windows), which the NVIDIA driver "
        "installs, was not found: what the driver alone knows is N/A."
    ),
    "bindings_missing": "The NVML bindings are not installed: `pip install nvidia-ml-py`.",
    "driver_not_loaded": (
        "The NVIDIA kernel driver is not loaded: check `nvidia-smi` and `lsmod | grep nvidia`; reboot "
        "after installing a driver, or load it with `sudo modprobe nvidia`."
    ),
    "driver_mismatch": (
        "The driver's library and its kernel module have different versions, usually after a driver "
        "upgrade without a reboot: reboot (or reload the nvidia kernel modules)."
    ),
    "no_permission": (
        "NVML refused for lack of permission: inside a container other processes (and their GPU "
        "memory) are hidden; run on the host or in a container started with `--pid=host`, or as root."
    ),
    "no_permission_host": (
        "NVML refused for lack of permission: other users' processes (and their GPU memory) are hidden "
        "from this user; run as root to see them."
    ),
    "no_permission_mig": (
        "This GPU is in MIG mode: NVML lists processes per MIG instance, and only root may ask about the "
        "whole GPU. The MIG instance torch uses is asked instead where it could be matched."
    ),
    "not_supported": (
        "This GPU or driver does not report it (common on consumer GPUs, in MIG mode and under vGPU); "
        "it is shown as N/A."
    ),
    "function_not_found": (
        "The NVIDIA driver is older than this NVML function: update the driver to get this figure."
    ),
    "gpu_lost": (
        "The GPU has fallen off the bus or stopped responding: look for Xid errors in `dmesg`; the GPU "
        "needs a reset (`nvidia-smi -r`) or the machine a reboot."
    ),
    "unknown": "NVML reported an unexpected error: run `nvidia-smi` to see whether the driver works.",
}

# pynvml exception class name -> our code; anything else is 'unknown'.
_CODES = {
    "NVMLError_LibraryNotFound": "library_not_found",
    "NVMLError_DriverNotLoaded": "driver_not_loaded",
    "NVMLError_LibRmVersionMismatch": "driver_mismatch",
    "NVMLError_NoPermission": "no_permission",
    "NVMLError_NotSupported": "not_supported",
    "NVMLError_FunctionNotFound": "function_not_found",
    "NVMLError_GpuIsLost": "gpu_lost",
}


def problem_from_error(exc: BaseException, what: str = "") -> NVMLProblem:
    """Map a pynvml exception (or an unexpected one) to an :class:`NVMLProblem` with its hint.

    The class is matched by name along its MRO so that the real pynvml classes and a stand-in with the
    same hierarchy map alike.
    """
    names = [klass.__name__ for klass in type(exc).__mro__]
    code = next((_CODES[name] for name in names if name in _CODES), "unknown")
    try:
        text = str(exc) or type(exc).__name__
    except Exception:  # noqa: BLE001 - pynvml's __str__ itself calls into the library
        text = type(exc).__name__
    message = f"{what}: {text}" if what else text
    return NVMLProblem(code=code, message=message, hint=HINTS[code])
