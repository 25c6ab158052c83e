"""The user's failing line in a traceback, which every explanation of an error puts first: the
outermost frame of a notebook cell (what the user ran), and, when the error was raised deeper in a
function or ``forward`` defined in a cell, the deepest such frame (where it went wrong in their own code).

Used by the mismatch diagnosis (:mod:`.diagnosis`, which also resolves the names on those lines) and by
the out-of-memory explanation (:mod:`torchgpu_magic.explain.outofmemory`). :func:`failing_line` keeps strings
and numbers only, never a frame.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional


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


def cell_frames(tb: Any, is_cell_file: Callable[[str], bool]) -> list:
    """(frame, line number) of each entry of ``tb`` whose file ``is_cell_file`` accepts, outermost first
    (the list holds the frames: its caller lets go of it when done)."""
    frames = []
    while tb is not None:
        if is_cell_file(tb.tb_frame.f_code.co_filename):
            frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def source_line(frame: Any, lineno: Optional[int]) -> str:
    """The text of line ``lineno`` of ``frame``'s code (cells are in linecache), without its newline."""
    import linecache

    return linecache.getline(frame.f_code.co_filename, lineno or 0).rstrip("\n")


def failing_line(exc: BaseException, is_cell_file: Callable[[str], bool]) -> FailingLine:
    """The :class:`FailingLine` of ``exc``'s traceback (empty when no frame is a cell's)."""
    frames = cell_frames(exc.__traceback__, is_cell_file)
    if not frames:
        return FailingLine()
    outer, lineno = frames[0]
    found = FailingLine(source_line(outer, lineno), lineno)
    if len(frames) > 1:
        inner, inner_lineno = frames[-1]
        found = found._replace(inner_line=source_line(inner, inner_lineno), inner_lineno=inner_lineno,
                               inner_function=inner.f_code.co_name)
    return found
