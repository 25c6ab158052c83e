"""The output examples of README.md and docs/*.md: their inputs, the run that makes them, and the rule
that compares a run with the text.

Every output shown in the README and the reference pages is an example named by an HTML comment on the
line before its fenced block (``<!-- example: readme-gpuinfo -->``). Its inputs are kept here, in
:data:`SESSIONS`, and nowhere else: each session runs its cells in order in a real ``InteractiveShell``
with the extension loaded, on the machine as it is (on the CI machine: no GPU, a CPU build of torch; no
simulated GPU), and the block shows every cell as a UTF-8 terminal shows it (``In [n]:``, then what the
cell printed, displayed or raised, colours off). A file with examples also carries one ``examples-env``
comment: the machine they were written on.

    python docs/examples.py --write    # run every session; rewrite the blocks whose text changed
    python docs/examples.py            # run every session; list the blocks that differ from a run
    python docs/examples.py --only readme-gpuinfo,oom-cpu   # those examples' sessions only

``tests/test_docs.py`` repeats the run and compares each block with it through :func:`mask`, which hides
only what legitimately varies from run to run (see its docstring), so a changed report fails the test
until the docs are rewritten in the same commit. Where the machine differs from the one the examples were
written on (another torch, IPython major version or operating system, or a GPU), the comparison is skipped
and says so.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import platform
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"<!-- example: ([\w-]+) -->\n```[^\n]*\n(.*?)```", re.S)
ENV_MARK = re.compile(r"<!-- examples-env: (\{.*?\}) -->")
# what an environment must share with the one the examples were written on for a run to be compared
SAME = ("torch", "ipython", "os", "gpu")


@dataclass(frozen=True)
class Example:
    """Cells shown together in one block. ``head``: keep only that many lines of the last cell's output
    (then one line ``…``); ``fails``: the last cell raises on purpose (any other failure stops the run);
    ``depends``: what else of the machine (keys of :func:`environment`) its text depends on, beyond
    :data:`SAME`."""

    name: str
    cells: tuple
    head: Optional[int] = None
    fails: bool = False
    depends: tuple = ()


class Quiet(str):
    """A cell run without being shown and without taking a cell number: setup that the page's text
    describes, or a wait for something the next shown cell depends on."""


# A session is one shell, its cells numbered from 1: its examples in order, and quiet cells between them
# (also allowed among an example's cells).
Step = Union[Example, Quiet]


def mlp(model: str = "model", opt: str = "opt", optimizer: str = "AdamW", rows: int = 256) -> str:
    """The cell that makes the examples' MLP (8.4 M parameters), its optimizer and a batch."""
    return (f"{model} = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), "
            f"torch.nn.Linear(4096, 1024))\n{opt} = torch.optim.{optimizer}({model}.parameters())\n"
            f"batch = torch.randn({rows}, 1024)")


