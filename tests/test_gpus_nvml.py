"""The NVML layer through the real pynvml over a stand-in NVML library (tests/fake_nvmllib.py, scenarios in
tests/fake_pynvml.py): every scenario and error, raised by pynvml's own wrappers."""
from __future__ import annotations

import threading

import fake_pynvml
import pynvml
import pytest

from torchgpu_magic.gpus import nvml
from torchgpu_magic.gpus.nvml import NA
from torchgpu_magic.render import fmt_bytes, is_na

MiB = 1024 * 1024


def test_na_sentinel():
    assert not NA
    assert str(NA) == "N/A"
    assert is_na(NA)
    assert type(NA)() is NA
    assert fmt_bytes(NA) == "N/A"


def test_h100_snapshot(fake_nvml):
    fake_nvml("h100")
    assert nvml.status() is None
    assert nvml.device_count() == 1
    assert nvml.driver_version() == "580.159.04"
    assert nvml.cuda_driver_version() == "13.0"
    snap = nvml.gpu_snapshot(0)
    assert snap.name == "NVIDIA H100 80GB HBM3"
    assert snap.uuid.startswith("GPU-")
    assert snap.pci_bus_id == "00000000:18:00.0"  # pynvml hands bytes; decoded
    assert snap.compute_capability == "9.0"
    assert snap.memory_total == 81559 * MiB
    assert snap.memory_used + snap.memory_free == snap.memory_total
    assert snap.power_limit == 700.0 and snap.power_draw == pytest.approx(69.9)
    assert (snap.pcie_generation, snap.pcie_width) == (5, 16)
    assert snap.persistence_mode is True and snap.mig_mode is False
    assert snap.problems == [] and snap.not_supported == []
    assert nvml.memory(0) == (4 * MiB, 81559 * MiB)


def test_eight_gpus_each_distinct(fake_nvml):
    fake_nvml("eight_gpus")
    assert nvml.device_count() == 8
    snaps = [nvml.gpu_snapshot(i) for i in range(8)]
    assert len({s.uuid for s in snaps}) == 8
    assert [s.pci_bus_id[9:11] for s in snaps] == list(fake_pynvml.DGX_A100_BUSES)
    assert all(s.memory_total == 81920 * MiB for s in snaps)
    assert nvml.cuda_driver_version() == "12.8"


def test_mig_mode(fake_nvml):
    fake_nvml("mig")
    snap = nvml.gpu_snapshot(0)
    assert snap.mig_mode is True
    assert [m.gpu_instance_id for m in snap.mig_devices] == [1, 2]
    assert all(m.uuid.startswith("MIG-") for m in snap.mig_devices)
    assert snap.mig_devices[0].memory_total == 19968 * MiB
    # utilisation is not supported in MIG mode: NA, recorded as a not-supported field, not a problem
    assert snap.utilization_gpu is NA and "utilization" in snap.not_supported
    assert snap.problems == []
    procs, problem = nvml.processes(0)
    assert problem is None
    assert procs[0].used_memory is NA  # NVML reports no per-process memory in MIG mode without privileges


def test_processes_named_and_self(fake_nvml):
    import os

    fake_nvml("h100_busy")
    procs, problem = nvml.processes(0)
    assert problem is None
    by_pid = {p.pid: p for p in procs}
    assert by_pid[os.getpid()].used_memory == 30720 * MiB
    assert by_pid[os.getpid()].name  # psutil sees our own process
    assert by_pid[fake_pynvml.OTHER_PIDS[0]].name is NA  # a PID this namespace cannot see


def test_compute_and_graphics_merged_once(fake_nvml):
    def edit(machine):
        gpu = machine.gpus[0]
        gpu.graphics = [fake_pynvml.FakeProcess(4190005, 100 * MiB), gpu.compute[0]]

    fake_nvml("h100_busy", edit)
    procs, _ = nvml.processes(0)
    assert [p.kind for p in procs] == ["compute+graphics", "compute", "graphics"]  # in both: both
    assert len({p.pid for p in procs}) == 3


def test_a_pid_in_both_lists_is_both(fake_nvml):
    fake_nvml("both_lists")
    procs, problem = nvml.processes(0)
    assert problem is None and [(p.pid, p.kind) for p in procs] == [(fake_pynvml.OTHER_PIDS[0],
                                                                     "compute+graphics")]


