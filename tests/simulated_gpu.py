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

The GPU allocates (tests/simulated_allocator.py): every stand-in's storage is a block of torch's CUDA
caching allocator, as the C++ allocator would hand it out, so ``memory_allocated``, ``memory_reserved``,
``max_memory_allocated``, ``memory_stats``, ``memory_snapshot``, ``mem_get_info`` and ``empty_cache``
answer through torch's own Python functions, a request the device cannot hold raises
``torch.OutOfMemoryError`` with torch's message for the figures, a matrix product allocates cuBLAS's
workspace once per thread, and NVML's used memory and process list follow (this process by its PID, under
a host PID or not listed, beside other processes, as :meth:`SimulatedGPU.use_scenario` sets).
"""
from __future__ import annotations

import functools
import math
import os
import sys
import threading
import time
import warnings
from collections import deque
from typing import Any, Optional

import fake_pynvml
import simulated_accelerator
import simulated_allocator
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
# what a matrix product asks of cuBLAS: torch allocates its workspace at the first one on each thread
MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "addmv", "mv"})


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
        return (f"_CudaDeviceProperties(name='{self.name}', major=9, minor=0, "
                f"total_memory={self.total_memory // MiB}MB, multi_processor_count=132, uuid={self.uuid}, "
                "L2_cache_size=50MB)")


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
        self.workspaces: dict = {}  # thread id -> its cuBLAS workspace's storage
        self.memory = self._new_memory()

    def _new_memory(self, scenario: Optional[str] = None) -> simulated_allocator.DeviceMemory:
        chosen = simulated_allocator.SCENARIOS[scenario] if scenario else None
        self._slice(chosen.mig if chosen else None, chosen.total if chosen else None)
        return simulated_allocator.DeviceMemory(
            self.properties.total_memory, lambda: self.current in self.contexts,
            self.nvml_module.machine.gpus[0], chosen)

    def _slice(self, profile: Optional[str], total: Optional[int]) -> None:
        """The H100 whole, or in MIG mode with this process's CUDA device one slice of it: torch names it
        by the slice's profile and UUID and reports the slice's memory; NVML answers for the slice, and
        refuses the whole GPU's process lists (a user without privileges)."""
        gpu = self.nvml_module.machine.gpus[0]
        if profile is None:
            self.properties = Properties(self.uuid.split("-", 1)[1])
            gpu.mig_mode, gpu.migs, gpu.parent_errors = (0, 0), [], {}
            return
        uuid = fake_pynvml.fake_uuid(f"h100-0-{profile}", "MIG-")
        name = f"NVIDIA H100 80GB HBM3 MIG {profile}"
        gpu.mig_mode = (1, 1)
        gpu.migs = [fake_pynvml.FakeMig(uuid, name, total, 0, gpu_instance_id=1, compute_instance_id=0)]
        refused = fake_pynvml._real.NVML_ERROR_NO_PERMISSION
        gpu.parent_errors = {n: refused for n in ("nvmlDeviceGetComputeRunningProcesses",
                                                  "nvmlDeviceGetGraphicsRunningProcesses")}
        self.properties = Properties(uuid.split("-", 1)[1])
        self.properties.name, self.properties.total_memory = name, total

    def use_scenario(self, name: str) -> simulated_allocator.DeviceMemory:
        """What else is on the GPU and how NVML lists this process (simulated_allocator.SCENARIOS); the
        memory starts empty."""
        from torchgpu_magic.gpus import nvml

        self.workspaces.clear()
        self.memory = self._new_memory(name)
        nvml.reset()
        return self.memory

    def cublas_workspace(self) -> None:
        """A matrix product on this thread: cuBLAS's workspace, allocated through the caching allocator
        at the first one (at::cuda::getCurrentCUDABlasHandle's workspace, kept until cleared)."""
        thread = threading.get_ident()
        if thread not in self.workspaces:
            self.work()
            self.workspaces[thread] = simulated_allocator.SimStorage(
                self.memory.allocator, simulated_allocator.CUBLAS_WORKSPACE_SM90)

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
        self.workspaces.clear()
        self.memory = self._new_memory()

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

    def maybe_exchange_device(self, device: int) -> int:
        """``_cuda_maybeExchangeDevice``: here as ``exchange_device``, but its own function, as in torch
        (torch._dynamo keeps one handler per function and refuses the same one twice)."""
        return self.exchange_device(device)

    def work(self) -> None:
        """Anything that runs on the device creates its primary context."""
        if self.current not in self.contexts:
            self.contexts.add(self.current)
            self.memory.changed()

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
        return self.memory.allocator.memory_stats()

    def reset_peaks(self, device: int) -> None:
        self._index(device)
        self.memory.allocator.reset_peaks()

    def empty_cache(self) -> None:
        self.memory.allocator.release_cached()

    def snapshot(self, *args: Any) -> dict:
        return {"segments": self.memory.allocator.snapshot(), "device_traces": [[]], "allocator_settings": {}}

    def clear_workspaces(self) -> None:
        self.workspaces.clear()


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

        def is_capturing(self) -> bool:
            """No CUDA graph is being captured (what optimizers ask torch.accelerator's stream)."""
            return False

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
    its storage: a block of the simulated caching allocator (:class:`simulated_allocator.SimStorage`),
    shared with the tensors viewing it and given back when the last goes, so allocating one moves torch's
    memory figures and may raise torch's out-of-memory error. It holds no data: an op on it works out its
    result's shape on ``meta``, and launches one kernel of ``op_seconds`` on the simulated GPU's
    timeline, as the real op would launch its kernel (views and metadata queries launch none). So what
    needs only shapes, dtypes and devices (which device a cell touched, its FLOPs and bytes as the
    roofline counts them), the GPU time of its kernels and the memory they allocate are there; a value is
    not (``.item()``, printing, a copy to the host fail, as they would without the data)."""

    @staticmethod
    def __new__(cls, meta: torch.Tensor, sim: SimulatedGPU, op_seconds: float,
                storage: Optional[simulated_allocator.SimStorage] = None) -> CudaStandIn:
        return torch.Tensor._make_wrapper_subclass(cls, meta.shape, strides=meta.stride(), dtype=meta.dtype,
                                                   device=torch.device("cuda", 0))

    def __init__(self, meta: torch.Tensor, sim: SimulatedGPU, op_seconds: float,
                 storage: Optional[simulated_allocator.SimStorage] = None) -> None:
        __tracebackhide__ = True  # noqa: F841 - the C++ allocator's place: no frame of the user's
        self.meta, self.sim, self.op_seconds = meta, sim, op_seconds
        if storage is None:
            torch.cuda.init()  # a CUDA tensor initialises torch's CUDA state, as a CUDA build's does
            sim.work()  # cudaMalloc creates the context
            storage = simulated_allocator.SimStorage(sim.memory.allocator, meta.untyped_storage().nbytes())
        self.storage = storage

    def data_ptr(self) -> int:
        return self.storage.data_ptr() + self.meta.storage_offset() * self.meta.element_size()

    def untyped_storage(self) -> simulated_allocator.SimStorage:
        return self.storage

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils._pytree import tree_leaves, tree_map

        __tracebackhide__ = True  # noqa: F841 - a kernel's place: no frame of the user's
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
        if func.overloadpacket.__name__ in MATMULS:
            sim.cublas_workspace()
        # a view or an in-place op's result is the memory of its input; any other result is new memory
        aliases = func.is_view or any(r.alias_info is not None for r in func._schema.returns)
        shared = mine[0].storage if aliases else None
        return tree_map(functools.partial(_wrap, sim=sim, seconds=seconds, shared=shared), out)


def _wrap(value: Any, sim: SimulatedGPU, seconds: float, shared: Any) -> Any:
    """A result of an op on meta as a stand-in (anything else as it is)."""
    __tracebackhide__ = True  # noqa: F841 - machinery
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return CudaStandIn(value, sim, seconds, shared)
    return value


def cuda_standin(sim: SimulatedGPU, shape: tuple, dtype: Any, op_seconds: float) -> CudaStandIn:
    """A :class:`CudaStandIn` of ``shape`` and ``dtype`` whose ops each take ``op_seconds`` of GPU time."""
    return CudaStandIn(torch.empty(shape, dtype=dtype, device="meta"), sim, op_seconds)


class _Cudart:
    """What ``torch.cuda.cudart()`` is asked for here: the free and total memory."""

    def __init__(self, sim: SimulatedGPU) -> None:
        self.sim = sim

    def cudaMemGetInfo(self, device: int) -> tuple:  # noqa: N802 - CUDA's name
        """(free, total) of the device; the call creates the context, as cudaMemGetInfo does."""
        self.sim.get_properties(device)
        self.sim.work()
        return self.sim.memory.mem_get_info()


def usable() -> Optional[str]:
    """None when this torch can carry the simulation, else why not (a CUDA build has its own layer)."""
    if torch.version.cuda is not None or hasattr(torch._C, "_cuda_getDeviceCount"):
        return (f"--simulate-gpu simulates CUDA under a CPU-only build of torch; this torch "
                f"{torch.__version__} is a CUDA build (run the gpu-marked tests on its GPU instead)")
    return None


def install(patch: Any) -> SimulatedGPU:
    """Wire a fresh :class:`SimulatedGPU` into torch and NVML with ``patch`` (a ``pytest.MonkeyPatch``,
    whose ``undo()`` takes it all out again). Call only where :func:`usable` says None."""
    from torchgpu_magic import caches
    from torchgpu_magic.gpus import nvml, processes
    from torchgpu_magic.timing import clocks

    sim = SimulatedGPU()
    C, cuda = torch._C, torch.cuda
    functions = {
        "_cuda_getDeviceCount": sim.device_count,
        "_cuda_init": sim.init,
        "_cuda_getDevice": lambda: sim.current,
        "_cuda_setDevice": sim.set_device,
        "_cuda_exchangeDevice": sim.exchange_device,
        "_cuda_maybeExchangeDevice": sim.maybe_exchange_device,
        "_cuda_synchronize": sim.synchronize,
        "_cuda_sleep": sim.sleep,
        "_cuda_set_sync_debug_mode": sim.set_debug_mode,
        "_cuda_get_sync_debug_mode": lambda: sim.debug_mode,
        "_cuda_hasPrimaryContext": lambda index: index in sim.contexts,
        "_cuda_getArchFlags": lambda: "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
        "_cuda_getCurrentStream": lambda index: (0, sim._index(index), 1),
        "_cuda_getCurrentRawStream": lambda index: 0,  # torch._dynamo imports it from a CUDA build
        "_cuda_memoryStats": sim.memory_stats,
        "_cuda_resetPeakMemoryStats": sim.reset_peaks,
        "_cuda_resetAccumulatedMemoryStats": lambda device: None,
        "_cuda_emptyCache": sim.empty_cache,
        "_cuda_memorySnapshot": sim.snapshot,
        "_cuda_getCublasWorkspaceSize": lambda: simulated_allocator.CUBLAS_WORKSPACE_SM90,
        "_cuda_clearCublasWorkspaces": sim.clear_workspaces,
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
    patch.setattr(cuda, "_maybe_exchange_device", sim.maybe_exchange_device)
    patch.setattr(cuda, "default_generators", (torch.Generator(),))
    for module in (cuda, cuda.streams):
        patch.setattr(module, "Event", event_class(sim))
        patch.setattr(module, "Stream", stream_class(sim))
    caches.reset_caches()  # what this package remembered about the torch it saw before
    patch.setattr(clocks.CudaClock, "host_time", staticmethod(sim.clock.now))
    patch.setitem(sys.modules, "pynvml", sim.nvml_module)
    nvml.reset()
    # The scenario's host PIDs name processes of the host's PID namespace, not this one's: whether a
    # process with that number happens to run here (this machine's PIDs go up to its pid_max, 32768 on
    # some) must not decide what the test sees, so they never exist here, as in the container they stand
    # for.
    real_exists = processes._pid_exists
    patch.setattr(processes, "_pid_exists",
                  lambda pid: pid not in sim.memory.host_pids() and real_exists(pid))
    simulated_accelerator.wire(patch, simulated_accelerator.CudaBackend())  # torch.accelerator over it
    return sim
