"""A scripted stand-in for the ``pynvml`` module, for tests at the NVML import boundary.

Model: gpustat's ``test_gpustat.py``, which replaces pynvml's functions with scripted ones. Here a
whole module is built per scenario and put at ``sys.modules["pynvml"]`` (the ``fake_nvml`` fixture in
conftest.py), so ``torchgpu_magic.gpus.nvml`` runs its real code against it. The exception classes and
constants are the real pynvml's (``NVMLError`` with ``.value`` and one subclass per error code),
so the error handling under test is the one that meets a real driver. Any ``nvml*`` function a
scenario did not script raises ``NVMLError_NotSupported``, like a GPU or driver that lacks it.

Figures follow real machines: an H100 80GB HBM3 reports 81559 MiB, an A100-SXM4-80GB 81920 MiB, a
DGX A100 puts its eight GPUs on PCI buses 07, 0F, 47, 4E, 87, 90, B7, BD.
"""
from __future__ import annotations

import hashlib
import os
import types
import uuid as _uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pynvml as _real

MiB = 1024 * 1024
OTHER_PIDS = (4190001, 4190002, 4190003)  # PIDs that do not exist here (Linux pid_max is 4194304)


def fake_uuid(seed: str, prefix: str = "GPU-") -> str:
    """A stable, realistic-looking UUID for a scripted GPU or MIG instance."""
    return prefix + str(_uuid.UUID(hashlib.md5(seed.encode()).hexdigest()))


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: Optional[int]  # noqa: N815 - pynvml's attribute name
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815


@dataclass
class FakeMig:
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass
class FakeGPU:
    """One scripted GPU. ``errors`` maps a pynvml function name to the error code it raises;
    ``only`` (when set) lists the per-GPU functions that exist at all (the strict stand-in)."""

    name: str
    uuid: str
    bus_id: str
    memory_total: int
    memory_used: int
    capability: tuple = (9, 0)
    utilization: tuple = (0, 0)
    temperature: int = 30
    power_mw: int = 70000
    power_limit_mw: int = 700000
    clocks: dict = field(default_factory=lambda: {"sm": 1980, "mem": 2619})
    max_clocks: dict = field(default_factory=lambda: {"sm": 1980, "mem": 2619})
    pcie: tuple = (5, 16, 5, 16)
    persistence: int = 1
    mig_mode: tuple = (0, 0)
    migs: list = field(default_factory=list)
    compute: list = field(default_factory=list)
    graphics: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)
    only: Optional[frozenset] = None
    memory_reserved: int = 0  # what the driver reserves: v1 'used' counts it, v2 keeps it apart
    v2_memory: bool = True  # drivers >= 510 have nvmlDeviceGetMemoryInfo_v2
    parent_errors: dict = field(default_factory=dict)  # errors of the whole GPU's handle, not its MIGs'


@dataclass
class Machine:
    gpus: list
    driver: str = "580.159.04"
    cuda: int = 13000
    init_error: Optional[int] = None


class _Handle:
    def __init__(self, gpu: FakeGPU, mig: Optional[FakeMig] = None) -> None:
        self.gpu = gpu
        self.mig = mig


class _Memory:
    def __init__(self, total: int, used: int, reserved: int = 0) -> None:
        self.total, self.used, self.reserved = total, used, reserved
        self.free = total - used - reserved


class _Utilization:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu, self.memory = gpu, memory


class _PciInfo:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id.encode()  # a c_char array in pynvml: bytes
        self.busIdLegacy = bus_id[4:].encode()


