"""Run the GPU check's steps: each a subprocess with a time limit of its own, under one total deadline.

A step is a command (``nvidia-smi``, ``pytest -m gpu``, a benchmark, one check in a process of its own)
and a judge that turns how it ended (exit status, its log, the result file it wrote) into an
:class:`~torchgpu_magic.check.outcome.Outcome`. Every step runs in a session of its own with its output in
its own log; one that outlives its limit is killed with its whole process group (a pytest run's kernels
and fresh interpreters too) and marked ``timeout``, and the next step starts. Before each step the time
left of the total deadline caps its limit; an optional step (the full suite) starts only when the time
left covers its whole limit; once the deadline is spent the remaining steps are skipped, each saying so.
Standard library only.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from .outcome import FAIL, SKIPPED, TIMEOUT, Outcome

MIN_STEP_S = 5.0  # a step is not started with less than this left of the deadline
KILL_GRACE_S = 3.0  # SIGTERM, then this long, then SIGKILL


@dataclass
class Ended:
    """How a step's process ended: exit status (None when killed), its log, the result file it was asked
    to write (checks), seconds it ran, and whether it was killed for its limit."""

    returncode: Optional[int]
    log: Path
    result: Path
    seconds: float
    timed_out: bool = False

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""


@dataclass
class Step:
    """One step: ``name`` (its id on the command line and its log's name), ``title`` (what it checks),
    ``argv`` (``{result}`` in it is replaced by the path of its result file), ``limit`` in seconds,
    ``judge`` (an :class:`Ended` to an :class:`Outcome`), ``optional`` (started only when the time left
    covers its whole limit) and ``unavailable`` (why it cannot run here at all: skipped without starting)."""

    name: str
    title: str
    argv: list
    limit: float
    judge: Callable[[Ended], Outcome]
    optional: bool = False
    unavailable: str = ""


@dataclass
class Result:
    """A step as the summary shows it."""

    name: str
    title: str
    outcome: Outcome
    seconds: float = 0.0
    log: Optional[str] = None  # relative to the output folder


def run_step(step: Step, out: Path, index: int, timeout: float, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[Path] = None) -> Ended:
    """Run ``step`` with ``timeout`` seconds, its output to ``out/logs/NN-name.log``; kill its process group
    when the time is up."""
    logs, results = out / "logs", out / "results"
    logs.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    log, result = logs / f"{index:02d}-{step.name}.log", results / f"{step.name}.json"
    result.unlink(missing_ok=True)
    argv = [str(a).replace("{result}", str(result)) for a in step.argv]
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as handle:
        handle.write(f"$ {' '.join(argv)}\n# limit {timeout:.0f} s\n")
        handle.flush()
        try:
            process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
                                       cwd=cwd, start_new_session=True)
        except OSError as exc:
            handle.write(f"# could not start: {exc}\n")
            return Ended(127, log, result, time.monotonic() - started)
        try:
            code: Optional[int] = process.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(process)
            code, timed_out = None, True
        seconds = time.monotonic() - started
        handle.write(f"\n# {'killed after its limit' if timed_out else f'exit status {code}'}, "
                     f"{seconds:.1f} s\n")
    return Ended(code, log, result, seconds, timed_out)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM to the step's whole process group; after a grace period, SIGKILL to whatever of the group
    is left (children that outlived their leader or ignored SIGTERM)."""
    with contextlib.suppress(ProcessLookupError):  # the whole group has gone
        os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILL_GRACE_S)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_plan(steps: list, out: Path, deadline: float, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[Path] = None, clock: Callable[[], float] = time.monotonic,
             echo: Callable[[str], None] = print) -> list:
    """Run ``steps`` in order within ``deadline`` seconds in all; a :class:`Result` for each, run or not."""
    start = clock()
    results = []
    for index, step in enumerate(steps, 1):
        left = deadline - (clock() - start)
        if step.unavailable:
            outcome, ended = Outcome(SKIPPED, why=step.unavailable), None
        elif left < MIN_STEP_S:
            outcome, ended = Outcome(SKIPPED, why=f"the total budget of {deadline:.0f} s was spent before it "
                                                  "started"), None
        elif step.optional and left < step.limit:
            outcome, ended = Outcome(SKIPPED, why=f"run only when time is left: it may take "
                                                  f"{step.limit:.0f} s, {left:.0f} s of the {deadline:.0f} s "
                                                  "budget were left"), None
        else:
            timeout = min(step.limit, left)
            ended = run_step(step, out, index, timeout, env, cwd)
            outcome = _judge(step, ended, timeout, cut=timeout < step.limit)
        result = Result(step.name, step.title, outcome, ended.seconds if ended else 0.0,
                        str(ended.log.relative_to(out)) if ended else None)
        results.append(result)
        echo(f"[{clock() - start:6.1f} s] {step.name}: {outcome.line()}")
    return results


def _judge(step: Step, ended: Ended, timeout: float, cut: bool) -> Outcome:
    """The step's own judge, except for a killed step (``timeout``) or a judge that fails itself."""
    if ended.timed_out:
        why = (f"killed at the total deadline, {timeout:.0f} s after it started (its own limit is "
               f"{step.limit:.0f} s)" if cut else f"killed after its limit of {step.limit:.0f} s")
        return Outcome(TIMEOUT, f"did not finish in {timeout:.0f} s", why=why)
    try:
        return step.judge(ended)
    except Exception as exc:  # noqa: BLE001 - a judge that cannot read the step is the step's failure
        return Outcome(FAIL, why=f"could not judge the step's output: {type(exc).__name__}: {exc}")