STEP = "loss = model(batch).square().mean()\nloss.backward()\nopt.step()\nopt.zero_grad()"
SESSIONS: dict = {
    # README.md: a taste of each magic, one story
    "readme": (
        Example("readme-gpuinfo", ("import torch, numpy as np", "%gpuinfo"), head=5),
        Example("readme-ontorch", (
            "%%ontorch meta\nmodel = torch.nn.Linear(4096, 4096)\nids = torch.from_numpy(np.arange(4))",
            "model.weight.device, ids.device")),
        Example("readme-whereis", ("x = torch.randn(4, 4096)\nmodel(x)",), fails=True),
        Example("readme-cudatime", ("w = torch.randn(512, 512)", "%cudatime -r 20 w @ w")),
        Example("readme-gpumem", ("%gpumem --text", "big = torch.ones(2**26)", "%gpumem stop")),
        Example("readme-cudamem", (
            mlp("mlp", "mlp_opt"),
            "%%cudamem --predict cuda --capacity 24GiB\nloss = mlp(batch.cuda()).square().mean()\n"
            "loss.backward()\nmlp_opt.step()"), head=4),
    ),
    # README.md: the out-of-memory explanation, in a kernel of its own so that its list of holders is short
    "readme-oom": (
        Example("readme-oom", (
            "import torch\nmodel = torch.nn.Linear(1024, 1024)\nh = torch.randn(8192, 1024)",
            "distances = (h[:, None] - h[None]).norm(dim=-1)"), head=10, fails=True),
    ),
    # docs/gpuinfo.md
    "gpuinfo": (
        Example("gpuinfo-here", ("%gpuinfo",)),
        Example("gpuinfo-bad-index", ("%gpuinfo -i 3",), fails=True),
    ),
    # docs/ontorch.md
    "ontorch": (
        Quiet("import torch, numpy as np"),
        Example("ontorch-footer", ("%%ontorch meta\nw = torch.ones(4, 4)\na = torch.from_numpy(np.ones(3))\n"
                                   "b = torch.Tensor([1, 2])",)),
        Example("ontorch-by-design", ("%%ontorch meta\nrng = torch.get_rng_state()\nz = torch.zeros(2)",)),
        Example("ontorch-line", ("%ontorch meta --dtype float64", "torch.ones(2)", "%ontorch",
                                 "%ontorch --reset")),
        Example("ontorch-move", (
            "net = torch.nn.Linear(256, 256)\nnet_opt = torch.optim.Adam(net.parameters())\n"
            "net(torch.randn(2, 256)).sum().backward()\nnet_opt.step()",
            "%%ontorch meta --move net,net_opt --discard-data\nnet.weight.device")),
        Example("ontorch-errors", ("%%ontorch cuda:3\npass",), fails=True),
        Example("ontorch-typo", ("%%ontorch cdua:0\npass",), fails=True),
    ),
    # docs/cudatime.md
    "cudatime": (
        Quiet("import torch"),
        Example("cudatime-roofline", ("w = torch.randn(512, 512)",
                                      "%%cudatime -r 20 --peak 400G,20G\nw @ w")),
        Example("cudatime-threads", ("%%cudatime -r 10 --threads 1,2 --no-roofline\nw @ w",)),
    ),
    # docs/whereis.md
    "whereis": (
        Quiet("import torch"),
        Example("whereis-table", (
            "%%ontorch meta\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), "
            "torch.nn.Linear(16, 2))",
            "x = torch.randn(4, 8)\nbatch = (x, torch.arange(4))",
            "%whereis")),
        Example("whereis-module", ("%whereis model",)),
        Example("whereis-watch", ("%whereis --watch on", "h = torch.randn(4, 16)", "%whereis --watch off")),
        Example("whereis-mismatch", (
            "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.body = model\n\n    def forward(self, x):\n        return self.body(x).softmax(-1)",
            "net = Net()\nlogits = net(x)"), fails=True),
    ),
    # docs/out-of-memory.md and docs/gpumem.md: a training loop, a result shown, then a step too big
    "oom": (
        Example("oom-setup", (
            "import torch\n" + mlp(optimizer="Adam", rows=512)
            + "\ntotal_loss = 0\nfor step in range(4):\n    loss = model(batch).pow(2).mean()\n"
            "    loss.backward()\n    opt.step()\n    opt.zero_grad()\n    total_loss += loss",
            "torch.eye(512)")),
        Example("oom-cpu", (
            "class Distances(torch.nn.Module):\n    def forward(self, x):\n        h = model(x)\n"
            "        return (h[:, None, :] - h[None, :, :]).norm(dim=-1)\n\n"
            "Distances()(torch.randn(8192, 1024))",), fails=True),
        Example("gpumem-holders", ("%gpumem holders",)),
        Example("gpumem-free", ("%gpumem free",)),
    ),
    # docs/gpumem.md
    "gpumem": (
        Quiet("import torch"),
        Example("gpumem-text", ("%gpumem --text", "x = torch.ones(2**25)", "del x")),
        Example("gpumem-growth", ("hist = []",) + ("hist.append(torch.ones(2 ** 24))",) * 4),
    ),
    # docs/gpumem.md: records whose peaks are far apart, so that their order is the same in every run
    "gpumem-records": (
        Quiet("import torch"),
        Example("gpumem-records", ("%gpumem --text", "a = torch.ones(2**24)", "b = torch.ones(2**25)",
                                   "%gpumem stop", "records = %gpumem --records\nrecords")),
    ),
    # docs/clusters.md: two ipyparallel engines on this machine (started and stopped by the setup cells)
    "clusters": (
        Quiet("import time\nimport ipyparallel as ipp\ncluster = ipp.Cluster(n=2, log_level=40)\n"
        "rc = cluster.start_and_connect_sync()\nrc.wait_for_engines(2, timeout=60)"),
        Example("clusters-gpuinfo", ("%gpuinfo --cluster",)),
        Example("clusters-whereis", (
            "%px import torch; x = torch.ones(1000); model = torch.nn.Linear(64, 64)", "%whereis --cluster")),
        Example("clusters-cudatime", (
            "%px torch.set_num_threads(2)",
            "%%cudatime --cluster -n 10 -r 7 --no-roofline\ny = model(x[:64])"), depends=("cpus",)),
        Example("clusters-local", ("%ontorch local --cluster",)),
        Example("clusters-busy", (
            "%%px --noblock --targets 1\nimport time\ntime.sleep(12)",
            Quiet("while not rc.queue_status()[1]['queue']:\n    time.sleep(0.05)"),
            "%gpuinfo --cluster --no-processes")),
        Example("clusters-gpumem", ("%gpumem --cluster --text",)),
        # the busy engine's sleep has done its part: interrupted, not waited out (12 s of every run)
        Quiet("import signal\nrc.send_signal(signal.SIGINT, targets=1, block=True)\nrc.wait(timeout=30)"),
    ),
    # docs/cudamem.md
    "cudamem": (
        Quiet("import torch"),
        Example("cudamem-measured", (mlp(), f"%%cudamem --top 3\n{STEP}")),
        Example("cudamem-predicted", (
            "layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, "
            "batch_first=True)\nencoder = torch.nn.TransformerEncoder(layer, num_layers=6, "
            "enable_nested_tensor=False)\nencoder_opt = torch.optim.AdamW(encoder.parameters())\n"
            "tokens = torch.randn(8, 256, 512)",
            "%%cudamem --predict cuda --arch hopper --capacity 79.11GiB --top 4\nencoder.cuda()\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = encoder(tokens.cuda()).square().mean()\nloss.backward()\nencoder_opt.step()\n"
            "encoder_opt.zero_grad()")),
        Example("cudamem-fit", (
            "%%cudamem --fit batch --capacity 4GiB\nloss = model(batch.cuda()).square().mean()\n"
            "loss.backward()\nopt.step()",), head=12),
        Example("cudamem-cannot", ("%%cudamem --predict\nprint(model(batch).sum().item())",), fails=True),
    ),
}


