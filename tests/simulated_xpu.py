"""One Intel Data Center GPU Max 1100 (48 GB HBM2e), simulated under a CPU-only build of torch as far as
torch's XPU backend goes before any kernel runs: the ``xpu`` leg (``pytest --simulate xpu``) and the
fixture ``simulated_xpu``.

The stand-in sits where an XPU build's C extension sits: ``torch._C._has_xpu`` and the
``torch._C._xpu_*`` functions the real ``torch.xpu`` Python layer calls (device count, lazy init,
properties, current device, synchronize, the caching allocator's statistics, free and total memory),
plus ``torch.xpu.Event`` / ``Stream``, whose C base classes a CPU build lacks; and the generic
accelerator API (tests/simulated_accelerator.py), whose memory functions reach XPU's caching allocator
(a ``DeviceAllocator``). So ``torch.xpu.is_available()``, ``is_initialized()`` (flipped by the real
``_lazy_init``), ``get_device_properties()`` and ``torch.accelerator.*`` run torch's own code. A real XPU
tensor still fails (the CPU build has no XPU kernels). Level Zero Sysman (which ``device_count`` tries
first) is absent here, as on a machine without ``pyzes``: torch then asks its C layer.

The properties are what torch prints for this GPU on Intel's CI (intel/torch-xpu-ops#4117:
``_XpuDeviceProperties(name='Intel(R) Data Center GPU Max 1100', platform_name='Intel(R) oneAPI Unified
Runtime over Level-Zero', type='gpu', device_id=0xBDA, ..., total_memory=49136MB, ...,
last_level_cache_size=196608KB, max_compute_units=448, ..., gpu_eu_count=448, gpu_subslice_count=56,
...)``); the out-of-memory wording is ``c10/xpu/XPUCachingAllocator.cpp``'s (tests/oom_wordings.py).
"""
from __future__ import annotations

from typing import Any, Optional

import simulated_accelerator
import torch
from simulated_accelerator import Backend, EventClock, Ledger, MiB
from simulated_gpu import SimulatedTime, Timeline

NAME = "Intel(R) Data Center GPU Max 1100"
TOTAL = 49136 * MiB
XPU_TYPE = 12  # c10::DeviceType::XPU


class Properties:
    """``torch.xpu.get_device_properties(0)`` of a Max 1100 as torch 2.13 reports it."""

    def __init__(self) -> None:
        self.name = NAME
        self.platform_name = "Intel(R) oneAPI Unified Runtime over Level-Zero"
        self.type = "gpu"
        self.vendor = "Intel(R) Corporation"
        self.device_id = 0xBDA
        self.uuid = "8680da0b-2f00-0000-1600-000000000000"
        self.driver_version = "1.6.33578+51"
        self.total_memory = TOTAL
        self.local_mem_size = 128 * 1024
        self.last_level_cache_size = 196608 * 1024
        self.max_compute_units = self.gpu_eu_count = 448
        self.gpu_subslice_count = 56
        self.memory_clock_rate, self.memory_bus_width = 3200, 64
        self.max_work_group_size, self.max_num_sub_groups = 1024, 64
        self.sub_group_sizes = [16, 32]
        self.has_fp16 = self.has_fp64 = self.has_atomic64 = True
        self.has_bfloat16_conversions = self.has_subgroup_matrix_multiply_accumulate = True
        self.is_integrated_gpu = False

    def __repr__(self) -> str:
        return (f"_XpuDeviceProperties(name='{self.name}', platform_name='{self.platform_name}', type='gpu', "
                f"device_id=0xBDA, uuid={self.uuid}, driver_version='{self.driver_version}', "
                "total_memory=49136MB, max_compute_units=448, gpu_eu_count=448, gpu_subslice_count=56)")


