"""A stand-in for the NVML shared library (``libnvidia-ml.so.1``), below the real ``pynvml`` wrapper.

pynvml reaches the driver only through ``nvmlLib``, the ``ctypes.CDLL`` it loads, asking it for each C
symbol by name (``_nvmlGetFunctionPointer``) and calling it with ctypes arguments. :class:`FakeNvmlLib`
is that object for a scripted :class:`fake_pynvml.Machine`: every C function it knows writes its answer
through the ctypes pointers pynvml passes and returns an NVML return code, so what reaches
``torchgpu_magic.gpus.nvml`` is exactly what pynvml makes of a real driver's answer, errors included:

- a symbol the scripted driver lacks (``Machine.missing``: R470 has no ``_v3`` process calls, no
  ``nvmlDeviceGetMemoryInfo_v2``) raises ``AttributeError`` here, which pynvml turns into
  ``NVMLError_FunctionNotFound``, and its unversioned wrappers into ``NVMLLibraryMismatchError``;
- a symbol the driver has but this stand-in does not script answers ``NVML_ERROR_NOT_SUPPORTED``, as a
  GPU without that feature does;
- a call before ``nvmlInit`` or after the last ``nvmlShutdown`` answers ``NVML_ERROR_UNINITIALIZED``.

``calls`` records the C symbols asked about a GPU, ``unscripted`` the ones that answered NOT_SUPPORTED.
"""
from __future__ import annotations

import ctypes
import re
from typing import Any, Callable, Optional

import pynvml as _real

SUCCESS = _real.NVML_SUCCESS
NOT_AVAILABLE = _real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


def family(symbol: str) -> str:
    """The pynvml-level name of a C symbol: ``nvmlDeviceGetMemoryInfo_v2`` -> ``nvmlDeviceGetMemoryInfo``.
    Scenarios script errors per family, so one entry covers every version of a call."""
    return re.sub(r"_v\d+$", "", symbol)


def _out(pointer: Any) -> Any:
    """The ctypes object behind ``byref(obj)`` (pynvml passes outputs that way), or the object itself."""
    return getattr(pointer, "_obj", pointer)


def _value(arg: Any) -> Any:
    return getattr(arg, "value", arg)


