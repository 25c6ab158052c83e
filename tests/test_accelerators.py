"""The device layer (torchgpu_magic.accelerators) on every simulated machine: which accelerator, asked
without initialising it; the allocator's figures through torch.accelerator or the backend's own module;
events that time device work; synchronize; the cache given back; an out-of-tree PrivateUse1 backend.

Each machine-parametrized test runs on the simulated H100, M2 Max (mps), Intel Max 1100 (xpu) and MI300X
under ROCm, installed for the test (or the run's, under ``--simulate NAME``; the others then skip).
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from torchgpu_magic import accelerators

MiB = 2**20
MACHINES = ("h100", "mps", "xpu", "rocm")
EXPECTED = {  # (device type, label, name, memory torch can use)
    "h100": ("cuda", "CUDA", "NVIDIA H100 80GB HBM3", 81008 * MiB),
    "rocm": ("cuda", "ROCm", "AMD Instinct MI300X", 200998912 * 1024),
    "mps": ("mps", "MPS", "Apple M2 Max", 32 * 2**30 * 2 // 3),
    "xpu": ("xpu", "XPU", "Intel(R) Data Center GPU Max 1100", 49136 * MiB),
}


@pytest.fixture(params=MACHINES)
def machine(request):
    """(name, simulation) of one simulated machine."""
    fixture = "simulated_gpu" if request.param == "h100" else f"simulated_{request.param}"
    return request.param, request.getfixturevalue(fixture)


def work(name, sim, seconds):
    """Queue ``seconds`` of device work on the machine: a ``_sleep`` kernel on CUDA / ROCm (the H100 at
    1980 MHz, the MI300X at 2100 MHz), a command buffer / SYCL kernel on MPS / XPU."""
    if name in ("h100", "rocm"):
        from torchgpu_magic.torchapi import gpu_spin

        gpu_spin(int(seconds * (2100e6 if name == "rocm" else 1980e6)))
    else:
        sim.launch(seconds)


def test_a_cpu_build_has_no_accelerator(request):
    if getattr(request.config, "_simulated_machine", None):
        pytest.skip("this run simulates a machine")
    assert accelerators.current_kind() is None and accelerators.state() == "no accelerator"
    assert accelerators.device_count() == 0 and accelerators.available_kinds() == []
    assert accelerators.other_kinds() == [] and accelerators.other_kinds() == []
    assert accelerators.torch_figures(0) == (0, 0, 0) and not accelerators.empty_cache()
    assert accelerators.backend_label() == "CPU"


def test_the_layer_names_the_accelerator_without_initialising_it(machine):
    import torch

    name, _ = machine
    kind, label, _, _ = EXPECTED[name]
    assert (accelerators.current_kind(), accelerators.backend_label()) == (kind, label)
    assert accelerators.is_rocm() == (name == "rocm")
    assert accelerators.device_count() == 1 and accelerators.available_kinds() == [kind]
    assert accelerators.torch_figures(0, kind) == (0, 0, 0 if name != "mps" else None)
    assert accelerators.memory_info((kind, 0)) is None or name == "mps"
    if kind != "mps":  # MPS has no lazy initialisation: usable is initialised
        assert accelerators.state() == "not initialised"
        assert not torch.get_device_module(kind).is_initialized()
    else:
        assert accelerators.state() == "initialised"


def test_the_other_accelerators_are_asked_once_where_there_are_none(machine, monkeypatch):
    """%gpuinfo's accelerators besides CUDA: MPS or XPU where there are; a torch with none is not asked
    again (each %gpuinfo, on every engine of a cluster, asked every backend for its devices)."""
    name, _ = machine
    kind = EXPECTED[name][0]
    expected = [] if kind == "cuda" else [kind]
    assert accelerators.other_kinds() == expected
    counted, count = [], accelerators.device_count
    monkeypatch.setattr(accelerators, "device_count", lambda kind=None: counted.append(kind) or count(kind))
    assert accelerators.other_kinds() == expected
    assert bool(counted) == bool(expected), counted


def test_started_asks_is_initialized_alone(machine, monkeypatch):
    """What %%ontorch asks around every cell: whether CUDA / XPU started, without counting devices."""
    import torch

    name, _ = machine
    kind = EXPECTED[name][0]
    if kind == "mps":
        pytest.skip("MPS has no lazy initialisation")
    counted = []
    for other in ("cuda", "xpu"):
        module = torch.get_device_module(other)
        monkeypatch.setattr(module, "device_count", lambda *a, count=module.device_count: counted.append(a)
                            or count(*a))
    assert not accelerators.started(kind) and not accelerators.started("xpu" if kind == "cuda" else "cuda")
    assert counted == []
    accelerators.facts((kind, 0))  # initialised, as a cell that ran work has it
    counted.clear()
    assert accelerators.started(kind) and counted == []


def test_what_the_device_is(machine):
    name, _ = machine
    kind, _, device_name, memory = EXPECTED[name]
    facts = accelerators.facts((kind, 0))
    assert (facts.kind, facts.name, facts.memory) == (kind, device_name, memory)
    assert accelerators.device_name(f"{kind}:0") == device_name
    assert facts.arch == {"h100": "sm_90", "rocm": "gfx942"}.get(name)
    assert facts.units == {"h100": 132, "rocm": 304, "mps": 38, "xpu": 56}[name]


def test_events_time_the_devices_work(machine):
    name, sim = machine
    kind = EXPECTED[name][0]
    accelerators.facts((kind, 0))  # initialised, as a cell that ran work has it
    start, end = accelerators.timing_event(kind), accelerators.timing_event(kind)
    clock = sim.timeline.clock  # the simulated machine's one clock
    before = clock.now()
    start.record()
    work(name, sim, 2e-3)
    end.record()
    queued = clock.now() - before  # the host's time between the records
    accelerators.synchronize((kind, 0))  # torch.accelerator.synchronize waits for the queue
    assert end.query()
    # the work's 2 ms, plus at most the time the host took to queue it after the start event
    assert 2.0 * 0.999 <= start.elapsed_time(end) <= 2.0 + queued * 1e3 + 0.01


def test_synchronize_waits_for_queued_work(machine):
    name, sim = machine
    kind = EXPECTED[name][0]
    accelerators.facts((kind, 0))  # initialised, as a cell that ran work has it
    work(name, sim, 20e-3)
    accelerators.synchronize(f"{kind}:0")
    # an order, not a duration: on the simulated machine's clock it returned only once the GPU had done
    # the work queued before it
    assert sim.timeline.done(sim.timeline.busy_until)


@pytest.mark.parametrize("name", ["mps", "xpu"])
def test_allocator_figures_and_the_cache(request, name):
    """torch.accelerator where torch has it for the backend (XPU), the backend's own figures where it
    has not (torch 2.11's MPS: current and driver-allocated memory, and no peak)."""
    sim = request.getfixturevalue(f"simulated_{name}")
    device = (name, 0)
    accelerators.facts(device)
    sim.allocate(300 * MiB)
    sim.free(100 * MiB)
    assert accelerators.allocated(device) == 200 * MiB and accelerators.reserved(device) == 300 * MiB
    if name == "mps":
        assert accelerators.peak(device) is None and not accelerators.reset_peak(device)
        assert accelerators.working_set_limit() == EXPECTED["mps"][3]
        assert accelerators.memory_info(device) == (EXPECTED["mps"][3] - 300 * MiB, EXPECTED["mps"][3])
    else:
        assert accelerators.peak(device) == 300 * MiB
        assert accelerators.reset_peak(device) and accelerators.peak(device) == 200 * MiB
        assert accelerators.memory_info(device) == (EXPECTED["xpu"][3] - 300 * MiB, EXPECTED["xpu"][3])
    assert accelerators.empty_cache() and accelerators.reserved(device) == 200 * MiB


def test_an_out_of_tree_privateuse1_backend_is_reached_where_the_generic_api_reaches(tmp_path):
    """Ascend's torch_npu registers 'npu' as PrivateUse1; its allocator is not a DeviceAllocator, so
    torch.accelerator's memory functions fail ("Allocator for npu is not a DeviceAllocator", as
    vllm-ascend's patch_torch_accelerator.py works around) and the layer asks torch.npu instead. Run in
    a fresh process: renaming PrivateUse1 cannot be undone."""
    code = '''
import types, torch
torch.utils.rename_privateuse1_backend("npu")
npu = types.ModuleType("torch_npu")
npu.is_available, npu.is_initialized, npu.device_count = (lambda: True), (lambda: True), (lambda: 2)
npu.current_device, npu.synchronize = (lambda: 1), (lambda device=None: None)
npu.memory_allocated = lambda device=None: 3 << 20
npu.memory_reserved = lambda device=None: 8 << 20
npu.max_memory_allocated = lambda device=None: 5 << 20
npu.reset_peak_memory_stats, npu.empty_cache = (lambda device=None: None), (lambda: None)
npu.mem_get_info = lambda device=None: (60 << 30, 64 << 30)
torch._register_device_module("npu", npu)
torch._C._accelerator_getAccelerator = lambda: torch.device("npu")
def fail(*args):
    raise RuntimeError("device_allocator INTERNAL ASSERT FAILED: Allocator for npu is not a DeviceAllocator.")
for name in ("isAllocatorInitialized", "getMemoryInfo", "emptyCache", "resetPeakStats", "getDeviceStats"):
    setattr(torch._C, "_accelerator_" + name, fail)
from torchgpu_magic import accelerators as a
print(a.current_kind(), a.backend_label(), a.state(), a.device_count(), a.current_index(),
      a.torch_figures(1, "npu"), a.memory_info("npu:1"), a.empty_cache(), a.reset_peak("npu:1"))
'''
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["npu", "NPU", "initialised", "2", "1", "(3145728,", "8388608,", "5242880)",
                                   "(64424509440,", "68719476736)", "True", "True"]


def test_initialised_devices_leave_out_a_backend_that_cannot_count_them(monkeypatch):
    """A lost GPU (its driver fails to count the devices) adds none, and the other backends still add
    theirs: a cell's figures and the memory reports carry on without it."""
    def count(kind: str) -> int:
        if kind == "cuda":
            raise RuntimeError("CUDA error: unspecified launch failure")
        return 2

    monkeypatch.setattr(accelerators, "initialised_kinds", lambda: ["cuda", "xpu"])
    monkeypatch.setattr(accelerators, "device_count", count)
    assert accelerators.initialised_devices() == [("xpu", 0), ("xpu", 1)]
