"""What the magics share: options parsed into one-line ``UsageError``s, and the closers that let
``%unload_ext`` undo what loading and use hooked into the shell (what they share of IPython's shell
itself, the cells, results and the history, is :mod:`.shell`).

Each magic is a :class:`MagicsPart` in a module named after it, holding that magic's options, hooks and
state. One :class:`TorchGPUMagics` per shell is the extension itself: registered under that name, it owns
the closers and knows the parts, so ``load`` and ``unload`` (in ``__init__.py``) register and remove them
together. This and :mod:`.shell` are the only modules the magics' modules import from each other.
"""
from __future__ import annotations

import copy
import functools
import re
from typing import Any, Callable, Optional, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import parse_argstring

from ..errors import MagicInputError

P = TypeVar("P", bound="MagicsPart")


_PARSED: dict = {}  # (a magic's parser, its line) -> its options (a plain dict: loading imports nothing more)


def parse_args(magic: Callable[..., Any], line: str) -> Any:
    """Parse ``line`` with the ``@magic_arguments`` of ``magic``; any problem becomes a one-line
    ``UsageError`` that says what was wrong and shows the magic's usage.

    Each line is parsed once (a notebook re-runs the same few magic lines, and IPython's shlex split plus
    argparse cost 0.17 ms, a tenth of a bare cluster round trip) and every call gets its own copy."""
    parsed = _PARSED.get((magic.parser, line))
    if parsed is not None:
        return copy.copy(parsed)
    name = magic.__name__
    try:
        parsed = parse_argstring(magic, line)
    except (UsageError, ValueError) as exc:
        usage = " ".join(magic.parser.format_usage().split())
        usage = usage.replace("usage: ", "", 1).replace("::", "", 1).replace("%" + name, "").strip()
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"%{name}: {message}. Usage: %{name} {usage}") from None
    if len(_PARSED) >= 256:
        _PARSED.clear()
    _PARSED[magic.parser, line] = parsed
    return copy.copy(parsed)


def usage_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the core's :class:`MagicInputError` into a one-line ``UsageError`` for ``method``, named as
    the user typed the magic: ``%%cudatime: ...`` for the cell form (whose errors would otherwise say
    ``%cudatime``, the line form's name, as do the usage lines argparse writes)."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of a cell's traceback
        cell = kwargs.get("cell", args[2] if len(args) > 2 else None)
        try:
            return method(*args, **kwargs)
        except MagicInputError as exc:
            raise UsageError(f"{'%%' if cell is not None else '%'}{name}: {exc}") from None
        except UsageError as exc:
            named = re.sub(rf"(?<!%)%{name}\b", f"%%{name}", str(exc)) if cell is not None else str(exc)
            if named == str(exc):
                raise
            raise UsageError(named) from None

    return wrapper


@magics_class
class TorchGPUMagics(Magics):
    """The extension in one shell. It defines no magic itself: it is registered under this name so that
    ``instance`` finds it, makes each magic's class when that magic is first used (:meth:`part`; until
    then ``load`` has a stand-in registered under the magic's name), and owns the closers that undo
    whatever the magics hooked into the shell (event callbacks, formatters, threads)."""

    def __init__(self, shell: Any) -> None:
        from .explainers import Tracebacks

        super().__init__(shell)
        self._closers: list[Callable[[], None]] = []
        self.cluster_kept: Any = None  # cluster.Kept: what --cluster bridges keep between calls, till unload
        self.tracebacks = Tracebacks(shell)  # the user's cell first, errors explained above
        self.parts: list[MagicsPart] = []  # the magics' classes made so far

    def part(self, cls: type[P]) -> P:
        """This shell's instance of the magic class ``cls``, made (and registered with IPython, in place of
        the stand-in ``load`` put there, and started) the first time it is asked for."""
        for part in self.parts:
            if isinstance(part, cls):
                return part
        made = cls(self.shell, self)
        self.shell.register_magics(made)
        self.parts.append(made)
        made.start()
        return made

    def start(self) -> None:
        """Hook the always-on features into the shell (called once, by ``load``): the traceback wrapper,
        with the explainers of device-mismatch and out-of-memory errors."""
        self.tracebacks.install()
        self.add_closer(self.tracebacks.uninstall)

    def add_closer(self, closer: Callable[[], None]) -> None:
        """Remember ``closer`` to undo something hooked into the shell; run by :meth:`close`. A closer
        already waiting (the same bound method) is not added again, so a magic may ask at every use."""
        if closer not in self._closers:
            self._closers.append(closer)

    def close(self) -> None:
        """Undo every registration, newest first; one failing closer does not stop the others."""
        errors = []
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - report all, after undoing all
                errors.append(exc)
        if errors:
            raise errors[0]


class MagicsPart(Magics):
    """One magic's class: its options, hooks and state, with what it hooks into the shell undone by its
    owner's closers. Subclasses are decorated with ``@magics_class``, as IPython requires."""

    def __init__(self, shell: Any, owner: TorchGPUMagics) -> None:
        super().__init__(shell)
        self._owner = owner

    def add_closer(self, closer: Callable[[], None]) -> None:
        """Have ``closer`` run when the extension is unloaded (see :meth:`TorchGPUMagics.close`)."""
        self._owner.add_closer(closer)

    def cluster_bridge(self, name: Optional[str]) -> Any:
        """The :class:`~torchgpu_magic.cluster.Bridge` for ``--cluster [NAME]``: the view ``%px`` runs on
        is preferred among names for one cluster, and the clients connected here to cluster objects
        (``--cluster cluster`` on an ``ipp.Cluster`` or ``LocalCluster``) are closed at unload. The
        bridge is made anew for each call, with what the earlier ones kept of the same client
        (:class:`~torchgpu_magic.cluster.Kept`, forgotten at unload)."""
        from .. import cluster

        px = self.shell.magics_manager.magics["line"].get("px")
        view = getattr(getattr(px, "__self__", None), "view", None)
        owner = self._owner
        if owner.cluster_kept is None:
            owner.cluster_kept = cluster.Kept()
            self.add_closer(cluster.close_clients)
            self.add_closer(self._forget_kept)
        return cluster.connect(self.shell.user_ns, name, view, owner.cluster_kept)

    def _forget_kept(self) -> None:
        """At unload: drop what the --cluster bridges kept."""
        kept, self._owner.cluster_kept = self._owner.cluster_kept, None
        kept.clear()

    def start(self) -> None:
        """Hook what this magic needs into the shell, once, when its class is first made (at its first
        use); a magic that waits to be used has nothing to hook here."""
