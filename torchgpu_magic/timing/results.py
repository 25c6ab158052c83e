"""What a measurement becomes (method step 8): the raw :class:`Run`, its flags (:func:`assess`), and the
result objects that show themselves: :class:`TimingResult`, :class:`TimingComparison` (``--devices`` /
``--threads`` rows) and the ``--kernels`` table.

Every report is one :class:`~torchgpu_magic.render.Report` (text for the terminal, HTML for notebooks)
and plain data for code (``to_dict()``). Nothing here runs the cell; torch is imported only to name a GPU
and to make a ``Measurement``.
"""
from __future__ import annotations

import contextlib
import functools
import math
import platform
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .. import accelerators
from ..render import Fields, Lines, Report, Reportable, Table, fmt_bytes, fmt_percent, fmt_seconds, is_na
from .clocks import Clock, Sample
from .flags import assess, l2_note, other_streams
from .stats import Options, Stats, median, ratio
from .throttle import clock_lines


@dataclass
class Run:
    """The raw outcome of ``engine.measure``; :func:`result_from` makes it a :class:`TimingResult`."""

    samples: list
    loops: int
    first: Sample
    stop: str
    elapsed: float
    warmup_runs: int
    kind: str
    syncs: Optional[int] = 0  # times a warm run waited for the GPU (CUDA clock only; None: not counted)


@dataclass(frozen=True)
class KernelRow:
    """One kernel (CUDA) or op (cpu) of the ``--kernels`` pass, per loop."""

    name: str
    calls: float
    time: float
    share: float


_KIND_WORDS = {"device": "device time", "host": "host time", "wall": "synchronized wall time"}


