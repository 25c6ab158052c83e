"""%whereis through a real InteractiveShell: tables, NAME reports, --watch, --repr, the diagnosis."""
from __future__ import annotations

import gc
import re

import pytest
from conftest import run
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

SETUP = (
    "import torch\nimport torch.nn.functional as F\n"
    "model = torch.nn.Linear(3, 2).to('meta')\n"
    "x = torch.ones(4, 3)\n"
    "a = torch.ones(3)\nb = torch.ones(3, device='meta')\n"
)


def _texts(captured) -> list:
    return [o.data.get("text/plain", "") for o in captured.outputs]


def _cell(ip, code):
    with capture_output() as captured:
        ip.run_cell(code)
    return captured


def _explained(captured) -> list:
    """The explanations a failing cell showed: above its traceback (stdout, up to IPython's line of
    dashes), and any displayed after the cell (when another handler showed the traceback)."""
    found = []
    head = captured.stdout.split("-" * 20)[0].strip()
    if head.startswith("whereis:"):
        found.append(head)
    return found + [t for t in _texts(captured) if t.startswith("whereis:")]


def test_table_through_the_magic(ip):
    run(ip, SETUP + "batch = [x, torch.zeros(2, dtype=torch.int64)]\n")
    out = _cell(ip, "%whereis")
    text = "\n".join(_texts(out))
    assert "cpu: 4 objects" in text and "batch[1]" in text and "same tensor as x" in text
    assert "meta: 2 objects" in text and "model" in text
    assert "text/html" in out.outputs[0].data
    report = ip.run_line_magic("whereis", "-o")
    assert {r.name for r in report.rows} >= {"x", "a", "b", "model", "batch[0]", "batch[1]"}


def test_an_object_of_an_unhashable_metaclass_is_passed_over(ip):
    """A class whose metaclass defines __eq__ without __hash__ (some ORMs and config libraries) makes its
    instances' type unhashable: the namespace walk, which caches per type, must pass it over, not fail."""
    run(ip, SETUP + "class Meta(type):\n    __eq__ = lambda cls, other: cls is other\n    __hash__ = None\n"
            "class Odd(metaclass=Meta):\n    pass\nodd = Odd()\n")
    report = ip.run_line_magic("whereis", "-o")
    assert {"x", "model"} <= {r.name for r in report.rows} and "odd" not in {r.name for r in report.rows}


def test_out_cache_detected(ip):
    run(ip, "import torch\nkeep = torch.ones(3)")
    ip.run_cell("torch.zeros(256)")  # shown as the cell's result: only Out keeps it
    ip.run_cell("keep")
    report = ip.run_line_magic("whereis", "-o")
    only = [r for r in report.rows if r.note == "only in Out"]
    assert len(only) == 1 and only[0].nbytes == 1024
    assert report.out_only_bytes == 1024
    assert "%reset -f out" in report.to_text()


def test_whereis_names(ip):
    run(ip, SETUP + "opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\nd = {'w': x}\n")
    texts = _texts(_cell(ip, "%whereis x model opt d['w']"))
    assert len(texts) == 4
    assert texts[0].startswith("x ") and "(4, 3)" in texts[0]
    assert texts[1].startswith("model: Linear") and "meta have no data" in texts[1]
    assert texts[2].startswith("opt: SGD")
    with pytest.raises(UsageError, match=r"name 'modle' is not defined; did you mean model\?"):
        ip.run_line_magic("whereis", "modle")
    with pytest.raises(UsageError, match="not a name"):
        ip.run_line_magic("whereis", "model.cuda()")
    with pytest.raises(UsageError, match="invalid choice"):
        ip.run_line_magic("whereis", "--watch maybe")
    with pytest.raises(UsageError, match="take no NAME"):
        ip.run_line_magic("whereis", "x --watch on")


def test_split_model_flagged_through_the_magic(ip):
    run(ip, "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
            "net[1].to('meta')")
    text = "\n".join(_texts(_cell(ip, "%whereis net")))
    assert "net is split across cpu, meta" in text


