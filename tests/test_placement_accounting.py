"""placement/accounting.py: the one account of an object, and every pair of views that read it agreeing
on the same object: same bytes, same devices.

The scenario of issue 20: Adam (and AdamW) stepped once, then `%%ontorch meta --move model,opt,x
--discard-data`, where `meta` stands in for `cuda`: torch keeps Adam's `step` on the cpu on purpose, and
no view may call that a mistake, count it twice, or count it differently from another view.
"""
from __future__ import annotations

import pytest
import torch
from conftest import run
from IPython.utils.capture import capture_output

from torchgpu_magic import placement
from torchgpu_magic.placement import accounting, bydesign, moves


def _stepped(opt_cls=torch.optim.Adam, **kwargs):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))  # 72 + 36 floats
    opt = opt_cls(model.parameters(), **kwargs)
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    return model, opt


def test_roles_of_every_tensor_an_object_holds():
    model, opt = _stepped()
    acc = accounting.account(model)
    assert acc.by_role() == {("cpu", "parameter"): 432, ("cpu", "gradient"): 432}
    model.register_buffer("counter", torch.zeros(2, dtype=torch.int64))
    assert accounting.account(model).by_role()[("cpu", "buffer")] == 16
    acc = accounting.account(opt)
    assert acc.by_role() == {("cpu", "state"): 864, ("cpu", "step"): 16}  # exp_avg + exp_avg_sq; 4 steps
    assert acc.devices == ("cpu",) and acc.nbytes() == 880 and not acc.kept_off and not acc.misplaced
    x = torch.ones(3, requires_grad=True)
    x.sum().backward()
    assert accounting.account(x).by_role() == {("cpu", "tensor"): 12, ("cpu", "gradient"): 12}
    assert accounting.account(3) is None


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam])
def test_step_kept_on_cpu_is_by_design_and_counted_apart(opt_cls):
    model, opt = _stepped(opt_cls)
    moves.move([("model", model), ("opt", opt)], torch.device("meta"), discard_data=True)
    acc = accounting.account(opt)
    assert acc.devices == ("meta",)  # where it lives: its state and parameters; not cpu
    assert acc.nbytes() == 864 and acc.shares["meta"].nbytes == 864
    kept = 16 if opt_cls is not torch.optim.NAdam else 32  # NAdam keeps mu_product beside step
    assert [(role, device, size) for role, device, size, _ in acc.kept_off] == [("step", "cpu", kept)]
    assert acc.by_role()[("cpu", "step")] == kept and not acc.misplaced
    assert accounting.devices_of(opt) == ("meta",)


def test_a_capturable_or_fused_step_belongs_on_the_parameters_device():
    model, opt = _stepped()
    moves.move([("model", model), ("opt", opt)], torch.device("meta"), discard_data=True)
    opt.param_groups[0]["capturable"] = True  # as load_state_dict leaves a capturable optimizer's state
    acc = accounting.account(opt)
    assert not acc.kept_off and acc.devices == ("cpu", "meta")
    assert {(what, device, expected) for what, device, expected in acc.misplaced} == {("step", "cpu", "meta")}
    assert "state not on its params' device (meta): step() will fail" in placement.namespace_report(
        {"opt": opt}).to_text()


def test_state_left_behind_by_a_moved_model_is_misplaced():
    model, opt = _stepped(torch.optim.SGD, lr=0.1, momentum=0.9)
    for state in opt.state.values():  # state and parameters apart, as after model.to('cuda') alone
        state["momentum_buffer"] = state["momentum_buffer"].to("meta")
    acc = accounting.account(opt)
    assert acc.devices == ("cpu", "meta") and len(acc.misplaced) == 4
    assert "4 state tensor(s) are not on their parameter's device" in placement.optimizer_report(
        "opt", opt).to_text()


def _views(ip):
    """Every view of the namespace after the move: the table, the NAME reports, and the accounts."""
    report = ip.run_line_magic("whereis", "-o")
    rows = {}
    for r in report.rows:
        rows.setdefault(r.name, []).append(r)
    return report, rows


