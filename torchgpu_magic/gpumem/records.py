"""Per-cell memory records: what each cell did to time, host memory and GPU memory, as plain data.

``%gpumem`` keeps one :class:`CellRecord` per cell run since it started, in a bounded
:class:`CellRecords` (the oldest dropped, and counted, past ``keep``). They are plain values so code
can read them (``records = %gpumem --records -o``), export them (:meth:`CellRecords.to_csv`,
:meth:`CellRecords.to_pandas`, :meth:`CellRecords.to_dict`) and send them between processes (the
cluster view gathers ``to_dict()`` from every engine).

Standard library only (pandas is imported by :meth:`CellRecords.to_pandas` alone, when called); no
IPython, no torch.
"""
from __future__ import annotations

import collections
import csv
import re
import time
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Union

from ..accelerators import device_label
from ..render import Lines, Report, Reportable, Table, fmt_bytes, fmt_seconds

DEFAULT_KEEP = 10_000
_GPU_FIELDS = ("delta", "peak", "nvml_delta")
_CELL_FIELDS = ("number", "first_line", "start", "seconds", "rss_delta", "rss_peak")


class CellGPU(NamedTuple):
    """One accelerator's figures for one cell: torch's allocated memory after minus before (``delta``),
    the highest allocated during (``peak``), and this process's usage as the driver sees it after minus
    before (``nvml_delta``: NVML's or AMD SMI's figure, where the CUDA context, cuBLAS workspaces and
    torch's cache growth count; MPS's driver-allocated memory; None where the driver cannot say), on the
    device ``kind:torch_index``. A named tuple, like :class:`CellRecord`: immutable and cheap to make."""

    torch_index: int
    delta: int
    peak: int
    nvml_delta: Optional[int] = None
    kind: str = "cuda"

    @property
    def label(self) -> str:
        """'cuda:0', 'xpu:1', 'mps' (a Mac has one GPU)."""
        return device_label(self.kind, self.torch_index)


_COLUMN = re.compile(r"(?P<kind>[a-z][a-z0-9_]*)(?::(?P<index>\d+))? (?P<field>delta|peak|nvml_delta)")


class CellRecord(NamedTuple):
    """What one cell did. ``start`` is the wall-clock time it began (``time.time()``); ``rss_peak`` is
    None where the OS cannot reset its high-water mark, ``rss_delta`` None where it cannot be read.

    A named tuple rather than a frozen dataclass: one is made after every cell, and a frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field) costs several times more."""

    number: Optional[int]
    first_line: str
    start: float
    seconds: float
    rss_delta: Optional[int]
    rss_peak: Optional[int]
    gpus: tuple = ()

    @property
    def gpu_peak(self) -> int:
        """The highest allocated peak of any GPU in this cell (0 without GPU figures)."""
        return max((g.peak for g in self.gpus), default=0)

    def to_dict(self) -> dict:
        """Plain values for code and JSON."""
        out = self._asdict()
        out["gpus"] = [g._asdict() for g in self.gpus]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> CellRecord:
        """The inverse of :meth:`to_dict`."""
        gpus = tuple(CellGPU(**g) for g in data.get("gpus", ()))
        return cls(**{k: data[k] for k in _CELL_FIELDS}, gpus=gpus)

    def line(self) -> str:
        """One short line, as ipython-autotime prints after a cell, naming the cell as IPython does:
        ``[gpumem] In[3] 1.23 s · host +512 MiB (peak 1.10 GiB) · cuda:0 +2.00 GiB (peak 3.10 GiB)``
        (a cell run without a number, from code, has none)."""
        cell = "" if self.number is None else f"In[{self.number}] "
        peak = "" if self.rss_peak is None else f" (peak {fmt_bytes(self.rss_peak)})"
        gpus = [f"{g.label} {fmt_bytes(g.delta, signed=True)} (peak {fmt_bytes(g.peak)})" for g in self.gpus]
        return " · ".join([f"[gpumem] {cell}{fmt_seconds(self.seconds)}",
                           f"host {fmt_bytes(self.rss_delta, signed=True)}{peak}", *gpus])


