"""A MacBook Pro with an Apple M2 Max (38-core GPU, 32 GB of unified memory) on macOS 14.5, simulated under
a CPU-only build of torch as far as torch's MPS backend goes before any kernel runs: the ``mps`` leg
(``pytest --simulate mps``) and the fixture ``simulated_mps``.

The stand-in sits where an MPS build's C extension sits: the ``torch._C._mps_*`` functions the real
``torch.mps`` / ``torch.backends.mps`` Python layer calls (availability, the macOS check, the device's
name and core count, synchronize, the allocator's current and driver-allocated memory and its
recommended maximum, timing events), ``torch._C._has_mps``, and the generic accelerator API
(tests/simulated_accelerator.py) as torch 2.11 answers it for MPS: the current accelerator is ``mps``,
but its memory functions fail ("Allocator for mps is not a DeviceAllocator"), so torch keeps no peak.
``sysctl``, which the extension asks for the chip and the machine, is a script on ``PATH`` answering as
this Mac does. A real MPS tensor still fails (the CPU build has no MPS kernels).

Figures from real machines: Metal's ``recommendedMaxWorkingSetSize`` of a 32 GB M2 Max is two thirds of
its memory, 21845.34 MiB (ollama/ollama#434, llama.cpp's ``ggml_metal_init`` log on that Mac); the MPS
allocator's high watermark is 1.7 times that by default (``PYTORCH_MPS_HIGH_WATERMARK_RATIO``, torch's
docs "MPS Environment Variables"), and past it ``MPSAllocator.mm`` raises "MPS backend out of memory (MPS
allocated: ..., other allocations: ..., max allowed: ...). Tried to allocate ... on private pool. Use
PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may cause system
failure)." (tests/oom_wordings.py quotes two from user reports).
"""
from __future__ import annotations

import os
import stat
import tempfile
from typing import Any, Optional

import simulated_accelerator
import torch
from simulated_accelerator import Backend, EventClock, GiB, Ledger
from simulated_gpu import SimulatedTime, Timeline

MPS_TYPE = 13  # c10::DeviceType::MPS
# MPSGuardImpl's only stream: Stream::DEFAULT (id 0) on mps:0. Built once here: a torch call in the stand-in
# would be traced by Dynamo, which asks for the current stream while it compiles (C++ in torch, never traced)
DEFAULT_STREAM = torch.Stream(stream_id=0, device_index=0, device_type=MPS_TYPE)

CHIP = "Apple M2 Max"
GPU_CORES = 38
MEMSIZE = 32 * GiB
RECOMMENDED = MEMSIZE * 2 // 3  # 21845.33 MiB
HIGH_WATERMARK = 1.7
MACOS = (14, 5)
SYSCTL = {
    "machdep.cpu.brand_string": CHIP,
    "hw.memsize": str(MEMSIZE),
    "hw.optional.arm64": "1",
    "sysctl.proc_translated": "0",
    "kern.osproductversion": ".".join(map(str, MACOS)),
}


def gb(nbytes: float) -> str:
    """MPSAllocator's ``format_size`` (torch 2.6 and later spell binary units): two decimals."""
    for unit, scale in (("GiB", GiB), ("MiB", 2**20), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} bytes"


