"""The CUDA memory paths on the simulated H100 that allocates (tests/simulated_allocator.py): torch's
figures moving as its caching allocator moves them, torch's own out-of-memory message, and through a real
InteractiveShell the out-of-memory explanation (in a container, where NVML lists this process under a host
PID), ``%gpumem holders``' rows, ``%gpumem free``'s figure and a measured ``%%cudamem cuda``.

These run in every leg (the fixture installs the simulation for the test, or resets the session's under
``--simulate-gpu``). CUDA tensors are stand-ins (:class:`simulated_gpu.CudaStandIn`): real metadata on
``cuda:0``, each storage a block of the simulated allocator, no values. What a real GPU adds (its
kernels, its driver's own allocations) is the `gpu` tests' (tests/test_oom.py, docs/gpu-validation.md).
"""
from __future__ import annotations

import re

import pytest
from conftest import run
from IPython.core.formatters import PlainTextFormatter
from IPython.utils.capture import capture_output

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3
TOTAL = 81008 * MiB  # what torch 2.13 reports as an H100 80GB HBM3's total_memory (simulated_gpu.Properties)
CONTEXT = 522 * MiB  # the scenarios' CUDA context


@pytest.fixture
def gpu(ip, simulated_gpu):
    """The shell and the simulated GPU, from a clean slate: what an earlier test's failed cell left in
    IPython's traceback (and the stand-ins its frames hold) let go of first, so this test's figures are
    its own."""
    import gc

    ip.run_line_magic("gpumem", "free -o")
    gc.collect()
    simulated_gpu.use_scenario("alone")
    return simulated_gpu


