"""placement/table.py: the %whereis table over gradients, user objects, nested containers, and
the --device / --sort / --top views of a big namespace."""
from __future__ import annotations

import dataclasses
import gc
import types
import weakref

import torch

from torchgpu_magic.placement import table, walk


class Trainer:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.best = torch.ones(5)
        self._private_buffer = torch.ones(7)


@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    extra: dict


def test_gradients_are_counted_as_their_own_column_and_in_totals():
    model = torch.nn.Linear(4, 4)  # 16 + 4 floats = 80 B of parameters
    model(torch.ones(2, 4)).sum().backward()
    x = torch.ones(8, requires_grad=True)
    (x * 2).sum().backward()
    report = table.namespace_report({"model": model, "x": x})
    rows = {r.name: r for r in report.rows}
    assert rows["model"].nbytes == 80 and rows["model"].grad_bytes == 80
    assert rows["x"].nbytes == 32 and rows["x"].grad_bytes == 32
    assert report.totals["cpu"] == 80 + 80 + 32 + 32
    assert report.grad_totals["cpu"] == 112
    text = report.to_text()
    assert "grad bytes" in text and "of which gradients 112 B" in text


def test_a_gradient_that_is_also_named_counts_once():
    x = torch.ones(8, requires_grad=True)
    x.sum().backward()
    report = table.namespace_report({"x": x, "g": x.grad})
    assert report.totals["cpu"] == 64 and report.grad_totals == {}


def test_user_objects_and_nested_containers_are_walked():
    model = torch.nn.Linear(2, 2)
    ns = {
        "trainer": Trainer(model),
        "batch": Batch(torch.ones(3), {"mask": [torch.zeros(2)]}),
        "cfg": types.SimpleNamespace(data=types.SimpleNamespace(weights=torch.ones(4))),
        "nested": {"a": [[torch.ones(1)]]},
    }
    names = {r.name for r in table.namespace_report(ns).rows}
    assert {"trainer.model", "trainer.opt", "trainer.best", "trainer._private_buffer", "batch.inputs",
            "batch.extra['mask'][0]", "cfg.data.weights", "nested['a'][0][0]"} <= names


def test_an_object_reached_twice_is_listed_once_and_cycles_end():
    model = torch.nn.Linear(2, 2)
    holder = types.SimpleNamespace(model=model)
    holder.me = holder
    report = table.namespace_report({"model": model, "holder": holder})
    assert [r.name for r in report.rows] == ["model"]


def test_what_the_limits_leave_out_is_said():
    deep = {"a": {"b": {"c": {"d": torch.ones(1)}}}}
    big = [torch.ones(1) for _ in range(walk.WALK_WIDTH + 5)]
    report = table.namespace_report({"deep": deep, "big": big}, top=None)
    names = {r.name for r in report.rows}
    assert "deep['a']['b']['c']['d']" not in names
    assert f"big[{walk.WALK_WIDTH - 1}]" in names and f"big[{walk.WALK_WIDTH}]" not in names
    assert ("deep['a']['b']['c']", "deeper than 3 levels") in report.cut
    assert any(name == "big" and "1,005 items" in why for name, why in report.cut)
    assert "Not looked into: " in report.to_text()


def test_walk_keeps_no_reference():
    t = torch.ones(10)
    ns = {"obj": types.SimpleNamespace(inner=[{"t": t}])}
    report = table.namespace_report(ns)
    assert report.rows[0].name == "obj.inner[0]['t']"
    ref = weakref.ref(t)
    del t, ns
    gc.collect()
    assert ref() is None


def test_ipython_names_code_and_modules_are_not_walked():
    ns = {"torch": torch, "Trainer": Trainer, "f": lambda: torch.ones(1), "In": [torch.ones(1)]}
    assert table.namespace_report(ns).rows == []


def _big_namespace() -> dict:
    ns = {f"t{i}": torch.ones(i + 1) for i in range(250)}
    ns["m"] = torch.ones(3, device="meta")
    return ns


def test_device_filter_sort_and_top():
    report = table.namespace_report(_big_namespace(), device="cpu", sort="bytes", top=10)
    assert set(report.totals) == {"cpu"} and {r.device for r in report.rows} == {"cpu"}
    assert [r.name for r in report.rows[:3]] == ["t249", "t248", "t247"]
    text = report.to_text()
    assert "t240" in text and "t239 " not in text
    rest = sum(4 * (i + 1) for i in range(240))
    from torchgpu_magic.render import fmt_bytes

    assert "... and 240 more" in text and fmt_bytes(rest) in text
    meta = table.namespace_report(_big_namespace(), device="meta")
    assert [r.name for r in meta.rows] == ["m"] and "meta: no data" in meta.rows[0].note
    assert table.namespace_report(_big_namespace(), device="cuda:3").rows == []


def test_default_top_cuts_a_big_table_and_none_shows_all():
    text = table.namespace_report(_big_namespace()).to_text()
    assert f"... and {250 - table.DEFAULT_TOP} more" in text
    assert "more" not in table.namespace_report(_big_namespace(), top=None).to_text()


def test_plain_text_of_the_report_through_ipython():
    from IPython.core.formatters import PlainTextFormatter

    report = table.namespace_report({"trainer": Trainer(torch.nn.Linear(2, 2))})
    assert PlainTextFormatter()(report) == report.to_text()
