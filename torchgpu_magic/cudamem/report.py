"""``%%cudamem``'s reports: a cell's memory (:class:`CellMemory`), measured or predicted, with its picture
over the step; one step measured and predicted side by side (:class:`StepComparison`); and the batch
search of ``--fit`` (:class:`FitResult`).

Plain values only (names, strings, numbers, the recorded series): a report never holds a tensor, a module
or the tracker. Each builds one report model (render.py), the picture among its parts, from which its
text and HTML are rendered, and gives ``to_dict()``. Standard library only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from ..render import Lines, Report, Reportable, Table, fmt_bytes, fmt_percent, fmt_seconds
from .allocator import CATEGORIES, PHASES
from .picture import TEXT_COLUMNS, MemoryPicture, SideBySide
from .series import StepSeries

INDENT = "  "
"""How far a report indents its lines under its title; its text chart is drawn that much narrower."""


def _natural(name: str) -> list:
    """'h.10' after 'h.2': numbers compared as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


class ModuleRow(NamedTuple):
    """One module's figures over the run: its parameters' bytes, how many times its forward ran, and
    memory above what was allocated when each of its passes began: the highest during its forward
    (``forward_peak``), what its forward left allocated (``forward_kept``: its outputs and what autograd
    saved for the backward), and the highest during its backward (``backward_peak``)."""

    name: str
    type: str
    params: int
    calls: int
    forward_peak: int
    forward_kept: int
    backward_peak: int


