"""``%gpumem --cluster``: every engine's GPU memory, sampled from a background thread, and the peaks of
each notebook cell per engine.

:class:`ClusterSampler` asks every engine for one memory sample per interval (``remote.memory_sample``)
from a named daemon thread, so the notebook never waits; after a notebook cell it also asks for the
peaks since the previous cell (``remote.cell_peaks``, which resets them). Each tick produces a
:class:`ClusterMemory`: a row per engine's GPU (memory bar, sparkline of the recent history) and the
per-cell peaks per engine. The thread only calls ``on_update`` (the panel sets one widget value there).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..render import Table, fmt_bytes, html_lines

THREAD_NAME = "torchgpu-cluster-gpumem"
HISTORY = 60  # samples kept per engine GPU for its sparkline
CELLS = 20  # notebook cells whose per-engine peaks are kept
_BLOCKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: list, top: Optional[float]) -> str:
    """Unicode blocks for ``values`` against ``top`` (their maximum when unknown)."""
    values = [v for v in values if v is not None]
    scale = top or (max(values) if values else 0)
    if not values or not scale:
        return ""
    return "".join(_BLOCKS[min(8, int(round(8 * v / scale)))] for v in values)


def bar(used: Any, total: Any, width: int = 20) -> str:
    """'#######-------------' for used/total; empty when either is unknown."""
    if not used or not total:
        return ""
    filled = min(width, int(round(width * used / total)))
    return "#" * filled + "-" * (width - filled)


@dataclass(repr=False)
class ClusterMemory:
    """One tick: ``rows`` (one per engine GPU, or per engine without a GPU), ``cells`` (per-cell peaks
    per engine, newest last), ``failed`` (engines that did not answer)."""

    rows: list
    cells: list = field(default_factory=list)  # [(cell label, {engine: {'gpus': {...}, 'peak_rss'}})]
    failed: list = field(default_factory=list)
    time: float = 0.0

    def table(self) -> Table:
        table = Table(["engine", "host", "GPU", "used / total (NVML)", "", "torch alloc / reserved",
                       "process RSS", "recent"], align="lllrlrrl", title="%gpumem --cluster")
        for r in self.rows:
            nvml = f"{fmt_bytes(r['used'])} / {fmt_bytes(r['total'])}" if r["total"] else "-"
            torch = (f"{fmt_bytes(r['allocated'])} / {fmt_bytes(r['reserved'])}"
                     if r["allocated"] is not None else "-")
            table.add(r["engine"], r["host"], r["gpu"], nvml, bar(r["used"], r["total"]), torch,
                      fmt_bytes(r["rss"]), sparkline(r["history"], r["total"]))
        for label, problem in self.failed:
            table.add(label, "", "-", "-", "", "-", "-", problem)
        return table

    def cell_table(self) -> Optional[Table]:
        if not self.cells:
            return None
        engines = sorted({e for _, per in self.cells for e in per})
        table = Table(["cell"] + engines, align="l" + "r" * len(engines),
                      title="peak per cell and engine (torch GPU peak, else process peak RSS)")
        for label, per in self.cells:
            table.add(label, *(_peak_text(per.get(e)) for e in engines))
        return table

    def to_text(self) -> str:
        parts = [self.table().to_text()]
        cells = self.cell_table()
        if cells is not None:
            parts.append(cells.to_text())
        return "\n\n".join(parts)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text("ClusterMemory(...)" if cycle else self.to_text())

    def _repr_html_(self) -> str:
        cells = self.cell_table()
        return self.table().to_html() + (cells.to_html() if cells is not None else "") + html_lines(
            [f"{label} did not answer: {problem}" for label, problem in self.failed])

    def to_dict(self) -> dict:
        return {"rows": [dict(r) for r in self.rows], "failed": [list(f) for f in self.failed],
                "cells": [{"cell": label, "engines": per} for label, per in self.cells], "time": self.time}


def _gpu_label(gpu: Optional[dict]) -> str:
    """'cuda:0' where torch sees the GPU, else 'nvml:3'; '-' for an engine without a GPU."""
    if gpu is None:
        return "-"
    return f"cuda:{gpu['torch_index']}" if gpu.get("torch_index") is not None else f"nvml:{gpu['nvml_index']}"


def _peak_text(peak: Optional[dict]) -> str:
    if not peak:
        return "-"
    if peak["gpus"]:
        return " / ".join(f"{fmt_bytes(v)}" for v in peak["gpus"].values())
    return f"{fmt_bytes(peak['peak_rss'])} RSS" if peak["peak_rss"] is not None else "-"


class ClusterSampler:
    """Samples every engine of ``bridge`` every ``interval`` seconds from a daemon thread."""

    def __init__(self, bridge: Any, interval: float = 1.0,
                 on_update: Optional[Callable[[ClusterMemory], None]] = None) -> None:
        self.bridge = bridge
        self.interval = interval
        self.on_update = on_update
        self.latest: Optional[ClusterMemory] = None
        self._history: dict = {}
        self._cells: deque = deque(maxlen=CELLS)
        self._pending: list = []  # notebook cells ended since the last tick
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def note_cell(self, label: str) -> None:
        """A notebook cell ended: the next tick collects the engines' peaks for it (never blocks)."""
        with self._lock:
            self._pending.append(label)

    def tick(self) -> ClusterMemory:
        """One sample of every engine (and the peaks of cells ended since the last one)."""
        timeout = max(5.0, 2 * self.interval)
        replies = self.bridge.run("memory_sample", timeout=timeout)
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            peaks = {r.engine: r.value for r in self.bridge.run("cell_peaks", timeout=timeout) if r.ok}
            self._cells.append((", ".join(pending), peaks))
        rows = []
        for reply in replies:
            if not reply.ok:
                continue
            snap = reply.value
            rss = (snap.get("host") or {}).get("rss")
            gpus = snap["gpus"] or [None]
            for gpu in gpus:
                label = _gpu_label(gpu)
                key = (reply.engine, label)
                used = gpu["used"] if gpu else rss
                history = self._history.setdefault(key, deque(maxlen=HISTORY))
                history.append(used)
                rows.append({"engine": reply.engine, "host": reply.host, "gpu": label,
                             "used": gpu["used"] if gpu else None, "total": gpu["total"] if gpu else None,
                             "allocated": gpu["allocated"] if gpu else None,
                             "reserved": gpu["reserved"] if gpu else None, "rss": rss,
                             "history": list(history)})
        failed = [(r.engine, r.error_text()) for r in replies if not r.ok]
        self.latest = ClusterMemory(rows, list(self._cells), failed, time.time())
        return self.latest

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                snapshot = self.tick()
                if self.on_update is not None:
                    self.on_update(snapshot)
            except Exception:  # noqa: BLE001,S112 - a lost cluster must not kill the thread; next tick retries
                pass
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # a slow tick: skip the missed beats instead of catching up in a burst
                next_at = now + self.interval
            self._stop.wait(next_at - now)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; wait at most ``timeout`` seconds (one engine call's limit)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
