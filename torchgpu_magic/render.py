"""One report model, and the formatting every report shares: bytes, durations, counts.

A report is data plus one :class:`Report` built from it: a title, then parts (:class:`Lines`,
:class:`Fields`, :class:`Table`, a picture: anything with ``to_text()`` and ``to_html()``, or a nested
:class:`Report` as a section). The terminal text, IPython's ``_repr_pretty_`` and the notebook's HTML are
all rendered from that one model (:class:`Reportable`), so they carry the same lines and cannot drift.

Standard library only, so every module (and the terminal entry point) can use it without importing
torch or IPython.
"""
from __future__ import annotations

import html
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def can_print(text: str) -> bool:
    """True when ``text`` survives the encoding of stdout (a 'C' locale cannot print 'µ')."""
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


MICRO = "µs" if can_print("µ") else "us"


def fmt_count(n: int) -> str:
    """Counts the way model cards write them: 4, 1.2K, 7.0M, 1.3B."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def join_cells(items: Any) -> str:
    """'a, b' for table cells; '-' when there is nothing to list."""
    return ", ".join(items) if items else "-"


def separator() -> str:
    """'·' where stdout can print it, '|' elsewhere (as :data:`MICRO` is 'µs' or 'us')."""
    return "·" if MICRO == "µs" else "|"


def is_na(value: Any) -> bool:
    """True for values a report shows as 'N/A': None, NaN, and the NVML layer's NA sentinel."""
    return (value is None or (isinstance(value, float) and math.isnan(value))
            or getattr(value, "_is_na", False) is True)


def fmt_bytes(n: Any, signed: bool = False) -> str:
    """Binary units with three significant figures: 0 B, 512 B, 1.50 KiB, 79.6 GiB."""
    if is_na(n):
        return "N/A"
    n = int(n)
    sign = "-" if n < 0 else "+" if signed else ""
    n = abs(n)
    value, unit = _scaled(float(n), _BYTE_UNITS, 1024, 1023.5)  # what rounds to 1024 MiB is 1.00 GiB
    return f"{sign}{n} B" if unit == "B" else f"{sign}{_sig3(value)} {unit}"


def _scaled(value: float, units: tuple, base: float, below: float) -> tuple:
    """``(value, unit)``: ``value`` divided by ``base`` until it is under ``below`` (or the units run out),
    with the unit it has reached."""
    unit = units[0]
    for unit in units:
        if value < below or unit == units[-1]:
            break
        value /= base
    return value, unit


def _sig3(value: float) -> str:
    """Three significant figures without scientific notation (1.23, 12.3, 123, 1234)."""
    if value == 0:
        return "0"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_seconds(seconds: Any) -> str:
    """A duration in one unit with three significant figures: 812 ns, 4.21 µs, 1.05 ms, 2.30 s."""
    if is_na(seconds):
        return "N/A"
    s = float(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s == 0:
        return "0 s"
    units = ((1.0, "s"), (1e-3, "ms"), (1e-6, MICRO), (1e-9, "ns"))
    scale, unit = next((scale, unit) for scale, unit in units if s >= scale * 0.9995 or unit == "ns")
    return f"{sign}{_sig3(s / scale)} {unit}"


def fmt_percent(fraction: Any) -> str:
    """A fraction (0.123) as '12.3 %'."""
    if is_na(fraction):
        return "N/A"
    value = float(fraction) * 100
    return f"{'-' if value < 0 else ''}{_sig3(abs(value))} %"


_SI_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def fmt_si(value: Any, unit: str) -> str:
    """A rate or count in decimal SI units with three significant figures, never scaled below the unit:
    612 TFLOP/s, 3.35 TB/s, 1.50 GFLOP, 0.33 FLOP/B."""
    if is_na(value):
        return "N/A"
    number = float(value)
    sign = "-" if number < 0 else ""
    number, prefix = _scaled(abs(number), _SI_PREFIXES, 1000, 999.5)
    shown = str(int(number)) if not prefix and isinstance(value, int) else _sig3(number)
    return f"{sign}{shown} {prefix}{unit}"


def fmt_value(value: Any, unit: str = "") -> str:
    """Any scalar for a table cell: N/A for missing values, the unit appended otherwise."""
    if is_na(value):
        return "N/A"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        value = _sig3(value) if abs(value) < 1000 else f"{value:.0f}"
    return f"{value} {unit}".rstrip() if unit else str(value)


@dataclass
class Table:
    """A plain table rendered as aligned text (terminals) or an HTML table (notebooks).

    ``align`` holds one of 'l' / 'r' per column; numbers read best right-aligned.
    """

    headers: Sequence[str]
    rows: list[Sequence[Any]] = field(default_factory=list)
    align: Optional[str] = None
    title: Optional[str] = None

    def add(self, *cells: Any) -> None:
        """Append one row; cells are converted with ``str``."""
        self.rows.append(cells)

    def _aligns(self) -> str:
        return self.align or "l" * len(self.headers)

    def to_text(self) -> str:
        """Aligned columns separated by two spaces, with a rule under the header."""
        cells = [[str(c) for c in self.headers]] + [[str(c) for c in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.headers))]
        aligns = self._aligns()

        def line(row: Sequence[str]) -> str:
            parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, aligns)]
            return "  ".join(parts).rstrip()

        rule = "  ".join("-" * w for w in widths)
        out = [self.title] if self.title else []
        return "\n".join([*out, line(cells[0]), rule, *map(line, cells[1:])])

    def to_html(self) -> str:
        """A self-contained HTML table (no external CSS or scripts)."""
        aligns = self._aligns()
        style = {"l": "text-align:left", "r": "text-align:right"}

        def cells(tag: str, row: Sequence[Any]) -> str:
            return "".join(f'<{tag} style="{style[a]}">{html.escape(str(c))}</{tag}>'
                           for c, a in zip(row, aligns))

        body = "".join(f"<tr>{cells('td', row)}</tr>" for row in self.rows)
        caption = (f'<caption style="text-align:left"><b>{html.escape(self.title)}</b></caption>'
                   if self.title else "")
        return (f'<table class="torchgpu-magic">{caption}<thead><tr>{cells("th", self.headers)}</tr></thead>'
                f"<tbody>{body}</tbody></table>")


