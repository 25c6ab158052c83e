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
