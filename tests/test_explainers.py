"""magics/explainers.py: the user's cell first. A device-mismatch error, and an out-of-memory error,
shows its explanation and the user's failing line above the traceback, the user's own frames, and one
line per run of frames inside torch; %xmode Verbose shows every frame; errors passing through %%ontorch
lose the magic machinery's frames. Checked in terminal text (a real InteractiveShell, both IPython legs)
and in the error output of a real Jupyter kernel (nbclient)."""
from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from conftest import ROOT, run
from IPython.utils.capture import capture_output

SETUP = (
    "import torch\n"
    "model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to('meta')\n"
    "x = torch.ones(4, 8)\n"
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = torch.nn.Linear(8, 8).to('meta')\n"
    "    def forward(self, inp):\n"
    "        return self.fc(inp)\n"
    "net = Net()\n"
)
# A forward that runs out of memory for real on the cpu (the CPU allocator refuses 1 PiB), holding h.
OOM_SETUP = (
    "class Big(torch.nn.Module):\n"
    "    def forward(self, inp):\n"
    "        h = inp * 2\n"
    "        return torch.empty(2**50, dtype=torch.uint8)\n"
    "big = Big()\n"
)
OOM_RAISED = "return torch.empty(2**50, dtype=torch.uint8)"
OOM_ERROR = "RuntimeError: [enforce fail at alloc_cpu.cpp"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _shown(ip, code):
    """Run a failing cell; what the terminal shows (the traceback, and anything displayed after)."""
    with capture_output() as cap:
        result = ip.run_cell(code, store_history=True)
    assert result.error_in_exec is not None
    texts = [o.data.get("text/plain", "") for o in cap.outputs]
    return "\n".join([cap.stdout, *texts])


@pytest.fixture
def tip(ip):
    run(ip, SETUP)
    ip.run_line_magic("xmode", "Context")
    yield ip
    ip.run_line_magic("xmode", "Context")


def test_explanation_and_failing_line_come_first_and_torch_is_one_line(tip):
    text = _shown(tip, "logits = model(x)")
    lines = text.strip().splitlines()
    assert lines[0] == ("whereis: a device mismatch (meta, cpu): the tensors of one operation must be on one "
                        "device.")
    assert lines[1] == "On line 1: logits = model(x)"
    fix = next(i for i, line in enumerate(lines) if line.startswith("Fix: "))
    header = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    marker = next(i for i, line in enumerate(lines) if re.search(r"\d+ frames inside torch", line))
    last = lines.index("RuntimeError: Tensor on device meta is not on the expected device cpu!")
    assert fix < header < marker < last == len(lines) - 1
    assert "logits = model(x)" in "\n".join(lines[header:marker])  # the user's frame is shown
    assert "%xmode Verbose shows them" in lines[marker]
    assert len(lines) < 25, text  # was about 170 lines of torch's frames
    assert "site-packages" not in text
    assert text.count("whereis: a device mismatch") == 1  # not shown again after the cell


def test_frames_of_the_users_forward_stay_between_runs_of_torch(tip):
    text = _shown(tip, "y = net(x)")
    markers = [m.start() for m in re.finditer(r"\d+ frames? inside torch", text)]
    assert len(markers) == 2
    forward = text.index("return self.fc(inp)", text.index("Traceback"))
    assert markers[0] < forward < markers[1]


def test_xmode_verbose_shows_every_frame_and_minimal_only_the_error(tip):
    tip.run_line_magic("xmode", "Verbose")
    verbose = _shown(tip, "logits = model(x)")
    assert verbose.lstrip().startswith("whereis: a device mismatch")
    assert "frames inside torch" not in verbose and "site-packages/torch" in verbose
    tip.run_line_magic("xmode", "Minimal")
    minimal = _shown(tip, "logits = model(x)").strip().splitlines()
    assert minimal[0].startswith("whereis: a device mismatch")
    assert minimal[-1] == "RuntimeError: Tensor on device meta is not on the expected device cpu!"
    assert not any("Traceback" in line for line in minimal)


def test_out_of_memory_explanation_and_failing_line_come_first_and_torch_is_one_line(tip):
    run(tip, OOM_SETUP)
    text = _shown(tip, "y = big(x)")
    lines = text.strip().splitlines()
    assert lines[0].startswith("gpumem: out of memory on cpu: asked 1.00 PiB; ")
    assert lines[1:3] == ["On line 1: y = big(x)", f"  inside forward(), line 4: {OOM_RAISED}"]
    holders = lines.index("Who holds cpu memory, largest first:")
    todo = next(i for i, line in enumerate(lines) if line.startswith("What to do"))
    header = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    cell = next(i for i, line in enumerate(lines) if "y = big(x)" in line and "---->" in line)
    marker = next(i for i, line in enumerate(lines) if re.search(r"\d+ frames? inside torch", line))
    raised = next(i for i, line in enumerate(lines) if OOM_RAISED in line and "---->" in line)
    assert 2 < holders < todo < header < cell < marker < raised < len(lines) - 1
    assert lines[-1].startswith(OOM_ERROR)  # the user's error last, and nothing shown after the cell
    assert re.search(r"^\s+forward: h\s+128 B\s", text, re.M)  # the frame's local, by function and name
    assert "%xmode Verbose shows them" in lines[marker] and "site-packages" not in text
    assert text.count("gpumem: out of memory") == 1


