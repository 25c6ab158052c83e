"""placement/modules.py on CPU with `meta`: %whereis NAME for tensors, modules and optimizers."""
from __future__ import annotations

import pytest
import torch

from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.placement import modules, table
from torchgpu_magic.render import separator as _sep


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(6)])
        self.norm = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 10)


def test_a_module_report_leaves_no_cyclic_garbage():
    """Everything the walk makes is freed when the report is dropped, by reference counting alone: a
    cycle (a recursive closure kept alive) left tens of thousands of nodes and storage entries for the
    garbage collector after each %whereis MODEL, a full pass over them in the user's next cell."""
    import gc

    net = Net()
    modules.module_report("net", net)  # first use: lazy imports, caches
    gc.collect()
    gc.disable()
    try:
        report = modules.module_report("net", net)
        del report
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_module_report_collapses_uniform_runs_and_flags_meta_split():
    net = Net()
    report = modules.module_report("net", net)
    names = [r.name for r in report.rows]
    assert names == ["net", "embed", "layers", "norm", "head"]
    assert report.rows[0].params == sum(p.numel() for p in net.parameters())
    net.layers[3].to("meta")
    report = modules.module_report("net", net)
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
    report = modules.module_report("net", net)
    assert report.rows[0].trainable.endswith("%")

    class AlignDevicesHook:  # the attributes accelerate's hook exposes
        execution_device = "cuda:0"
        offload = True

    lin = torch.nn.Linear(2, 2).to("meta")
    lin._hf_hook = AlignDevicesHook()
    text = modules.module_report("lin", lin).to_text()
    assert "accelerate: weights on cpu, loaded onto cuda:0 for each forward" in text
    assert "loaded onto cuda:0 for each forward; the forward runs as is." in text


def test_dataparallel_wrapper_on_a_machine_without_a_gpu():
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type in ("cuda", "xpu"):  # the GPUs DataParallel moves to
        pytest.skip(f"DataParallel moves its module to {accelerator.type}:0 where torch sees a GPU, leaving "
                    "a context in the test process (a kernel the simulated machines cannot run): "
                    "tests/test_whereis.py::test_gpu_model_table_and_dataparallel covers it there")
    dp = torch.nn.DataParallel(torch.nn.Linear(2, 2))
    assert "DataParallel wrapper" in modules.module_report("dp", dp).to_text()


def test_module_report_never_runs_forward_or_moves():
    class Boom(torch.nn.Linear):
        def forward(self, x):  # pragma: no cover - must not be called
            raise AssertionError("forward ran")

    m = Boom(2, 2)
    ptr = m.weight.data_ptr()
    modules.module_report("m", m)
    table.namespace_report({"m": m})
    assert m.weight.data_ptr() == ptr


def test_optimizer_report_state_versus_params():
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.Adam(model.parameters())
    assert "No state yet" in modules.optimizer_report("opt", opt).to_text()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    report = modules.optimizer_report("opt", opt)
    assert report.rows[0][1] == 2 and report.rows[0][3] == "cpu"
    for state in opt.state.values():  # state that did not follow its parameter
        state["exp_avg"] = state["exp_avg"].to("meta")
    report = modules.optimizer_report("opt", opt)
    assert report.rows[0][3] == "cpu, meta"
    assert "not on their parameter's device" in report.to_text()


def test_tensor_line_and_placement_line():
    x = torch.ones(4, 4)
    ns = {"x": x, "row": x[1]}
    line = modules.describe("row", ns["row"], ns).to_text()
    assert "row" in line and "cpu" in line and "(4,)" in line and "16 B" in line
    assert "a view of a 64 B storage" in line and "shares storage with x" in line
    sep = _sep()
    expected = f"Linear {sep} cpu {sep} float32 {sep} 4 params {sep} 16 B"
    assert modules.placement_line(torch.nn.Linear(1, 2)) == expected
    with pytest.raises(MagicInputError, match="not a tensor"):
        modules.describe("n", 3)


def test_reports_show_their_text_in_ipythons_plain_text_formatter():
    """Terminals, VS Code's text view and static exports show only text/plain: a dataclass's
    generated __repr__ must not win over the report's _repr_pretty_."""
    from IPython.core.formatters import PlainTextFormatter

    model = torch.nn.Linear(3, 2)
    x = torch.ones(3)
    reports = [modules.describe("x", x, {"x": x}), modules.module_report("model", model),
               modules.optimizer_report("opt", torch.optim.SGD(model.parameters(), lr=0.1))]
    formatter = PlainTextFormatter()
    for report in reports:
        assert formatter(report) == report.to_text()
