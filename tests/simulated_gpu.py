"""One H100 80GB with CUDA 13, simulated under a CPU-only build of torch, as far as torch.cuda goes before
any kernel runs: the suite's third leg (``pytest --simulate-gpu``, in ``make test``) and the scenario tests
of ``%%cudatime``'s decisions (fixture ``simulated_gpu``).

The stand-in sits where a CUDA build's C extension sits: the ``torch._C._cuda_*`` functions the real
``torch.cuda`` Python layer calls (device count, lazy init, properties, current device, synchronize,
``_sleep``, sync debug mode with its one prototype warning, ``_cuda_hasPrimaryContext``, allocator
statistics), plus ``torch.cuda.Event`` / ``Stream``, whose C base classes a CPU build lacks. So
``torch.cuda.is_available()``, ``device_count()``, ``is_initialized()`` (flipped by the real
``_lazy_init``), ``get_device_properties()``, ``current_device()``, ``synchronize()`` and ``device()`` run
torch's own code. NVML is the scripted ``h100`` scenario (tests/fake_pynvml.py), whose SM clock follows
the simulated GPU: 1980 MHz while it has worked in the last 100 ms, else 345 MHz and "idle".

The GPU is a timeline on the simulated machine's clock (:class:`SimulatedTime`: the host's CPU time and
its waits for the GPU, which a loaded machine's preemptions do not move), one stream deep: a kernel
(``_sleep(cycles)``, at the H100's 1980 MHz) starts when the GPU is free, and no sooner than a launch
latency after it was queued; an event completes when the work queued before it has; ``synchronize``
waits for the timeline; a host that has queued :data:`QUEUE_DEPTH` unfinished kernels blocks, as CUDA's
launch queue does. A real CUDA tensor still fails (the CPU build has no CUDA kernels): a test that reaches
one took the CUDA path. Where a test needs a CUDA tensor's metadata and its kernels' time but no values
(the roofline's counts), it makes a :class:`CudaStandIn`.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
import warnings
from collections import deque
from typing import Any, Optional

import fake_pynvml
import torch

SM_CLOCK_HZ = 1980e6  # an H100 SXM5 at its max SM clock (NVML's max_clocks in the h100 scenario)
LAUNCH_S = 5e-6  # from a kernel's launch to its start on an idle GPU (CUDA's launch latency is 2-10 us)
EVENT_S = 1e-6  # from an event's record to its completion on an idle GPU
QUEUE_DEPTH = 1024  # pending launches before the host blocks (CUDA's launch queue)
BUSY_WINDOW_S = 0.1  # NVML reports the boost clock this long after the GPU last worked
MiB = 2**20
PROTOTYPE_WARNING = ("Synchronization debug mode is a prototype feature and does not yet detect all "
                     "synchronizing operations")
SYNC_WARNING = "called a synchronizing CUDA operation"


class SimulatedTime:
    """The simulated machine's clock, in seconds: the CPU time of the thread that installed the simulation
    (the one that runs the cells), plus the host's waits for the GPU. A span on it is what the host did,
    never how long a loaded machine kept the host from running (preemption stops this clock: measured here
    at load 6, a 20 us piece of Python took at most 0.3 ms on it against 24 ms of real time), so what
    %%cudatime derives from the GPU's spans (a kernel's length, a spin that covers the host's launches)
    does not move with the machine's load. A wait for the GPU (a synchronize, an event, a full launch
    queue) takes no real time and sets the clock to the moment waited for. The CUDA clock of %%cudatime
    reads its host and wall times here too (``CudaClock.host_time``), so the host, wall and device figures
    of a sample share one clock and can be compared with each other. Any thread may read it."""

    def __init__(self) -> None:
        self._cpu = time.pthread_getcpuclockid(threading.get_ident())
        self._waited = 0.0

    def now(self) -> float:
        return time.clock_gettime(self._cpu) + self._waited

    def wait_until(self, moment: float) -> None:
        """The host waits for the GPU until ``moment``: the clock moves there."""
        self._waited += max(0.0, moment - self.now())


class Timeline:
    """The simulated GPU's work, in :class:`SimulatedTime` seconds."""

    def __init__(self, clock: SimulatedTime) -> None:
        self.clock = clock
        self.busy_until = -math.inf  # never worked
        self.pending: deque = deque()  # end times of queued kernels

    def launch(self, seconds: float) -> None:
        now = self.clock.now()
        while self.pending and self.pending[0] <= now:
            self.pending.popleft()
        if len(self.pending) >= QUEUE_DEPTH:  # the launch queue is full: the host waits for a slot
            self.clock.wait_until(self.pending.popleft())
            now = self.clock.now()
        start = max(now + LAUNCH_S, self.busy_until)
        self.busy_until = start + seconds
        self.pending.append(self.busy_until)

    def stamp(self) -> float:
        """When an event recorded now completes."""
        return max(self.clock.now() + EVENT_S, self.busy_until)

    def done(self, moment: float) -> bool:
        """Whether the GPU has reached ``moment``."""
        return self.clock.now() >= moment

    def busy_recently(self) -> bool:
        return self.clock.now() - self.busy_until < BUSY_WINDOW_S


