"""Shared fixtures: a real IPython shell with the extension loaded, the `gpu` marker's skip, and a
CUDA build's TorchView as torch would describe a GPU machine."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    """Skip `gpu`-marked tests where torch sees no CUDA GPU."""
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")  # the magic reaches the traceback printers on IPython 7-9
    return shell


@pytest.fixture
def ip(_shell: Any) -> Any:
    """A real InteractiveShell with torchgpu_magic loaded; unloaded and emptied after the test.

    Default device, dtype and thread count are checked to be restored by the test's end.
    """
    import torch

    from torchgpu_magic import load_ipython_extension, unload_ipython_extension

    before = (torch.get_default_dtype(), torch.get_num_threads(), _default_device())
    load_ipython_extension(_shell)
    try:
        yield _shell
    finally:
        unload_ipython_extension(_shell)
        _shell.reset(new_session=False)
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
    """Clear CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER for tests that script them."""
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
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