@pytest.fixture
def moved(ip):
    run(ip, "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))\n"
            "opt = torch.optim.AdamW(model.parameters())\nx = torch.ones(4, 8)\n"
            "model(x).sum().backward(); opt.step()")
    with capture_output() as cap:
        run(ip, "%%ontorch meta --move model,opt,x --discard-data\ny = model(x)")
    ip.moved_output = cap.stdout
    return ip


def test_table_and_optimizer_report_same_bytes_same_devices(moved):
    report, rows = _views(moved)
    [row] = rows["opt"]  # one row, on meta: the step counters on cpu are not a second placement
    assert row.device == "meta" and row.nbytes == 864
    assert "+16 B of step counters on cpu, where torch keeps them" in row.note
    assert "state not on" not in row.note and "cpu" not in report.totals
    described = moved.run_line_magic("whereis", "-o opt")
    assert described.header == ["opt: AdamW, 1 param group(s), state 864 B on meta"]
    assert described.rows == [(0, 4, "meta", "meta", 864)]
    assert any("Step counters: 16 B on cpu" in flag for flag in described.flags)
    acc = accounting.account(moved.user_ns["opt"])
    assert (row.device,) == acc.devices and row.nbytes == acc.nbytes()


def test_table_and_module_report_same_bytes_same_devices(moved):
    _, rows = _views(moved)
    [row] = rows["model"]
    described = moved.run_line_magic("whereis", "-o model")
    assert described.header[-1] == "model: Sequential, 108 params, 432 B on meta"
    assert row.device == "meta" and row.nbytes == 432 == described.rows[0].nbytes
    assert described.rows[0].devices == "meta"


def test_move_report_and_table_same_bytes(moved):
    out = moved.moved_output
    _, rows = _views(moved)
    assert f"model (module, {rows['model'][0].nbytes} B)" in out
    assert f"opt (optimizer, {rows['opt'][0].nbytes} B; its 16 B of step counters stay on cpu" in out
    assert f"x (tensor, {rows['x'][0].nbytes} B)" in out


def test_footer_and_table_same_devices(moved):
    out = moved.moved_output
    assert out.splitlines()[-1] == "%%ontorch: ran on meta"  # no "not on meta: opt (cpu+meta ...)"
    snapshot = placement.namespace_snapshot(moved.user_ns, placement.SnapshotCache())
    _, rows = _views(moved)
    for name in ("model", "opt", "x", "y"):
        assert snapshot[name].devices == tuple(r.device for r in rows[name]), name
    assert snapshot["opt"].nbytes == rows["opt"][0].nbytes


def test_diagnosis_and_table_same_devices(moved):
    with capture_output() as cap:
        moved.run_cell("opt.zero_grad(); model(torch.ones(4, 8)).sum().backward(); opt.step()")
    text = "\n".join(o.data.get("text/plain", "") for o in cap.outputs) + cap.stdout
    line = next(line for line in text.splitlines() if line.strip().startswith("opt "))
    assert line.split()[1] == "meta"  # not cpu+meta


def test_totals_are_the_accounts_counted_once_across_objects(moved):
    report, _ = _views(moved)
    ns = moved.user_ns
    storages = {}
    for name in ("model", "opt", "x", "y"):
        acc = accounting.account(ns[name])
        storages.update({k: v for k, v in acc.storages.items() if v[0] in acc.devices or v[1] == "gradient"})
    assert report.totals == {"meta": sum(size for _, _, size in storages.values())}


def test_the_rest_line_counts_shared_storage_once():
    x = torch.ones(1000)  # 3.91 KiB
    ns = {"x": x, "a": x, "b": x[:10], "c": x.view(10, 100)}
    report = placement.namespace_report(ns, top=1)
    assert report.totals == {"cpu": 4000}
    text = report.to_text()
    assert "... and 3 more" in text
    rest = next(line for line in text.splitlines() if line.startswith("... and 3 more"))
    assert " 0 B " in rest  # they add nothing to x's storage, already shown
    other = placement.namespace_report({"x": x, "z": torch.ones(10), "a": x}, top=1)
    rest = next(line for line in other.to_text().splitlines() if line.startswith("... and 2 more"))
    assert " 40 B " in rest


