"""placement/common.py: the per-object facts the other placement modules share."""
from __future__ import annotations

import torch

from torchgpu_magic.placement import common


def test_devices_of():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].to("meta")
    assert common.devices_of(model) == ("cpu", "meta")
    assert common.devices_of(torch.ones(1, device="meta")) == ("meta",)
    assert common.devices_of(3) == ()
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    assert common.devices_of(opt) == ("cpu",)