# ---- memory v2, process-call fallbacks, MIG handles (issue 11, items 5 and 6) -----------------------------
def test_memory_uses_v2_so_reserved_memory_is_not_used(fake_nvml):
    module = fake_nvml("v2_memory")
    assert nvml.memory(0) == (4 * MiB, 81559 * MiB)  # what nvidia-smi says; v1 would say 536 MiB
    snap = nvml.gpu_snapshot(0)
    assert snap.memory_used == 4 * MiB and snap.memory_free == (81559 - 4 - 532) * MiB
    assert "nvmlDeviceGetMemoryInfo_v2" in module.calls


def test_memory_falls_back_to_v1_on_a_driver_without_v2(fake_nvml):
    module = fake_nvml("no_v3")
    assert nvml.memory(0) == ((4 + 2048) * MiB, 81559 * MiB)
    assert nvml.gpu_snapshot(0).memory_used == (4 + 2048) * MiB
    assert "nvmlDeviceGetMemoryInfo_v2" not in module.calls
    assert "memory" not in nvml.gpu_snapshot(0).not_supported


def test_memory_v2_failing_for_a_real_reason_is_not_hidden_by_v1(fake_nvml):
    fake_nvml("v2_memory", lambda m: m.gpus[0].errors.update(
        nvmlDeviceGetMemoryInfo=fake_pynvml._real.NVML_ERROR_GPU_IS_LOST))
    assert nvml.memory(0) == (NA, NA)
    assert nvml.gpu_snapshot(0).problems[0].code == "gpu_lost"


def test_process_lists_fall_back_to_v2_on_a_driver_without_v3(fake_nvml):
    module = fake_nvml("no_v3")
    procs, problem = nvml.processes(0)
    assert problem is None
    assert [(p.pid, p.used_memory, p.kind) for p in procs] == [(fake_pynvml.OTHER_PIDS[0], 2048 * MiB,
                                                                 "compute")]
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in module.calls


def test_mig_memory_and_processes_come_from_the_slice_torch_uses(fake_nvml):
    fake_nvml("mig_user")
    snap = nvml.gpu_snapshot(0)
    second = snap.mig_devices[1].uuid
    assert nvml.memory(0, second) == ((13 + 2048) * MiB, 19968 * MiB)  # the 20 GB slice, not the 40 GB GPU
    procs, problem = nvml.processes(0, second)
    assert problem is None and [p.pid for p in procs] == [fake_pynvml.OTHER_PIDS[0]]
    procs, problem = nvml.processes(0, snap.mig_devices[0].uuid)
    assert problem is None and procs == []


def test_no_permission_on_a_mig_gpu_does_not_blame_the_container(fake_nvml):
    fake_nvml("mig_user")
    procs, problem = nvml.processes(0)
    assert procs == [] and problem.code == "no_permission"
    assert "MIG mode" in problem.hint and "container" not in problem.hint


def test_an_unknown_mig_uuid_is_a_problem_not_an_exception(fake_nvml):
    fake_nvml("mig_user")
    procs, problem = nvml.processes(0, "MIG-00000000-0000-0000-0000-000000000000")
    assert procs == [] and problem is not None
    assert nvml.memory(0, "MIG-00000000-0000-0000-0000-000000000000") == (NA, NA)


def test_no_permission_for_process_lists(fake_nvml):
    fake_nvml("no_permission")
    procs, problem = nvml.processes(0)
    assert procs == []
    assert problem.code == "no_permission"
    assert "container" in problem.hint
    assert nvml.gpu_snapshot(0).problems == []  # the rest of the GPU still answers


@pytest.mark.parametrize(
    "scenario, code, words",
    [
        ("no_library", "library_not_found", "libnvidia-ml.so.1"),
        ("no_driver", "driver_not_loaded", "modprobe"),
        ("mismatch", "driver_mismatch", "reboot"),
        ("unknown_error", "unknown", "nvidia-smi"),
    ],
)
def test_init_errors_map_to_hints(fake_nvml, scenario, code, words):
    fake_nvml(scenario)
    problem = nvml.status()
    assert problem.code == code
    assert words in problem.hint
    assert nvml.device_count() == 0
    assert nvml.driver_version() is NA and nvml.cuda_driver_version() is NA
    snap = nvml.gpu_snapshot(0)
    assert snap.problems == [problem] and snap.name is NA
    assert nvml.processes(0) == ([], problem)
    assert nvml.memory(0) == (NA, NA)


