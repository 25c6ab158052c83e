"""``%gpumem --cluster``: every engine's GPU memory, sampled from a background thread, and the peaks of
each notebook cell per engine.

:class:`ClusterSampler` asks every engine for one compact sample per interval (``remote.memory_tick``)
from a named daemon thread, so the notebook never waits. The bridge does not ask busy engines (a
``%px`` cell running): their rows keep their last figures and say since when they are busy, while the
others refresh at the interval. One engine per host reports the host's GPUs (NVML: memory, utilisation,
processes), so a host's GPUs travel once per tick however many engines it runs; every engine reports
its torch allocator figures and process memory.

Each tick produces a :class:`ClusterMemory`: a row per GPU, by host and UUID, with the engines using it
under it (an engine before CUDA is initialised is on no GPU yet, not on all of them), and the peaks of
each notebook cell per engine. An engine busy through some cells reports their peaks when it answers
again, under those cells' labels: nothing is lost. The thread only calls ``on_update``.
"""
from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from ..render import Report, Reportable, Table, fmt_bytes, fmt_value

THREAD_NAME = "torchgpu-cluster-gpumem"
HISTORY = 60  # samples kept per GPU and per engine for their sparklines
CELLS = 20  # notebook cells whose per-engine peaks are kept
_BLOCKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: list, top: Optional[float]) -> str:
    """Unicode blocks for ``values`` against ``top`` (their maximum when unknown)."""
    values = [v for v in values if v is not None]
    scale = top or max(values, default=0)
    if not values or not scale:
        return ""
    return "".join(_BLOCKS[min(8, int(round(8 * v / scale)))] for v in values)


def bar(used: Any, total: Any, width: int = 20) -> str:
    """'#######-------------' for used/total; empty when either is unknown."""
    if not used or not total:
        return ""
    filled = min(width, int(round(width * used / total)))
    return "#" * filled + "-" * (width - filled)


def _bare(uuid: Any) -> str:
    """A GPU UUID as torch prints it (NVML's carries a 'GPU-' / 'MIG-' prefix)."""
    text = str(uuid or "")
    return text.split("-", 1)[1] if text[:4] in ("GPU-", "MIG-") else text


