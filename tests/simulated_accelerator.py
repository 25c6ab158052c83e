"""What every simulated accelerator shares: torch's generic accelerator API wired to it, an allocator
ledger, and a tensor stand-in whose ops run on its timeline.

``torch.accelerator`` (current_accelerator, device_count, synchronize, current_stream and the memory
functions) is Python over ``torch._C._accelerator_*``; a CPU-only build answers None / raises there. A
build for a GPU answers from its backend: :func:`wire` puts a simulated device behind those C functions,
as a build for that backend would, so ``torch.accelerator`` runs torch's own Python over it. What each
function does, and raises, follows torch/csrc/DeviceAccelerator.cpp: the device index and stream
initialise the backend first (``maybe_initialize_device``); ``synchronizeDevice`` is a no-op on a backend
with lazy initialisation not yet initialised; the memory functions go through the backend's
``DeviceAllocator``, which MPS's allocator is not before torch 2.13 (c10/core/CachingDeviceAllocator.h
then fails its internal assert, "Allocator for mps is not a DeviceAllocator").

The simulated H100 (tests/simulated_gpu.py) and the ROCm MI300X (tests/simulated_rocm.py) wire their
``torch.cuda`` simulation here; the M-series Mac (tests/simulated_mps.py) and the Intel GPU
(tests/simulated_xpu.py) their own.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

MiB = 2**20
GiB = 2**30


def not_a_device_allocator(kind: str) -> RuntimeError:
    """What ``at::getDeviceAllocator`` raises for a backend whose allocator is not a ``DeviceAllocator``."""
    return RuntimeError(
        "device_allocator INTERNAL ASSERT FAILED at \"/pytorch/c10/core/CachingDeviceAllocator.h\":120, "
        f"please report a bug to PyTorch. Allocator for {kind} is not a DeviceAllocator.")


class Ledger:
    """An allocator's figures as torch's caching allocators keep them: live bytes, what the allocator holds
    from the driver (its cache included), and the peak of the live bytes since the last reset."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.allocated = 0
        self.reserved = 0
        self.peak = 0

    def allocate(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated = max(0, self.allocated - nbytes)  # the blocks stay in the cache: reserved unchanged

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def reset_peak(self) -> None:
        self.peak = self.allocated

    def stats(self) -> dict:
        """``getDeviceStats`` as torch's C layer returns it (the ``all`` pool; counts left at zero)."""
        def stat(current: int, peak: int) -> dict:
            return {"current": current, "peak": peak, "allocated": current, "freed": 0}

        pools = {"allocated_bytes": (self.allocated, self.peak), "reserved_bytes": (self.reserved,
                                                                                      self.reserved),
                 "active_bytes": (self.allocated, self.peak), "requested_bytes": (self.allocated, self.peak)}
        out: dict = {key: 0 for key in ("num_alloc_retries", "num_ooms", "max_split_size",
                                         "num_sync_all_streams", "num_device_alloc", "num_device_free")}
        for key, (current, peak) in pools.items():
            out[key] = {pool: stat(current, peak) for pool in ("all", "small_pool", "large_pool")}
        return out


class Backend:
    """What :func:`wire` asks of a simulated device. ``lazy`` says whether the backend initialises lazily
    (CUDA, ROCm, XPU do; MPS does not); ``device_allocator`` whether its allocator is a DeviceAllocator."""

    kind = "cuda"
    lazy = True
    device_allocator = True

    def module(self) -> Any:
        return torch.get_device_module(self.kind)

    def initialise(self) -> None:
        """torch's ``maybe_initialize_device``: the backend's own lazy initialisation."""
        if self.lazy:
            self.module()._lazy_init()

    def initialised(self) -> bool:
        return bool(self.module().is_initialized()) if self.lazy else True

    def current(self) -> int:
        return int(self.module().current_device())

    def set_current(self, index: int) -> None:
        self.module().set_device(index)

    def synchronize(self, index: int) -> None:
        self.module().synchronize(index)

    def stream(self, index: int) -> Any:
        return self.module().current_stream(index)

    def device_stats(self, index: int) -> dict:
        raise NotImplementedError

    def reset_peak(self, index: int) -> None:
        raise NotImplementedError

    def empty_cache(self) -> None:
        self.module().empty_cache()

    def memory_info(self, index: int) -> tuple:
        raise NotImplementedError


class CudaBackend(Backend):
    """torch.cuda's simulation (the H100's, the MI300X's): its allocator statistics are what the simulation
    put behind ``torch._C._cuda_memoryStats``, the figures a CUDA build's DeviceAllocator returns."""

    def synchronize(self, index: int) -> None:
        """cudaDeviceSynchronize on the device, as the C layer does it (not torch.cuda.synchronize, the
        Python function a test or the extension may wrap to count a cell's own calls)."""
        with torch.cuda.device(index):
            torch._C._cuda_synchronize()

    def device_stats(self, index: int) -> dict:
        return torch._C._cuda_memoryStats(index)

    def reset_peak(self, index: int) -> None:
        torch._C._cuda_resetPeakMemoryStats(index)

    def memory_info(self, index: int) -> tuple:
        return torch.cuda.mem_get_info(index)


def wire(patch: Any, backend: Backend) -> None:
    """Put ``backend`` behind ``torch._C._accelerator_*`` with ``patch`` (a ``pytest.MonkeyPatch``)."""
    C = torch._C
    kind = backend.kind

    def allocator() -> None:
        if not backend.device_allocator:
            raise not_a_device_allocator(kind)

    def index_of(index: int) -> int:
        backend.initialise()
        return backend.current() if index is None or index < 0 else int(index)

    def synchronize(index: int) -> None:
        if backend.lazy and not backend.initialised():
            return
        backend.synchronize(index_of(index))

    def exchange(index: int) -> int:
        backend.initialise()
        before = backend.current()
        if index >= 0:
            backend.set_current(index)
        return before

    def stats(index: int) -> dict:
        allocator()
        return backend.device_stats(index)

    def initialized() -> bool:
        allocator()
        return backend.initialised()

    def empty() -> None:
        allocator()
        if backend.initialised():
            backend.empty_cache()

    def reset_peak(index: int) -> None:
        allocator()
        backend.reset_peak(index)

    def memory_info(index: int) -> tuple:
        allocator()
        return backend.memory_info(index_of(index))

    def set_index(index: int) -> None:
        if index >= 0:  # a negative index is a no-op
            backend.initialise()
            backend.set_current(index)

    functions: dict = {
        "_accelerator_getAccelerator": lambda: torch.device(kind),
        "_accelerator_getDeviceIndex": lambda: index_of(None),
        "_accelerator_setDeviceIndex": set_index,
        "_accelerator_getStream": lambda index: backend.stream(index_of(index)),
        "_accelerator_synchronizeDevice": synchronize,
        "_accelerator_exchangeDevice": exchange,
        "_accelerator_maybeExchangeDevice": exchange,
        "_accelerator_isAllocatorInitialized": initialized,
        "_accelerator_emptyCache": empty,
        "_accelerator_getDeviceStats": stats,
        "_accelerator_resetPeakStats": reset_peak,
        "_accelerator_resetAccumulatedStats": lambda index: allocator(),
        "_accelerator_getMemoryInfo": memory_info,
    }
    for name, function in functions.items():
        patch.setattr(C, name, function, raising=False)
    fresh_caches(patch, torch.accelerator, ("get_device_capability",))
    from torchgpu_magic import caches

    caches.reset_caches()  # what the package remembered of the torch before


def fresh_caches(patch: Any, module: Any, names: tuple) -> None:
    """Give torch's cached functions ``module.<names>`` an empty cache of their own for the simulation: what
    they answer for it stays out of the caches of the real ones, which ``patch.undo()`` puts back."""
    import functools

    for name in names:
        function = getattr(module, name, None)
        if function is not None and hasattr(function, "__wrapped__"):
            patch.setattr(module, name, functools.lru_cache(maxsize=None)(function.__wrapped__))


def device_standin_class(device_type: str) -> type:
    """A tensor on a simulated ``device_type`` as far as its metadata goes (device, shape, dtype, strides,
    an address of its own), holding no data: an op on it works its result's shape out on ``meta`` and runs
    ``launch(op_seconds)`` on the simulated device, as the real op would queue its kernel (views and
    metadata queries launch none). A value read (``.item()``, printing, a copy to the host) fails."""

    class DeviceStandIn(torch.Tensor):
        _next_address = 0x6F0000000000

        @staticmethod
        def __new__(cls, meta: torch.Tensor, launch: Callable[[float], None], op_seconds: float,
                    index: int = 0) -> Any:
            return torch.Tensor._make_wrapper_subclass(cls, meta.shape, strides=meta.stride(),
                                                       dtype=meta.dtype,
                                                       device=torch.device(device_type, index))

        def __init__(self, meta: torch.Tensor, launch: Callable[[float], None], op_seconds: float,
                     index: int = 0) -> None:
            self.meta, self.launch, self.op_seconds, self.index = meta, launch, op_seconds, index
            self.address = DeviceStandIn._next_address
            DeviceStandIn._next_address += max(1, meta.untyped_storage().nbytes()) + 512

        def data_ptr(self) -> int:
            return self.address

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            from torch.utils._pytree import tree_leaves, tree_map

            kwargs = kwargs or {}
            mine = [t for t in tree_leaves((args, kwargs)) if isinstance(t, DeviceStandIn)]
            out = func(*tree_map(lambda t: t.meta if isinstance(t, DeviceStandIn) else t, args),
                       **tree_map(lambda t: t.meta if isinstance(t, DeviceStandIn) else t, kwargs))
            first = mine[0]
            if not func.is_view:
                first.launch(first.op_seconds)
            return tree_map(lambda t: DeviceStandIn(t, first.launch, first.op_seconds, first.index)
                            if isinstance(t, torch.Tensor) and t.device.type == "meta" else t, out)

    DeviceStandIn.__name__ = f"{device_type.capitalize()}StandIn"
    return DeviceStandIn


class EventClock:
    """Timing events on a simulated timeline: each records the moment the work queued before it ends."""

    def __init__(self, timeline: Any) -> None:
        self.timeline = timeline

    def stamp(self) -> float:
        return self.timeline.stamp()

    @staticmethod
    def done(timeline: Any, moment: Optional[float]) -> bool:
        """Whether ``timeline``'s GPU has reached ``moment`` (an event never recorded is done)."""
        return moment is None or timeline.done(moment)

    @staticmethod
    def span_ms(start: float, end: float) -> float:
        """Device timestamps are whole nanoseconds (as a GPU's are), read in milliseconds."""
        return round((end - start) * 1e9) / 1e6
