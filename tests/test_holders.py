"""holders/holdings.py, graphs.py, devicestate.py, report.py on CPU: who holds memory by name, each
storage once; the autograd graphs a name keeps alive, found without unpacking; nothing kept."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from torchgpu_magic.holders import devicestate, graphs
from torchgpu_magic.holders import holdings as holders
from torchgpu_magic.holders import report as holdersreport

MiB = 1024 ** 2


def _by_name(holdings):
    return {h.name: h for h in holdings.holders}


def _model_and_opt():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(8, 64)).sum().backward()
    opt.step()
    return model, opt


def test_names_models_and_optimizers_by_role_each_storage_once():
    model, opt = _model_and_opt()
    x = torch.ones(256, 1024)
    ns = {"model": model, "opt": opt, "x": x, "y": x, "view": x[:10], "batch": [x, torch.zeros(1024)],
          "_hidden": torch.ones(10)}
    found = _by_name(holders.collect(ns))
    params = sum(p.numel() * 4 for p in model.parameters())
    assert found["model"].parts("cpu") == {"parameter": params, "gradient": params}
    assert found["opt"].parts("cpu") == {"state": 2 * params, "step": 4 * 4}  # 2 moments, a step per param
    assert found["opt"].shared["cpu"] == 2 * params  # the parameters and gradients the model counts
    assert found["x"].nbytes("cpu") == MiB
    assert "y" not in found or found["y"].nbytes("cpu") == 0
    assert found["view"].nbytes("cpu") == 0 and found["view"].shared["cpu"] == MiB
    assert found["batch"].nbytes("cpu") == 4096 and found["batch"].what == "list: 2 tensors"
    assert "_hidden" not in found


def test_output_history_entries_with_their_other_names():
    shown = torch.ones(1000)
    ns = {"Out": {3: shown, 4: "text"}, "_": shown, "__": [torch.ones(10)], "_3": shown}
    found = _by_name(holders.collect(ns))
    assert found["Out[3] (also _)"].nbytes("cpu") == 4000 and found["Out[3] (also _)"].source == "output"
    assert found["__"].nbytes("cpu") == 40
    assert not any(name.startswith("Out[4]") for name in found)


def _failing_forward():
    class Net(torch.nn.Module):
        def forward(self, inp):
            attn = inp @ inp.T  # noqa: F841 - what the traceback keeps
            return torch.empty(2 ** 50, dtype=torch.uint8)

    net = Net()
    try:
        net(torch.ones(512, 512))
    except RuntimeError as exc:
        return net, exc
    raise AssertionError("did not fail")


def test_traceback_frames_by_function_and_local():
    net, error = _failing_forward()
    found = _by_name(holders.collect({"net": net}, [error]))
    assert found["forward: attn"].nbytes("cpu") == MiB and found["forward: attn"].source == "traceback"
    assert found["forward: inp"].nbytes("cpu") == MiB
    assert not any(name.startswith("forward: self") for name in found)  # net is the user's name
    torch_frames = [n for n in found if n.startswith("_call_impl")]
    assert all(found[n].nbytes("cpu") == 0 for n in torch_frames)  # the input, counted under forward
    assert "Net.forward" in holders.collect({"net": net}, [error]).module_frames


def test_an_accumulated_loss_keeps_every_steps_graph():
    model = torch.nn.Linear(256, 256)
    total_loss = 0
    for _ in range(4):
        total_loss = total_loss + model(torch.randn(128, 256)).pow(2).sum()
    holdings = holders.collect({"model": model, "total_loss": total_loss})
    found = _by_name(holdings)
    graph = found["graph of total_loss"]
    assert graph.source == "graph" and graph.root == "total_loss"
    # each step saved its input (128x256) and its output (for pow): 2 x 128 KiB per step
    assert graph.nbytes("cpu") == 4 * 2 * 128 * 256 * 4
    assert found["total_loss"].scalar
    assert holdings.freed_by({graph.index})["cpu"] == graph.nbytes("cpu")
    total_loss.backward()  # frees what the graph saved
    after = _by_name(holders.collect({"model": model, "total_loss": total_loss}))
    assert after["graph of total_loss"].nbytes("cpu") == 0


def test_the_graph_walk_never_unpacks_and_stops_at_its_limit():
    calls = []
    x = torch.ones(1000, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: ("packed", t.clone()),
                                                  lambda p: calls.append("unpack") or p[1]):
        y = (x * x).exp().sum()
    saved = list(graphs.GraphWalk([y]))
    assert not calls and len(saved) >= 2
    deep = torch.ones(3, requires_grad=True)
    for _ in range(50):
        deep = deep * 1.0
    walk = graphs.GraphWalk([deep], limit=10)
    list(walk)
    assert walk.cut and walk.nodes == 10


def test_custom_function_saved_tensors_and_ctx_attributes():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            ctx.extra = a * 3
            return a * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    a = torch.ones(1000, requires_grad=True)
    out = Twice.apply(a).sum()
    found = _by_name(holders.collect({"a": a, "out": out}))
    assert found["graph of out"].nbytes("cpu") == 4000  # ctx.extra; `a` (saved) counted under its name
    assert found["graph of out"].shared["cpu"] == 4000


def test_collect_keeps_no_reference():
    big = torch.ones(1000)
    ref = weakref.ref(big)
    net, error = _failing_forward()
    holdings = holders.collect({"big": big, "net": net}, [error])
    del big, net, error
    gc.collect()
    assert ref() is None
    assert all(not isinstance(v, torch.Tensor) for h in holdings.holders for v in vars_of(h))


def vars_of(holder):
    return [getattr(holder, slot) for slot in holder.__slots__]


def test_meta_tensors_hold_no_memory():
    found = _by_name(holders.collect({"m": torch.ones(1000, device="meta")}))
    assert "m" in found and found["m"].nbytes("meta") == 0 and not found["m"].counted


def test_holds_tensors():
    assert holders.holds_tensors(torch.ones(1))
    assert holders.holds_tensors({"a": [torch.ones(1)]})
    assert not holders.holds_tensors("text") and not holders.holds_tensors([1, 2])


def test_cpu_state_is_read_live():
    state = devicestate.read("cpu")
    assert state.kind == "cpu" and state.process > 0 and state.total >= state.free > 0
    from torchgpu_magic.accelerators import cuda_state

    if cuda_state() != "initialised":  # not initialised (or no CUDA): said, not raised, not initialised
        assert devicestate.read("cuda:0").notes and cuda_state() != "initialised"


def test_report_rows_largest_first_the_rest_among_them():
    x = torch.ones(256, 1024)
    small = torch.ones(10)
    report = holdersreport.holders_report({"small": small, "x": x, "alias": x}, "cpu")
    section = report.section("cpu")
    rows = section.rows
    assert [r.nbytes for r in rows] == sorted((r.nbytes for r in rows), reverse=True)
    names = [r.name for r in rows]
    assert names.index("x") < names.index("small") and "the rest of this process" in names
    assert section.rows[names.index("x")].label() == "x (also alias)"
    assert section.counted == MiB + 40
    text = section.to_text()
    assert text.startswith("cpu: 1.00 MiB held by 2 holders") and "x (also alias)" in text
    data = report.to_dict()
    assert next(r for r in data["devices"][0]["rows"] if r["name"] == "x") == {
        "name": "x", "source": "name", "bytes": MiB, "what": "tensor float32 (256, 1024)",
        "parts": {"tensor": MiB}, "also": ["alias"]}


def test_report_cuts_to_the_top_rows():
    ns = {f"t{i}": torch.ones(i + 1) for i in range(40)}
    section = holdersreport.holders_report(ns, "cpu").section("cpu")
    lines = section.table().to_text().splitlines()
    assert len(lines) == 2 + holdersreport.TOP + 1 and "... and" in lines[-1]


def test_the_largest_row_is_never_folded_away():
    """Issue 29 item 6: with more holders than rows shown, "the rest of this process" (the process's RSS
    beyond the holders: hundreds of MiB) was appended after the cut and folded into "... and N more"."""
    ns = {f"t{i}": torch.ones(1024) for i in range(40)}
    section = holdersreport.holders_report(ns, "cpu").section("cpu")
    table = section.table().to_text().splitlines()
    assert section.rows[0].name == "the rest of this process"
    assert table[2].split()[:5] == ["the", "rest", "of", "this", "process"], table[:3]
    assert "... and 26 more" in table[-1]


LONG = "images_of_the_validation_split_after_augmentation_and_normalisation"


def test_holder_tables_fit_100_columns_in_the_plain_text_formatter():
    """Issue 29 item 11: tables reached 182 columns; a long name is shortened in the middle and the
    "what" column, last, wraps under itself."""
    from IPython.core.formatters import PlainTextFormatter

    model, opt = _model_and_opt()
    ns = {LONG: [torch.ones(64, 64) for _ in range(3)], "model": model, "opt": opt,
          "also_" + LONG: model, "x": torch.ones(8)}
    report = holdersreport.holders_report(ns, "cpu")
    text = PlainTextFormatter()(report)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert "images_of_the_valida..." in text or "..." in text
    assert "Sequential: parameters" in text and "gradients" in text  # wrapped, not lost
    assert report._repr_html_().count(LONG) >= 1  # HTML keeps the whole name


def test_gpu_rows_leave_the_allocators_rounding_out_of_no_name_reaches(monkeypatch):
    """Issue 28 item 11: torch rounds every block up to 512 bytes (allocated counts the rounded sizes,
    requested what tensors asked): the rounding is torch's, not tensors no name reaches. The state is
    scripted, so no cuBLAS workspace of a GPU used before (a simulated one, under --simulate-gpu) counts."""
    monkeypatch.setattr("torchgpu_magic.torchapi.cublas_workspace_sizes", frozenset)
    state = devicestate.DeviceState("cuda:0", total=80 * 1024 * MiB, free=70 * 1024 * MiB, allocated=4 * MiB,
                                    reserved=20 * MiB, requested=4 * MiB - 300 * 512)
    section = holdersreport.device_holders(holders.Holdings(), "cuda:0", state)
    rows = {r.name: r for r in section.rows}
    assert rows["torch's rounding"].nbytes == 300 * 512 and rows["torch's rounding"].source == "torch"
    assert rows["no name reaches"].nbytes == 4 * MiB - 300 * 512


def test_in_a_container_no_process_nvml_lists_is_called_another():
    """Issue 28 item 1: NVML lists the host's PIDs in a container without --pid=host, this process among
    them: no "another process" row; what is held outside torch says NVML cannot tell them apart."""
    gib = 1024 * MiB
    state = devicestate.DeviceState("cuda:0", total=80 * gib, free=2 * gib, allocated=40 * gib,
                                    reserved=48 * gib, requested=40 * gib,
                                    foreign=((4190001, "", int(48.5 * gib)), (4190002, "", 29 * gib)))
    section = holdersreport.device_holders(holders.Holdings(), "cuda:0", state)
    assert not [r for r in section.rows if r.source == "process"]
    outside = next(r for r in section.rows if r.name == "outside torch's allocator")
    assert outside.nbytes == 30 * gib and outside.source == "unknown"
    assert "cannot tell which is this one" in outside.what and "4190001, 4190002" in outside.what
    alone = devicestate.DeviceState("cuda:0", total=80 * gib, free=31 * gib, allocated=40 * gib,
                                    reserved=48 * gib, foreign=((4190001, "", int(48.5 * gib)),))
    row = next(r for r in holdersreport.device_holders(holders.Holdings(), "cuda:0", alone).rows
               if r.name == "outside torch's allocator")
    assert row.source == "outside" and "this one" in row.what


@pytest.mark.parametrize("largest, cache, asked, expected", [
    (100, 1000, None, True), (900, 1000, None, False), (300, 1000, 500, True), (None, 1000, None, False),
])
def test_fragmentation(largest, cache, asked, expected):
    state = devicestate.DeviceState("cuda:0", allocated=1000, reserved=1000 + cache,
                                    largest_free_block=largest)
    assert holdersreport.fragmented(state, asked) is expected
