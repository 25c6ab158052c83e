"""How close a timed cell runs to the hardware's limit: achieved FLOP/s and bytes/s, arithmetic intensity,
the roofline bound (compute or memory) and the percentage of the peak.

After the samples, :func:`attach` reads the device's peaks (:mod:`.peaks`: the datasheet table scaled to
the SM clock the samples ran at, from the result's per-sample clock readings (:mod:`.throttle`), or
``--peak``), runs the cell once more, untimed, under the counter (:mod:`.counting`:
FLOPs by the formulas of torch's ``FlopCounterMode``, the bytes each op reads and writes), and puts a
:class:`Roofline` on the :class:`~.results.TimingResult` with its notes.

With FLOPs of several precisions, the compute time at peak is the sum of each precision's FLOPs over
its peak, and the FLOP/s percentage is that time over the measured time; the bandwidth percentage is
bytes / bandwidth over the measured time. The cell is compute-bound when the first of those times is
the longer (its arithmetic intensity is above the ridge point, peak FLOP/s / bandwidth), memory-bound
otherwise. Standard library only at import time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ContextManager, Optional

from ..errors import MagicInputError
from ..render import fmt_percent, fmt_si
from . import peaks

UNCOUNTED_SHOWN = 5
_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_NUMBER = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKMGTP]?)\s*")


def parse_peak(text: str) -> tuple:
    """``--peak FLOPS[,BYTES_PER_S]`` as ``(flops, bytes_per_s or None)``: numbers per second, with an
    optional SI prefix (``1.5e12,2e11`` or ``1.5T,200G``)."""
    parts = str(text).split(",")
    values = []
    for part in parts:
        match = _NUMBER.fullmatch(part)
        value = float(match.group(1)) * _SI[match.group(2)] if match else 0.0
        if not match or not 0 < value < float("inf") or len(parts) > 2:  # 1e400 reads as inf
            raise MagicInputError(f"--peak takes FLOPS[,BYTES_PER_S]: one or two numbers per second above 0, "
                                  f"with an optional k/M/G/T/P (e.g. 1.5e12,2e11 or 1.5T,200G); got {text!r}")
        values.append(value)
    return values[0], values[1] if len(values) > 1 else None


@dataclass(repr=False)
class Roofline:
    """The roofline of one measurement: per-loop ``flops`` and ``bytes`` (read and written by the ops) on
    the timed device, the per-loop ``seconds`` they took (the headline median), FLOPs by precision, the
    peaks held against them (FLOP/s per precision present, bandwidth, their name and source, the SM clock
    the samples ran at, the clock each precision's figure assumes and the scale applied to it), the ops no
    FLOP formula counts, the attention ops counted as causal, the ops that do matrix products whose FLOPs
    are not counted (``unknown``: then no FLOP/s percentage, intensity or bound is given, the bytes
    stand), the higher-order ops not looked into, and ``error`` when the counting run failed."""

    seconds: float
    flops: Optional[int] = None
    bytes: Optional[int] = None
    flops_by_precision: dict = field(default_factory=dict)
    peak_name: Optional[str] = None
    peak_source: Optional[str] = None
    peak_flops: dict = field(default_factory=dict)
    peak_bandwidth: Optional[float] = None
    clock_mhz: Optional[float] = None
    reference_mhz: dict = field(default_factory=dict)
    clock_scales: dict = field(default_factory=dict)
    peak_labels: dict = field(default_factory=dict)
    uncounted: dict = field(default_factory=dict)
    unknown: dict = field(default_factory=dict)
    causal: dict = field(default_factory=dict)
    opaque: dict = field(default_factory=dict)
    other_devices: dict = field(default_factory=dict)
    compiled: bool = False
    count_seconds: Optional[float] = None
    error: Optional[str] = None
    notes: list = field(default_factory=list)

    # -- figures ------------------------------------------------------------------------------------------
    @property
    def achieved_flops(self) -> Optional[float]:
        return self.flops / self.seconds if self.flops is not None and self.seconds > 0 else None

    @property
    def achieved_bandwidth(self) -> Optional[float]:
        return self.bytes / self.seconds if self.bytes is not None and self.seconds > 0 else None

    @property
    def intensity(self) -> Optional[float]:
        """FLOPs per byte moved (None when nothing was moved, or some matrix work was not counted)."""
        return self.flops / self.bytes if self.flops is not None and self.bytes and not self.unknown else None

    @property
    def compute_time(self) -> Optional[float]:
        """Seconds the counted FLOPs take at peak (each precision at its own); None without a peak for
        one of them."""
        counted = {kind: count for kind, count in self.flops_by_precision.items() if count}
        if self.flops is None or not all(self.peak_flops.get(kind) for kind in counted):
            return None
        return sum((count / self.peak_flops[kind] for kind, count in counted.items()), 0.0)

    @property
    def memory_time(self) -> Optional[float]:
        """Seconds the counted bytes take at the peak bandwidth."""
        return self.bytes / self.peak_bandwidth if self.bytes is not None and self.peak_bandwidth else None

    @property
    def flops_fraction(self) -> Optional[float]:
        """Achieved FLOP/s over the peak for this mix of precisions."""
        compute = self.compute_time
        return compute / self.seconds if compute and self.seconds > 0 and not self.unknown else None

    @property
    def bandwidth_fraction(self) -> Optional[float]:
        memory = self.memory_time
        return memory / self.seconds if memory is not None and self.seconds > 0 else None

    @property
    def ridge(self) -> Optional[float]:
        """The ridge point (FLOP/B) for this mix of precisions: peak FLOP/s over bandwidth."""
        compute = self.compute_time
        if not compute or not self.peak_bandwidth or self.unknown:
            return None
        return self.flops / compute / self.peak_bandwidth

    @property
    def bound(self) -> Optional[str]:
        """'compute' or 'memory': which of the two takes longer at peak; None without both peaks."""
        compute, memory = self.compute_time, self.memory_time
        if compute is None or memory is None or (not compute and not memory) or self.unknown:
            return None
        return "compute" if compute >= memory else "memory"

    # -- text ---------------------------------------------------------------------------------------------
    def _peak_label(self) -> str:
        counted = [k for k, v in self.flops_by_precision.items() if v]
        scaled = any(self.clock_scales.get(k, 1.0) < 1 for k in counted)
        clocked = f" at {self.clock_mhz:,.0f} MHz" if scaled and self.clock_mhz else ""
        if len(counted) == 1:
            return self.peak_labels.get(counted[0], self.peak_name or "") + clocked
        mix = ", ".join(f"{k} {fmt_percent(self.flops_by_precision[k] / self.flops)}" for k in counted)
        return f"{self.peak_name} peaks{clocked} for this mix ({mix} of FLOPs)"

    def line(self) -> Optional[str]:
        """'612 TFLOP/s (62 % of H100 SXM bf16 dense), 905 GB/s (27 % of 3.35 TB/s); compute-bound
        (intensity 680 FLOP/B, ridge 295)'; None when nothing was counted on the timed device."""
        if not self.flops and not self.bytes:
            return None
        flops = fmt_si(self.achieved_flops, "FLOP/s") if self.flops else "no FLOPs counted"
        if self.unknown:
            shown = ", ".join(sorted(self.unknown))
            flops = (f"{flops} and more not counted ({shown})" if self.flops else
                     f"FLOPs not counted ({shown})")
        if self.flops and self.flops_fraction is not None:
            flops += f" ({fmt_percent(self.flops_fraction)} of {self._peak_label()})"
        moved = fmt_si(self.achieved_bandwidth, "B/s")
        if self.bandwidth_fraction is not None:
            moved += f" ({fmt_percent(self.bandwidth_fraction)} of {fmt_si(self.peak_bandwidth, 'B/s')})"
        if self.unknown:
            return f"{flops}, {moved}"
        intensity = f"intensity {fmt_si(self.intensity or 0, 'FLOP/B')}"
        if self.bound is None:
            return f"{flops}, {moved}; {intensity}"
        ridge = f", ridge {fmt_si(self.ridge, 'FLOP/B')}" if self.ridge else ""
        return f"{flops}, {moved}; {self.bound}-bound ({intensity}{ridge})"

    def short(self) -> str:
        """The comparison table's cell: '612 TFLOP/s (62 %), 905 GB/s (27 %)'; '-' when not counted."""
        if not self.flops and not self.bytes:
            return "-"
        parts = []
        for value, unit, fraction in ((self.achieved_flops, "FLOP/s", self.flops_fraction),
                                      (self.achieved_bandwidth, "B/s", self.bandwidth_fraction)):
            text = "FLOPs not counted" if unit == "FLOP/s" and self.unknown else fmt_si(value, unit)
            parts.append(text + (f" ({fmt_percent(fraction)})" if fraction is not None else ""))
        return ", ".join(parts)

    # -- data ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain data: the counts, achieved figures, peaks, fractions and bound (the notes are the
        result's)."""
        derived = ["achieved_flops", "achieved_bandwidth", "intensity", "flops_fraction",
                   "bandwidth_fraction", "ridge", "bound", "compute_time", "memory_time"]
        kept = [f.name for f in fields(self) if f.name != "notes"]
        return {name: getattr(self, name) for name in kept + derived}

    @classmethod
    def from_dict(cls, data: dict) -> Roofline:
        """A :class:`Roofline` from its :meth:`to_dict` (derived figures are recomputed)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def analyse(counts: Any, device_type: str, seconds: float, peak: Optional[peaks.Peak]) -> Roofline:
    """The :class:`Roofline` of ``counts`` (:class:`~.counting.Counts`) for a cell timed on a
    ``device_type`` device at ``seconds`` per loop, against ``peak`` (None: achieved figures only).
    A clock (the samples' median reading) that the achieved FLOP/s prove wrong (the GPU slowed down
    between a sample and its reading) is dropped, and the peak taken at the table's clock."""
    by_precision = {kind: n for (where, kind), n in counts.flops.items() if where == device_type}
    rl = Roofline(seconds, sum(by_precision.values()), counts.bytes.get(device_type, 0), by_precision,
                  uncounted=dict(counts.uncounted), unknown=dict(counts.unknown), causal=dict(counts.causal),
                  opaque=dict(counts.opaque),
                  compiled=counts.compiled,
                  count_seconds=counts.seconds)
    rl.other_devices = {where: {"bytes": counts.bytes.get(where, 0),
                                "flops": sum(n for (w, _), n in counts.flops.items() if w == where)}
                        for where in {w for w, _ in counts.flops} | set(counts.bytes) if where != device_type}
    if peak is not None:
        rl.peak_name, rl.peak_source, rl.peak_bandwidth = peak.name, peak.source, peak.bandwidth
        rl.clock_mhz = peak.clock_mhz
        rl.reference_mhz = {kind: mhz for kind in by_precision if (mhz := peak.reference_for(kind))}
        _hold_against(rl, peak, clocked=True)
        references = _references(rl)
        if rl.clock_scales and (rl.flops_fraction or 0) > 1:
            _hold_against(rl, peak, clocked=False)
            rl.notes.append(f"roofline: the SM clock NVML read after the samples ({rl.clock_mhz:,.0f} MHz, "
                            "their median) is below what the achieved FLOP/s need (the GPU slowed down "
                            f"before it was read): peaks at the table's {references} MHz")
        elif rl.clock_scales:
            scaled = ", ".join(f"{kind} {fmt_si(value, 'FLOP/s')}" for kind, value in rl.peak_flops.items()
                               if value and rl.flops_by_precision.get(kind))
            rl.notes.append(f"roofline: FLOP/s peaks scaled to the SM clock the samples ran at, "
                            f"{rl.clock_mhz:,.0f} of the {references} MHz the table's figures "
                            "assume (the median of NVML's readings after each sample)"
                            + (f": {scaled}" if scaled else ""))
        rl.notes += peak.notes
    rl.notes[:0] = _count_notes(rl, peak)
    return rl


def _hold_against(rl: Roofline, peak: peaks.Peak, clocked: bool) -> None:
    """The peaks for the counted precisions, each scaled to the clock (unless not ``clocked``); the scales
    below 1 that were applied are kept in ``clock_scales``."""
    rl.peak_flops = {kind: peak.flops_for(kind, clocked) for kind in rl.flops_by_precision}
    rl.peak_labels = {kind: peak.label(kind) for kind in rl.flops_by_precision}
    rl.clock_scales = {kind: peak.scale_for(kind) for kind in rl.flops_by_precision
                       if clocked and peak.scale_for(kind) < 1}


def _references(rl: Roofline) -> str:
    """'1,830' when the counted precisions' figures assume one clock; '1,830 (bf16) / 1,980 (fp32)' when
    the tensor-core and the CUDA-core figures assume different ones."""
    by_clock: dict = {}
    for kind, mhz in rl.reference_mhz.items():
        if rl.flops_by_precision.get(kind):
            by_clock.setdefault(mhz, []).append(kind)
    if len(by_clock) <= 1:
        return ", ".join(f"{mhz:,.0f}" for mhz in by_clock)
    return " / ".join(f"{mhz:,.0f} ({', '.join(kinds)})" for mhz, kinds in sorted(by_clock.items()))


def _count_notes(rl: Roofline, peak: Optional[peaks.Peak]) -> list:
    """What the counts are, and what they leave out."""
    counted = f"{fmt_si(rl.flops, 'FLOP')} and " if rl.flops else "no FLOPs and "
    notes = [f"roofline: {counted}{fmt_si(rl.bytes, 'B')} per loop, counted in one extra untimed run of the "
             "cell (--no-roofline skips it, for a cell that must not run again); bytes: each op's inputs "
             "read and outputs written once, views free (not a bound on memory traffic: less where data "
             "stays in L2 between ops, more where tiled kernels re-read)"]
    if rl.uncounted:
        ranked = sorted(rl.uncounted.items(), key=lambda item: -item[1])
        shown = ", ".join(f"{name} x{calls}" for name, calls in ranked[:UNCOUNTED_SHOWN])
        more = len(ranked) - UNCOUNTED_SHOWN
        shown += f" and {more} more" if more > 0 else ""
        notes.append(f"roofline: FLOPs count matmuls, convolutions and attention (torch's FlopCounterMode); "
                     f"not counted: {shown}; the FLOP figure is a lower bound")
    said = ((rl.causal, "causal attention ({}) counted by the (query, key) pairs it attends, s(s+1)/2 of s x "
             "s for a square mask, as the kernels skip the masked tiles (the convention of FlashAttention's "
             "benchmarks: half of full attention)"),
            (rl.unknown, "{} did matrix products whose FLOPs are not counted (no formula reads them): no "
             "FLOP/s percentage, intensity or bound; the bytes stand"),
            (rl.opaque, "the FLOPs and bytes inside {} are not counted (a higher-order op: the ops in it are "
             "not seen one by one)"))
    for ops, text in said:
        if ops:
            shown = ", ".join(f"{name} x{calls}" for name, calls in sorted(ops.items()))
            notes.append(f"roofline: {text.format(shown)}")
    if rl.compiled:
        notes.append("roofline: torch.compile'd code ran eagerly for the count: the figures are those of "
                     "the eager ops (fused kernels move fewer bytes)")
    if not rl.flops and not rl.bytes and not rl.other_devices:
        notes.append("roofline: the counting run saw no torch op (CUDA graph replays and kernels launched "
                     "outside torch's dispatcher are not seen)")
    for where, figures in sorted(rl.other_devices.items()):
        flops = f"{fmt_si(figures['flops'], 'FLOP')} and " if figures["flops"] else ""
        notes.append(f"roofline: {flops}{fmt_si(figures['bytes'], 'B')} on {where} are left out (not the "
                     "timed device)")
    if (rl.bandwidth_fraction or 0) > 1:
        notes.append("roofline: above the peak bandwidth: the data stays in cache from loop to loop (the "
                     "count takes every byte from memory)" + ("" if rl.peak_name == "--peak" else
                                                                  "; --flush-l2 times it with a cold cache"))
    if (rl.flops_fraction or 0) > 1:
        notes.append("roofline: above the FLOP/s peak: " + (
            "the --peak figure is below what this device does" if rl.peak_name == "--peak" else
            "the GPU ran above the clock the table's figures assume"))
    if peak is not None:
        missing = sorted(k for k, v in rl.flops_by_precision.items() if v and not rl.peak_flops.get(k))
        if missing:
            notes.append(f"roofline: no {', '.join(missing)} peak for {peak.name} in the table: no FLOP/s "
                         "percentage")
    return notes


def attach(result: Any, run: Callable[[], Any], device: Any, peak: Optional[tuple],
           silence: Callable[[], ContextManager[Any]]) -> None:
    """Count one more run of the cell (``run``) and put its :class:`Roofline` and notes on ``result``
    (a :class:`~.results.TimingResult` timed on ``device``); ``peak`` is ``--peak`` as
    ``(flops, bytes_per_s or None)``. The device's peaks are scaled to the SM clock the samples ran at
    (``result.sm_clock``: NVML's readings after each sample). What the counting run raises becomes a note,
    never the cell's error: the cell ran through every sample."""
    from . import counting

    flops, bandwidth = (list(peak) + [None])[:2] if peak is not None else (None, None)
    table, notes = None, []
    if bandwidth is None:  # the table has something --peak does not give
        try:
            table, notes = peaks.for_device(device, (result.sm_clock or {}).get("median_mhz"))
        except Exception as exc:  # noqa: BLE001 - a GPU that cannot say its name costs the peak, not the report
            notes = [f"roofline: no peak figures: asking torch about {device} failed "
                     f"({' '.join(f'{type(exc).__name__}: {exc}'.split())[:200]})"]
    if peak is not None:
        table, notes = peaks.user_peak(flops, bandwidth, table), []
    try:
        counts = counting.count(run, silence)
    except Exception as exc:  # noqa: BLE001 - the count is an extra; the timing stands
        message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        result.roofline = Roofline(result.median, error=message)
        result.notes.append(f"roofline: not counted: the extra counting run raised {message} "
                            "(--no-roofline skips that run)")
        return
    rl = analyse(counts, getattr(device, "type", str(device)), result.median, table)
    rl.notes += notes
    result.roofline = rl
    result.notes += rl.notes
