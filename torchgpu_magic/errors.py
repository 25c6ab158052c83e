"""The one exception type the core raises for bad user input.

Core modules (devices, timing, placement, memory, inventory) know nothing of IPython; they raise
:class:`MagicInputError` with a one-line message saying what was wrong and what is valid, and
``magics/base.py`` (``usage_errors``) turns it into IPython's ``UsageError`` (shown without a traceback).
"""
from __future__ import annotations


class MagicInputError(ValueError):
    """Bad input from the user: the message is one line that names what is valid."""