class FakeNvmlLib:
    """``nvmlLib`` for one scripted machine (see the module docstring)."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine
        self.initialized = 0
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: list = []
        self.unscripted: list = []
        self._handles: dict = {}  # address of the struct a handle points at -> (gpu, mig or None)
        self._structs: dict = {}  # (id(gpu), id(mig)) -> the struct, kept alive

    # ---- symbol lookup: what ctypes' CDLL.__getattr__ does ------------------------------------------
    def __getattr__(self, symbol: str) -> Callable:
        if not symbol.startswith("nvml") or symbol in self.machine.missing:
            raise AttributeError(f"undefined symbol: {symbol}")
        method = _SCRIPTED.get(symbol)
        if method is not None:
            return _CFunction(lambda *args: method(self, symbol, *args))
        return _CFunction(lambda *args: self._unsupported(symbol))

    def _unsupported(self, symbol: str) -> int:
        if not self.initialized:
            return _real.NVML_ERROR_UNINITIALIZED
        self.unscripted.append(symbol)
        return _real.NVML_ERROR_NOT_SUPPORTED

    # ---- handles ------------------------------------------------------------------------------------
    def _give(self, pointer: Any, gpu: Any, mig: Any = None) -> int:
        """Point the ``c_nvmlDevice_t`` behind ``pointer`` at a struct standing for (gpu, mig)."""
        key = (id(gpu), id(mig))
        if key not in self._structs:
            struct = _real.struct_c_nvmlDevice_t()
            self._structs[key] = struct
            self._handles[ctypes.addressof(struct)] = (gpu, mig)
        _out(pointer).contents = self._structs[key]
        return SUCCESS

    def _device(self, symbol: str, handle: Any) -> tuple:
        """(gpu, mig, error code or None) for a call about ``handle``, with the scripted errors applied."""
        if not self.initialized:
            return None, None, _real.NVML_ERROR_UNINITIALIZED
        self.calls.append(symbol)
        try:
            gpu, mig = self._handles[ctypes.addressof(handle.contents)]
        except (KeyError, ValueError, AttributeError):
            return None, None, _real.NVML_ERROR_INVALID_ARGUMENT
        name = family(symbol)
        error = gpu.errors.get(symbol, gpu.errors.get(name))
        if error is not None:
            return gpu, mig, error
        if gpu.only is not None and name not in gpu.only:
            self.unscripted.append(symbol)
            return gpu, mig, _real.NVML_ERROR_NOT_SUPPORTED
        return gpu, mig, None


class _CFunction:
    """A C function as ctypes hands it out: callable, with ``restype`` / ``argtypes`` pynvml may set."""

    def __init__(self, call: Callable) -> None:
        self._call = call
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)


# ---- the C functions ------------------------------------------------------------------------------
def _init(lib: FakeNvmlLib, symbol: str, flags: Any) -> int:
    lib.init_calls += 1
    if lib.machine.init_error is not None:
        return lib.machine.init_error
    lib.initialized += 1
    return SUCCESS


def _shutdown(lib: FakeNvmlLib, symbol: str) -> int:
    if not lib.initialized:
        return _real.NVML_ERROR_UNINITIALIZED
    lib.shutdown_calls += 1
    lib.initialized -= 1
    return SUCCESS


def _error_string(lib: FakeNvmlLib, symbol: str, code: Any) -> bytes:
    return f"NVML error {_value(code)}".encode()


def _system(getter: Callable) -> Callable:
    """A system-level query writing ``getter(machine)`` to its output."""
    def call(lib: FakeNvmlLib, symbol: str, *args: Any) -> int:
        if not lib.initialized:
            return _real.NVML_ERROR_UNINITIALIZED
        value = getter(lib.machine)
        if isinstance(value, str):
            args[0].value = value.encode()
        else:
            _out(args[0]).value = value
        return SUCCESS
    return call


def _handle_by_index(lib: FakeNvmlLib, symbol: str, index: Any, out: Any) -> int:
    if not lib.initialized:
        return _real.NVML_ERROR_UNINITIALIZED
    index = _value(index)
    if not 0 <= index < len(lib.machine.gpus):
        return _real.NVML_ERROR_INVALID_ARGUMENT
    return lib._give(out, lib.machine.gpus[index])


def _handle_by_uuid(lib: FakeNvmlLib, symbol: str, uuid: Any, out: Any) -> int:
    """A GPU's or a MIG instance's handle (drivers >= 470 take MIG UUIDs here)."""
    if not lib.initialized:
        return _real.NVML_ERROR_UNINITIALIZED
    lib.calls.append(symbol)
    wanted = _value(uuid).decode()
    for gpu in lib.machine.gpus:
        if gpu.uuid == wanted:
            return lib._give(out, gpu)
        for mig in gpu.migs:
            if mig.uuid == wanted:
                return lib._give(out, gpu, mig)
    return _real.NVML_ERROR_NOT_FOUND


def _per_device(answer: Callable) -> Callable:
    """A per-GPU query: ``answer(gpu, mig, *outputs)`` fills the outputs, or returns an error code."""
    def call(lib: FakeNvmlLib, symbol: str, handle: Any, *args: Any) -> int:
        gpu, mig, error = lib._device(symbol, handle)
        if error is not None:
            return error
        return answer(gpu, mig, *args) or SUCCESS
    return call


def _text(getter: Callable) -> Callable:
    def answer(gpu: Any, mig: Any, buffer: Any, size: Any) -> None:
        buffer.value = getter(gpu, mig).encode()
    return _per_device(answer)


def _number(getter: Callable) -> Callable:
    def answer(gpu: Any, mig: Any, *args: Any) -> Optional[int]:
        value = getter(gpu, mig, *(_value(a) for a in args[:-1]))
        if value is None:
            return _real.NVML_ERROR_NOT_SUPPORTED
        _out(args[-1]).value = value() if callable(value) else value
        return None
    return _per_device(answer)


def _pci(gpu: Any, mig: Any, out: Any) -> None:
    info = _out(out)
    info.busId = gpu.bus_id.encode()
    info.busIdLegacy = gpu.bus_id[4:].encode()
    domain, bus, device = gpu.bus_id.split(".")[0].split(":")
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device, 16)


def _capability(gpu: Any, mig: Any, major: Any, minor: Any) -> None:
    _out(major).value, _out(minor).value = gpu.capability


def _memory(version: int) -> Callable:
    """v1 counts the memory the driver reserves as used; v2 keeps it apart, as nvidia-smi shows it."""
    def answer(gpu: Any, mig: Any, out: Any) -> None:
        info = _out(out)
        if mig is not None:
            total, used, reserved = mig.memory_total, mig.memory_used, 0
        else:
            total, used, reserved = gpu.memory_total, gpu.memory_used, gpu.memory_reserved
        if version == 1:
            used, reserved = used + reserved, 0
        else:
            info.reserved = reserved
        info.total, info.used, info.free = total, used, total - used - reserved
    return answer


def _utilization(gpu: Any, mig: Any, out: Any) -> Optional[int]:
    if gpu.mig_mode[0]:
        return _real.NVML_ERROR_NOT_SUPPORTED  # as on a real A100 in MIG mode
    _out(out).gpu, _out(out).memory = gpu.utilization
    return None


def _clock(which: str) -> Callable:
    def getter(gpu: Any, mig: Any, kind: int) -> Any:
        table = gpu.clocks if which == "current" else gpu.max_clocks
        return table["sm" if kind == _real.NVML_CLOCK_SM else "mem"]
    return getter


def _mig_mode(gpu: Any, mig: Any, current: Any, pending: Any) -> None:
    _out(current).value, _out(pending).value = gpu.mig_mode


def _mig_handle(lib: FakeNvmlLib, symbol: str, handle: Any, index: Any, out: Any) -> int:
    gpu, mig, error = lib._device(symbol, handle)
    if error is not None:
        return error
    index = _value(index)
    if index >= len(gpu.migs):
        return _real.NVML_ERROR_NOT_FOUND
    return lib._give(out, gpu, gpu.migs[index])


def _processes(kind: str) -> Callable:
    """A process list as the C API gives it: a first call with no array asks for the count (SUCCESS when
    there is none, INSUFFICIENT_SIZE otherwise), the second fills the array. On a MIG handle, that
    instance's processes; on a whole GPU in MIG mode ``parent_errors`` apply (NO_PERMISSION for users)."""
    def call(lib: FakeNvmlLib, symbol: str, handle: Any, count: Any, array: Any) -> int:
        gpu, mig, error = lib._device(symbol, handle)
        if error is not None:
            return error
        listed = list(getattr(gpu, kind))
        if mig is not None:
            listed = [p for p in listed if p.gpuInstanceId == mig.gpu_instance_id]
        else:
            error = gpu.parent_errors.get(symbol, gpu.parent_errors.get(family(symbol)))
            if error is not None:
                return error
        size = _out(count)
        if array is None or size.value < len(listed):
            size.value = len(listed)
            return _real.NVML_ERROR_INSUFFICIENT_SIZE if listed else SUCCESS
        for slot, proc in zip(array, listed):
            slot.pid = proc.pid
            slot.usedGpuMemory = NOT_AVAILABLE if proc.usedGpuMemory is None else proc.usedGpuMemory
            slot.gpuInstanceId, slot.computeInstanceId = proc.gpuInstanceId, proc.computeInstanceId
        size.value = len(listed)
        return SUCCESS
    return call


