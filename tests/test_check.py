"""The GPU check (``python -m torchgpu_magic.check``, ``make gpu-check``): the step runner (a step's limit,
the total deadline, a hung step killed with its whole process group while the next one runs), the judges of
pytest, benchmark, notebook, ``nvidia-smi`` and check output, every check's verdict on figures that meet
and that miss their targets, ``summary.md``, the command line, and one run of the command as a user runs
it under the simulated H100: the checks that need a kernel skip, each saying why, and ``%gpuinfo``
compared with a stand-in ``nvidia-smi`` that disagrees by 5 MiB fails. No GPU result comes from here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from conftest import ROOT

from torchgpu_magic.check import __main__ as cli
from torchgpu_magic.check import child, context_checks, memory_checks, placement_checks, plan, runner, summary
from torchgpu_magic.check import timing_checks as tc
from torchgpu_magic.check.outcome import FAIL, INFO, PASS, SKIPPED, TIMEOUT, Outcome, Skip, worst
from torchgpu_magic.check.runner import Ended, Result, Step, run_plan

MiB = 2**20


def _python(code: str) -> list:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# ---- the runner -------------------------------------------------------------------------------------------
class _LimitFromItsFirstLine(subprocess.Popen):
    """A step's process whose limit starts to count once it has written its first line to its log (or
    ended): the hung step below writes that line after starting its child, so the child exists before the
    kill in that order, not by a race between the limit and a loaded machine starting two interpreters."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._log, self._header = Path(kwargs["stdout"].name), kwargs["stdout"].tell()
        self._waited = False

    def wait(self, timeout=None):
        if timeout is not None and not self._waited:  # the limit's wait; the kill's come after it
            self._waited = True
            for _ in range(1200):  # 60 s at most
                if len(self._log.read_text()) > self._header or self.poll() is not None:
                    break
                time.sleep(0.05)
        return super().wait(timeout)


