"""What a measurement becomes (method step 8): the raw :class:`Run`, its flags (:func:`assess`), and the
result objects that show themselves: :class:`TimingResult`, :class:`TimingComparison` (``--devices`` /
``--threads`` rows) and the ``--kernels`` table.

Every report is text for the terminal (``_repr_pretty_``), HTML for notebooks (``_repr_html_``) and plain
data for code (``to_dict()``). Nothing here runs the cell; torch is imported only to name a GPU.
"""
from __future__ import annotations

import contextlib
import math
import platform
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .. import accelerators
from ..render import Table, fmt_bytes, fmt_percent, fmt_seconds, html_lines, is_na
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


@dataclass
class TimingResult:
    """One ``%%cudatime`` measurement. Times are seconds per loop; ``samples`` are the per-loop headline
    times (device time on CUDA, host time on cpu) of every sample that entered the statistics."""

    device: str
    device_name: str
    torch_version: str
    clock: str
    kind: str
    samples: list
    loops: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    mean: float
    std: float
    ci95: tuple
    first_run: float
    host: Optional[float]
    device_time: Optional[float]
    wall: Optional[float]
    host_samples: list
    device_samples: Optional[list]
    wall_samples: Optional[list]
    memory_before: Optional[int]
    memory_peak: Optional[int]
    memory_reserved_growth: Optional[int]
    floor: Optional[float]
    converged: bool
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

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def n(self) -> int:
        return len(self.samples)

    # -- text ----------------------------------------------------------------------------------------
    def headline(self) -> str:
        """'50.2 ms device time per loop (median; IQR 12.3 µs, min 50.1 ms; 23 samples x 1 loop)'."""
        loops = f"{self.loops:,} loop{'s' if self.loops != 1 else ''}"
        return (f"{fmt_seconds(self.median)} {_KIND_WORDS[self.kind]} per loop (median; IQR "
                f"{fmt_seconds(self.iqr)}, min {fmt_seconds(self.min)}; {self.n} samples x {loops})")

    def detail_lines(self) -> list:
        """The figures under the headline (method step 8), then warnings and notes."""
        parts = []
        if self.kind != "host" and self.host is not None:
            parts.append(f"host enqueue {fmt_seconds(self.host)}")
        if self.wall is not None:
            parts.append(f"synchronized wall {fmt_seconds(self.wall)}")
        parts.append(f"first run {fmt_seconds(self.first_run)} (excluded)")
        lines = ["per loop: " + ", ".join(parts)]
        if self.memory_before is None:
            lines.append("memory: N/A (torch keeps no allocator statistics for this device)")
        elif self.memory_peak is None:  # MPS on a torch whose accelerator API does not reach it
            lines.append(f"memory: {fmt_bytes(self.memory_before)} allocated before; reserved "
                         f"{fmt_bytes(self.memory_reserved_growth, signed=True)}; peak N/A (torch keeps no "
                         "peak for this device: %gpumem tracks one by sampling)")
        else:
            lines.append(f"memory: peak {fmt_bytes(self.memory_peak, signed=True)} above the "
                         f"{fmt_bytes(self.memory_before)} allocated before; reserved "
                         f"{fmt_bytes(self.memory_reserved_growth, signed=True)}")
        lines += ["! " + w for w in self.warnings]
        lines += self.notes
        return lines

    def to_text(self) -> str:
        title = f"{self.magic} on {self.device} ({self.device_name}), {self.clock}"
        achieved = [self.roofline.line()] if self.roofline is not None and self.roofline.line() else []
        lines = [title, "  " + self.headline()] + ["  " + line for line in achieved + self.detail_lines()]
        if self.kernels is not None:
            lines.append(self.kernel_table().to_text(indent="  "))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text() if not cycle else "TimingResult(...)")

    def _repr_html_(self) -> str:
        table = Table(["", "per loop"], align="lr",
                      title=f"{self.magic} on {self.device} ({self.device_name}), {self.clock}")
        table.add(f"median {_KIND_WORDS[self.kind]}", fmt_seconds(self.median))
        table.add("IQR", fmt_seconds(self.iqr))
        table.add("min / max", f"{fmt_seconds(self.min)} / {fmt_seconds(self.max)}")
        table.add("samples x loops", f"{self.n} x {self.loops:,}")
        if self.roofline is not None and self.roofline.line():
            table.add("achieved", self.roofline.line())
        if self.kind != "host" and self.host is not None:
            table.add("host enqueue", fmt_seconds(self.host))
        if self.wall is not None:
            table.add("synchronized wall", fmt_seconds(self.wall))
        table.add("first run (excluded)", fmt_seconds(self.first_run))
        table.add("peak memory above before", fmt_bytes(self.memory_peak, signed=True))
        table.add("reserved growth", fmt_bytes(self.memory_reserved_growth, signed=True))
        out = table.to_html() + html_lines(["! " + w for w in self.warnings] + self.notes)
        if self.kernels is not None:
            out += self.kernel_table().to_html()
        return out

    def kernel_table(self) -> Table:
        """The ``--kernels`` table of this result (call only when ``kernels`` is set)."""
        busy = self.gpu_busy / self.device_time if self.gpu_busy and self.device_time else None
        return kernel_table(self.kernels or [], self.device.startswith("cuda"), self.kernels_empty,
                            self.cold or self.flush_l2, busy)

    def to_dict(self) -> dict:
        """Plain data (seconds, bytes; None for N/A): every field, plus ``iqr``."""
        out = {name: _plain(getattr(self, name)) for name in self.__dataclass_fields__}
        out["iqr"] = _plain(self.iqr)
        out["kernels"] = None if self.kernels is None else [_plain(vars(row)) for row in self.kernels]
        out["roofline"] = None if self.roofline is None else _plain(self.roofline.to_dict())
        return out