def _flat(record: CellRecord, devices: list) -> dict:
    """One CSV / DataFrame row: the cell's fields, then ``cuda:N delta`` / ``peak`` / ``nvml_delta`` per
    device (``mps delta``, ``xpu:0 peak``...)."""
    row: dict = {k: getattr(record, k) for k in _CELL_FIELDS}
    by_device = {(g.kind, g.torch_index): g for g in record.gpus}
    for kind, index in devices:
        g = by_device.get((kind, index))
        for name in _GPU_FIELDS:
            row[f"{device_label(kind, index)} {name}"] = None if g is None else getattr(g, name)
    return row


def _int(text: str) -> Optional[int]:
    return None if text == "" else int(text)


class CellRecords(Reportable):
    """The records of every cell since ``%gpumem`` started, oldest first, bounded to the last ``keep``;
    :attr:`dropped` counts the older ones that were let go.

    Iterate it, index it, or take it out as plain data: :meth:`to_dict`, :meth:`to_csv` (and
    :meth:`from_csv` back), :meth:`to_pandas`. Its text and HTML reprs show the totals and the top
    cells by peak memory.
    """

    def __init__(self, records: Iterable[CellRecord] = (), keep: int = DEFAULT_KEEP,
                 dropped: int = 0) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self._records: collections.deque = collections.deque(maxlen=keep)
        self.dropped = dropped
        for record in records:
            self.append(record)

    def append(self, record: CellRecord) -> None:
        """Add the newest record, letting the oldest go past ``keep``."""
        if len(self._records) == self.keep:
            self.dropped += 1
        self._records.append(record)

    def clear(self) -> None:
        """Forget every record (the dropped count too)."""
        self._records.clear()
        self.dropped = 0

    def copy(self) -> CellRecords:
        """A copy that later cells do not change (records are immutable, so this is cheap)."""
        return CellRecords(self._records, self.keep, self.dropped)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[CellRecord]:
        return iter(self._records)

    def __getitem__(self, index: int) -> CellRecord:
        return self._records[index]

    def last(self, n: int) -> list:
        """The newest ``n`` records, oldest first."""
        return list(self._records)[-n:] if n > 0 else []

    # ---- summaries --------------------------------------------------------------------------------
    def gpu_devices(self) -> list:
        """Every ``(kind, torch index)`` any record has figures for, in order."""
        return sorted({(g.kind, g.torch_index) for r in self._records for g in r.gpus})

    def totals(self) -> dict:
        """Cells, total time, summed RSS change, highest RSS peak and, per GPU, summed allocated change
        and highest peak."""
        records = list(self._records)
        gpus: dict = {}
        for r in records:
            for g in r.gpus:
                total = gpus.setdefault(g.label, {"delta": 0, "peak": 0})
                total["delta"] += g.delta
                total["peak"] = max(total["peak"], g.peak)
        return {
            "cells": len(records),
            "dropped": self.dropped,
            "seconds": sum(r.seconds for r in records),
            "rss_delta": sum(r.rss_delta for r in records if r.rss_delta is not None),
            "rss_peak": max((r.rss_peak for r in records if r.rss_peak is not None), default=None),
            "gpus": gpus,
        }

    def top(self, n: int = 5) -> list:
        """The ``n`` cells with the highest peak: GPU allocated peak first, then host RSS peak."""
        return sorted(self._records, key=lambda r: (r.gpu_peak, r.rss_peak or 0), reverse=True)[:n]

    # ---- plain data -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """``{'records': [...], 'dropped': n, 'keep': n}``: plain values for code and JSON."""
        return {"records": [r.to_dict() for r in self._records], "dropped": self.dropped, "keep": self.keep}

    @classmethod
    def from_dict(cls, data: dict) -> CellRecords:
        """The inverse of :meth:`to_dict` (e.g. records gathered from another process)."""
        return cls((CellRecord.from_dict(r) for r in data["records"]), data.get("keep", DEFAULT_KEEP),
                   data.get("dropped", 0))

    def columns(self) -> list:
        """The names of :meth:`rows`' fields, in order."""
        return list(_CELL_FIELDS) + [f"{device_label(kind, index)} {name}"
                                     for kind, index in self.gpu_devices() for name in _GPU_FIELDS]

    def rows(self) -> list:
        """One flat dict per cell (the CSV's and the DataFrame's rows): the cell's fields, then per GPU
        ``cuda:N delta``, ``cuda:N peak``, ``cuda:N nvml_delta`` (empty where a cell has no figure)."""
        devices = self.gpu_devices()
        return [_flat(r, devices) for r in self._records]

    def to_csv(self, path: Union[str, Any]) -> None:
        """Write one row per cell to ``path`` (columns as :meth:`rows`; bytes and seconds as numbers)."""
        with open(path, "w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, fieldnames=self.columns())
            writer.writeheader()
            for row in self.rows():
                writer.writerow({k: "" if v is None else v for k, v in row.items()})

    @classmethod
    def from_csv(cls, path: Union[str, Any], keep: int = DEFAULT_KEEP) -> CellRecords:
        """Read a file written by :meth:`to_csv` back into records."""
        with open(path, newline="", encoding="utf-8") as source:
            reader = csv.DictReader(source)
            names = reader.fieldnames or ()
            found = [_COLUMN.fullmatch(name) for name in names]
            devices = sorted({(m["kind"], int(m["index"] or 0)) for m in found if m})
            records = []
            for row in reader:
                gpus = []
                for kind, index in devices:
                    label = device_label(kind, index)
                    if row[f"{label} delta"] == "":
                        continue
                    gpus.append(CellGPU(index, int(row[f"{label} delta"]), int(row[f"{label} peak"]),
                                        _int(row[f"{label} nvml_delta"]), kind))
                records.append(CellRecord(
                    _int(row["number"]), row["first_line"], float(row["start"]),
                    float(row["seconds"]), _int(row["rss_delta"]), _int(row["rss_peak"]),
                    tuple(gpus)))
        return cls(records, keep)

    def to_pandas(self) -> Any:
        """A pandas DataFrame with one row per cell (columns as :meth:`rows`). pandas is imported only
        here; without it this raises ImportError saying what to install."""
        try:
            import pandas
        except ImportError:
            raise ImportError("CellRecords.to_pandas() needs pandas (pip install pandas); "
                              "to_dict() and to_csv() work without it") from None
        return pandas.DataFrame(self.rows(), columns=self.columns())

    # ---- reprs ------------------------------------------------------------------------------------
    def _summary(self) -> list:
        t = self.totals()
        first = self._records[0].start if self._records else None
        since = "" if first is None else " since " + time.strftime("%H:%M:%S", time.localtime(first))
        cells = f"{t['cells']} cell{'' if t['cells'] == 1 else 's'}{since}"
        lines = [f"{cells} ({t['dropped']} older dropped)" if t["dropped"] else cells,
                 f"total time {fmt_seconds(t['seconds'])} · host RSS {fmt_bytes(t['rss_delta'], signed=True)}"
                 + ("" if t["rss_peak"] is None else f" (highest peak {fmt_bytes(t['rss_peak'])})")]
        for label, g in t["gpus"].items():
            lines.append(f"{label}: allocated {fmt_bytes(g['delta'], signed=True)} "
                         f"(highest peak {fmt_bytes(g['peak'])})")
        return lines

    def _top_table(self) -> Optional[Table]:
        top = self.top()
        if not top:
            return None
        has_gpu = bool(self.gpu_devices())
        heads = ["cell", "first line", "time", "Δ RSS", "peak RSS"]
        if has_gpu:
            heads += ["Δ allocated", "peak allocated"]
        table = Table(heads, align="llrrr" + ("rr" if has_gpu else ""),
                      title=f"top {len(top)} by peak memory")
        for r in top:
            row = ["" if r.number is None else f"[{r.number}]", r.first_line[:50], fmt_seconds(r.seconds),
                   fmt_bytes(r.rss_delta, signed=True), fmt_bytes(r.rss_peak)]
            if has_gpu:
                row += [fmt_bytes(sum(g.delta for g in r.gpus), signed=True), fmt_bytes(r.gpu_peak)]
            table.add(*row)
        return table

    def __repr__(self) -> str:
        return f"<CellRecords: {len(self)} cells, {self.dropped} dropped>"

    def report(self) -> Report:
        """The summary (the number of cells, totals), then the cells that peaked highest."""
        summary = self._summary()
        return Report([Lines(summary[1:]), self._top_table()],
                      title="%gpumem records: " + summary[0], indent="  ")
