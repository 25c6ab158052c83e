"""Why NVML could not answer, and what a person can do about it: :class:`NVMLProblem` and the mapping
from pynvml's exception classes to a short code and a hint (model: nvitop's ``nvmlQuery``). Standard
library only; :mod:`torchgpu_magic.gpus.nvml` uses it and re-exports its names.

A hint holds only what is true wherever the problem occurs. What to do where NVML finds no driver depends
on the machine (no NVIDIA GPU, a GPU without a driver, a container started without it, WSL...), which
NVML cannot see: ``%gpuinfo``'s diagnosis (:mod:`torchgpu_magic.gpus.causes`) says that.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HINTS", "NVMLProblem", "problem_from_error"]


@dataclass(frozen=True)
class NVMLProblem:
    """Why NVML could not answer: a short ``code``, NVML's ``message``, and a ``hint`` to act on."""

    code: str
    message: str
    hint: str

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "hint": self.hint}


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
