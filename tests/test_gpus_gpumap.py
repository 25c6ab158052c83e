"""gpumap.py: torch's view, CUDA_VISIBLE_DEVICES read as CUDA reads it, torch<->NVML mapping.

NVML is the scripted stand-in; torch's side is a TorchView built as torch_view() would build it on a
GPU machine (torch here is a CPU build), and torch_view() itself is checked against torch with its CUDA
functions monkeypatched.
"""
from __future__ import annotations

import fake_pynvml
import pytest
from conftest import bare, cuda_view

from torchgpu_magic.gpus import gpumap, nvml
from torchgpu_magic.gpus.nvml import NA

MiB = 1024 * 1024


def identities():
    return [nvml.gpu_snapshot(i, identity_only=True) for i in range(nvml.device_count())]


# ---- CUDA_VISIBLE_DEVICES parsing ---------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (None, [0, 1, 2, 3, 4, 5, 6, 7]),
    ("3,1", [3, 1]),
    ("7, 0", [7, 0]),
    ("1gpu,2ampere", [1, 2]),  # read like strtoul
    ("2,9,3", [2]),  # an out-of-range index ends the list
    ("2,-1,3", [2]),  # so does a negative one
    ("1,1", []),  # a repeated one empties it
    ("", []),
    ("-1", []),
    ("NoDevFiles", []),
])
def test_parse_indices(fake_nvml, value, expected):
    fake_nvml("eight_gpus")
    assert [i for i, _ in gpumap.parse_cuda_visible_devices(value, identities())] == expected


def test_parse_uuids_full_and_abbreviated(fake_nvml):
    fake_nvml("eight_gpus")
    gpus = identities()
    full = f"{gpus[5].uuid},{gpus[2].uuid}"
    assert gpumap.parse_cuda_visible_devices(full, gpus) == [(5, None), (2, None)]
    short = f"{gpus[6].uuid[:12]},{gpus[0].uuid[:12]}"
    assert gpumap.parse_cuda_visible_devices(short, gpus) == [(6, None), (0, None)]
    assert gpumap.parse_cuda_visible_devices("GPU-ffffffff", gpus) == []
    assert gpumap.parse_cuda_visible_devices(f"{gpus[1].uuid},3", gpus) == [(1, None)]  # no mixing


def test_parse_mig(fake_nvml):
    fake_nvml("mig")
    gpus = identities()
    migs = gpus[0].mig_devices
    assert gpumap.parse_cuda_visible_devices(None, gpus) == [(0, 0)]  # one MIG instance per process
    assert gpumap.parse_cuda_visible_devices("0", gpus) == [(0, 0)]
    assert gpumap.parse_cuda_visible_devices(migs[1].uuid, gpus) == [(0, 1)]
    assert gpumap.parse_cuda_visible_devices(f"{migs[1].uuid},{migs[0].uuid}", gpus) == [(0, 1)]
    legacy = f"MIG-{gpus[0].uuid}/2/0"
    assert gpumap.parse_cuda_visible_devices(legacy, gpus) == [(0, 1)]


# ---- gpu_map ------------------------------------------------------------------------------------

def test_gpu_map_empty_without_cuda(fake_nvml):
    fake_nvml("eight_gpus")
    assert gpumap.gpu_map(gpumap.TorchView(version="2.13.0+cpu")) == []


def test_gpu_map_reordered_by_uuid(fake_nvml, fresh_env):
    module = fake_nvml("eight_gpus")
    gpus = module.machine.gpus
    fresh_env["CUDA_VISIBLE_DEVICES"] = "3,1"
    view = cuda_view([bare(gpus[3].uuid), bare(gpus[1].uuid)])
    mapping = gpumap.gpu_map(view)
    assert [(m.torch_index, m.nvml_index, m.matched_by) for m in mapping] == [(0, 3, "uuid"), (1, 1, "uuid")]
    assert mapping[0].uuid == gpus[3].uuid and mapping[0].name == "NVIDIA A100-SXM4-80GB"


