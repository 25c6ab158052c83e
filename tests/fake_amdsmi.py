"""A scripted ``amdsmi`` (AMD SMI's Python package) for tests at its boundary: the functions
torchgpu_magic.gpus.amdsmi calls, answering as the real package answers on the scripted machine and
raising what it raises.

The shapes follow ROCm/amdsmi's ``py-interface/amdsmi_interface.py``: every per-GPU call checks that its
argument is a processor handle (``AmdSmiParameterException`` otherwise) and turns a failed C call into
``AmdSmiLibraryException(err_code)``, whose ``str`` is "An error occured with code: N(AMDSMI_STATUS_... -
...)" (``amdsmi_exception.py``); a call before ``amdsmi_init`` fails with AMDSMI_STATUS_NOT_INIT. ASIC
info spells ids in hex (``'0x1002'``, ``'0x74a1'``) and the graphics target as ``'gfx942'``; VRAM usage is
in MB; the process list (ROCm 6.4's form) is one dict per process with ``memory_usage.vram_mem`` in bytes.
Status codes are amdsmi.h's.

The ``mi300x`` machine is one AMD Instinct MI300X OAM: device id 0x74a1 (``rocm-smi -i`` in
ROCm/legacy-rocm-build#4750), gfx942, 304 compute units, and a VRAM pool of 200998912 KB (``rocminfo``,
ROCm/rocprof-compute-viewer#29), i.e. 196288 MB.
"""
from __future__ import annotations

import ctypes
import os
import types
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Optional

MB = 2**20
STATUS = {  # amdsmi.h's amdsmi_status_t values used here
    "AMDSMI_STATUS_INVAL": 1, "AMDSMI_STATUS_NOT_SUPPORTED": 2, "AMDSMI_STATUS_NO_PERM": 10,
    "AMDSMI_STATUS_INIT_ERROR": 18, "AMDSMI_STATUS_NOT_FOUND": 31, "AMDSMI_STATUS_NOT_INIT": 32,
    "AMDSMI_STATUS_DRIVER_NOT_LOADED": 34,
}
INFO = {
    1: "AMDSMI_STATUS_INVAL - Invalid parameters",
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    18: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    31: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    32: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
}


@dataclass
class FakeAMDGPU:
    market_name: str = "AMD Instinct MI300X OAM"
    device_id: int = 0x74A1
    gfx: str = "gfx942"
    compute_units: int = 304
    bdf: str = "0000:0c:00.0"
    uuid: str = "6aff74a1-0000-1000-80b4-3a2f9d0c1e55"
    vram_total_mb: int = 196288
    vram_used_mb: int = 283  # the driver's own, with no process running
    gfx_activity: int = 0
    processes: list = field(default_factory=list)  # (pid, name, vram bytes)


@dataclass
class Machine:
    gpus: list
    init_error: Optional[int] = None  # an amdsmi_status_t amdsmi_init fails with
    driver: str = "6.10.5"
    process_lookup: Callable[[], list] = list  # the processes the live machine adds (this process's)


def scenario(name: str) -> Machine:
    if name == "mi300x":
        return Machine([FakeAMDGPU()])
    if name == "no_driver":
        return Machine([], init_error=STATUS["AMDSMI_STATUS_DRIVER_NOT_LOADED"])
    raise KeyError(f"no fake AMD SMI scenario {name!r}; known: mi300x, no_driver")


def make(name: str, edit: Optional[Callable[[Machine], None]] = None) -> types.ModuleType:
    """A module standing in for ``amdsmi`` on scenario ``name``; ``edit`` may adjust the machine first."""
    machine = scenario(name)
    if edit is not None:
        edit(machine)
    return load(machine)


