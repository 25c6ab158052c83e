"""``%whereis --cluster``: each engine's placement, merged by name.

One row per name: where it lives on each engine, grouped (``model``: cuda:0 on engine 0, cuda:1 on
engine 1, ...), and a flag for a name that lives on different device *types* on different engines (cpu
on one, cuda on the others: the engine that forgot a ``.to(device)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..render import Lines, Report, Reportable, Table
from .bridge import engine_list


@dataclass(repr=False)
class ClusterPlacement(Reportable):
    """``names``: ``{name: {engine label: {'kind', 'devices', 'summary'}}}``; ``missing``: names some
    engines lack; ``failed``: engines that did not report."""

    names: dict
    engines: list
    missing: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)

    def where(self, name: str) -> str:
        """'cuda:0 on engine 0; cuda:1 on engine 1' / 'cpu on engines 0, 1, 2'."""
        groups: dict = {}
        for label, info in self.names[name].items():
            groups.setdefault("+".join(info["devices"]) or "no tensors", []).append(label)
        return "; ".join(f"{device} on {engine_list(labels)}" for device, labels in groups.items())

    def mixed(self) -> dict:
        """Names on different device types on different engines: ``{name: {type: [labels]}}``."""
        out = {}
        for name, per in self.names.items():
            kinds: dict = {}
            for label, info in per.items():
                key = "+".join(sorted({d.split(":")[0] for d in info["devices"]})) or "no tensors"
                kinds.setdefault(key, []).append(label)
            if len(kinds) > 1:
                out[name] = kinds
        return out

    def table(self) -> Table:
        rows = [(name, "/".join(sorted({info["kind"] for info in per.values()})), self.where(name))
                for name, per in sorted(self.names.items())]
        return Table(["name", "kind", "where"], rows, align="lll",
                     title=f"%whereis --cluster: {len(self.engines)} engine{'s' * (len(self.engines) != 1)}")

    def notes(self) -> list:
        out = []
        for name, kinds in self.mixed().items():
            said = "; ".join(f"{kind} on {engine_list(labels)}" for kind, labels in kinds.items())
            out.append(f"! {name} lives on different device types on different engines: {said}. Move it "
                       "the same way on every engine (%px or %%ontorch local), or the engines compute "
                       "different things at different speeds")
        out += [f"{name} is not defined on {engine_list(labels)}" for name, labels in self.missing.items()]
        out += [f"{label} did not report: {problem}" for label, problem in self.failed]
        if not self.names and not self.failed:
            out.append("no tensors, modules or optimizers on the engines")
        return out

    def report(self) -> Report:
        return Report([self.table(), Report([Lines(self.notes())], indent="  ")])

    def to_dict(self) -> dict:
        return {"names": self.names, "engines": list(self.engines), "missing": self.missing,
                "mixed": self.mixed(), "failed": [{"label": lb, "problem": p} for lb, p in self.failed]}


def build(replies: Sequence[Any]) -> ClusterPlacement:
    """Merge the engines' ``remote.whereis`` replies by name."""
    names: dict = {}
    missing: dict = {}
    for reply in [r for r in replies if r.ok]:
        for name, info in reply.value["names"].items():
            names.setdefault(name, {})[reply.engine] = info
        for text in reply.value["missing"]:
            missing.setdefault(text.split(" ", 1)[0], []).append(reply.engine)
    return ClusterPlacement(names, [r.engine for r in replies], missing,
                            [(r.engine, r.error_text()) for r in replies if not r.ok])
