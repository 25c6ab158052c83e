"""%gpuinfo's report: torch<->NVML mapping under CUDA_VISIBLE_DEVICES, each diagnosis cause, rendering.

NVML is the scripted stand-in; torch's side is a TorchView built as torch_view() would build it on a
GPU machine (torch here is a CPU build), and torch_view() itself is checked against torch with its CUDA
functions monkeypatched.
"""
from __future__ import annotations

import json
import os

import pytest

from torchgpu_magic import inventory as inv
from torchgpu_magic import nvml
from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.nvml import NA

MiB = 1024 * 1024


def cuda_view(uuids=(), cuda="12.8", **kw):
    """What torch_view() returns on a CUDA build seeing these GPUs (torch prints UUIDs without 'GPU-')."""
    devices = [inv.TorchDevice(i, name="gpu", uuid=u, total_memory=80 * 1024 * MiB, allocated=0,
                               reserved=0, peak=0) for i, u in enumerate(uuids)]
    return inv.TorchView(version=f"2.8.0+cu{cuda.replace('.', '')}", cuda=cuda, cudnn=91002,
                         is_available=bool(devices), device_count=len(devices), devices=devices, **kw)


def bare(uuid):
    return uuid.split("-", 1)[1]


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
    assert [i for i, _ in inv.parse_cuda_visible_devices(value, identities())] == expected


def test_parse_uuids_full_and_abbreviated(fake_nvml):
    fake_nvml("eight_gpus")
    gpus = identities()
    full = f"{gpus[5].uuid},{gpus[2].uuid}"
    assert inv.parse_cuda_visible_devices(full, gpus) == [(5, None), (2, None)]
    short = f"{gpus[6].uuid[:12]},{gpus[0].uuid[:12]}"
    assert inv.parse_cuda_visible_devices(short, gpus) == [(6, None), (0, None)]
    assert inv.parse_cuda_visible_devices("GPU-ffffffff", gpus) == []
    assert inv.parse_cuda_visible_devices(f"{gpus[1].uuid},3", gpus) == [(1, None)]  # no mixing


def test_parse_mig(fake_nvml):
    fake_nvml("mig")
    gpus = identities()
    migs = gpus[0].mig_devices
    assert inv.parse_cuda_visible_devices(None, gpus) == [(0, 0)]  # one MIG instance per process
    assert inv.parse_cuda_visible_devices("0", gpus) == [(0, 0)]
    assert inv.parse_cuda_visible_devices(migs[1].uuid, gpus) == [(0, 1)]
    assert inv.parse_cuda_visible_devices(f"{migs[1].uuid},{migs[0].uuid}", gpus) == [(0, 1)]
    legacy = f"MIG-{gpus[0].uuid}/2/0"
    assert inv.parse_cuda_visible_devices(legacy, gpus) == [(0, 1)]


# ---- gpu_map ------------------------------------------------------------------------------------

def test_gpu_map_empty_without_cuda(fake_nvml):
    fake_nvml("eight_gpus")
    assert inv.gpu_map(inv.TorchView(version="2.13.0+cpu")) == []


def test_gpu_map_reordered_by_uuid(fake_nvml, fresh_env):
    module = fake_nvml("eight_gpus")
    gpus = module.machine.gpus
    fresh_env["CUDA_VISIBLE_DEVICES"] = "3,1"
    view = cuda_view([bare(gpus[3].uuid), bare(gpus[1].uuid)])
    mapping = inv.gpu_map(view)
    assert [(m.torch_index, m.nvml_index, m.matched_by) for m in mapping] == [(0, 3, "uuid"), (1, 1, "uuid")]
    assert mapping[0].uuid == gpus[3].uuid and mapping[0].name == "NVIDIA A100-SXM4-80GB"