def test_out_of_memory_under_xmode_verbose_and_minimal(tip):
    run(tip, OOM_SETUP)
    tip.run_line_magic("xmode", "Verbose")
    verbose = _shown(tip, "y = big(x)").strip()
    assert verbose.startswith("gpumem: out of memory on cpu") and "On line 1: y = big(x)" in verbose
    assert "frames inside torch" not in verbose and "site-packages/torch" in verbose
    assert verbose.index("What to do") < verbose.index("Traceback") < verbose.index(OOM_ERROR)
    assert verbose.count("gpumem: out of memory") == 1
    tip.run_line_magic("xmode", "Minimal")
    minimal = _shown(tip, "y = big(x)").strip().splitlines()
    assert minimal[0].startswith("gpumem: out of memory on cpu") and minimal[1] == "On line 1: y = big(x)"
    assert minimal[-1].startswith(OOM_ERROR) and not any("Traceback" in line for line in minimal)


@pytest.mark.parametrize("cell, first, last", [
    ("logits = model(x)", "whereis: a device mismatch", "RuntimeError: Tensor on device meta"),
    ("y = big(x)", "gpumem: out of memory on cpu", OOM_ERROR)])
def test_xmode_plain_explains_first_and_folds_torch_too(tip, cell, first, last):
    """%xmode Plain (Python's own layout, whose header only a traceback with frames has): the
    explanation, then 'Traceback (most recent call last):', the user's frames and torch's as one line."""
    run(tip, OOM_SETUP)
    tip.run_line_magic("xmode", "Plain")
    lines = _shown(tip, cell).strip().splitlines()
    assert lines[0].startswith(first) and lines[-1].startswith(last)
    header = lines.index("Traceback (most recent call last):")
    marker = next(i for i, line in enumerate(lines) if re.search(r"\d+ frames? inside torch", line))
    assert header < marker and any(cell in line for line in lines[header:marker])
    assert "site-packages" not in "\n".join(lines) and "\n".join(lines).count(first) == 1


@pytest.mark.parametrize("mode", ["Context", "Plain", "Verbose", "Minimal"])
def test_ipythons_remembered_traceback_is_the_whole_one(tip, mode):
    """What %debug and call_pdb open (InteractiveTB.tb) is the error's whole traceback after an explained
    one, as after IPython's own, not the partial ones formatted to fold torch's frames."""
    run(tip, OOM_SETUP)
    tip.run_line_magic("xmode", mode)
    for cell in ("logits = model(x)", "y = big(x)"):
        _shown(tip, cell)
        assert tip.InteractiveTB.tb is sys.last_traceback is sys.last_value.__traceback__


def test_a_traceback_that_cannot_be_folded_is_explained_after_the_cell(tip, monkeypatch):
    """When folding the frames fails, IPython's own traceback is shown, and the explanation comes after
    the cell, once."""
    from torchgpu_magic.magics import explainers as tracebacks

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(tracebacks, "structured", broken)
    run(tip, OOM_SETUP)
    for cell, first in (("logits = model(x)", "whereis: a device mismatch"),
                        ("y = big(x)", "gpumem: out of memory on cpu")):
        with capture_output() as cap:
            tip.run_cell(cell, store_history=True)
        assert "site-packages/torch" in cap.stdout and first not in cap.stdout  # IPython's own, whole
        (shown,) = [o.data["text/plain"] for o in cap.outputs]
        assert shown.startswith(first) and shown.count(first) == 1


def test_other_errors_keep_ipythons_traceback(tip):
    text = _shown(tip, "torch.ones(2) @ torch.ones(3)")
    assert "whereis" not in text and "frames inside" not in text
    assert "Traceback (most recent call last)" in text


def test_an_error_inside_a_magic_cell_loses_the_machinery_not_torch(tip):
    text = _shown(tip, "%%ontorch cpu\nz = 1\nraise ValueError('boom')")
    assert re.search(r"\d+ frames inside IPython.*torchgpu_magic", text), text
    assert "raise ValueError('boom')" in text and "decorator/__init__.py" not in text
    assert "interactiveshell.py" not in text and text.strip().endswith("ValueError: boom")