class Properties:
    """``torch.cuda.get_device_properties(0)`` of an H100 80GB HBM3 as torch 2.13 reports it."""

    def __init__(self, uuid: str) -> None:
        self.name = "NVIDIA H100 80GB HBM3"
        self.major, self.minor = 9, 0
        self.total_memory = 81008 * MiB
        self.multi_processor_count = 132
        self.L2_cache_size = 50 * MiB
        self.uuid = uuid
        self.pci_bus_id, self.pci_device_id, self.pci_domain_id = 0x18, 0, 0
        self.is_integrated = self.is_multi_gpu_board = 0
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.memory_clock_rate, self.memory_bus_width, self.clock_rate = 2619000, 5120, 1980000

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major=9, minor=0, total_memory=81008MB, "
                f"multi_processor_count=132, uuid={self.uuid}, L2_cache_size=50MB)")


class SimulatedGPU:
    """The simulated device's state; :func:`install` wires it into torch and NVML."""

    def __init__(self) -> None:
        self.nvml_module = fake_pynvml.make("h100", self._link_clocks)
        self.uuid = self.nvml_module.machine.gpus[0].uuid
        self.properties = Properties(self.uuid.split("-", 1)[1])
        self.clock = SimulatedTime()
        self.timeline = Timeline(self.clock)
        self.contexts: set = set()
        self.current = 0
        self.debug_mode = 0
        self.warned_prototype = False

    def _link_clocks(self, machine: Any) -> None:
        gpu = machine.gpus[0]
        gpu.clocks = {"sm": lambda: 1980 if self.timeline.busy_recently() else 345, "mem": 2619}
        idle = fake_pynvml._real.nvmlClocksEventReasonGpuIdle
        gpu.clock_reasons = lambda: 0 if self.timeline.busy_recently() else idle

    def reset(self) -> None:
        """CUDA not initialised, no context, an idle GPU (a fresh process, as far as the tests can tell)."""
        torch.cuda._initialized = False
        torch.cuda._cached_device_count = None
        self.timeline = Timeline(self.clock)
        self.contexts.clear()
        self.current = 0
        self.debug_mode = 0
        self.warned_prototype = False

    # ---- torch._C._cuda_* ------------------------------------------------------------------------
    def device_count(self) -> int:
        """1, or 0 where CUDA_VISIBLE_DEVICES hides the GPU (as cudaGetDeviceCount reads it)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return 1
        first = visible.split(",")[0].strip()
        if first.upper().startswith("GPU-"):
            return int(self.uuid.lower().startswith(first.lower()))
        return int(first.isdigit() and int(first) == 0)

    def init(self) -> None:
        if not self.device_count():
            raise RuntimeError("No CUDA GPUs are available")

    def _index(self, device: Any) -> int:
        index = self.current if device is None or device < 0 else int(device)
        if index >= self.device_count():
            raise RuntimeError("CUDA error: invalid device ordinal")
        return index

    def get_properties(self, device: int) -> Properties:
        self._index(device)
        return self.properties

    def set_device(self, device: int) -> None:
        self.current = self._index(device)

    def exchange_device(self, device: int) -> int:
        if device < 0:
            return -1
        before, self.current = self.current, self._index(device)
        return before

    def work(self) -> None:
        """Anything that runs on the device creates its primary context."""
        self.contexts.add(self.current)

    def synchronize(self) -> None:
        self.work()
        self.clock.wait_until(self.timeline.busy_until)

    def sleep(self, cycles: int) -> None:
        self.work()
        self.timeline.launch(int(cycles) / SM_CLOCK_HZ)

    def set_debug_mode(self, mode: int) -> None:
        if not self.warned_prototype:  # TORCH_WARN_ONCE in torch/csrc/cuda/Module.cpp
            self.warned_prototype = True
            warnings.warn(PROTOTYPE_WARNING, UserWarning, stacklevel=3)
        if mode not in (0, 1, 2):
            raise RuntimeError("invalid value of debug_mode, expected one of 0,1,2")
        self.debug_mode = mode

    def host_sync(self) -> None:
        """A synchronizing operation (cudaStreamSynchronize): flagged by the sync debug mode, then waits."""
        if self.debug_mode == 2:
            raise RuntimeError(SYNC_WARNING)
        if self.debug_mode == 1:
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=3)
        self.synchronize()

    def memory_stats(self, device: int) -> dict:
        self._index(device)
        zero = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
        return {key: {"all": dict(zero)} for key in ("allocated_bytes", "reserved_bytes", "active_bytes")}


def event_class(sim: SimulatedGPU) -> type:
    """``torch.cuda.Event`` on the simulated timeline."""

    class Event:
        def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                     external: bool = False) -> None:
            self.enable_timing = enable_timing
            self.moment: Optional[float] = None

        def record(self, stream: Any = None) -> None:
            sim.work()
            self.moment = sim.timeline.stamp()

        def wait(self, stream: Any = None) -> None:
            """A stream waiting for this event: one stream deep, the wait is already in order."""

        def query(self) -> bool:
            return self.moment is None or sim.timeline.done(self.moment)

        def synchronize(self) -> None:
            if self.moment is not None:
                sim.clock.wait_until(self.moment)

        def elapsed_time(self, end: Any) -> float:
            if not (self.enable_timing and end.enable_timing):
                raise ValueError("Both events must be created with argument 'enable_timing=True'.")
            if self.moment is None or end.moment is None or not end.query():
                raise RuntimeError("CUDA error: device not ready")
            # a GPU's event timestamps are whole nanoseconds: the span of a 1.5 ms kernel reads 1.5 ms, never
            # the 1.4999999985 ms that subtracting two clock readings far from zero can leave
            return round((end.moment - self.moment) * 1e9) / 1e6

    return Event


def stream_class(sim: SimulatedGPU) -> type:
    """``torch.cuda.Stream`` on the simulated timeline (every stream is the one timeline)."""

    class Stream:
        def __init__(self, device: Any = None, priority: int = 0, stream_id: int = 0,
                     device_index: Optional[int] = None, device_type: int = 1) -> None:
            self.device_index = sim.current if device_index is None else device_index
            self.stream_id = stream_id
            self.device = torch.device("cuda", self.device_index)

        def query(self) -> bool:
            return sim.timeline.done(sim.timeline.busy_until)

        def synchronize(self) -> None:
            sim.host_sync()

        def wait_event(self, event: Any) -> None:
            """One timeline: already in order."""

        def wait_stream(self, stream: Any) -> None:
            """One timeline: already in order."""

        def record_event(self, event: Any = None) -> Any:
            event = event or torch.cuda.Event()
            event.record(self)
            return event

        def __eq__(self, other: Any) -> bool:
            return isinstance(other, Stream) and (other.stream_id, other.device_index) == (
                self.stream_id, self.device_index)

        def __hash__(self) -> int:
            return hash((self.stream_id, self.device_index))

    return Stream


class CudaStandIn(torch.Tensor):
    """A tensor on the simulated ``cuda:0`` as far as its metadata goes: device, shape, dtype, strides, and
    an address of its own (two stand-ins never alias, as two real allocations do not). It holds no data:
    an op on it works out its result's shape on ``meta``, and launches one kernel of ``op_seconds`` on
    the simulated GPU's timeline, as the real op would launch its kernel (views and metadata queries
    launch none). So what needs only shapes, dtypes and devices (which device a cell touched, its FLOPs
    and bytes as the roofline counts them) and the GPU time of its kernels are there; a value is not
    (``.item()``, printing, a copy to the host fail, as they would without the data)."""

    _next_address = 0x7F0000000000

    @staticmethod
    def __new__(cls, meta: torch.Tensor, sim: SimulatedGPU, op_seconds: float) -> CudaStandIn:
        return torch.Tensor._make_wrapper_subclass(cls, meta.shape, strides=meta.stride(), dtype=meta.dtype,
                                                   device=torch.device("cuda", 0))

    def __init__(self, meta: torch.Tensor, sim: SimulatedGPU, op_seconds: float) -> None:
        self.meta, self.sim, self.op_seconds = meta, sim, op_seconds
        self.address = CudaStandIn._next_address
        CudaStandIn._next_address += max(1, meta.untyped_storage().nbytes()) + 512

    def data_ptr(self) -> int:
        return self.address

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils._pytree import tree_leaves, tree_map

        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        mine = [t for t in leaves if isinstance(t, CudaStandIn)]
        if any(isinstance(t, torch.Tensor) and not isinstance(t, CudaStandIn) and t.dim() for t in leaves):
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                               "devices, cuda:0 and cpu!")  # what CUDA says (a 0-dim cpu tensor is allowed)
        # on meta: a value read (.item(), a copy to the host) fails there too, as data that is not here
        out = func(*tree_map(lambda t: t.meta if isinstance(t, CudaStandIn) else t, args),
                   **tree_map(lambda t: t.meta if isinstance(t, CudaStandIn) else t, kwargs))
        sim, seconds = mine[0].sim, mine[0].op_seconds
        if not func.is_view:
            sim.sleep(int(seconds * SM_CLOCK_HZ))
        return tree_map(lambda t: CudaStandIn(t, sim, seconds)
                        if isinstance(t, torch.Tensor) and t.device.type == "meta" else t, out)


def cuda_standin(sim: SimulatedGPU, shape: tuple, dtype: Any, op_seconds: float) -> CudaStandIn:
    """A :class:`CudaStandIn` of ``shape`` and ``dtype`` whose ops each take ``op_seconds`` of GPU time."""
    return CudaStandIn(torch.empty(shape, dtype=dtype, device="meta"), sim, op_seconds)


class _Cudart:
    """What ``torch.cuda.cudart()`` is asked for here: the free and total memory."""

    def __init__(self, sim: SimulatedGPU) -> None:
        self.sim = sim

    def cudaMemGetInfo(self, device: int) -> tuple:  # noqa: N802 - CUDA's name
        total = self.sim.get_properties(device).total_memory
        return total, total


def usable() -> Optional[str]:
    """None when this torch can carry the simulation, else why not (a CUDA build has its own layer)."""
    if torch.version.cuda is not None or hasattr(torch._C, "_cuda_getDeviceCount"):
        return (f"--simulate-gpu simulates CUDA under a CPU-only build of torch; this torch "
                f"{torch.__version__} is a CUDA build (run the gpu-marked tests on its GPU instead)")
    return None


def install(patch: Any) -> SimulatedGPU:
    """Wire a fresh :class:`SimulatedGPU` into torch and NVML with ``patch`` (a ``pytest.MonkeyPatch``,
    whose ``undo()`` takes it all out again). Call only where :func:`usable` says None."""
    from torchgpu_magic import accelerators
    from torchgpu_magic.gpus import nvml
    from torchgpu_magic.timing import clocks, engine

    sim = SimulatedGPU()
    C, cuda = torch._C, torch.cuda
    functions = {
        "_cuda_getDeviceCount": sim.device_count,
        "_cuda_init": sim.init,
        "_cuda_getDevice": lambda: sim.current,
        "_cuda_setDevice": sim.set_device,
        "_cuda_exchangeDevice": sim.exchange_device,
        "_cuda_maybeExchangeDevice": sim.exchange_device,
        "_cuda_synchronize": sim.synchronize,
        "_cuda_sleep": sim.sleep,
        "_cuda_set_sync_debug_mode": sim.set_debug_mode,
        "_cuda_get_sync_debug_mode": lambda: sim.debug_mode,
        "_cuda_hasPrimaryContext": lambda index: index in sim.contexts,
        "_cuda_getArchFlags": lambda: "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
        "_cuda_getCurrentStream": lambda index: (0, sim._index(index), 1),
        "_cuda_getCurrentRawStream": lambda index: 0,  # torch._dynamo imports it from a CUDA build
        "_cuda_memoryStats": sim.memory_stats,
        "_cuda_resetPeakMemoryStats": lambda device: None,
        "_cuda_resetAccumulatedMemoryStats": lambda device: None,
        "_cuda_emptyCache": lambda: None,
    }
    for name, function in functions.items():
        patch.setattr(C, name, function, raising=False)
    patch.setattr(torch.version, "cuda", "13.0")
    patch.setattr(cuda, "_cudart", _Cudart(sim))
    patch.setattr(cuda, "_initialized", False)
    patch.setattr(cuda, "_cached_device_count", None)
    patch.setattr(cuda, "_device_count_nvml", lambda: -1)
    patch.setattr(cuda, "_get_device_properties", sim.get_properties, raising=False)
    patch.setattr(cuda, "_exchange_device", sim.exchange_device)
    patch.setattr(cuda, "_maybe_exchange_device", sim.exchange_device)
    patch.setattr(cuda, "default_generators", (torch.Generator(),))
    for module in (cuda, cuda.streams):
        patch.setattr(module, "Event", event_class(sim))
        patch.setattr(module, "Stream", stream_class(sim))
    # what this package remembered about the torch it saw before
    patch.setattr(accelerators, "_CPU_ONLY", None)
    patch.setattr(engine, "_FLOORS", {})
    patch.setattr(clocks, "_SPIN_CYCLES", {}, raising=False)
    patch.setattr(clocks.CudaClock, "host_time", staticmethod(sim.clock.now))
    patch.setitem(sys.modules, "pynvml", sim.nvml_module)
    nvml.reset()
    return sim
