"""placement.py on CPU with `meta`: snapshots, tables, module/optimizer reports, resolution, diagnosis."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

from torchgpu_magic import placement
from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.placement.common import _sep


def _raise(fn):
    try:
        fn()
    except RuntimeError as exc:
        return exc
    raise AssertionError("did not raise")


# ---- namespace_snapshot / changed / devices_of -------------------------------------------------------


def test_snapshot_lists_tensors_modules_optimizers_and_small_containers():
    model = torch.nn.Linear(3, 2)
    ns = {
        "x": torch.ones(3), "model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
        "_hidden": torch.ones(1), "n": 3, "batch": [torch.ones(2), "label"], "d": {"w": torch.ones(1)},
        "Out": {1: torch.ones(1)},
    }
    snap = placement.namespace_snapshot(ns)
    assert set(snap) == {"x", "model", "opt", "batch[0]", "d['w']"}
    assert snap["x"].kind == "tensor" and snap["x"].devices == ("cpu",) and snap["x"].nbytes == 12
    assert snap["model"].kind == "module" and snap["model"].nbytes == 8 * 4
    assert snap["opt"].kind == "optimizer"
    assert "float32" in snap["x"].summary and "(3,)" in snap["x"].summary


def test_snapshot_holds_no_reference_and_fingerprint_tracks_changes():
    x = torch.ones(3)
    model = torch.nn.Linear(2, 2)
    ns = {"x": x, "model": model}
    before = placement.namespace_snapshot(ns)
    ref = weakref.ref(x)
    del ns["x"], x
    gc.collect()
    assert ref() is None, "a snapshot must not keep a tensor alive"
    ns["x"] = torch.ones(3)  # replaced
    model.to("meta")  # moved in place
    after = placement.namespace_snapshot(ns)
    names = [p.name for p in placement.changed(before, after)]
    assert names == ["model", "x"] or sorted(names) == ["model", "x"]
    assert after["model"].devices == ("meta",)
    assert placement.changed(after, placement.namespace_snapshot(ns)) == []
    ns["x"] = ns["x"].to(torch.float64)
    assert [p.name for p in placement.changed(after, placement.namespace_snapshot(ns))] == ["x"]


def test_devices_of():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].to("meta")
    assert placement.devices_of(model) == ("cpu", "meta")
    assert placement.devices_of(torch.ones(1, device="meta")) == ("meta",)
    assert placement.devices_of(3) == ()
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    assert placement.devices_of(opt) == ("cpu",)


# ---- the namespace table -------------------------------------------------------------------------------


def test_table_groups_by_device_and_counts_shared_storage_once():
    base = torch.zeros(256)  # 1 KiB
    tied = torch.nn.Linear(4, 4, bias=False)
    other = torch.nn.Linear(4, 4, bias=False)
    other.weight = tied.weight  # tied weights
    ns = {"base": base, "view": base[10:20], "tied": tied, "other": other, "m": torch.ones(8, device="meta")}
    report = placement.namespace_report(ns)
    assert report.totals["cpu"] == 1024 + 64
    rows = {r.name: r for r in report.rows}
    assert rows["view"].note == "shares storage with base" and rows["view"].nbytes == 40
    assert rows["m"].device == "meta"
    text = report.to_text()
    assert "cpu: 4 objects, 1.06 KiB" in text and "meta: 1 object, no memory" in text
    assert "<table" in report._repr_html_()
    assert report.to_dict()["totals"]["cpu"] == 1088


def test_table_looks_one_level_into_containers_and_shows_pinned_and_grad():
    w = torch.ones(2, requires_grad=True)
    ns = {"batch": (torch.ones(3), torch.ones(2, dtype=torch.int64)), "params": {"w": w},
          "deep": [[torch.ones(1)]]}
    rows = {r.name: r for r in placement.namespace_report(ns).rows}
    assert set(rows) == {"batch[0]", "batch[1]", "params['w']"}
    assert rows["batch[1]"].dtype == "int64"
    assert rows["params['w']"].grad == "yes" and rows["batch[0]"].pinned == "no"


def test_out_cache_only_objects_are_marked_with_their_memory():
    kept = torch.ones(10)
    only_out = torch.zeros(100)
    view_of_kept = kept[:5]
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    ns = {"kept": kept, "Out": {3: kept, 4: only_out, 5: view_of_kept, 6: model[0], 7: model[0].weight},
          "_": view_of_kept, "_4": only_out, "model": model}
    report = placement.namespace_report(ns)
    rows = {r.name: r for r in report.rows}
    assert "Out[3]" not in rows  # also bound to a user name
    assert rows["Out[4]"].note == "only in Out"
    assert report.out_only_names == ["Out[4]", "Out[5]"]
    assert report.out_only_bytes == 400  # the view of `kept` holds no extra memory
    assert "%reset -f out" in report.to_text()


def test_split_module_flagged_in_table():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].to("meta")
    rows = [r for r in placement.namespace_report({"model": model}).rows if r.name == "model"]
    assert {r.device for r in rows} == {"cpu", "meta"}
    assert all("split across cpu, meta" in r.note for r in rows)


# ---- %whereis NAME reports -------------------------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(6)])
        self.norm = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 10)


def test_module_report_collapses_uniform_runs_and_flags_meta_split():
    net = Net()
    report = placement.module_report("net", net)
    names = [r.name for r in report.rows]
    assert names == ["net", "embed", "layers", "norm", "head"]
    assert report.rows[0].params == sum(p.numel() for p in net.parameters())
    net.layers[3].to("meta")
    report = placement.module_report("net", net)
    names = [r.name for r in report.rows]
    assert "layers.0..2" in names and "layers.3" in names and "layers.4..5" in names
    merged = report.rows[names.index("layers.0..2")]
    assert merged.what == "3 × Linear" and merged.params == 3 * 20 and merged.nbytes == 3 * 80
    assert "split across cpu, meta" in report.rows[0].note
    assert any("split across cpu, meta" in flag for flag in report.flags)
    assert any("meta have no data" in flag for flag in report.flags)
    assert "meta params" in report.rows[names.index("layers.3")].note


def test_module_report_trainable_and_wrappers_and_hooks():
    net = Net()
    net.embed.requires_grad_(False)
    report = placement.module_report("net", net)
    assert report.rows[0].trainable.endswith("%")
    dp = torch.nn.DataParallel(torch.nn.Linear(2, 2))
    assert "DataParallel wrapper" in placement.module_report("dp", dp).to_text()

    class AlignDevicesHook:  # the attributes accelerate's hook exposes
        execution_device = "cuda:0"
        offload = True

    lin = torch.nn.Linear(2, 2).to("meta")
    lin._hf_hook = AlignDevicesHook()
    text = placement.module_report("lin", lin).to_text()
    assert "accelerate hook AlignDevicesHook runs on cuda:0 weights offloaded" in text


def test_module_report_never_runs_forward_or_moves():
    class Boom(torch.nn.Linear):
        def forward(self, x):  # pragma: no cover - must not be called
            raise AssertionError("forward ran")

    m = Boom(2, 2)
    ptr = m.weight.data_ptr()
    placement.module_report("m", m)
    placement.namespace_report({"m": m})
    assert m.weight.data_ptr() == ptr


def test_optimizer_report_state_versus_params():
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.Adam(model.parameters())
    assert "No state yet" in placement.optimizer_report("opt", opt).to_text()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    report = placement.optimizer_report("opt", opt)
    assert report.rows[0][1] == 2 and report.rows[0][3] == "cpu"
    for state in opt.state.values():  # state that did not follow its parameter
        state["exp_avg"] = state["exp_avg"].to("meta")
    report = placement.optimizer_report("opt", opt)
    assert report.rows[0][3] == "cpu, meta"
    assert "not on their parameter's device" in report.to_text()


def test_tensor_line_and_placement_line():
    x = torch.ones(4, 4)
    ns = {"x": x, "row": x[1]}
    line = placement.describe("row", ns["row"], ns).to_text()
    assert "row" in line and "cpu" in line and "(4,)" in line and "16 B" in line
    assert "a view of a 64 B storage" in line and "shares storage with x" in line
    sep = _sep()
    expected = f"Linear {sep} cpu {sep} float32 {sep} 4 params {sep} 16 B"
    assert placement.placement_line(torch.nn.Linear(1, 2)) == expected
    with pytest.raises(MagicInputError, match="not a tensor"):
        placement.describe("n", 3)


def test_resolve_is_static_and_suggests_close_names():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    ns = {"model": model, "batch": [torch.ones(1)], "d": {"w": torch.ones(1)}}
    assert placement.resolve("model[0].weight", ns) is model[0].weight
    assert placement.resolve("model[-1]", ns) is model[0]
    assert placement.resolve("d['w']", ns) is ns["d"]["w"]
    with pytest.raises(MagicInputError, match="did you mean model"):
        placement.resolve("modle", ns)
    with pytest.raises(MagicInputError, match="not a name"):
        placement.resolve("model(1)", ns)
    with pytest.raises(MagicInputError, match="constant indices"):
        placement.resolve("batch[i]", ns)

    class Lazy:
        @property
        def weights(self):  # pragma: no cover - must not run
            raise AssertionError("property ran")

    with pytest.raises(MagicInputError, match="does not run code"):
        placement.resolve("lazy.weights", {"lazy": Lazy()})


def test_reports_show_their_text_in_ipythons_plain_text_formatter():
    """Terminals, VS Code's text view and static exports show only text/plain: a dataclass's
    generated __repr__ must not win over the reports' _repr_pretty_."""
    from IPython.core.formatters import PlainTextFormatter

    model = torch.nn.Linear(3, 2)
    ns = {"model": model, "x": torch.ones(3), "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    exc = _raise(lambda: ns["x"] + torch.ones(3, device="meta"))
    reports = [placement.namespace_report(ns), placement.describe("x", ns["x"], ns),
               placement.module_report("model", model), placement.optimizer_report("opt", ns["opt"]),
               placement.diagnose(exc, "x + y", ns, lambda filename: False)]
    formatter = PlainTextFormatter()
    for report in reports:
        assert formatter(report) == report.to_text()


# ---- the diagnosis ------------------------------------------------------------------------------------


@pytest.mark.parametrize("message, devices", [
    ("Expected all tensors to be on the same device, but found at least two devices, cpu and meta!",
     ("cpu", "meta")),
    ("Expected all tensors to be on the same device, but got mat2 is on cuda:0, different from other "
     "tensors on cpu (when checking argument in method wrapper_CUDA_mm)", ("cuda:0", "cpu")),
    ("Expected object of type torch.cuda.FloatTensor but found type torch.FloatTensor for argument #2 'mat2'",
     ("cuda", "cpu")),
    ("Expected object of device type cuda but got device type cpu for argument #1 'self'", ("cuda", "cpu")),
    ("Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     ("cpu", "cuda")),
    ("Tensor on device meta is not on the expected device cpu!", ("meta", "cpu")),
])
def test_mismatch_wordings(message, devices):
    assert placement.mismatch_devices(RuntimeError(message)) == devices


@pytest.mark.parametrize("exc", [
    RuntimeError("Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) "
                 "should be the same"),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
    ValueError("Expected all tensors to be on the same device"),
])
def test_not_a_mismatch(exc):
    assert placement.mismatch_devices(exc) is None


def test_real_errors_are_recognised():
    a, b = torch.ones(3), torch.ones(3, device="meta")
    model = torch.nn.Linear(3, 2).to("meta")
    errors = [
        _raise(lambda: a + b),
        _raise(lambda: model(torch.ones(1, 3))),
        _raise(lambda: torch.ones(3, 3) @ b),
        _raise(lambda: F.linear(torch.ones(2, 3), torch.ones(4, 3, device="meta"),
                                torch.ones(4, device="meta"))),
    ]
    for exc in errors:
        assert placement.mismatch_devices(exc) is not None, str(exc)


def test_diagnosis_keeps_no_reference():
    x = torch.ones(3)
    ns = {"x": x, "y": torch.ones(3, device="meta")}
    exc = _raise(lambda: ns["x"] + ns["y"])
    diagnosis = placement.diagnose(exc, "z = x + y", ns, lambda filename: False)
    assert {c.name for c in diagnosis.culprits} == {"x", "y"}
    assert diagnosis.fixes == ["x = x.to(y.device)"]
    ref = weakref.ref(x)
    del ns["x"], x, exc
    gc.collect()
    assert ref() is None
    assert "x" in diagnosis.to_text() and diagnosis.to_dict()["fixes"]


def test_diagnosis_of_a_cell_that_also_steps_an_optimizer():
    model = torch.nn.Linear(3, 2)
    ns = {"model": model, "x": torch.ones(1, 3, device="meta"),
          "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    exc = _raise(lambda: ns["model"](ns["x"]))
    diagnosis = placement.diagnose(exc, "model(x).sum().backward()\nopt.step()", ns, lambda filename: False)
    summaries = {c.name: c.summary for c in diagnosis.culprits}
    assert summaries == {"model": "Linear (module)", "x": "tensor float32 (1, 3)", "opt": "SGD (optimizer)"}
    assert diagnosis.fixes == ["x = x.to(next(model.parameters()).device)"]
