"""The IPython side of torchgpu_magic: option parsing, display, and registration.

This is the only module that knows IPython's magic machinery and the only one that turns the core's
:class:`~torchgpu_magic.errors.MagicInputError` into IPython's ``UsageError``. Every feature keeps its
state on the one :class:`TorchGPUMagics` instance, and registers what it hooks into the shell (event
callbacks, formatters, exception handlers, threads) with :meth:`TorchGPUMagics.add_closer`, so that
``%unload_ext`` removes exactly what loading and use added.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .errors import MagicInputError

_REGISTRY_NAME = "TorchGPUMagics"


def parse_args(magic: Callable[..., Any], line: str) -> Any:
    """Parse ``line`` with the ``@magic_arguments`` of ``magic``; any problem becomes a one-line
    ``UsageError`` that says what was wrong and shows the magic's usage."""
    name = magic.__name__
    try:
        return parse_argstring(magic, line)
    except (UsageError, ValueError) as exc:
        usage = " ".join(magic.parser.format_usage().split())
        usage = usage.replace("usage: ", "", 1).replace("%" + name, "").strip()
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"%{name}: {message}. Usage: %{name} {usage}") from None


def usage_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the core's :class:`MagicInputError` into a one-line ``UsageError`` for ``method``."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except MagicInputError as exc:
            raise UsageError(f"%{method.__name__}: {exc}") from None

    return wrapper


@magics_class
class TorchGPUMagics(Magics):
    """All torchgpu_magic magics, and the per-kernel state they share."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._closers: list[Callable[[], None]] = []

    # ---- lifecycle -------------------------------------------------------------------------------
    def add_closer(self, closer: Callable[[], None]) -> None:
        """Remember ``closer`` to undo something hooked into the shell; run by :meth:`close`."""
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

    def start(self) -> None:
        """Hook the always-on features into the shell (called once, by :func:`load`)."""

    # ---- %gpuinfo (issue 2) ----------------------------------------------------------------------

    # ---- %%ontorch (issue 3) ---------------------------------------------------------------------

    # ---- %%cudatime (issue 4) --------------------------------------------------------------------

    # ---- %whereis (issue 5) ----------------------------------------------------------------------

    # ---- %gpumem (issue 6) -----------------------------------------------------------------------


def instance(shell: Any) -> Optional[TorchGPUMagics]:
    """The registered :class:`TorchGPUMagics` of ``shell``, or None when the extension is not loaded."""
    found = shell.magics_manager.registry.get(_REGISTRY_NAME)
    return found if isinstance(found, TorchGPUMagics) else None


def load(shell: Any) -> None:
    """Register the magics on ``shell`` once; a second call is a no-op."""
    if instance(shell) is not None:
        return
    magics = TorchGPUMagics(shell)
    shell.register_magics(magics)
    magics.start()


def unload(shell: Any) -> None:
    """Undo :func:`load` and everything the magics hooked in since; a no-op when not loaded.

    IPython has no API to unregister magics, so ours are removed from the manager's tables by hand.
    """
    magics = instance(shell)
    if magics is None:
        return
    try:
        magics.close()
    finally:
        manager = shell.magics_manager
        for table in manager.magics.values():
            for name, func in list(table.items()):
                if getattr(func, "__self__", None) is magics:
                    del table[name]
        manager.registry.pop(_REGISTRY_NAME, None)