def test_gpu_map_by_uuid_ignores_position(fake_nvml, fresh_env):
    """torch's UUID wins even when CUDA_VISIBLE_DEVICES would suggest another order."""
    module = fake_nvml("eight_gpus")
    gpus = module.machine.gpus
    fresh_env["CUDA_VISIBLE_DEVICES"] = f"{gpus[7].uuid[:13]},{gpus[4].uuid}"
    mapping = inv.gpu_map(cuda_view([bare(gpus[7].uuid), bare(gpus[4].uuid)]))
    assert [m.nvml_index for m in mapping] == [7, 4]


def test_gpu_map_by_pci_bus_id(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")
    view = cuda_view([NA, NA])
    view.devices[0].pci_bus_id = "00000000:B7:00.0"
    view.devices[1].pci_bus_id = "0000:07:00.0"
    mapping = inv.gpu_map(view)
    assert [(m.nvml_index, m.matched_by) for m in mapping] == [(6, "pci_bus_id"), (0, "pci_bus_id")]


def test_gpu_map_falls_back_to_cuda_visible_devices(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")
    fresh_env["CUDA_VISIBLE_DEVICES"] = "5,2"
    mapping = inv.gpu_map(cuda_view([NA, NA]))
    assert [(m.nvml_index, m.matched_by) for m in mapping] == [(5, "CUDA_VISIBLE_DEVICES"),
                                                                (2, "CUDA_VISIBLE_DEVICES")]


def test_gpu_map_unmatched_stays_none(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")
    fresh_env["CUDA_VISIBLE_DEVICES"] = "0,1,2"
    mapping = inv.gpu_map(cuda_view([NA, NA]))  # torch sees 2, the variable names 3: no guessing
    assert [m.nvml_index for m in mapping] == [None, None]


def test_gpu_map_mig_instance(fake_nvml, fresh_env):
    module = fake_nvml("mig")
    mig = module.machine.gpus[0].migs[1]
    fresh_env["CUDA_VISIBLE_DEVICES"] = mig.uuid
    mapping = inv.gpu_map(cuda_view([bare(mig.uuid)]))
    assert mapping[0].nvml_index == 0 and mapping[0].mig == mig.uuid and "3g.20gb" in mapping[0].name
    # and without a UUID from torch, by the variable
    mapping = inv.gpu_map(cuda_view([NA]))
    found = (mapping[0].nvml_index, mapping[0].mig, mapping[0].matched_by)
    assert found == (0, mig.uuid, "CUDA_VISIBLE_DEVICES")


def test_gpu_map_without_nvml(fake_nvml):
    fake_nvml("no_library")
    mapping = inv.gpu_map(cuda_view(["55c4c5fd-deba-e3ab-208e-3f4ea921bff5"]))
    assert mapping[0].nvml_index is None and mapping[0].torch_index == 0


# ---- diagnosis ----------------------------------------------------------------------------------

def causes(report):
    return [d.cause for d in report.diagnosis]


def test_cpu_only_build_with_gpus_present(fake_nvml, fresh_env):
    fake_nvml("h100")
    report = inv.build_report(view_fn=lambda: inv.TorchView(version="2.13.0+cpu"))
    assert causes(report) == ["cpu_only_build"]
    message = report.diagnosis[0].message
    assert "CPU-only" in message and "NVIDIA H100 80GB HBM3" in message
    assert "CUDA build of torch would use" in message
    assert "13.0" in report.diagnosis[0].fix
    assert report.gpus[0].torch_index is None and report.gpus[0].nvml_index == 0


def test_cpu_only_build_without_driver(fake_nvml, fresh_env):
    fake_nvml("no_library")
    report = inv.build_report(view_fn=lambda: inv.TorchView(version="2.13.0+cpu"))
    assert causes(report) == ["cpu_only_build", "no_driver"]
    assert "would use" not in report.diagnosis[0].message


@pytest.mark.parametrize("scenario", ["no_library", "no_driver", "mismatch"])
def test_no_driver(fake_nvml, fresh_env, scenario):
    fake_nvml(scenario)
    report = inv.build_report(view_fn=lambda: cuda_view([]))
    assert causes(report) == ["no_driver"]
    assert report.diagnosis[0].fix == nvml.status().hint


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles", "GPU-ffffffff"])
def test_cuda_visible_devices_hides_all(fake_nvml, fresh_env, value):
    fake_nvml("eight_gpus")
    fresh_env["CUDA_VISIBLE_DEVICES"] = value
    report = inv.build_report(view_fn=lambda: cuda_view([]))
    assert causes(report) == ["hidden_by_cuda_visible_devices"]
    assert repr(value) in report.diagnosis[0].message and "8 NVIDIA GPUs" in report.diagnosis[0].message


def test_driver_older_than_torch_cuda(fake_nvml, fresh_env):
    fake_nvml("old_driver")
    view = cuda_view([], cuda="12.8")
    view.warnings = ["CUDA initialization: The NVIDIA driver on your system is too old (found 11040)."]
    report = inv.build_report(view_fn=lambda: view)
    assert causes(report) == ["driver_too_old"]
    assert "470.256.02" in report.diagnosis[0].message and "12.8" in report.diagnosis[0].message
    assert any("too old" in n for n in report._notes())


def test_same_major_is_not_too_old(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")  # driver supports 12.8
    report = inv.build_report(view_fn=lambda: cuda_view([], cuda="12.9"))
    assert "driver_too_old" not in causes(report)
    assert causes(report) == ["unknown"]


def test_other_accelerator(fake_nvml, fresh_env):
    fake_nvml("no_library")
    view = inv.TorchView(version="2.13.0", other_accelerators=["mps"])
    report = inv.build_report(view_fn=lambda: view)
    assert "other_accelerator" in causes(report)
    assert "'mps'" in report.diagnosis[-1].fix


def test_no_diagnosis_when_torch_has_a_gpu(fake_nvml, fresh_env):
    module = fake_nvml("h100")
    report = inv.build_report(view_fn=lambda: cuda_view([bare(module.machine.gpus[0].uuid)]))
    assert report.diagnosis == [] and report.torch_can_use_gpu
    assert report.gpus[0].torch_index == 0 and report.gpus[0].nvml_index == 0


# ---- processes, selection, rendering ------------------------------------------------------------

def test_own_process_marked(fake_nvml, fresh_env):
    fake_nvml("h100_busy")
    report = inv.build_report(view_fn=lambda: cuda_view([]))
    own = [p for p in report.gpus[0].processes if p.is_self]
    assert [p.pid for p in own] == [os.getpid()]
    assert not report.gpus[0].host_pids
    assert "<- this kernel" in report.to_text()


def test_container_host_pids_noted(fake_nvml, fresh_env):
    fake_nvml("container")
    report = inv.build_report(view_fn=lambda: cuda_view([]))
    assert report.gpus[0].host_pids
    assert "host PIDs" in report.to_text()


def test_no_permission_process_note(fake_nvml, fresh_env):
    fake_nvml("no_permission")
    report = inv.build_report(view_fn=lambda: cuda_view([]))
    assert report.gpus[0].process_problem.code == "no_permission"
    assert "process list incomplete" in report.to_text()


def test_no_processes_option(fake_nvml, fresh_env):
    module = fake_nvml("h100_busy")
    report = inv.build_report(show_processes=False, view_fn=lambda: cuda_view([]))
    assert report.gpus[0].processes == []
    assert "nvmlDeviceGetComputeRunningProcesses" not in module.calls
    assert "Processes" not in report.to_text()


def test_index_selects_torch_index_and_rejects_others(fake_nvml, fresh_env):
    module = fake_nvml("eight_gpus")
    gpus = module.machine.gpus
    fresh_env["CUDA_VISIBLE_DEVICES"] = "6,2"
    view = cuda_view([bare(gpus[6].uuid), bare(gpus[2].uuid)])
    report = inv.build_report(index=1, view_fn=lambda: view)
    assert [(g.torch_index, g.nvml_index) for g in report.gpus] == [(1, 2)]
    with pytest.raises(MagicInputError, match=r"no torch GPU index \(cuda:N\) 5; valid: 0, 1"):
        inv.build_report(index=5, view_fn=lambda: view)


def test_index_is_nvml_index_when_torch_has_no_gpu(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")
    cpu = inv.TorchView(version="2.13.0+cpu")
    assert [g.nvml_index for g in inv.build_report(index=7, view_fn=lambda: cpu).gpus] == [7]
    with pytest.raises(MagicInputError, match="valid: 0, 1, 2, 3, 4, 5, 6, 7"):
        inv.build_report(index=8, view_fn=lambda: cpu)
    fake_nvml("no_library")
    with pytest.raises(MagicInputError, match="there is no GPU here"):
        inv.build_report(index=0, view_fn=lambda: cpu)


def test_gpu_lost_in_report(fake_nvml, fresh_env):
    fake_nvml("gpu_lost")
    report = inv.build_report(view_fn=lambda: cuda_view([]))
    text = report.to_text()
    assert "GPU 3: name: GPU is lost" in text and "Xid" in text
    assert len(report.gpus) == 8


def test_to_dict_is_json_and_na_is_null(fake_nvml, fresh_env):
    fake_nvml("mig")
    report = inv.build_report(view_fn=lambda: inv.TorchView(version="2.13.0+cpu"))
    data = json.loads(json.dumps(report.to_dict()))
    assert set(data) == {"environment", "torch", "gpus", "diagnosis", "nvml_problem", "pid"}
    snap = data["gpus"][0]["snapshot"]
    assert snap["utilization_gpu"] is None and snap["memory_total"] == 40960 * MiB
    assert data["environment"]["driver_version"] == "550.163.01"
    assert data["diagnosis"][0]["cause"] == "cpu_only_build"


def test_html_and_text_agree(fake_nvml, fresh_env):
    module = fake_nvml("eight_gpus")
    report = inv.build_report(view_fn=lambda: cuda_view([bare(module.machine.gpus[0].uuid)]))
    html = report._repr_html_()
    assert html.count("<table") == 3  # GPUs, GPU state, environment; no processes: a line says so
    assert "Processes: none listed" in html
    text = report.to_text()
    for g in module.machine.gpus:
        assert g.uuid in html and g.uuid in text
    assert "cuda:0" in text and "gen4 x16" in text


def test_strict_gpu_renders_na(fake_nvml, fresh_env):
    fake_nvml("strict")
    text = inv.build_report(view_fn=lambda: cuda_view([])).to_text()
    assert "N/A" in text and "does not report it" in text


# ---- torch_view against torch itself ------------------------------------------------------------

def test_torch_view_here_does_not_touch_cuda():
    import torch

    view = inv.torch_view()
    assert view.version == torch.__version__
    assert view.cuda == torch.version.cuda
    if not torch.cuda.is_available():
        assert view.devices == [] and view.device_count == 0
        assert not torch.cuda.is_initialized()


def test_torch_view_reads_cuda_build(monkeypatch):
    """With torch's CUDA functions patched as a CUDA build with one GPU reports them."""
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
    view = inv.torch_view()
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
    view = inv.torch_view()
    assert not view.is_available and "too old" in view.warnings[0]


@pytest.mark.gpu
def test_real_gpu_report_agrees_with_torch_and_nvml():
    import torch

    nvml.reset()
    report = inv.build_report()
    assert report.torch_can_use_gpu and report.diagnosis == []
    for entry in report.gpus:
        if entry.torch_index is None:
            continue
        props = torch.cuda.get_device_properties(entry.torch_index)
        assert entry.torch.name == props.name
        assert entry.nvml_index is not None, "every torch GPU must be matched to NVML"
        if entry.mapping.mig is None:
            assert entry.snapshot.name == props.name
            assert entry.snapshot.compute_capability == f"{props.major}.{props.minor}"
            assert abs(entry.snapshot.memory_total - props.total_memory) <= 0.02 * entry.snapshot.memory_total
    assert len([g for g in report.gpus if g.torch_index is not None]) == torch.cuda.device_count()
