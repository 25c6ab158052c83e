"""The ``%gpumem`` panel: an ipywidgets view over :class:`torchgpu_magic.gpumem.Sampler`.

This is the only module that imports ipywidgets. The sampler thread calls :meth:`MemoryPanel.update`,
which only sets trait values (HTML strings), batched per widget with ``hold_sync()``: it never prints and
never enters an ``Output`` context, because output from threads is routed differently since ipykernel 7
(ipywidgets #4020, ipykernel #1450) while comm messages from any thread are safe. Everything is drawn as
inline HTML/SVG with inline styles: no network resource, no custom frontend code, so the panel works
wherever ipywidgets 8 does (JupyterLab, Notebook 7, VS Code, Colab).

Closing the panel's widget (``panel.widget.close()``) stops the sampler and closes every widget the
panel made (children, layouts, styles), so nothing is left in ipywidgets' registry.
"""
from __future__ import annotations

import contextlib
import html
import threading
import time
from typing import Any, Callable, Optional, Sequence

import ipywidgets as widgets

from ..accelerators import empty_cache
from ..render import fmt_bytes, fmt_seconds, is_na
from .figures import MemorySnapshot
from .records import CellRecord
from .sampler import Sampler

# Colours of the bar's parts (also used by the legend), readable on light and dark themes.
COLOURS = {
    "allocated": "#2f6fb0",
    "cache": "#8fbce6",
    "other": "#9467bd",
    "others": "#e8893a",
    "unattributed": "#b8b8b8",
    "free": "#e9ecef",
    "rss": "#2f6fb0",
    "used": "#b8b8b8",
}
LABELS = {
    "allocated": "torch allocated",
    "cache": "reserved but free (cache)",
    "other": "other (CUDA context, non-torch)",
    "others": "other processes",
    "unattributed": "driver / unattributed",
    "rss": "this process (RSS)",
    "used": "other use",
}
SPARK_POINTS = 120
CELLS_SHOWN = 10  # the newest cells drawn in the panel (every record stays in the cell log)
_BOX = ("font-family:var(--jp-ui-font-family, sans-serif);font-size:12px;line-height:1.5;"
        "color:var(--jp-ui-font-color1, #222)")