def test_missing_bindings(fake_nvml):
    fake_nvml(None)
    problem = nvml.status()
    assert problem.code == "bindings_missing"  # not "no driver": without pynvml the driver is unknown
    assert "nvidia-ml-py" in problem.hint


def test_gpu_lost_stops_querying_that_gpu(fake_nvml):
    module = fake_nvml("gpu_lost")
    snap = nvml.gpu_snapshot(3)
    assert [p.code for p in snap.problems] == ["gpu_lost"]
    assert "Xid" in snap.problems[0].hint
    assert snap.memory_total is NA
    asked = [c for c in module.calls]
    assert len(asked) == 1  # after the first GPU_IS_LOST nothing more is asked of that GPU
    assert nvml.gpu_snapshot(2).memory_total == 81920 * MiB  # the others still answer
    assert nvml.memory(3) == (NA, NA)


def test_strict_stand_in_everything_else_not_supported(fake_nvml):
    module = fake_nvml("strict")
    snap = nvml.gpu_snapshot(0)
    assert snap.name == "NVIDIA GeForce RTX 3060 Laptop GPU"
    assert snap.memory_total == 6144 * MiB
    for name in ("pci_bus_id", "compute_capability", "temperature", "power_draw", "clock_sm",
                 "pcie_generation", "persistence_mode", "mig_mode"):
        assert getattr(snap, name) is NA, name
    assert snap.problems == []
    assert "power draw" in snap.not_supported and "MIG mode" in snap.not_supported
    assert module.unscripted  # it really was asked, and said no
    procs, problem = nvml.processes(0)
    assert procs == [] and problem.code == "not_supported"


def test_unscripted_module_function_is_not_supported(fake_nvml):
    module = fake_nvml("h100")
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(module.NVMLError_NotSupported) as info:
        module.nvmlDeviceGetFanSpeed(handle)
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert module.unscripted == ["nvmlDeviceGetFanSpeed"]
    module.nvmlShutdown()