_SCRIPTED: dict = {
    "nvmlInitWithFlags": _init,
    "nvmlInit_v2": lambda lib, symbol: _init(lib, symbol, 0),
    "nvmlShutdown": _shutdown,
    "nvmlErrorString": _error_string,
    "nvmlSystemGetDriverVersion": _system(lambda m: m.driver),
    "nvmlSystemGetCudaDriverVersion": _system(lambda m: m.cuda),
    "nvmlSystemGetCudaDriverVersion_v2": _system(lambda m: m.cuda),
    "nvmlDeviceGetCount_v2": _system(lambda m: len(m.gpus)),
    "nvmlDeviceGetHandleByIndex_v2": _handle_by_index,
    "nvmlDeviceGetHandleByUUID": _handle_by_uuid,
    "nvmlDeviceGetName": _text(lambda gpu, mig: mig.name if mig else gpu.name),
    "nvmlDeviceGetUUID": _text(lambda gpu, mig: mig.uuid if mig else gpu.uuid),
    "nvmlDeviceGetPciInfo_v3": _per_device(_pci),
    "nvmlDeviceGetCudaComputeCapability": _per_device(_capability),
    "nvmlDeviceGetMemoryInfo": _per_device(_memory(1)),
    "nvmlDeviceGetMemoryInfo_v2": _per_device(_memory(2)),
    "nvmlDeviceGetUtilizationRates": _per_device(_utilization),
    "nvmlDeviceGetTemperature": _number(lambda gpu, mig, sensor: gpu.temperature),
    "nvmlDeviceGetPowerUsage": _number(lambda gpu, mig: gpu.power_mw),
    "nvmlDeviceGetEnforcedPowerLimit": _number(lambda gpu, mig: gpu.power_limit_mw),
    "nvmlDeviceGetClockInfo": _number(_clock("current")),
    "nvmlDeviceGetMaxClockInfo": _number(_clock("max")),
    "nvmlDeviceGetCurrentClocksEventReasons": _number(lambda gpu, mig: gpu.clock_reasons),
    "nvmlDeviceGetCurrentClocksThrottleReasons": _number(lambda gpu, mig: gpu.clock_reasons),
    "nvmlDeviceGetCurrPcieLinkGeneration": _number(lambda gpu, mig: gpu.pcie[0]),
    "nvmlDeviceGetCurrPcieLinkWidth": _number(lambda gpu, mig: gpu.pcie[1]),
    "nvmlDeviceGetMaxPcieLinkGeneration": _number(lambda gpu, mig: gpu.pcie[2]),
    "nvmlDeviceGetMaxPcieLinkWidth": _number(lambda gpu, mig: gpu.pcie[3]),
    "nvmlDeviceGetPersistenceMode": _number(lambda gpu, mig: gpu.persistence),
    "nvmlDeviceGetMigMode": _per_device(_mig_mode),
    "nvmlDeviceGetMaxMigDeviceCount": _number(lambda gpu, mig: 7 if gpu.mig_mode[0] else 0),
    "nvmlDeviceGetMigDeviceHandleByIndex": _mig_handle,
    "nvmlDeviceGetGpuInstanceId": _number(lambda gpu, mig: mig.gpu_instance_id if mig else 0xFFFFFFFF),
    "nvmlDeviceGetComputeInstanceId": _number(
        lambda gpu, mig: mig.compute_instance_id if mig else 0xFFFFFFFF),
    "nvmlDeviceGetComputeRunningProcesses_v3": _processes("compute"),
    "nvmlDeviceGetComputeRunningProcesses_v2": _processes("compute"),
    "nvmlDeviceGetGraphicsRunningProcesses_v3": _processes("graphics"),
    "nvmlDeviceGetGraphicsRunningProcesses_v2": _processes("graphics"),
}

DEVICE_FAMILIES = sorted({family(s) for s in _SCRIPTED if s.startswith("nvmlDeviceGet")}
                         - {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetCount"})
"""The per-GPU query families this stand-in scripts (a lost GPU fails every one of them)."""
