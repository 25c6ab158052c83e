"""The step's memory drawn: a stacked area chart by category over the step's events, the phases shaded
and named, the peak marked with its phase, module, operator and cell line, and the capacity as a line
where it is on the scale.

:class:`MemoryPicture` draws one :class:`~.series.StepSeries` as inline SVG (``to_svg``, ``to_html``:
made here, no script, nothing fetched, no plotting library, so it shows wherever HTML output does:
JupyterLab, Notebook 7, VS Code, Colab, a static export) and as block characters for a terminal
(``to_text``, at most :data:`TEXT_COLUMNS` columns). Each band carries a ``<title>`` naming its category
and bytes, which browsers show on hover. :class:`SideBySide` puts several pictures on one scale
(measured beside predicted). A long series is thinned to the pixels it is drawn on
(:meth:`~.series.StepSeries.sample`), never past its peak, which is drawn from its own row.

Both are picture parts of a report (``to_text()`` and ``to_html()``, :class:`~torchgpu_magic.render.Part`):
they show inside the report that holds them (:class:`~.report.CellMemory`, :class:`~.report.StepComparison`),
never as reports of their own. Standard library only.
"""
from __future__ import annotations

import functools
import html
import itertools
import math
from typing import Any, Optional, Sequence

from ..render import can_print, fmt_bytes, fmt_percent
from .series import StepSeries

STACK = ("parameters", "buffers", "optimizer state", "workspaces", "other", "gradients", "activations",
         "temporaries")
"""The bands from the bottom up: what lives through the step first, what comes and goes on top."""

COLORS = {"parameters": "#4e79a7", "buffers": "#76b7b2", "optimizer state": "#59a14f",
          "workspaces": "#9c755f", "other": "#b07aa1", "gradients": "#f28e2b", "activations": "#e15759",
          "temporaries": "#edc948"}
PHASE_COLORS = {"before the cell": "#bab0ac", "forward": "#4e79a7", "outside modules": "#bab0ac",
                "backward": "#f28e2b", "optimizer step": "#59a14f"}
SHORT = {"before the cell": "before", "forward": "fwd", "outside modules": "out", "backward": "bwd",
         "optimizer step": "opt"}
BLOCKS = {"parameters": "█", "buffers": "#", "optimizer state": "▓", "workspaces": "+", "other": "=",
          "gradients": "▒", "activations": "░", "temporaries": ":"}
ASCII_BLOCKS = {"parameters": "#", "buffers": "B", "optimizer state": "%", "workspaces": "w", "other": "=",
                "gradients": "*", "activations": "+", "temporaries": ":"}
_EIGHTHS = "▁▂▃▄▅▆▇█"
_CHAR_PX = 6.2  # the width of an average character at 11 px sans-serif, for placing labels
_CAPACITY_ON_SCALE = 2.0  # a capacity above twice the peak is named, not drawn (the curve would flatten)
TEXT_ROWS = 8
TEXT_COLUMNS = 100
"""The widest a text chart draws, its labels and its report's indentation included."""
_PLOT_BOTTOM = 240  # the chart's baseline in the SVG, 190 pixels below its top