# ---- the diagnosis ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("code, names, fix", [
    ("c = a + b", ["a", "b"], "a = a.to(b.device)"),
    ("y = model(x)", ["model", "x"], "x = x.to(next(model.parameters()).device)"),
    ("m = torch.ones(3, 3)\nc = m @ b", ["m", "b"], "m = m.to(b.device)"),
    ("w = torch.ones(2, 3, device='meta')\ny = F.linear(x, w, torch.ones(2, device='meta'))", ["x", "w"],
     "x = x.to(w.device)"),
])
def test_diagnosis_on_real_errors(ip, code, names, fix):
    run(ip, SETUP)
    out = _cell(ip, code)
    assert "Traceback" in out.stdout and "RuntimeError" in out.stdout
    texts = _explained(out)
    assert len(texts) == 1, texts
    text = texts[0]
    assert text.startswith("whereis: a device mismatch")
    used = text.split("used there:")[1].split("elsewhere")[0]
    for name in names:
        assert re.search(rf"^\s+{re.escape(name)}\s", used, re.M), (name, text)
    assert "Fix: " + fix in text


def test_diagnosis_in_a_function_defined_in_the_cell(ip):
    """The user's line and objects first, the callee's line in its own terms second; the fix goes on
    the user's line."""
    run(ip, SETUP)
    text = _explained(_cell(ip, "def step(inp):\n    return model(inp)\nstep(x)"))[0]
    assert "On line 3: step(x)" in text and "inside step(), line 2: return model(inp)" in text
    assert re.search(r"used there:\n\s+x\s+cpu", text)
    assert "Fix: x = x.to(next(model.parameters()).device)" in text and "inp = inp" not in text


NET = (
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = torch.nn.Linear(3, 2)\n"
    "    def forward(self, inp):\n"
    "        return self.fc(inp)\n"
)


@pytest.mark.parametrize("code, used, fix", [
    ("batch = {'inp': torch.ones(2, 3)}\ny = net(**batch)", ["net", "batch['inp']"],
     "batch = {k: v.to(next(net.parameters()).device) for k, v in batch.items()}"),
    ("inputs = [torch.ones(2, 3), torch.ones(1)]\ny = net(inputs[0])", ["net", "inputs[0]"],
     "inputs = [t.to(next(net.parameters()).device) for t in inputs]"),
    ("pair = (x, (torch.ones(1), x))\ny = net(pair[0])", ["net", "pair[0]", "pair[1][0]"],
     "pair = tuple(t.to(next(net.parameters()).device) for t in pair)"),
    ("y = net(x)", ["net", "x"], "x = x.to(next(net.parameters()).device)"),
])
def test_diagnosis_inside_forward_names_the_users_objects(ip, code, used, fix):
    run(ip, SETUP + NET + "net = Net().to('meta')\n")
    text = _explained(_cell(ip, code))[0]
    mine = text.split("used there:")[1].split("inside forward()")[0]
    for name in used:
        assert re.search(rf"^\s+{re.escape(name)}\s", mine, re.M), (name, text)
    inside = re.split(r"inside forward\(\), line \d+: return self\.fc\(inp\)", text)[1]
    assert re.search(r"^\s+self\.fc\s+meta", inside, re.M) and re.search(r"^\s+inp\s+cpu", inside, re.M)
    assert "Fix: " + fix in text and "inp = inp" not in text and "self" not in text.split("Fix:")[1]


