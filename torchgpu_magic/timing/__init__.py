"""The ``%%cudatime`` engine: compile a cell once, clock it correctly, decide when to stop, and report.

``%time`` and ``%timeit`` read a host clock and never synchronize, so for GPU work they measure how long
it took to *queue* kernels. This package follows ``docs/timing-method.md``, one concern per module:

- :mod:`.cells`: compile the cell once into a loop (no ``exec`` per loop); silence its output.
- :mod:`.clocks`: the backend's events (CUDA, ROCm, XPU, MPS), or ``perf_counter`` with or without a
  device synchronize; the cell's waits for the GPU; allocator figures around a measurement.
- :mod:`.observe`: what the setup and first run touched (a ``TorchDispatchMode``), and from it which
  device to time on (a pure function of the default device and the devices touched); the tensors of an
  op, read the same way by the roofline's counter.
- :mod:`.throttle`: the GPU's SM clock and its reasons from NVML after every sample.
- :mod:`.stats`: median, quartiles and the median's confidence interval; the 1-2-5 loop counts; the
  stopping rule and the :class:`Options` that set its limits.
- :mod:`.engine`: first run apart, auto-range, warm-up, samples; the empty-cell floor, ``--kernels``,
  and :func:`time_cell`, a whole measurement.
- :mod:`.flags`: the warnings and notes (noise, floor, launch-bound from the GPU's idle time, other
  streams, the L2 note).
- :mod:`.results`: :class:`TimingResult`, :class:`TimingComparison` and the kernel table.
- :mod:`.roofline`: achieved FLOP/s and bytes/s, the bound and the % of peak, from :mod:`.counting`
  (FLOPs and bytes of one extra, untimed run, with the FLOP formulas of :mod:`.formulas` beside torch's:
  causal attention, the fused ops of ``nn`` modules' eval fast paths) and :mod:`.peaks` (the datasheet
  table, scaled to the SM clock :mod:`.throttle` read after the samples).

The arrows point one way: engine imports the others, results imports clocks, flags, stats and
throttle, clocks imports cells (and throttle, lazily), flags imports stats, throttle imports stats;
roofline imports peaks and (lazily) counting; counting imports formulas and observe. Nothing here
imports IPython; torch is imported lazily, at the top only by counting. The names callers use are
re-exported here.
"""
from __future__ import annotations

from .cells import compile_cell, silenced
from .clocks import Clock, MemoryProbe, Sample, check_device, cpu_cache_bytes, sleep_cycles_per_ms
from .engine import WARMUP_MIN_RUNS, empty_cell_floor, measure, time_cell
from .flags import assess
from .observe import Touched, choose_device, timing_device, watch
from .results import KernelRow, TimingComparison, TimingResult, kernel_table, result_from
from .roofline import Roofline, parse_peak
from .stats import FLOOR_SAMPLES, Options, Stats, loops_for, next_loops, stop_reason

__all__ = [
    "FLOOR_SAMPLES", "WARMUP_MIN_RUNS", "Clock", "KernelRow", "MemoryProbe", "Options", "Roofline", "Sample",
    "Stats", "TimingComparison", "TimingResult", "assess", "check_device", "choose_device", "compile_cell",
    "cpu_cache_bytes", "empty_cell_floor", "kernel_table", "loops_for", "measure", "next_loops",
    "parse_peak", "result_from", "silenced", "sleep_cycles_per_ms", "stop_reason", "time_cell",
    "timing_device", "Touched", "watch",
]
