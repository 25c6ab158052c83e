"""Clocks and devices (torchgpu_magic/timing/clocks.py) on cpu: which devices can be timed, the memory
probe's N/A where torch keeps no allocator statistics, the CPU cache size behind --flush-l2. The CUDA
clock is checked on a real GPU in tests/test_cudatime.py (the `gpu` marker)."""
from __future__ import annotations

import pytest

from torchgpu_magic import timing
from torchgpu_magic.errors import MagicInputError


def test_meta_cannot_be_timed():
    import torch

    with pytest.raises(MagicInputError, match="meta tensors hold no data"):
        timing.check_device(torch.device("meta"))
    timing.check_device(torch.device("cpu"), flush_l2=True)


def test_cpu_memory_is_not_available_rather_than_invented():
    import torch

    probe = timing.MemoryProbe(torch.device("cpu"))
    probe.start()
    assert probe.stop() == (None, None, None)


def test_cpu_cache_size_is_positive():
    assert timing.cpu_cache_bytes() >= 2**20


# ---- which device a cell is timed on (issue 19, item 1) ----------------------------------------------------
def _touched(*devices, initialised=False):
    return timing.Touched(devices=list(devices), nbytes={d: 0 for d in devices}, cuda_initialised=initialised)


@pytest.mark.parametrize(("default", "touched", "want"), [
    ("cpu", None, "cpu"),  # before the first run: a cpu default gives cpu
    ("cpu", _touched("cpu"), "cpu"),  # a CPU-only cell: host time, however initialised CUDA is
    ("cpu", _touched(), "cpu"),  # a cell that touched no tensor at all
    ("cpu", _touched("cpu", "cuda:0"), "cuda:0"),  # its tensors were on the GPU
    ("cpu", _touched("cuda"), "cuda:1"),  # plain 'cuda' is the current GPU
    ("cpu", _touched("cpu", initialised=True), "cuda:1"),  # the cell initialised CUDA (torch.cuda.init())
    ("cpu", _touched("meta"), "cpu"),  # meta runs nothing: not a device to time on
    ("cpu", _touched("xpu:0"), "cpu"),  # an accelerator this machine cannot time on
    ("cuda", None, "cuda:1"),  # inside %%ontorch cuda: the current GPU
    ("cuda:0", _touched("cpu"), "cuda:0"),  # a non-cpu default is kept
    ("meta", None, "meta"),  # ... meta too (check_device refuses it later)
    ("mps", None, "mps"),
])
def test_the_timing_device_is_a_pure_function_of_default_and_what_the_cell_touched(default, touched, want):
    import torch

    assert str(timing.choose_device(torch.device(default), touched, 1, ("cuda",))) == want


def test_a_cell_of_cpu_tensors_touches_cpu_and_its_working_set_is_counted_once():
    import torch

    x = torch.ones(1024)  # 4 KiB
    with timing.watch() as touched:
        y = x + 1
        x[:10].sum()
        torch.ones(2, device="meta") * 2
    assert touched.devices == ["cpu", "meta"]
    assert touched.working_set("cpu") == x.nbytes + y.nbytes + 4  # x once (its view shares it), y, the sum
    assert touched.working_set("meta") is None and not touched.cuda_initialised


def test_the_watch_keeps_no_tensor_and_leaves_no_mode_behind():
    import gc
    import weakref

    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    x = torch.ones(8)
    ref = weakref.ref(x)
    with timing.watch():
        x * 2
    del x
    gc.collect()
    assert ref() is None and _get_current_dispatch_mode() is None
    with pytest.raises(ZeroDivisionError), timing.watch():
        torch.ones(1) / 0 + int("1") // 0
    assert _get_current_dispatch_mode() is None


def test_timing_device_initialises_nothing():
    import torch

    was = torch.cuda.is_initialized()
    assert timing.timing_device() == torch.device("cpu")  # a cpu default, before the cell ran
    assert torch.cuda.is_initialized() == was