def kernel_table(rows: Sequence[KernelRow], device: bool, empty: Optional[str] = None,
                 hot_only: bool = False, busy: Optional[float] = None) -> Table:
    """The ``--kernels`` rows as a table; ``empty`` says why there are none, ``hot_only`` that the pass
    ran hot although the samples ran with ``--cold`` / ``--flush-l2``, ``busy`` the share of the device
    time the kernels kept the GPU busy."""
    title = ("top kernels by device time (separate torch.profiler pass" if device
             else "top ops by self CPU time (separate torch.profiler pass")
    title += ", run hot: without --cold / --flush-l2)" if hot_only else ")"
    if busy is not None:
        title += f"; the kernels kept the GPU busy {fmt_percent(min(busy, 1.0))} of the device time"
    if not rows:
        title += ": " + (empty or "no torch op ran")
    table = Table(["name", "calls/loop", "time/loop", "share"], align="lrrr", title=title)
    for row in rows:
        name = row.name if len(row.name) <= 70 else row.name[:67] + "..."
        calls = f"{row.calls:.3g}"
        table.add(name, calls, fmt_seconds(row.time), fmt_percent(row.share))
    return table


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return None if is_na(value) or math.isinf(value) else value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass
class TimingComparison:
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

    def _kernel_tables(self) -> list:
        out = []
        for label, result in self.rows:
            if result.kernels is not None:
                table = result.kernel_table()
                table.title = f"{label}: {table.title}"
                out.append(table)
        return out

    def to_text(self) -> str:
        return "\n".join([self.table().to_text()] + ["  " + line for line in self.notes()]
                         + [table.to_text(indent="  ") for table in self._kernel_tables()])

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text() if not cycle else "TimingComparison(...)")

    def _repr_html_(self) -> str:
        return (self.table().to_html() + html_lines(self.notes())
                + "".join(table.to_html() for table in self._kernel_tables()))

    def to_dict(self) -> dict:
        return {"rows": [dict(label=label, speedup=_plain(s), **result.to_dict())
                         for (label, result), s in zip(self.rows, self.speedups())]}