class SimulatedXPU(Backend):
    """The Max 1100's state; :func:`install` wires it into torch."""

    kind = "xpu"

    def __init__(self) -> None:
        self.properties = Properties()
        self.clock = SimulatedTime()  # the installing thread's CPU time plus its waits (simulated_gpu)
        self.reset()

    def reset(self) -> None:
        """XPU not initialised, an idle GPU, nothing allocated (a fresh process, as far as tests can tell)."""
        torch.xpu._initialized = False
        torch.xpu._cached_device_count = None
        self.timeline = Timeline(self.clock)
        self.ledger = Ledger(TOTAL)
        self.index = 0

    # ---- torch._C._xpu_* ------------------------------------------------------------------------------
    def device_count(self) -> int:
        return 1

    def init(self) -> None:
        """``_xpu_init``: Level Zero finds the GPU."""

    def _index(self, device: Any) -> int:
        index = self.index if device is None or device < 0 else int(device)
        if index >= 1:
            raise RuntimeError(f"device is out of range, device is {index}, total number of device is 1.")
        return index

    def set_current(self, index: int) -> None:
        self.index = self._index(index)

    def exchange(self, index: int) -> int:
        if index < 0:
            return -1
        before, self.index = self.index, self._index(index)
        return before

    def synchronize(self, index: int = 0) -> None:
        self._index(index)
        self.clock.wait_until(self.timeline.busy_until)

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of GPU work (a SYCL kernel) on the one queue."""
        self.timeline.launch(seconds)

    def memory_stats(self, index: int) -> dict:
        self._index(index)
        return self.ledger.stats()

    # ---- what the accelerator API asks (Backend) ----------------------------------------------------
    def device_stats(self, index: int) -> dict:
        return self.memory_stats(index)

    def reset_peak(self, index: int) -> None:
        self._index(index)
        self.ledger.reset_peak()

    def empty_cache(self) -> None:
        self.ledger.empty_cache()

    def memory_info(self, index: int) -> tuple:
        self._index(index)
        return TOTAL - self.ledger.reserved, TOTAL

    def allocate(self, nbytes: int) -> None:
        """A tensor of ``nbytes`` on xpu:0: past the capacity, XPUCachingAllocator's error."""
        if self.ledger.reserved - self.ledger.allocated < nbytes and \
                self.ledger.reserved + nbytes > TOTAL:
            gib = 2**30
            free = TOTAL - self.ledger.reserved
            raise torch.OutOfMemoryError(
                f"XPU out of memory. Tried to allocate {nbytes / gib:.2f} GiB. GPU 0 has a total capacity of "
                f"{TOTAL / gib:.2f} GiB of which {free / gib:.2f} GiB is free. Of the allocated memory "
                f"{self.ledger.allocated / gib:.2f} GiB is allocated by PyTorch, and "
                f"{(self.ledger.reserved - self.ledger.allocated) / gib:.2f} GiB is reserved by PyTorch but "
                "unallocated. Please use `empty_cache` to release all unoccupied cached memory.")
        self.ledger.allocate(nbytes)

    def free(self, nbytes: int) -> None:
        self.ledger.free(nbytes)


def event_class(sim: SimulatedXPU) -> type:
    """``torch.xpu.Event`` on the simulated timeline."""

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.enable_timing = enable_timing
            self.moment: Optional[float] = None

        def record(self, stream: Any = None) -> None:
            torch.xpu._lazy_init()
            self.moment = sim.timeline.stamp()

        def wait(self, stream: Any = None) -> None:
            """One queue: the wait is already in order."""

        def query(self) -> bool:
            return EventClock.done(sim.timeline, self.moment)

        def synchronize(self) -> None:
            if self.moment is not None:
                sim.clock.wait_until(self.moment)

        def elapsed_time(self, end: Any) -> float:
            if not (self.enable_timing and end.enable_timing):
                raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
            if self.moment is None or end.moment is None or not end.query():
                raise RuntimeError("Both events must be recorded before calculating elapsed time.")
            return EventClock.span_ms(self.moment, end.moment)

    return Event