# ---- inside every cell magic, and in a function called from one ------------------------------------
CELL_MAGICS = ["%%ontorch cpu", "%%cudatime -n 1 -r 3 --warmup 0 --no-roofline", "%%cudamem"]
APPLY = "def apply(a):\n    return model(a)\n"
# (the cell's last line, the explanation's headline, the failing line, the line inside, its function)
IN_A_MAGIC = [
    ("out = model(h)", "whereis: a device mismatch", "On line 3: out = model(h)", "", ""),
    ("out = apply(h)", "whereis: a device mismatch", "On line 3: out = apply(h)", "return model(a)", "apply"),
    ("y = torch.empty(2**50, dtype=torch.uint8)", "gpumem: out of memory on cpu",
     "On line 3: y = torch.empty(2**50, dtype=torch.uint8)", "", ""),
    ("y = big(h)", "gpumem: out of memory on cpu", "On line 3: y = big(h)", OOM_RAISED, "forward"),
]


def _groups(lines: list) -> dict:
    """A mismatch diagnosis's culprits by group title ('used there', 'inside', 'elsewhere'): the names."""
    groups: dict = {}
    title = None
    for line in lines:
        if line.startswith("  ") and not line.startswith("    "):
            title = line.strip().split(":")[0].split("(")[0].strip()
            groups[title] = []
        elif line.startswith("    ") and title is not None:
            groups[title].append(line.split()[0])
    return groups


@pytest.mark.parametrize("earlier", [None, "1/0", "logits = model(x)"],
                         ids=["first", "after-an-error", "after-a-mismatch"])
@pytest.mark.parametrize("last, headline, failing, inner, function", IN_A_MAGIC,
                         ids=["mismatch", "mismatch-in-a-function", "oom", "oom-in-a-forward"])
@pytest.mark.parametrize("magic", CELL_MAGICS, ids=["ontorch", "cudatime", "cudamem"])
def test_explained_inside_a_cell_magic_from_the_users_line(tip, magic, last, headline, failing, inner,
                                                           function, earlier):
    """The explanation inside %%ontorch, %%cudatime and %%cudamem quotes the user's line, numbered as the
    cell shows it, not IPython's get_ipython().run_cell_magic(...) call; the 'used there' names are the
    line's and are not repeated under 'elsewhere in the cell'; the traceback starts at the cell's own
    frame. The same after an earlier failed cell."""
    run(tip, OOM_SETUP)
    run(tip, APPLY)
    if earlier is not None:
        _shown(tip, earlier)
    text = _shown(tip, f"{magic}\nh = x * 2\n{last}")
    lines = text.strip().splitlines()
    assert lines[0].startswith(headline) and text.count(headline) == 1, text
    assert lines[1] == failing, text
    explanation = lines[:next(i for i, line in enumerate(lines) if "Traceback (most recent call" in line)]
    if inner:
        assert any(line.startswith(f"  inside {function}(), line ") and line.rstrip(":").endswith(inner)
                   for line in explanation), text
    assert "run_cell_magic" not in text, text
    cell_frame = next(i for i, line in enumerate(lines) if "---->" in line and last in line)
    assert re.search(r"\d+ frames? inside IPython", "\n".join(lines[:cell_frame])), text
    if headline.startswith("whereis"):
        fix = next(i for i, line in enumerate(lines) if line.startswith("Fix: "))
        groups = _groups(lines[1:fix])
        assert "h" in groups["used there"], text
        named = [name for names in groups.values() for name in names]
        assert "elsewhere in the cell" not in groups or not set(groups["elsewhere in the cell"]) & (
            set(named) - set(groups["elsewhere in the cell"])), text
        assert len(named) == len(set(named)), text


def test_unload_puts_showtraceback_back(ip):
    from torchgpu_magic import unload_ipython_extension

    assert "showtraceback" in vars(ip)
    unload_ipython_extension(ip)
    assert "showtraceback" not in vars(ip)
    run(ip, "%load_ext torchgpu_magic")


def test_the_out_of_memory_explanation_as_html_begins_with_the_failing_line(tip):
    """The report as a notebook shows it when it comes after the cell (another extension showed the
    error): its headline, the failing line, then the holders' table and the advice."""
    from torchgpu_magic.explain import outofmemory as explain
    from torchgpu_magic.magics.explainers import is_cell_file

    run(tip, OOM_SETUP)
    with capture_output():
        error = tip.run_cell("y = big(x)", store_history=True).error_in_exec
    report = explain.explain(error, tip.user_ns, (), "y = big(x)", lambda f: is_cell_file(tip, f))
    markup = report._repr_html_()
    parts = ("gpumem: out of memory on cpu", "On line 1: y = big(x)", "inside forward(), line 4", "<table",
             "forward: h", "What to do")
    order = [markup.index(part) for part in parts]
    assert order == sorted(order), markup


