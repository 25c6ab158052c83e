"""Why torch cannot use a Mac's, an AMD or an Intel GPU (torchgpu_magic/gpus/backendcauses.py): each cause
from the facts that show it, and the fix it names. The whole report on the simulated machines is in
tests/test_simulated_machines.py."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from torchgpu_magic.gpus import backendcauses as causes
from torchgpu_magic.gpus.apple import MacFacts

M2 = MacFacts("Apple M2 Max", 32 * 2**30, "14.5", True, False)
MI300X = SimpleNamespace(name="AMD Instinct MI300X OAM", arch="gfx942")
AMD = [MI300X.name]
RX6700 = SimpleNamespace(name="AMD Radeon RX 6700 XT", arch="gfx1031")
ROCM_ARCHS = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100"]


def view(hip=None, cuda=None, available=False):
    return SimpleNamespace(version="2.13.0", hip=hip, cuda=cuda, is_available=available)


def codes(found):
    return [d.cause for d in found]


def test_a_mac_whose_gpu_torch_uses_has_no_cause():
    assert causes.mac_causes("2.13.0", True, True, M2) == []


def test_an_x86_python_under_rosetta_is_named_with_the_arm64_fix():
    rosetta = MacFacts("Apple M2 Max", 32 * 2**30, "14.5", True, True)
    (cause,) = causes.mac_causes("2.13.0", True, False, rosetta)
    assert cause.cause == "rosetta" and "arm64" in cause.fix and "Rosetta" in cause.message


def test_a_torch_without_mps_and_an_old_macos_are_both_said():
    old = MacFacts("Apple M1", 16 * 2**30, "12.1", True, False)
    found = causes.mac_causes("2.13.0", False, False, old)
    assert codes(found) == ["no_mps_build", "macos_too_old"]
    assert "12.3 or later" in found[1].message


def test_a_mac_without_a_known_cause_points_at_torchs_own_error():
    assert codes(causes.mac_causes("2.13.0", True, False, None)) == ["unknown"]


def test_a_rocm_build_on_an_nvidia_machine_and_the_reverse():
    assert codes(causes.rocm_causes(view(hip="6.4"), [], None, 2, {})) == ["rocm_build_on_nvidia"]
    (cause,) = causes.rocm_causes(view(cuda="13.0"), AMD, None, 0, {})
    assert cause.cause == "cuda_build_on_amd" and "whl/rocm" in cause.fix and "MI300X" in cause.message
    assert codes(causes.rocm_causes(view(), AMD, None, 0, {})) == ["cpu_only_build"]


def test_no_amd_gpu_names_the_driver_and_the_kfd_device():
    found = causes.rocm_causes(view(hip="6.4"), [], "amdsmi_init failed", 0, {}, "cannot open /dev/kfd")
    assert codes(found) == ["no_kfd_access", "no_amd_gpu"] and "render" in found[0].fix


def test_each_visibility_variable_that_hides_the_gpu_is_named():
    found = causes.rocm_causes(view(hip="6.4"), AMD, None, 0, {"ROCR_VISIBLE_DEVICES": "",
                                                                    "CUDA_VISIBLE_DEVICES": "1"})
    assert codes(found) == ["hidden_by_visible_devices"]
    assert "ROCR_VISIBLE_DEVICES=''" in found[0].message and "CUDA_VISIBLE_DEVICES='1'" in found[0].message
    # HIP reads CUDA_VISIBLE_DEVICES only where HIP_VISIBLE_DEVICES is unset
    found = causes.rocm_causes(view(hip="6.4"), AMD, None, 0, {"HIP_VISIBLE_DEVICES": "-1",
                                                                    "CUDA_VISIBLE_DEVICES": "0"})
    assert "CUDA_VISIBLE_DEVICES" not in found[0].message


def test_a_gfx_target_torch_has_no_kernels_for_and_the_override():
    assert causes.gfx_problem([MI300X], ROCM_ARCHS, {}) is None
    assert causes.gfx_problem([RX6700], ROCM_ARCHS, {}).cause == "unsupported_gfx"
    assert causes.gfx_problem([RX6700], ROCM_ARCHS, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}).cause == \
        "gfx_override"
    wrong = causes.gfx_problem([RX6700], ROCM_ARCHS, {"HSA_OVERRIDE_GFX_VERSION": "10.1.0"})
    assert wrong.cause == "unsupported_gfx" and "makes it gfx1010" in wrong.message
    assert "unreadable" in causes.gfx_problem([RX6700], ROCM_ARCHS, {"HSA_OVERRIDE_GFX_VERSION": "x"}).message


def test_kfd_access_is_read_from_the_device(tmp_path):
    assert causes.kfd_problem(str(tmp_path / "absent")) is None
    device = tmp_path / "kfd"
    device.write_text("")
    assert causes.kfd_problem(str(device)) is None  # this user can open it


def test_an_intel_gpu_torch_cannot_use():
    assert causes.xpu_causes("2.13.0", True, True, {}) == []
    assert codes(causes.xpu_causes("2.13.0", False, False, {})) == ["no_xpu_build"]
    assert codes(causes.xpu_causes("2.13.0", True, False, {"ZE_AFFINITY_MASK": "7"})) == [
        "hidden_by_affinity_mask"]
    (cause,) = causes.xpu_causes("2.13.0", True, False, {}, ["Intel device 8086:56a0 (i915)"])
    assert cause.cause == "no_level_zero"
    assert "the PCI bus shows Intel device 8086:56a0 (i915)" in cause.message


# ---- an AMD machine seen from its PCI bus (gpus/machine.py), without AMD SMI or NVML --------------------
AMD_IDS = "1002  Advanced Micro Devices, Inc. [AMD/ATI]\n\t74a1  Aqua Vanjaram [Instinct MI300X]\n"


def amd_machine(tmp_path, driver="amdgpu"):
    """A Linux machine whose GPU is an MI300X: AMD's vendor id, a processing accelerator (class 0x1200,
    as lspci lists MI300-series cards), bound to amdgpu or to no driver; Intel's host bridge beside it."""
    from scripted_machine import linux

    tree = linux(tmp_path).pci("0000:0c:00.0", "0x1002", "0x120000", "0x74a1", driver)
    tree.write("usr/share/misc/pci.ids", AMD_IDS)
    return tree


