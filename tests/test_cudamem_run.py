"""The tracked run under torch's MemTracker: what a cell's names hold, the ledger per device, the phase
and module at the peak, a model called twice in one run, and nothing left behind."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from torchgpu_magic.cudamem import run as tracking
from torchgpu_magic.cudamem.allocator import Ledger


@dataclasses.dataclass
class Trainer:
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    history: list


def test_find_objects_looks_into_containers_and_user_objects():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(2)
    trainer = Trainer(model, opt, [x, {"y": x}])
    found = tracking.find_objects([("trainer", trainer), ("again", model), ("n", 3), ("torch", torch)])
    assert [(path, kind) for path, _, kind in found] == [
        ("trainer.model", "module"), ("trainer.opt", "optimizer"), ("trainer.history[0]", "tensor")]
    deep = tracking.find_objects([("d", [[[[x]]]])])
    assert deep == []  # deeper than three levels


def test_module_names_follow_the_users_name():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    names = tracking.module_names(tracking.find_objects([("net", model)]))
    assert sorted(names.values()) == ["net", "net.0", "net.1", "net.1.0"]


def _run(fn, objects):
    return tracking.run_tracked(fn, tracking.find_objects(objects), lambda name: Ledger())


def test_phases_peak_module_and_per_device_ledgers():
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 256)

    def step():
        model(x).square().mean().backward()
        opt.step()

    ledgers, rows, fqns = _run(step, [("model", model), ("opt", opt), ("x", x)])
    ledger = ledgers["cpu"]
    assert set(ledger.phase_peaks) == {"before the cell", "forward", "outside modules", "backward",
                                       "optimizer step"}
    assert ledger.peak_phase == "optimizer step" and ledger.peak == max(ledger.phase_peaks.values())
    assert sorted(fqns.values()) == ["model", "model.0", "model.1", "model.2"]
    assert {r.name for r in rows["cpu"]} == {"model", "model.0", "model.1", "model.2"}


def test_the_module_at_a_forward_peak_is_the_innermost_running():
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(64, 8192)), torch.nn.Linear(8192, 1))
    x = torch.randn(32, 64)
    ledgers, _, fqns = _run(lambda: model(x), [("model", model), ("x", x)])
    assert ledgers["cpu"].peak_phase == "forward"
    assert fqns[ledgers["cpu"].peak_module] in ("model.0.0", "model.1")


def test_a_model_called_twice_is_tracked_where_memtracker_alone_refuses():
    from torch.distributed._tools.mem_tracker import MemTracker

    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    plain = MemTracker()
    plain.track_external(model)
    with pytest.raises(NotImplementedError, match="multiple iterative calls"):
        with plain:
            model(x)
            model(x)
    _, rows, _ = _run(lambda: [model(x) for _ in range(3)], [("model", model), ("x", x)])
    assert [r.calls for r in rows["cpu"]] == [3]


def test_nothing_is_left_behind_even_when_the_run_fails():
    from torch.nn.modules import module
    from torch.optim import optimizer

    model = torch.nn.Linear(8, 8)
    resize, fmt = torch.UntypedStorage.resize_, warnings.formatwarning

    def fails():
        model(torch.randn(2, 8)).sum().backward()
        raise ValueError("in the cell")

    with pytest.raises(ValueError, match="in the cell"):
        _run(fails, [("model", model)])
    assert torch.UntypedStorage.resize_ is resize and warnings.formatwarning is fmt
    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    assert not optimizer._global_optimizer_pre_hooks and not optimizer._global_optimizer_post_hooks
    assert not model.weight._backward_hooks and model.weight._post_accumulate_grad_hooks in (None, {})


def test_the_tested_torch_versions_are_pinned():
    assert tracking.TESTED_TORCH == ((2, 11), (2, 12), (2, 13))
    note = tracking.version_note()
    assert note is None if tracking.torch_version() in tracking.TESTED_TORCH else "not among" in note


def test_the_faster_peak_update_keeps_memtrackers_own_figures():
    """Our tracker visits only the running modules after each operator; every module's snapshots and
    the peak come out as MemTracker's own walk over all modules makes them."""
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Sequential(torch.nn.ReLU(),
                                torch.nn.Linear(256, 64)), torch.nn.Linear(64, 8))
    x = torch.randn(32, 64)

    def figures(tracker):
        tracker.track_external(model, x)
        with tracker:
            model(x).square().sum().backward()
        model.zero_grad(set_to_none=True)
        return (tracker.get_tracker_snapshot("peak"),
                {stats.mod_fqn: {state.name: [{str(d): v["Total"] for d, v in snap.items()} for snap in snaps]
                                 for state, snaps in stats.snapshots.items()}
                 for stats in tracker.memory_tracking.values()})

    ours = figures(tracking.tracker_class()(lambda name: Ledger()))
    theirs = figures(MemTracker())
    assert len(ours[1]) == 6  # the model, its four children and the inner Linear
    assert ours == theirs