def test_device_filter_that_matches_nothing_says_where_things_are(ip):
    run(ip, "import torch\nx = torch.ones(3)\nm = torch.nn.Linear(2, 2)")
    text = ip.run_line_magic("whereis", "-o --device meta").to_text()
    assert text == ("Nothing on meta; the namespace's tensors, modules and optimizers are on cpu "
                    "(2 objects).")


def test_by_design_rules():
    assert bydesign.looks_like_rng_state(torch.get_rng_state())
    assert bydesign.looks_like_rng_state(torch.zeros(16, dtype=torch.uint8))  # a CUDA generator's state
    assert not bydesign.looks_like_rng_state(torch.zeros(16))
    assert bydesign.tensor_why(torch.get_rng_state(), "cpu") == bydesign.RNG_WHY
    assert bydesign.tensor_why(torch.ones(3), "cpu") is None
    scaler = torch.amp.GradScaler("cpu")
    assert bydesign.holder_why(scaler) == bydesign.SCALER_WHY and bydesign.holder_why(object()) is None
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    names = bydesign.loader_names("for i, (xb,) in enumerate(loader):\n    pass\nfirst = next(iter(loader))\n"
                                  "other = next(iter(data))", {"loader": loader, "data": [1]})
    assert names == {"i", "xb", "first"}
    assert bydesign.loader_names("for (", {}) == set()


def test_pinned_is_no_without_a_cuda_context_and_never_asks_torch(monkeypatch):
    class NeverAsk:
        def is_pinned(self):
            raise AssertionError("is_pinned was asked without a CUDA context")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert bydesign.pinned(NeverAsk(), "cpu") == "no"
    _script_cuda()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # initialised, but no context yet
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda index: False, raising=False)
    assert bydesign.pinned(NeverAsk(), "cpu") == "no"
    assert bydesign.pinned(NeverAsk(), "cuda:0") == "-"


def _script_cuda() -> None:
    """The device layer remembers a CPU-only build once it has seen one (it asks around every cell); a
    test that scripts torch.cuda as a CUDA build's makes it forget, so that the script is what it asks."""
    from torchgpu_magic import caches

    caches.reset_caches()


def test_pinned_asks_torch_once_a_gpu_has_a_context_and_is_by_design(monkeypatch):
    _script_cuda()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda index: index == 1, raising=False)
    buffer = torch.ones(3)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: self is buffer)
    assert bydesign.pinned(buffer, "cpu") == "yes"
    assert bydesign.tensor_why(buffer, "cpu") == bydesign.PINNED_WHY


def test_devices_of():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].to("meta")
    assert accounting.devices_of(model) == ("cpu", "meta")
    assert accounting.devices_of(torch.ones(1, device="meta")) == ("meta",)
    assert accounting.devices_of(3) == ()
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    assert accounting.devices_of(opt) == ("cpu",)


def test_account_to_dict_is_plain_data():
    model, opt = _stepped()
    moves.move([("model", model), ("opt", opt)], torch.device("meta"), discard_data=True)
    data = accounting.account(opt).to_dict()
    assert data["devices"] == ["meta"] and data["bytes"] == {"meta": 864}
    assert {"device": "cpu", "role": "step", "bytes": 16} in data["by_role"]
    assert data["kept_off"][0]["device"] == "cpu" and data["misplaced"] == []


def test_many_tensors_read_at_once_say_what_each_says_alone():
    base = torch.ones(10, requires_grad=True)
    base.sum().backward()
    tensors = [base, base[2:5], torch.ones(3, device="meta"), torch.get_rng_state(),
               torch.zeros(2, 3, dtype=torch.float64).t(), torch.ones(())]
    fields = len(accounting.TensorFacts._fields)
    for group in (tensors, tensors + [torch.ones(4).to_sparse()]):  # the sparse one: read one by one
        columns = accounting.tensor_columns(group)
        for index, tensor in enumerate(group):
            together = accounting.TensorFacts(*(column[index] for column in columns[:fields]))
            assert together == accounting.tensor_facts(tensor), index
        assert columns.why[3] == bydesign.RNG_WHY and columns.grads[0][2] == 40
        assert columns.devices[2] == "meta"
        assert len(placement.namespace_report({f"t{i}": t for i, t in enumerate(group)}).rows) == len(group)
