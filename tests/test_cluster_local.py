"""``local``: the GPU of this process's local rank, with the decision's inputs (the GPU count and the
launcher variables) pinned so the tests hold on a GPU machine too; and the GPU-marked check that two
engines on the one GPU of a test machine are both flagged."""
from __future__ import annotations

import os

import pytest
from conftest import run

from torchgpu_magic import devices
from torchgpu_magic.errors import MagicInputError


@pytest.fixture
def no_ranks(monkeypatch):
    for name in devices.LOCAL_RANK_VARS + (devices.ORDER_VAR,):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", devices.LOCAL_RANK_VARS + (devices.ORDER_VAR,))
def test_local_rank_modulo_the_gpus_seen(no_ranks, name):
    no_ranks.setattr(devices, "_cuda_count", lambda: 4)
    no_ranks.setenv(name, "6")
    device, how = devices.local_device()
    assert str(device) == "cuda:2" and f"{name}=6" in how and "mod the 4 GPUs" in how


def test_launcher_variable_wins_over_the_cluster_order(no_ranks):
    no_ranks.setattr(devices, "_cuda_count", lambda: 8)
    no_ranks.setenv(devices.ORDER_VAR, "1")
    no_ranks.setenv("SLURM_LOCALID", "3")
    assert str(devices.local_device()[0]) == "cuda:3"


def test_no_variable_means_the_current_gpu(no_ranks):
    no_ranks.setattr(devices, "_cuda_count", lambda: 2)
    no_ranks.setattr(devices, "_current_index", lambda kind: 1)
    device, how = devices.local_device()
    assert str(device) == "cuda:1" and "no local-rank variable is set" in how and "LOCAL_RANK" in how


def test_no_gpu_means_auto(no_ranks):
    no_ranks.setattr(devices, "_cuda_count", lambda: 0)
    no_ranks.setattr(devices, "_xpu_count", lambda: 0)
    no_ranks.setattr(devices, "_mps_available", lambda: False)
    no_ranks.setenv("LOCAL_RANK", "1")
    device, how = devices.local_device()
    assert str(device) == "cpu" and how.startswith("LOCAL_RANK=1, but torch sees no CUDA or XPU GPU")
    assert str(devices.resolve("local")) == "cpu"


def test_bad_rank_is_a_one_line_error(no_ranks):
    no_ranks.setenv("LOCAL_RANK", "two")
    with pytest.raises(MagicInputError, match="LOCAL_RANK='two' is not a rank"):
        devices.local_device()


def test_ontorch_local_says_how_it_chose(ip, no_ranks, capsys):
    no_ranks.setattr(devices, "_cuda_count", lambda: 0)
    no_ranks.setattr(devices, "_xpu_count", lambda: 0)
    no_ranks.setattr(devices, "_mps_available", lambda: False)
    run(ip, "%%ontorch local\nimport torch\ny = torch.ones(2)")
    out = capsys.readouterr().out
    assert "%ontorch local: torch sees no CUDA or XPU GPU here, so local is cpu" in out
    assert "ran on cpu" in out


def test_ontorch_cluster_needs_local_and_the_line_form(ip):
    from IPython.core.error import UsageError

    for line in ("%ontorch cpu --cluster", "%ontorch --cluster"):
        result = ip.run_cell(line)
        assert isinstance(result.error_in_exec, UsageError), line


def _use_gpu() -> int:
    import os

    import torch

    torch.ones(1, device="cuda:0")  # a CUDA context on GPU 0: the engine is now in NVML's process list
    return os.getpid()


@pytest.mark.gpu
def test_two_engines_on_the_one_gpu_are_both_flagged(ip):
    """On a GPU test machine: two engines both put a tensor on cuda:0; %gpuinfo --cluster must name both
    as sharing that GPU."""
    ipp = pytest.importorskip("ipyparallel")
    cluster = ipp.Cluster(n=2, log_level=40)
    saved = os.environ.get("PYTHONPATH", "")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, saved) if p)
    try:
        rc = cluster.start_and_connect_sync()
        rc.wait_for_engines(2, timeout=120, block=True)
        rc[:].apply_sync(_use_gpu)
        ip.user_ns["rc"] = rc
        report = run(ip, "%gpuinfo --cluster rc -o")
        shared = [f for f in report.flags if f.cause == "shared_gpu"]
        assert len(shared) >= 1 and "engines 0, 1" in shared[0].message, report.to_text()
        gpu = next(g for g in report.gpus if g["engines"])
        assert gpu["engines"] == ["engine 0", "engine 1"]
    finally:
        os.environ["PYTHONPATH"] = saved
        cluster.stop_cluster_sync()