# What a session leaves running, stopped whether its cells succeed or not.
TEARDOWN = {"clusters": "rc.close()\ncluster.stop_cluster_sync()"}


def examples() -> dict:
    """Every example by name, with the name of its session."""
    found = {}
    for session, steps in SESSIONS.items():
        for step in steps:
            if isinstance(step, Example):
                found[step.name] = (session, step)
    return found


def files() -> list:
    """The Markdown files that may show examples: the README and the reference pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(text: str) -> dict:
    """The example blocks of a Markdown text: {name: the block's text}."""
    return {name: body for name, body in MARK.findall(text)}


def written_env(text: str) -> Optional[dict]:
    """The machine a file's examples were written on (its ``examples-env`` comment), or None."""
    found = ENV_MARK.search(text)
    return json.loads(found.group(1)) if found else None


def environment() -> dict:
    """This machine, as far as the examples' text depends on it."""
    import IPython
    import torch

    from torchgpu_magic.timing.results import device_name

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return {"torch": torch.__version__, "ipython": IPython.version_info[0], "os": platform.system(),
            "gpu": gpu, "cpu": device_name(torch.device("cpu")), "cpus": cpus, "host": socket.gethostname()}


def differs(written: Optional[dict], here: dict, depends: tuple = ()) -> Optional[str]:
    """Why a run here cannot be compared with examples written on ``written`` (None when it can), for an
    example whose text also ``depends`` on those keys of the machine."""
    if written is None:
        return "the file has no examples-env comment: run python docs/examples.py --write"
    changed = [f"{key} {written.get(key)} there, {here.get(key)} here" for key in (*SAME, *depends)
               if written.get(key) != here.get(key)]
    return "the examples were written on another machine: " + "; ".join(changed) if changed else None


# Lines that come and go from run to run of the same cell: %%cudatime's verdicts on the samples it took.
VARYING_LINES = re.compile(r"^\s*([^!]*: )?(! (noisy|unreliable|the slowest sample|the result is under 10 x|"
                           r"not converged)|-r \d+: fixed sample count)"
                           r"|^\s*\(on the cpu, freed memory the C allocator keeps")
MASKS = (
    (re.compile(r"\b\d{4}-\d\d-\d\d\b"), "<date>"),
    (re.compile(r"\b\d{1,2}:\d\d:\d\d\b"), "<clock>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<address>"),
    (re.compile(r"\b(PID|pid)(\s+)\d+"), r"\1\2<pid>"),
    (re.compile(r"\b\d+ samples? x \d+ loops?\b"), "<samples> x <loops>"),
    (re.compile(r"\b\d+(\.\d+)?x( slower)?\b"), "<ratio>"),
    (re.compile(r"[-+]?\d[\d,]*(\.\d+)?\s?"
                r"(ns|µs|us|ms|s|min|h|[KMGTPE]?i?B|[kMGTPE]?FLOP/s|[kMGTPE]?B/s|%)(?![\w/])"), "<n>"),
    (re.compile(r"\bgave back (<n> on [\w:]+|nothing measurable)"), "gave back <measured>"),
)


def mask(text: str, env: dict) -> str:
    """``text`` with what varies between runs of the same example hidden, for comparing two runs:

    - durations, byte sizes, rates and percentages (a number with its unit: ``7.49 ms``, ``161 MiB``,
      ``35.9 GFLOP/s``, ``23.9 %``), ``N samples x M loops``, clock times, dates, hexadecimal addresses
      and PIDs become placeholders;
    - the machine's CPU model and host name (``env``'s) become ``<cpu>`` and ``<host>``;
    - ``%%cudatime``'s verdicts on its samples (noisy, unreliable, slowest / fastest, under 10 x an empty
      cell, not converged, an engine ``slower`` than the others) and the confidence interval of a fixed
      ``-r`` count are left out, as are speed ratios (``1.02x``) and whether the memory ``%gpumem free``
      measured coming back was measurable (and its note on the C allocator, said only when it was not);
    - runs of spaces count as one, and a table's rule of dashes as one dash, so a column widened by a
      longer figure does not count as a change (and :func:`same` compares across line breaks too).

    Everything else (words, names, shapes, dtypes, counts, the order of rows and lines) must match."""
    lines = []
    for line in _mask_pid_columns(text.splitlines()):
        if VARYING_LINES.match(line):
            continue
        for value, placeholder in (("cpu", "<cpu>"), ("host", "<host>")):
            if env.get(value):
                line = re.sub(rf"\b{re.escape(str(env[value]))}\b", placeholder, line)
        for pattern, placeholder in MASKS:
            line = pattern.sub(placeholder, line)
        line = re.sub(r"[ \t]+", " ", line).strip()
        if re.fullmatch(r"[ -]*--[ -]*", line):
            line = "-"
        lines.append(line)
    return "\n".join(lines).strip()


def same(written: str, run: str, written_env: dict, run_env: dict) -> bool:
    """Whether a block and a run of its example say the same, once both are masked and the line breaks
    set aside too: a table whose last column wraps (``%gpumem holders``) breaks its lines where the widths
    of the other columns leave room, and those follow the figures."""
    return mask(written, written_env).split() == mask(run, run_env).split()


def _mask_pid_columns(lines: list) -> list:
    """The numbers in a table's ``pid`` column (a header over a rule of dashes) as ``<pid>``."""
    out = list(lines)
    for i in range(len(out) - 1):
        header = re.search(r"\bpid\b", out[i])
        if header is None or not re.fullmatch(r"[ -]*-[ -]*", out[i + 1]):
            continue
        for rule in re.finditer(r"-+", out[i + 1]):
            if rule.start() < header.end() and header.start() < rule.end():
                start, end = rule.span()
                for j in range(i + 2, len(out)):
                    if not out[j].strip():
                        break
                    out[j] = out[j][:start] + re.sub(r"\d+", "<pid>", out[j][start:end]) + out[j][end:]
    return out


# ---- running -----------------------------------------------------------------------------------------
def _show(number: Optional[int], cell: str) -> str:
    """A cell as a terminal shows it: ``In [n]:`` and continuation prompts."""
    prompt = f"In [{number}]: "
    more = " " * (len(prompt) - 5) + "...: "
    return "\n".join((prompt if i == 0 else more) + line for i, line in enumerate(cell.splitlines()))


class _Terminal(io.StringIO):
    """What a cell writes, as a UTF-8 terminal takes it (the reports choose ✗ over x, µs over us, by the
    encoding of the stream they print to)."""

    encoding = "utf-8"


def _run_cell(shell: object, cell: str, shown: bool) -> tuple:
    """(what the cell printed, displayed or raised; whether it failed)."""
    out = _Terminal()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        result = shell.run_cell(cell, store_history=shown)
    text = "\n".join(line.rstrip() for line in out.getvalue().splitlines()).strip("\n")
    return text, not result.success


def _quiet(shell: object, cell: Quiet, where: str) -> None:
    text, failed = _run_cell(shell, cell, shown=False)
    if failed:
        raise RuntimeError(f"{where}: a quiet cell failed:\n{text}")


def _fresh(shell: object) -> None:
    """Start a session as a new kernel would: no names, and no earlier session's error still holding its
    frames' tensors (an out-of-memory example would otherwise list them as holders)."""
    import gc

    from torchgpu_magic.magics.shell import release_traceback

    shell.reset(new_session=True)
    release_traceback(shell)
    gc.collect()


def run(names: Optional[set] = None) -> dict:
    """Run the sessions holding ``names`` (all when None) in one fresh shell each; {name: block text}."""
    from IPython.core.interactiveshell import InteractiveShell

    # engines and workers started by a session import this tree's package, as this process does
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")
    wanted = {session for name, (session, _) in examples().items() if names is None or name in names}
    outputs = {}
    for session, steps in SESSIONS.items():
        if session not in wanted:
            continue
        _fresh(shell)
        shell.run_line_magic("load_ext", "torchgpu_magic")
        try:
            for step in steps:
                if isinstance(step, Quiet):
                    _quiet(shell, step, session)
                    continue
                shown = []
                for i, cell in enumerate(step.cells):
                    if isinstance(cell, Quiet):
                        _quiet(shell, cell, step.name)
                        continue
                    number = shell.execution_count
                    text, failed = _run_cell(shell, cell, shown=True)
                    last = i == len(step.cells) - 1
                    if failed != (last and step.fails):
                        raise RuntimeError(f"example {step.name}: cell {i + 1} "
                                           f"{'failed' if failed else 'did not fail'}:\n{text}")
                    if last and step.head is not None and len(text.splitlines()) > step.head:
                        text = "\n".join(text.splitlines()[:step.head] + ["…"])
                    shown.append(_show(number, cell) + ("\n" + text if text else ""))
                outputs[step.name] = "\n".join(shown) + "\n"
        finally:
            if session in TEARDOWN:
                _run_cell(shell, TEARDOWN[session], shown=False)
            shell.run_line_magic("unload_ext", "torchgpu_magic")
    _fresh(shell)
    return outputs


# ---- writing and checking ----------------------------------------------------------------------------
def write(outputs: dict, env: dict) -> list:
    """Put each output into its block, and the environment into each file with examples; the names
    rewritten. A block whose masked text did not change is left as it is (so that a rewrite does not churn
    every figure), unless the file's examples were written on another machine: then all of them are
    rewritten, so that a file's blocks and its examples-env comment always describe one run."""
    marker = f"<!-- examples-env: {json.dumps(env, ensure_ascii=False)} -->"
    rewritten: list = []
    for path in files():
        text = path.read_text(encoding="utf-8")
        old_env = written_env(text) or {}
        new_text, at, changed = "", 0, False
        for found in MARK.finditer(text):
            name, body = found.group(1), found.group(2)
            new = outputs.get(name)
            if new is None or (same(body, new, old_env, env) and old_env == env):
                continue
            new_text += text[at:found.start(2)] + new
            at, changed = found.end(2), True
            rewritten.append(name)
        new_text += text[at:]
        if changed or (MARK.search(text) and not ENV_MARK.search(text)):
            new_text = (ENV_MARK.sub(lambda _: marker, new_text) if ENV_MARK.search(new_text)
                        else new_text.rstrip("\n") + "\n\n" + marker + "\n")
        if new_text != text:
            path.write_text(new_text, encoding="utf-8")
    return rewritten


def compare(outputs: dict, env: dict) -> list:
    """(name, diff) for every block that does not match its run once masked."""
    problems = []
    for path in files():
        text = path.read_text(encoding="utf-8")
        written = written_env(text) or {}
        for name, body in blocks(text).items():
            if name not in outputs or differs(written, env, examples()[name][1].depends):
                continue
            if not same(body, outputs[name], written, env):
                want, got = mask(body, written), mask(outputs[name], env)
                diff = "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(),
                                                      f"{path.name} ({name})", "this run", lineterm=""))
                problems.append((name, diff))
    return problems


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks whose text changed")
    parser.add_argument("--only", metavar="NAME[,NAME...]", help="these examples' sessions only")
    parser.add_argument("--json", action="store_true",
                        help="print this machine and the outputs as JSON (for tests/test_docs.py)")
    args = parser.parse_args(argv)
    names = set(args.only.split(",")) if args.only else None
    unknown = sorted((names or set()) - set(examples()))
    if unknown:
        parser.error(f"no example named {', '.join(unknown)}")
    env = environment()
    outputs = run(names)
    if args.json:
        print(json.dumps({"env": env, "outputs": outputs}, ensure_ascii=False))
        return 0
    if args.write:
        rewritten = write(outputs, env)
        print(f"rewrote {len(rewritten)} example block(s): {', '.join(rewritten)}" if rewritten
              else "every example block matches this run")
        return 0
    problems = compare(outputs, env)
    for _, diff in problems:
        print(diff)
    print(f"{len(problems)} example block(s) differ from this run" if problems
          else "every example block matches this run")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
