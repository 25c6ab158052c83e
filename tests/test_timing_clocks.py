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


# ---- which device a cell is timed on (issue 11, item 1) ----------------------------------------------------
@pytest.mark.parametrize(("default", "before", "after", "want"), [
    ("cpu", False, False, "cpu"),  # a CPU-only cell: host time, no CUDA context
    ("cpu", True, False, "cuda:1"),  # CUDA already in use in the session: the cell may use it
    ("cpu", False, True, "cuda:1"),  # the setup or the first run initialised CUDA
    ("cuda", False, False, "cuda:1"),  # inside %%ontorch cuda: the current GPU
    ("cuda:0", False, False, "cuda:0"),
    ("meta", True, True, "meta"),  # a non-cpu default is kept (check_device refuses meta later)
    ("mps", False, True, "mps"),
])
def test_the_timing_device_is_a_pure_function_of_default_and_cuda_state(default, before, after, want):
    import torch

    assert str(timing.choose_device(torch.device(default), before, after, 1)) == want


def test_timing_device_reads_cuda_state_without_initialising_it(monkeypatch):
    import torch

    from torchgpu_magic.timing import clocks

    monkeypatch.setattr(clocks, "cuda_initialised", lambda: False)
    assert timing.timing_device() == torch.device("cpu")  # whatever this machine has, CUDA unused
    assert not torch.cuda.is_initialized() or torch.cuda.is_available()


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