class Part(Protocol):
    """What a :class:`Report` is made of: its text (lines, no indentation of its own) and its HTML.
    :class:`Lines`, :class:`Fields`, :class:`Table` and :class:`Report` are parts; so is a picture (a
    chart drawn as text for terminals and as markup for notebooks)."""

    def to_text(self) -> str: ...

    def to_html(self) -> str: ...


@dataclass
class Lines:
    """Lines of text: one HTML block each, indented as in the text, or, with ``pre``, one preformatted
    block (for lines whose columns are aligned with spaces)."""

    lines: Sequence[str]
    pre: bool = False

    def to_text(self) -> str:
        return "\n".join(self.lines)

    def to_html(self) -> str:
        if not self.lines:
            return ""
        if self.pre:
            return '<pre class="torchgpu-magic-note">' + html.escape("\n".join(self.lines)) + "</pre>"
        return "".join(f'<div class="torchgpu-magic-note"{_indented(line)}>{html.escape(line.lstrip())}</div>'
                       for line in self.lines)


def _indented(line: str) -> str:
    """The style attribute that indents a line's HTML block as far as its text is indented ('' for none)."""
    indent = len(line) - len(line.lstrip(" "))
    return f' style="padding-left:{indent}ch"' if indent else ""


@dataclass
class Fields:
    """Labelled figures: ``label: value`` lines in text, a two-column table in HTML."""

    pairs: Sequence[tuple]

    def to_text(self) -> str:
        return "\n".join(f"{label}: {value}" for label, value in self.pairs)

    def to_html(self) -> str:
        rows = "".join(f'<tr><th style="text-align:left">{html.escape(label)}:</th>'
                       f'<td style="text-align:left">{html.escape(str(value))}</td></tr>'
                       for label, value in self.pairs)
        return f'<table class="torchgpu-magic"><tbody>{rows}</tbody></table>' if rows else ""


@dataclass
class Report:
    """A title and its parts. In text the parts follow the title indented by ``indent``, separated by a
    blank line when ``gap`` (the title too); in HTML the title is bold and the parts follow in order.
    Empty parts show nothing, and None stands for a part a report leaves out. A report is itself a part:
    a titled section inside another."""

    parts: Sequence[Optional[Part]]
    title: str = ""
    indent: str = ""
    gap: bool = False

    def to_text(self) -> str:
        texts = [text for text in (part.to_text() for part in self.parts if part is not None) if text]
        body = ("\n\n" if self.gap else "\n").join(texts)
        lines = [self.indent + line if line else "" for line in body.split("\n")] if texts else []
        if self.title:
            lines = [self.title] + ([""] if self.gap and lines else []) + lines
        return "\n".join(lines)

    def to_html(self) -> str:
        body = "".join(part.to_html() for part in self.parts if part is not None)
        if not self.title:
            return body
        return f'<div class="torchgpu-magic"><div><b>{html.escape(self.title)}</b></div>{body}</div>'


class Reportable:
    """Data that shows itself through its one :meth:`report`: ``to_text()`` (and ``str()``) for code and
    terminals, ``_repr_pretty_`` for IPython, ``_repr_html_`` for notebooks. A dataclass subclass needs
    ``repr=False`` (IPython prefers a generated ``__repr__`` to an inherited ``_repr_pretty_``); a class
    with a ``__repr__`` of its own gets ``_repr_pretty_`` beside it, for the same reason."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__repr__" in cls.__dict__ and "_repr_pretty_" not in cls.__dict__:
            cls._repr_pretty_ = Reportable._repr_pretty_  # type: ignore[method-assign]

    def report(self) -> Report:
        """The report model of this object (each report class builds its own)."""
        raise NotImplementedError(f"{type(self).__name__} builds no report")

    def to_text(self) -> str:
        return self.report().to_text()

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"{type(self).__name__}(...)" if cycle else self.to_text())

    def _repr_html_(self) -> str:
        return self.report().to_html()
