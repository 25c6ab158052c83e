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


# ---- the cluster report from the engines' answers (what remote.gpuinfo sends, scripted) ----------------

def _gpu_entry(nvml_index, torch_index, uuid, processes=(), reserved=None):
    snapshot = {"uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "memory_used": 2 << 30,
                "memory_total": 80 << 30, "utilization_gpu": 0} if nvml_index is not None else None
    return {"nvml_index": nvml_index, "torch_index": torch_index, "snapshot": snapshot, "mapping": None,
            "processes": [{"pid": pid, "name": "python", "used_memory": used} for pid, used in processes],
            "torch": {"name": "NVIDIA H100 80GB HBM3", "reserved": reserved}}


def _answer(label, host, pid, gpus, current=0):
    """An engine's answer: this process's own ``remote.gpuinfo()`` with the GPUs replaced."""
    from torchgpu_magic.cluster import remote
    from torchgpu_magic.cluster.bridge import Reply

    value = remote.gpuinfo()
    value.update(gpus=gpus, current_device=current)
    return Reply(label, label, True, value=value, host=host, pid=pid)


def test_stray_contexts_are_summed_per_host():
    """Each host's stray-context flag counts the contexts on that host's GPU 0 only: an engine on another
    host with a stray context on its own GPU 0 is not in this host's sum."""
    from torchgpu_magic.cluster import gpus

    replies = []
    for host, used in (("node-a", 500 << 20), ("node-b", 300 << 20)):
        for rank, pid in enumerate((100, 101)):
            held = [(pid, 4 << 30)] if rank == 0 else [(pid, used)]  # rank 1 also works on GPU 1
            entries = [_gpu_entry(0, 0, f"GPU-{host}-0", held, reserved=(4 << 30) if rank == 0 else 0),
                       _gpu_entry(1, 1, f"GPU-{host}-1", [(pid, 4 << 30)] if rank == 1 else [],
                                  reserved=(4 << 30) if rank == 1 else 0)]
            replies.append(_answer(f"engine {len(replies)}", host, pid, entries, current=rank))
    report = gpus.build("rc", "ipyparallel", replies)
    flags = [f for f in report.flags if f.cause == "stray_contexts"]
    assert len(flags) == 2, report.to_text()
    by_host = {("node-a" if "node-a" in f.message else "node-b"): f.message for f in flags}
    assert "500 MiB in all" in by_host["node-a"], by_host["node-a"]
    assert "300 MiB in all" in by_host["node-b"], by_host["node-b"]


def test_without_nvml_an_engine_is_on_its_current_gpu():
    """With no NVML (every NVML index None), an engine seeing two GPUs is placed on torch's current one,
    cuda:1 here, not on whichever GPU came last in its answer."""
    from torchgpu_magic.cluster import gpus

    entries = [_gpu_entry(None, 0, None), _gpu_entry(None, 1, None)]
    report = gpus.build("rc", "ipyparallel", [_answer("engine 0", "node-a", 100, entries, current=0),
                                              _answer("engine 1", "node-a", 101, entries, current=1)])
    on = {row["label"]: row["on"] for row in report.engines}
    assert on == {"engine 0": ["cuda:0"], "engine 1": ["cuda:1"]}, on
