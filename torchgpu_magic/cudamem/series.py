"""The step's memory over its events: every allocation and free the tracker saw, with the category, phase,
module, operator and cell line of each, recorded as the step runs and read back as columns.

A :class:`~.allocator.Ledger` appends one row per event to a :class:`StepSeries` (a few typed arrays, so
that recording costs a handful of appends per event, not an object); what the series is read for, the
live bytes by category after each event, is replayed from them on demand. Row 0 is the cell's start (what
it held before it ran); row ``i`` is the state after event ``i``. :meth:`StepSeries.sample` thins a long
series for drawing (first, last, lowest and highest row of each column of pixels, and the peak row
always), so the shape and the peak stay exact. :meth:`StepSeries.to_dict` gives the columns as lists and
:meth:`StepSeries.to_pandas` a DataFrame, for a user to plot their way.

Standard library only (pandas is imported by :meth:`StepSeries.to_pandas` alone).
"""
from __future__ import annotations

import itertools
import linecache
from array import array
from typing import Any, Iterator, Optional

KINDS = ("start", "alloc", "free", "recategorize")
"""What a row is: the cell's start, a storage allocated, a storage freed, a storage found to be of another
category (a gradient first seen as a temporary): bytes move between categories, the total stays."""

_START, _ALLOC, _FREE, _MOVE = range(4)
_KIND_CODE = {name: i for i, name in enumerate(KINDS)}