class FakePynvml(types.ModuleType):
    """The module object: real constants and exceptions, scripted functions, call counters."""

    def __init__(self, machine: Machine) -> None:
        super().__init__("pynvml")
        for name in dir(_real):
            if name.startswith(("NVML_", "NVMLError", "nvmlMemory_v")):
                setattr(self, name, getattr(_real, name))
        self.machine = machine
        self.initialized = 0
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: list = []
        self.unscripted: list = []

    def __getattr__(self, name: str) -> Any:
        """An unscripted nvml* function: exists, but the 'GPU' does not support it."""
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def unsupported(*args: Any) -> Any:
            self.unscripted.append(name)
            self._check_init()
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)

        return unsupported

    # ---- library ---------------------------------------------------------------------------------
    def _check_init(self) -> None:
        if not self.initialized:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.init_calls += 1
        if self.machine.init_error is not None:
            raise _real.NVMLError(self.machine.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._check_init()
        self.shutdown_calls += 1
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._check_init()
        return self.machine.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._check_init()
        return self.machine.cuda

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check_init()
        return len(self.machine.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self._check_init()
        if not 0 <= index < len(self.machine.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(self.machine.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:  # noqa: N802
        """A GPU's or a MIG instance's handle (drivers >= 470 take MIG UUIDs here)."""
        self._check_init()
        self.calls.append("nvmlDeviceGetHandleByUUID")
        for gpu in self.machine.gpus:
            if gpu.uuid == uuid:
                return _Handle(gpu)
            for mig in gpu.migs:
                if mig.uuid == uuid:
                    return _Handle(gpu, mig)
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    # ---- per GPU ---------------------------------------------------------------------------------
    def _gpu(self, fn: str, handle: _Handle) -> FakeGPU:
        self._check_init()
        self.calls.append(fn)
        gpu = handle.gpu
        if fn in gpu.errors:
            raise _real.NVMLError(gpu.errors[fn])
        if gpu.only is not None and fn not in gpu.only:
            self.unscripted.append(fn)
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetName", handle)
        return handle.mig.name if handle.mig else gpu.name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        return handle.mig.uuid if handle.mig else gpu.uuid

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:  # noqa: N802
        return _PciInfo(self._gpu("nvmlDeviceGetPciInfo", handle).bus_id)

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple:  # noqa: N802
        return tuple(self._gpu("nvmlDeviceGetCudaComputeCapability", handle).capability)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> _Memory:  # noqa: N802
        """v1 (no ``version``) counts reserved memory as used; v2 keeps it apart, as nvidia-smi shows."""
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        if version and not gpu.v2_memory:
            raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if version:
            self.calls.append("nvmlDeviceGetMemoryInfo_v2")
        if handle.mig:
            return _Memory(handle.mig.memory_total, handle.mig.memory_used)
        if version:
            return _Memory(gpu.memory_total, gpu.memory_used, gpu.memory_reserved)
        return _Memory(gpu.memory_total, gpu.memory_used + gpu.memory_reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig_mode[0]:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)  # as on a real A100 in MIG mode
        return _Utilization(*gpu.utilization)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: _Handle, kind: int) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        return gpu.clocks["sm" if kind == _real.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, kind: int) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMaxClockInfo", handle)
        return gpu.max_clocks["sm" if kind == _real.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie[3]

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu("nvmlDeviceGetPersistenceMode", handle).persistence

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list:  # noqa: N802
        return list(self._gpu("nvmlDeviceGetMigMode", handle).mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if gpu.mig_mode[0] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(gpu.migs):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return _Handle(gpu, gpu.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:  # noqa: N802
        self._gpu("nvmlDeviceGetGpuInstanceId", handle)
        return handle.mig.gpu_instance_id if handle.mig else 0xFFFFFFFF

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:  # noqa: N802
        self._gpu("nvmlDeviceGetComputeInstanceId", handle)
        return handle.mig.compute_instance_id if handle.mig else 0xFFFFFFFF

    def _processes(self, fn: str, handle: _Handle, kind: str) -> list:
        """A process list: on a MIG handle, the processes of that instance; on a whole GPU in MIG mode,
        ``parent_errors`` apply (a non-root user gets NO_PERMISSION there)."""
        gpu = self._gpu(fn, handle)
        listed = list(getattr(gpu, kind))
        if handle.mig is not None:
            return [p for p in listed if p.gpuInstanceId == handle.mig.gpu_instance_id]
        if fn in gpu.parent_errors:
            raise _real.NVMLError(gpu.parent_errors[fn])
        return listed

    # pynvml's unversioned names call the _v3 symbols; a driver without them still has _v2
    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list:  # noqa: N802
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle, "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list:  # noqa: N802
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list:  # noqa: N802
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: _Handle) -> list:  # noqa: N802
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, "graphics")


# ---- scenarios ----------------------------------------------------------------------------------

def h100(index: int = 0, **kw: Any) -> FakeGPU:
    """An H100 80GB HBM3 (SXM5): 81559 MiB, compute capability 9.0, 700 W, PCIe gen5 x16."""
    base = dict(
        name="NVIDIA H100 80GB HBM3", uuid=fake_uuid(f"h100-{index}"),
        bus_id=f"00000000:{0x18 + index:02X}:00.0",
        memory_total=81559 * MiB, memory_used=4 * MiB, capability=(9, 0), utilization=(0, 0),
        temperature=31, power_mw=69856, power_limit_mw=700000,
        clocks={"sm": 345, "mem": 2619}, max_clocks={"sm": 1980, "mem": 2619}, pcie=(5, 16, 5, 16),
    )
    base.update(kw)
    return FakeGPU(**base)


DGX_A100_BUSES = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")


def a100(index: int, **kw: Any) -> FakeGPU:
    """An A100-SXM4-80GB as in a DGX A100: 81920 MiB, capability 8.0, 400 W, PCIe gen4 x16."""
    base = dict(
        name="NVIDIA A100-SXM4-80GB", uuid=fake_uuid(f"a100-{index}"),
        bus_id=f"00000000:{DGX_A100_BUSES[index]}:00.0", memory_total=81920 * MiB, memory_used=1 * MiB,
        capability=(8, 0), utilization=(0, 0), temperature=29 + index, power_mw=61000 + 500 * index,
        power_limit_mw=400000, clocks={"sm": 210, "mem": 1593}, max_clocks={"sm": 1410, "mem": 1593},
        pcie=(4, 16, 4, 16),
    )
    base.update(kw)
    return FakeGPU(**base)


def _self_pid() -> int:
    return os.getpid()


def scenario(name: str) -> Machine:
    """Build the named scenario (a fresh Machine each time, so tests may edit it)."""
    builders: dict = {
        "h100": lambda: Machine([h100(0)]),
        "h100_busy": lambda: Machine([h100(
            0, memory_used=(4 + 30720 + 12288) * MiB, utilization=(87, 41), temperature=58,
            power_mw=512340, clocks={"sm": 1980, "mem": 2619},
            compute=[FakeProcess(_self_pid(), 30720 * MiB), FakeProcess(OTHER_PIDS[0], 12288 * MiB)],
        )]),
        "container": lambda: Machine([h100(
            0, memory_used=(4 + 20480 + 8192) * MiB,
            compute=[FakeProcess(OTHER_PIDS[1], 20480 * MiB), FakeProcess(OTHER_PIDS[2], 8192 * MiB)],
        )]),
        "no_permission": lambda: Machine([h100(0, errors={
            "nvmlDeviceGetComputeRunningProcesses": _real.NVML_ERROR_NO_PERMISSION,
            "nvmlDeviceGetGraphicsRunningProcesses": _real.NVML_ERROR_NO_PERMISSION,
        })]),
        "eight_gpus": lambda: Machine([a100(i) for i in range(8)], driver="570.172.08", cuda=12080),
        "mig": lambda: Machine([_mig_a100()], driver="550.163.01", cuda=12040),
        "gpu_lost": lambda: Machine(
            [a100(i, errors=_lost_errors() if i == 3 else {}) for i in range(8)],
            driver="570.172.08", cuda=12080),
        "old_driver": lambda: Machine([FakeGPU(
            name="Tesla T4", uuid=fake_uuid("t4"), bus_id="00000000:00:04.0", memory_total=15360 * MiB,
            memory_used=0, capability=(7, 5), power_mw=9000, power_limit_mw=70000,
            clocks={"sm": 300, "mem": 405}, max_clocks={"sm": 1590, "mem": 5001}, pcie=(3, 16, 3, 16),
            persistence=0, v2_memory=False)], driver="470.256.02", cuda=11040),
        "strict": lambda: Machine([FakeGPU(
            name="NVIDIA GeForce RTX 3060 Laptop GPU", uuid=fake_uuid("rtx3060"), bus_id="00000000:01:00.0",
            memory_total=6144 * MiB, memory_used=512 * MiB,
            only=frozenset({"nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo"}))]),
        "no_library": lambda: Machine([], init_error=_real.NVML_ERROR_LIBRARY_NOT_FOUND),
        "no_driver": lambda: Machine([], init_error=_real.NVML_ERROR_DRIVER_NOT_LOADED),
        "mismatch": lambda: Machine([], init_error=_real.NVML_ERROR_LIB_RM_VERSION_MISMATCH),
        "unknown_error": lambda: Machine([], init_error=_real.NVML_ERROR_UNKNOWN),
        "no_gpus": lambda: Machine([]),
        # an idle H100 on driver >= 510: v1 says 536 MiB used (reserved counted), nvidia-smi and v2 say 4
        "v2_memory": lambda: Machine([h100(0, memory_used=4 * MiB, memory_reserved=532 * MiB)]),
        # a driver older than the _v3 process calls (R470): the unversioned pynvml names fail, _v2 answers
        "no_v3": lambda: Machine([h100(
            0, memory_used=(4 + 2048) * MiB, v2_memory=False,
            compute=[FakeProcess(OTHER_PIDS[0], 2048 * MiB)],
            errors={n: _real.NVML_ERROR_FUNCTION_NOT_FOUND for n in (
                "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")},
        )], driver="470.256.02", cuda=11040),
        # one PID in both lists (a process drawing with OpenGL while it computes)
        "both_lists": lambda: Machine([h100(
            0, memory_used=(4 + 1024) * MiB, compute=[FakeProcess(OTHER_PIDS[0], 1024 * MiB)],
            graphics=[FakeProcess(OTHER_PIDS[0], 1024 * MiB)])]),
        # MIG as a non-root user sees it: the whole GPU's process lists are refused, each instance answers
        "mig_user": lambda: Machine([_mig_a100(parent_errors={n: _real.NVML_ERROR_NO_PERMISSION for n in (
            "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")})],
            driver="550.163.01", cuda=12040),
    }
    if name not in builders:
        raise KeyError(f"no fake NVML scenario {name!r}; known: {', '.join(sorted(builders))}")
    return builders[name]()


SCENARIOS = ("h100", "h100_busy", "container", "no_permission", "eight_gpus", "mig", "gpu_lost",
             "old_driver", "strict", "no_library", "no_driver", "mismatch", "unknown_error", "no_gpus",
             "v2_memory", "no_v3", "both_lists", "mig_user")


def _lost_errors() -> dict:
    """Every per-GPU query fails with GPU_IS_LOST (after the handle was obtained), as after Xid 79."""
    names = [n for n in dir(FakePynvml)
             if n.startswith("nvmlDeviceGet") and n != "nvmlDeviceGetHandleByIndex"]
    return {n: _real.NVML_ERROR_GPU_IS_LOST for n in names}


def _mig_a100(**kw: Any) -> FakeGPU:
    """An A100-SXM4-40GB in MIG mode with two 3g.20gb instances; utilisation is not supported. A process
    runs on instance 2 (NVML gives no per-process memory in MIG mode without privileges)."""
    parent = fake_uuid("a100mig")
    migs = [
        FakeMig(fake_uuid(f"mig{i}", "MIG-"), "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968 * MiB,
                (13 + 2048 * i) * MiB, gpu_instance_id=1 + i, compute_instance_id=0)
        for i in range(2)
    ]
    return FakeGPU(
        name="NVIDIA A100-SXM4-40GB", uuid=parent, bus_id="00000000:00:04.0", memory_total=40960 * MiB,
        memory_used=2074 * MiB, capability=(8, 0), power_limit_mw=400000, pcie=(4, 16, 4, 16),
        clocks={"sm": 1410, "mem": 1215}, max_clocks={"sm": 1410, "mem": 1215},
        mig_mode=(1, 1), migs=migs,
        compute=[FakeProcess(OTHER_PIDS[0], None, gpuInstanceId=2, computeInstanceId=0)], **kw,
    )


def make(name: str, edit: Optional[Callable[[Machine], None]] = None) -> FakePynvml:
    """A fresh fake pynvml module for scenario ``name``; ``edit`` may adjust the machine first."""
    machine = scenario(name)
    if edit is not None:
        edit(machine)
    return FakePynvml(machine)
