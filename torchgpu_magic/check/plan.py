"""The GPU check's steps, in order, and how each one's output is judged.

1. The machine: ``nvidia-smi``, its ``--query-gpu`` line, and the versions (torch, CUDA, driver).
2. The checks (:data:`~.registry.CHECKS`), each a figure against its target, in a process of its own.
3. From a checkout of the repository (tests/, benchmarks/, notebooks/ beside the package; a user with only
   the wheel gets 1 and 2): ``pytest -m gpu``; every benchmark with a ``--gpu`` mode (``--strict`` where it
   has one); the tour notebook executed to ``tour-gpu.ipynb``; the ordinary tests of the files that have
   GPU tests; and the rest of the suite, only when the time left covers its whole limit.

The checks come first so that a run cut short still has their figures. Nothing here imports torch or
IPython: the run's own process stays light, and every step's process is fresh.
"""
from __future__ import annotations

import re
import shutil
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

from .outcome import FAIL, INFO, PASS, SKIPPED, Outcome
from .registry import CHECKS
from .runner import Ended, Step

BENCH_MARKS = ("PASS", "FAIL", "SKIP")
SMI_QUERY = "name,driver_version,memory.used,memory.total,utilization.gpu,clocks.sm,clocks.max.sm"
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
LIMITS = {"nvidia-smi": 20, "pytest-gpu": 180, "bench": 150, "tour": 150, "pytest-gpu-files": 180,
          "pytest-rest": 240}
NOT_A_CHECKOUT = ("no repository checkout here (tests/, benchmarks/ and notebooks/ do not come with the "
                  "wheel): run from a checkout, or pass --repo")


def repo_root(package_dir: Path) -> Optional[Path]:
    """The checkout the package was imported from (its parent holds tests/ and pyproject.toml), or None."""
    root = package_dir.resolve().parent
    return root if (root / "pyproject.toml").is_file() and (root / "tests").is_dir() else None


# ---- judges ----------------------------------------------------------------------------------------------
def judge_info(ended: Ended) -> Outcome:
    """A command whose output is the figure (``nvidia-smi``): ``info``, or ``fail`` when it failed."""
    lines = [line for line in ended.log_text().splitlines()
             if line.strip() and not line.startswith(("$ ", "# "))]
    if ended.returncode != 0:
        return Outcome(FAIL, why=f"exit status {ended.returncode}: {lines[-1] if lines else 'no output'}")
    data = [line.strip() for line in lines if "," in line and not line.startswith(("|", "+"))]
    figure = "; ".join(data[1:] if len(data) > 1 else data) or next(
        (line.strip(" |") for line in lines if "Driver Version" in line), lines[0] if lines else "")
    return Outcome(INFO, " ".join(figure.split()))


def judge_check(ended: Ended) -> Outcome:
    """A check's outcome from the result file its process wrote."""
    if ended.result.exists():
        return Outcome.from_json(ended.result.read_text(encoding="utf-8"))
    return Outcome(FAIL, why=f"its process ended (exit status {ended.returncode}) without a verdict: see the "
                             "log")


def pytest_judge(junit: Path) -> Callable[[Ended], Outcome]:
    """A judge of a pytest run from its JUnit XML: ``fail`` on any failure or error, ``skipped`` (with the
    commonest reason) when every test skipped, else ``pass`` with the counts."""
    def judge(ended: Ended) -> Outcome:
        if not junit.exists():
            tail = ended.log_text().strip().splitlines()[-3:]
            return Outcome(FAIL, why=f"pytest wrote no report (exit status {ended.returncode}): "
                                     + " / ".join(tail))
        return judge_junit(junit.read_text(encoding="utf-8"), ended.returncode)
    return judge


def judge_junit(xml: str, returncode: Optional[int]) -> Outcome:
    """The verdict of a pytest run from its JUnit XML text and exit status."""
    root = ElementTree.fromstring(xml)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total, failed, errors, skipped = (sum(int(s.get(field, 0)) for s in suites)
                                      for field in ("tests", "failures", "errors", "skipped"))
    passed = total - failed - errors - skipped
    counted = ((passed, "passed"), (failed, "failed"), (errors, "errors"), (skipped, "skipped"))
    figure = ", ".join(f"{n} {word}" for n, word in counted if n)
    if failed or errors or returncode not in (0, 5):
        names = [f"{case.get('classname', '')}::{case.get('name', '')}" for case in root.iter("testcase")
                 if case.find("failure") is not None or case.find("error") is not None]
        return Outcome(FAIL, figure or "nothing ran", why=f"exit status {returncode}", details=names)
    if passed == 0:
        reasons = Counter(_skip_reason(s.get("message", "")) for s in root.iter("skipped"))
        if not skipped:
            return Outcome(SKIPPED, why="no test collected")
        why = reasons.most_common(1)[0][0] if reasons else "no reason given"
        return Outcome(SKIPPED, why=f"all {skipped} skipped: {why}")
    return Outcome(PASS, figure)


def _skip_reason(message: str) -> str:
    """pytest's skip message without its location prefix."""
    return re.sub(r"^\S*:\d+: ", "", message).removeprefix("Skipped: ")


