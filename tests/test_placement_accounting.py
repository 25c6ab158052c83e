"""placement/accounting.py: the per-object facts every placement view reads."""
from __future__ import annotations

import torch

from torchgpu_magic.placement import accounting


def test_devices_of():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].to("meta")
    assert accounting.devices_of(model) == ("cpu", "meta")
    assert accounting.devices_of(torch.ones(1, device="meta")) == ("meta",)
    assert accounting.devices_of(3) == ()
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    assert accounting.devices_of(opt) == ("cpu",)


class _NeverAsk:
    """A stand-in tensor whose is_pinned must not be called (it could create a CUDA context)."""

    def is_pinned(self):
        raise AssertionError("is_pinned was asked without a CUDA context")


def test_pinned_is_no_without_a_cuda_context_and_never_asks_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert accounting._pinned(_NeverAsk(), "cpu") == "no"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # initialised, but no context yet
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda index: False, raising=False)
    assert accounting._pinned(_NeverAsk(), "cpu") == "no"
    assert accounting._pinned(_NeverAsk(), "cuda:0") == "-"


def test_pinned_asks_torch_once_a_gpu_has_a_context(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda index: index == 1, raising=False)

    class Pinned:
        def is_pinned(self):
            return True

    assert accounting._pinned(Pinned(), "cpu") == "yes"
