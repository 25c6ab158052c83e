"""records.py: per-cell records as plain data: bounded, exported to CSV / pandas / dicts, shown as text."""
from __future__ import annotations

import sys

import pytest
from IPython.core.formatters import PlainTextFormatter

from torchgpu_magic.gpumem.records import CellGPU, CellRecord, CellRecords

MiB = 1024 * 1024


def _record(n: int, gpus: tuple = ()) -> CellRecord:
    return CellRecord(n, f"cell_{n}()", 1_700_000_000.0 + n, 0.001 * n, n * MiB, 100 * MiB + n, gpus)


def test_bounded_with_the_count_of_dropped_ones_oldest_first():
    records = CellRecords(keep=3)
    for n in range(10):
        records.append(_record(n))
    assert [r.number for r in records] == [7, 8, 9]
    assert records.dropped == 7 and len(records) == 3
    assert records[-1].number == 9 and [r.number for r in records.last(2)] == [8, 9]
    copy = records.copy()
    records.append(_record(10))
    assert [r.number for r in copy] == [7, 8, 9] and copy.dropped == 7
    with pytest.raises(ValueError):
        CellRecords(keep=0)


def test_csv_round_trip_with_and_without_gpu_figures(tmp_path):
    records = CellRecords([
        _record(1),
        _record(2, (CellGPU(0, 2 * MiB, 3 * MiB, 4 * MiB), CellGPU(1, -MiB, 0, None))),
        CellRecord(None, 'print("a, \\"quoted\\" line")', 1.5, 0.25, None, None, ()),
    ])
    path = tmp_path / "cells.csv"
    records.to_csv(path)
    back = CellRecords.from_csv(path)
    assert list(back) == list(records)
    header = path.read_text().splitlines()[0]
    assert header.startswith("number,first_line,start,seconds,rss_delta,rss_peak,cuda:0 delta")
    assert CellRecords.from_dict(records.to_dict()).to_dict() == records.to_dict()


def test_to_pandas_has_one_row_per_cell():
    pandas = pytest.importorskip("pandas")
    records = CellRecords([_record(1), _record(2, (CellGPU(0, MiB, 2 * MiB),))])
    frame = records.to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame["number"]) == [1, 2]
    assert frame["cuda:0 peak"].tolist()[1] == 2 * MiB
    assert pandas.isna(frame["cuda:0 peak"].tolist()[0])


def test_to_pandas_without_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(ImportError, match=r"pip install pandas.*to_csv\(\) work without it"):
        CellRecords([_record(1)]).to_pandas()


def test_text_and_html_show_totals_and_top_cells_by_peak():
    records = CellRecords([_record(1), _record(2, (CellGPU(0, 5 * MiB, 900 * MiB),)), _record(3)], keep=3)
    records.append(_record(4))
    text = PlainTextFormatter()(records)
    assert text.startswith("%gpumem records: 3 cells since") and "(1 older dropped)" in text
    assert "cuda:0: allocated +5.00 MiB (highest peak 900 MiB)" in text
    lines = text.splitlines()
    first_row = next(i for i, line in enumerate(lines) if line.strip().startswith("["))
    assert lines[first_row].strip().startswith("[2]")  # highest GPU peak first
    assert "<table" in records._repr_html_() and "cell_2()" in records._repr_html_()
    assert PlainTextFormatter()(CellRecords()).startswith("%gpumem records: 0 cells")


def test_one_line_per_cell_like_autotime():
    record = CellRecord(3, "x", 0.0, 1.234, 512 * MiB, 1126 * MiB, (CellGPU(0, 2048 * MiB, 3174 * MiB),))
    assert record.line() == ("[gpumem] In[3] 1.23 s · host +512 MiB (peak 1.10 GiB) · "
                             "cuda:0 +2.00 GiB (peak 3.10 GiB)")
    assert CellRecord(3, "x", 0.0, 0.5, None, None).line() == "[gpumem] In[3] 500 ms · host N/A"
    assert CellRecord(None, "x", 0.0, 0.5, None, None).line() == "[gpumem] 500 ms · host N/A"