def test_the_pci_bus_names_amd_and_intel_gpus_and_their_drivers(tmp_path):
    from torchgpu_magic.gpus import machine

    tree = amd_machine(tmp_path).pci("0000:00:02.0", "0x8086", "0x030000", "0x56a0", "i915")
    tree.pci("0000:00:0b.0", "0x8086", "0x120000", "0x7d1d", "intel_vpu")  # an NPU: class 12h, no GPU
    here = machine.survey(str(tree.root), "Linux", "6.8.0")
    (amd,) = here.amd_gpus
    assert (amd.label(), amd.driver) == ("AMD Aqua Vanjaram [Instinct MI300X]", "amdgpu")
    assert [(g.label(), g.driver) for g in here.intel_gpus] == [("Intel device 8086:56a0", "i915")]
    assert here.nvidia_gpus == () and here.has_nvidia_gpu is False


def test_a_cuda_build_on_an_amd_machine_is_told_so_from_the_pci_bus(ip, request, tmp_path, monkeypatch,
                                                                    fake_nvml, torch_sees_gpus):
    from conftest import run

    if getattr(request.config, "_simulated_machine", None) not in (None, "h100"):
        pytest.skip("scripts a CUDA build of torch; this run simulates another backend")

    from torchgpu_magic.gpus import amdsmi, machine

    monkeypatch.setattr(machine, "ROOT", str(amd_machine(tmp_path, driver=None).root))
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # AMD SMI not installed
    amdsmi.reset()
    fake_nvml("no_library")  # no NVIDIA driver: its library is not found
    torch_sees_gpus(0)  # a CUDA 13 build, seeing no GPU
    report = run(ip, "%gpuinfo -o")
    amdsmi.reset()
    assert report.backend == "ROCm" and not report.torch_can_use_gpu
    assert [d.cause for d in report.diagnosis] == ["cuda_build_on_amd", "no_amdgpu_driver"]
    assert "AMD Aqua Vanjaram [Instinct MI300X]" in report.diagnosis[0].message
    assert "whl/rocm" in report.diagnosis[0].fix and "amdgpu" in report.diagnosis[1].message
    assert [d.name for d in report.devices] == ["AMD Aqua Vanjaram [Instinct MI300X]"]