def test_gpu_map_by_uuid_ignores_position(fake_nvml, fresh_env):
    """torch's UUID wins even when CUDA_VISIBLE_DEVICES would suggest another order."""
    module = fake_nvml("eight_gpus")
    gpus = module.machine.gpus
    fresh_env["CUDA_VISIBLE_DEVICES"] = f"{gpus[7].uuid[:13]},{gpus[4].uuid}"
    mapping = gpumap.gpu_map(cuda_view([bare(gpus[7].uuid), bare(gpus[4].uuid)]))
    assert [m.nvml_index for m in mapping] == [7, 4]


def test_gpu_map_by_pci_bus_id(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")
    view = cuda_view([NA, NA])
    view.devices[0].pci_bus_id = "00000000:B7:00.0"
    view.devices[1].pci_bus_id = "0000:07:00.0"
    mapping = gpumap.gpu_map(view)
    assert [(m.nvml_index, m.matched_by) for m in mapping] == [(6, "pci_bus_id"), (0, "pci_bus_id")]


def test_gpu_map_falls_back_to_cuda_visible_devices(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")
    fresh_env["CUDA_VISIBLE_DEVICES"] = "5,2"
    mapping = gpumap.gpu_map(cuda_view([NA, NA]))
    assert [(m.nvml_index, m.matched_by) for m in mapping] == [(5, "CUDA_VISIBLE_DEVICES"),
                                                                (2, "CUDA_VISIBLE_DEVICES")]


def test_gpu_map_unmatched_stays_none(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")
    fresh_env["CUDA_VISIBLE_DEVICES"] = "0,1,2"
    mapping = gpumap.gpu_map(cuda_view([NA, NA]))  # torch sees 2, the variable names 3: no guessing
    assert [m.nvml_index for m in mapping] == [None, None]


def test_gpu_map_mig_instance(fake_nvml, fresh_env):
    module = fake_nvml("mig")
    mig = module.machine.gpus[0].migs[1]
    fresh_env["CUDA_VISIBLE_DEVICES"] = mig.uuid
    mapping = gpumap.gpu_map(cuda_view([bare(mig.uuid)]))
    assert mapping[0].nvml_index == 0 and mapping[0].mig == mig.uuid and "3g.20gb" in mapping[0].name
    # and without a UUID from torch, by the variable
    mapping = gpumap.gpu_map(cuda_view([NA]))
    found = (mapping[0].nvml_index, mapping[0].mig, mapping[0].matched_by)
    assert found == (0, mig.uuid, "CUDA_VISIBLE_DEVICES")


def test_gpu_map_without_nvml(fake_nvml):
    fake_nvml("no_library")
    mapping = gpumap.gpu_map(cuda_view(["55c4c5fd-deba-e3ab-208e-3f4ea921bff5"]))
    assert mapping[0].nvml_index is None and mapping[0].torch_index == 0



# ---- torch_view against torch itself ------------------------------------------------------------

def test_torch_view_here_does_not_touch_cuda():
    import torch

    view = gpumap.torch_view()
    assert view.version == torch.__version__
    assert view.cuda == torch.version.cuda
    if not torch.cuda.is_available():
        assert view.devices == [] and view.device_count == 0
        assert not torch.cuda.is_initialized()


def test_torch_view_reads_cuda_build(monkeypatch):
    """With torch's CUDA functions patched as a CUDA build with one GPU reports them, once CUDA is
    initialised (before that, NVML names the GPUs where it can: the next tests)."""
    import types

    import torch

    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=81559 * MiB,
                                  uuid="55c4c5fd-deba-e3ab-208e-3f4ea921bff5", pci_bus_id=0x18,
                                  pci_domain_id=0, pci_device_id=0)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 1 * MiB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 2 * MiB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: 3 * MiB)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    view = gpumap.torch_view()
    dev = view.devices[0]
    assert (view.cuda, view.cudnn, view.is_available) == ("12.8", 91002, True)
    assert (dev.name, dev.capability, dev.pci_bus_id) == ("NVIDIA H100 80GB HBM3", "9.0", "00000000:18:00.0")
    assert (dev.allocated, dev.reserved, dev.peak) == (MiB, 2 * MiB, 3 * MiB)


def test_torch_view_captures_driver_warning(monkeypatch):
    import warnings

    import torch

    def unavailable():
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old", UserWarning,
                      stacklevel=1)
        return False

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", unavailable)
    view = gpumap.torch_view()
    assert not view.is_available and "too old" in view.warnings[0]



