"""What the magics share of IPython's shell: the cells they compile, the results they show, and the history
they let go of.

- :func:`register_cell`: the ONE way a cell magic registers the source it compiles, under the number of
  the cell that runs it, so tracebacks show the cell's lines as "Cell In[n]" on IPython 7 and 9, in a
  terminal and in Jupyter (ipykernel's compiler names cells by a hash of their source);
- :func:`cell_number`: that number;
- :func:`show`: a magic's result, returned (``-o``), shown, or neither (``-q``);
- :func:`ends_with_semicolon`: IPython's rule for a cell whose value is not shown;
- :func:`ipython_tracebacks`, :func:`release_traceback`, :func:`release_outputs`: what IPython keeps of
  the last error and the output history, and letting go of it (``%gpumem free``).
"""
from __future__ import annotations

from typing import Any


def register_cell(shell: Any, source: str) -> str:
    """Register ``source`` (a cell's code as a magic compiles it) with IPython's compiler under the running
    cell's number, so that tracebacks and ``linecache`` show its lines; the file name to compile it under.

    The name is IPython's own (``<ipython-input-N-...>``), also under ipykernel, whose compiler names
    cells as files in a temporary directory (``/tmp/ipykernel_PID/HASH.py``) that are not on disk: for a
    ``.py`` name IPython 9 reads a frame's lines with ``inspect.getsourcelines``, which finds a function
    from its ``def`` line, and the function a magic wraps the cell in (``%%cudatime``'s loop) has none
    in the cell, so the traceback showed a blank line, or none. Under IPython's own name the lines come
    from ``linecache``, as in a terminal; the cell number (``Cell In[n]``) is kept either way.
    """
    from IPython.core.compilerop import CachingCompiler

    return CachingCompiler.cache(_OwnNames(shell.compile), source, cell_number(shell))


class _OwnNames:
    """The shell's compiler (whatever subclass the kernel installed) with IPython's own cell names:
    :meth:`CachingCompiler.cache` run on it registers the source where the compiler keeps cells (its
    ``_filename_map`` on IPython 8+, ``linecache``) under the name IPython itself would give."""

    def __init__(self, compiler: Any) -> None:
        self._compiler = compiler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiler, name)

    def get_code_name(self, raw_code: str, transformed_code: str, number: int) -> str:
        from IPython.core.compilerop import CachingCompiler

        return CachingCompiler.get_code_name(self._compiler, raw_code, transformed_code, number)


def show(result: Any, output: bool = False, quiet: bool = False) -> Any:
    """A magic's result: returned with ``-o`` (``output``), else displayed unless ``-q`` (``quiet``);
    what the magic returns."""
    if output:
        return result
    if not quiet and result is not None:
        from IPython.display import display

        display(result)
    return None


def cell_number(shell: Any) -> int:
    """The ``In[n]`` of the cell running now, as IPython itself names it (its traceback's "Cell In[n]",
    its history, the ``Out[n]`` of the result). IPython 8 and 9 add one to ``execution_count`` *before* a
    cell runs and 7.x after it, so ``execution_count`` names the next cell on one leg and this cell on the
    other; IPython hands the running cell's ``ExecutionResult`` to its display hook on both, and its
    ``execution_count`` is the number IPython uses. Outside a cell (``run_line_magic`` from code), or for
    a cell run without history on 7.x, the shell's count, which names the cell it would be."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(result, "execution_count", None)
    return number if isinstance(number, int) else shell.execution_count


def ends_with_semicolon(source: str) -> bool:
    """True when the last code token of ``source`` is ``;``: IPython's rule for a cell whose value is
    not shown (``DisplayHook.semicolon_at_end_of_expression`` exists only from IPython 8)."""
    import io
    import tokenize

    skip = {tokenize.ENDMARKER, tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT,
            tokenize.DEDENT}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    code = [tok for tok in tokens if tok.type not in skip]
    return bool(code) and code[-1].string == ";"


def ipython_tracebacks(shell: Any) -> list:
    """What IPython keeps of the last error it showed, beyond ``sys.last_*``: the traceback its formatter
    remembers (``InteractiveTB.tb``) and the exception in the last cell's ``ExecutionResult``. Each keeps
    the failed cell's frames, and their locals, alive."""
    found = (getattr(getattr(shell, "InteractiveTB", None), "tb", None),
             getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None))
    return [kept for kept in found if kept is not None]


def release_traceback(shell: Any) -> list:
    """Let go of the last error's traceback wherever Python and IPython keep it (``sys.last_exc``,
    ``sys.last_value``, ``sys.last_traceback``, ``sys.last_type``, ``InteractiveTB.tb``, the last cell's
    result, as IPython's own ``del_var`` does), and of earlier failed cells' errors, which their results
    keep in a reference cycle (:mod:`torchgpu_magic.holders.failed`); the names of what was let go."""
    import sys

    from ..holders.failed import release_earlier

    released = []
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        if getattr(sys, name, None) is not None:
            delattr(sys, name)
            released.append(f"sys.{name}")
    formatter = getattr(shell, "InteractiveTB", None)
    if getattr(formatter, "tb", None) is not None:
        formatter.tb = None
        released.append("InteractiveTB.tb")
    if getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None) is not None:
        shell.last_execution_result = None
        released.append("last_execution_result")
    return released + release_earlier()


def release_outputs(shell: Any) -> list:
    """Drop the output history's entries that hold tensors, modules or optimizers: ``Out[n]`` (with its
    ``_n``), ``_``, ``__``, ``___`` (in the namespace and the display hook), as ``%reset out`` does for
    all of them, and the last cell's value IPython keeps in its result; the names of what was dropped."""
    from ..holders.holdings import holds_tensors

    ns = shell.user_ns
    hidden = getattr(shell, "user_ns_hidden", {})  # IPython pushes _N, _, __, ___ there too
    released = []
    out = ns.get("Out")
    if isinstance(out, dict):
        for key in [k for k, v in list(out.items()) if holds_tensors(v)]:
            del out[key]
            released.append(f"Out[{key}]")
            for table in (ns, hidden):
                table.pop(f"_{key}", None)
    last = getattr(shell, "last_execution_result", None)
    if holds_tensors(getattr(last, "result", None)):  # the last cell's value, until this cell ends
        last.result = None
        released.append("last_execution_result.result")
    hook = getattr(shell, "displayhook", None)
    for name in ("_", "__", "___"):
        if holds_tensors(ns.get(name)):
            ns[name] = ""
            released.append(name)
        if holds_tensors(hidden.get(name)):
            hidden[name] = ""
        if hook is not None and holds_tensors(getattr(hook, name, None)):
            setattr(hook, name, "")
    return released
