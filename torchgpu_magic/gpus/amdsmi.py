"""AMD SMI: the only module that imports ``amdsmi`` (AMD's own Python package for its GPUs under ROCm).

Never required and imported lazily, on first use: where it is missing (it ships with ROCm in
``/opt/rocm/share/amd_smi``, or ``pip install amdsmi`` matching the ROCm release) or cannot reach the
driver, :func:`status` says why in a line and every query answers empty, so %gpuinfo shows torch's view
alone with that note. As :mod:`torchgpu_magic.gpus.nvml` for NVML, the library is initialised once under a
lock and shut down by :func:`reset`; no query raises. ``amdsmi`` is looked up in ``sys.modules`` first, so
tests can put a scripted stand-in there and call :func:`reset`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .library import Library
from .snapshots import NA, ProcessInfo

__all__ = ["AMDGPU", "status", "gpus", "reset", "INSTALL"]

INSTALL = ("AMD SMI's Python package gives the GPUs' own figures: it ships with ROCm (pip install "
           "/opt/rocm/share/amd_smi) or as `pip install amdsmi` matching the ROCm release")
MB = 2**20


@dataclass
class AMDGPU:
    """One AMD GPU as AMD SMI sees it (bytes for memory, percent, °C, watts); NA where it cannot say."""

    index: int
    name: Any = NA
    uuid: Any = NA
    bdf: Any = NA
    device_id: Any = NA
    arch: Any = NA
    compute_units: Any = NA
    memory_total: Any = NA
    memory_used: Any = NA
    utilization: Any = NA
    temperature: Any = NA
    power: Any = NA
    driver: Any = NA
    processes: list = field(default_factory=list)
    problems: list = field(default_factory=list)


def _load() -> tuple:
    try:
        import amdsmi
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from loading libamd_smi.so
        return None, f"cannot import amdsmi ({type(exc).__name__}: {exc})"
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:  # noqa: BLE001 - AmdSmiLibraryException: no driver, no permission
        return None, f"amdsmi_init failed: {_one_line(exc)} (is the amdgpu driver loaded? `amd-smi list`)"
    return amdsmi, None


_LIBRARY = Library(_load, "amdsmi_shut_down")
_amdsmi = _LIBRARY.module  # the initialised amdsmi module, or None where AMD SMI is unavailable
status = _LIBRARY.status  # None when AMD SMI works, else why not (one line)
reset = _LIBRARY.reset  # shut AMD SMI down, so the next call initialises afresh


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def gpus() -> list:
    """Every AMD GPU AMD SMI sees, in its order, with the processes on each; empty when it cannot say."""
    module = _amdsmi()
    if module is None:
        return []
    try:
        handles = module.amdsmi_get_processor_handles()
    except Exception:  # noqa: BLE001
        return []
    return [_gpu(module, index, handle) for index, handle in enumerate(handles)]


def _gpu(module: Any, index: int, handle: Any) -> AMDGPU:
    gpu = AMDGPU(index)

    def ask(what: str, name: str, *args: Any) -> Any:
        try:
            return getattr(module, name)(handle, *args)
        except Exception as exc:  # noqa: BLE001 - one failed query is one N/A and a note
            gpu.problems.append(f"{what}: {_one_line(exc)}")
            return None

    asic = ask("ASIC info", "amdsmi_get_gpu_asic_info") or {}
    gpu.name = asic.get("market_name", NA)
    gpu.device_id = asic.get("device_id", NA)
    gpu.arch = asic.get("target_graphics_version", NA)
    gpu.compute_units = _number(asic.get("num_compute_units"))
    gpu.bdf = ask("PCI bus id", "amdsmi_get_gpu_device_bdf") or NA
    gpu.uuid = ask("UUID", "amdsmi_get_gpu_device_uuid") or NA
    vram = ask("VRAM usage", "amdsmi_get_gpu_vram_usage") or {}
    total, used = _number(vram.get("vram_total")), _number(vram.get("vram_used"))
    gpu.memory_total = NA if total is NA else total * MB  # AMD SMI counts VRAM in MB
    gpu.memory_used = NA if used is NA else used * MB
    gpu.utilization = _number((ask("activity", "amdsmi_get_gpu_activity") or {}).get("gfx_activity"))
    power = ask("power", "amdsmi_get_power_info") or {}
    gpu.power = _number(power.get("current_socket_power", power.get("average_socket_power")))
    kinds = getattr(module, "AmdSmiTemperatureType", None)
    metrics = getattr(module, "AmdSmiTemperatureMetric", None)
    if kinds is not None and metrics is not None:
        gpu.temperature = _number(ask("temperature", "amdsmi_get_temp_metric", kinds.HOTSPOT,
                                      metrics.CURRENT))
    gpu.driver = (ask("driver", "amdsmi_get_gpu_driver_info") or {}).get("driver_version", NA)
    gpu.processes = _processes(ask)
    return gpu


def _processes(ask: Any) -> list:
    """The processes on a GPU: ROCm 6.4's list of dicts, or an older list of handles each asked with
    ``amdsmi_get_gpu_process_info``."""
    listed = ask("process list", "amdsmi_get_gpu_process_list") or []
    found = []
    for entry in listed:
        info = entry if isinstance(entry, dict) else ask("process", "amdsmi_get_gpu_process_info", entry)
        if not info:
            continue
        usage = info.get("memory_usage") or {}
        vram = _number(usage.get("vram_mem", info.get("mem")))
        name = info.get("name", NA)
        found.append(ProcessInfo(int(info["pid"]), NA if name in ("N/A", "") else name, vram, "compute"))
    return found


def _number(value: Any) -> Any:
    """An int, or NA for AMD SMI's 'N/A' and anything that is not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return NA
