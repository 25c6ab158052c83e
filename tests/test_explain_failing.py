"""explain/failing.py: the user's failing line of a traceback (the outermost cell frame, and the deepest
one when it raised in a function defined in a cell), read as strings; what every explanation shows first."""
from __future__ import annotations

import functools
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


# ---- inside a magic: IPython's call of the magic is not the user's line -------------------------------

def _cache(name: str, source: str) -> None:
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)


class _Shell:
    """Runs a magic's cell as a cell magic does: the body compiled under a cell file of its own, whose
    line 1 is the magic's line (a comment), in the user's namespace; ``wrap`` puts it in a function, as
    %%cudatime does."""

    def __init__(self, ns: dict, wrap: bool = False) -> None:
        self.ns, self.wrap = ns, wrap

    def run_cell_magic(self, name: str, line: str, body: str) -> None:
        self.run(f"# %%{name} {line}\n{body}")

    def run_line_magic(self, name: str, statement: str) -> None:
        self.run(statement)

    def run(self, source: str) -> None:
        inner = f"<magic-body-{len(source)}>"
        _cache(inner, source)
        if self.wrap:  # a function the magic made: its def is not in the cell
            import ast

            tree = ast.parse(source)
            func = ast.parse("def _magic_loop():\n    pass\n").body[0]
            func.body = tree.body
            module = ast.fix_missing_locations(ast.Module([func], []))
            local: dict = {}
            exec(compile(module, inner, "exec"), self.ns, local)
            local["_magic_loop"]()
        else:
            exec(compile(source, inner, "exec"), self.ns)


def _raised_in(outer: str, ns: dict) -> BaseException:
    _cache(CELL, outer)
    try:
        exec(compile(outer, CELL, "exec"), ns)
    except RuntimeError as exc:
        return exc
    raise AssertionError("the cell did not raise")


def _cells(filename: str) -> bool:
    return filename == CELL or filename.startswith("<magic-body-") or filename == "<other-cell>"


def _failing() -> None:
    raise RuntimeError("boom")


def test_inside_a_cell_magic_the_failing_line_is_the_cells_not_ipythons_call():
    for wrap in (False, True):
        ns: dict = {"fail": _failing}
        ns["get_ipython"] = functools.partial(_Shell, ns, wrap)
        outer = "get_ipython().run_cell_magic('ontorch', 'cpu', 'h = 2\\nfail()\\n')\n"
        found = failing_line(_raised_in(outer, ns), _cells)
        assert found == FailingLine("fail()", 3), (wrap, found)  # line 3 of the cell the user sees


def test_a_function_called_from_a_cell_magic_is_the_inner_line():
    ns: dict = {}
    ns["get_ipython"] = lambda: _Shell(ns)
    exec(compile("def f(a):\n    raise RuntimeError(a)\n", "<other-cell>", "exec"), ns)
    _cache("<other-cell>", "def f(a):\n    raise RuntimeError(a)\n")
    found = failing_line(_raised_in("get_ipython().run_cell_magic('cudamem', '', 'x = 1\\nf(x)\\n')\n", ns),
                         _cells)
    assert found.lines() == ["On line 3: f(x)", "  inside f(), line 2: raise RuntimeError(a)"]


def test_a_line_magic_further_down_the_cell_keeps_the_cells_numbering():
    ns = {"fail": _failing}
    ns["get_ipython"] = lambda: _Shell(ns, wrap=True)
    outer = "x = 1\ny = 2\nget_ipython().run_line_magic('cudatime', 'fail()')\n"
    found = failing_line(_raised_in(outer, ns), _cells)
    assert found == FailingLine("fail()", 3)


def test_a_magic_that_runs_a_function_of_another_cell_is_not_stepped_into():
    """%%time (whose code is not a cell's) calling f defined in another cell: the magic's line stays the
    user's line, and f is where it raised."""
    ns: dict = {}
    _cache("<other-cell>", "def f():\n    raise RuntimeError('x')\n")
    exec(compile("def f():\n    raise RuntimeError('x')\n", "<other-cell>", "exec"), ns)

    class Timer:
        def run_cell_magic(self, name, line, body):
            exec(compile(body, "<timed exec>", "exec"), ns)

    ns["get_ipython"] = Timer
    outer = "get_ipython().run_cell_magic('time', '', 'f()\\n')\n"
    found = failing_line(_raised_in(outer, ns), _cells)
    assert (found.lineno, found.inner_function, found.inner_lineno) == (1, "f", 2)
    assert found.line.startswith("get_ipython().run_cell_magic('time'")