def judge_benchmark(ended: Ended) -> Outcome:
    """A benchmark printing ``PASS``/``FAIL``/``SKIP`` lines: ``fail`` on a non-zero exit or a FAIL line."""
    lines = ended.log_text().splitlines()
    marks = Counter(word for word in (line.split(" ", 1)[0] for line in lines) if word in BENCH_MARKS)
    failed = [line[6:] for line in lines if line.startswith("FAIL ")]
    figure = ", ".join(f"{marks[m]} {m}" for m in BENCH_MARKS if marks[m]) or "no target reported"
    no_gpu = [line.strip() for line in failed if "sees no CUDA GPU" in line]
    if no_gpu:
        return Outcome(SKIPPED, why=no_gpu[0])
    if ended.returncode != 0 or failed:
        why = f"exit status {ended.returncode}" + (f": {failed[0]}" if failed else "")
        return Outcome(FAIL, figure, why=why, details=failed)
    return Outcome(PASS, figure, details=[line for line in lines if line.startswith((*BENCH_MARKS, "INFO"))])


def notebook_judge(output: Path) -> Callable[[Ended], Outcome]:
    """A judge of ``notebooks/run.py``: ``pass`` when every cell ran and the notebook was written."""
    def judge(ended: Ended) -> Outcome:
        text = ended.log_text()
        missing = re.search(r"ModuleNotFoundError: No module named '(nbclient|nbformat|ipykernel)'", text)
        if missing:
            return Outcome(SKIPPED, why=f"{missing.group(1)} is not installed (the wheels' install line "
                                        "adds it)")
        cells = len(re.findall(r"^In \[\d+\]:", text, re.M))
        if ended.returncode == 0 and output.exists():
            return Outcome(PASS, f"{cells} cells executed, written to {output.name}")
        errors = [line for line in text.splitlines() if re.match(r"^\w+(Error|Exception)\b", line)]
        why = errors[-1] if errors else f"exit status {ended.returncode}"
        return Outcome(FAIL, f"{cells} cells shown", why=why)
    return judge


# ---- the steps -------------------------------------------------------------------------------------------
def steps(out: Path, root: Optional[Path], python: str = sys.executable) -> list:
    """Every step of the run, in order (see the module's docstring)."""
    smi = shutil.which("nvidia-smi") or "nvidia-smi"
    no_smi = "" if shutil.which("nvidia-smi") else "nvidia-smi is not on PATH"
    query = [f"--query-gpu={SMI_QUERY}", "--format=csv"]
    plan = [Step("nvidia-smi", "nvidia-smi", [smi], LIMITS["nvidia-smi"], judge_info, unavailable=no_smi),
            Step("nvidia-smi-query", f"nvidia-smi {' '.join(query)}", [smi, *query], LIMITS["nvidia-smi"],
                 judge_info, unavailable=no_smi)]
    plan += [Step(name, check.title, [python, "-m", "torchgpu_magic.check.child", name, "{result}"],
                  check.limit, judge_check) for name, check in CHECKS.items()]
    plan += repository_steps(out, root, python)
    return plan


def repository_steps(out: Path, root: Optional[Path], python: str) -> list:
    """The steps that need the checkout: tests, benchmarks, the tour (without one, each skipped with why)."""
    if root is None:
        names = ["pytest-gpu", "bench-timing", "tour", "pytest-gpu-files", "pytest-rest"]
        return [Step(n, n, [], 0, judge_info, unavailable=NOT_A_CHECKOUT) for n in names]
    tests = root / "tests"
    gpu_files = sorted(str(p.relative_to(root)) for p in tests.glob("test_*.py")
                       if "mark.gpu" in p.read_text(encoding="utf-8"))
    junit = {name: out / f"junit-{name}.xml" for name in ("pytest-gpu", "pytest-gpu-files", "pytest-rest")}
    plan = [Step("pytest-gpu", "pytest -m gpu: every GPU test", [python, *PYTEST, "-m", "gpu", "--junitxml",
                 str(junit["pytest-gpu"]), "tests"], LIMITS["pytest-gpu"], pytest_judge(junit["pytest-gpu"]))]
    for bench in sorted((root / "benchmarks").glob("bench_*.py")):
        source = bench.read_text()
        if '"--gpu"' not in source:
            continue
        strict = ["--strict"] if '"--strict"' in source else []
        argv = [python, str(bench.relative_to(root)), "--gpu", *strict]
        plan.append(Step(f"bench-{bench.stem.removeprefix('bench_')}", " ".join(argv[1:]), argv,
                         LIMITS["bench"], judge_benchmark))
    tour = out / "tour-gpu.ipynb"
    no_tour = "" if (root / "notebooks" / "tour.ipynb").is_file() else "no notebooks/tour.ipynb here"
    plan.append(Step("tour", "notebooks/tour.ipynb executed in a kernel, to tour-gpu.ipynb",
                     [python, "notebooks/run.py", "notebooks/tour.ipynb", "--output", str(tour),
                      "--timeout", "120"],
                     LIMITS["tour"], notebook_judge(tour), unavailable=no_tour))
    plan.append(Step("pytest-gpu-files", "the ordinary tests of the files with GPU tests",
                     [python, *PYTEST, "-m", "not gpu", "--junitxml", str(junit["pytest-gpu-files"]),
                      *gpu_files],
                     LIMITS["pytest-gpu-files"], pytest_judge(junit["pytest-gpu-files"]),
                     unavailable="" if gpu_files else "no test file has a gpu-marked test"))
    ignored = [f"--ignore={f}" for f in gpu_files + ["tests/test_browser.py"]]
    plan.append(Step("pytest-rest", "the rest of the ordinary suite (not the browser), when time is left",
                     [python, *PYTEST, "-m", "not gpu", *ignored, "--junitxml", str(junit["pytest-rest"]),
                      "tests"],
                     LIMITS["pytest-rest"], pytest_judge(junit["pytest-rest"]), optional=True))
    return plan