# ---- from a run to a result -----------------------------------------------------------------------------
def device_name(device: Any) -> str:
    """A person's name for ``device``: the GPU model, or the CPU model where Linux says it."""
    kind = getattr(device, "type", str(device))
    if kind not in ("cpu", "meta"):
        return accelerators.device_name(device)
    if kind == "cpu":
        with contextlib.suppress(OSError):
            with open("/proc/cpuinfo") as handle:
                for line in handle:
                    if line.lower().startswith("model name"):
                        return line.split(":", 1)[1].strip()
        return platform.processor() or platform.machine() or "CPU"
    return str(device)


def l2_cache_bytes(device: Any) -> Optional[int]:
    """The last-level cache of an accelerator in bytes: CUDA's and ROCm's L2, XPU's last-level cache (None
    on cpu, or where torch does not say, as on MPS)."""
    if getattr(device, "type", "cpu") in ("cpu", "meta"):
        return None
    return accelerators.facts(device).cache


def result_from(run: Run, clock: Clock, device: Any, memory: tuple, floor: Optional[float],
                opts: Options, threads: int, torch_version: str, name: str,
                kernels: Optional[tuple] = None, working_set: Optional[int] = None) -> TimingResult:
    """Turn a :class:`Run` into a :class:`TimingResult` with its statistics, warnings and notes. When the
    cell's work is mostly on streams the events do not see, the headline is the synchronized wall time.
    ``kernels`` is the ``--kernels`` pass (rows, why there are none, GPU busy time per loop);
    ``working_set`` the bytes the first run touched on the device."""
    rows, empty, busy = kernels if kernels is not None else (None, None, None)
    host = [s.host / s.loops for s in run.samples]
    wall = [s.wall / s.loops for s in run.samples] if run.samples[0].wall is not None else None
    dev = [s.device / s.loops for s in run.samples] if run.samples[0].device is not None else None
    host_m = median(host)
    wall_m = median(wall) if wall else None
    dev_m = median(dev) if dev else None
    kind = "wall" if run.kind == "device" and other_streams(dev_m, wall_m, run.loops, opts.flush_l2,
                                                            opts.cold) else run.kind
    per = [Clock.primary(s, kind) / s.loops for s in run.samples]
    stats = Stats.of(per)
    settled = stats.settled()
    warnings = assess(stats, kind, host_m, dev_m, wall_m, run.loops, floor, opts.cold, opts.flush_l2,
                      run.syncs, busy)
    watch = getattr(clock, "watch", None)
    clocks = watch.summary() if watch is not None else None
    clock_warnings, clock_notes = clock_lines(clocks)
    warnings += clock_warnings
    if run.stop == "max-time":
        warnings.append(f"not converged within --max-time {opts.max_time:g} s: the median's 95 % CI is "
                        f"+-{fmt_percent(stats.rel_ci)} (want < 1 %), IQR/median "
                        f"{fmt_percent(stats.rel_iqr)} (want < 2 %)")
    notes = []
    if run.stop == "fixed" and not settled:
        notes.append(f"-r {len(per)}: fixed sample count; the median's 95 % CI is "
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
    l2 = l2_cache_bytes(device) if run.kind == "device" else None
    notes += [line for line in [l2_note(working_set, l2, opts.flush_l2)] if line] + clock_notes
    first = Clock.primary(run.first, kind)
    return TimingResult(
        device=str(device), device_name=name, torch_version=torch_version, clock=clock.label, kind=kind,
        samples=per, loops=run.loops, median=stats.median, q1=stats.q1, q3=stats.q3, min=stats.min,
        max=stats.max, mean=stats.mean, std=stats.std, ci95=(stats.ci_low, stats.ci_high), first_run=first,
        host=host_m, device_time=dev_m, wall=wall_m, host_samples=host, device_samples=dev, wall_samples=wall,
        memory_before=memory[0], memory_peak=memory[1], memory_reserved_growth=memory[2], floor=floor,
        converged=settled and run.stop != "max-time", stop_reason=run.stop, elapsed=run.elapsed,
        warmup_loops=run.warmup_runs, threads=threads, cold=opts.cold, flush_l2=opts.flush_l2,
        host_syncs=run.syncs, working_set=working_set, l2_cache=l2, gpu_busy=busy, sm_clock=clocks,
        warnings=warnings, notes=notes, kernels=rows, kernels_empty=empty,
    )