class SimulatedMPS(Backend):
    """The M2 Max's state; :func:`install` wires it into torch and ``PATH``."""

    kind = "mps"
    lazy = False
    device_allocator = False  # torch 2.11: MPSAllocator is not yet a c10::DeviceAllocator

    def __init__(self) -> None:
        self.clock = SimulatedTime()  # the installing thread's CPU time plus its waits (simulated_gpu)
        self.timeline = Timeline(self.clock)
        self.ledger = Ledger(RECOMMENDED)
        self.driver = 0  # what the Metal driver allocated for this process (the allocator's heaps)
        self.events: dict = {}
        self.next_event = 1
        self.sysctl_dir = tempfile.mkdtemp(prefix="simulated-mps-")
        self.watermark = HIGH_WATERMARK
        self.generator = torch.Generator()

    def reset(self) -> None:
        self.timeline = Timeline(self.clock)
        self.ledger = Ledger(RECOMMENDED)
        self.driver = 0
        self.events.clear()

    # ---- the allocator ------------------------------------------------------------------------------
    def max_allowed(self) -> int:
        return int(self.watermark * RECOMMENDED)

    def allocate(self, nbytes: int) -> None:
        """A tensor of ``nbytes`` on mps: past the high watermark, MPSAllocator's error."""
        other = self.driver - self.ledger.allocated
        if self.ledger.allocated + other + nbytes > self.max_allowed():
            raise RuntimeError(  # TORCH_CHECK(false, ...) in alloc_buffer_block
                f"MPS backend out of memory (MPS allocated: {gb(self.ledger.allocated)}, other allocations: "
                f"{gb(other)}, max allowed: {gb(self.max_allowed())}). Tried to allocate {gb(nbytes)} on "
                "private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory "
                "allocations (may cause system failure).")
        self.ledger.allocate(nbytes)
        self.driver = max(self.driver, self.ledger.reserved)

    def free(self, nbytes: int) -> None:
        self.ledger.free(nbytes)

    def empty_cache(self) -> None:
        self.ledger.empty_cache()
        self.driver = self.ledger.reserved

    # ---- the device ---------------------------------------------------------------------------------
    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of GPU work (a command buffer) on the one MPS stream."""
        self.timeline.launch(seconds)

    def synchronize(self, index: int = 0) -> None:
        self.clock.wait_until(self.timeline.busy_until)

    def current(self) -> int:
        return 0

    def set_current(self, index: int) -> None:
        if index != 0:
            raise RuntimeError("Invalid device index for MPS: only 0 exists")

    def stream(self, index: int) -> Any:
        """What MPSGuardImpl::getStream gives for any device: the default stream of mps:0, the one
        command queue; torch.compile's Dynamo asks for it while tracing."""
        return DEFAULT_STREAM

    def device_stats(self, index: int) -> dict:
        raise simulated_accelerator.not_a_device_allocator("mps")

    def reset_peak(self, index: int) -> None:
        raise simulated_accelerator.not_a_device_allocator("mps")

    def memory_info(self, index: int) -> tuple:
        raise simulated_accelerator.not_a_device_allocator("mps")

    # ---- events (torch/mps/event.py over torch._C._mps_*Event) ------------------------------------
    def acquire_event(self, enable_timing: bool) -> int:
        ident, self.next_event = self.next_event, self.next_event + 1
        self.events[ident] = [bool(enable_timing), None]
        return ident

    def record_event(self, ident: int) -> None:
        self.events[ident][1] = self.timeline.stamp()

    def query_event(self, ident: int) -> bool:
        return EventClock.done(self.timeline, self.events[ident][1])

    def synchronize_event(self, ident: int) -> None:
        moment = self.events[ident][1]
        if moment is not None:
            self.clock.wait_until(moment)

    def elapsed(self, start: int, end: int) -> float:
        first, last = self.events[start], self.events[end]
        if not (first[0] and last[0]):
            raise RuntimeError("Events were not created with argument 'enable_timing=True'")
        if first[1] is None or last[1] is None:
            raise RuntimeError("Events were not recorded")
        self.synchronize_event(end)  # MPSEvent's elapsed time waits for the end event
        return EventClock.span_ms(first[1], last[1])

    # ---- sysctl -------------------------------------------------------------------------------------
    def write_sysctl(self) -> str:
        """A ``sysctl`` on ``PATH`` answering ``sysctl -n NAME`` as this Mac does, 'unknown oid' else."""
        cases = "".join(f"  {name}) echo '{value}' ;;\n" for name, value in SYSCTL.items())
        path = os.path.join(self.sysctl_dir, "sysctl")
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\n[ \"$1\" = -n ] && shift\ncase \"$1\" in\n" + cases
                         + "  *) echo \"sysctl: unknown oid '$1'\" >&2; exit 1 ;;\nesac\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        return self.sysctl_dir


def mps_standin(sim: SimulatedMPS, shape: tuple, dtype: Any, op_seconds: float) -> Any:
    """A tensor on the simulated ``mps`` whose ops each queue ``op_seconds`` of GPU work."""
    return _STANDIN(torch.empty(shape, dtype=dtype, device="meta"), sim.launch, op_seconds)


_STANDIN = simulated_accelerator.device_standin_class("mps")


def usable() -> Optional[str]:
    """None when this torch can carry the simulation (a CPU-only build), else why not."""
    if torch.version.cuda is not None or torch._C._has_mps or hasattr(torch._C, "_cuda_getDeviceCount"):
        return (f"--simulate mps simulates MPS under a CPU-only build of torch; this torch "
                f"{torch.__version__} has a GPU backend of its own")
    return None


def install(patch: Any) -> SimulatedMPS:
    """Wire a fresh :class:`SimulatedMPS` into torch and ``PATH`` with ``patch`` (a ``pytest.MonkeyPatch``,
    whose ``undo()`` takes it all out again). Call only where :func:`usable` says None."""
    sim = SimulatedMPS()
    functions = {
        "_mps_is_available": lambda: True,
        "_mps_is_on_macos_or_newer": lambda major, minor: MACOS >= (major, minor),
        "_mps_get_name": lambda: CHIP,
        "_mps_get_core_count": lambda: GPU_CORES,
        "_mps_deviceSynchronize": sim.synchronize,
        "_mps_emptyCache": sim.empty_cache,
        "_mps_currentAllocatedMemory": lambda: sim.ledger.allocated,
        "_mps_driverAllocatedMemory": lambda: sim.driver,
        "_mps_recommendedMaxMemory": lambda: RECOMMENDED,
        "_mps_setMemoryFraction": lambda fraction: setattr(sim, "watermark", float(fraction) or 1e9),
        "_mps_acquireEvent": sim.acquire_event,
        "_mps_releaseEvent": lambda ident: sim.events.pop(ident, None),
        "_mps_recordEvent": sim.record_event,
        "_mps_waitForEvent": lambda ident: None,  # one stream: the wait is already in order
        "_mps_queryEvent": sim.query_event,
        "_mps_synchronizeEvent": sim.synchronize_event,
        "_mps_elapsedTimeOfEvents": sim.elapsed,
        "_mps_get_default_generator": lambda: sim.generator,  # what torch.manual_seed seeds
    }
    for name, function in functions.items():
        patch.setattr(torch._C, name, function, raising=False)
    patch.setattr(torch._C, "_has_mps", True)
    patch.setattr(torch.mps, "_default_mps_generator", None)
    simulated_accelerator.fresh_caches(patch, torch.backends.mps, (
        "is_available", "is_macos_or_newer", "is_macos13_or_newer", "get_name", "get_core_count"))
    simulated_accelerator.wire(patch, sim)
    patch.setenv("PATH", sim.write_sysctl() + os.pathsep + os.environ.get("PATH", ""))
    _forget_apple_facts(patch)
    from torchgpu_magic.timing import clocks

    # %%cudatime's clocks read host and wall time on the simulated clock, as on the H100
    for clock in (clocks.EventClock, clocks.SyncClock):
        patch.setattr(clock, "host_time", staticmethod(sim.clock.now))
    return sim


def _forget_apple_facts(patch: Any) -> None:
    """The extension reads sysctl once per process: forget what it read before the simulation."""
    from torchgpu_magic.gpus import apple

    patch.setattr(apple, "_FACTS", None)

