"""What one step of the GPU check found: a verdict, its figure, the target it was held to, and why.

A check is two halves: the measurement (which needs the GPU) and the verdict, a pure function of the
figures measured. The verdict helpers here (:func:`judged`, :func:`within`) are what every check uses,
so a figure that misses its target is a ``fail`` whatever check produced it, and the tests can give a
verdict figures that miss without a GPU. Standard library only.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

PASS, FAIL, SKIPPED, TIMEOUT, INFO = "pass", "fail", "skipped", "timeout", "info"
VERDICTS = (PASS, FAIL, SKIPPED, TIMEOUT, INFO)
FAILING = (FAIL, TIMEOUT)  # what makes the whole run exit non-zero


class Skip(Exception):
    """Raised by a check that cannot produce a real figure here; its message says why (shown as
    ``skipped: <why>``). Never a pass: a check that did not measure says so."""


@dataclass
class Outcome:
    """A step's verdict (one of :data:`VERDICTS`), its ``figure`` (what was measured, one line), the
    ``target`` it was held to, ``why`` (for a skip, a failure or a timeout: the reason) and ``details``
    (more lines for the step's log and the summary's notes: one per point measured)."""

    verdict: str
    figure: str = ""
    target: str = ""
    why: str = ""
    details: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}: one of {', '.join(VERDICTS)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        data = json.loads(text)
        return cls(**{k: data[k] for k in ("verdict", "figure", "target", "why", "details") if k in data})

    def line(self) -> str:
        """``pass: <figure> (target ...)`` / ``skipped: <why>``: one line for a terminal."""
        text = self.figure
        if self.target:
            text += f" (target {self.target})"
        if self.why:
            text = f"{text}; {self.why}" if text else self.why
        return f"{self.verdict}: {text}"


def judged(ok: bool, figure: str, target: str, why_not: str = "", details: Optional[list] = None) -> Outcome:
    """``pass`` when ``ok``, else ``fail`` with ``why_not`` (default: the figure missed the target)."""
    why = "" if ok else why_not or "outside the target"
    return Outcome(PASS if ok else FAIL, figure, target, why, list(details or []))


def within(measured: float, reference: float, tolerance: float) -> bool:
    """``measured`` is no further than ``tolerance`` from ``reference`` (same units)."""
    return abs(measured - reference) <= tolerance


def between(value: Optional[float], low: float, high: float) -> bool:
    """``low <= value <= high``; a missing value (None) is not between anything."""
    return value is not None and low <= value <= high


def worst(outcomes: list) -> Outcome:
    """One outcome for several sub-checks: fail if any failed (their figures joined), pass if all passed,
    skipped only if every one skipped; the details of all are kept."""
    if not outcomes:
        raise ValueError("no outcomes to combine")
    details = [line for o in outcomes for line in ([o.line()] + list(o.details))]
    measured = [o for o in outcomes if o.verdict != SKIPPED]
    if not measured:
        return Outcome(SKIPPED, why="; ".join(dict.fromkeys(o.why for o in outcomes)), details=details)
    failed = [o for o in measured if o.verdict in FAILING]
    figure = "; ".join(o.figure for o in measured if o.figure)
    target = "; ".join(dict.fromkeys(o.target for o in measured if o.target))
    skipped = [o.why for o in outcomes if o.verdict == SKIPPED]
    why = "; ".join([o.why for o in failed] + [f"not checked: {w}" for w in skipped])
    return Outcome(FAIL if failed else PASS, figure, target, why, details)

