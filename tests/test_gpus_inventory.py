"""%gpuinfo's report: each diagnosis cause, processes, selection, rendering.

NVML is the scripted stand-in; torch's side is a TorchView built as torch_view() would build it on a
GPU machine (torch here is a CPU build). The torch<->NVML mapping itself is tested in test_gpumap.py.
"""
from __future__ import annotations

import json
import os

import fake_pynvml
import pytest
from conftest import bare, cuda_view

from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.gpus import inventory as inv
from torchgpu_magic.gpus import nvml
from torchgpu_magic.gpus.machine import PCIGPU, Distribution

MiB = 1024 * 1024


# ---- diagnosis ----------------------------------------------------------------------------------

def causes(report):
    return [d.cause for d in report.diagnosis]


# A bare-metal Ubuntu machine with an NVIDIA GPU on its PCI bus, whatever machine runs the tests: the
# causes that depend on the hardware and the place are tested situation by situation in
# test_gpus_problems.py; these tests are about NVML's and torch's side.
GPU_MACHINE = inv.Machine("Linux", nvidia_gpus=(PCIGPU("0000:01:00.0", "0x2330", "GH100 [H100 SXM5 80GB]"),),
                          distribution=Distribution("ubuntu", ("debian",), "Ubuntu 24.04.3 LTS"))
BARE = inv.Place()


def report_for(view, **kw):
    return inv.build_report(view_fn=lambda: view, here=GPU_MACHINE, place=BARE, **kw)


def test_cpu_only_build_with_gpus_present(fake_nvml, fresh_env):
    fake_nvml("h100")
    report = report_for(inv.TorchView(version="2.13.0+cpu"))
    assert causes(report) == ["cpu_only_build"]
    message = report.diagnosis[0].message
    assert "CPU-only" in message and "NVIDIA H100 80GB HBM3" in message
    assert "needs a CUDA build of torch" in message
    assert "whl/cu130" in report.diagnosis[0].fix
    assert report.gpus[0].torch_index is None and report.gpus[0].nvml_index == 0


def test_cpu_only_build_without_driver(fake_nvml, fresh_env):
    fake_nvml("no_library")
    report = report_for(inv.TorchView(version="2.13.0+cpu"))
    assert causes(report) == ["no_driver", "cpu_only_build"]  # the driver first: the build follows from it
    assert "ubuntu-drivers" in report.diagnosis[0].fix and "once the driver works" in report.diagnosis[1].fix


@pytest.mark.parametrize("scenario, cause", [("no_library", "no_driver"), ("no_driver", "driver_not_loaded"),
                                             ("mismatch", "driver_mismatch")])
def test_no_driver(fake_nvml, fresh_env, scenario, cause):
    fake_nvml(scenario)
    report = report_for(cuda_view([]))
    assert causes(report) == [cause]
    if scenario == "no_library":  # what to install here, not the cause said again
        assert "ubuntu-drivers" in report.diagnosis[0].fix
        assert "not found" not in report.diagnosis[0].fix
    else:
        assert report.diagnosis[0].fix == nvml.status().hint
    assert "NVML:" not in report.to_text()  # the cause says what NVML's failure means here


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles", "GPU-ffffffff"])
def test_cuda_visible_devices_hides_all(fake_nvml, fresh_env, value):
    fake_nvml("eight_gpus")
    fresh_env["CUDA_VISIBLE_DEVICES"] = value
    report = report_for(cuda_view([]))
    assert causes(report) == ["hidden_by_cuda_visible_devices"]
    assert repr(value) in report.diagnosis[0].message and "8 NVIDIA GPUs" in report.diagnosis[0].message


def test_driver_older_than_torch_cuda(fake_nvml, fresh_env):
    fake_nvml("old_driver")
    view = cuda_view([], cuda="12.8")
    view.warnings = ["CUDA initialization: The NVIDIA driver on your system is too old (found 11040)."]
    report = report_for(view)
    assert causes(report) == ["driver_too_old"]
    assert "470.256.02" in report.diagnosis[0].message and "12.8" in report.diagnosis[0].message
    assert any("too old" in n for n in report._notes())


def test_same_major_is_not_too_old(fake_nvml, fresh_env):
    fake_nvml("eight_gpus")  # driver supports 12.8
    report = report_for(cuda_view([], cuda="12.9"))
    assert "driver_too_old" not in causes(report)
    assert causes(report) == ["unknown"]


def test_other_accelerator(fake_nvml, fresh_env):
    fake_nvml("no_library")
    view = inv.TorchView(version="2.13.0", other_accelerators=["xpu"])
    report = report_for(view)
    assert "other_accelerator" in causes(report)
    assert "'xpu'" in report.diagnosis[-1].fix


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
    assert "<- this process" in report.to_text()


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


@pytest.mark.parametrize("place, says, never", [
    (inv.Place(), "run as root", "container"),
    (inv.Place(container="docker"), "--pid=host", "other users"),
])
def test_no_permission_hint_names_a_container_only_in_one(fake_nvml, fresh_env, place, says, never):
    fake_nvml("no_permission")
    notes = " ".join(inv.build_report(view_fn=lambda: cuda_view([]), here=GPU_MACHINE, place=place)._notes())
    assert "process list incomplete" in notes and says in notes and never not in notes


def test_no_processes_option(fake_nvml, fresh_env):
    module = fake_nvml("h100_busy")
    report = inv.build_report(show_processes=False, view_fn=lambda: cuda_view([]))
    assert report.gpus[0].processes == []
    assert not [c for c in module.calls if "RunningProcesses" in c]
    assert inv.build_report(view_fn=lambda: cuda_view([])).gpus[0].processes  # the check can fail
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in module.calls
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
    report = report_for(inv.TorchView(version="2.13.0+cpu"))
    data = json.loads(json.dumps(report.to_dict()))
    assert set(data) == {"environment", "torch", "gpus", "diagnosis", "nvml_problem", "pid", "machine",
                         "place"}
    assert data["machine"]["nvidia_gpus"][0]["device"] == "0x2330" and data["place"]["container"] is None
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


def test_a_mig_slice_shows_its_own_memory_and_processes(fake_nvml, fresh_env):
    module = fake_nvml("mig_user")  # a non-root user: the whole GPU's process lists are refused
    second = module.machine.gpus[0].migs[1]
    report = inv.build_report(view_fn=lambda: cuda_view([bare(second.uuid)]))
    (entry,) = report.gpus
    assert entry.mapping.mig == second.uuid
    assert entry.snapshot.memory_total == 19968 * MiB  # the 20 GB slice torch uses, not the 40 GB GPU
    assert entry.snapshot.memory_used == second.memory_used
    assert entry.process_problem is None
    assert [p.pid for p in entry.processes] == [fake_pynvml.OTHER_PIDS[0]]


def test_strict_gpu_renders_na(fake_nvml, fresh_env):
    fake_nvml("strict")
    text = inv.build_report(view_fn=lambda: cuda_view([])).to_text()
    assert "N/A" in text and "does not report it" in text



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


def test_the_docs_name_the_pid_as_the_report_does(fake_nvml, fresh_env):
    from conftest import ROOT

    fake_nvml("no_library")
    text = report_for(inv.TorchView(version="2.13.0+cpu")).to_text()
    readme = (ROOT / "docs" / "gpuinfo.md").read_text()
    assert "this process's PID" in text and "this process's PID" in readme
    assert "this kernel's PID" not in readme and "<- this kernel" not in readme