def stream_class(sim: SimulatedXPU) -> type:
    """``torch.xpu.Stream`` on the simulated timeline (every stream is the one queue)."""

    class Stream:
        def __init__(self, device: Any = None, priority: int = 0, stream_id: int = 0,
                     device_index: Optional[int] = None, device_type: int = XPU_TYPE) -> None:
            self.device_index = sim.index if device_index is None else device_index
            self.stream_id = stream_id
            self.device = torch.device("xpu", self.device_index)

        def query(self) -> bool:
            return sim.timeline.done(sim.timeline.busy_until)

        def is_capturing(self) -> bool:
            """No XPU graph is being captured (what optimizers ask before a step)."""
            return False

        def synchronize(self) -> None:
            sim.synchronize(self.device_index)

        def wait_event(self, event: Any) -> None:
            """One queue: already in order."""

        def wait_stream(self, stream: Any) -> None:
            """One queue: already in order."""

        def record_event(self, event: Any = None) -> Any:
            event = event or torch.xpu.Event()
            event.record(self)
            return event

        def __eq__(self, other: Any) -> bool:
            return isinstance(other, Stream) and (other.stream_id, other.device_index) == (
                self.stream_id, self.device_index)

        def __hash__(self) -> int:
            return hash((self.stream_id, self.device_index))

    return Stream


def xpu_standin(sim: SimulatedXPU, shape: tuple, dtype: Any, op_seconds: float) -> Any:
    """A tensor on the simulated ``xpu:0`` whose ops each queue ``op_seconds`` of GPU work."""
    return _STANDIN(torch.empty(shape, dtype=dtype, device="meta"), sim.launch, op_seconds)


_STANDIN = simulated_accelerator.device_standin_class("xpu")


def usable() -> Optional[str]:
    """None when this torch can carry the simulation (a CPU-only build), else why not."""
    if torch.version.cuda is not None or torch._C._has_xpu or hasattr(torch._C, "_cuda_getDeviceCount"):
        return (f"--simulate xpu simulates XPU under a CPU-only build of torch; this torch "
                f"{torch.__version__} has a GPU backend of its own")
    return None


def install(patch: Any) -> SimulatedXPU:
    """Wire a fresh :class:`SimulatedXPU` into torch with ``patch`` (a ``pytest.MonkeyPatch``, whose
    ``undo()`` takes it all out again). Call only where :func:`usable` says None."""
    sim = SimulatedXPU()
    xpu = torch.xpu
    functions = {
        "_xpu_getDeviceCount": sim.device_count,
        "_xpu_init": sim.init,
        "_xpu_getDevice": lambda: sim.index,
        "_xpu_setDevice": sim.set_current,
        "_xpu_exchangeDevice": sim.exchange,
        "_xpu_maybeExchangeDevice": sim.exchange,
        "_xpu_synchronize": sim.synchronize,
        "_xpu_getCurrentStream": lambda index: (0, sim._index(index), XPU_TYPE),
        "_xpu_getCurrentRawStream": lambda index: 0,  # torch._dynamo imports it from an XPU build
        "_xpu_memoryStats": sim.memory_stats,
        "_xpu_resetPeakMemoryStats": sim.reset_peak,
        "_xpu_resetAccumulatedMemoryStats": lambda index: None,
        "_xpu_emptyCache": sim.empty_cache,
        "_xpu_getMemoryInfo": sim.memory_info,
        "_xpu_getArchFlags": lambda: "pvc",
    }
    for name, function in functions.items():
        patch.setattr(torch._C, name, function, raising=False)
    patch.setattr(torch._C, "_has_xpu", True)
    patch.setattr(xpu, "_initialized", False)
    patch.setattr(xpu, "_cached_device_count", None)
    patch.setattr(xpu, "_get_device_properties", lambda index: sim.properties, raising=False)
    patch.setattr(xpu, "_exchange_device", sim.exchange)
    patch.setattr(xpu, "_maybe_exchange_device", sim.exchange)
    patch.setattr(xpu, "default_generators", (torch.Generator(),))
    for module in (xpu, xpu.streams):
        patch.setattr(module, "Event", event_class(sim))
        patch.setattr(module, "Stream", stream_class(sim))
    simulated_accelerator.fresh_caches(patch, xpu, ("get_device_capability",))
    simulated_accelerator.wire(patch, sim)
    from torchgpu_magic.timing import clocks

    # %%cudatime's clocks read host and wall time on the simulated clock, as on the H100
    for clock in (clocks.EventClock, clocks.SyncClock):
        patch.setattr(clock, "host_time", staticmethod(sim.clock.now))
    return sim