@dataclass(repr=False)
class ClusterMemory(Reportable):
    """One tick: ``gpus`` (one per GPU, by host and UUID: NVML's used / total / utilisation and the
    engines on it), ``rows`` (one per engine: where it is, torch's figures, process RSS, its status),
    ``cells`` (per-cell peaks per engine, newest last) and ``failed`` (engines without a fresh answer:
    busy, stuck, dead)."""

    gpus: list
    rows: list
    cells: list = field(default_factory=list)  # [(cell label, {engine: {'gpus': {...}, 'peak_rss'}})]
    failed: list = field(default_factory=list)
    time: float = 0.0

    def headline(self) -> str:
        hosts = len({r["host"] for r in self.rows if r["host"]})
        n = len(self.rows)
        return (f"%gpumem --cluster: {n} engine{'s' * (n != 1)} on {hosts} host{'s' * (hosts != 1)}, "
                f"{len(self.gpus)} GPU{'s' * (len(self.gpus) != 1)}")

    def table(self) -> Table:
        """One row per GPU (by host and UUID) with the engines using it indented under it, then each
        host's engines on no GPU; without any GPU (a CPU cluster, or before NVML answers), the engines
        alone, without the NVML columns."""
        rows: list = []
        placed = set()
        hosts = {r["host"] for r in self.rows} | {g["host"] for g in self.gpus}
        for host in sorted(hosts, key=lambda h: (not h, h)):  # engines of unknown host (busy at once) last
            gpus = [g for g in self.gpus if g["host"] == host]
            for gpu in gpus:
                rows.append([host, f"GPU {gpu['index']}  {gpu['name'] or ''}".rstrip(),
                             f"{fmt_bytes(gpu['used'])} / {fmt_bytes(gpu['total'])}" if gpu["total"] else "-",
                             bar(gpu["used"], gpu["total"]), fmt_value(gpu["util"], "%"), "", "",
                             sparkline(gpu["history"], gpu["total"]),
                             "" if gpu["engines"] else "stale: its reporter did not answer" if gpu["stale"]
                             else "idle"])
                for row in self.rows:
                    if gpu["key"] in row["gpus"]:
                        rows.append(self._engine(row, "  ", gpu["key"], gpu["procs"].get(row["pid"])))
                        placed.add(row["engine"])
            rest = [r for r in self.rows if r["host"] == host and r["engine"] not in placed]
            if rest and gpus:
                rows.append([host, "not on a GPU"] + [""] * 7)
            rows += [self._engine(row, "  " if gpus else "", None, None) for row in rest]
        headers = ["host", "GPU / engine" if self.gpus else "engine", "used / total (NVML)", "", "util",
                   "torch alloc / reserved", "process RSS", "recent", "status"]
        keep = range(9) if self.gpus else (0, 1, 5, 6, 7, 8)
        title = self.headline() + (" (GPUs by host and UUID; engines under the GPU they use)" if self.gpus
                                   else "")
        return Table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows],
                     align="".join("llrlrrrll"[i] for i in keep), title=title)

    @staticmethod
    def _engine(row: dict, indent: str, key: Any, process: Any) -> list:
        """An engine's row: under GPU ``key``, its process's GPU memory there (NVML) and torch's figures."""
        figures = row["gpus"].get(key) if key is not None else next(
            (v for v in row["gpus"].values() if v), None)
        torch = (f"{fmt_bytes(figures[0])} / {fmt_bytes(figures[1])}" if figures else "-")
        return [row["host"] or "-", indent + row["engine"], fmt_bytes(process) if process else "", "", "",
                torch, fmt_bytes(row["rss"]), sparkline(row["history"], None), row["status"]]

    def cell_table(self) -> Optional[Table]:
        if not self.cells:
            return None
        engines = sorted({e for _, per in self.cells for e in per}, key=_label_order)
        rows = [[label] + [_peak_text(per.get(e)) for e in engines] for label, per in self.cells]
        return Table(["cell"] + engines, rows, align="l" + "r" * len(engines),
                     title="peak per cell and engine (torch GPU peak, else process peak RSS)")

    def report(self) -> Report:
        """The table (an engine without a fresh answer says why in its status), then the cells' peaks."""
        return Report([self.table(), self.cell_table()], gap=True)

    def to_dict(self) -> dict:
        return {"gpus": [{**g, "key": list(g["key"]), "procs": {str(p): v for p, v in g["procs"].items()}}
                         for g in self.gpus],
                "rows": [{**r, "gpus": {str(k): list(v) for k, v in r["gpus"].items()}} for r in self.rows],
                "failed": [list(f) for f in self.failed],
                "cells": [{"cell": label, "engines": per} for label, per in self.cells], "time": self.time}


def _label_order(label: str) -> tuple:
    head, _, tail = label.rpartition(" ")
    return (head, int(tail), "") if tail.isdigit() else (head, -1, tail)


def _peak_text(peak: Optional[dict]) -> str:
    if not peak:
        return "-"
    if peak["gpus"]:
        return " / ".join(f"{fmt_bytes(v)}" for v in peak["gpus"].values())
    return f"{fmt_bytes(peak['peak_rss'])} RSS" if peak["peak_rss"] is not None else "-"


