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


MAGICS = ["%%ontorch cpu", "%%cudatime -n 1 -r 3", "%%cudamem"]
# Cells that fail in a magic, and the line the traceback must show with its text: (cell, "----> k text").
RAISE = "raise ValueError('boom')"
FAILING = [(f"{magic}\nx = 1\n{RAISE}", f"----> 3 {RAISE}") for magic in MAGICS]
FAILING += [(f"%%cudatime -n 1 -r 3 y = 2\nx = 1\n{RAISE}", f"----> 3 {RAISE}"),
            ("x = 1\n%cudatime -n 1 -r 3 int('boom')", "----> 1 int('boom')")]


def _arrow(out: str) -> list:
    """The '---->' lines of a traceback, without the cell's path and spacing IPython 7 puts around them."""
    return [" ".join(line.split()) for line in out.splitlines() if line.lstrip().startswith("---->")]


@pytest.mark.parametrize("magic", MAGICS)
def test_a_magic_cells_traceback_names_the_cell_it_ran_in(hist, magic):
    result, out = _cell(hist, f"{magic}\nx = 1\nraise ValueError('boom')")
    number = result.execution_count
    assert isinstance(result.error_in_exec, ValueError) and number == hist.execution_count - 1
    frames = re.findall(r"Cell In\[\d+\]|<ipython-input-\d+-", out)
    assert frames and set(frames) == {_label(number)}, out


@pytest.mark.parametrize("compiler", ["ipython", "ipykernel"])
@pytest.mark.parametrize("cell, arrow", FAILING)
def test_a_magic_cells_traceback_shows_the_failing_lines_text(hist, monkeypatch, compiler, cell, arrow):
    """The failing line with its text, numbered as in the cell, under IPython's compiler and under
    ipykernel's (which names cells as files in a temporary directory, not on disk: IPython 9 then read a
    function's lines from its def, and %%cudatime's loop showed a blank line, or none)."""
    if compiler == "ipykernel":
        xcompiler = pytest.importorskip("ipykernel.compiler")
        monkeypatch.setattr(hist, "compile", xcompiler.XCachingCompiler())
    result, out = _cell(hist, cell)
    assert result.error_in_exec is not None
    assert arrow in _arrow(out), out
    assert "Could not get source" not in out
    if NEW_STYLE:
        assert f"Cell In[{result.execution_count}]" in out, out


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


@pytest.mark.notebook
def test_traceback_lines_and_numbers_in_a_real_kernel():
    """The same cells in a real Jupyter kernel (ipykernel's compiler, nbclient): every magic's traceback
    names its own cell and shows the failing line's text (on IPython 7, ipykernel names the cell itself
    by a temporary file; the magic's code is named by its cell's number)."""
    pytest.importorskip("nbclient", reason="needs nbclient and nbformat (the IPython 7 leg has neither)")
    import importlib.util

    import nbformat
    from conftest import ROOT
    from nbclient import NotebookClient

    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext torchgpu_magic\nimport torch")]
    nb.cells += [nbformat.v4.new_code_cell(cell) for cell, _ in FAILING]
    with runner.this_python_kernel() as kernel:
        NotebookClient(nb, kernel_name=kernel, timeout=300, allow_errors=True,
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    for cell, (_, arrow) in zip(nb.cells[1:], FAILING):
        text = runner.cell_text(cell)
        assert arrow in _arrow(text), text
        labels = {a or b for a, b in re.findall(r"Cell In\[(\d+)\]|<ipython-input-(\d+)-", text)}
        assert labels == {str(cell.execution_count)}, text