@dataclass(repr=False)
class TimingResult(Reportable):
    """One ``%%cudatime`` measurement, kept raw as torch's ``Measurement`` keeps it: the per-loop
    headline times of every sample that entered the statistics (``samples``: device time on CUDA, host
    time on cpu, seconds), ``loops`` per sample and the task (``stmt`` and ``setup``, the cell's source);
    the statistics (``median``, ``iqr``, ``ci95``...) are derived from the samples, once.
    :meth:`to_measurement` hands it to ``torch.utils.benchmark.Compare``."""

    device: str
    device_name: str
    torch_version: str
    clock: str
    kind: str
    samples: list
    loops: int
    first_run: float
    host_samples: list
    device_samples: Optional[list]
    wall_samples: Optional[list]
    memory_before: Optional[int]
    memory_peak: Optional[int]
    memory_reserved_growth: Optional[int]
    floor: Optional[float]
    stop_reason: str
    elapsed: float
    warmup_loops: int
    threads: int
    cold: bool = False
    flush_l2: bool = False
    host_syncs: Optional[int] = 0  # None: not counted (cpu, mps, xpu; --warmup 0)
    working_set: Optional[int] = None  # bytes of the storages the first run's ops touched on the device
    l2_cache: Optional[int] = None  # the GPU's L2 cache, bytes
    gpu_busy: Optional[float] = None  # seconds per loop in kernels (their union), from the --kernels pass
    sm_clock: Optional[dict] = None  # throttle.ClockWatch.summary(): NVML's SM clock after each sample
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    kernels: Optional[list] = None
    kernels_empty: Optional[str] = None
    roofline: Optional[Any] = None  # a roofline.Roofline: FLOP/s, bytes/s, bound, % of peak
    magic: str = "%%cudatime"  # the line form's results say %cudatime
    stmt: str = ""  # the statement timed (the cell's body)
    setup: str = ""  # run once before the first run

    # -- derived statistics ------------------------------------------------------------------------------
    @functools.cached_property
    def stats(self) -> Stats:
        """The statistics of :attr:`samples` (median, quartiles, the median's 95 % CI...)."""
        return Stats.of(self.samples)

    median = property(lambda self: self.stats.median, doc="Median seconds per loop.")
    q1 = property(lambda self: self.stats.q1, doc="First quartile, seconds per loop.")
    q3 = property(lambda self: self.stats.q3, doc="Third quartile, seconds per loop.")
    min = property(lambda self: self.stats.min, doc="Fastest sample, seconds per loop.")
    max = property(lambda self: self.stats.max, doc="Slowest sample, seconds per loop.")
    mean = property(lambda self: self.stats.mean, doc="Mean seconds per loop.")
    std = property(lambda self: self.stats.std, doc="Standard deviation of the samples (NaN for one).")
    iqr = property(lambda self: self.stats.iqr, doc="Interquartile range, seconds per loop.")
    ci95 = property(lambda self: (self.stats.ci_low, self.stats.ci_high),
                    doc="The median's distribution-free 95 % confidence interval.")
    n = property(lambda self: len(self.samples), doc="The number of samples.")
    host = property(lambda self: median(self.host_samples), doc="Median host time per loop.")
    device_time = property(lambda self: _median_of(self.device_samples),
                           doc="Median device time per loop (None without a device clock).")
    wall = property(lambda self: _median_of(self.wall_samples),
                    doc="Median synchronized wall time per loop (None where not measured).")

    @property
    def converged(self) -> bool:
        """The stopping rule was met: the median's CI or the IQR within the method's targets."""
        return self.stats.settled() and self.stop_reason != "max-time"

    def __repr__(self) -> str:
        return (f"<TimingResult {self.magic} on {self.device}: {fmt_seconds(self.median)} "
                f"{_KIND_WORDS[self.kind]} per loop, {self.n} x {self.loops:,} loops>")

    # -- the report ------------------------------------------------------------------------------------
    def headline(self) -> str:
        """'50.2 ms device time per loop (median; IQR 12.3 µs, min 50.1 ms; 23 samples x 1 loop)'."""
        loops = f"{self.loops:,} loop{'s' if self.loops != 1 else ''}"
        return (f"{fmt_seconds(self.median)} {_KIND_WORDS[self.kind]} per loop (median; IQR "
                f"{fmt_seconds(self.iqr)}, min {fmt_seconds(self.min)}; {self.n} samples x {loops})")

    def report(self) -> Report:
        """The title; the headline and the roofline's line; the figures per loop and the memory; the
        warnings and notes; the ``--kernels`` table."""
        parts = []
        if self.kind != "host" and self.host is not None:
            parts.append(f"host enqueue {fmt_seconds(self.host)}")
        if self.wall is not None:
            parts.append(f"synchronized wall {fmt_seconds(self.wall)}")
        parts.append(f"first run {fmt_seconds(self.first_run)} (excluded)")
        if self.memory_before is None:
            memory = "N/A (torch keeps no allocator statistics for this device)"
        elif self.memory_peak is None:  # MPS on a torch whose accelerator API does not reach it
            memory = (f"{fmt_bytes(self.memory_before)} allocated before; reserved "
                      f"{fmt_bytes(self.memory_reserved_growth, signed=True)}; peak N/A (torch keeps no peak "
                      "for this device: %gpumem tracks one by sampling)")
        else:
            memory = (f"peak {fmt_bytes(self.memory_peak, signed=True)} above the "
                      f"{fmt_bytes(self.memory_before)} allocated before; reserved "
                      f"{fmt_bytes(self.memory_reserved_growth, signed=True)}")
        achieved = self.roofline.line() if self.roofline is not None else ""
        return Report([Lines([self.headline()] + ([achieved] if achieved else [])),
                       Fields([("per loop", ", ".join(parts)), ("memory", memory)]),
                       Lines(["! " + w for w in self.warnings] + self.notes),
                       *([self.kernel_table()] if self.kernels is not None else [])],
                      title=f"{self.magic} on {self.device} ({self.device_name}), {self.clock}", indent="  ")

    def kernel_table(self) -> Table:
        """The ``--kernels`` table of this result (call only when ``kernels`` is set)."""
        busy = self.gpu_busy / self.device_time if self.gpu_busy and self.device_time else None
        return kernel_table(self.kernels or [], self.device.startswith("cuda"), self.kernels_empty,
                            self.cold or self.flush_l2, busy)

    # -- data ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain data (seconds, bytes; None for N/A): every field, and the statistics derived from them."""
        out = {name: _plain(getattr(self, name)) for name in (*self.__dataclass_fields__, *_DERIVED)}
        out["kernels"] = None if self.kernels is None else [_plain(vars(row)) for row in self.kernels]
        out["roofline"] = None if self.roofline is None else _plain(self.roofline.to_dict())
        return out

    def to_measurement(self, label: Optional[str] = None, sub_label: Optional[str] = None,
                       description: Optional[str] = None) -> Any:
        """This result as a ``torch.utils.benchmark.Measurement``, so that ``Compare`` can put it beside
        others: each sample is one run of ``loops`` loops. ``label`` / ``sub_label`` name Compare's
        group and row, ``description`` its column (the device, unless given); the task is the cell."""
        from torch.utils.benchmark import Measurement, TaskSpec

        task = TaskSpec(self.stmt or "pass", self.setup, label=label, sub_label=sub_label,
                        description=self.device if description is None else description,
                        num_threads=self.threads)
        return Measurement(self.loops, [t * self.loops for t in self.samples], task,
                           metadata={"device": self.device, "device_name": self.device_name,
                                     "clock": self.clock, "kind": self.kind})


