"""The user's failing line in a traceback, which every explanation of an error puts first: the line of the
user's cell that was running (what the user ran), and, when the error was raised deeper in a function or
``forward`` defined in a cell, the deepest such frame (where it went wrong in their own code).

Inside a cell magic (``%%ontorch``, ``%%cudatime``, ``%%cudamem``, or a line magic such as ``%cudatime
STATEMENT``) the outermost cell frame is not the user's line but IPython's call of the magic
(``get_ipython().run_cell_magic('ontorch', 'cpu', '...')``): the user's line is in the code the magic
compiled from the cell. :func:`user_frames` steps through such calls, and numbers the line as the cell
shows it: the magics compile a cell so that its line 1 is the magic's own line, so line ``k`` of that
code is line ``k`` of the cell, counted from the line that called the magic.

Used by the mismatch diagnosis (:mod:`.mismatch`, which also resolves the names on those lines), by the
out-of-memory explanation (:mod:`torchgpu_magic.explain.outofmemory`), and by the traceback's folding
(the magic call is part of the machinery). :func:`failing_line` keeps strings and numbers only, never a
frame.
"""
from __future__ import annotations

import linecache
import re
import traceback
from typing import Any, Callable, NamedTuple, Optional

_MAGIC_CALL = re.compile(r"\bget_ipython\(\)\.run_(?:cell|line)_magic\(")
"""How IPython's transforms write a magic in a cell's code (IPython 7 to 9)."""


class FailingLine(NamedTuple):
    """The user's failing line (``line``, ``lineno``) and, when it raised inside a function defined in a
    cell, that function's line too (``inner_*``; empty otherwise). Strings and numbers."""

    line: str = ""
    lineno: Optional[int] = None
    inner_line: str = ""
    inner_lineno: Optional[int] = None
    inner_function: str = ""

    def lines(self) -> list:
        """'On line 6: net(x)', and '  inside forward(), line 4: attn = x @ x.T' when it raised there."""
        if not self.line:
            return []
        where = f"line {self.lineno}" if self.lineno else "the failing line"
        out = [f"On {where}: {self.line.strip()}"]
        if self.inner_line:
            out.append(f"  inside {self.inner_function}(), line {self.inner_lineno}: "
                       f"{self.inner_line.strip()}")
        return out

    def to_dict(self) -> dict:
        return self._asdict()


class CellFrame(NamedTuple):
    """A frame of the user's code in a traceback: the ``frame``, the line it was on in its own code
    (``lineno``, what ``linecache`` reads) and that line's number as the user's cell shows it
    (``shown``: different inside a line magic that is not on the cell's first line)."""

    frame: Any
    lineno: int
    shown: int


def cell_frames(tb: Any, is_cell_file: Callable[[str], bool]) -> list:
    """(frame, line number) of each entry of ``tb`` whose file ``is_cell_file`` accepts, outermost first
    (the list holds the frames: its caller lets go of it when done)."""
    return [(frame, lineno) for frame, lineno in traceback.walk_tb(tb)
            if is_cell_file(frame.f_code.co_filename)]


def source_line(frame: Any, lineno: Optional[int]) -> str:
    """The text of line ``lineno`` of ``frame``'s code (cells are in linecache), without its newline."""
    return linecache.getline(frame.f_code.co_filename, lineno or 0).rstrip("\n")


def compiled_by_magic(frame: Any) -> bool:
    """True when ``frame`` runs code a magic compiled from a cell's text: module-level code, or a function
    the magic wrapped the cell in (``%%cudatime``'s loop), whose ``def`` is not in the cell. A function the
    user defined (its ``def`` on its first lines) is the user's own, even when a magic called it."""
    code = frame.f_code
    if code.co_name == "<module>":
        return True
    head = " ".join(source_line(frame, code.co_firstlineno + k) for k in range(8))
    return re.search(rf"\b(?:def|class)\s+{re.escape(code.co_name)}\b|\blambda\b", head) is None


def user_frames(tb: Any, is_cell_file: Callable[[str], bool]) -> list:
    """The :class:`CellFrame` of each cell frame of ``tb``, the user's line first: IPython's calls of a
    magic are stepped over into the code the magic compiled from the cell (see the module's docstring).
    The list holds frames: its caller lets go of it when done."""
    frames = cell_frames(tb, is_cell_file)
    offset = 0
    while len(frames) > 1 and _MAGIC_CALL.search(source_line(*frames[0])) and compiled_by_magic(frames[1][0]):
        offset += frames[0][1] - 1  # the magic's line 1 is the line that called it
        frames = frames[1:]
    if not frames:
        return []
    filename = frames[0][0].f_code.co_filename
    return [CellFrame(frame, lineno, lineno + offset if frame.f_code.co_filename == filename else lineno)
            for frame, lineno in frames]


def magic_calls(tb: Any, is_cell_file: Callable[[str], bool]) -> set:
    """The ids of the frames of ``tb`` that only hand the user's cell to a cell magic (the one line
    ``get_ipython().run_cell_magic(...)`` that IPython makes of a ``%%magic`` cell, stepped over by
    :func:`user_frames`): machinery, not the user's code. A line magic's frame stays: its cell's other
    lines are the user's."""
    kept = {id(cell.frame) for cell in user_frames(tb, is_cell_file)}
    return {id(frame) for frame, lineno in cell_frames(tb, is_cell_file)
            if id(frame) not in kept and "run_cell_magic(" in source_line(frame, lineno)}


def failing_line(exc: BaseException, is_cell_file: Callable[[str], bool]) -> FailingLine:
    """The :class:`FailingLine` of ``exc``'s traceback (empty when no frame is a cell's)."""
    return line_of(user_frames(exc.__traceback__, is_cell_file))


def line_of(frames: list) -> FailingLine:
    """The :class:`FailingLine` of the cell frames :func:`user_frames` found (empty for none)."""
    if not frames:
        return FailingLine()
    outer = frames[0]
    found = FailingLine(source_line(outer.frame, outer.lineno), outer.shown)
    if len(frames) > 1:
        inner = frames[-1]
        found = found._replace(inner_line=source_line(inner.frame, inner.lineno), inner_lineno=inner.shown,
                               inner_function=inner.frame.f_code.co_name)
    return found
