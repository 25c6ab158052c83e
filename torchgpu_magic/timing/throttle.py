"""Whether the GPU ran at its full clock while it was timed.

A GPU held below its max SM clock by its power cap, heat or sync boost runs the same kernels slower, and
nothing in the events says so: nvbench drops the samples taken under 75 % of the max clock. Here NVML's SM
clock and its reasons are read after every sample (:class:`ClockWatch`, two NVML calls, outside the timed
spans), and the result says how many samples ran below the max clock, how low, and why
(:func:`clock_lines`); the median of those readings is the clock the roofline scales the peaks to. A reading
taken after the GPU had already dropped to its idle clock says nothing about the sample and is left out.
Uses :mod:`torchgpu_magic.gpus`; torch is not imported here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..render import fmt_percent, is_na
from .stats import median

SLOW_CLOCK = 0.75  # nvbench drops samples taken under 75 % of the max SM clock
IDLE = "idle"


@dataclass
class ClockWatch:
    """The SM clock (MHz) and its reasons after each sample of one GPU; ``top`` is the max SM clock."""

    top: Optional[int]
    reader: Optional[Callable[[], tuple]] = None  # NVML's (clock, reasons), either NA where it has none
    readings: list = field(default_factory=list)  # (MHz or None, reasons tuple or None)

    @classmethod
    def for_device(cls, device: Any) -> ClockWatch:
        """The watch for torch's ``cuda:N``, matched to NVML's GPU by UUID (the whole GPU of a MIG
        instance: clocks are the GPU's); one that reads nothing where NVML cannot give the GPU."""
        from ..gpus import gpumap, nvml

        index = getattr(device, "index", None) or 0
        try:
            target = gpumap.nvml_target(index)
            found = nvml.clock_reader(target[0]) if target is not None else None
        except Exception:  # noqa: BLE001 - a report without clock figures, never a failed measurement
            found = None
        if found is None:
            return cls(None)
        top, reader = found
        return cls(None if is_na(top) else int(top), reader)

    def read(self) -> None:
        """Read the clock now (after a sample)."""
        if self.reader is not None:
            clock, reasons = self.reader()
            self.readings.append((None if is_na(clock) else int(clock),
                                  None if is_na(reasons) else tuple(reasons)))

    def summary(self) -> dict:
        """Plain figures for the result: ``max_mhz``, ``samples`` read under load, ``below_max`` and
        ``below_75`` (how many of them ran below the max clock / below 75 % of it), ``lowest_mhz``,
        ``median_mhz`` (the clock the samples ran at, beside their median time: the roofline scales the
        table's peaks to it), and the ``reasons`` seen, in words (idle left out)."""
        loaded = [(clock, reasons or ()) for clock, reasons in self.readings
                  if clock is not None and IDLE not in (reasons or ())]
        below = [clock for clock, _ in loaded if self.top and clock < self.top]
        reasons = list(dict.fromkeys(reason for _, seen in loaded for reason in seen))
        return {"max_mhz": self.top, "samples": len(loaded), "below_max": len(below),
                "below_75": sum(1 for clock in below if clock < SLOW_CLOCK * self.top),
                "lowest_mhz": min(below) if below else None,
                "median_mhz": median([clock for clock, _ in loaded]) if loaded else None, "reasons": reasons}


def clock_lines(summary: Optional[dict]) -> tuple:
    """``(warnings, notes)`` for a result's clock summary: a warning when samples ran under 75 % of the
    max SM clock (nvbench would drop them), a note when they ran below it otherwise or a reason held it
    (power cap, thermal slowdown, sync boost...)."""
    if not summary or not summary.get("samples"):
        return [], []
    n, top, why = summary["samples"], summary["max_mhz"], ", ".join(summary["reasons"])
    because = f": {why}" if why else ""
    if summary["below_75"]:
        return [f"the GPU ran under 75 % of its max SM clock in {summary['below_75']} of {n} samples "
                f"(lowest {summary['lowest_mhz']} MHz of {top} MHz{because}); nvbench drops such samples, "
                "and the figures are slower than this GPU at full clock"], []
    if summary["below_max"]:
        share = fmt_percent(summary["lowest_mhz"] / top)
        return [], [f"SM clock below its max in {summary['below_max']} of {n} samples (lowest "
                    f"{summary['lowest_mhz']} MHz, {share} of {top} MHz{because})"]
    if why:
        every = f"all {n} samples" if n > 1 else "its 1 sample"
        return [], [f"SM clock at its max ({top} MHz) in {every}, with clock reasons reported: {why}"]
    return [], []
