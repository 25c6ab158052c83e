"""The user's cell first: how the extension shows a traceback it can explain, or one that ran through its
own magics.

IPython's traceback of a device-mismatch error is some 25 frames of torch's (about 170 lines in a
terminal) with the explanation under it, after post_run_cell. Here the explanation comes first, then the
frames of the user's own code (cells, and files outside site-packages and the standard library), and
each run of frames inside torch, this package or another library is one line: ``… 23 frames inside
torch``, in ``%xmode Context``'s and ``Plain``'s layouts alike. ``%xmode Verbose`` shows every frame as
IPython does (the explanation still first), ``%xmode Minimal`` the explanation and the error line. Errors
that merely pass through ``%%ontorch`` or ``%%cudatime`` get the same collapsing of the magic machinery
(IPython's, ``decorator``'s and this package's frames), and keep torch's frames as IPython shows them.

How: IPython renders an exception through its ``_render_traceback_`` when it has one (that is how
ipyparallel shows remote errors). :class:`Tracebacks` wraps the shell's ``showtraceback`` (put back
exactly on unload); for an error it explains or collapses it gives the exception a
``_render_traceback_`` for the one call and calls the original, so IPython's own path (``%tb``,
``call_pdb``, ipykernel's error message) is unchanged, and IPython's remembered traceback (what
``%debug`` opens) is the whole one. The explainers are always on, from load to unload: the mismatch
diagnosis (:mod:`torchgpu_magic.explain.mismatch`) and the out-of-memory explanation
(:mod:`torchgpu_magic.explain.outofmemory`). Where the traceback was not ours to show (another extension's
``set_custom_exc`` handler showed it), the explanation comes after the cell (:meth:`Tracebacks.after_cell`).
An explainer or a formatting problem never costs the user their traceback: IPython's own is shown instead.
"""
from __future__ import annotations

import functools
import os
import sysconfig
import traceback
import types
from typing import Any, Callable, Optional

# Frames of the magic machinery: collapsed whenever a traceback passes through this package's magics.
MACHINERY = frozenset({"IPython", "ipykernel", "decorator", "torchgpu_magic", "traitlets"})
HINT = "%xmode Verbose shows them"
_STDLIB = tuple(os.path.normcase(p) for p in {sysconfig.get_paths().get("stdlib", ""),
                                              sysconfig.get_paths().get("platstdlib", "")} if p)



def is_cell_file(shell: Any, filename: str) -> bool:
    """True for the file names IPython compiles cells under, whatever names them: IPython 8+ keeps them
    in its compiler's ``_filename_map``; IPython 7 in ``linecache._ipython_cache``, whether it named them
    (``<ipython-input-N-...>``) or ipykernel did (``/tmp/ipykernel_PID/HASH.py``)."""
    import linecache

    return (filename in getattr(shell.compile, "_filename_map", {})
            or filename in getattr(linecache, "_ipython_cache", {})
            or filename.startswith("<ipython-input-"))


def owner(frame: Any, cell: Callable[[str], bool]) -> Optional[str]:
    """Who a frame's code belongs to: None for the user's own (a cell, a ``<string>``, or a file outside
    site-packages and the standard library), else the top-level package (``torch``, ``IPython``,
    ``torchgpu_magic``), or ``python`` for the standard library."""
    filename = frame.f_code.co_filename
    if cell(filename) or filename.startswith("<"):
        return None
    path = os.path.normcase(os.path.abspath(filename))
    package = str(frame.f_globals.get("__name__", "") or "").split(".")[0]
    if "site-packages" in path or "dist-packages" in path or package == "torchgpu_magic":
        return package or os.path.basename(filename)
    if path.startswith(_STDLIB):
        return "python"
    return None


def _hidden(frame: Any) -> bool:
    """IPython's own rule: a frame whose locals set ``__tracebackhide__`` is left out of tracebacks."""
    try:
        return bool(frame.f_locals.get("__tracebackhide__"))
    except Exception:  # noqa: BLE001 - a frame whose locals cannot be read is not hidden
        return False


def runs(tb: Any, cell: Callable[[str], bool], collapse: Callable[[Optional[str]], bool],
         skip_hidden: bool = True) -> list:
    """The frames of ``tb`` as runs: ``('frame', tb entry)`` for each frame shown, and ``('collapsed',
    count, owners)`` for each run of frames folded into one line (``collapse(owner)`` says which; hidden
    frames are folded into their neighbours' run, or counted as ``IPython``'s). A cell's line that only
    hands the cell to a magic (``get_ipython().run_cell_magic(...)``) counts as ``IPython``'s when the
    frame of the cell's own code follows it."""
    from ..explain.failing import magic_calls

    calls = magic_calls(tb, cell)
    out: list = []
    while tb is not None:
        frame = tb.tb_frame
        who = "IPython" if id(frame) in calls else owner(frame, cell)
        if skip_hidden and _hidden(frame):
            who = who or "IPython"
        elif not collapse(who):
            out.append(("frame", tb))
            tb = tb.tb_next
            continue
        if out and out[-1][0] == "collapsed":
            _, count, owners = out[-1]
            out[-1] = ("collapsed", count + 1, owners if who in owners else owners + (who,))
        else:
            out.append(("collapsed", 1, (who,)))
        tb = tb.tb_next
    return out