class _PanelBox(widgets.VBox):
    """The panel's root widget: closing it (from code, or ``Widget.close_all()``) closes the panel.

    Its mimebundle carries, beside the live view, ``text/plain`` and ``text/html`` snapshots of the
    panel (:meth:`MemoryPanel.static_bundle`), so a saved or converted notebook (nbconvert, GitHub's
    viewer) shows the figures instead of a blank where no widget can render."""

    def __init__(self, panel: MemoryPanel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._panel = panel
        self._on_close: Optional[Callable[[], None]] = panel.close

    def __repr__(self) -> str:
        """One line naming the panel (ipywidgets' own ``text/plain``, cut at 110 characters)."""
        return self._panel.describe()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        return {**super()._repr_mimebundle_(**kwargs), **self._panel.static_bundle()}

    def close(self) -> None:
        """Stop the sampler and close every widget of the panel, then this one."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
        super().close()


class MemoryPanel:
    """A live view of one :class:`~torchgpu_magic.gpumem.Sampler`: per GPU a stacked bar (NVML used of
    total, with this process's share split into torch allocated, cache and other, then other processes),
    peak allocated since reset and a sparkline of the last minutes; host RSS and available memory; the
    last cells' memory; buttons to empty torch's cache, reset the peak and pause sampling.

    ``on_close`` is called once when the panel closes (the magic uses it to unhook its cell events).
    """

    def __init__(self, sampler: Sampler, on_close: Optional[Callable[[], None]] = None) -> None:
        self.sampler = sampler
        self._on_close = on_close
        self._lock = threading.Lock()
        self.closed = False  # True once close() ran
        self._cells_on = True
        self._records: Any = ()  # the cell log's records (read when drawn, the newest CELLS_SHOWN)
        self._cells_drawn = False  # the cells widget shows _records as they are now
        self._warning = ""  # the last growing-cell warning (gpumem.growth), shown above the cells
        self.title, self.host, self.gpus, self.cells, self.status = (widgets.HTML() for _ in range(5))
        self.empty_button = widgets.Button(description="Empty cache", icon="trash",
                                           tooltip="empty_cache(): give torch's cached memory back")
        self.reset_button = widgets.Button(description="Reset peak", icon="undo",
                                           tooltip="start the peak figures again from now")
        self.pause_button = widgets.Button(description="Pause", icon="pause",
                                           tooltip="stop or restart sampling")
        self.empty_button.on_click(lambda _: self.empty_cache())
        self.reset_button.on_click(lambda _: self.sampler.reset_peaks())
        self.pause_button.on_click(lambda _: self.toggle_pause())
        self.buttons = widgets.HBox([self.empty_button, self.reset_button, self.pause_button])
        self.widget = _PanelBox(self, children=[self.title, self.host, self.gpus, self.cells, self.buttons,
                                                self.status])
        self.widget.add_class("torchgpu-magic-gpumem")
        self.empty_button.disabled = not sampler.targets
        self.cells.value = self._cells_html()
        self._cells_drawn = True
        sampler.callback = self.update

    # ---- state ------------------------------------------------------------------------------------
    def model_ids(self) -> set:
        """The comm ids of every widget this panel made (for tests of 'nothing left behind')."""
        return {w.model_id for w in self._all_widgets() if w.comm is not None}

    def _all_widgets(self) -> list:
        return [part for w in (self.widget, self.buttons, self.title, self.host, self.gpus, self.cells,
                               self.status, self.empty_button, self.reset_button, self.pause_button)
                for part in (w, getattr(w, "layout", None), getattr(w, "style", None))
                if isinstance(part, widgets.Widget)]

    def describe(self) -> str:
        """One line of text for where the widget cannot render."""
        latest = self.sampler.latest
        figures = f" · {latest.host_line()}" if latest is not None else ""
        return f"%gpumem {'closed' if self.closed else 'live'} panel{figures}"

    # ---- updates (any thread) ---------------------------------------------------------------------
    def update(self, snapshot: MemorySnapshot) -> None:
        """Show ``snapshot``: sets trait values only, one batched message per widget."""
        history = self.sampler.history
        title = self._title_html(snapshot)
        host = _host_html(snapshot, history)
        gpus = _gpus_html(snapshot, history)
        status = _status_html(snapshot, self.sampler.last_error)
        with self._lock:
            if self.closed:
                return
            values = {self.title: title, self.host: host, self.gpus: gpus, self.status: status}
            if not self._cells_drawn:
                values[self.cells], self._cells_drawn = self._cells_html(), True
            with contextlib.ExitStack() as stack:
                for w in (*values, self.empty_button):
                    stack.enter_context(w.hold_sync())
                self.empty_button.disabled = not snapshot.gpus
                for w, value in values.items():
                    w.value = value

    def show_cells(self, records: Any, on: bool = True, warning: Optional[str] = None) -> None:
        """Show the newest cells of ``records`` (a sequence, read again whenever drawn); ``on`` False
        says accounting is off; ``warning`` (a cell that grew memory run after run) is shown above them
        until the next one. Cheap, as it runs after every cell: the table is drawn by the next
        :meth:`update` (the sampler's next tick, or :meth:`refresh`), not here."""
        self._records = records
        self._cells_on = on
        if warning:
            self._warning = warning
        self._cells_drawn = False

    def _newest(self) -> list:
        return list(self._records)[-CELLS_SHOWN:]

    def _cells_html(self) -> str:
        table = _cells_html(self._newest(), self._cells_on, bool(self.sampler.targets))
        if not self._warning:
            return table
        warning = html.escape(self._warning)
        return f'<div style="{_BOX};color:#b45309" class="tgm-growth">{warning}</div>' + table

    # ---- the static snapshot ----------------------------------------------------------------------
    def static_bundle(self) -> dict:
        """``text/plain`` and ``text/html`` snapshots of the panel as it is now, for where no widget can
        render (exports, viewers, terminals); self-contained HTML, no script, no network."""
        latest = self.sampler.latest
        history = self.sampler.history
        parts = "" if latest is None else (self._title_html(latest) + _host_html(latest, history)
                                           + _gpus_html(latest, history))
        note = ("panel closed: the figures as they were last" if self.closed
                else "a snapshot: the live panel needs a running kernel with ipywidgets")
        markup = (f'<div class="tgm-snapshot">{parts}{self._cells_html()}'
                  + ("" if latest is None else _status_html(latest, None))
                  + f'<div style="{_BOX};opacity:.7;margin-top:4px">{html.escape(note)}</div></div>')
        lines = [f"%gpumem {note}"]
        if latest is not None:
            lines.append(latest.to_text())
        if self._warning:
            lines.append(self._warning)
        lines.extend(r.line() for r in self._newest())
        return {"text/plain": "\n".join(lines), "text/html": markup}

    def _title_html(self, snapshot: MemorySnapshot) -> str:
        state = "paused" if self.sampler.paused else f"every {fmt_seconds(self.sampler.interval)}"
        stamp = time.strftime("%H:%M:%S", time.localtime(snapshot.wall_time))
        return (f'<div style="{_BOX}"><b>Memory</b> <span style="opacity:.7">· this process · '
                f'sampling {html.escape(state)} · <span class="tgm-time">{stamp}</span></span></div>')

    # ---- buttons (kernel thread) ------------------------------------------------------------------
    def empty_cache(self) -> None:
        """torch's ``empty_cache()`` on every initialised accelerator, and show the result at once."""
        empty_cache()
        self.refresh()

    def toggle_pause(self) -> None:
        """Pause or resume sampling; the button says which comes next."""
        if self.sampler.paused:
            self.sampler.resume()
            self.pause_button.description, self.pause_button.icon = "Pause", "pause"
        else:
            self.sampler.pause()
            self.pause_button.description, self.pause_button.icon = "Resume", "play"
        self.refresh()

    def refresh(self) -> None:
        """Sample and draw now, from the calling thread (the mode for frontends that drop updates made
        from a background thread); draws the last figures again while paused."""
        if self.sampler.paused and self.sampler.latest is not None:
            self.update(self.sampler.latest)
        else:
            self.sampler.sample_now()

    # ---- closing ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the sampler (within one interval) and close every widget of the panel; idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True  # an update already running finishes first; later ones return
        self.sampler.callback = None
        self.sampler.stop()
        for w in self._all_widgets():
            if w is not self.widget:
                w.close()
        if self.widget._on_close is not None:  # closed through close(), not through the widget
            self.widget._on_close = None
            self.widget.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


# ---- HTML pieces -----------------------------------------------------------------------------------
def _figure(key: str, value: Any, signed: bool = False) -> str:
    """A figure with a stable class name (the browser test and users' CSS can find it)."""
    return f'<span class="tgm-{key}">{html.escape(fmt_bytes(value, signed=signed))}</span>'


def _bar(parts: Sequence[tuple], scale: float) -> str:
    """A stacked horizontal bar: ``parts`` are (key, bytes); the rest of ``scale`` shows as free."""
    segments = []
    for key, amount in parts:
        if is_na(amount) or amount <= 0 or scale <= 0:
            continue
        width = min(100.0, 100.0 * float(amount) / scale)
        tip = html.escape(f"{LABELS.get(key, key)}: {fmt_bytes(amount)}")
        segments.append(f'<div title="{tip}" style="width:{width:.3f}%;background:{COLOURS[key]}"></div>')
    return (f'<div style="display:flex;height:14px;width:100%;max-width:560px;background:{COLOURS["free"]};'
            f'border-radius:3px;overflow:hidden;margin:2px 0">{"".join(segments)}</div>')


def _legend(items: Sequence[tuple]) -> str:
    """Swatch, label and figure for each (key, bytes) pair."""
    return "".join(f'<span style="display:inline-block;width:9px;height:9px;background:{COLOURS[k]};'
                   f'margin:0 3px 0 8px;border-radius:2px"></span>{html.escape(LABELS[k])} {_figure(k, v)}'
                   for k, v in items)


def sparkline(series: Sequence[tuple], scale: Optional[float] = None, width: int = 240,
              height: int = 28) -> str:
    """An inline SVG with one line per ``(values, colour)`` in ``series`` (values oldest first, N/A
    skipped), all on one scale (``scale`` or the largest value). Each line is downsampled to at most
    :data:`SPARK_POINTS` by keeping each bucket's maximum, so short spikes stay visible. '' when no line
    has two values."""
    lines = []
    for values, colour in series:
        points = [float(v) for v in values if not is_na(v)]
        if len(points) < 2:
            continue
        if len(points) > SPARK_POINTS:
            step = len(points) / SPARK_POINTS
            points = [max(points[int(i * step):max(int((i + 1) * step), int(i * step) + 1)])
                      for i in range(SPARK_POINTS)]
        lines.append((points, colour))
    if not lines:
        return ""
    top = max([scale or 0.0] + [max(points) for points, _ in lines]) or 1.0
    drawn = []
    for points, colour in lines:
        n = len(points) - 1
        coords = " ".join(f"{i * width / n:.1f},{height - 1 - (height - 2) * p / top:.1f}"
                          for i, p in enumerate(points))
        drawn.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
    return (f'<svg class="tgm-spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'style="vertical-align:middle;background:{COLOURS["free"]};border-radius:3px">'
            f'{"".join(drawn)}</svg>')


def _span_text(history: Sequence[MemorySnapshot]) -> str:
    if len(history) < 2:
        return ""
    return f'<span style="opacity:.7"> last {fmt_seconds(history[-1].time - history[0].time)}</span>'


def _host_html(snapshot: MemorySnapshot, history: Sequence[MemorySnapshot]) -> str:
    h = snapshot.host
    if h is None:
        return f'<div style="{_BOX}"><b>Host</b> memory figures unavailable (psutil cannot read them)</div>'
    other_use = max(0, h.total - h.available - h.rss)
    spark = sparkline([([s.host.rss for s in history if s.host is not None], COLOURS["rss"])])
    return (
        f'<div style="{_BOX};margin-top:4px"><b>Host</b> · this process {_figure("host-rss", h.rss)} RSS'
        f' (peak {_figure("host-peak", h.peak_rss)}) · system available'
        f' {_figure("host-available", h.available)}'
        f' of {_figure("host-total", h.total)}'
        + _bar([("rss", h.rss), ("used", other_use)], float(h.total))
        + f'<div>{spark}{_span_text(history) if spark else ""}</div></div>'
    )


def _gpus_html(snapshot: MemorySnapshot, history: Sequence[MemorySnapshot]) -> str:
    if not snapshot.gpus:
        return (f'<div style="{_BOX};margin-top:4px" class="tgm-nogpu"><b>no GPU: host memory only</b>'
                '<span style="opacity:.7"> (torch sees no CUDA GPU here)</span></div>')
    blocks = []
    for i, g in enumerate(snapshot.gpus):
        name = html.escape(f"{g.target.label} {g.target.name}".strip())
        if not is_na(g.total):
            scale, scale_note = float(g.total), ""
        else:
            scale = float(max([v for v in (g.reserved, g.peak) if not is_na(v)] or [0]))
            scale_note = ' <span style="opacity:.7">(NVML cannot say: scaled to torch\'s reserved)</span>'
        parts = [("allocated", g.allocated), ("cache", g.cache)]
        if not is_na(g.process):  # NVML lists this process: the rest of its share is context & co
            parts.append(("other", g.other))
        mine = g.reserved if is_na(g.process) else g.process
        unattributed = None if is_na(g.used) else int(g.used) - int(mine or 0) - int(g.others or 0)
        parts += [("others", g.others), ("unattributed", unattributed)]
        series = [s.gpus[i] for s in history if i < len(s.gpus)]
        spark = sparkline([([s.used for s in series], COLOURS["unattributed"]),
                           ([s.process for s in series], COLOURS["other"]),
                           ([s.allocated for s in series], COLOURS["allocated"])],
                          None if is_na(g.total) else scale)
        blocks.append(
            f'<div style="{_BOX};margin-top:6px" class="tgm-gpu"><b>{name}</b> · NVML used '
            f'{_figure("gpu-used", g.used)} of {_figure("gpu-total", g.total)} · this process '
            f'{_figure("gpu-process", g.process)} · peak allocated {_figure("gpu-peak", g.peak)}{scale_note}'
            + _bar(parts, scale)
            + f'<div>{_legend([(k, v) for k, v in parts if k != "unattributed"])}</div>'
            + (f'<div>{spark} <span style="opacity:.7">NVML used (grey), this process (purple), '
               f'torch allocated (blue)</span>{_span_text(history)}</div>' if spark else "")
            + "</div>"
        )
    return "".join(blocks)


def _cells_html(records: Sequence[CellRecord], on: bool, has_gpu: bool) -> str:
    if not on:
        return (f'<div style="{_BOX};margin-top:6px;opacity:.7">per-cell accounting is off '
                '(<code>%gpumem --cells on</code>)</div>')
    if not records:
        return (f'<div style="{_BOX};margin-top:6px;opacity:.7">Cells: each cell run from now on is listed '
                'here with its memory delta and peak</div>')
    heads = ["cell", "first line", "time", "Δ RSS", "peak RSS"]
    if has_gpu:
        heads += ["Δ allocated", "peak allocated"]
    cell = "padding:1px 8px;text-align:right;white-space:nowrap"
    rows = []
    for r in reversed(records):
        figures = [fmt_bytes(r.rss_delta, signed=True), fmt_bytes(r.rss_peak)]
        if has_gpu:
            figures += [fmt_bytes(sum(g.delta for g in r.gpus), signed=True), fmt_bytes(r.gpu_peak)]
        rows.append(
            f'<tr class="tgm-cell"><td style="{cell}">[{"" if r.number is None else r.number}]</td>'
            f'<td style="padding:1px 8px;text-align:left"><code>{html.escape(r.first_line[:60])}</code></td>'
            f'<td style="{cell}">{html.escape(fmt_seconds(r.seconds))}</td>'
            + "".join(f'<td style="{cell}">{html.escape(f)}</td>' for f in figures)
            + "</tr>"
        )
    head = "".join(f'<th style="padding:1px 8px;text-align:{"left" if h == "first line" else "right"}">'
                   f'{html.escape(h)}</th>' for h in heads)
    return (f'<div style="{_BOX};margin-top:6px"><b>Cells</b> <span style="opacity:.7">(newest first; '
            f'peaks are reset before each cell)</span><table style="border-collapse:collapse">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def _status_html(snapshot: MemorySnapshot, last_error: Optional[str]) -> str:
    lines = [line for line in snapshot.notes() if line != "no GPU: host memory only"]
    if last_error:
        lines.append(f"panel update failed: {last_error}")
    if not lines:
        return ""
    return "".join(f'<div style="{_BOX};color:#b45309" class="tgm-status">{html.escape(line)}</div>'
                   for line in lines)


class ClusterPanel:
    """``%gpumem --cluster``'s live view: one HTML widget whose value the cluster sampler's thread
    replaces each tick (a trait set, the only thing a thread may do with a widget), holding a
    :class:`~torchgpu_magic.cluster.memory.ClusterMemory`'s tables."""

    def __init__(self, first_html: str) -> None:
        self.widget = widgets.HTML(value=first_html)

    def update(self, report: Any) -> None:
        """Show ``report`` (anything with ``_repr_html_``); called from the sampler thread."""
        self.widget.value = report._repr_html_()

    def close(self) -> None:
        self.widget.close()
