"""The simulated machines the suite can run as, one per leg: ``pytest --simulate h100|mps|xpu|rocm``
(``--simulate-gpu`` is ``--simulate h100``), and the per-test fixtures of the non-NVIDIA ones
(``simulated_mps``, ``simulated_xpu``, ``simulated_rocm``; the H100's is conftest's ``simulated_gpu``).

A machine is installed for the whole run before any test module is imported, or for one test by its
fixture (reset to a fresh process's state under the whole run's). A test asking for one machine in a run
simulating another skips: two simulated backends in one process are no machine that exists.
"""
from __future__ import annotations

from typing import Any, Optional

import pytest

MACHINES = {
    "h100": "one NVIDIA H100 80GB HBM3, CUDA 13.0 (torch.cuda up to the first kernel)",
    "mps": "an Apple M2 Max Mac, 32 GB unified memory, macOS 14.5 (torch's MPS up to the first kernel)",
    "xpu": "one Intel Data Center GPU Max 1100 (torch's XPU backend up to the first kernel)",
    "rocm": "one AMD Instinct MI300X, ROCm 6.4 (torch.cuda over HIP up to the first kernel; AMD SMI)",
}


def module_of(name: str) -> Any:
    """The module that simulates machine ``name``."""
    import importlib

    return importlib.import_module({"h100": "simulated_gpu", "mps": "simulated_mps", "xpu": "simulated_xpu",
                                    "rocm": "simulated_rocm"}[name])


def chosen(config: Any) -> Optional[str]:
    """The machine this run simulates: ``--simulate NAME``, ``--simulate-gpu`` (h100), or None."""
    name = config.getoption("--simulate", None)
    if config.getoption("--simulate-gpu", False):
        if name not in (None, "h100"):
            raise pytest.UsageError("--simulate-gpu is --simulate h100: give one of them")
        name = "h100"
    return name


def install_for_run(config: Any) -> Any:
    """Install the run's machine (if any); returns the simulation object, remembered on ``config``."""
    config._simulated_machine = chosen(config)
    config._simulated_device = None
    if config._simulated_machine is None:
        return None
    module = module_of(config._simulated_machine)
    why = module.usable()
    if why:
        raise pytest.UsageError(why)
    config._simulation_patch = pytest.MonkeyPatch()
    config._simulated_device = module.install(config._simulation_patch)
    return config._simulated_device


# The simulated machines that are no NVIDIA CUDA machine: there torch is a build for MPS, XPU or HIP, and
# NVML has no GPU to list.
NOT_CUDA = ("mps", "xpu", "rocm")

# The device kind each simulated machine gives torch, as it lists the devices it has.
DEVICE_KIND = {"h100": "cuda", "mps": "mps", "xpu": "xpu", "rocm": "cuda"}


def skip_unless_cuda_machine(config: Any, scripts: str) -> None:
    """Skip the test where the run simulates a machine that cannot be what the test ``scripts`` (a CUDA
    build of torch, an NVIDIA machine...): scripting it over an MPS, XPU or ROCm torch would make a
    machine that does not exist. The ordinary leg and the simulated H100 run it."""
    running = getattr(config, "_simulated_machine", None)
    if running in NOT_CUDA:
        pytest.skip(f"scripts {scripts}; this run simulates {MACHINES[running]}")


# The devices besides cpu and meta that a torch without CUDA lists on each simulated machine, as device
# errors name them: the Mac's one MPS device, the Intel machine's one GPU.
NON_CUDA_DEVICES = {"mps": ["mps"], "xpu": ["xpu:0"]}


def devices_here(config: Any) -> str:
    """The devices a torch without CUDA lists on this run's machine, as the device layer's messages name
    them ("cpu, meta"; "cpu, mps, meta" on the simulated Mac): read from the run's choice of machine,
    apart from the code under test."""
    running = getattr(config, "_simulated_machine", None)
    return ", ".join(["cpu", *NON_CUDA_DEVICES.get(running, []), "meta"])


def for_test(request: Any, monkeypatch: Any, name: str) -> Any:
    """Machine ``name`` for one test (a generator: yields it, then tidies up): the run's (reset), else
    installed for this test alone and what the package remembered of it forgotten afterwards; skips in a
    run simulating another machine, or on a torch with a GPU backend of its own."""
    from torchgpu_magic import caches

    running = getattr(request.config, "_simulated_machine", None)
    if running not in (None, name):
        pytest.skip(f"needs the simulated {name}; this run simulates {running}")
    if running == name:
        sim = request.config._simulated_device
        sim.reset()
        yield sim
        return
    module = module_of(name)
    why = module.usable()
    if why:
        pytest.skip(why)
    yield module.install(monkeypatch)
    monkeypatch.undo()
    caches.reset_caches()


@pytest.fixture
def simulated_mps(request: Any, monkeypatch: Any) -> Any:
    """The simulated M2 Max (tests/simulated_mps.py) for this test, in a fresh process's state."""
    yield from for_test(request, monkeypatch, "mps")


@pytest.fixture
def simulated_xpu(request: Any, monkeypatch: Any) -> Any:
    """The simulated Intel Max 1100 (tests/simulated_xpu.py) for this test, in a fresh process's state."""
    yield from for_test(request, monkeypatch, "xpu")


@pytest.fixture
def simulated_rocm(request: Any, monkeypatch: Any) -> Any:
    """The simulated MI300X under ROCm (tests/simulated_rocm.py) for this test, in a fresh process's
    state; NVML and AMD SMI are reset around it."""
    from torchgpu_magic.gpus import amdsmi, nvml

    for sim in for_test(request, monkeypatch, "rocm"):
        nvml.reset()
        amdsmi.reset()
        yield sim
        nvml.reset()
        amdsmi.reset()