def standin(sim, nbytes, name=None, ip=None):
    """A float32 CUDA stand-in of ``nbytes`` (a multiple of 4), bound to ``name`` in the shell if given."""
    import simulated_gpu
    import torch

    tensor = simulated_gpu.cuda_standin(sim, (nbytes // 4,), torch.float32, 1e-6)
    if ip is not None:
        ip.user_ns[name] = tensor
    return tensor


def explanation(ip, code):
    """The explanation a failing cell printed above its traceback (as tests/test_oom.py reads it)."""
    with capture_output() as captured:
        result = ip.run_cell(code, store_history=True)
    assert result.error_in_exec is not None
    text = captured.stdout
    assert text.startswith("gpumem: out of memory on "), text
    return result.error_in_exec, re.split(r"^-{20,}$", text, maxsplit=1, flags=re.M)[0].rstrip("\n")


# ---- the simulation answers as torch's allocator does --------------------------------------------------
def test_the_allocator_moves_torchs_figures_as_its_cpp_does(simulated_gpu):
    import torch

    tiny = standin(simulated_gpu, 12)  # rounded to 512 bytes, in a 2 MiB segment of the small pool
    assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (512, 2 * MiB)
    assert torch.cuda.memory_stats()["requested_bytes.all.current"] == 12
    mid = standin(simulated_gpu, 5 * MiB)  # between 1 and 10 MiB: a 20 MiB segment, split
    assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (5 * MiB + 512, 22 * MiB)
    big = standin(simulated_gpu, GiB + 4)  # above 10 MiB: its own segment, rounded to 2 MiB
    assert torch.cuda.memory_reserved() == 22 * MiB + GiB + 2 * MiB
    assert torch.cuda.mem_get_info() == (TOTAL - CONTEXT - torch.cuda.memory_reserved(), TOTAL)
    peak = torch.cuda.max_memory_allocated()
    del mid  # back to torch's cache, not to the device
    assert torch.cuda.memory_allocated() == peak - 5 * MiB and torch.cuda.max_memory_allocated() == peak
    again = standin(simulated_gpu, 4 * MiB)  # served from the cached 20 MiB segment
    assert torch.cuda.memory_reserved() == 22 * MiB + GiB + 2 * MiB
    del again
    torch.cuda.empty_cache()  # the 20 MiB segment has nothing allocated: it goes back
    assert torch.cuda.memory_reserved() == 2 * MiB + GiB + 2 * MiB
    blocks = [b for s in torch.cuda.memory_snapshot() for b in s["blocks"]
              if b["state"] == "active_allocated"]
    assert sorted(b["requested_size"] for b in blocks) == [12, GiB + 4]
    del tiny, big


def test_an_allocation_the_device_cannot_hold_raises_torchs_own_error(simulated_gpu):
    import torch

    from torchgpu_magic.explain.oomerror import oom_facts

    held = standin(simulated_gpu, 70 * GiB)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        standin(simulated_gpu, 10 * GiB)
    message = str(caught.value)
    assert message.startswith("CUDA out of memory. Tried to allocate 10.00 GiB. GPU 0 has a total capacity "
                              "of 79.11 GiB of which ")
    assert "Including non-PyTorch memory, this process has 70.51 GiB memory in use." in message
    facts = oom_facts(caught.value)
    assert (facts.device, facts.asked) == ("cuda:0", 10 * GiB)
    assert facts.total == pytest.approx(TOTAL, abs=0.01 * GiB)  # printed as 79.11 GiB
    assert facts.allocated == 70 * GiB and facts.cached == 0
    assert torch.cuda.memory_stats()["num_ooms"] == 1
    del held


def test_nvml_follows_the_device_and_lists_this_process_as_the_scenario_says(simulated_gpu):
    import os

    from torchgpu_magic.gpus import nvml

    kept = standin(simulated_gpu, GiB)
    procs, _ = nvml.processes(0)
    assert [(p.pid, p.used_memory) for p in procs] == [(os.getpid(), CONTEXT + GiB)]
    simulated_gpu.use_scenario("container")
    kept = standin(simulated_gpu, GiB)
    procs, _ = nvml.processes(0)
    assert [(p.pid, p.used_memory) for p in procs] == [(21422, CONTEXT + GiB)]
    used, _ = nvml.memory(0)
    assert used == 4 * MiB + CONTEXT + GiB
    del kept


# ---- the out-of-memory explanation (issue 28 item 1) ------------------------------------------------------
STEP = "def step(x, w):\n    h = x @ w\n    wide = h.repeat(1024, 1)\n    return wide\nout = step(x, w)"


def _model(ip, sim):
    """x (16 GiB) and w (4 GiB) on the GPU; step() makes h (16 MiB) then asks 16 GiB more."""
    import simulated_gpu
    import torch

    run(ip, "import torch")
    ip.user_ns["x"] = simulated_gpu.cuda_standin(sim, (4096, 1024 * 1024), torch.float32, 1e-6)
    ip.user_ns["w"] = simulated_gpu.cuda_standin(sim, (1024 * 1024, 1024), torch.float32, 1e-6)


def test_in_a_container_this_kernel_is_never_called_another_process(ip, gpu):
    """NVML lists the host's PIDs (this kernel as 3736537, an inference engine as 3955547): the old
    explanation advised "other processes hold 70 GiB of cuda:0 (pid 3736537, pid 3955547): stop them",
    this kernel among them."""
    gpu.use_scenario("container_shared")
    _model(ip, gpu)
    error, text = explanation(ip, STEP)
    assert type(error).__name__ == "OutOfMemoryError" and "Process 3736537 has" in str(error)
    assert text.startswith("gpumem: out of memory on cuda:0: asked 16.0 GiB; ")
    assert "stop them" not in text and "another process" not in text
    assert re.search(r"^\s+outside torch's allocator\s+50\.0 GiB\s+unknown \(NVML\)", text, re.M), text
    assert re.search(r"^\s+x \(also step: x\)\s+16\.0 GiB\s+your name", text, re.M)
    assert re.search(r"^\s+step: h\s+16\.0 MiB\s+a traceback", text, re.M)
    assert "NVML lists 2 processes under the host's PIDs (3736537 20.6 GiB, 3955547 49.5 GiB)" in text
    advice = text.split("What to do, largest first:\n")[1].splitlines()
    assert advice[0].startswith("  1. up to 50.0 GiB of cuda:0 is held outside torch here, by this process's "
                                "CUDA context and other processes: NVML lists 2 under the host's PIDs")
    assert "cannot tell which is this kernel" in advice[0]
    assert max(len(line) for line in text.splitlines() if line.startswith("  ") and "  " in line[2:]) <= 100


def test_on_the_host_another_process_is_named_and_the_kernel_alone_in_a_container_is_this_one(ip, gpu):
    gpu.use_scenario("shared")
    _model(ip, gpu)
    _, text = explanation(ip, STEP.replace("1024, 1", "4096, 1"))  # 64 GiB of the 46.6 GiB left
    assert re.search(r"^\s+pid 4190001\s+12\.0 GiB\s+another process", text, re.M), text
    assert "other processes hold 12.0 GiB of cuda:0 (pid 4190001): stop them, or use another GPU" in text
    ip.run_line_magic("gpumem", "free -o")
    ip.user_ns.pop("x"), ip.user_ns.pop("w")
    gpu.use_scenario("container")  # alone, under its host PID: the one process listed is this one
    _model(ip, gpu)
    _, text = explanation(ip, STEP.replace("1024, 1", "4096, 1"))  # 64 GiB
    assert "another process" not in text and "stop them" not in text and "up to" not in text
    assert "NVML lists one process, under the host's PID 21422: this one" in " ".join(text.split())


def test_on_a_mig_slice_the_slices_figures_and_nvml_without_per_process_memory(ip, gpu):
    """A MIG 3g.40gb slice of the H100, shared with another job: torch sees the slice (39.25 GiB), NVML
    lists the slice's processes without their memory (a user without privileges), so what others hold
    is bounded, never "0 B" and never "stop them"."""
    import torch

    gpu.use_scenario("mig")
    run(ip, "import torch")
    ip.user_ns["x"] = standin(gpu, 30 * GiB)
    error, text = explanation(ip, "y = x.repeat(2)")  # 60 GiB: more than the slice has
    assert torch.cuda.get_device_properties(0).name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert text.startswith("gpumem: out of memory on cuda:0: asked 60.0 GiB; ")
    assert "of 39.2 GiB" in text.splitlines()[0]
    assert "the request alone (60.0 GiB) is more than cuda:0" in text
    _, text = explanation(ip, "y = x.narrow(0, 0, 2 ** 28).clone()")  # 1 GiB: the other job's 8 GiB there
    flat = " ".join(text.split())
    assert "stop them" not in text and "another process" not in text
    assert "1 other process (4190003) NVML lists here without their memory (MIG mode" in flat
    assert "up to 8.51 GiB of cuda:0 is held outside torch here" in flat
    assert "NVML lists 2 processes here without their memory" in flat  # the note: what NVML cannot say


# ---- %gpumem holders: torch's own memory is not "no name reaches" (issue 28 item 11) ----------------
def test_rounding_and_cublas_workspaces_are_torchs_and_the_rest_is_unreached(ip, gpu):
    import simulated_allocator

    _model(ip, gpu)
    run(ip, "h = x @ w")  # the first matrix product: cuBLAS's 32 MiB workspace
    ip.user_ns["small"] = standin(gpu, 12)  # 500 bytes of rounding
    hidden = standin(gpu, 3 * MiB)  # held where no name reaches (this test's local)
    report = run(ip, "%gpumem holders cuda:0 -o")
    rows = {r.name: r for r in report.section("cuda:0").rows}
    assert rows["cuBLAS workspaces"].nbytes == simulated_allocator.CUBLAS_WORKSPACE_SM90
    assert rows["torch's rounding"].nbytes == 500
    assert rows["no name reaches"].nbytes == 3 * MiB
    assert rows["h"].nbytes == 16 * MiB and rows["outside torch's allocator"].nbytes == CONTEXT
    text = PlainTextFormatter()(report)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    del hidden


# ---- %gpumem free: what the GPU got back (issue 28 item 5) -----------------------------------------------
def test_free_gives_back_what_the_cache_held_counted_once(ip, gpu):
    """10 GiB released by the traceback and 11 GiB already cached: the GPU gets 21 GiB back (torch's
    reserved memory falls 21 GiB). The old report added the 10 GiB twice: "gave back 31.0 GiB"."""
    import torch

    run(ip, "import torch")
    ip.user_ns["make"] = lambda size: standin(gpu, size)
    with capture_output():
        ip.run_cell("def step():\n    acts = make(10 * 2**30)\n    tmp = make(11 * 2**30)\n    del tmp\n"
                    "    raise ValueError('a bug after the forward')\nstep()")
    reserved = torch.cuda.memory_reserved()
    assert reserved == 21 * GiB
    report = run(ip, "%gpumem free -o")
    assert report.total()["cuda:0"] == 21 * GiB and torch.cuda.memory_reserved() == 0
    assert report.nvml["cuda:0"] == 21 * GiB  # NVML's figure for this process fell as much
    steps = {s.source: s for s in report.steps}
    assert steps["the last error's traceback"].freed["cuda:0"] == 10 * GiB
    assert steps["torch's cache"].freed["cuda:0"] == 21 * GiB
    text = report.to_text()
    assert text.startswith("%gpumem free: gave back 21.0 GiB on cuda:0")
    assert "released 10.0 GiB on cuda:0 into torch's cache" in text
    assert "torch's cache (torch.cuda.empty_cache()): gave back 21.0 GiB on cuda:0" in text


def test_holders_ask_nothing_that_creates_a_context(ip, gpu):
    """cudaMemGetInfo creates the context it answers from: %gpumem holders after torch.cuda.init(),
    before anything ran on the GPU, must not create one (hundreds of MiB) to say what is free."""
    import torch

    torch.cuda.init()
    report = run(ip, "%gpumem holders cuda:0 -o")
    assert not torch._C._cuda_hasPrimaryContext(0)
    assert any("no CUDA context on cuda:0 yet" in note for note in report.section("cuda:0").notes())


# ---- %%cudamem measured on the GPU -----------------------------------------------------------------
def test_a_measured_cudamem_on_the_gpu_agrees_with_torchs_own_peak(ip, gpu):
    """%%cudamem cuda runs the cell under torch's MemTracker; its peak (a model of the caching allocator
    over the storages MemTracker sees) is set beside torch's own max_memory_allocated, which the
    simulated allocator keeps from the blocks it hands out."""
    _model(ip, gpu)
    run(ip, "h = x @ w")  # the first matrix product's workspace: not the cell's
    measured = run(ip, "%%cudamem cuda -o -q\ng = h.relu()\ny = (g * 2).sum()\ndel g")
    assert measured.device == "cuda:0" and measured.mode == "measured"
    grew = measured.torch_max_allocated - measured.torch_allocated_before
    assert grew == 2 * 16 * MiB + 512  # g, g * 2 and the sum's 512-byte block, as the allocator counts
    assert measured.peak - measured.before == grew  # MemTracker's ledger over the cell's own tensors
    assert measured.categories["activations"] == grew
    assert measured.capacity == TOTAL


# ---- the `gpu` tests' own checks can fail (issue 28 item 12) ----------------------------------------
@pytest.mark.parametrize("scenario", ["alone", "container", "container_shared"])
def test_the_no_context_check_sees_a_context_also_where_nvml_lists_host_pids(simulated_gpu, scenario):
    """tests/test_no_context.py asks NVML whether a step put this process on a GPU. It compared NVML's
    PIDs with this one's, which in a container without --pid=host never match: the check passed whatever
    the step did. fresh_process.listed_here takes a process NVML did not list before the step as this one
    there."""
    from fresh_process import listed_here, nvml_entries

    simulated_gpu.use_scenario(scenario)
    baseline = nvml_entries()
    assert listed_here(baseline, nvml_entries()) == []  # no context yet: nothing to find
    kept = standin(simulated_gpu, MiB)  # cudaMalloc creates the context: NVML lists the process
    assert listed_here(baseline, nvml_entries()) == [0]
    del kept


def test_where_nvml_lists_only_others_under_host_pids_they_are_others(ip, gpu):
    """This process not in NVML's list at all, another job's under its host PID: what NVML lists holds
    less than torch reserves here, so it is not this process; it is named as another."""
    gpu.use_scenario("hidden")
    _model(ip, gpu)
    _, text = explanation(ip, STEP.replace("1024, 1", "4096, 1"))  # 64 GiB of the 50.5 GiB left
    flat = " ".join(text.split())
    assert re.search(r"^\s+pid 4190002\s+8\.00 GiB\s+another process", text, re.M), text
    assert "this process is not in NVML's list and the process it lists (4190002) are others" in flat
    assert "outside torch's allocator" in text and "this process's CUDA context and libraries'" in flat
