"""moves.py: all-or-nothing moves for %%ontorch --move, on CPU with `meta`."""
from __future__ import annotations

import pytest
import torch

from torchgpu_magic import placement
from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.placement import moves

META = torch.device("meta")


def test_tensor_returns_a_new_tensor_and_counts_bytes():
    x = torch.ones(10)
    [(name, moved, nbytes, _)] = moves.move([("x", x)], META, discard_data=True)
    assert name == "x" and moved.device.type == "meta" and x.device.type == "cpu" and nbytes == 40
    [(_, again, nbytes, _)] = moves.move([("x", moved)], META)
    assert again is moved and nbytes == 0


def test_module_in_place_and_a_lone_parameter():
    layer = torch.nn.Linear(3, 2)  # 6 + 2 floats
    [(_, same, nbytes, _)] = moves.move([("layer", layer)], META, discard_data=True)
    assert same is layer and {p.device.type for p in layer.parameters()} == {"meta"} and nbytes == 32
    param = torch.nn.Parameter(torch.ones(4))
    [(_, moved, nbytes, _)] = moves.move([("p", param)], META, discard_data=True)  # cpu -> meta: a new one
    assert isinstance(moved, torch.nn.Parameter) and moved.device.type == "meta" and nbytes == 16
    assert moved.requires_grad


def test_optimizer_state_keeps_step_where_torch_keeps_it_and_follows_replaced_params():
    layer = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(layer.parameters())
    layer(torch.ones(1, 2)).sum().backward()
    opt.step()
    result = moves.move([("layer", layer), ("opt", opt)], META, discard_data=True)
    assert [r[2] for r in result] == [12, 2 * (2 + 1) * 4]
    assert result[1][3] == "its 8 B of step counters stay on cpu, as torch keeps them"
    assert opt.param_groups[0]["params"] == [layer.weight, layer.bias]
    state = opt.state[layer.weight]
    assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"
    assert state["step"].device.type == "cpu"  # as Optimizer.load_state_dict places a non-capturable step
    assert set(map(id, opt.state)) == {id(layer.weight), id(layer.bias)}


def test_refusals_change_nothing():
    layer, x = torch.nn.Linear(2, 2), torch.ones(2)
    weight = layer.weight
    with pytest.raises(MagicInputError, match="would drop their values.*--discard-data"):
        moves.move([("layer", layer), ("x", x)], META)
    assert layer.weight is weight and weight.device.type == "cpu"
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    with pytest.raises(MagicInputError, match=r"opt holds parameters of layer.*--move layer,opt"):
        moves.move([("layer", layer)], META, discard_data=True, ns={"layer": layer, "opt": opt})
    assert layer.weight is weight and weight.device.type == "cpu"
    ghost = torch.nn.Linear(2, 2, device="meta")
    with pytest.raises(MagicInputError, match="ghost is on meta, which holds no values to copy to cpu"):
        moves.move([("ghost", ghost)], torch.device("cpu"))
    with pytest.raises(MagicInputError, match="takes tensors, nn.Modules and optimizers"):
        moves.move([("n", 3)], META)
    assert placement.kind_of([torch.ones(1)]) is None


class _Boom(torch.nn.Linear):
    def _apply(self, fn, recurse=True):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")


def test_a_failure_half_way_puts_every_module_back():
    first, second = torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), _Boom(2, 2))
    first(torch.ones(1, 2)).sum().backward()
    before = [(p, p.data, p.grad) for m in (first, second) for p in m.parameters()]
    with pytest.raises(MagicInputError) as info:
        moves.move([("first", first), ("second", second)], META, discard_data=True)
    assert str(info.value) == ("could not move second to meta (RuntimeError: CUDA out of memory. Tried to "
                               "allocate 2.00 GiB); nothing was moved")
    after = [(p, p.data, p.grad) for m in (first, second) for p in m.parameters()]
    assert all(a[0] is b[0] and a[1].device.type == "cpu" for a, b in zip(after, before))
    assert all(a[1].data_ptr() == b[1].data_ptr() for a, b in zip(after, before))
    assert first.weight.grad is before[0][2]