def test_cpu_flush_writes_twice_the_last_level_cache():
    clock = timing.clocks.HostClock()
    flush = clock.make_flush()
    flush()
    assert clock.flush_bytes == timing.clocks.FLUSH_FACTOR * timing.cpu_cache_bytes()
    assert timing.clocks.FLUSH_FACTOR >= 2 and timing.clocks.FLUSH_MIN_BYTES >= 256 * 2**20


def test_a_sample_without_device_time_falls_back_to_wall_then_host():
    sample = timing.Sample(1, host=1.0, wall=2.0)
    assert timing.Clock.primary(sample, "device") == 2.0
    assert timing.Clock.primary(timing.Sample(1, host=1.0), "device") == 1.0
    assert timing.Clock.primary(timing.Sample(1, host=1.0, wall=2.0, device=3.0), "host") == 1.0


@pytest.mark.fresh_process
def test_the_watch_costs_no_torch_dynamo_import_and_compiled_code_still_compiles():
    """torch wraps a dispatch mode's __torch_dispatch__ in a lazy torch._dynamo import (seconds, charged to
    the first run); the watch marks its frames as never compiled instead. A torch.compile'd function run
    under the watch still compiles one graph, and its ops are seen."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys, torch\nfrom torchgpu_magic import timing\n"
            "with timing.watch() as seen:\n    torch.ones(4) + 1\n"
            "print('dynamo imported:', 'torch._dynamo' in sys.modules)\n"
            "f = torch.compile(lambda x: (x.sin() * 2).cos(), backend='eager')\n"
            "with timing.watch() as seen:\n    f(torch.ones(4))\n"
            "from torch._dynamo.utils import counters\n"
            "print('frames:', dict(counters['frames']), 'devices:', seen.devices)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dynamo imported: False" in done.stdout
    assert "frames: {'total': 1, 'ok': 1} devices: ['cpu']" in done.stdout, done.stdout


@pytest.mark.parametrize(("cell", "names"), [
    ("torch.cuda._sleep(1000)", True),  # GPU work outside torch's dispatcher: nothing for the watch to see
    ("with torch.cuda.stream(s):\n    pass", True),
    ("y = x.cuda()", True),
    ("y = torch.ones(2, device='cuda:1')", True),
    ("def f():\n    return [torch.cuda.synchronize() for _ in range(2)]\nf()", True),  # nested code
    ("y = gpu_tensor + 0 if False else 1", True),  # a name bound to a CUDA tensor
    ("y = x @ x", False),
    ("y = 'not a cuda device'", False),
])
def test_a_cell_that_names_cuda_is_told_from_one_that_does_not(cell, names):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        gpu_tensor = torch.empty(2, device="cuda")  # a CUDA tensor without a GPU (no op is run on it)
    namespace = {"torch": torch, "x": torch.ones(2), "gpu_tensor": gpu_tensor}
    compiled = timing.compile_cell(cell, namespace)
    assert timing.observe.names_cuda(compiled.code, compiled.namespace) is names


def test_a_device_it_cannot_time_on_is_refused_with_the_valid_ones(monkeypatch):
    """Without an out-of-tree backend the list ends at xpu:N (it said ', None' before); with one, its
    name ends it."""
    import torch

    from torchgpu_magic import accelerators
    from torchgpu_magic.timing import clocks

    monkeypatch.setattr(accelerators, "current_kind", lambda: None)
    with pytest.raises(MagicInputError) as refused:
        clocks.check_device(torch.device("hpu"))
    assert str(refused.value) == "cannot time on 'hpu'; valid: cpu, cuda, cuda:N, mps, xpu, xpu:N"
    monkeypatch.setattr(accelerators, "current_kind", lambda: "npu")
    with pytest.raises(MagicInputError) as refused:
        clocks.check_device(torch.device("hpu"))
    assert str(refused.value).endswith("xpu, xpu:N, npu")
    clocks.check_device("npu")  # its own backend: timed through the accelerator API