class MemoryPicture:
    """One step's memory over its events (see the module's docstring). ``title`` heads the picture;
    ``capacity`` (bytes, from ``capacity_source``) is drawn as a line when it is at most twice the
    peak, else named; ``scale`` (bytes at the top of the chart) lets pictures share one scale;
    ``columns`` is the width of the text chart (a report that indents it draws it narrower)."""

    def __init__(self, series: StepSeries, title: str, capacity: Optional[int] = None,
                 capacity_source: Optional[str] = None, columns: int = TEXT_COLUMNS) -> None:
        self.series = series
        self.title = title
        self.capacity = capacity
        self.capacity_source = capacity_source
        self.columns = columns
        self._totals = series.totals()
        self.peak = self._totals[series.peak_row]
        self.scale = self.natural_scale()

    def natural_scale(self) -> int:
        """The top of the chart on its own: the peak, or the capacity when it is drawn."""
        top = max(self.peak, 1)
        drawn = self.capacity is not None and 0 < self.capacity <= _CAPACITY_ON_SCALE * top
        return max(top, self.capacity) if drawn else top

    # ---- what is drawn ----------------------------------------------------------------------------
    def figures(self) -> dict:
        """The values the picture shows, from the series itself: the peak, where it was, the bytes of
        each category at the peak, each phase's highest total and each category's highest bytes."""
        series = self.series
        at_peak = dict(zip(series.categories, series.categories_at([series.peak_row])[0]))
        return {"peak": self.peak, "peak_row": series.peak_row, **series.where(series.peak_row),
                "categories": at_peak, "phase_peaks": series.phase_peaks(), "highest": self.highest}

    @functools.cached_property
    def highest(self) -> dict:
        """Each category's highest live bytes over the step (0: never present, left out of the legend)."""
        return self.series.highest()

    def peak_label(self) -> str:
        """'peak 40.3 MiB · optimizer step · model.0 · aten.add · line 3: opt.step()'."""
        where = self.series.where(self.series.peak_row)
        parts = [f"peak {fmt_bytes(self.peak)}", where["phase"]]
        parts += [where[key] for key in ("module", "op") if where[key]]
        if where["line"]:
            source = where["source"] or ""
            source = source if len(source) <= 40 else source[:39] + "…"
            parts.append(f"line {where['line']}" + (f": {source}" if source else ""))
        return " · ".join(parts)

    def capacity_note(self) -> Optional[str]:
        """What the capacity line is, or why it is not drawn; None without a capacity."""
        if self.capacity is None:
            return None
        where = f"capacity {fmt_bytes(self.capacity)}" + (f" ({self.capacity_source})" if self.capacity_source
                                                          else "")
        if self.capacity <= self.scale:
            return where
        return f"{where}: above the chart, the peak is {fmt_percent(self.peak / self.capacity)} of it"

    def _bands(self, columns: int) -> tuple:
        """(sampled rows, {category: cumulative tops per sampled row}) for the categories present."""
        rows = self.series.sample(columns)
        live = self.series.categories_at(rows)
        tops: dict = {}
        running = [0] * len(rows)
        for name in STACK:
            column = self.series.category_index[name]
            values = [values[column] for values in live]
            if not any(values):
                continue
            running = [a + b for a, b in zip(running, values)]
            tops[name] = running
        return rows, tops

    def _phase_columns(self, columns: int) -> list:
        """The phase that holds the most rows of each of ``columns`` equal slices of the series (of the
        row each column shows, where there are fewer rows than columns)."""
        count = len(self.series)
        if count <= columns:
            return [self.series.where(column * count // columns)["phase"] for column in range(columns)]
        weights: list = [{} for _ in range(columns)]

        def column_of(row: int) -> int:  # the slice ``row`` is in: the last whose first row is not past it
            return ((row + 1) * columns - 1) // count

        for phase, first, last in self.series.phase_spans():
            for column in range(column_of(first), column_of(last) + 1):
                lo, hi = column * count // columns, (column + 1) * count // columns - 1
                overlap = min(hi, last) - max(lo, first) + 1
                if overlap > 0:
                    weights[column][phase] = weights[column].get(phase, 0) + overlap
        return [max(found, key=found.get) for found in weights]

    # ---- SVG ----------------------------------------------------------------------------------------
    def svg_height(self, width: int = 760) -> int:
        """The height :meth:`to_svg` takes at ``width``: the chart and its legend's lines."""
        return _PLOT_BOTTOM + 44 + 16 * len(self._footer(self.figures(), width))

    def to_svg(self, width: int = 760, height: Optional[int] = None) -> str:
        """The picture as one self-contained ``<svg>`` element (also a valid .svg file), ``width`` pixels
        across and at least ``height`` down."""
        figures = self.figures()
        footer = self._footer(figures, width)
        height = max(height or 0, _PLOT_BOTTOM + 44 + 16 * len(footer))
        left, right, top, bottom = 66, width - 14, 50, _PLOT_BOTTOM
        plot_w, plot_h = right - left, bottom - top
        series = self.series
        count = len(series)

        def x_of(row: float) -> float:
            return left + plot_w * (row / (count - 1) if count > 1 else 0)

        def y_of(value: float) -> float:
            return bottom - plot_h * min(value, self.scale) / self.scale

        esc = html.escape
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tgm-memory-picture" width="{width}" '
               f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" '
               f'style="max-width:100%;height:auto" role="img">',
               f"<title>{esc(self.title)}: {esc(self.peak_label())}</title>",
               f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
               f'<text x="8" y="18" font-size="13" font-weight="bold" fill="#222">{esc(self.title)}</text>']
        out.append('<g class="tgm-phases">')
        for phase, first, last in series.phase_spans():
            x0, x1 = x_of(max(first - 0.5, 0)), x_of(min(last + 0.5, count - 1))
            if count == 1:
                x0, x1 = left, right
            out.append(f'<rect class="tgm-phase" x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 0.5):.1f}" '
                       f'height="{plot_h}" fill="{PHASE_COLORS[phase]}" fill-opacity="0.12">'
                       f"<title>{esc(phase)}: events {first} to {last}</title></rect>")
        out.append("</g>")
        rows, tops = self._bands(plot_w)
        xs = [x_of(r) for r in rows] if count > 1 else [left, right]
        out.append('<g class="tgm-bands">')
        for name in reversed(list(tops)):
            ys = [y_of(v) for v in tops[name]] if count > 1 else [y_of(tops[name][0])] * 2
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
            points += f" {xs[-1]:.1f},{bottom} {xs[0]:.1f},{bottom}"
            out.append(f'<polygon class="tgm-band" data-category="{esc(name)}" points="{points}" '
                       f'fill="{COLORS[name]}" fill-opacity="0.9"><title>{esc(name)}: '
                       f"{fmt_bytes(figures['categories'][name])} at the peak, highest "
                       f"{fmt_bytes(self.highest[name])}</title></polygon>")
        out.append("</g>")
        out += self._svg_axes(left, right, top, bottom, y_of, count)
        out += self._svg_capacity(left, right, y_of)
        out += self._svg_peak(x_of(series.peak_row) if count > 1 else left, y_of(self.peak), width)
        out += self._svg_phase_names(x_of, bottom, count)
        out += self._svg_footer(footer, bottom + 52)
        out.append("</svg>")
        return "".join(out)

    def _svg_axes(self, left: int, right: int, top: int, bottom: int, y_of: Any, count: int) -> list:
        out = [f'<g class="tgm-axes" fill="#444"><line x1="{left}" y1="{bottom}" x2="{right}" '
               f'y2="{bottom}" stroke="#444"/><line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" '
               f'stroke="#444"/>']
        for value, label in _ticks(self.scale):
            y = y_of(value)
            out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#444"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        out.append(f'<text x="{left}" y="{bottom + 30}">0</text>'
                   f'<text x="{(left + right) / 2:.0f}" y="{bottom + 30}" text-anchor="middle">'
                   f"events in order (allocations and frees): {count - 1:,}</text>"
                   f'<text x="{right}" y="{bottom + 30}" text-anchor="end">{count - 1:,}</text></g>')
        return out

    def _svg_capacity(self, left: int, right: int, y_of: Any) -> list:
        if self.capacity is None or self.capacity > self.scale:
            return []  # none, or named under the chart (:meth:`_footer`)
        y = y_of(self.capacity)
        return [f'<g class="tgm-capacity"><line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" '
                f'stroke="#c00" stroke-width="1.5" stroke-dasharray="6 3"/><text x="{left + 4}" '
                f'y="{y + 13:.1f}" fill="#c00" stroke="#fff" stroke-width="3" paint-order="stroke">'
                f"{html.escape(self.capacity_note() or '')}</text></g>"]

    def _svg_peak(self, x: float, y: float, width: int) -> list:
        label = self.peak_label()
        estimate = _CHAR_PX * len(label)
        if x + estimate <= width - 8:
            anchor, at = "start", x
        elif x - estimate >= 8:
            anchor, at = "end", x
        else:
            anchor, at = "start", max(8.0, width - 8 - estimate)
        return [f'<g class="tgm-peak"><line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="42" stroke="#222" '
                f'stroke-dasharray="2 2"/><circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#222"/>'
                f'<text x="{at:.1f}" y="38" text-anchor="{anchor}" fill="#222">{html.escape(label)}</text>'
                f"<title>{html.escape(label)}</title></g>"]

    def _svg_phase_names(self, x_of: Any, bottom: int, count: int) -> list:
        """Each phase named under its widest span: in full where it fits, else short, else not at all
        (the legend's line of phase highs names every phase)."""
        widest: dict = {}
        for phase, first, last in self.series.phase_spans():
            span = (x_of(min(last + 0.5, count - 1)) - x_of(max(first - 0.5, 0))) if count > 1 else 999
            if span > widest.get(phase, (0, 0, 0))[0]:
                widest[phase] = (span, first, last)
        out = ['<g class="tgm-phase-names" fill="#333">']
        for phase, (span, first, last) in widest.items():
            name = phase if _CHAR_PX * len(phase) + 4 <= span else SHORT[phase]
            if _CHAR_PX * len(name) + 4 > span:
                continue
            middle = (x_of(first) + x_of(last)) / 2 if count > 1 else x_of(0) + span / 2
            out.append(f'<text class="tgm-phase-name" x="{middle:.1f}" y="{bottom + 14}" '
                       f'text-anchor="middle">{html.escape(name)}</text>')
        out.append("</g>")
        return out

    def _footer(self, figures: dict, width: int) -> list:
        """The lines under the chart: the legend (a list of (category, text, x) per line), then the phases'
        highs and the capacity when it is off the scale (a string per line)."""
        lines: list = [[]]
        used = 8.0
        for name in STACK:
            if not self.highest[name]:
                continue
            text = f"{name} {fmt_bytes(figures['categories'][name])}"
            room = 16 + _CHAR_PX * len(text) + 14
            if lines[-1] and used + room > width:
                lines.append([])
                used = 8.0
            lines[-1].append((name, text, used))
            used += room
        highs = list(figures["phase_peaks"].items())
        phases = [f"{p} {fmt_bytes(b)}" + (" ·" if i < len(highs) - 1 else "")
                  for i, (p, b) in enumerate(highs)]
        chars = int((width - 16) / _CHAR_PX)
        lines += _wrap(["at the peak, by category (above); highest by phase:"] + phases, chars, " ")
        if self.capacity is not None and self.capacity > self.scale:
            lines += _wrap((self.capacity_note() or "").split(" "), chars, " ")
        return lines

    def _svg_footer(self, lines: list, y: int) -> list:
        out = ['<g class="tgm-legend" fill="#222">']
        for line in lines:
            if isinstance(line, str):
                out.append(f'<text x="8" y="{y}">{html.escape(line)}</text>')
            else:
                for name, text, x in line:
                    out.append(f'<rect x="{x:.1f}" y="{y - 9}" width="10" height="10" fill="{COLORS[name]}"/>'
                               f'<text x="{x + 14:.1f}" y="{y}">{html.escape(text)}</text>')
            y += 16
        out.append("</g>")
        return out

    def to_html(self) -> str:
        """The SVG in a block of its own, for a notebook's HTML output."""
        return f'<div class="torchgpu-magic-picture">{self.to_svg()}</div>'

    # ---- text -------------------------------------------------------------------------------------------
    def to_text(self) -> str:
        """A few rows of block characters, each column the highest row of its slice of the series (the
        peak's column is the peak), a character per category, the peak marked above and the phases
        under it; no line longer than :attr:`columns`. ASCII where stdout cannot print the block
        characters."""
        fancy = can_print("█▓▒░▁▼├┤─│┼╌…")
        blocks = BLOCKS if fancy else ASCII_BLOCKS
        label_w = 9
        width = self.columns
        columns = max(10, width - label_w - 2)
        picks, peak_column = self._text_picks(columns)
        index = self.series.category_index
        rows = sorted(set(picks))
        live = dict(zip(rows, self.series.categories_at(rows)))
        grid = self._text_grid([live[row] for row in picks], blocks, fancy)
        capacity_level = None
        if self.capacity is not None and self.capacity <= self.scale:
            capacity_level = min(TEXT_ROWS - 1, int(self.capacity / self.scale * TEXT_ROWS))
            grid[capacity_level] = [c if c != " " else ("╌" if fancy else "-") for c in grid[capacity_level]]
        lines = [self._text_marker(peak_column, label_w + 2, width, fancy)]
        for level in range(TEXT_ROWS - 1, -1, -1):
            label = fmt_bytes(self.scale) if level == TEXT_ROWS - 1 else \
                fmt_bytes(self.capacity) if level == capacity_level else ""
            axis = ("┤" if label else "│") if fancy else "|"
            lines.append(f"{label:>{label_w}} {axis}" + "".join(grid[level]).rstrip())
        lines.append(f"{'0 B':>{label_w}} " + ("┼" + "─" * columns if fancy else "+" + "-" * columns))
        lines.append(" " * (label_w + 2) + _phase_row(self._phase_columns(columns), fancy))
        at_peak = live[self.series.peak_row]
        lines += _wrap([f"{blocks[n]} {n} {fmt_bytes(at_peak[index[n]])}" for n in STACK if self.highest[n]],
                       width)
        note = self.capacity_note()
        words = f"{len(self.series) - 1:,} events in order (allocations and frees)"
        words += f"; {note}" if note else ""
        lines += _wrap(words.split(" "), width, " ")
        return "\n".join(line.rstrip() for line in lines)

    def _text_picks(self, columns: int) -> tuple:
        """(the row each of ``columns`` shows: its slice's highest, or, for fewer rows than columns, the
        row under it; the peak's column)."""
        count, peak = len(self.series), self.series.peak_row
        picks = []
        for column in range(columns):
            lo, hi = column * count // columns, (column + 1) * count // columns
            chunk = self._totals[lo:hi]
            picks.append(lo + chunk.index(max(chunk)) if count > columns else lo)
        peak_column = next((c for c, row in enumerate(picks) if row == peak), peak * columns // count)
        picks[peak_column] = peak
        return picks, peak_column

    def _text_grid(self, columns: list, blocks: dict, fancy: bool) -> list:
        """:data:`TEXT_ROWS` rows (the bottom first) of one character per column (its bytes by category):
        a cell the stack covers shows the category at its middle, the cell the stack ends in an eighth
        block as high as the stack reaches into it."""
        grid = [[" "] * len(columns) for _ in range(TEXT_ROWS)]
        step, index = self.scale / TEXT_ROWS, self.series.category_index
        for column, values in enumerate(columns):
            stack, top = [], 0
            for name in STACK:
                stack.append((top, top + values[index[name]], name))
                top += values[index[name]]
            for level in range(TEXT_ROWS):
                low, high = level * step, (level + 1) * step
                if top >= high:
                    middle = (low + high) / 2
                    name = next((n for a, b, n in stack if a <= middle < b), stack[-1][2])
                    grid[level][column] = blocks[name]
                elif top > low:
                    eighths = max(1, min(8, round((top - low) / step * 8)))
                    grid[level][column] = _EIGHTHS[eighths - 1] if fancy else "_" if eighths < 4 else "."
        return grid

    def _text_marker(self, column: int, offset: int, width: int, fancy: bool) -> str:
        mark = "▼" if fancy else "v"
        label = self.peak_label()
        if not fancy:
            label = label.replace("·", "|").replace("…", "...").encode("ascii", "replace").decode()
        at = offset + column
        if at + 2 + len(label) <= width:
            return " " * at + f"{mark} {label}"
        if at - 1 - len(label) >= 0:
            return " " * (at - 1 - len(label)) + f"{label} {mark}"
        right, left = width - at - 2, at - 1  # the room beside the mark on each side
        more = "…" if fancy else "..."
        if right >= left:
            return " " * at + f"{mark} {label[:max(right - len(more), 0)]}{more}"
        shown = label[:max(left - len(more), 0)] + more
        return " " * (at - 1 - len(shown)) + f"{shown} {mark}"


class SideBySide:
    """Pictures of one step on one scale, side by side in HTML and SVG, one above the other in text
    (as measured beside predicted)."""

    def __init__(self, pictures: Sequence[MemoryPicture]) -> None:
        self.pictures = list(pictures)
        scale = max(p.natural_scale() for p in self.pictures)
        for picture in self.pictures:
            picture.scale = scale

    def to_svg(self, width: int = 600) -> str:
        """One ``<svg>`` holding each picture, left to right."""
        height = max(p.svg_height(width) for p in self.pictures)
        inner = [p.to_svg(width, height).replace("<svg ", f'<svg x="{i * width}" ', 1)
                 for i, p in enumerate(self.pictures)]
        total = width * len(self.pictures)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height}" '
                f'viewBox="0 0 {total} {height}" style="max-width:100%;height:auto">'
                + "".join(inner) + "</svg>")

    def to_html(self) -> str:
        """The pictures in a row that wraps on a narrow page."""
        height = max(p.svg_height(600) for p in self.pictures)
        cells = "".join(f'<div style="flex:1 1 480px;min-width:0">{p.to_svg(600, height)}</div>'
                        for p in self.pictures)
        return (f'<div class="torchgpu-magic-picture" style="display:flex;flex-wrap:wrap;gap:12px">'
                f"{cells}</div>")

    def to_text(self) -> str:
        """Each picture under its title, one after the other."""
        return "\n\n".join(p.title + "\n" + p.to_text() for p in self.pictures)