_DERIVED = ("median", "q1", "q3", "min", "max", "mean", "std", "ci95", "iqr", "host", "device_time", "wall",
            "converged")


def _median_of(values: Optional[list]) -> Optional[float]:
    return median(values) if values else None


def kernel_table(rows: Sequence[KernelRow], device: bool, empty: Optional[str] = None,
                 hot_only: bool = False, busy: Optional[float] = None) -> Table:
    """The ``--kernels`` rows as a table; ``empty`` says why there are none, ``hot_only`` that the pass
    ran hot although the samples ran with ``--cold`` / ``--flush-l2``, ``busy`` the share of the device
    time the kernels kept the GPU busy."""
    title = "top kernels by device time" if device else "top ops by self CPU time"
    title += f" (separate torch.profiler pass{', run hot: without --cold / --flush-l2' if hot_only else ''})"
    if busy is not None:
        title += f"; the kernels kept the GPU busy {fmt_percent(min(busy, 1.0))} of the device time"
    if not rows:
        title += ": " + (empty or "no torch op ran")
    table = Table(["name", "calls/loop", "time/loop", "share"], align="lrrr", title=title)
    for row in rows:
        name = row.name if len(row.name) <= 70 else row.name[:67] + "..."
        table.add(name, f"{row.calls:.3g}", fmt_seconds(row.time), fmt_percent(row.share))
    return table


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return None if is_na(value) or math.isinf(value) else value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(repr=False)
class TimingComparison(Reportable):
    """Rows of :class:`TimingResult` (``--devices`` / ``--threads``) with speed-up against the first row."""

    rows: list  # [(label, TimingResult)]
    magic: str = "%%cudatime"  # the line form's comparisons say %cudatime

    def speedups(self) -> list:
        base = self.rows[0][1].median
        return [ratio(base, result.median) for _, result in self.rows]

    def table(self) -> Table:
        headers = ["row", "device", "time per loop", "IQR", "min", "samples x loops", "speed-up",
                   "first run", "clock"]
        counted = any(result.roofline is not None for _, result in self.rows)
        headers += ["achieved (% of peak)"] if counted else []
        title = f"{self.magic} comparison (median per loop; speed-up relative to the first row)"
        table = Table(headers, align="llrrrrrrl" + "r" * counted, title=title)
        for (label, result), speedup in zip(self.rows, self.speedups()):
            achieved = [result.roofline.short() if result.roofline is not None else "-"] if counted else []
            table.add(label, result.device_name, fmt_seconds(result.median), fmt_seconds(result.iqr),
                      fmt_seconds(result.min), f"{result.n} x {result.loops:,}", f"{speedup:.2f}x",
                      fmt_seconds(result.first_run), _KIND_WORDS[result.kind], *achieved)
        return table

    def notes(self) -> list:
        """Each row's warnings (prefixed with its label), then its notes; a note every row shares is
        said once, without a label."""
        shared = [n for n in self.rows[0][1].notes if all(n in r.notes for _, r in self.rows)]
        out = []
        for label, result in self.rows:
            out += [f"{label}: ! {w}" for w in result.warnings]
            out += [f"{label}: {n}" for n in result.notes if n not in shared]
        return out + shared

    def report(self) -> Report:
        """The table, then each row's warnings and notes and ``--kernels`` tables, indented."""
        kernels = []
        for label, result in self.rows:
            if result.kernels is not None:
                table = result.kernel_table()
                table.title = f"{label}: {table.title}"
                kernels.append(table)
        return Report([self.table(), Report([Lines(self.notes()), *kernels], indent="  ")])

    def to_dict(self) -> dict:
        return {"rows": [dict(label=label, speedup=_plain(s), **result.to_dict())
                         for (label, result), s in zip(self.rows, self.speedups())]}


# ---- from a run to a result -----------------------------------------------------------------------------
def device_name(device: Any) -> str:
    """A person's name for ``device``: the GPU model, or the CPU model where Linux says it."""
    kind = getattr(device, "type", str(device))
    if kind == "cpu":
        with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
        return platform.processor() or platform.machine() or "CPU"
    return str(device) if kind == "meta" else accelerators.device_name(device)


