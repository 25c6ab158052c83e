"""Compile a cell once (method step 1), and silence what it prints.

:func:`compile_cell` puts the cell's (already transformed) body in a loop inside one generator function,
as IPython's ``%timeit`` puts it in ``inner(_it, _timer)``; the setup statement runs once, in the same
scope, when the generator starts. No ``exec`` per loop, so a fast cell is not drowned in overhead.
Standard library only.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import io
import itertools
from typing import Any, Callable, Iterator, Optional, Union

# The def on line 1, where the magic's own line is: a traceback reads a function's lines from its first
# line, which must be within the cell's (a one-line %cudatime STATEMENT has only line 1).
_TEMPLATE = """def _cudatime_cell():
    setup
    _cudatime_args = yield
    while True:
        _cudatime_it, _cudatime_before, _cudatime_after = _cudatime_args
        if _cudatime_before is None:
            for _cudatime_i in _cudatime_it:
                stmt
        else:
            for _cudatime_i in _cudatime_it:
                _cudatime_before()
                stmt
                _cudatime_after()
        _cudatime_args = yield
"""


class _Filler(ast.NodeTransformer):
    """Replace the template's bare ``setup`` / ``stmt`` lines with the bodies (IPython's
    ``TimeitTemplateFiller``), keeping the user's line numbers so tracebacks point at the cell."""

    def __init__(self, setup: list, stmt: list) -> None:
        self.bodies = {"setup": setup, "stmt": stmt}

    def visit_Expr(self, node: ast.Expr) -> Any:
        if isinstance(node.value, ast.Name) and node.value.id in self.bodies:
            return copy.deepcopy(self.bodies[node.value.id])
        return node


class CompiledCell:
    """A cell compiled once into a generator that runs ``loops`` iterations per :meth:`run`.

    :meth:`start` runs the setup (in the same scope as the cell, as ``%%timeit`` does) and must come
    before :meth:`run`; calling it again starts afresh (a new setup, e.g. on another device).
    """

    def __init__(self, factory: Callable[[], Any], filename: str, stmt: str = "", setup: str = "") -> None:
        self._factory = factory
        self._gen: Any = None
        self.filename = filename
        self.stmt = stmt  # the source timed, and its setup: the task a result names
        self.setup = setup
        self.code = factory.__code__  # the loop function's code (setup and cell; nested code in its consts)
        self.namespace: dict = factory.__globals__  # the globals the cell runs in (the user's namespace)

    def start(self) -> None:
        """Run the setup statement and get ready to run loops."""
        self.close()
        gen = self._factory()
        next(gen)
        self._gen = gen

    def run(self, loops: int, before: Optional[Callable[[], Any]] = None,
            after: Optional[Callable[[], Any]] = None) -> None:
        """Run the cell ``loops`` times; ``before`` / ``after`` (both or neither) wrap every loop."""
        if self._gen is None:
            self.start()
        self._gen.send((itertools.repeat(None, loops), before, after))

    def close(self) -> None:
        """Drop the generator (and with it the setup's locals)."""
        if self._gen is not None:
            self._gen.close()
            self._gen = None


def compile_cell(stmt: Union[str, ast.Module], namespace: dict, setup: Union[str, ast.Module] = "",
                 filename: str = "<cudatime>") -> CompiledCell:
    """Compile ``stmt`` (and ``setup``) once into a :class:`CompiledCell` whose globals are ``namespace``.

    ``stmt`` and ``setup`` are source already transformed by the shell (IPython's ``transform_cell``),
    as text or as parsed modules (after ``transform_ast``). Each is compiled on its own first, so a
    ``return`` or ``yield`` that would become legal inside the loop function is still a SyntaxError.
    """
    setup_ast, stmt_ast = (code if isinstance(code, ast.Module) else ast.parse(code or "pass", filename)
                           for code in (setup, stmt))
    for module in (setup_ast, stmt_ast):
        compile(module, filename, "exec", dont_inherit=True)
    template = ast.parse(_TEMPLATE)
    filled = _Filler(setup_ast.body or [ast.Pass()], stmt_ast.body or [ast.Pass()]).visit(template)
    code = compile(ast.fix_missing_locations(filled), filename, "exec", dont_inherit=True)
    local: dict = {}
    exec(code, namespace, local)  # defines the generator function only; runs nothing of the cell
    return CompiledCell(local["_cudatime_cell"], filename, _source(stmt), _source(setup))


def _source(code: Union[str, ast.Module]) -> str:
    return code if isinstance(code, str) else ast.unparse(code)


class _NullWriter(io.TextIOBase):
    """A text sink that keeps nothing (a cell that prints in every loop must not grow memory)."""

    def write(self, text: str) -> int:
        return len(text)


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Discard what the cell prints to stdout / stderr (runs after the first)."""
    sink = _NullWriter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield

