"""gpumem/figures.py: figures from host, NVML (scripted stand-in) and torch, through the package's names."""
from __future__ import annotations

import pytest
from IPython.lib.pretty import pretty

from torchgpu_magic import gpumem as memory
from torchgpu_magic import host
from torchgpu_magic.gpus import nvml

MiB = 1024 * 1024
H100 = memory.GPUTarget(None, 0, "NVIDIA H100 80GB HBM3")


# ---- figures ---------------------------------------------------------------------------------------
def test_host_figures_are_this_process_and_the_system():
    import psutil

    figures = host.host_memory()
    assert 0 < figures.rss < figures.total
    assert 0 < figures.available <= figures.total
    assert abs(figures.rss - psutil.Process().memory_info().rss) < 64 * MiB
    assert figures.peak_rss is None or figures.peak_rss >= figures.rss - 4 * MiB


def test_snapshot_without_gpus_says_host_only():
    snap = memory.collect([])
    assert snap.gpus == ()
    assert "no GPU: host memory only" in snap.notes()
    text = pretty(snap)
    assert "RSS" in text and "no GPU: host memory only" in text
    assert "no GPU: host memory only" in snap._repr_html_()
    assert snap.to_dict()["host"]["rss"] == snap.host.rss


def test_nvml_figures_split_this_process_from_others(fake_nvml):
    fake_nvml("h100_busy")
    (g,) = memory.collect([H100]).gpus
    assert g.total == 81559 * MiB
    assert g.used == (4 + 30720 + 12288) * MiB
    assert g.process == 30720 * MiB  # our PID in NVML's list
    assert g.others == 12288 * MiB
    assert g.allocated is None and g.reserved is None  # torch cannot see this GPU
    assert g.other == 30720 * MiB  # nothing reserved by torch: all of it is context & co
    assert g.problems == ()
    row = memory.collect([H100]).table().to_text()
    assert "30.0 GiB" in row and "12.0 GiB" in row and "79.6 GiB" in row


def test_torch_side_derives_cache_and_other():
    g = memory.GPUMemory(H100, used=10 * MiB, total=100 * MiB, process=9 * MiB, others=0,
                         allocated=2 * MiB, reserved=6 * MiB, peak=3 * MiB)
    assert g.cache == 4 * MiB
    assert g.other == 3 * MiB
    d = g.to_dict()
    assert d["cache"] == 4 * MiB and d["other"] == 3 * MiB and d["nvml_index"] == 0


def test_process_in_other_pid_namespace_is_said(fake_nvml):
    fake_nvml("container")
    (g,) = memory.collect([H100]).gpus
    # NVML lists the host's PIDs: our share is unknown (not 0), and so is the others' (it includes ours)
    assert g.process is None and g.others is None and g.used == (4 + 20480 + 8192) * MiB
    assert any("PID namespace" in p and "N/A" in p for p in g.problems)


def test_a_mig_target_is_measured_on_its_slice(fake_nvml):
    fake_nvml("mig_user")
    slice_uuid = nvml.gpu_snapshot(0).mig_devices[1].uuid
    (g,) = memory.collect([memory.GPUTarget(0, 0, "MIG 3g.20gb", slice_uuid)]).gpus
    assert g.total == 19968 * MiB and g.used == (13 + 2048) * MiB
    assert g.others == 0 or g.others is None  # the slice's one process reports no memory without root


def test_process_list_refused_gives_na_and_hint(fake_nvml):
    fake_nvml("no_permission")
    (g,) = memory.collect([H100]).gpus
    assert g.process is None and g.others is None and g.other is None
    assert g.used == 4 * MiB
    assert any("permission" in p for p in g.problems)


def test_nvml_unavailable_is_a_status_not_an_error(fake_nvml):
    fake_nvml("no_driver")
    snap = memory.collect([H100])
    assert snap.status and "NVML" in snap.status[0]
    assert snap.gpus[0].used is None