def test_diagnosis_of_a_training_step_that_names_an_optimizer(ip):
    """The optimizer on the failing line used to kill the diagnosis with an AttributeError."""
    run(ip, SETUP + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    text = _explained(_cell(ip, "opt.zero_grad(); loss = model(x).sum(); loss.backward(); opt.step()"))[0]
    assert "could not explain" not in text
    assert re.search(r"^\s+opt\s+meta\s+SGD \(optimizer\)", text, re.M)
    assert "Fix: x = x.to(next(model.parameters()).device)" in text


@pytest.mark.parametrize("code, devices", [
    ("lstm = torch.nn.LSTM(3, 4).to('meta')\nout, _ = lstm(torch.ones(2, 1, 3))", "(cpu, meta)"),
    ("gru = torch.nn.GRU(3, 4)\nout, _ = gru(torch.ones(2, 1, 3), torch.zeros(1, 1, 4, device='meta'))",
     "(cpu, meta)"),
    ("q = torch.ones(1, 2, 4, 8)\nk = torch.ones(1, 2, 4, 8, device='meta')\n"
     "o = F.scaled_dot_product_attention(q, k, k)", "(cpu, meta)"),
    ("t = torch.zeros(5)\nt.index_add_(0, torch.tensor([0, 1], device='meta'), torch.ones(2, device='meta'))",
     "(cpu, meta"),
])
def test_diagnosis_of_rnn_attention_and_index_errors(ip, code, devices):
    run(ip, SETUP)
    with capture_output() as captured:
        failed = ip.run_cell(code).error_in_exec is not None
    texts = _explained(captured)
    if not failed:  # torch 2.11 takes a meta index and source into a cpu index_add_ without a word
        assert "index_add_" in code and texts == [], captured.stdout[-3000:]
        return
    assert len(texts) == 1, captured.stdout[-3000:]  # the error as this torch words it
    assert texts[0].startswith(f"whereis: a device mismatch {devices}") and "Fix: " in texts[0]


def test_traceback_of_other_errors_unchanged(ip):
    """Only the errors it explains get the extension's traceback (tests/test_explainers.py); any other
    error in an ordinary cell shows exactly IPython's."""
    import torchgpu_magic

    run(ip, SETUP)
    code = "m = torch.ones(2, 3)\nc = m @ m"
    with_ext = _cell(ip, code)
    torchgpu_magic.unload_ipython_extension(ip)
    try:
        without = _cell(ip, code)
    finally:
        torchgpu_magic.load_ipython_extension(ip)
    assert with_ext.outputs == without.outputs == []
    strip = re.compile(r"In\[\d+\]|<ipython-input-\d+-\w+>")
    assert strip.sub("", with_ext.stdout) == strip.sub("", without.stdout)
    assert "site-packages" in with_ext.stdout or "mat1 and mat2" in with_ext.stdout


def test_nothing_for_other_errors(ip):
    run(ip, SETUP)
    out = _cell(ip, "raise ValueError('Expected all tensors to be on the same device')")
    assert out.outputs == [] and "ValueError" in out.stdout
    out = _cell(ip, "torch.ones(2, 3) @ torch.ones(4, 5)")
    assert out.outputs == [] and "RuntimeError" in out.stdout
    assert _cell(ip, "c = a + a").outputs == []


def test_coexists_with_a_custom_exception_handler(ip):
    import torchgpu_magic

    seen = []

    def handler(shell, etype, value, tb, tb_offset=None):
        seen.append(etype)
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)

    torchgpu_magic.unload_ipython_extension(ip)
    ip.set_custom_exc((RuntimeError,), handler)
    custom = (ip.CustomTB, ip.custom_exceptions)
    try:
        torchgpu_magic.load_ipython_extension(ip)
        run(ip, SETUP)
        out = _cell(ip, "c = a + b")
        assert seen == [RuntimeError]
        # the handler showed the traceback through the shell: explained above it, and once
        assert "RuntimeError" in out.stdout and len(_explained(out)) == 1
        assert (ip.CustomTB, ip.custom_exceptions) == custom
        torchgpu_magic.unload_ipython_extension(ip)
        assert (ip.CustomTB, ip.custom_exceptions) == custom
    finally:
        ip.set_custom_exc((), None)
        torchgpu_magic.load_ipython_extension(ip)


def test_reload_leaves_one_handler(ip):
    def ours():
        return [cb for cb in ip.events.callbacks["post_run_cell"]
                if getattr(cb, "__name__", "") in ("after_cell", "_watch_cell")]

    ip.run_line_magic("whereis", "--watch on")
    for _ in range(5):
        ip.run_line_magic("reload_ext", "torchgpu_magic")
    assert [cb.__name__ for cb in ours()] == ["after_cell"]
    ip.run_line_magic("whereis", "--watch on")
    ip.run_line_magic("whereis", "--watch on")
    assert sorted(cb.__name__ for cb in ours()) == ["_watch_cell", "after_cell"]


# ---- --watch ----------------------------------------------------------------------------------------------


def test_watch_lines(ip):
    run(ip, "import torch\nm = torch.nn.Linear(2, 2)\nkeep = torch.ones(1)")
    ip.run_line_magic("whereis", "--watch on")
    out = _cell(ip, "t = torch.ones(2, 3)\nm.to('meta')\nbatch = [torch.ones(1)]")
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("whereis: ")
    assert "new t cpu float32 (2, 3)" in lines[0] and "keep" not in lines[0]
    assert re.search(r"moved m cpu(→|->)meta", lines[0]) and "new batch[0] cpu" in lines[0]
    assert _cell(ip, "n = 1 + 1").stdout == ""
    assert "changed t" in _cell(ip, "t = t.double()").stdout
    ip.run_line_magic("whereis", "--watch off")
    assert _cell(ip, "u = torch.ones(1)").stdout == ""