def result_from(run: Run, clock: Clock, device: Any, memory: tuple, floor: Optional[float],
                opts: Options, threads: int, torch_version: str, name: Optional[str] = None,
                kernels: Optional[tuple] = None, working_set: Optional[int] = None,
                task: tuple = ("", "")) -> TimingResult:
    """Turn a :class:`Run` into a :class:`TimingResult` with its warnings and notes. When the cell's work
    is mostly on streams the events do not see, the headline is the synchronized wall time. ``name`` is
    the device's (None: asked of torch with the L2 size); ``kernels`` is the ``--kernels`` pass (rows, why
    there are none, GPU busy time per loop); ``working_set`` the bytes the first run touched on the
    device; ``task`` the cell's (statement, setup)."""
    rows, empty, busy = kernels if kernels is not None else (None, None, None)
    host = [s.host / s.loops for s in run.samples]
    wall = [s.wall / s.loops for s in run.samples] if run.samples[0].wall is not None else None
    dev = [s.device / s.loops for s in run.samples] if run.samples[0].device is not None else None
    kind = "wall" if run.kind == "device" and other_streams(_median_of(dev), _median_of(wall), run.loops,
                                                            opts.flush_l2, opts.cold) else run.kind
    watch = getattr(clock, "watch", None)
    # an accelerator's last-level cache: CUDA's and ROCm's L2, XPU's (None where torch does not say: MPS)
    on_accelerator = run.kind == "device" and getattr(device, "type", "cpu") != "cpu"
    facts = accelerators.facts(device) if on_accelerator else None
    l2 = facts.cache if facts else None
    if name is None:
        name = facts.name if facts else device_name(device)
    result = TimingResult(
        device=str(device), device_name=name, torch_version=torch_version, clock=clock.label, kind=kind,
        samples=[Clock.primary(s, kind) / s.loops for s in run.samples], loops=run.loops,
        first_run=Clock.primary(run.first, kind), host_samples=host, device_samples=dev, wall_samples=wall,
        memory_before=memory[0], memory_peak=memory[1], memory_reserved_growth=memory[2], floor=floor,
        stop_reason=run.stop, elapsed=run.elapsed, warmup_loops=run.warmup_runs, threads=threads,
        cold=opts.cold, flush_l2=opts.flush_l2, host_syncs=run.syncs, working_set=working_set, l2_cache=l2,
        gpu_busy=busy, sm_clock=watch.summary() if watch is not None else None, kernels=rows,
        kernels_empty=empty, stmt=task[0], setup=task[1])
    stats = result.stats
    clock_warnings, clock_notes = clock_lines(result.sm_clock)
    warnings = assess(stats, kind, result.host, result.device_time, result.wall, run.loops, floor, opts.cold,
                      opts.flush_l2, run.syncs, busy) + clock_warnings
    if run.stop == "max-time":
        warnings.append(f"not converged within --max-time {opts.max_time:g} s: the median's 95 % CI is "
                        f"+-{fmt_percent(stats.rel_ci)} (want < 1 %), IQR/median "
                        f"{fmt_percent(stats.rel_iqr)} (want < 2 %)")
    notes = []
    if run.stop == "fixed" and not stats.settled():
        notes.append(f"-r {result.n}: fixed sample count; the median's 95 % CI is "
                     f"+-{fmt_percent(stats.rel_ci)}")
    if run.kind == "host":
        notes.append("host time (perf_counter): cpu work is finished when the call returns")
    if run.kind == "wall":
        notes.append(f"synchronized wall time (perf_counter around a device synchronize): torch's events "
                     f"cannot time on {device}, so host gaps between launches count too")
    if opts.cold:
        notes.append("--cold: synchronized after every loop" + (
            "; device time from an event pair per loop, each start queued behind a short device-side spin, "
            "so neither the gaps between loops nor launch latency count" if run.kind == "device"
            else " (nothing to synchronize on cpu: same as the default)" if run.kind == "host" else ""))
    if opts.flush_l2:
        what = "twice the L2 cache, at least 256 MiB" if run.kind == "device" else \
            "twice the last-level cache"
        notes.append(f"--flush-l2: {fmt_bytes(clock.flush_bytes)} ({what}) is overwritten before every "
                     "loop, outside the timed span")
    notes += [line for line in [l2_note(working_set, l2, opts.flush_l2)] if line] + clock_notes
    result.warnings, result.notes = warnings, notes
    return result
