"""What %%cudamem predicts for: device specs, where fake tensors may live (never fake cuda on a build
without CUDA, whatever torch.cuda's Python functions answer), capacities, GPU generations and the
allowances with their sources."""
from __future__ import annotations

import pytest

from torchgpu_magic.cudamem import targetdevice as targets
from torchgpu_magic.cudamem.allocator import GIB, KIB, MIB
from torchgpu_magic.errors import MagicInputError


@pytest.mark.parametrize("text, size", [("80GiB", 80 * GIB), ("80 GiB", 80 * GIB), ("80GB", 80 * 10**9),
                                        ("81920MiB", 80 * GIB), ("24G", 24 * GIB), ("1.5gib", 3 * GIB // 2),
                                        ("4096", 4096), ("512k", 512 * KIB)])
def test_sizes_are_read_as_people_write_them(text, size):
    assert targets.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "eighty", "80 GiBs", "-1GiB", "0", "1e9"])
def test_a_size_that_is_not_one_is_a_one_line_error_naming_the_forms(text):
    with pytest.raises(MagicInputError) as caught:
        targets.parse_size(text)
    assert "\n" not in str(caught.value) and "80GiB" in str(caught.value) or "positive" in str(caught.value)


@pytest.mark.parametrize("text, cc", [("hopper", (9, 0)), ("Ampere", (8, 0)), ("sm_90", (9, 0)),
                                      ("sm89", (8, 9)), ("8.6", (8, 6)), ("sm_100", (10, 0))])
def test_gpu_generations_by_name_or_compute_capability(text, cc):
    assert targets.parse_arch(text) == cc


def test_an_unknown_generation_lists_the_valid_ones():
    with pytest.raises(MagicInputError, match="volta, turing, ampere, ada, hopper, blackwell"):
        targets.parse_arch("pascal-ish")


@pytest.mark.parametrize("spec, parsed", [("cuda", ("cuda", None)), (" CUDA:3 ", ("cuda", 3)),
                                          ("'cpu'", ("cpu", None))])
def test_device_specs(spec, parsed):
    assert targets.parse_device(spec) == parsed


@pytest.mark.parametrize("spec", [pytest.param("gpu", id="the-word-gpu"), "cuda:x", "cpu:1", "npu", "meta",
                                  ""])
def test_devices_it_cannot_predict_for_are_refused_in_one_line(spec):
    with pytest.raises(MagicInputError, match="it takes cpu, cuda, cuda:N, mps, xpu or xpu:N"):
        targets.parse_device(spec)


def _has_cuda_build() -> bool:
    import torch

    return bool(getattr(torch._C, "_has_cuda", False)) and torch.version.cuda is not None


def test_cpu_is_predicted_on_fake_cpu_tensors():
    target = targets.resolve_target("cpu")
    assert (target.native, target.run_on, target.how()) == (True, "cpu", "FakeTensorMode on fake cpu tensors")


@pytest.mark.skipif(_has_cuda_build(), reason="a CUDA build runs fake cuda tensors natively")
def test_without_cuda_in_the_build_cuda_is_predicted_on_cpu_whatever_torch_cuda_says(monkeypatch):
    """The rule that keeps the kernel alive reads torch's C flags, not torch.cuda's Python answers (which
    a test harness may script as an H100)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    for spec in ("cuda", "cuda:0", "cuda:7"):
        target = targets.resolve_target(spec)
        assert (target.native, target.run_on, target.kind) == (False, "cpu", "cuda")
        assert "has no CUDA" in target.why and "standing in for" in target.how()


def _cuda_build_without_a_gpu() -> bool:
    import torch

    return _has_cuda_build() and not torch.cuda.is_available()


@pytest.mark.skipif(not _cuda_build_without_a_gpu(),
                    reason="needs a CUDA build of torch whose CUDA finds no GPU (make test-cudabuild)")
def test_on_a_cuda_build_without_a_gpu_cuda_is_predicted_on_cpu_and_says_why():
    """What `pip install torch` gives a Linux machine without a GPU: the build has CUDA, its runtime sees no
    device, and fake cuda tensors would need one (torch makes a real one per fake device), so the stand-in
    runs, for the reason that holds on this build (not 'this torch has no CUDA')."""
    for spec in ("cuda", "cuda:0", "cuda:3"):
        target = targets.resolve_target(spec)
        assert (target.native, target.run_on, target.kind) == (False, "cpu", "cuda")
        assert target.why == "torch's CUDA runtime sees no GPU here" and "standing in for" in target.how()


def test_capacity_comes_from_the_device_torch_describes_and_is_unknown_for_one_it_does_not(monkeypatch):
    import torch

    class Props:
        total_memory, name, major, minor = 80 * GIB, "NVIDIA H100 80GB HBM3", 9, 0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    capacity, source, cc = targets.device_facts(targets.Target("cuda:0", "cuda", 0, "cpu", False, "x"))
    assert (capacity, cc) == (80 * GIB, (9, 0)) and "H100" in source
    assert targets.device_facts(targets.Target("cuda:3", "cuda", 3, "cpu", False, "x")) == (None, None, None)
    assert targets.device_facts(targets.resolve_target("cpu")) == (None, None, None)


def test_host_capacity_is_the_total_memory():
    import psutil

    capacity, source = targets.host_capacity()
    assert capacity == psutil.virtual_memory().total and source == "total RAM (psutil)"


def test_cublas_workspaces_per_generation_and_from_the_environment(monkeypatch):
    for name in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_CUBLASLT_UNIFIED_WORKSPACE"):
        monkeypatch.delenv(name, raising=False)
    hopper = targets.cublas_workspaces((9, 0))
    ampere = targets.cublas_workspaces((8, 0))
    unknown = targets.cublas_workspaces(None)
    assert [a.nbytes for a in hopper] == [32 * MIB, 1 * MIB]
    assert [a.nbytes for a in ampere] == [8 * MIB + 128 * KIB, 1 * MIB]
    assert unknown[0].nbytes == 32 * MIB and "unknown" in unknown[0].source
    assert all(a.in_allocator and "CublasHandlePool.cpp" in a.source for a in hopper)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1")
    [only] = targets.cublas_workspaces((9, 0))
    assert only.nbytes == 128 * KIB and ":16:8" in only.source


def test_the_cuda_context_is_a_measured_figure_with_its_source_or_the_largest_one_said_so():
    ampere = targets.cuda_context((8, 6))
    assert ampere.nbytes == 256 * MIB and "invoke-ai/InvokeAI/issues/9413" in ampere.source
    assert not ampere.in_allocator
    hopper = targets.cuda_context((9, 0))
    assert hopper.nbytes == max(n for n, _ in targets.CONTEXT_MEASURED.values())
    assert "no measured figure for hopper" in hopper.source
    assert "generation unknown" in targets.cuda_context(None).source


def test_generation_names():
    assert [targets.generation(cc) for cc in [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0),
                                              (12, 0), None]] == [
        "volta", "turing", "ampere", "ampere", "ada", "hopper", "blackwell", "blackwell", None]
