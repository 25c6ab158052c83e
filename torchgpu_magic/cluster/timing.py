"""``%%cudatime --cluster``: the cell timed on every engine at once, one row per engine, and the spread.

Each engine returns ``TimingResult.to_dict()``; the rows are rebuilt as :class:`TimingResult` objects so
that the result is a :class:`~torchgpu_magic.timing.TimingComparison` (what ``--devices`` returns), with
the engines that did not report, the spread (slowest median / median of medians) and the stragglers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any, Sequence

from ..render import Table, fmt_seconds
from ..timing import KernelRow, Roofline, TimingComparison, TimingResult

STRAGGLER = 1.10
"""An engine whose median is this many times the cluster's median (or more) is a straggler: in a
synchronous step every engine waits for it."""


def result_of(data: dict) -> TimingResult:
    """A :class:`TimingResult` from its ``to_dict()`` (the fields it has; the statistics are derived)."""
    fields = {name: data[name] for name in TimingResult.__dataclass_fields__ if name in data}
    if fields.get("kernels") is not None:
        fields["kernels"] = [KernelRow(**row) for row in fields["kernels"]]
    if fields.get("roofline") is not None:
        fields["roofline"] = Roofline.from_dict(fields["roofline"])
    return TimingResult(**fields)


@dataclass(repr=False)
class ClusterTiming(TimingComparison):
    """A row per engine (``rows``: ``[(label, TimingResult)]``), ``failed`` replies, ``hosts`` by label."""

    failed: list = field(default_factory=list)  # [(label, 'problem: message')]
    hosts: dict = field(default_factory=dict)
    crowded: dict = field(default_factory=dict)  # oversubscribed host -> (engines, torch threads, CPUs)

    @property
    def on_cpu(self) -> bool:
        """Every row timed on the CPU (host time): the spread is the hosts', not the GPUs'."""
        return bool(self.rows) and all(str(result.device).split(":")[0] == "cpu" for _, result in self.rows)

    @property
    def median(self) -> float:
        """The median of the engines' medians (seconds per loop)."""
        return median(result.median for _, result in self.rows) if self.rows else float("nan")

    @property
    def spread(self) -> float:
        """Slowest engine's median / the median of medians (1.0 is a perfectly even cluster)."""
        if not self.rows or not self.median:
            return float("nan")
        return max(result.median for _, result in self.rows) / self.median

    def stragglers(self) -> list:
        """Labels of the engines at least :data:`STRAGGLER` times the median, slowest first."""
        limit = STRAGGLER * self.median
        slow = [(result.median, label) for label, result in self.rows if result.median >= limit]
        return [label for _, label in sorted(slow, reverse=True)]

    def table(self) -> Table:
        title = "%%cudatime --cluster (median per loop; each engine against the median of medians)"
        counted = any(result.roofline is not None for _, result in self.rows)
        table = Table(["engine", "host", "device", "time per loop", "IQR", "samples x loops", "vs median",
                       "clock"] + ["achieved (% of peak)"] * counted, align="lllrrrrl" + "r" * counted,
                      title=title)
        slow = set(self.stragglers())
        for label, result in self.rows:
            ratio = result.median / self.median if self.median else float("nan")
            mark = (" slower" if self.crowded_rows() else " straggler") if label in slow else ""
            achieved = [result.roofline.short() if result.roofline is not None else "-"] * counted
            table.add(label, self.hosts.get(label, ""), result.device_name, fmt_seconds(result.median),
                      fmt_seconds(result.iqr), f"{result.n} x {result.loops:,}", f"{ratio:.2f}x" + mark,
                      result.clock, *achieved)
        for label, problem in self.failed:
            table.add(label, self.hosts.get(label, ""), "-", "-", "-", "-", "-", problem, *["-"] * counted)
        return table

    def summary(self) -> str:
        if not self.rows:
            return "no engine reported a time"
        line = (f"spread: slowest / median = {self.spread:.2f}x over {len(self.rows)} "
                f"engine{'s' * (len(self.rows) != 1)}")
        slow = self.stragglers()
        crowded = self.crowded_rows()
        if crowded:
            said = "; ".join(f"host {host} runs {n} engine{'s' * (n != 1)} x torch threads = {threads} "
                             f"thread{'s' * (threads != 1)} on {cpus} CPU{'s' * (cpus != 1)}"
                             for host, (n, threads, cpus) in sorted(crowded.items()))
            line += (f"; the engines time on the CPU and share too few cores ({said}): the spread measures "
                     "that sharing, not the engines. For a fair comparison give each engine its own cores "
                     "(fewer engines per host, or torch.set_num_threads on each), or time on the GPUs")
        elif slow:
            why = "a slower CPU, or other work on its host?" if self.on_cpu else "a throttled or shared GPU?"
            line += (f"; straggler{'s' * (len(slow) != 1)}: {', '.join(slow)} (every synchronous step "
                     f"waits for the slowest engine: {why})")
        return line

    def crowded_rows(self) -> dict:
        """The oversubscribed hosts, when every row is timed on the CPU (else none matter)."""
        return self.crowded if self.on_cpu else {}

    def notes(self) -> list:
        return [self.summary()] + (super().notes() if self.rows else [])

    def to_dict(self) -> dict:
        return {"rows": [dict(label=label, engine_host=self.hosts.get(label, ""), **result.to_dict())
                         for label, result in self.rows],
                "failed": [{"label": label, "problem": problem} for label, problem in self.failed],
                "median": self.median if self.rows else None, "spread": self.spread if self.rows else None,
                "stragglers": self.stragglers() if self.rows else [],
                "crowded_hosts": {host: dict(zip(("engines", "threads", "cpus"), v))
                                  for host, v in self.crowded_rows().items()}}


def build(replies: Sequence[Any]) -> ClusterTiming:
    """The :class:`ClusterTiming` of the engines' ``remote.cudatime`` replies."""
    rows = [(r.engine, result_of(r.value)) for r in replies if r.ok]
    failed = [(r.engine, r.error_text()) for r in replies if not r.ok]
    return ClusterTiming(rows, failed=failed, hosts={r.engine: r.host for r in replies},
                         crowded=crowded_hosts(replies))


def crowded_hosts(replies: Sequence[Any]) -> dict:
    """``{host: (engines, torch threads in all, CPUs)}`` for the hosts whose answering engines run more
    torch threads than the host has CPUs for them (each engine says how many CPUs it may use)."""
    hosts: dict = {}
    for reply in replies:
        if reply.host and reply.cpus:
            engines, threads, cpus = hosts.get(reply.host, (0, 0, 0))
            hosts[reply.host] = (engines + 1, threads + (reply.threads or 1), max(cpus, reply.cpus))
    return {host: v for host, v in hosts.items() if v[1] > v[2]}