@dataclass(repr=False)
class CellMemory(Reportable):
    """What a cell's run allocated on one device: the peak, when it happened (phase and module), the
    memory at that moment by category, and per module. ``mode`` is ``'measured'`` (the real run,
    tracked) or ``'predicted'`` (a run on fake tensors). For a CUDA target ``reserved_peak`` is what the
    caching allocator would have reserved and ``allowances`` what fake tensors cannot see; ``needs`` is
    the device memory the run asks for, compared with ``capacity`` when known. ``series`` is the memory
    over the step's events (``series.to_pandas()``, ``series.to_dict()``), drawn by :meth:`picture`."""

    mode: str
    device: str
    how: str
    peak: int
    peak_phase: str
    peak_module: Optional[str]
    phase_peaks: dict
    categories: dict
    before: int
    after: int
    after_categories: dict = field(default_factory=dict)
    reserved_peak: Optional[int] = None
    allowances: list = field(default_factory=list)
    capacity: Optional[int] = None
    capacity_source: Optional[str] = None
    modules: list = field(default_factory=list)
    top: int = 8
    torch_max_allocated: Optional[int] = None
    torch_allocated_before: Optional[int] = None
    other_devices: dict = field(default_factory=dict)
    limits: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    series: Optional[StepSeries] = None

    def picture(self, columns: int = TEXT_COLUMNS) -> Optional[MemoryPicture]:
        """The step's memory drawn from :attr:`series`, with the capacity, its text chart ``columns``
        wide; None without a series."""
        if self.series is None:
            return None
        verb = "predicted for" if self.mode == "predicted" else "measured on"
        return MemoryPicture(self.series, f"{verb} {self.device}: memory allocated over the step",
                             self.capacity, self.capacity_source, columns=columns)

    @property
    def needs(self) -> int:
        """Device memory the run asks for: the allocator's reserved peak where modelled (else the
        allocated peak), plus the allowances that lie outside the allocator (the CUDA context)."""
        base = self.reserved_peak if self.reserved_peak is not None else self.peak
        return base + sum(a["nbytes"] for a in self.allowances if not a["in_allocator"])

    @property
    def fits(self) -> Optional[bool]:
        """Whether :attr:`needs` fits in :attr:`capacity`; None when the capacity is unknown."""
        return None if self.capacity is None else self.needs <= self.capacity

    def verdict(self) -> str:
        """'fits in 80.0 GiB (--capacity), with 78.1 GiB to spare', or how much more it needs."""
        if self.capacity is None:
            return "capacity unknown (give --capacity SIZE, e.g. --capacity 79GiB for an H100 80GB)"
        where = f"{fmt_bytes(self.capacity)} ({self.capacity_source})"
        if self.fits:
            return f"fits in {where}, with {fmt_bytes(self.capacity - self.needs)} to spare"
        over = self.needs - self.capacity
        return (f"does not fit in {where}: needs {fmt_bytes(over)} more "
                f"({fmt_percent(over / self.capacity)} over)")

    def _title(self) -> str:
        verb = "predicted for" if self.mode == "predicted" else "measured on"
        return f"%%cudamem {verb} {self.device}: {self.how}"

    def _headline(self) -> list:
        where = f" in {self.peak_module}" if self.peak_module else ""
        phases = " · ".join(f"{p} {fmt_bytes(self.phase_peaks[p])}" for p in PHASES if p in self.phase_peaks)
        lines = [f"peak {fmt_bytes(self.peak)} allocated, during {self.peak_phase}{where} "
                 f"(before the cell {fmt_bytes(self.before)}, after {fmt_bytes(self.after)})",
                 f"highest by phase: {phases}"]
        if self.reserved_peak is not None:
            beside = [a for a in self.allowances if not a["in_allocator"]]
            parts = [f"{fmt_bytes(self.reserved_peak)} reserved by the caching allocator"]
            parts += [f"{fmt_bytes(a['nbytes'])} {a['what']}" for a in beside]
            lines.append(f"needs {fmt_bytes(self.needs)} on the device: {' + '.join(parts)}; "
                         f"{self.verdict()}")
        else:
            lines.append(f"needs {fmt_bytes(self.needs)}; {self.verdict()}")
        if self.torch_max_allocated is not None:
            lines.append(f"torch's max_memory_allocated during the cell: "
                         f"{fmt_bytes(self.torch_max_allocated)} ({fmt_bytes(self.torch_allocated_before)} "
                         f"allocated before it, tracked or not)")
        if self.other_devices:
            lines.append("also tracked: " + ", ".join(f"{d} peak {fmt_bytes(b)}"
                                                      for d, b in sorted(self.other_devices.items())))
        return lines

    def _category_table(self) -> Table:
        table = Table(["category", "at the peak", "share", "after the cell"], align="lrrr",
                      title="By category")
        for name in CATEGORIES:
            nbytes = self.categories.get(name, 0)
            after = self.after_categories.get(name, 0)
            if nbytes or after or name != "workspaces":
                share = fmt_percent(nbytes / self.peak) if self.peak else "-"
                table.add(name, fmt_bytes(nbytes), share, fmt_bytes(after))
        table.add("total", fmt_bytes(self.peak), "", fmt_bytes(self.after))
        return table

    def top_modules(self) -> list:
        """The :attr:`top` modules by the larger of their forward and backward peaks; the models
        themselves are left out when they have submodules (their figures are the headline's)."""
        rows = [r for r in self.modules if "." in r.name] or list(self.modules)
        rows.sort(key=lambda r: (-max(r.forward_peak, r.backward_peak), _natural(r.name)))
        return rows[: self.top] if self.top else rows

    def _module_table(self) -> Optional[Table]:
        rows = self.top_modules()
        if not rows:
            return None
        shown = f"top {len(rows)} of {len(self.modules)}" if len(rows) < len(self.modules) else "all"
        table = Table(["module", "type", "params", "forward peak", "forward kept", "backward peak"],
                      align="llrrrr",
                      title=f"By module ({shown}; above what was allocated as each pass began)")
        for r in rows:
            calls = f" x{r.calls}" if r.calls > 1 else ""
            table.add(r.name + calls, r.type, fmt_bytes(r.params), fmt_bytes(r.forward_peak),
                      fmt_bytes(r.forward_kept), fmt_bytes(r.backward_peak))
        return table

    def _footer(self) -> list:
        lines = [f"{a['what']}: {fmt_bytes(a['nbytes'])} "
                 f"({'in the peak' if a['in_allocator'] else 'beside the allocator'}; {a['source']})"
                 for a in self.allowances]
        lines += [f"not counted: {text}" for text in self.limits]
        lines += self.notes
        if self.seconds:
            lines.append(f"took {fmt_seconds(self.seconds)}")
        return lines

    def report(self) -> Report:
        """The title over the headline, then, a blank line apart, the picture, the tables and the
        footer."""
        body = [self.picture(TEXT_COLUMNS - len(INDENT)), self._category_table(), self._module_table(),
                Lines(self._footer())]
        return Report([Report([Lines(self._headline())], title=self._title(), indent=INDENT),
                       Report(body, indent=INDENT, gap=True)], gap=True)

    def to_dict(self) -> dict:
        """Plain values for code and JSON, with ``needs`` and ``fits`` computed."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["modules"] = [row._asdict() for row in self.modules]
        out["allowances"] = [dict(a) for a in self.allowances]
        out["series"] = self.series.to_dict() if self.series is not None else None
        out.update(needs=self.needs, fits=self.fits)
        return out


@dataclass(repr=False)
class StepComparison(Reportable):
    """One step measured and predicted (``--compare``): the prediction first, on fake copies, which
    changes nothing, then the real run from the same state; their pictures side by side on one scale and
    their figures in one table."""

    measured: CellMemory
    predicted: CellMemory

    def picture(self, columns: int = TEXT_COLUMNS) -> Optional[SideBySide]:
        """The two pictures, measured on the left (their text charts ``columns`` wide); None when
        either has no series."""
        pictures = [self.measured.picture(columns), self.predicted.picture(columns)]
        return SideBySide(pictures) if all(p is not None for p in pictures) else None

    def _title(self) -> str:
        return (f"%%cudamem --compare: one step measured on {self.measured.device} and predicted for "
                f"{self.predicted.device}")

    def _table(self) -> Table:
        m, p = self.measured, self.predicted
        rows = [("peak", m.peak, p.peak)]
        rows += [(f"highest in {phase}", m.phase_peaks.get(phase), p.phase_peaks.get(phase))
                 for phase in PHASES if phase in m.phase_peaks or phase in p.phase_peaks]
        rows += [(f"{name} at the peak", m.categories.get(name, 0), p.categories.get(name, 0))
                 for name in CATEGORIES if m.categories.get(name) or p.categories.get(name)]
        rows.append(("after the cell", m.after, p.after))
        table = Table(["", "measured", "predicted", "predicted / measured"], align="lrrr",
                      title="The step, measured and predicted")
        for label, a, b in rows:
            ratio = f"{b / a:.4f}" if a and b is not None else "-"
            table.add(label, "-" if a is None else fmt_bytes(a), "-" if b is None else fmt_bytes(b), ratio)
        return table

    def report(self) -> Report:
        """The title, then the pictures, the table and where the full reports are, a blank line apart."""
        return Report([self.picture(TEXT_COLUMNS - len(INDENT)), self._table(),
                       Lines(["the full reports: .measured and .predicted"])],
                      title=self._title(), indent=INDENT, gap=True)

    def to_dict(self) -> dict:
        """Both reports' plain values."""
        return {"measured": self.measured.to_dict(), "predicted": self.predicted.to_dict()}


