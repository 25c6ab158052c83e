"""Scripted NVML machines for tests at the NVML boundary, under the real ``pynvml``.

Model: gpustat's ``test_gpustat.py``, scenarios taken from real machines. Each scenario is a
:class:`Machine`; :func:`make` loads a fresh copy of the real ``pynvml`` module whose ``nvmlLib`` (the
ctypes library it would load from ``libnvidia-ml.so.1``) is :class:`fake_nvmllib.FakeNvmlLib` for that
machine. The ``fake_nvml`` fixture (conftest.py) puts that module at ``sys.modules["pynvml"]``, so
``torchgpu_magic.gpus.nvml`` runs its real code through pynvml's real wrappers: their error classes,
their version-mismatch errors, their struct handling. A stand-in that raised what pynvml never raises
would test a path no user takes (a test of the ``_v3`` -> ``_v2`` fallback once passed that way).

Figures follow real machines: an H100 80GB HBM3 reports 81559 MiB, an A100-SXM4-80GB 81920 MiB, a
DGX A100 puts its eight GPUs on PCI buses 07, 0F, 47, 4E, 87, 90, B7, BD.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import types
import uuid as _uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import fake_nvmllib
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
    """One scripted GPU. ``errors`` maps a pynvml function (every version of it) or one C symbol to the
    NVML return code it answers; ``only`` (when set) lists the per-GPU functions the GPU supports, the
    others answering NOT_SUPPORTED (the strict stand-in). A clock may be a callable, read at each query."""

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
    clock_reasons: Any = 0  # nvmlDeviceGetCurrentClocksEventReasons' bit mask (a callable: read each time)
    parent_errors: dict = field(default_factory=dict)  # errors of the whole GPU's handle, not its MIGs'


# Symbols a driver of the R470 branch (still an LTS driver) lacks: the _v3 process calls came with R510,
# nvmlDeviceGetMemoryInfo_v2 with R510, the clocks-event names with R535 (it has the throttle names).
R470_MISSING = frozenset({
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons",
})


@dataclass
class Machine:
    """A scripted machine: its GPUs, its driver, the C symbols its NVML library lacks (``missing``), and
    the error ``nvmlInit`` answers (``NVML_ERROR_LIBRARY_NOT_FOUND``: the library cannot be loaded)."""

    gpus: list
    driver: str = "580.159.04"
    cuda: int = 13000
    init_error: Optional[int] = None
    missing: frozenset = frozenset()


class ScriptedPynvml(types.ModuleType):
    """A fresh copy of the real ``pynvml`` module over a :class:`fake_nvmllib.FakeNvmlLib`. The stand-in
    library's record is readable from the module: ``machine``, ``calls``, ``unscripted``,
    ``init_calls``, ``shutdown_calls``, ``initialized``."""

    @property
    def lib(self) -> fake_nvmllib.FakeNvmlLib:
        return self.__dict__["_scripted_lib"]

    machine = property(lambda self: self.lib.machine)
    calls = property(lambda self: self.lib.calls)
    unscripted = property(lambda self: self.lib.unscripted)
    init_calls = property(lambda self: self.lib.init_calls)
    shutdown_calls = property(lambda self: self.lib.shutdown_calls)
    initialized = property(lambda self: self.lib.initialized)


def load(machine: Machine) -> ScriptedPynvml:
    """A new copy of the real pynvml module whose ``CDLL("libnvidia-ml.so.1")`` gives the stand-in library
    for ``machine`` (or fails as a machine without the driver's library does). The copy is executed under
    the name ``pynvml``, which its error-class set-up looks itself up by."""
    spec = importlib.util.spec_from_file_location("pynvml", _real.__file__)
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved
    lib = fake_nvmllib.FakeNvmlLib(machine)

    def cdll(name: str, *args: Any, **kwargs: Any) -> Any:
        if machine.init_error == _real.NVML_ERROR_LIBRARY_NOT_FOUND:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return lib

    module.CDLL = cdll
    module.__dict__["_scripted_lib"] = lib
    module.__class__ = ScriptedPynvml
    return module


# ---- scenarios ----------------------------------------------------------------------------------

def h100(index: int = 0, **kw: Any) -> FakeGPU:
    """An H100 80GB HBM3 (SXM5): 81559 MiB, compute capability 9.0, 700 W, PCIe gen5 x16."""
    base = dict(
        name="NVIDIA H100 80GB HBM3", uuid=fake_uuid(f"h100-{index}"),
        bus_id=f"00000000:{0x18 + index:02X}:00.0",
        memory_total=81559 * MiB, memory_used=4 * MiB, capability=(9, 0), utilization=(0, 0),
        temperature=31, power_mw=69856, power_limit_mw=700000,
        clocks={"sm": 345, "mem": 2619}, max_clocks={"sm": 1980, "mem": 2619}, pcie=(5, 16, 5, 16),
        clock_reasons=_real.nvmlClocksEventReasonGpuIdle,
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
            power_mw=512340, clocks={"sm": 1980, "mem": 2619}, clock_reasons=0,
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
            persistence=0)], driver="470.256.02", cuda=11040, missing=R470_MISSING),
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
        # a driver older than the _v3 process calls (R470): pynvml's unversioned names raise its
        # NVMLLibraryMismatchError there; the _v2 calls answer
        "no_v3": lambda: Machine([h100(
            0, memory_used=(4 + 2048) * MiB, compute=[FakeProcess(OTHER_PIDS[0], 2048 * MiB)],
        )], driver="470.256.02", cuda=11040, missing=R470_MISSING),
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
    return {name: _real.NVML_ERROR_GPU_IS_LOST for name in fake_nvmllib.DEVICE_FAMILIES}


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


def make(name: str, edit: Optional[Callable[[Machine], None]] = None) -> ScriptedPynvml:
    """A fresh pynvml module over the stand-in library for scenario ``name``; ``edit`` may adjust the
    machine first (and the test may keep editing ``module.machine`` afterwards)."""
    machine = scenario(name)
    if edit is not None:
        edit(machine)
    return load(machine)