class ClusterSampler:
    """Samples every engine of ``bridge`` every ``interval`` seconds from a daemon thread."""

    def __init__(self, bridge: Any, interval: float = 1.0) -> None:
        self.bridge = bridge
        self.interval = interval
        self.on_update: Optional[Callable[[ClusterMemory], None]] = None
        self.latest: Optional[ClusterMemory] = None
        self._gpus: dict = {}  # (host, uuid or index) -> GPU row (kept while its reporter is busy)
        self._engines: dict = {}  # engine label -> its last row
        self._history: dict = {}  # GPU key or engine label -> deque
        self._reporters: dict = {}  # host -> pid of the engine that reports the host's GPUs
        self._cells: deque = deque(maxlen=CELLS)
        self._notes: deque = deque(maxlen=1000)  # (sequence, label) of the notebook cells ended
        self._seq = 0
        self._covered: dict = {}  # engine label -> the cell count its last full answer covered
        self._token = uuid.uuid4().hex[:12]  # this panel, for the engines' count of cells reported
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def deadline(self) -> float:
        """Seconds one tick waits for the engines: about the interval (a sample takes milliseconds), so
        an engine that became busy just as its request was sent delays one tick by that much at most,
        and the next tick finds it busy and leaves it out."""
        return max(1.0, self.interval)

    def note_cell(self, label: str) -> None:
        """A notebook cell ended: the next answer of each engine brings its peaks (never blocks)."""
        with self._lock:
            self._seq += 1
            self._notes.append((self._seq, label))

    def tick(self, timeout: Optional[float] = None) -> ClusterMemory:
        """One tick. The first asks every engine in full (``remote.memory_tick``: its torch figures,
        process memory, and its host's GPUs from one engine per host). The next ones ask one free engine
        per host (``remote.host_tick``: the host's GPUs with each process's GPU memory, and each engine's
        process memory, read from the OS), so a host costs one call however many engines it runs and a
        busy engine's row stays current while another engine of its host is free; an engine that missed
        notebook cells (they ended since its last full answer) or never answered in full is asked in
        full too, and brings those cells' peaks. At most ``timeout`` seconds (default :attr:`deadline`;
        the first tick, when the engines may still import torch, is given longer)."""
        with self._lock:
            seq, notes = self._seq, list(self._notes)
        wait = self.deadline if timeout is None else timeout
        if not self._engines:
            replies = self.bridge.run("memory_tick", None, [self._token, seq], timeout=wait)
        else:
            leaders = self._leaders()
            replies = self.bridge.run("host_tick", self._pids(), timeout=wait, only=list(leaders.values()))
            for reply in replies:
                if reply.ok and reply.value is not None:
                    self._host(reply)
            behind = [r.key for r in replies if r.ok and self._covered.get(r.engine, -1) < seq]
            if behind:
                again = self.bridge.run("memory_tick", dict(self._reporters), [self._token, seq],
                                        timeout=wait, keys=behind)
                full = {r.key: r for r in again}
                replies = [full.get(r.key, r) for r in replies]
        now = time.time()
        by_cells: dict = {}
        for reply in replies:
            if reply.ok and reply.value is not None and "rss" in reply.value and "torch" in reply.value:
                self._answer(reply)
                self._covered[reply.engine] = seq
                if "cell_peaks" in reply.value:
                    first = reply.value.get("cells_from", 0)
                    labels = tuple(label for s, label in notes if first < s <= seq)
                    if labels:
                        by_cells.setdefault(labels, {})[reply.engine] = reply.value["cell_peaks"]
            elif reply.ok:
                self._engines.get(reply.engine, {})["status"] = ""
            else:
                self._silent(reply)
        self._cells.extend((", ".join(labels), per) for labels, per in by_cells.items())
        self._choose_reporters(replies)
        self.latest = self._snapshot(replies, now)
        return self.latest

    def _pids(self) -> dict:
        """``{host: [pid, ...]}`` of the engines whose host is known."""
        out: dict = {}
        for row in self._engines.values():
            if row["host"] and row["pid"]:
                out.setdefault(row["host"], []).append(row["pid"])
        return out

    def _leaders(self) -> dict:
        """``{host: engine key}``: the engine asked for its host this tick (the host's reporter)."""
        return {row["host"]: row["key"] for row in self._engines.values()
                if row["host"] and self._reporters.get(row["host"]) == row["pid"]}

    def _host(self, reply: Any) -> None:
        """A host's figures from its reporter: its GPUs, each engine's process memory there."""
        self._take_gpus(reply.host, reply.value.get("gpus") or [])
        rss = reply.value.get("rss") or {}
        for row in self._engines.values():
            if row["host"] == reply.host and row["pid"] in rss:
                row["rss"] = rss[row["pid"]]
                self._tally(row)

    def _answer(self, reply: Any) -> None:
        """Take one engine's sample: its host's GPU rows when it reports them, its own row."""
        self._take_gpus(reply.host, reply.value.get("gpus") or [])
        mine = {(reply.host, _bare(gpu_uuid) or f"cuda:{torch_index}"): (allocated, reserved)
                for torch_index, gpu_uuid, allocated, reserved in reply.value.get("torch") or []}
        self._engines[reply.engine] = {"engine": reply.engine, "key": reply.key, "host": reply.host,
                                       "pid": reply.pid, "gpus": mine, "rss": reply.value.get("rss"),
                                       "status": ""}
        self._tally(self._engines[reply.engine])

    def _tally(self, row: dict) -> None:
        """An engine's row on the GPUs where its process holds memory and torch keeps nothing (or cannot
        say), and its history's next figure: torch's reserved bytes, else the process's memory."""
        for key, gpu in self._gpus.items():
            if key[0] == row["host"] and row["pid"] in gpu["pids"]:
                row["gpus"].setdefault(key, None)
        reserved = sum(v[1] for v in row["gpus"].values() if v)
        self._push(row["engine"], reserved if reserved else row["rss"])
        row["history"] = list(self._history[row["engine"]])

    def _take_gpus(self, host: str, rows: list) -> None:
        """The GPU rows an engine reported for its host (see :func:`remote.memory_tick`)."""
        for index, gpu_uuid, name, used, total, util, procs in rows:
            key = (host, _bare(gpu_uuid) or f"#{index}")
            self._gpus[key] = {"key": key, "host": host, "index": index, "uuid": gpu_uuid, "name": name,
                               "used": used, "total": total, "util": util, "stale": False,
                               "pids": {int(p): v for p, v in procs.items()}, "engines": []}
            self._push(key, used)

    def _silent(self, reply: Any) -> None:
        """An engine without a fresh answer keeps its last row (heartbeat figures when the bridge has
        them), with the reason as its status."""
        row = self._engines.setdefault(reply.engine, {"engine": reply.engine, "key": reply.key,
                                                      "host": reply.host or "", "pid": reply.pid, "gpus": {},
                                                      "rss": None, "history": []})
        row["status"] = reply.error_text()
        for key, gpu in self._gpus.items():
            if key[0] == row["host"] and self._reporters.get(row["host"]) == row["pid"]:
                gpu["stale"] = True
        if isinstance(reply.value, dict) and reply.value.get("source") == "heartbeat":
            row["rss"] = reply.value.get("rss")
            row["status"] += "; figures from its last heartbeat"
            mine = {row["pid"]: None} if row["pid"] else {}
            rows = [[*gpu[:6], gpu[6] or mine] for gpu in reply.value.get("gpus") or []]
            self._take_gpus(row["host"], rows)

    def _choose_reporters(self, replies: list) -> None:
        """Keep each host's reporter while it is free; else the first free engine of that host."""
        free = {self._engines[r.engine]["pid"] for r in replies if r.ok and r.engine in self._engines}
        for row in self._engines.values():
            host = row["host"]
            if host and row["pid"] in free and self._reporters.get(host) not in free:
                self._reporters[host] = row["pid"]

    def _push(self, key: Any, value: Any) -> None:
        self._history.setdefault(key, deque(maxlen=HISTORY)).append(value)

    def _snapshot(self, replies: list, now: float) -> ClusterMemory:
        rows = [self._engines[r.engine] for r in replies if r.engine in self._engines]
        gpus = []
        for key in sorted(self._gpus, key=lambda k: (k[0], str(self._gpus[k]["index"]))):
            gpu = dict(self._gpus[key])
            gpu["engines"] = [r["engine"] for r in rows if key in r["gpus"]]
            gpu["history"] = list(self._history.get(key, ()))
            gpu["procs"] = dict(gpu.pop("pids"))
            gpus.append(gpu)
        failed = [(r.engine, r.error_text()) for r in replies if not r.ok]
        return ClusterMemory(gpus, [dict(r) for r in rows], list(self._cells), failed, now)

    def gone(self, exc: BaseException) -> ClusterMemory:
        """The last tick's figures with one line saying why there is no new one (the cluster gone)."""
        last = self.latest or ClusterMemory([], [])
        self.latest = replace(last, failed=[("cluster", str(exc))], time=time.time())
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
            except Exception as exc:  # noqa: BLE001 - a lost cluster must not kill the thread: say it, retry
                snapshot = self.gone(exc)
            with contextlib.suppress(Exception):  # a closed widget: the thread is being stopped
                if self.on_update is not None:
                    self.on_update(snapshot)
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