# ---- --repr -----------------------------------------------------------------------------------------------


def test_repr_on_off_restores_printers(ip):
    import torch

    fmt = ip.display_formatter
    t, m = torch.ones(2), torch.nn.Linear(1, 2)
    plain_before = fmt.format(t)[0]
    assert "text/html" not in plain_before
    ip.run_line_magic("whereis", "--repr on")
    data = fmt.format(m)[0]
    assert data["text/plain"].splitlines()[0] in ("Linear · cpu · float32 · 4 params · 16 B",
                                                  "Linear | cpu | float32 | 4 params | 16 B")
    assert "Linear(in_features=1" in data["text/plain"]
    assert "4 params" in data["text/html"] and "<pre>" in data["text/html"]
    assert fmt.format(t)[0]["text/plain"].endswith(plain_before["text/plain"])
    ip.run_line_magic("whereis", "--repr on")  # idempotent
    ip.run_line_magic("whereis", "--repr off")
    assert fmt.format(t)[0] == plain_before
    assert torch.Tensor not in fmt.formatters["text/plain"].type_printers


def test_repr_keeps_a_printer_registered_before(ip):
    import torch

    plain = ip.display_formatter.formatters["text/plain"]

    def custom(obj, p, cycle):
        p.text("CUSTOM")

    plain.for_type(torch.Tensor, custom)
    try:
        ip.run_line_magic("whereis", "--repr on")
        text = ip.display_formatter.format(torch.ones(1))[0]["text/plain"]
        assert text.splitlines()[1:] == ["CUSTOM"] and "float32" in text.splitlines()[0]
        import torchgpu_magic

        torchgpu_magic.unload_ipython_extension(ip)  # unload restores it too
        assert plain.type_printers[torch.Tensor] is custom
        torchgpu_magic.load_ipython_extension(ip)
    finally:
        plain.type_printers.pop(torch.Tensor, None)


# ---- no references kept -----------------------------------------------------------------------------------


def test_no_reference_kept(ip):
    ip.run_line_magic("whereis", "--watch on")
    ip.run_line_magic("whereis", "--repr on")
    run(ip, SETUP + "big = torch.ones(1000)\nimport weakref\nref = weakref.ref(big)")
    _cell(ip, "%whereis")
    _cell(ip, "%whereis big model")
    # A diagnosis that names `big` (IPython itself keeps the frames of a failing operation alive, so
    # `big` is used elsewhere in the cell, not by the operation that fails).
    assert "big" in _explained(_cell(ip, "s = big.sum()\nc = a + b"))[0]
    assert "float32" in ip.display_formatter.format(ip.user_ns["big"])[0]["text/plain"]  # --repr printer
    ref = ip.user_ns["ref"]
    assert ref() is not None
    ip.user_ns.pop("big")
    gc.collect()
    assert ref() is None, [k for k, v in ip.user_ns.items() if v is ref()]


# ---- on a real GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_model_table_and_dataparallel(ip):
    run(ip, "import torch\nnet = torch.nn.Linear(8, 8).cuda()\n"
            "dp = torch.nn.DataParallel(net, device_ids=[0])")
    text = "\n".join(_texts(_cell(ip, "%whereis")))
    assert "cuda:0:" in text and "net" in text
    text = "\n".join(_texts(_cell(ip, "%whereis dp")))
    assert "DataParallel wrapper: replicates .module onto cuda:0 at each forward, " in text
    assert "outputs gathered on cuda:0" in text


@pytest.mark.gpu
def test_gpu_diagnosis_on_real_cuda_cpu_mismatch(ip):
    run(ip, "import torch\nmodel = torch.nn.Linear(3, 2).cuda()\nx = torch.ones(4, 3)")
    text = _explained(_cell(ip, "y = model(x)"))[0]
    assert "cuda:0" in text and "x = x.to(next(model.parameters()).device)" in text