def test_the_stand_in_is_the_real_pynvml_over_a_fake_library(fake_nvml):
    """Every function the NVML layer calls is pynvml's own code; only the C library below is scripted, so
    its errors are pynvml's: NVMLError subclasses for return codes, FunctionNotFound for a missing
    symbol, and NVMLLibraryMismatchError (no NVMLError at all) from an unversioned wrapper over it."""
    module = fake_nvml("no_v3")
    assert module.nvmlInit.__code__.co_filename == pynvml.__file__
    assert module.nvmlDeviceGetComputeRunningProcesses.__wrapped__.__code__.co_filename == pynvml.__file__
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(module.NVMLLibraryMismatchError) as info:
        module.nvmlDeviceGetComputeRunningProcesses(handle)
    assert not isinstance(info.value, module.NVMLError)
    with pytest.raises(module.NVMLError_FunctionNotFound):
        module.nvmlDeviceGetComputeRunningProcesses_v3(handle)
    listed = module.nvmlDeviceGetComputeRunningProcesses_v2(handle)
    assert [p.pid for p in listed] == [fake_pynvml.OTHER_PIDS[0]]
    module.nvmlShutdown()
    with pytest.raises(module.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()


def test_a_missing_library_fails_as_pynvml_says_it(fake_nvml):
    module = fake_nvml("no_library")
    with pytest.raises(module.NVMLError_LibraryNotFound):
        module.nvmlInit()
    module = fake_nvml("no_driver")
    with pytest.raises(module.NVMLError_DriverNotLoaded):
        module.nvmlInit()


# ---- clocks and their reasons, read around %%cudatime's samples ------------------------------------------
def test_clock_reader_gives_the_max_clock_once_and_clock_and_reasons_per_read(fake_nvml):
    module = fake_nvml("h100")
    top, read = nvml.clock_reader(0)
    assert top == 1980
    assert read() == (345, ("idle",))  # an idle H100: 345 MHz, clocks dropped because it is idle
    gpu = module.machine.gpus[0]
    gpu.clocks["sm"] = 1410
    gpu.clock_reasons = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonSwThermalSlowdown
    calls = len(module.calls)
    assert read() == (1410, ("power cap", "thermal slowdown"))
    assert module.calls[calls:] == ["nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons"]


def test_clock_reasons_use_the_older_name_on_a_driver_before_r535(fake_nvml):
    module = fake_nvml("old_driver", lambda m: setattr(m.gpus[0], "clock_reasons",
                                                      pynvml.nvmlClocksThrottleReasonHwSlowdown))
    top, read = nvml.clock_reader(0)
    assert top == 1590 and read() == (300, ("hardware slowdown",))
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in module.calls


def test_clock_reader_says_na_where_nvml_cannot(fake_nvml):
    fake_nvml("strict")
    top, read = nvml.clock_reader(0)
    assert top is NA and read() == (NA, NA)
    fake_nvml("no_driver")
    assert nvml.clock_reader(0) is None


def test_problem_from_error_covers_codes():
    cases = {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_mismatch",
        pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
        pynvml.NVML_ERROR_NOT_SUPPORTED: "not_supported",
        pynvml.NVML_ERROR_GPU_IS_LOST: "gpu_lost",
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "function_not_found",
        pynvml.NVML_ERROR_UNKNOWN: "unknown",
        pynvml.NVML_ERROR_TIMEOUT: "unknown",
    }
    for value, code in cases.items():
        problem = nvml.problem_from_error(pynvml.NVMLError(value), "x")
        assert problem.code == code
        assert problem.hint and problem.message.startswith("x: ")
    assert nvml.problem_from_error(OSError("boom")).code == "unknown"


def test_lazy_init_once_under_threads(fake_nvml):
    module = fake_nvml("h100")
    assert module.init_calls == 0  # installing does not initialise
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        results.append(nvml.status())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [None] * 8
    assert module.init_calls == 1


def test_failed_init_is_not_retried_until_reset(fake_nvml):
    module = fake_nvml("no_driver")
    nvml.status()
    nvml.device_count()
    nvml.gpu_snapshot(0)
    assert module.init_calls == 1
    nvml.reset()
    nvml.status()
    assert module.init_calls == 2


def test_reset_shuts_down(fake_nvml):
    module = fake_nvml("h100")
    nvml.status()
    assert module.initialized == 1
    nvml.reset()
    assert module.shutdown_calls == 1 and module.initialized == 0
    nvml.reset()  # idempotent: nothing to shut down
    assert module.shutdown_calls == 1


def test_identity_only_snapshot_is_cheap(fake_nvml):
    module = fake_nvml("mig")
    snap = nvml.gpu_snapshot(0, identity_only=True)
    assert snap.uuid.startswith("GPU-") and len(snap.mig_devices) == 2
    assert snap.temperature is NA
    assert "nvmlDeviceGetTemperature" not in module.calls


def test_every_scenario_gives_a_snapshot_without_raising(fake_nvml):
    for name in fake_pynvml.SCENARIOS:
        fake_nvml(name)
        for i in range(max(1, nvml.device_count())):
            nvml.gpu_snapshot(i)
            nvml.processes(i)
            nvml.memory(i)


def test_real_pynvml_here_reports_why():
    """On this machine (no driver) the real bindings must give a problem with a hint, never raise."""
    nvml.reset()
    try:
        problem = nvml.status()
        if problem is None:
            assert nvml.device_count() >= 0
        else:
            assert problem.hint
    finally:
        nvml.reset()


def test_utilization_the_cheap_call(fake_nvml):
    """The cluster panel's per-GPU figure: the percentage where NVML says it, NA on a lost GPU or without
    NVML, never an exception."""
    fake_nvml("h100_busy")
    assert nvml.utilization(0) == 87
    assert nvml.utilization(5) is nvml.NA  # no such GPU
    fake_nvml("gpu_lost")
    assert nvml.utilization(3) is nvml.NA and nvml.utilization(0) == 0
    fake_nvml(None)
    assert nvml.utilization(0) is nvml.NA
