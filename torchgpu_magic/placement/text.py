"""Small formatting helpers the placement reports share: shapes, parameter counts, the separator, the
order devices are listed in, and the trainable-share cell.
"""
from __future__ import annotations

from typing import Any


def shape_str(shape: tuple) -> str:
    """'(3, 4)'; '()' for a scalar."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def fmt_count(n: int) -> str:
    """Parameter counts the way model cards write them: 4, 1.2K, 7.0M, 1.3B."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def _join(items: Any) -> str:
    """'a, b' for table cells; '-' when there is nothing to list."""
    return ", ".join(items) if items else "-"


def _sep() -> str:
    """'·' where stdout can print it, '|' elsewhere (like render.MICRO's 'µs' / 'us')."""
    from .. import render

    return "·" if render.MICRO == "µs" else "|"


def _device_order(device: str) -> tuple:
    """Sort key listing accelerators first (by type, then index), then cpu, then meta."""
    kind, _, index = device.partition(":")
    rank = {"cpu": 1, "disk": 2, "meta": 3}.get(kind, 0)
    return (rank, kind, int(index) if index.isdigit() else -1)


def _grad_state(trainable: int, total: int) -> str:
    """The 'grad' / 'trainable' cell: 'yes', 'no', the trainable share ('25 %'), or '-' without elements."""
    if total == 0:
        return "-"
    if trainable == total:
        return "yes"
    return "no" if trainable == 0 else f"{100 * trainable / total:.0f} %"