def test_big_namespace_options_through_the_magic(ip):
    run(ip, "import torch\nfor i in range(300):\n    globals()[f't{i}'] = torch.ones(i + 1)\n"
            "m = torch.ones(2, device='meta')")
    text = "\n".join(_texts(_cell(ip, "%whereis")))
    assert "... and 200 more" in text and "meta: 1 object" in text
    text = "\n".join(_texts(_cell(ip, "%whereis --device cpu --sort bytes --top 3")))
    assert "meta" not in text and "t299" in text and "t296 " not in text and "... and 297 more" in text
    assert "more" not in "\n".join(_texts(_cell(ip, "%whereis --top 0")))
    report = ip.run_line_magic("whereis", "-o --device META --sort name")
    assert [r.name for r in report.rows] == ["m"]
    for bad, match in [("--top -1", "count of rows"),
                       ("--device 'cuda 0'", "--device: unknown device 'cuda 0'"),
                       ("m --top 3", "without NAME"), ("--sort size", "invalid choice")]:
        with pytest.raises(UsageError, match=match):
            ip.run_line_magic("whereis", bad)


def test_gradients_and_user_objects_through_the_magic(ip):
    run(ip, "import torch, types\nmodel = torch.nn.Linear(4, 4)\nmodel(torch.ones(1, 4)).sum().backward()\n"
            "class Trainer:\n    def __init__(self, m):\n        self.m = m\n"
            "        self.hist = [[torch.ones(2)]]\n"
            "trainer = Trainer(model)\ncfg = types.SimpleNamespace(w=torch.ones(3))")
    text = "\n".join(_texts(_cell(ip, "%whereis")))
    assert "of which gradients 80 B" in text
    assert "trainer.hist[0][0]" in text and "cfg.w" in text and "trainer.m " not in text


def test_every_report_shows_its_text_in_the_shells_plain_text_formatter(ip):
    """Terminals, VS Code's text view and static exports show only text/plain: no report may fall back
    to a dataclass-generated repr (ModuleReport(name=..., rows=[ModuleRow(...)])), on either IPython leg."""
    run(ip, SETUP + "opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n")
    ns = ip.user_ns
    from torchgpu_magic.explain import mismatch

    error = RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                         "cpu and meta!")
    diagnosis = mismatch.diagnose(error, "c = a + b", ns, lambda filename: False)
    reports = [ip.run_line_magic("whereis", f"-o {name}") for name in ("x", "model", "opt")]
    reports += [ip.run_line_magic("whereis", "-o"), diagnosis]
    plain = ip.display_formatter.formatters["text/plain"]
    for report in reports:
        assert plain(report) == report.to_text(), type(report).__name__
        assert not re.match(r"\w+\(", plain(report))
    shown = _texts(_cell(ip, "%whereis model opt"))
    assert shown[0].startswith("model: Linear") and shown[1].startswith("opt: SGD")


@pytest.mark.notebook
def test_training_notebook_diagnoses_each_forgotten_move():
    """notebooks/training.ipynb in a real kernel: each cell that forgets a .to(device) gets the diagnosis
    with the fix on the user's line; the right loop shows the model's gradients in %whereis."""
    import importlib.util

    pytest.importorskip("nbclient")  # not on the IPython 7 leg

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    nb = runner.execute(ROOT / "notebooks" / "training.ipynb", timeout=300)
    failing = [c for c in nb.cells if "raises-exception" in c.get("metadata", {}).get("tags", [])]
    fixes = [
        ["Fix: xb = xb.to(next(model.parameters()).device)",
         "Fix: yb = yb.to(next(model.parameters()).device)",
         "On line 2: loss = train_step(model, opt, xb, yb)", "inside train_step()"],
        ["Fix: batch = {k: v.to(next(model.parameters()).device) for k, v in batch.items()}"],
        ["Fix: head.to(xb.device)"],
    ]
    assert len(failing) == len(fixes)
    for cell, expected in zip(failing, fixes):
        text = runner.cell_text(cell)
        assert "whereis: a device mismatch" in text, (cell.source, text)
        for line in expected:
            assert line in text, (line, text)
    shown = "\n".join(runner.cell_text(c) for c in nb.cells if c.source.startswith("%whereis --sort"))
    assert re.search(r"^model\s+Sequential\s+float32\s+178 params\s+712 B\s+712 B\s", shown, re.M), shown


def test_help_speaks_to_the_user_not_of_the_implementation(ip):
    from torchgpu_magic import placement
    from torchgpu_magic.magics.whereis import WhereIsMagics

    text = WhereIsMagics.whereis.__doc__ + WhereIsMagics.whereis.parser.format_help()
    assert "imported" not in text and "placement." not in text
    assert f"(default {placement.DEFAULT_TOP})" in " ".join(text.split())
