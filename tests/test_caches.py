"""The package's caches (torchgpu_magic/caches.py): each made there, all forgotten by one reset_caches()."""
from __future__ import annotations

from torchgpu_magic import caches


def test_reset_caches_forgets_every_cache_made_there():
    calls = []

    @caches.cache
    def square(n):
        calls.append(n)
        return n * n

    seen = caches.table()
    seen["key"] = 1
    assert square(3) == square(3) == 9 and calls == [3]
    caches.reset_caches()
    assert seen == {} and square(3) == 9 and calls == [3, 3]


def test_maxsize_keeps_only_the_latest_answers():
    calls = []

    @caches.cache(maxsize=1)
    def double(n):
        calls.append(n)
        return 2 * n

    assert [double(1), double(1), double(2), double(1)] == [2, 2, 4, 2] and calls == [1, 2, 1]


def test_the_packages_caches_are_forgotten_too():
    """What the package remembered of a type, a device or torch's CUDA count goes with one call, as a
    simulated GPU needs (tests/simulated_gpu.py)."""
    import torch

    from torchgpu_magic import devices
    from torchgpu_magic.placement import kinds

    assert kinds.kind_of(torch.ones(1)) == "tensor" and kinds.device_str(torch.device("cpu")) == "cpu"
    devices.available_devices()
    assert kinds.KIND_OF_TYPE and kinds.DEVICE_TEXT and devices._count_of.cache_info().currsize == 1
    caches.reset_caches()
    assert not kinds.KIND_OF_TYPE and not kinds.DEVICE_TEXT and devices._count_of.cache_info().currsize == 0
