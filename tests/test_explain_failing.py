"""explain/failing.py: the user's failing line of a traceback (the outermost cell frame, and the deepest
one when it raised in a function defined in a cell), read as strings; what every explanation shows first."""
from __future__ import annotations

import linecache

from torchgpu_magic.explain.failing import FailingLine, failing_line

CELL = "<cell-under-test>"
SOURCE = "def step(x):\n    y = x + 1\n    raise RuntimeError('boom')\nstep(1)\n"


def _raised() -> BaseException:
    linecache.cache[CELL] = (len(SOURCE), None, SOURCE.splitlines(True), CELL)
    try:
        exec(compile(SOURCE, CELL, "exec"), {})
    except RuntimeError as exc:
        return exc
    raise AssertionError("the cell did not raise")


def test_the_failing_line_and_where_it_raised_inside():
    found = failing_line(_raised(), lambda filename: filename == CELL)
    assert found == FailingLine("step(1)", 4, "    raise RuntimeError('boom')", 3, "step")
    assert found.lines() == ["On line 4: step(1)", "  inside step(), line 3: raise RuntimeError('boom')"]
    assert found.to_dict()["inner_function"] == "step"


def test_raised_on_the_cells_own_line_and_without_a_cell():
    try:
        exec(compile("1 / 0\n", CELL, "exec"), {})
    except ZeroDivisionError as exc:
        error = exc
    linecache.cache[CELL] = (6, None, ["1 / 0\n"], CELL)
    assert failing_line(error, lambda filename: filename == CELL).lines() == ["On line 1: 1 / 0"]
    assert failing_line(error, lambda filename: False) == FailingLine()
    assert FailingLine().lines() == []