def test_torch_failing_in_a_forked_child_becomes_notes_not_a_traceback(monkeypatch, fake_nvml, fresh_env):
    import torch

    from torchgpu_magic.gpus import inventory

    def forked(*args):
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                           "multiprocessing, you must use the 'spawn' start method")

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # as in a child forked after init
    for name in ("get_device_properties", "memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, forked)
    fake_nvml("no_driver")  # NVML cannot name the GPU: torch is asked, and fails
    view = gpumap.torch_view()
    assert [d.index for d in view.devices] == [0] and view.devices[0].name is NA
    assert any("get_device_properties failed: RuntimeError: Cannot re-initialize" in w for w in view.warnings)
    assert any("allocator figures failed" in w for w in view.warnings)
    fake_nvml("h100")
    text = inventory.build_report(view_fn=lambda: view).to_text()  # renders, with the notes
    assert "Cannot re-initialize CUDA in forked subprocess" in text
    view = gpumap.torch_view()  # where NVML names the GPU, torch is not asked at all
    assert view.named_by_nvml and view.devices[0].name == "NVIDIA H100 80GB HBM3" and not view.warnings


def test_gpus_are_named_by_nvml_without_initialising_cuda(monkeypatch, fake_nvml, fresh_env, torch_sees_gpus):
    fake_nvml("eight_gpus")
    torch_sees_gpus(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,2")
    view = gpumap.torch_view()
    assert view.named_by_nvml and [d.name for d in view.devices] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert [(d.capability, d.total_memory, d.allocated) for d in view.devices] == \
        [("8.0", 81920 * MiB, 0)] * 2
    mapping = gpumap.gpu_map(view)
    assert [(m.torch_index, m.nvml_index, m.matched_by) for m in mapping] == [
        (0, 5, "CUDA_VISIBLE_DEVICES"), (1, 2, "CUDA_VISIBLE_DEVICES")]
    from torchgpu_magic.gpus import inventory

    text = inventory.build_report(view_fn=lambda: view).to_text()
    assert "torch's GPUs are named from NVML in CUDA_VISIBLE_DEVICES order" in text


def test_a_mig_instance_is_named_by_nvml_as_the_slice(fake_nvml, fresh_env, torch_sees_gpus):
    fake_nvml("mig")
    torch_sees_gpus(1)
    view = gpumap.torch_view()
    assert view.devices[0].name == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert view.devices[0].total_memory == 19968 * MiB


def test_gpus_of_different_kinds_in_fastest_first_order_are_asked_of_torch(monkeypatch, fake_nvml,
                                                                           fresh_env, torch_sees_gpus):
    """CUDA's default FASTEST_FIRST order may put either of two different GPUs first: NVML cannot say which
    is cuda:0 then, so torch is asked (here: the stand-in that refuses), unless the order is PCI's."""
    def mixed(machine):
        machine.gpus[1] = fake_pynvml.h100(1, bus_id=machine.gpus[1].bus_id)

    fake_nvml("eight_gpus", mixed)
    torch_sees_gpus(8)
    view = gpumap.torch_view()
    assert not view.named_by_nvml and any("get_device_properties failed" in w for w in view.warnings)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    view = gpumap.torch_view()
    assert view.named_by_nvml and view.devices[1].name == "NVIDIA H100 80GB HBM3"