def _chain(entries: list) -> Any:
    """A new traceback of just these entries (tracebacks can be built since Python 3.7)."""
    new = None
    for entry in reversed(entries):
        new = types.TracebackType(new, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return new


def marker(count: int, owners: tuple, hint: bool) -> str:
    """'… 23 frames inside torch (%xmode Verbose shows them)'."""
    from ..render import can_print

    dots = "…" if can_print("…") else "..."
    inside = ", ".join(dict.fromkeys(owners))
    return f"{dots} {count} frame{'s' if count != 1 else ''} inside {inside}" + (f" ({HINT})" if hint else "")


def structured(itb: Any, etype: type, value: BaseException, parts: list) -> Optional[list]:
    """IPython's structured traceback (``itb``: the shell's ``InteractiveTB``, in its current mode) of
    the frames ``parts`` shows (from :func:`runs`), with one marker line per collapsed run where it was.
    None when IPython's layout is not the one this splices into (then the caller shows IPython's own)."""
    frames = [p[1] for p in parts if p[0] == "frame"]
    bare = itb.structured_traceback(etype, value, None, tb_offset=0)
    full = itb.structured_traceback(etype, value, _chain(frames), tb_offset=0)
    k = len(frames)
    start = 0
    while start < min(len(bare), len(full)) and bare[start] == full[start]:
        start += 1
    # full = what both have first, a header only a traceback with frames has (``%xmode Plain``'s
    # 'Traceback (most recent call last):'), one entry per frame, then what both have last.
    first = len(full) - (len(bare) - start) - k
    if first < start or full[first + k:] != bare[start:]:
        return None
    out = full[:first]
    end = "" if getattr(itb, "tb_join_char", "\n") else "\n"  # Plain's entries end their own lines
    hinted = False
    entries = iter(full[first:first + k])
    for part in parts:
        if part[0] == "frame":
            out.append(next(entries))
        else:
            out.append(marker(part[1], part[2], not hinted) + end)
            hinted = True
    return out + full[first + k:]


def explain_mismatch(error: BaseException, source: str, ns: Any, cell: Callable[[str], bool]) -> Any:
    """The mismatch diagnosis of ``error`` (None for any other error)."""
    if not isinstance(error, (RuntimeError, ValueError)):
        return None
    from ..explain import mismatch

    if mismatch.mismatch_devices(error) is None:
        return None
    return mismatch.diagnose(error, source, ns, cell)


def explain_oom(error: BaseException, source: str, ns: Any, cell: Callable[[str], bool],
                tracebacks: Any = ()) -> Any:
    """The out-of-memory explanation of ``error`` (None for any other error). Above the traceback the
    failed cell's frames are read from ``error`` itself and ``sys.last_*``: while the traceback is being
    shown, IPython's own references (``InteractiveTB.tb``, the last result) are still the previous
    error's, and about to let go of it; after the cell, ``tracebacks`` are IPython's."""
    if not isinstance(error, (RuntimeError, MemoryError)):
        return None
    from ..explain import outofmemory

    return outofmemory.explain(error, ns, tracebacks, source, cell)


class Tracebacks:
    """The shell's ``showtraceback``, wrapped while the extension is loaded: explanation first, the
    user's frames, the rest collapsed (see the module's docstring)."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.cell = functools.partial(is_cell_file, shell)  # whether a file name is one of its cells
        self.explainers: list = [explain_mismatch, explain_oom]
        self.explained: Optional[int] = None  # id() of the last exception shown with its explanation
        self._installed = False
        self._had_own: bool = False
        self._previous: Any = None

    def install(self) -> None:
        """Wrap the shell's ``showtraceback`` and hook :meth:`after_cell` (by ``load``, once per shell)."""
        shell = self.shell
        self._had_own = "showtraceback" in vars(shell)
        self._previous = shell.showtraceback
        shell.showtraceback = self.showtraceback
        shell.events.register("post_run_cell", self.after_cell)
        self._installed = True

    def uninstall(self) -> None:
        """Put the shell's ``showtraceback`` back as it was; when another extension wrapped it after us,
        ours stays in its chain but only passes through. Run once, as the closer of :meth:`install`."""
        self._installed = False
        shell = self.shell
        shell.events.unregister("post_run_cell", self.after_cell)
        if vars(shell).get("showtraceback") == self.showtraceback:
            if self._had_own:
                shell.showtraceback = self._previous
            else:
                del shell.showtraceback

    def after_cell(self, result: Any = None) -> None:
        """post_run_cell: after a device-mismatch or out-of-memory error whose traceback did not show the
        explanation (another handler showed it), the explanation. Silent for every other outcome, and for
        an error whose traceback was shown explained. Reads only; keeps nothing; a failure of its own is
        one line, never a traceback."""
        from .shell import ipython_tracebacks

        error = getattr(result, "error_in_exec", None)
        if error is not None:  # its frames outlive the cell in a cycle through the result: remember it
            from ..holders.failed import note_failed

            note_failed(result)
        explained = error is not None and self.explained == id(error)
        self.explained = None  # one cell's: an id is free for reuse once that error goes
        if not isinstance(error, (RuntimeError, ValueError, MemoryError)) or explained:
            return
        from ..explain import mismatch, oomerror

        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        if not isinstance(error, ValueError) and oomerror.oom_facts(error) is not None:
            what = "out-of-memory error"
            explain = functools.partial(explain_oom, tracebacks=ipython_tracebacks(self.shell))
        elif mismatch.mismatch_devices(error) is not None:
            what, explain = "device mismatch", explain_mismatch
        else:
            return
        try:
            report = explain(error, source, self.shell.user_ns, self.cell)
        except Exception as exc:  # noqa: BLE001 - an explanation must never add a traceback of its own
            print(f"torchgpu_magic: could not explain this {what} ({type(exc).__name__}: {exc})")
            return
        if report is not None:
            from IPython.display import display

            display(report)

    def showtraceback(self, exc_tuple: Any = None, filename: Any = None, tb_offset: Any = None,
                      exception_only: bool = False, running_compiled_code: bool = False) -> Any:
        __tracebackhide__ = True  # noqa: F841 - this frame is never part of what went wrong
        original = self._previous
        args = (exc_tuple, filename, tb_offset, exception_only, running_compiled_code)
        if not self._installed or exception_only:
            return original(*args)
        itb = self.shell.InteractiveTB
        try:
            etype, value, tb = self.shell._get_exc_info(exc_tuple)
            stb, explained = self._render(etype, value, tb, tb_offset)
        except Exception:  # noqa: BLE001 - never cost the user their traceback: IPython's own instead
            stb = None
        if stb is None or hasattr(type(value), "_render_traceback_"):
            return original(*args)
        # Rendering set IPython's remembered traceback (what %debug and call_pdb open) to the partial
        # ones it formatted: the whole one, as IPython's own rendering would have left it.
        itb.tb = tb
        try:
            value._render_traceback_ = lambda: stb
        except (AttributeError, TypeError):  # an exception that takes no attributes
            return original(*args)
        if explained:  # shown above the traceback: not again after the cell
            self.explained = id(value)
        try:
            return original(*args)
        finally:
            try:
                del value._render_traceback_
            except AttributeError:
                pass

    def _render(self, etype: Any, value: BaseException, tb: Any, tb_offset: Any) -> tuple:
        """Our structured traceback for this error (None to leave it to IPython), and whether it begins
        with an explanation."""
        from IPython.core.error import UsageError

        if not isinstance(value, Exception) or issubclass(etype, (SyntaxError, UsageError)):
            return None, False
        itb = self.shell.InteractiveTB
        offset = itb.tb_offset if tb_offset is None else tb_offset
        for _ in range(offset or 0):
            tb = tb.tb_next if tb is not None else None
        explanation = self._explain(value)
        cell = self.cell
        if explanation is None and not any(owner(frame, cell) == "torchgpu_magic"
                                           for frame, _ in traceback.walk_tb(tb)):
            return None, False
        head = [] if explanation is None else [explanation.to_text() + "\n"]
        mode = str(getattr(itb, "mode", "Context"))
        if mode in ("Verbose", "Minimal"):
            return head + itb.structured_traceback(etype, value, tb if mode == "Verbose" else None,
                                                   tb_offset=0), bool(head)
        collapse = (lambda who: who is not None) if head else (lambda who: who in MACHINERY)
        body = structured(itb, etype, value, runs(tb, cell, collapse, getattr(itb, "skip_hidden", True)))
        if body is None:  # a layout this cannot splice into: IPython's own, under the explanation
            body = itb.structured_traceback(etype, value, tb, tb_offset=0) if head else None
        return (head + body if body is not None else None), bool(head)

    def _explain(self, value: BaseException) -> Any:
        """The first explainer's report for ``value``, or None (an explainer that fails is skipped)."""
        result = getattr(getattr(self.shell, "displayhook", None), "exec_result", None)
        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        for explainer in self.explainers:
            try:
                found = explainer(value, source, self.shell.user_ns, self.cell)
            except Exception:  # noqa: BLE001 - an explanation must never add a traceback of its own
                continue
            if found is not None:
                return found
        return None