def load(machine: Machine) -> types.ModuleType:
    module = types.ModuleType("amdsmi")
    module.machine = machine
    state = {"init": False}

    class AmdSmiException(Exception):
        """Base smi exception class"""

    class AmdSmiLibraryException(AmdSmiException):
        def __init__(self, err_code: int) -> None:
            err_code = abs(err_code)
            super().__init__(err_code)
            self.err_code = err_code
            self.err_info = INFO.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

        def __str__(self) -> str:
            return f"An error occured with code: {self.err_code}({self.err_info})"

        def get_error_code(self) -> int:
            return self.err_code

    class AmdSmiParameterException(AmdSmiException):
        def __init__(self, received: Any, expected: Any) -> None:
            super().__init__(None)
            self.err_msg = (f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}")

        def __str__(self) -> str:
            return self.err_msg

    class amdsmi_processor_handle(ctypes.c_void_p):  # noqa: N801 - the wrapper's name
        pass

    class AmdSmiInitFlags(IntEnum):
        INIT_ALL_PROCESSORS = 0xFFFFFFFF
        INIT_AMD_CPUS = 1
        INIT_AMD_GPUS = 2

    class AmdSmiTemperatureType(IntEnum):
        EDGE = 0
        HOTSPOT = 1
        JUNCTION = 1
        VRAM = 2

    class AmdSmiTemperatureMetric(IntEnum):
        CURRENT = 0

    handles = [amdsmi_processor_handle(0x5000 + i) for i in range(len(machine.gpus))]

    def gpu(handle: Any) -> FakeAMDGPU:
        if not isinstance(handle, amdsmi_processor_handle):
            raise AmdSmiParameterException(handle, amdsmi_processor_handle)
        if not state["init"]:
            raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_INIT"])
        for known, found in zip(handles, machine.gpus):
            if known.value == handle.value:
                return found
        raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_FOUND"])

    def amdsmi_init(flag: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if machine.init_error is not None:
            raise AmdSmiLibraryException(machine.init_error)
        state["init"] = True

    def amdsmi_shut_down() -> None:
        if not state["init"]:
            raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_INIT"])
        state["init"] = False

    def amdsmi_get_processor_handles() -> list:
        if not state["init"]:
            raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_INIT"])
        return list(handles)

    def amdsmi_get_gpu_asic_info(handle: Any) -> dict:
        g = gpu(handle)
        return {"market_name": g.market_name, "vendor_id": "0x1002",
                "vendor_name": "Advanced Micro Devices Inc.", "subvendor_id": "0x1002",
                "device_id": hex(g.device_id), "rev_id": "0x00",
                "asic_serial": "0x6AFF74A1B43A2F9D", "oam_id": 0, "num_compute_units": g.compute_units,
                "target_graphics_version": g.gfx}

    def amdsmi_get_gpu_device_bdf(handle: Any) -> str:
        return gpu(handle).bdf

    def amdsmi_get_gpu_device_uuid(handle: Any) -> str:
        return gpu(handle).uuid

    def amdsmi_get_gpu_vram_usage(handle: Any) -> dict:
        g = gpu(handle)
        used = g.vram_used_mb + sum(size for _, _, size in _processes(g)) // MB
        return {"vram_total": g.vram_total_mb, "vram_used": used}

    def amdsmi_get_gpu_activity(handle: Any) -> dict:
        return {"gfx_activity": gpu(handle).gfx_activity, "umc_activity": 0, "mm_activity": "N/A"}

    def _processes(g: FakeAMDGPU) -> list:
        return list(g.processes) + (list(machine.process_lookup()) if g is machine.gpus[0] else [])

    def amdsmi_get_gpu_process_list(handle: Any) -> list:
        g = gpu(handle)
        return [{"name": name or "N/A", "pid": pid, "mem": size,
                 "engine_usage": {"gfx": 0, "enc": 0},
                 "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": size}, "cu_occupancy": "N/A"}
                for pid, name, size in _processes(g)]

    def amdsmi_get_gpu_driver_info(handle: Any) -> dict:
        gpu(handle)
        return {"driver_name": "amdgpu", "driver_version": machine.driver, "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_temp_metric(handle: Any, sensor: Any, metric: Any) -> int:
        gpu(handle)
        return 38

    def amdsmi_get_power_info(handle: Any, sensor_ind: int = 0) -> dict:
        gpu(handle)
        return {"current_socket_power": 132, "average_socket_power": 131, "gfx_voltage": "N/A",
                "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": 750}

    for name, value in list(locals().items()):
        if name.startswith(("amdsmi_", "AmdSmi")):
            setattr(module, name, value)
    module.amdsmi_wrapper = types.SimpleNamespace(amdsmi_processor_handle=amdsmi_processor_handle)
    return module


def this_process(size: int) -> Callable[[], list]:
    """A ``process_lookup`` that lists this process holding ``size`` bytes of VRAM."""
    return lambda: [(os.getpid(), "python3", size)] if size else []