@dataclass(repr=False)
class FitResult(Reportable):
    """``--fit``: the largest first dimension of ``names`` whose predicted run fits ``capacity``
    (``best``; None when not even 1 fits), found by ``predictions`` (batch, needs, fits), doubling from
    the current size then bisecting; ``at_best`` is the full prediction at that size."""

    names: list
    device: str
    capacity: int
    capacity_source: str
    current: int
    best: Optional[int]
    predictions: list
    at_best: Optional[CellMemory]
    limit: Optional[int] = None
    seconds: float = 0.0

    def _headline(self) -> str:
        names = ", ".join(self.names)
        where = f"{fmt_bytes(self.capacity)} ({self.capacity_source})"
        count = f"{len(self.predictions)} prediction{'s' * (len(self.predictions) != 1)}"
        if self.best is None:
            head = f"no first dimension of {names} fits {self.device} in {where}: even 1 needs " \
                   f"{fmt_bytes(self.predictions[-1][1])} ({count})"
        else:
            head = f"largest first dimension of {names} that fits {self.device} in {where}: {self.best} " \
                   f"(now {self.current}; {count}, doubling then bisecting, {fmt_seconds(self.seconds)})"
            if self.limit is not None and self.best >= self.limit:
                head += f"; the search stopped at {self.limit}, so larger sizes may fit too"
        return head

    def _table(self) -> Table:
        """One row per prediction: what it needs in one unit, the capacity's (a search ends beside the
        capacity, where '1023 MiB' and '1.00 GiB' would read as one amount), and how far from it."""
        unit = fmt_bytes(self.capacity).split()[-1]
        scale = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB", "PiB").index(unit)
        table = Table(["first dimension", "needs", "vs capacity", "fits"], align="rrrl",
                      title=f"Predictions, in order (capacity {fmt_bytes(self.capacity)})")
        for size, needs, fits in self.predictions:
            value = needs / scale
            shown = f"{value:.0f}" if unit == "B" or value >= 100 else f"{value:.1f}" if value >= 10 \
                else f"{value:.2f}"
            table.add(size, f"{shown} {unit}", fmt_bytes(needs - self.capacity, signed=True),
                      "yes" if fits else "no")
        return table

    def report(self) -> Report:
        """The headline over the predictions' table, then the full prediction at the size found."""
        best = None if self.at_best is None else Report([self.at_best.report()], title="At that size:")
        return Report([Report([self._table()], title="%%cudamem --fit: " + self._headline(), indent=INDENT,
                              gap=True), best], gap=True)

    def to_dict(self) -> dict:
        """Plain values for code and JSON."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["predictions"] = [list(row) for row in self.predictions]
        out["at_best"] = self.at_best.to_dict() if self.at_best is not None else None
        return out
