"""The names a cell uses, read from its code, and their fake copies: storages shared as in the original,
gradients and optimizer state copied, an optimizer's step kept readable, notebook functions rebound to
the copies, batch tensors resized for --fit; the originals untouched and not held."""
from __future__ import annotations

import ast
import copy
import gc
import weakref

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from torchgpu_magic.cudamem.fakenamespace import CopyError, fake_namespace, mark_target, names_read


def test_cell_names_are_what_the_cell_reads_and_what_its_notebook_functions_read():
    ns: dict = {"model": 1, "x": 2, "opt": 3, "unused": 4, "loss": 5, "lr": 6, "cfg": 7}
    exec("def step(batch):\n    return model(batch) * lr\n", ns)
    code = "loss = step(x)\nloss.backward()\nopt.step()\nfor _ in range(2):\n    cfg += 1\nnew = 1"
    assert names_read(ast.parse(code), ns) == ["cfg", "lr", "model", "opt", "step", "x"]


def test_a_name_assigned_at_the_top_before_it_is_read_is_not_copied():
    ns = {"x": 1, "y": 2}
    assert names_read(ast.parse("x = 3\nprint(x, y)"), ns) == ["y"]
    assert names_read(ast.parse("if True:\n    x = 3\nprint(x)"), ns) == ["x"]  # maybe assigned: read


def _copies(ns: dict, names: list, resize=None) -> tuple:
    fake_mode = FakeTensorMode()
    out, copies = fake_namespace(ns, names, fake_mode, "cpu", resize)
    return fake_mode, out, dict(copies)


def test_copies_are_fakes_sharing_storages_as_the_originals_do():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as a language model's head and embedding
    x = torch.randn(6, 4)
    view = x[2:]
    _, out, copies = _copies({"model": model, "x": x, "view": view}, ["model", "view", "x"])
    fake = copies["model"]
    assert isinstance(fake[0].weight, FakeTensor) and isinstance(fake[0].weight, torch.nn.Parameter)
    assert fake[1].weight is fake[0].weight
    assert copies["view"].untyped_storage()._cdata == copies["x"].untyped_storage()._cdata
    assert copies["view"].storage_offset() == 8 and copies["view"].shape == (4, 4)
    assert model[1].weight is model[0].weight and not isinstance(x, FakeTensor)


def test_gradients_and_optimizer_state_come_along_and_step_stays_readable():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    fake_mode, _, copies = _copies({"model": model, "opt": opt}, ["model", "opt"])
    fake_model, fake_opt = copies["model"], copies["opt"]
    assert all(isinstance(p.grad, FakeTensor) and p.grad.shape == p.shape for p in fake_model.parameters())
    assert fake_opt.param_groups[0]["params"][0] is fake_model.weight
    state = fake_opt.state[fake_model.weight]
    assert isinstance(state["exp_avg"], FakeTensor) and state["step"].item() == 1.0
    with fake_mode:
        fake_opt.step()  # reads step with .item(): works on the copy
    assert opt.state[model.weight]["step"].item() == 1.0


def test_notebook_functions_read_the_copies_and_modules_are_shared():
    ns: dict = {"torch": torch}
    exec("x = torch.ones(3)\ndef double():\n    return x * 2\n", ns)
    fake_mode, out, _ = _copies(ns, ["double", "torch", "x"])
    assert out["torch"] is torch and out["double"] is not ns["double"]
    assert out["double"].__globals__ is out and ns["double"].__globals__ is ns
    with fake_mode:
        assert isinstance(out["double"](), FakeTensor)


def test_resize_gives_the_batch_a_new_first_dimension():
    x = torch.randn(8, 3, requires_grad=True)
    _, _, copies = _copies({"batch": {"x": x}}, ["batch"], resize={id(x): 1000})
    assert copies["batch"]["x"].shape == (1000, 3) and copies["batch"]["x"].requires_grad


def test_what_cannot_be_copied_is_shared_when_it_holds_no_tensor_and_refused_when_it_does():
    import threading

    class Holder:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.w = torch.ones(2)

    lock = threading.Lock()
    _, out, _ = _copies({"lock": lock}, ["lock"])
    assert out["lock"] is lock
    with pytest.raises(CopyError, match="cannot copy holder for a prediction"):
        _copies({"holder": Holder()}, ["holder"])
    with pytest.raises(CopyError, match="sparse"):
        _copies({"s": torch.eye(3).to_sparse()}, ["s"])


def test_the_originals_are_not_held_after_copying():
    x = torch.ones(100)
    ref = weakref.ref(x)
    fake_mode, out, copies = _copies({"x": x}, ["x"])
    del x
    gc.collect()
    assert ref() is None and isinstance(copies["x"], FakeTensor)


def test_optimizers_take_foreach_as_torch_would_on_the_target_unless_the_user_chose():
    params = [torch.nn.Parameter(torch.ones(2))]
    chosen = torch.optim.AdamW(params, foreach=False)
    left = torch.optim.AdamW(params)
    sgd = torch.optim.SGD(params, lr=0.1)
    copies = [("a", copy.deepcopy(chosen)), ("b", copy.deepcopy(left)), ("c", copy.deepcopy(sgd))]
    mark_target(copies, foreach=True)
    assert [c.param_groups[0]["foreach"] for _, c in copies] == [False, True, True]
    assert left.param_groups[0]["foreach"] is None