class StepSeries:
    """The rows of one device's ledger over the step (see the module's docstring).

    ``categories`` and ``phases`` name the category and phase indices the rows hold (``category_index``:
    a category's); ``modules`` and ``ops`` are filled as names appear; ``peak_row`` is set by the ledger
    to the row of its peak, and ``texts`` (line number -> source) by :meth:`read_lines` after the run.
    """

    def __init__(self, categories: tuple, phases: tuple) -> None:
        self.categories = categories
        self.phases = phases
        self.modules: list = []
        self.ops: list = []
        self.texts: dict = {}
        self.peak_row = 0
        self.baseline = [0] * len(categories)
        self._kind = array("b", [_START])
        self._category = array("b", [-1])
        self._source = array("b", [-1])
        self._bytes = array("q", [0])
        self._phase = array("b", [0])
        self._module = array("i", [-1])
        self._op = array("i", [-1])
        self._line = array("i", [0])
        self._module_index: dict = {}
        self._op_index: dict = {}
        self.category_index = {name: i for i, name in enumerate(categories)}
        self._phase_code = {name: i for i, name in enumerate(phases)}

    # ---- recording (the ledger) -------------------------------------------------------------------
    def start(self, by_category: dict) -> None:
        """Row 0: the live bytes by category as the cell starts."""
        self.baseline = [by_category.get(name, 0) for name in self.categories]
        self._bytes[0] = sum(self.baseline)

    def record(self, kind: str, category: str, nbytes: int, phase: str, module: Optional[str],
               op: Optional[str], line: Optional[int], source: Optional[str] = None) -> None:
        """One event of ``kind`` ('alloc', 'free' or 'recategorize'), ``nbytes`` of ``category`` (moved
        from ``source`` for 'recategorize'), in ``phase`` and ``module``, during operator ``op``, from
        ``line`` of the cell (None or 0: unknown)."""
        self._kind.append(_KIND_CODE[kind])
        self._category.append(self.category_index[category])
        self._source.append(self.category_index[source] if source is not None else -1)
        self._bytes.append(nbytes)
        self._phase.append(self._phase_code[phase])
        self._module.append(self._intern(module, self.modules, self._module_index))
        self._op.append(self._intern(op, self.ops, self._op_index))
        self._line.append(line or 0)

    @staticmethod
    def _intern(name: Optional[str], names: list, index: dict) -> int:
        if name is None:
            return -1
        found = index.get(name)
        if found is None:
            found = index[name] = len(names)
            names.append(name)
        return found

    def name_modules(self, names: dict) -> None:
        """Give the modules the names the report uses (MemTracker's ``'Sequential.0'`` -> ``'model.0'``)."""
        self.modules = [names.get(name, name) for name in self.modules]

    def read_lines(self, filename: Optional[str]) -> None:
        """Keep the source of each cell line the rows name, from the cell registered as ``filename``."""
        if filename is None:
            return
        for number in sorted(set(self._line) - {0}):
            text = linecache.getline(filename, number).strip()
            if text:
                self.texts[number] = text

    # ---- reading ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Rows: the start and one per event."""
        return len(self._kind)

    @property
    def events(self) -> int:
        """Allocations, frees and recategorizations recorded."""
        return len(self._kind) - 1

    def totals(self) -> list:
        """The live bytes after each row (row 0: before the cell)."""
        signed = [0 if kind == _MOVE else -size if kind == _FREE else size
                  for kind, size in zip(self._kind, self._bytes)]
        signed[0] = sum(self.baseline)
        return list(itertools.accumulate(signed))

    def _replay(self) -> Iterator[list]:
        """The live bytes by category after each row, in order (one list, updated in place)."""
        live = list(self.baseline)
        for kind, category, source, size in zip(self._kind, self._category, self._source, self._bytes):
            if kind == _ALLOC:
                live[category] += size
            elif kind == _FREE:
                live[category] -= size
            elif kind == _MOVE:
                live[source] -= size
                live[category] += size
            yield live

    def categories_at(self, rows: list) -> list:
        """For each of ``rows``, the live bytes by category after it (a list per row, in the order of
        :attr:`categories`)."""
        wanted = set(rows)
        found = {row: list(live) for row, live in zip(range(max(rows, default=-1) + 1), self._replay())
                 if row in wanted}
        return [found[row] for row in rows]

    def where(self, row: int) -> dict:
        """Phase, module, operator and cell line (number and source) of ``row``."""
        module, op, line = self._module[row], self._op[row], self._line[row]
        return {"phase": self.phases[self._phase[row]],
                "module": self.modules[module] if module >= 0 else None,
                "op": self.ops[op] if op >= 0 else None, "line": line or None, "source": self.texts.get(line)}

    def phase_spans(self) -> list:
        """``(phase, first row, last row)`` for each run of rows in one phase, in order."""
        spans: list = []
        for phase, rows in itertools.groupby(range(len(self._phase)), key=self._phase.__getitem__):
            rows = list(rows)
            spans.append((self.phases[phase], rows[0], rows[-1]))
        return spans

    def highest(self) -> dict:
        """Each category's highest live bytes over the step."""
        best = list(self.baseline)
        for category, live in zip(self._category, self._replay()):  # row 0 (category -1) changes nothing
            best[category] = max(best[category], live[category])
        return dict(zip(self.categories, best))

    def phase_peaks(self) -> dict:
        """Each phase's highest total, reached at an allocation (row 0 for the first phase, what the cell
        held before it ran), in the order of :attr:`phases`."""
        totals = self.totals()
        highs = {0: totals[0]}
        for row, (kind, phase) in enumerate(zip(self._kind, self._phase)):
            if kind == _ALLOC and totals[row] > highs.get(phase, -1):
                highs[phase] = totals[row]
        return {self.phases[p]: highs[p] for p in range(len(self.phases)) if p in highs}

    def sample(self, columns: int) -> list:
        """At most about ``4 * columns`` rows that draw as all of them would at ``columns`` pixels across:
        of each column's rows the first, the last, the lowest and the highest total, and the peak row."""
        totals = self.totals()
        count = len(totals)
        if count <= 4 * columns:
            return list(range(count))
        keep = {0, count - 1, self.peak_row}
        for column in range(columns):  # each at least 4 rows
            lo, hi = column * count // columns, (column + 1) * count // columns
            chunk = totals[lo:hi]
            keep.update((lo, hi - 1, lo + chunk.index(min(chunk)), lo + chunk.index(max(chunk))))
        return sorted(keep)

    def to_dict(self) -> dict:
        """The rows as columns of equal length (``pandas.DataFrame(series.to_dict())`` takes them as
        they are): ``row``, ``kind``, ``category`` and ``from category`` (for a recategorization),
        ``bytes`` (the block's size; row 0: what the cell held before it), ``phase``, ``module``, ``op``,
        ``line`` (of the cell), ``total`` and one column per category: the live bytes after the row."""
        count = len(self)
        rows = list(range(count))
        live = self.categories_at(rows)

        def names(codes: array, table: Any) -> list:
            return [table[code] if code >= 0 else None for code in codes]

        out: dict = {
            "row": rows, "kind": [KINDS[k] for k in self._kind],
            "category": names(self._category, self.categories),
            "from category": names(self._source, self.categories), "bytes": list(self._bytes),
            "phase": [self.phases[p] for p in self._phase], "module": names(self._module, self.modules),
            "op": names(self._op, self.ops), "line": [n or None for n in self._line], "total": self.totals(),
        }
        for index, name in enumerate(self.categories):
            out[name] = [values[index] for values in live]
        return out

    def to_pandas(self) -> Any:
        """:meth:`to_dict` as a pandas DataFrame indexed by ``row``. pandas is imported only here;
        without it this raises ImportError saying what to install."""
        try:
            import pandas
        except ImportError:
            raise ImportError("StepSeries.to_pandas() needs pandas (pip install pandas); to_dict() works "
                              "without it") from None
        return pandas.DataFrame(self.to_dict()).set_index("row")

    def __repr__(self) -> str:
        return f"<StepSeries: {self.events} events, peak at row {self.peak_row}>"
