"""The GPU check's ``summary.md`` (and ``summary.json``): every step with its verdict, figure and target,
what could not be checked and why, what failed, and each check's points. Markdown that reads as well as
plain text (a terminal prints it at the end of the run). Standard library only.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from .outcome import FAIL, FAILING, INFO, PASS, SKIPPED, TIMEOUT


def _cell(text: str) -> str:
    """Text for one cell of a markdown table: one line, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def counts(results: list) -> dict:
    """How many steps ended with each verdict, in a fixed order, verdicts that did not occur left out."""
    tally = Counter(r.outcome.verdict for r in results)
    return {verdict: tally[verdict] for verdict in (PASS, FAIL, TIMEOUT, SKIPPED, INFO) if tally[verdict]}


def _verdict(results: list, failing: list) -> str:
    """The run in one sentence: what missed, or that every step that measured met its target, or that
    nothing was measured here."""
    if failing:
        return f"{len(failing)} missed: " + ", ".join(r.name for r in failing) + "."
    if any(r.outcome.verdict == PASS for r in results):
        return "Every step that measured met its target."
    return "Nothing was measured here: see what was not checked, and why."


def render(results: list, command: str, budget: float, seconds: float, started: str,
           note: Optional[str] = None) -> str:
    """The summary as markdown text."""
    tally = ", ".join(f"{n} {verdict}" for verdict, n in counts(results).items())
    failing = [r for r in results if r.outcome.verdict in FAILING]
    lines = [f"# GPU check, {started}", "",
             f"`{command}`: {len(results)} steps in {seconds:.0f} s of a {budget:.0f} s budget: {tally}. "
             + _verdict(results, failing), ""]
    if note:
        lines += [note, ""]
    info = [r for r in results if r.outcome.verdict == INFO]
    if info:
        lines += ["## Machine", ""]
        for r in info:
            lines.append(f"- **{r.title}**: {r.outcome.figure}")
            lines += [f"  - {d}" for d in r.outcome.details]
        lines.append("")
    lines += ["## Steps", "", "| # | step | verdict | figure | target | why | time | log |",
              "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        o = r.outcome
        lines.append(f"| {i} | {_cell(r.name)}: {_cell(r.title)} | **{o.verdict}** | {_cell(o.figure)} | "
                     f"{_cell(o.target)} | {_cell(o.why)} | {r.seconds:.1f} s | {r.log or ''} |")
    skipped = [r for r in results if r.outcome.verdict == SKIPPED]
    if skipped:
        lines += ["", "## Not checked", ""]
        lines += [f"- {r.name}: skipped: {r.outcome.why}" for r in skipped]
    if failing:
        lines += ["", "## Missed", ""]
        for r in failing:
            lines.append(f"- {r.name}: {r.outcome.line()} (log: {r.log})")
    detailed = [r for r in results if r.outcome.details and r.outcome.verdict != INFO]
    if detailed:
        lines += ["", "## Points", ""]
        for r in detailed:
            lines.append(f"### {r.name}")
            lines += [f"- {d}" for d in r.outcome.details]
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write(out: Path, results: list, command: str, budget: float, seconds: float, started: str,
          note: Optional[str] = None) -> str:
    """Write ``summary.md`` and ``summary.json`` under ``out``; return the markdown."""
    text = render(results, command, budget, seconds, started, note)
    (out / "summary.md").write_text(text, encoding="utf-8")
    data = {"command": command, "budget_s": budget, "seconds": seconds, "started": started, "note": note,
            "steps": [{"name": r.name, "title": r.title, "seconds": r.seconds, "log": r.log,
                       **asdict(r.outcome)} for r in results]}
    (out / "summary.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    return text
