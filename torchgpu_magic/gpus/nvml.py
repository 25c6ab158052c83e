"""The NVML layer: the only module that imports ``pynvml`` (from the ``nvidia-ml-py`` distribution).

NVML never crashes a report. The library is initialised lazily, once, under a lock (and shut down at
exit); every query returns a value or :data:`NA`, and every failure becomes an :class:`NVMLProblem`
whose ``hint`` says what a person can do about it (model: nvitop's ``nvmlQuery`` and ``NaType``).
``pynvml`` is looked up in ``sys.modules`` at initialisation, so tests can put a scripted stand-in
there and call :func:`reset`.
"""
from __future__ import annotations

import atexit
import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .library import Library
from .snapshots import HINTS, NA, GPUSnapshot, MigSnapshot, NVMLProblem, ProcessInfo, problem_from_error

__all__ = [
    "NA",
    "NVMLProblem",
    "problem_from_error",
    "GPUSnapshot",
    "MigSnapshot",
    "ProcessInfo",
    "status",
    "device_count",
    "driver_version",
    "cuda_driver_version",
    "gpu_snapshot",
    "memory",
    "utilization",
    "processes",
    "clock_reader",
    "reset",
]


# ---- initialisation -----------------------------------------------------------------------------

def _load() -> tuple:
    try:
        import pynvml
    except ImportError as exc:
        problem = NVMLProblem("bindings_missing", f"cannot import pynvml: {exc}", HINTS["bindings_missing"])
        return None, problem
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses, or OSError from ctypes
        return None, problem_from_error(exc, "nvmlInit")
    return pynvml, None


_LIBRARY = Library(_load, "nvmlShutdown")
_nvml = _LIBRARY.module  # the initialised pynvml module, or None when NVML is unavailable (see status)
status = _LIBRARY.status  # None when NVML works, else the NVMLProblem saying why not
reset = _LIBRARY.reset  # shut NVML down, so the next call initialises afresh
atexit.register(reset)


# ---- queries ------------------------------------------------------------------------------------


@dataclass
class _Querier:
    """Runs queries against one GPU, collecting problems; stops asking once the GPU is lost."""

    module: Any
    problems: list
    not_supported: list
    lost: bool = False

    def __call__(self, what: str, fn_name: Any, *args: Any, convert: Optional[Callable] = None) -> Any:
        """``fn_name`` names a pynvml function, or is a callable taking (module, *args)."""
        if self.lost:
            return NA
        fn = (functools.partial(fn_name, self.module) if callable(fn_name)
              else getattr(self.module, fn_name, None))
        if fn is None:
            self._note(what, NVMLProblem("function_not_found", f"{what}: pynvml has no {fn_name}",
                                         HINTS["function_not_found"]))
            return NA
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001 - every failure becomes NA plus a problem
            self._note(what, problem_from_error(exc, what))
            return NA
        if value is None:
            return NA
        value = _decode(value)
        if convert is not None:
            try:
                return convert(value)
            except (TypeError, ValueError, AttributeError):
                return NA
        return value

    def _note(self, what: str, problem: NVMLProblem) -> None:
        if problem.code in ("not_supported", "function_not_found"):
            if what not in self.not_supported:
                self.not_supported.append(what)
            return
        if problem.code == "gpu_lost":
            self.lost = True
        if problem not in self.problems:
            self.problems.append(problem)


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _query(what: str, fn_name: Any, *args: Any) -> Any:
    """One system-level query: its value, or NA."""
    module = _nvml()
    return NA if module is None else _Querier(module, [], [])(what, fn_name, *args)


def device_count() -> int:
    """How many GPUs NVML sees (all of them, whatever CUDA_VISIBLE_DEVICES says); 0 without NVML."""
    value = _query("device count", "nvmlDeviceGetCount")
    return int(value) if isinstance(value, int) else 0


def driver_version() -> Any:
    """The NVIDIA driver version, e.g. '580.159.04', or NA."""
    return _query("driver version", "nvmlSystemGetDriverVersion")


def cuda_driver_version() -> Any:
    """The newest CUDA version the driver supports, e.g. '13.0' (from NVML's 13000), or NA."""
    value = _query("CUDA driver version", "nvmlSystemGetCudaDriverVersion")
    return f"{value // 1000}.{value % 1000 // 10}" if isinstance(value, int) else NA


