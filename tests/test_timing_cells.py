"""Compile once (torchgpu_magic/timing/cells.py): the setup runs once in the cell's scope, loops run
n times, hooks wrap every loop, and errors keep the cell's own filename and line."""
from __future__ import annotations

import pytest

from torchgpu_magic import timing


def test_setup_runs_once_in_the_cell_scope_and_loops_run_n_times():
    ns = {"log": []}
    cell = timing.compile_cell("count += 1\nlog.append(count)", ns, setup="count = 10\nlog.append('setup')")
    cell.start()
    cell.run(3)
    cell.run(2)
    assert ns["log"] == ["setup", 11, 12, 13, 14, 15]
    assert "count" not in ns  # like %timeit, the cell's names stay local
    cell.start()  # a fresh start runs the setup again (another device row)
    cell.run(1)
    assert ns["log"][-2:] == ["setup", 11]


def test_hooks_wrap_every_loop():
    ns = {"log": []}
    cell = timing.compile_cell("log.append('x')", ns)
    cell.start()
    cell.run(2, lambda: ns["log"].append("<"), lambda: ns["log"].append(">"))
    assert ns["log"] == ["<", "x", ">", "<", "x", ">"]


@pytest.mark.parametrize("code", ["return 1", "yield 1", "x = (", "await f()"])
def test_code_illegal_at_top_level_stays_a_syntax_error(code):
    with pytest.raises(SyntaxError):
        timing.compile_cell(code, {})


def test_errors_keep_the_cell_filename_and_line():
    cell = timing.compile_cell("a = 1\nb = 1 / 0", {}, filename="<my-cell>")
    cell.start()
    with pytest.raises(ZeroDivisionError) as info:
        cell.run(1)
    last = info.traceback[-1]
    assert str(last.path) == "<my-cell>" and last.lineno + 1 == 2
