"""Every place that names a cell agrees with the ``In[n]`` the user sees, on IPython 9 and on 7.34.

IPython 8+ adds one to ``execution_count`` before a cell runs and 7.x after it, so a magic that read the
count while its cell ran named the *next* cell on one leg ("Cell In[6]" under In[5]). The cells here run
with history, as a notebook or terminal runs them.
"""
from __future__ import annotations

import re

import IPython
import pytest
from IPython.utils.capture import capture_output

NEW_STYLE = int(IPython.__version__.split(".")[0]) >= 8


def _label(number: int) -> str:
    """How this IPython names cell ``number`` in a traceback."""
    return f"Cell In[{number}]" if NEW_STYLE else f"<ipython-input-{number}-"


def _cell(ip, code):
    """Run ``code`` as a numbered cell; (its result, what it printed and displayed as text)."""
    with capture_output() as cap:
        result = ip.run_cell(code, store_history=True)
    shown = [o.data.get("text/plain", "") for o in cap.outputs]
    return result, "\n".join([cap.stdout, *shown])


@pytest.fixture
def hist(ip):
    ip.run_cell("import torch", store_history=True).raise_error()
    return ip


@pytest.mark.parametrize("magic", ["%%ontorch cpu", "%%cudatime -n 1 -r 3"])
def test_a_magic_cells_traceback_names_the_cell_it_ran_in(hist, magic):
    result, out = _cell(hist, f"{magic}\nx = 1\nraise ValueError('boom')")
    number = result.execution_count
    assert isinstance(result.error_in_exec, ValueError) and number == hist.execution_count - 1
    frames = re.findall(r"Cell In\[\d+\]|<ipython-input-\d+-", out)
    assert frames and set(frames) == {_label(number)}, out


def test_syntax_errors_in_a_timed_cell_name_it_too(hist):
    result, out = _cell(hist, "%%cudatime -n 1 -r 3\nx = (")
    assert _label(result.execution_count) in out or f"In[{result.execution_count}]" in out, out


def test_gpumem_lines_records_and_panel_name_the_cell(hist):
    _cell(hist, "%gpumem --text")
    numbers = []
    for code in ("a = 1", "b = bytearray(10)", "c = 3"):
        result, out = _cell(hist, code)
        numbers.append(result.execution_count)
        assert f"[gpumem] In[{result.execution_count}] " in out, out
    records = hist.run_line_magic("gpumem", "--records")
    assert [r.number for r in records][-3:] == numbers
    assert [r.first_line for r in records][-3:] == ["a = 1", "b = bytearray(10)", "c = 3"]
    _cell(hist, "%gpumem stop")


def test_the_panels_closing_lines_carry_cell_numbers(hist):
    pytest.importorskip("ipywidgets")
    _cell(hist, "%gpumem --widget")
    result, _ = _cell(hist, "snap = 1")
    _, out = _cell(hist, "%gpumem stop")
    assert f"[gpumem] In[{result.execution_count}] " in out, out