def _handle(module: Any, nvml_index: int, problems: list, mig_uuid: Any = None) -> Any:
    """The handle of GPU ``nvml_index``, or of its MIG instance ``mig_uuid`` (the slice torch uses) when
    given: the one to ask about memory and processes; None (and a problem) when NVML cannot give it."""
    try:
        if mig_uuid:
            return module.nvmlDeviceGetHandleByUUID(mig_uuid)
        return module.nvmlDeviceGetHandleByIndex(nvml_index)
    except Exception as exc:  # noqa: BLE001
        what = f"MIG instance {mig_uuid}" if mig_uuid else f"GPU {nvml_index}"
        problems.append(problem_from_error(exc, what))
        return None


def _watts(milliwatts: Any) -> float:
    return round(int(milliwatts) / 1000.0, 1)


def gpu_snapshot(nvml_index: int, identity_only: bool = False) -> GPUSnapshot:
    """All NVML says about GPU ``nvml_index`` now; never raises, NA for what it cannot say.

    ``identity_only`` asks only what identifies the GPU (name, UUID, PCI bus id, compute capability, MIG
    mode and instances): the few calls that matching torch's devices to NVML's, or naming them, needs.
    """
    snap = GPUSnapshot(index=nvml_index)
    module = _nvml()
    if module is None:
        snap.problems.append(status())
        return snap
    handle = _handle(module, nvml_index, snap.problems)
    if handle is None:
        return snap
    q = _Querier(module, snap.problems, snap.not_supported)
    snap.name = q("name", "nvmlDeviceGetName", handle)
    snap.uuid = q("UUID", "nvmlDeviceGetUUID", handle)
    snap.pci_bus_id = q("PCI bus id", "nvmlDeviceGetPciInfo", handle, convert=lambda p: _decode(p.busId))
    snap.compute_capability = q("compute capability", "nvmlDeviceGetCudaComputeCapability", handle,
                                convert=lambda cc: f"{cc[0]}.{cc[1]}")
    if identity_only:
        _mig_state(q, handle, snap)
        return snap
    mem = q("memory", memory_info, handle)
    if mem is not NA:
        snap.memory_total, snap.memory_used, snap.memory_free = int(mem.total), int(mem.used), int(mem.free)
    util = q("utilization", "nvmlDeviceGetUtilizationRates", handle)
    if util is not NA:
        snap.utilization_gpu, snap.utilization_memory = int(util.gpu), int(util.memory)
    temp_sensor = getattr(module, "NVML_TEMPERATURE_GPU", 0)
    snap.temperature = q("temperature", "nvmlDeviceGetTemperature", handle, temp_sensor)
    snap.power_draw = q("power draw", "nvmlDeviceGetPowerUsage", handle, convert=_watts)
    snap.power_limit = q("power limit", "nvmlDeviceGetEnforcedPowerLimit", handle, convert=_watts)
    clock_sm, clock_mem = getattr(module, "NVML_CLOCK_SM", 1), getattr(module, "NVML_CLOCK_MEM", 2)
    snap.clock_sm = q("SM clock", "nvmlDeviceGetClockInfo", handle, clock_sm)
    snap.clock_memory = q("memory clock", "nvmlDeviceGetClockInfo", handle, clock_mem)
    snap.clock_sm_max = q("max SM clock", "nvmlDeviceGetMaxClockInfo", handle, clock_sm)
    snap.clock_memory_max = q("max memory clock", "nvmlDeviceGetMaxClockInfo", handle, clock_mem)
    snap.pcie_generation = q("PCIe generation", "nvmlDeviceGetCurrPcieLinkGeneration", handle)
    snap.pcie_width = q("PCIe width", "nvmlDeviceGetCurrPcieLinkWidth", handle)
    snap.pcie_generation_max = q("max PCIe generation", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    snap.pcie_width_max = q("max PCIe width", "nvmlDeviceGetMaxPcieLinkWidth", handle)
    enabled = getattr(module, "NVML_FEATURE_ENABLED", 1)
    snap.persistence_mode = q("persistence mode", "nvmlDeviceGetPersistenceMode", handle,
                              convert=lambda v: v == enabled)
    _mig_state(q, handle, snap)
    return snap


def _mig_state(q: _Querier, handle: Any, snap: GPUSnapshot) -> None:
    mig = q("MIG mode", "nvmlDeviceGetMigMode", handle)
    if mig is not NA:
        snap.mig_mode, snap.mig_mode_pending = bool(mig[0]), bool(mig[1])
        if snap.mig_mode:
            snap.mig_devices = _mig_devices(q, handle)


def _mig_devices(q: _Querier, handle: Any) -> list:
    """The MIG instances that exist on a GPU in MIG mode (empty slots are skipped)."""
    slots = q("MIG device count", "nvmlDeviceGetMaxMigDeviceCount", handle)
    found = []
    for slot in range(slots if isinstance(slots, int) else 0):
        try:
            mig_handle = q.module.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception as exc:  # noqa: BLE001 - NotFound marks an empty slot
            if problem_from_error(exc).code == "gpu_lost":
                q.lost = True
                break
            continue
        mig = MigSnapshot(index=slot)
        mig.uuid = q("MIG UUID", "nvmlDeviceGetUUID", mig_handle)
        mig.name = q("MIG name", "nvmlDeviceGetName", mig_handle)
        mem = q("MIG memory", memory_info, mig_handle)
        if mem is not NA:
            mig.memory_total, mig.memory_used = int(mem.total), int(mem.used)
        mig.gpu_instance_id = q("MIG GPU instance", "nvmlDeviceGetGpuInstanceId", mig_handle)
        mig.compute_instance_id = q("MIG compute instance", "nvmlDeviceGetComputeInstanceId", mig_handle)
        found.append(mig)
    return found


def memory_info(module: Any, handle: Any) -> Any:
    """The memory figures of ``handle``: ``nvmlDeviceGetMemoryInfo`` v2 where the driver has it (>= 510),
    which keeps memory the driver reserves apart from 'used', as ``nvidia-smi`` does; v1 otherwise, whose
    'used' counts the reserved memory too (hundreds of MiB on an idle GPU). Raises what pynvml raises."""
    version = getattr(module, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return module.nvmlDeviceGetMemoryInfo(handle, version=version)
        except TypeError:  # bindings older than the v2 call
            pass
        except Exception as exc:  # noqa: BLE001 - a driver without v2: fall back; anything else is real
            if problem_from_error(exc).code not in ("function_not_found", "not_supported"):
                raise
    return module.nvmlDeviceGetMemoryInfo(handle)


# pynvml's names of the clocks-event reasons (bits of one mask), in words for a report.
_REASONS = (
    ("GpuIdle", "idle"), ("ApplicationsClocksSetting", "application clocks"), ("SwPowerCap", "power cap"),
    ("HwSlowdown", "hardware slowdown"), ("SyncBoost", "sync boost"),
    ("SwThermalSlowdown", "thermal slowdown"), ("HwThermalSlowdown", "hardware thermal slowdown"),
    ("HwPowerBrakeSlowdown", "power brake"), ("DisplayClockSetting", "display clock"),
)


def clock_reader(nvml_index: int) -> Optional[tuple]:
    """``(max SM clock MHz, read)`` for GPU ``nvml_index``, where ``read()`` gives ``(SM clock MHz, reasons)``
    now: the reasons why the clock is what it is, in words (:data:`_REASONS`; empty when none). Each figure
    is NA where NVML cannot say. None when NVML cannot give the GPU at all. The handle and the max clock
    are asked once, so a read costs two NVML calls (``%%cudatime`` reads around every sample). The reasons
    come from ``nvmlDeviceGetCurrentClocksEventReasons``, or its older name (drivers before R535)."""
    module = _nvml()
    handle = None if module is None else _handle(module, nvml_index, [])
    if handle is None:
        return None
    q = _Querier(module, [], [])
    sm = getattr(module, "NVML_CLOCK_SM", 1)
    top = q("max SM clock", "nvmlDeviceGetMaxClockInfo", handle, sm)
    names = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    # each reason's bit; a name this pynvml lacks gets bit 0, never set
    bits = [(getattr(module, f"nvmlClocksEventReason{name}", 0), words) for name, words in _REASONS]

    def read() -> tuple:
        clock = q("SM clock", "nvmlDeviceGetClockInfo", handle, sm)
        mask = q("clock reasons", lambda m, h: _first_of(m, names, h), handle)
        return clock, NA if mask is NA else tuple(text for bit, text in bits if int(mask) & bit)

    return top, read


def memory(nvml_index: int, mig_uuid: Any = None) -> tuple:
    """``(used, total)`` bytes of GPU ``nvml_index``, or of its MIG instance ``mig_uuid`` (NA each when
    unknown): the cheap call for samplers."""
    module = _nvml()
    handle = None if module is None else _handle(module, nvml_index, [], mig_uuid)
    if handle is None:
        return NA, NA
    try:
        info = memory_info(module, handle)
    except Exception:  # noqa: BLE001 - a sampler wants a figure or NA, never an exception
        return NA, NA
    return int(info.used), int(info.total)


def utilization(nvml_index: int) -> Any:
    """GPU ``nvml_index``'s utilisation in percent, or NA: the cheap call for a cluster panel's GPU rows."""
    return _query("utilization", lambda module: module.nvmlDeviceGetUtilizationRates(
        module.nvmlDeviceGetHandleByIndex(nvml_index)).gpu)


# Each list's pynvml functions, newest first, called by their versioned names: pynvml's unversioned names
# call _v3 and turn a driver without it (before R510; R470 is still an LTS branch) into its own
# NVMLLibraryMismatchError, which is no NVMLError and would hide the _v2 answer.
_PROCESS_CALLS = (
    ("compute", ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")),
    ("graphics", ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2")),
)


def _first_of(module: Any, names: tuple, *args: Any) -> Any:
    """Call the first of the pynvml functions ``names`` that the driver has (a driver without a symbol
    answers FUNCTION_NOT_FOUND); raises the last such error when none has it, anything else at once."""
    error: Optional[BaseException] = None
    for fn in (getattr(module, name) for name in names if hasattr(module, name)):
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001
            if problem_from_error(exc).code != "function_not_found":
                raise
            error = exc
    raise error or AttributeError(f"pynvml has none of {', '.join(names)}")


def processes(nvml_index: int, mig_uuid: Any = None) -> tuple:
    """The processes using GPU ``nvml_index`` (or its MIG instance ``mig_uuid``) and, when the list is
    incomplete, why.

    Returns ``(list[ProcessInfo], Optional[NVMLProblem])``. Compute processes come first; a PID in
    both lists appears once, as 'compute+graphics'. Names come from psutil where this process can see
    the PID (inside a container NVML lists the host's PIDs).
    """
    module = _nvml()
    if module is None:
        return [], status()
    problems: list = []
    handle = _handle(module, nvml_index, problems, mig_uuid)
    if handle is None:
        return [], problems[0]
    found: dict = {}
    first_problem: Optional[NVMLProblem] = None
    for kind, names in _PROCESS_CALLS:
        try:
            listed = list(_first_of(module, names, handle))
        except Exception as exc:  # noqa: BLE001
            first_problem = first_problem or _process_problem(module, handle, mig_uuid, exc, kind)
            continue
        for proc in listed:
            pid = int(proc.pid)
            if pid in found:
                if found[pid].kind != kind:
                    found[pid].kind = "compute+graphics"
                continue
            used = getattr(proc, "usedGpuMemory", None)
            found[pid] = ProcessInfo(pid=pid, used_memory=NA if used is None else int(used), kind=kind)
    import psutil

    for info in found.values():  # where this process can see the PID
        try:
            info.name = psutil.Process(info.pid).name()
        except (psutil.Error, OSError):
            info.name = NA
    return list(found.values()), first_problem


def _process_problem(module: Any, handle: Any, mig_uuid: Any, exc: BaseException, kind: str) -> NVMLProblem:
    """The problem of a failed process list; NO_PERMISSION on a whole GPU in MIG mode is not the
    container's doing, and its hint says so."""
    problem = problem_from_error(exc, f"{kind} process list")
    if problem.code == "no_permission" and not mig_uuid:
        try:
            in_mig = bool(module.nvmlDeviceGetMigMode(handle)[0])
        except Exception:  # noqa: BLE001 - not a MIG-capable GPU
            in_mig = False
        if in_mig:
            return NVMLProblem(problem.code, problem.message, HINTS["no_permission_mig"])
    return problem
