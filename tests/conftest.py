"""Shared fixtures: a real IPython shell with the extension loaded, the `gpu` marker's skip, a CUDA
build's TorchView as torch would describe a GPU machine, and the simulated H100 (``--simulate-gpu`` for
the whole run, fixture ``simulated_gpu`` for one test; tests/simulated_gpu.py)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import simulated_legs  # noqa: E402 - found through the path above
from simulated_legs import simulated_mps, simulated_rocm, simulated_xpu  # noqa: E402, F401 - fixtures


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--simulate-gpu", action="store_true", default=False,
        help="run as on a machine with one H100 80GB and CUDA 13: torch.cuda answers as it would before any "
             "kernel runs (a real CUDA tensor still fails) and NVML is the scripted h100 scenario; needs a "
             "CPU-only build of torch (tests/simulated_gpu.py)")
    parser.addoption(
        "--simulate", choices=sorted(simulated_legs.MACHINES), default=None,
        help="run as on a simulated machine: h100 (= --simulate-gpu), mps (an M2 Max Mac), xpu (an Intel "
             "GPU Max 1100), rocm (an AMD MI300X under ROCm); needs a CPU-only build of torch "
             "(tests/simulated_legs.py)")


def pytest_configure(config: Any) -> None:
    """Under ``--simulate-gpu`` / ``--simulate NAME``, install the simulated machine before any test (or
    test module) runs."""
    config.addinivalue_line("markers", "fresh_process: checks what a new Python process does (a subprocess "
                                       "runs the whole check): the same in every leg of this interpreter")
    config.addinivalue_line("markers", "engines: checks what real ipyparallel engines or Dask workers do "
                                       "(processes of their own): the same in every simulated leg")
    device = simulated_legs.install_for_run(config)
    config._simulated_gpu = device if config._simulated_machine == "h100" else None


def pytest_unconfigure(config: Any) -> None:
    patch = getattr(config, "_simulation_patch", None)
    if patch is not None:
        patch.undo()


def pytest_report_header(config: Any) -> Any:
    machine = getattr(config, "_simulated_machine", None)
    return f"simulated machine: {simulated_legs.MACHINES[machine]}" if machine else None


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


OWN_PROCESS_SKIP = ("runs in a process of its own (a fresh interpreter or a Jupyter kernel), which the "
                    "simulated machine does not reach: the same check as in the ordinary leg, which runs it")
ENGINES_SKIP = ("checks engines or workers, processes of their own which the simulated machine does not "
                "reach, and the notebook's side of --cluster reads nothing of this machine: run in the "
                "ordinary legs and as on the simulated H100")


# The tests where the build of torch matters, run again by `make test-cudabuild` (`pytest -m cudabuild`) on a
# CUDA build of torch where CUDA finds no GPU, as `pip install torch` gives a Linux machine without one:
# %gpuinfo's causes, device choice (auto, --fallback, validation), load/unload, --predict cuda's choice of a
# stand-in and the reasons it gives, the tour notebook in a kernel on that build.
CUDABUILD = ("test_gpus_problems.py", "test_gpuinfo.py", "test_gpus_inventory.py", "test_devices.py",
             "test_ontorch.py", "test_extension.py", "test_cudamem.py", "test_cudamem_targetdevice.py",
             "test_notebooks.py::test_notebook_runs_without_errors[tour.ipynb]")


def _cudabuild_only(config: Any) -> bool:
    return (config.getoption("markexpr", "") or "").strip() == "cudabuild"


def pytest_ignore_collect(collection_path: Any, config: Any) -> Any:
    """Under `-m cudabuild` alone, leave the other test files unimported: their imports cost the leg time."""
    name = collection_path.name
    if _cudabuild_only(config) and name.startswith("test_") and name.endswith(".py"):
        return True if name not in {entry.split("::")[0] for entry in CUDABUILD} else None
    return None


def pytest_itemcollected(item: Any) -> None:
    """Mark the tests of :data:`CUDABUILD` `cudabuild` (before `-m` selects)."""
    name = item.nodeid.split("/")[-1]
    if name.split("::")[0] in CUDABUILD or name in CUDABUILD:
        item.add_marker(pytest.mark.cudabuild)


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    """Skip `gpu`-marked tests where torch sees no real CUDA GPU (the simulated one runs no kernel), and,
    under a simulated machine, the tests whose whole check runs in a process of its own (`notebook`,
    `fresh_process`, `browser`): the simulation lives in this process, so there they would repeat the
    ordinary leg's run exactly, at the price of a torch import, a kernel or a browser each (38 s a leg for
    the five slowest of them). The real clusters' tests (`engines`)
    check engines and workers, which the simulation does not reach either, while the notebook's side of
    ``--cluster`` reads nothing of this machine's accelerators (``--devices`` there is only spelled
    here): they run as on the simulated H100 and not again as on the Mac, the Intel GPU and the MI300X,
    where they cost 73 s a leg."""
    if config._simulated_machine is not None:
        own = pytest.mark.skip(reason=OWN_PROCESS_SKIP)
        engines = pytest.mark.skip(reason=ENGINES_SKIP)
        for item in items:
            if any(mark in item.keywords for mark in ("notebook", "fresh_process", "browser")):
                item.add_marker(own)
            elif "engines" in item.keywords and config._simulated_machine != "h100":
                item.add_marker(engines)
        reason = ("needs a real CUDA GPU: the simulated machines simulate torch only up to the first kernel, "
                  "and these tests run kernels")
    elif _has_cuda():
        return
    else:
        reason = "needs a CUDA GPU (torch.cuda.is_available() is False here)"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def simulated_gpu(request: Any, monkeypatch: Any) -> Any:
    """The simulated H100 for this test, reset to a fresh process's state (CUDA not initialised, no
    context, an idle GPU): the session's under ``--simulate-gpu``, else installed for this test alone and
    taken out afterwards. Skips on a CUDA build of torch, which has its own CUDA layer."""
    import simulated_gpu

    from torchgpu_magic import caches
    from torchgpu_magic.gpus import nvml

    sim = request.config._simulated_gpu
    if request.config._simulated_machine not in (None, "h100"):
        pytest.skip(f"needs the simulated H100; this run simulates {request.config._simulated_machine}")
    if sim is None:
        why = simulated_gpu.usable()
        if why:
            pytest.skip(why)
        sim = simulated_gpu.install(monkeypatch)
    sim.reset()
    nvml.reset()
    yield sim
    nvml.reset()
    if request.config._simulated_gpu is None:  # what the package remembered of the simulated GPU goes too
        caches.reset_caches()


@pytest.fixture(scope="session")
def _shell() -> Any:
    """The session's one InteractiveShell. The modules every test imports (torch, IPython, this package)
    are imported first and their objects frozen out of the garbage collector's reach (``gc.freeze``):
    ``ip``'s teardown resets the shell, and IPython's reset runs a full collection, which would otherwise
    walk torch's millions of objects after every test (more than half of the suite's time)."""
    import gc

    import torch  # noqa: F401 - imported here to be frozen
    from IPython.core.interactiveshell import InteractiveShell

    import torchgpu_magic.magics  # noqa: F401

    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")  # the magic reaches the traceback printers on IPython 7-9
    gc.collect()
    gc.freeze()
    return shell


@pytest.fixture
def ip(_shell: Any) -> Any:
    """A real InteractiveShell with torchgpu_magic loaded; unloaded and emptied after the test.

    Default device, dtype and thread count are checked to be restored by the test's end.
    """
    import gc

    import torch

    from torchgpu_magic import load_ipython_extension, unload_ipython_extension
    from torchgpu_magic.magics.shell import release_traceback

    before = (torch.get_default_dtype(), torch.get_num_threads(), _default_device())
    load_ipython_extension(_shell)
    try:
        yield _shell
    finally:
        unload_ipython_extension(_shell)
        # What a failed cell of this test left: the traceback Python and IPython keep, and the failed cells'
        # results their frames keep alive in a cycle (holders/failed.py), which the next test's holders
        # would otherwise count as its own.
        release_traceback(_shell)
        _shell.reset(new_session=False)  # runs a full collection, of what is not frozen
        gc.freeze()  # what outlived the test (modules it imported, their caches): out of the next walk
        after = (torch.get_default_dtype(), torch.get_num_threads(), _default_device())
        assert after == before, f"test left torch state changed: {before} -> {after}"


def _default_device() -> Any:
    import torch

    return torch.empty(0).device


def run(shell: Any, code: str) -> Any:
    """Run ``code`` as a cell and raise whatever it raised (like jupysql's testing shell)."""
    result = shell.run_cell(code)
    result.raise_error()
    return result.result


def run_error(shell: Any, code: str) -> BaseException:
    """Run ``code`` as a cell that must fail; return the exception it raised."""
    result = shell.run_cell(code)
    error = result.error_before_exec or result.error_in_exec
    assert error is not None, f"cell did not fail: {code!r}"
    return error


@pytest.fixture
def fresh_env(monkeypatch: Any) -> Any:
    """Clear CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER for tests that script them; whatever the test sets
    them to is undone afterwards (set first, so monkeypatch records the value from before the test)."""
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return os.environ


@pytest.fixture
def fake_nvml(monkeypatch: Any) -> Any:
    """Install a scripted pynvml: ``fake_nvml("h100")`` puts the scenario's module (tests/fake_pynvml.py)
    at ``sys.modules["pynvml"]``, resets torchgpu_magic.gpus.nvml, and returns the module; ``fake_nvml(None)``
    makes ``import pynvml`` fail. Both are undone after the test."""
    import fake_pynvml

    from torchgpu_magic.gpus import nvml

    def install(name: Any, edit: Any = None) -> Any:
        module = None if name is None else fake_pynvml.make(name, edit)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        nvml.reset()
        return module

    yield install
    nvml.reset()


@pytest.fixture
def torch_sees_gpus(request: Any, monkeypatch: Any) -> Any:
    """``torch_sees_gpus(n)`` makes torch answer as a CUDA 13 build seeing ``n`` GPUs before CUDA is
    initialised, whatever this machine has (none, the simulated H100, or real GPUs with CUDA initialised
    by earlier tests): asking torch about a device then fails the test, as it would initialise CUDA.
    With NVML scripted (``fake_nvml``), the extension names the GPUs from NVML. Skips where the run
    simulates an MPS, XPU or ROCm machine: a CUDA build is not what torch is there."""
    import torch

    simulated_legs.skip_unless_cuda_machine(request.config, "a CUDA build of torch")

    def refuse(*args: Any) -> Any:
        raise AssertionError("asked torch about a CUDA device: that initialises CUDA")

    def install(count: int) -> None:
        monkeypatch.setattr(torch.version, "cuda", "13.0")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
        for name in ("get_device_properties", "memory_allocated", "memory_reserved", "max_memory_allocated"):
            monkeypatch.setattr(torch.cuda, name, refuse)

    return install


def cuda_view(uuids: Any = (), cuda: str = "12.8", **kw: Any) -> Any:
    """What torch_view() returns on a CUDA build seeing these GPUs (torch prints UUIDs without 'GPU-')."""
    from torchgpu_magic.gpus.gpumap import TorchDevice, TorchView

    mib = 1024 * 1024
    devices = [TorchDevice(i, name="gpu", uuid=u, total_memory=80 * 1024 * mib, allocated=0,
                           reserved=0, peak=0) for i, u in enumerate(uuids)]
    return TorchView(version=f"2.8.0+cu{cuda.replace('.', '')}", cuda=cuda, cudnn=91002,
                     is_available=bool(devices), device_count=len(devices), devices=devices, **kw)


def bare(uuid: str) -> str:
    """An NVML UUID as torch prints it: without the 'GPU-' / 'MIG-' prefix."""
    return uuid.split("-", 1)[1]