def test_cuda_never_initialised_by_sampling():
    import torch

    before = torch.cuda.is_initialized()
    memory.collect([memory.GPUTarget(0, None, "x")])
    assert torch.cuda.is_initialized() == before


@pytest.mark.gpu
def test_figures_agree_with_torch_the_driver_and_nvidia_smi_on_a_real_gpu():
    """Each figure against a source of its own: torch's allocator, CUDA's cudaMemGetInfo (the driver's
    view, through torch), the growth NVML sees for a known allocation, and nvidia-smi where it is there."""
    import os
    import shutil
    import subprocess

    import torch

    from torchgpu_magic.gpus import inventory

    mapping = inventory.gpu_map()[0]
    index = mapping.torch_index
    target = memory.GPUTarget(index, mapping.nvml_index, mapping.name, mapping.mig)
    torch.zeros(1, device=f"cuda:{index}")
    torch.cuda.synchronize(index)
    torch.cuda.empty_cache()
    (before,) = memory.collect([target]).gpus
    # 256 MiB more than torch's cache holds free (earlier tests of this process leave blocks cached in
    # segments they still use, which empty_cache keeps): the tensor must come from the driver
    size = 256 * MiB + before.reserved - before.allocated
    x = torch.empty(size, dtype=torch.uint8, device=f"cuda:{index}")
    torch.cuda.synchronize(index)
    (g,) = memory.collect([target]).gpus
    assert g.allocated == torch.cuda.memory_allocated(index) >= x.numel()
    assert g.reserved == torch.cuda.memory_reserved(index)
    grown = g.reserved - before.reserved
    assert grown >= size  # a new segment from the driver
    free, total = torch.cuda.mem_get_info(index)  # the driver's figures, not NVML's
    assert abs(g.total - total) <= 0.02 * total  # NVML's total counts memory the driver keeps back
    assert abs((g.used - before.used) - grown) <= 32 * MiB  # NVML saw the new segment arrive
    if g.process is not None:  # NVML lists this PID (not in a container with its own PID namespace)
        assert abs((g.process - before.process) - grown) <= 32 * MiB
        assert g.process >= g.reserved  # context and libraries come on top of torch's reservation
    if shutil.which("nvidia-smi") and not mapping.mig:
        smi = subprocess.run(["nvidia-smi", f"--id={mapping.nvml_index}", "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True,
                             timeout=60).stdout
        assert abs(g.used / MiB - int(smi.strip())) <= 64, (g.used, smi, os.getpid())


@pytest.mark.gpu
def test_gpu_one_gib_tensor_figures_and_the_context_on_top():
    # a fresh process: allocated must be exactly the tensor, and the context must be ours alone
    from fresh_process import run_fresh

    done = run_fresh(
        "from torchgpu_magic import accelerators, gpumem as memory\nfrom torchgpu_magic.gpus import gpumap\n"
        "x = torch.empty(2**30, dtype=torch.uint8, device='cuda')\ntorch.cuda.synchronize()\n"
        "m = gpumap.gpu_map()[0]\n"
        "target = memory.GPUTarget(m.torch_index, m.nvml_index, '', m.mig)\n"
        "(g,) = memory.collect([target]).gpus\n"
        "assert g.allocated == 2**30, g.allocated\n"
        "assert 0 <= g.reserved - 2**30 <= 20 * 2**20, g.reserved\n"
        "# where NVML does not list this PID (a container with its own PID namespace) this process's share\n"
        "# is N/A (None): the GPU's used memory must drop by the tensor instead\n"
        "if g.process is not None:\n"
        "    assert 250 * 2**20 <= g.process - g.reserved <= 2**30, (g.process, g.reserved)\n"
        "del x\nassert accelerators.empty_cache()\n"
        "(after,) = memory.collect([target]).gpus\n"
        "if g.process is not None:\n"
        "    assert after.process <= g.process - 2**30 + 20 * 2**20, (after.process, g.process)\n"
        "assert after.used <= g.used - 2**30 + 20 * 2**20, (after.used, g.used)\n"
        "print('OK')\n")
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