def _ticks(scale: int) -> list:
    """(bytes, label) of about four round marks from 0 to ``scale`` in its binary unit: 0 B, 10 MiB..."""
    power = next((p for p in (4, 3, 2, 1) if scale >= 1024 ** p), 0)
    unit, name = 1024 ** power, ("B", "KiB", "MiB", "GiB", "TiB")[power]
    raw = scale / unit / 4
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    out, value = [], 0.0
    while value <= scale / unit + 1e-9:
        out.append((value * unit, f"{value:g} {name}" if value else "0 B"))
        value += step
    return out


def _phase_row(phases: list, fancy: bool) -> str:
    """The phases under the chart: each run of columns as ``├─forward─┤`` (or short, or bare)."""
    out = []
    for phase, run in itertools.groupby(phases):
        span = len(list(run))
        name = phase if len(phase) + 2 <= span else SHORT[phase] if len(SHORT[phase]) + 2 <= span else ""
        if span == 1:
            out.append("│" if fancy else "|")
            continue
        fill = "─" if fancy else "-"
        out.append(("├" if fancy else "|") + name.center(span - 2, fill) + ("┤" if fancy else "|"))
    return "".join(out)


def _wrap(items: list, width: int, gap: str = "  ") -> list:
    """Items joined by ``gap``, in lines of at most ``width`` characters."""
    lines, line = [], ""
    for item in items:
        if line and len(line) + len(gap) + len(item) > width:
            lines.append(line)
            line = ""
        line = f"{line}{gap}{item}" if line else item
    return lines + ([line] if line else [])
