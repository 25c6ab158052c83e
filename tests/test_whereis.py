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


def test_table_through_the_magic(ip):
    run(ip, SETUP + "batch = [x, torch.zeros(2, dtype=torch.int64)]\n")
    out = _cell(ip, "%whereis")
    text = "\n".join(_texts(out))
    assert "cpu: 4 objects" in text and "batch[1]" in text and "same tensor as x" in text
    assert "meta: 2 objects" in text and "model" in text
    assert "text/html" in out.outputs[0].data
    report = ip.run_line_magic("whereis", "-o")
    assert {r.name for r in report.rows} >= {"x", "a", "b", "model", "batch[0]", "batch[1]"}


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
    texts = _texts(out)
    assert len(texts) == 1, texts
    text = texts[0]
    assert text.startswith("whereis: a device mismatch")
    used = text.split("used there:")[1].split("elsewhere")[0]
    for name in names:
        assert re.search(rf"^\s+{re.escape(name)}\s", used, re.M), (name, text)
    assert "Fix: " + fix in text


def test_diagnosis_in_a_function_defined_in_the_cell(ip):
    run(ip, SETUP)
    text = _texts(_cell(ip, "def step(inp):\n    return model(inp)\nstep(x)"))[0]
    assert "return model(inp)" in text and "inp = inp.to(next(model.parameters()).device)" in text


def test_traceback_unchanged(ip):
    import torchgpu_magic

    run(ip, SETUP)
    with_ext = _cell(ip, "c = a + b").stdout
    torchgpu_magic.unload_ipython_extension(ip)
    try:
        without = _cell(ip, "c = a + b")
    finally:
        torchgpu_magic.load_ipython_extension(ip)
    assert without.outputs == []
    strip = re.compile(r"In\[\d+\]")
    assert strip.sub("", with_ext) == strip.sub("", without.stdout)


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
        assert "RuntimeError" in out.stdout and _texts(out)[0].startswith("whereis: a device mismatch")
        assert (ip.CustomTB, ip.custom_exceptions) == custom
        torchgpu_magic.unload_ipython_extension(ip)
        assert (ip.CustomTB, ip.custom_exceptions) == custom
    finally:
        ip.set_custom_exc((), None)
        torchgpu_magic.load_ipython_extension(ip)


def test_reload_leaves_one_handler(ip):
    def ours():
        return [cb for cb in ip.events.callbacks["post_run_cell"]
                if getattr(cb, "__name__", "") in ("_diagnose_cell", "_watch_cell")]

    ip.run_line_magic("whereis", "--watch on")
    for _ in range(5):
        ip.run_line_magic("reload_ext", "torchgpu_magic")
    assert [cb.__name__ for cb in ours()] == ["_diagnose_cell"]
    ip.run_line_magic("whereis", "--watch on")
    ip.run_line_magic("whereis", "--watch on")
    assert sorted(cb.__name__ for cb in ours()) == ["_diagnose_cell", "_watch_cell"]


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
    assert "big" in _texts(_cell(ip, "s = big.sum()\nc = a + b"))[0]
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
    text = _texts(_cell(ip, "y = model(x)"))[0]
    assert "cuda:0" in text and "x = x.to(next(model.parameters()).device)" in text