def test_a_hung_step_is_killed_with_its_process_group_and_the_next_step_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "KILL_GRACE_S", 0.5)
    monkeypatch.setattr(runner, "subprocess", types.SimpleNamespace(**{**vars(subprocess),
                                                                      "Popen": _LimitFromItsFirstLine}))
    hung = Step("hung", "hangs, with a child that ignores SIGTERM", _python("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        print("grandchild", child.pid, flush=True)
        time.sleep(600)
    """), limit=2, judge=lambda ended: Outcome(PASS, "should not be judged"))
    after = Step("after", "runs after", _python("print('after ran')"), limit=60, judge=plan.judge_info)
    lines: list = []
    first, second = run_plan([hung, after], tmp_path, deadline=300, echo=lines.append)
    assert first.outcome.verdict == TIMEOUT
    assert first.outcome.why == "killed after its limit of 2 s"
    log = (tmp_path / first.log).read_text()
    assert log.endswith("s\n") and "# killed after its limit" in log
    pid = int(next(line for line in log.splitlines() if line.startswith("grandchild")).split()[1])
    for _ in range(100):  # the group got SIGKILL; the orphan is reaped by init
        if _gone(pid):
            break
        subprocess.run(["sleep", "0.1"])
    assert _gone(pid)
    assert (second.outcome.verdict, second.outcome.figure) == (INFO, "after ran")
    assert lines[0].endswith("hung: timeout: did not finish in 2 s; killed after its limit of 2 s")


def test_the_deadline_cuts_a_steps_limit_and_skips_what_no_longer_fits(tmp_path, monkeypatch):
    now = [0.0]
    spent = {"a": (60, False), "c": (90, True)}
    given = {}

    def fake_run(step, out, index, timeout, env=None, cwd=None):
        given[step.name] = timeout
        seconds, killed = spent[step.name]
        now[0] += seconds
        return Ended(None if killed else 0, out / "x.log", out / "x.json", seconds, killed)

    monkeypatch.setattr(runner, "run_step", fake_run)
    judge = lambda ended: Outcome(PASS, "ok")  # noqa: E731
    steps = [Step("a", "a", [], 100, judge), Step("b", "b", [], 100, judge, optional=True),
             Step("c", "c", [], 100, judge), Step("d", "d", [], 50, judge),
             Step("e", "e", [], 10, judge, unavailable="no e here")]
    results = run_plan(steps, tmp_path, deadline=150, clock=lambda: now[0], echo=lambda line: None)
    assert given == {"a": 100, "c": 90}
    verdicts = {r.name: r.outcome for r in results}
    assert verdicts["a"].verdict == PASS
    assert verdicts["b"].verdict == SKIPPED and verdicts["b"].why == (
        "run only when time is left: it may take 100 s, 90 s of the 150 s budget were left")
    assert verdicts["c"].verdict == TIMEOUT
    assert verdicts["c"].why.startswith("killed at the total deadline, 90 s")
    assert verdicts["d"].verdict == SKIPPED and "budget of 150 s was spent" in verdicts["d"].why
    assert (verdicts["e"].verdict, verdicts["e"].why) == (SKIPPED, "no e here")


def test_a_check_whose_process_dies_without_a_verdict_fails_and_so_does_a_missing_command(tmp_path):
    died = Step("died", "dies", _python("import os; os.abort()"), 60, plan.judge_check)
    missing = Step("missing", "no such program", [str(tmp_path / "no-such-program")], 60, plan.judge_check)
    outcome = Outcome(SKIPPED, why="no GPU").to_json()
    wrote = Step("wrote", "writes its outcome",
                 _python(f"import sys; open(sys.argv[1], 'w').write({outcome!r})") + ["{result}"], 60,
                 plan.judge_check)
    results = run_plan([died, missing, wrote], tmp_path, deadline=120, echo=lambda line: None)
    assert [r.outcome.verdict for r in results] == [FAIL, FAIL, SKIPPED]
    assert results[0].outcome.why.startswith("its process ended (exit status -6) without a verdict")
    assert "could not start" in (tmp_path / results[1].log).read_text()
    assert results[2].outcome.why == "no GPU"


def test_a_judge_that_breaks_fails_its_step(tmp_path):
    def broken(ended):
        raise KeyError("figure")

    (result,) = run_plan([Step("s", "s", _python("pass"), 60, broken)], tmp_path, 60, echo=lambda line: None)
    assert result.outcome.verdict == FAIL
    assert result.outcome.why == "could not judge the step's output: KeyError: 'figure'"


# ---- the judges -------------------------------------------------------------------------------------------
def _ended(tmp_path, text: str, code=0) -> Ended:
    log = tmp_path / "step.log"
    log.write_text("$ the command\n# limit 10 s\n" + text)
    return Ended(code, log, tmp_path / "step.json", 1.0)


def test_a_pytest_step_is_judged_from_its_junit_report(tmp_path):
    (tmp_path / "test_some.py").write_text("import pytest\n\ndef test_ok():\n    pass\n\n"
                                           "def test_skip():\n    pytest.skip('needs a CUDA GPU')\n")
    (tmp_path / "test_none.py").write_text("import pytest\n\n@pytest.mark.skip(reason='needs a CUDA GPU')\n"
                                           "def test_a():\n    pass\n")
    steps = [Step(name, name, [sys.executable, *plan.PYTEST, "--junitxml", str(tmp_path / f"{name}.xml"),
                               f"{name}.py"], 120, plan.pytest_judge(tmp_path / f"{name}.xml"))
             for name in ("test_some", "test_none")]
    some, none = run_plan(steps, tmp_path, deadline=240, cwd=tmp_path, echo=lambda line: None)
    assert (some.outcome.verdict, some.outcome.figure) == (PASS, "1 passed, 1 skipped")
    assert (none.outcome.verdict, none.outcome.why) == (SKIPPED, "all 1 skipped: needs a CUDA GPU")


JUNIT = ('<testsuites><testsuite name="pytest" errors="{e}" failures="{f}" skipped="{s}" tests="{t}">'
         '<testcase classname="tests.test_x" name="test_a"><failure message="assert 1 == 2"/></testcase>'
         '<testcase classname="tests.test_x" name="test_b"><skipped message="tests/x.py:3: needs a GPU"/>'
         '</testcase>'
         '</testsuite></testsuites>')


def test_junit_verdicts():
    failed = plan.judge_junit(JUNIT.format(e=0, f=1, s=1, t=5), 1)
    assert (failed.verdict, failed.figure, failed.details) == (FAIL, "3 passed, 1 failed, 1 skipped",
                                                               ["tests.test_x::test_a"])
    assert plan.judge_junit(JUNIT.format(e=0, f=0, s=0, t=0), 5).why == "no test collected"
    assert plan.judge_junit(JUNIT.format(e=0, f=0, s=2, t=2), 0).why == "all 2 skipped: needs a GPU"
    assert plan.judge_junit(JUNIT.format(e=0, f=0, s=0, t=4), 2).verdict == FAIL  # interrupted: not a pass


def test_benchmark_notebook_info_and_check_verdicts(tmp_path):
    bench = plan.judge_benchmark
    met = bench(_ended(tmp_path, "PASS  a: 1\nPASS  b: 2\nINFO  floor\nall targets met\n"))
    assert (met.verdict, met.figure) == (PASS, "2 PASS")
    missed = bench(_ended(tmp_path, "PASS  a: 1\nFAIL  b: 1.03 (target 1 +- 0.02)\n", code=1))
    assert (missed.verdict, missed.why) == (FAIL, "exit status 1: b: 1.03 (target 1 +- 0.02)")
    assert bench(_ended(tmp_path, "Traceback ...\nRuntimeError: x\n", code=1)).verdict == FAIL
    no_gpu = bench(_ended(tmp_path, "FAIL  --gpu: torch sees no CUDA GPU here\n", code=1))
    assert (no_gpu.verdict, no_gpu.why) == (SKIPPED, "--gpu: torch sees no CUDA GPU here")

    written = tmp_path / "tour-gpu.ipynb"
    judge = plan.notebook_judge(written)
    assert judge(_ended(tmp_path, "ModuleNotFoundError: No module named 'nbclient'\n", 1)).verdict == SKIPPED
    assert judge(_ended(tmp_path, "In [1]: x\nIn [2]: y\nCellExecutionError: boom\n", 1)).why == (
        "CellExecutionError: boom")
    written.write_text("{}")
    ran = judge(_ended(tmp_path, "In [1]: x\nIn [2]: y\n"))
    assert (ran.verdict, ran.figure) == (PASS, "2 cells executed, written to tour-gpu.ipynb")

    smi = plan.judge_info(_ended(tmp_path, "+------+\n| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   "
                                           "CUDA Version: 13.0 |\n+------+\n"))
    assert smi.verdict == INFO
    assert smi.figure == "NVIDIA-SMI 580.159.04 Driver Version: 580.159.04 CUDA Version: 13.0"
    query = plan.judge_info(_ended(tmp_path, "name, memory.used [MiB]\nNVIDIA H100 80GB HBM3, 4 MiB\n"))
    assert query.figure == "NVIDIA H100 80GB HBM3, 4 MiB"
    assert plan.judge_info(_ended(tmp_path, "NVIDIA-SMI has failed\n", code=9)).verdict == FAIL

    assert plan.judge_check(_ended(tmp_path, "")).why.startswith("its process ended (exit status 0) without")
    (tmp_path / "step.json").write_text(Outcome(PASS, "1 ms", "+- 1 us", details=["a"]).to_json())
    assert plan.judge_check(_ended(tmp_path, "")) == Outcome(PASS, "1 ms", "+- 1 us", details=["a"])


# ---- each check's verdict: figures that meet the target pass, figures that miss fail ----------------------
def _torch_device(spec):
    import torch

    return torch.device(spec)


ALLOCATOR = (256 * MiB, 258 * MiB)  # allocated, reserved
VERDICTS = {
    "sleep kernels vs profiler": (
        lambda: tc.judge_sleep_points([(1e-5, 10.4e-6, 10e-6), (0.1, 0.1003, 0.1)]),
        lambda: tc.judge_sleep_points([(1e-5, 10.4e-6, 10e-6), (1e-3, 1.0102e-3, 1e-3)])),
    "matmul vs do_bench": (lambda: tc.judge_ratio("m", 1.01e-3, 1e-3, "do_bench", 0.02),
                           lambda: tc.judge_ratio("m", 1.03e-3, 1e-3, "do_bench", 0.02)),
    "--cold and --flush-l2": (lambda: tc.judge_cold(10e-6, 1.3e-6, 12e-6, 12.5e-6, (20e-6, 30e-6), 50 * MiB),
                              lambda: tc.judge_cold(10e-6, 1.3e-6, 12.6e-6, 12.6e-6, (20e-6, 30e-6),
                                                    50 * MiB)),
    "empty-cell floor": (lambda: tc.judge_floor(30e-9, 2e-6, 100e-6, []),
                         lambda: tc.judge_floor(30e-9, 2e-6, 100e-6, ["the result is under 10 x ..."])),
    "roofline": (lambda: tc.judge_roofline(0.8, "compute", 0.85, "memory", "H100 SXM"),
                 lambda: tc.judge_roofline(0.97, "compute", 0.85, "memory", "H100 SXM")),
    "%gpumem figures": (lambda: memory_checks.judge_gpumem(*ALLOCATOR, 800 * MiB, *ALLOCATOR, 800.4, ""),
                        lambda: memory_checks.judge_gpumem(*ALLOCATOR, 800 * MiB, *ALLOCATOR, 803, "")),
    "out of memory": (
        lambda: memory_checks.judge_oom("cuda:0", True, "gpumem: out of memory on cuda:0: asked 512 MiB; x",
                                        79 * 2**30, 79 * 2**30, 80 * 2**30, True, 40 * 2**30, 40 * 2**30,
                                        40 * 2**30, True),
        lambda: memory_checks.judge_oom("cuda:0", True, "gpumem: out of memory on cuda:0: asked 512 MiB; x",
                                        79 * 2**30, 79 * 2**30, 80 * 2**30, True, 40 * 2**30, 40 * 2**30,
                                        38 * 2**30, True)),
    "%%cudamem --predict cuda": (
        lambda: memory_checks.judge_prediction([("fp32", 103, 100), ("bf16 autocast", 97, 100)], "GPT-2"),
        lambda: memory_checks.judge_prediction([("fp32", 103, 100), ("bf16 autocast", 94, 100)], "GPT-2")),
    "%whereis with Adam": (lambda: placement_checks.judge_whereis("cuda:0: 2 tensors\n  model", "cuda:0", 8),
                           lambda: placement_checks.judge_whereis(
                               "cuda:0: ...\n  opt: state not on its params' device (cpu): step() will fail",
                               "cuda:0", 8)),
    "mismatch diagnosis": (
        lambda: placement_checks.judge_mismatch(RuntimeError(), "whereis: cuda:0 vs cpu\n"
                                                f"  {placement_checks.FIX}", "cuda:0"),
        lambda: placement_checks.judge_mismatch(RuntimeError(), "whereis: cuda:0 vs cpu", "cuda:0")),
    "%%ontorch cuda:0": (
        lambda: placement_checks.judge_ontorch((_torch_device("cuda:0"), _torch_device("cuda:0"), 0),
                                               _torch_device("cpu")),
        lambda: placement_checks.judge_ontorch((_torch_device("cuda:0"), _torch_device("cpu"), 0),
                                               _torch_device("cpu"))),
    "%gpuinfo vs nvidia-smi": (
        lambda: context_checks.judge_gpuinfo([(0, 4 * MiB, 0.0, (9.0, 0.0), (4.0, 0.0))]),
        lambda: context_checks.judge_gpuinfo([(0, 4 * MiB, 0.0, (6.0, 0.0), (6.0, 0.0))])),
    "no context": (
        lambda: context_checks.judge_no_context({"%gpuinfo": (0, "CONTEXTS [] NVML []")}),
        lambda: context_checks.judge_no_context({"%gpuinfo": (0, "CONTEXTS [] NVML []"),
                                                 "%gpumem": (0, "CONTEXTS [0] NVML [0]")})),
}


@pytest.mark.parametrize("name", list(VERDICTS))
def test_each_check_passes_figures_on_target_and_fails_figures_that_miss(name):
    meets, misses = VERDICTS[name]
    good, bad = meets(), misses()
    assert good.verdict == PASS, good
    assert bad.verdict == FAIL and bad.why, bad
    assert good.figure and good.target and bad.figure


def test_verdict_details_say_which_part_missed():
    cold = tc.judge_cold(10e-6, 1.3e-6, 14e-6, 14e-6, None, 8 * MiB)
    assert cold.verdict == FAIL and "not checked: this GPU's L2 (8 MiB) is too small" in cold.why
    contexts = context_checks.judge_no_context({"%whereis": (1, None),
                                                "%gpuinfo": (0, "CONTEXTS [] NVML []")})
    assert contexts.why == "%whereis: failed (exit status 1), see the log"
    assert contexts.figure == "1 of 2 steps left no context and no NVML entry"
    util = context_checks.judge_gpuinfo([(0, 4 * MiB, 40.0, (4.0, 0.0), None)])
    assert util.why == "outside: GPU 0 utilisation"
    nvml = memory_checks.judge_gpumem(1, 2, None, 1, 2, None, "NVML's process list has no entry for this PID")
    assert nvml.verdict == PASS and nvml.why.startswith("not checked: this process's figure: NVML's")


def test_worst_of_sub_outcomes():
    skipped = Outcome(SKIPPED, why="no L2")
    assert worst([skipped, Outcome(SKIPPED, why="no L2")]) == Outcome(SKIPPED, why="no L2", details=[
        "skipped: no L2", "skipped: no L2"])
    assert worst([Outcome(PASS, "a", "t"), skipped]).verdict == PASS
    assert worst([Outcome(PASS, "a", "t"), Outcome(FAIL, "b", "t", "off")]).why == "off"
    with pytest.raises(ValueError):
        Outcome("maybe")


# ---- the checks' own processes --------------------------------------------------------------------------
def test_a_check_that_raises_fails_with_its_reason_and_one_that_cannot_measure_skips(monkeypatch, capsys):
    def broken(probe):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    def unable(probe):
        raise Skip("triton is not installed here")

    monkeypatch.setitem(child.CHECKS, "broken", child.CHECKS["versions"]._replace(run=broken))
    monkeypatch.setitem(child.CHECKS, "unable", child.CHECKS["versions"]._replace(run=unable))
    assert child.run_check("broken") == Outcome(
        FAIL, why="the check raised RuntimeError: CUDA error: an illegal memory access was encountered")
    assert "Traceback" in capsys.readouterr().err
    assert child.run_check("unable") == Outcome(SKIPPED, why="triton is not installed here")
    assert child.main(["nope", "x.json"]) == 2


def test_every_check_that_needs_a_kernel_skips_on_the_simulated_gpu_saying_why(simulated_gpu):
    import torch

    for name in ("cudatime-vs-profiler", "roofline", "out-of-memory", "whereis-adam", "no-context"):
        outcome = child.run_check(name)
        assert outcome.verdict == SKIPPED, (name, outcome)
        assert outcome.why.startswith(f"this torch ({torch.__version__}) is not built with CUDA"), outcome
    assert not simulated_gpu.contexts  # deciding that it cannot measure touched no CUDA context


# ---- the plan, the summary, the command line ---------------------------------------------------------------
def test_the_plan_from_a_checkout_and_without_one(tmp_path):
    assert plan.repo_root(ROOT / "torchgpu_magic") == ROOT
    steps = {s.name: s for s in plan.steps(tmp_path, ROOT, python="py")}
    names = list(steps)
    assert names[:3] == ["nvidia-smi", "nvidia-smi-query", "versions"]
    assert names.index("ontorch-cuda") < names.index("pytest-gpu") < names.index("bench-timing")
    assert names[-3:] == ["tour", "pytest-gpu-files", "pytest-rest"]
    assert steps["bench-timing"].argv == ["py", "benchmarks/bench_timing.py", "--gpu", "--strict"]
    junit = str(tmp_path / "junit-pytest-gpu.xml")
    assert steps["pytest-gpu"].argv[-4:] == ["gpu", "--junitxml", junit, "tests"]
    gpu_files = steps["pytest-gpu-files"].argv
    assert "tests/test_cudatime.py" in gpu_files and "tests/test_layout.py" not in gpu_files
    assert steps["pytest-rest"].optional and "--ignore=tests/test_cudatime.py" in steps["pytest-rest"].argv
    assert steps["tour"].argv[-4:] == ["--output", str(tmp_path / "tour-gpu.ipynb"), "--timeout", "120"]
    assert steps["versions"].argv == ["py", "-m", "torchgpu_magic.check.child", "versions", "{result}"]
    wheel_only = [s for s in plan.steps(tmp_path, None) if s.unavailable == plan.NOT_A_CHECKOUT]
    assert [s.name for s in wheel_only] == ["pytest-gpu", "bench-timing", "tour", "pytest-gpu-files",
                                            "pytest-rest"]


def test_summary_lists_every_step_with_its_verdict_and_why(tmp_path):
    results = [
        Result("versions", "torch and the GPU", Outcome(INFO, "torch 2.11, 1 GPU", details=["cuDNN 9"]), 2.0,
               "logs/v"),
        Result("floor", "the floor", Outcome(PASS, "5 ns | 2 us", "hot <= 1 us", details=["point"]), 3.0,
               "logs/f"),
        Result("matmul", "vs do_bench", Outcome(FAIL, "ratio 1.03", "1 +- 0.02", "outside the target"), 4.0,
               "l/m"),
        Result("pytest-gpu", "pytest -m gpu", Outcome(TIMEOUT, "did not finish in 5 s", why="killed"), 5.0,
               "l/p"),
        Result("tour", "the tour", Outcome(SKIPPED, why="nbclient is not installed")),
    ]
    text = summary.write(tmp_path, results, "python -m torchgpu_magic.check --out x", 450, 14.2, "today")
    assert text == (tmp_path / "summary.md").read_text()
    assert ("5 steps in 14 s of a 450 s budget: 1 pass, 1 fail, 1 timeout, 1 skipped, 1 info. 2 missed: "
            "matmul, pytest-gpu." in text)
    assert "- **torch and the GPU**: torch 2.11, 1 GPU\n  - cuDNN 9" in text
    assert "| 2 | floor: the floor | **pass** | 5 ns \\| 2 us | hot <= 1 us |  | 3.0 s | logs/f |" in text
    assert "## Not checked\n\n- tour: skipped: nbclient is not installed" in text
    assert "- matmul: fail: ratio 1.03 (target 1 +- 0.02); outside the target (log: l/m)" in text
    assert "### floor\n- point" in text
    data = json.loads((tmp_path / "summary.json").read_text())
    assert [s["verdict"] for s in data["steps"]] == [INFO, PASS, FAIL, TIMEOUT, SKIPPED]
    nothing = summary.render([results[-1]], "c", 10, 1, "today")
    assert "Nothing was measured here: see what was not checked, and why." in nothing


def test_the_command_line_refuses_unknown_steps_and_lists_the_rest(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--only", "versions,nope"])
    assert exit_.value.code == 2
    assert "no step named nope; the steps are: nvidia-smi, " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--deadline", "0"])
    assert "--deadline takes a positive number of seconds, not 0" in capsys.readouterr().err
    assert cli.main(["--list", "--skip", "pytest-rest"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[2].split()[:3] == ["versions", "45", "s"] and not any("pytest-rest" in x for x in listed)


def test_the_validation_page_documents_every_step():
    page = (ROOT / "docs" / "gpu-validation.md").read_text()
    for step in plan.steps(ROOT / "out", ROOT):
        assert f"`{step.name}`" in page, step.name
    line = ("python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "
            ".whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 "
            "&& make gpu-check OUT=$OUT")
    assert line in page


# ---- the command as a user runs it, under the simulated H100 ----------------------------------------------
FAKE_SMI = '''#!{python} -S
"""nvidia-smi as it prints on one idle H100 80GB HBM3, driver 580.159.04 (tests/fake_pynvml.py's h100
scenario), except memory.used: FAKE_SMI_USED_MIB. The summary table, --query-gpu in CSV (with or without
header and units), and an empty --query-compute-apps. (-S: no site, so not the simulation either.)"""
import os
import sys

FIELDS = {{"index": ("0", ""), "name": ("NVIDIA H100 80GB HBM3", ""), "driver_version": ("580.159.04", ""),
          "memory.used": (os.environ.get("FAKE_SMI_USED_MIB", "4"), "MiB"), "memory.total": ("81559", "MiB"),
          "utilization.gpu": ("0", "%"), "clocks.sm": ("345", "MHz"), "clocks.max.sm": ("1980", "MHz")}}
options = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
form = options.get("--format", "").split(",")
if "--query-gpu" in options:
    names = options["--query-gpu"].split(",")
    if "noheader" not in form:
        print(", ".join(f"{{n}} [{{FIELDS[n][1]}}]" if FIELDS[n][1] and "nounits" not in form else n
                        for n in names))
    print(", ".join(FIELDS[n][0] + ("" if "nounits" in form or not FIELDS[n][1] else " " + FIELDS[n][1])
                    for n in names))
elif "--query-compute-apps" in options:
    if "noheader" not in form:
        print("pid, gpu_uuid, used_gpu_memory [MiB]")
else:
    print("| NVIDIA-SMI 580.159.04    Driver Version: 580.159.04    CUDA Version: 13.0 |")
    print("|   0  NVIDIA H100 80GB HBM3  On | 00000000:18:00.0 Off | 4MiB / 81559MiB |")
'''
SIMULATION = '''
import sys
sys.path.insert(0, {tests!r})
import pytest
import simulated_gpu

simulated_gpu.install(pytest.MonkeyPatch())
'''


@pytest.mark.fresh_process
def test_the_command_under_the_simulated_h100_runs_skips_with_why_and_fails_a_disagreement(tmp_path):
    import torch

    if torch.backends.cuda.is_built():  # what the simulation leaves alone: a real CUDA build
        pytest.skip("a CUDA build of torch: `make gpu-check` runs the real thing on its GPU")
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    site.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    # every Python process of the run (the checks' own, and those they start) sees the simulated H100
    (site / "sitecustomize.py").write_text(SIMULATION.format(tests=str(ROOT / "tests")))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SMI_USED_MIB": "9",
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    out = tmp_path / "out"
    steps = "nvidia-smi,nvidia-smi-query,versions,gpuinfo-vs-smi,no-context,cudatime-vs-profiler"
    done = subprocess.run([sys.executable, "-m", "torchgpu_magic.check", "--out", str(out), "--only", steps,
                           "--deadline", "240"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # the disagreement fails the run
    text = (out / "summary.md").read_text()
    assert done.stdout.endswith(text + "\n")
    assert "6 steps in " in text and "1 fail, 2 skipped, 3 info. 1 missed: gpuinfo-vs-smi." in text
    rows = {line.split(" | ")[1].split(":")[0]: line for line in text.splitlines() if line.startswith("| ")
            and line[2].isdigit()}
    assert "Driver Version: 580.159.04" in rows["nvidia-smi"]
    query = "NVIDIA H100 80GB HBM3, 580.159.04, 9 MiB, 81559 MiB, 0 %, 345 MHz, 1980 MHz"
    assert query in rows["nvidia-smi-query"]
    assert "NVIDIA H100 80GB HBM3" in rows["versions"] and "a CPU build" in rows["versions"]
    disagreement = "| **fail** | GPU 0: 4.0 MiB, 0.0 % vs nvidia-smi 9 MiB, 0 % / 9 MiB, 0 %"
    assert disagreement in rows["gpuinfo-vs-smi"]
    for name in ("cudatime-vs-profiler", "no-context"):
        assert "| **skipped** |" in rows[name] and "is not built with CUDA" in rows[name], rows[name]
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == ["01-nvidia-smi.log", "02-nvidia-smi-query.log", "03-versions.log",
                    "04-gpuinfo-vs-smi.log", "05-no-context.log", "06-cudatime-vs-profiler.log"]
    assert "%gpuinfo: [(0, 4194304.0, 0.0, (9.0, 0.0), (9.0, 0.0))]" in (out / "logs" / logs[3]).read_text()
    assert [s["verdict"] for s in json.loads((out / "summary.json").read_text())["steps"]] == [
        INFO, INFO, INFO, FAIL, SKIPPED, SKIPPED]
