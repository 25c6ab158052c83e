"""The ``%%cudatime`` engine: compile a cell once, clock it correctly, decide when to stop, and report.

``%time`` and ``%timeit`` read a host clock and never synchronize, so for GPU work they measure how long
it took to *queue* kernels. This package follows ``docs/timing-method.md``, one concern per module:

- :mod:`.cells`: compile the cell once into a loop (no ``exec`` per loop); silence its output.
- :mod:`.clocks`: CUDA events, or ``perf_counter`` with or without a device synchronize; which device
  to time on (a pure function of the default device and whether CUDA is in use); allocator figures
  around a measurement.
- :mod:`.stats`: median, quartiles and the median's confidence interval; the 1-2-5 loop counts; the
  stopping rule and the :class:`Options` that set its limits.
- :mod:`.engine`: first run apart, auto-range, warm-up, samples; the empty-cell floor, ``--kernels``,
  and :func:`time_cell`, a whole measurement.
- :mod:`.results`: the flags, :class:`TimingResult`, :class:`TimingComparison` and the kernel table.
- :mod:`.roofline`: achieved FLOP/s and bytes/s, the bound and the % of peak, from :mod:`.counting`
  (FLOPs and bytes of one extra, untimed run) and :mod:`.peaks` (the datasheet table, the SM clock).

The arrows point one way: engine imports cells, clocks, results, stats and (lazily) roofline; results
imports clocks and stats, clocks imports cells; roofline imports peaks and (lazily) counting, the only
module that imports torch at its top. Nothing here imports IPython; torch is imported lazily. The names
callers use are re-exported here.
"""
from __future__ import annotations

from .cells import compile_cell, silenced
from .clocks import (
    Clock,
    MemoryProbe,
    Sample,
    check_device,
    choose_device,
    cpu_cache_bytes,
    sleep_cycles_per_ms,
    timing_device,
)
from .engine import WARMUP_MIN_RUNS, empty_cell_floor, measure, time_cell
from .results import KernelRow, TimingComparison, TimingResult, assess, kernel_table, result_from
from .roofline import Roofline, parse_peak
from .stats import FLOOR_SAMPLES, Options, Stats, loops_for, next_loops, stop_reason

__all__ = [
    "FLOOR_SAMPLES", "WARMUP_MIN_RUNS", "Clock", "KernelRow", "MemoryProbe", "Options", "Roofline", "Sample",
    "Stats", "TimingComparison", "TimingResult", "assess", "check_device", "choose_device", "compile_cell",
    "cpu_cache_bytes", "empty_cell_floor", "kernel_table", "loops_for", "measure", "next_loops",
    "parse_peak", "result_from", "silenced", "sleep_cycles_per_ms", "stop_reason", "time_cell",
    "timing_device",
]