def test_the_diagnosis_as_html_keeps_its_columns(tip):
    from torchgpu_magic.explain import mismatch
    from torchgpu_magic.magics.explainers import is_cell_file

    with capture_output():
        error = tip.run_cell("logits = model(x)", store_history=True).error_in_exec
    diagnosis = mismatch.diagnose(error, "logits = model(x)", tip.user_ns, lambda f: is_cell_file(tip, f))
    markup = diagnosis._repr_html_()
    assert markup.startswith("<pre") and "    model  meta" in markup


# ---- in a real Jupyter kernel ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel_cells():
    """One notebook run in a real kernel: a device-mismatch error (cell 2), then an out-of-memory error
    (cell 4), then each inside a cell magic (cells 5 and 6); its executed cells."""
    pytest.importorskip("nbclient", reason="needs nbclient and nbformat (the IPython 7 leg has neither)")
    import nbformat
    from nbclient import NotebookClient

    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s)
                for s in ("%load_ext torchgpu_magic", SETUP, "y = net(x)", OOM_SETUP, "y = big(x)",
                          "%%ontorch cpu\nh = x * 2\ny = net(h)",
                          "%%cudatime -n 1 -r 3 --warmup 0 --no-roofline\nh = x * 2\ny = big(h)")]
    with runner.this_python_kernel() as kernel:
        client = NotebookClient(nb, kernel_name=kernel, timeout=180, allow_errors=True,
                                resources={"metadata": {"path": "."}})
        client.execute()
    return nb.cells


@pytest.mark.notebook
def test_traceback_order_in_a_kernels_error_output(kernel_cells):
    outputs = kernel_cells[2].outputs
    (error,) = [o for o in outputs if o.output_type == "error"]
    assert not [o for o in outputs if o.output_type == "display_data"]  # explained once, above
    frames = [ANSI.sub("", part) for part in error["traceback"]]
    text = "\n".join(frames)
    assert frames[0].startswith("whereis: a device mismatch (meta, cpu)")
    assert "On line 1: y = net(x)" in frames[0] and "Fix: " in frames[0]
    assert re.search(r"\d+ frames inside torch", text) and "return self.fc(inp)" in text
    assert frames[-1].startswith("RuntimeError: Tensor on device meta")
    assert len(text.splitlines()) < 40, text


@pytest.mark.notebook
def test_out_of_memory_traceback_order_in_a_kernels_error_output(kernel_cells):
    outputs = kernel_cells[4].outputs
    (error,) = [o for o in outputs if o.output_type == "error"]
    assert not [o for o in outputs if o.output_type in ("display_data", "stream")]  # explained once, above
    frames = [ANSI.sub("", part) for part in error["traceback"]]
    text = "\n".join(frames)
    assert frames[0].startswith("gpumem: out of memory on cpu: asked 1.00 PiB")
    assert "On line 1: y = big(x)" in frames[0] and "Who holds cpu memory" in frames[0]
    assert re.search(r"^\s+forward: h\s+128 B\s", frames[0], re.M)
    marker = re.search(r"\d+ frames? inside torch", text)
    assert marker and text.index("y = big(x)", len(frames[0])) < marker.start() < text.index(OOM_RAISED,
                                                                                           len(frames[0]))
    assert frames[-1].startswith(OOM_ERROR)
    assert "site-packages" not in text and len(text.splitlines()) < 50, text


@pytest.mark.notebook
@pytest.mark.parametrize("index, headline, failing, inner", [
    (5, "whereis: a device mismatch (meta, cpu)", "On line 3: y = net(h)", "inside forward(), line 9"),
    (6, "gpumem: out of memory on cpu", "On line 3: y = big(h)", "inside forward(), line 4")])
def test_explained_inside_a_cell_magic_in_a_kernel(kernel_cells, index, headline, failing, inner):
    """In a real kernel too, inside %%ontorch and %%cudatime, the explanation quotes the cell's line."""
    (error,) = [o for o in kernel_cells[index].outputs if o.output_type == "error"]
    frames = [ANSI.sub("", part) for part in error["traceback"]]
    lines = frames[0].splitlines()
    assert lines[0].startswith(headline) and lines[1] == failing, frames[0]
    assert any(line.startswith(f"  {inner}") for line in lines), frames[0]
    text = "\n".join(frames)
    number = kernel_cells[index].execution_count
    assert "run_cell_magic" not in text
    assert f"Cell In[{number}], line 3" in text or f"<ipython-input-{number}-" in text, text  # IPython 9, 7
