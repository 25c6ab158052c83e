"""%gpuinfo through a real InteractiveShell, and `python -m torchgpu_magic` in a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import simulated_legs
from conftest import ROOT, run, run_error
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from torchgpu_magic.gpus.accelerated import AcceleratorReport
from torchgpu_magic.gpus.inventory import GPUReport


def _has_cuda():
    import torch

    return torch.cuda.is_available()


def _report_class(config):
    """The report %gpuinfo gives on this run's machine: the MPS / XPU / ROCm report on the simulated Mac,
    Intel GPU and MI300X, the NVIDIA inventory's elsewhere (chosen from the run, apart from the code)."""
    machine = getattr(config, "_simulated_machine", None)
    return AcceleratorReport if machine in simulated_legs.NOT_CUDA else GPUReport


@pytest.mark.skipif(_has_cuda(), reason="checks the report of a machine where CUDA has no GPU")
def test_gpuinfo_here_gives_diagnosis_no_traceback(ip):
    import torch

    with capture_output() as cap:
        run(ip, "%gpuinfo")
    assert "Traceback" not in cap.stdout + cap.stderr
    assert len(cap.outputs) == 1
    data = cap.outputs[0].data
    headline = data["text/plain"].splitlines()[0]
    accelerator = torch.accelerator.current_accelerator()
    # no GPU torch can use (a CPU build, or a CUDA build that finds none): the report says why
    if accelerator is None or not torch.accelerator.device_count():
        assert "torch cannot use a GPU" in headline
        if torch.version.cuda is None:
            assert "CPU-only build" in data["text/plain"]
    else:  # a Mac's MPS, an Intel XPU: the report names it
        assert headline.startswith(f"torch can use {torch.accelerator.device_count()} GPU")
        assert f"({accelerator.type.upper()})" in headline
    assert "<table" in data["text/html"]


def test_gpuinfo_json_parses(ip, request):
    with capture_output() as cap:
        run(ip, "%gpuinfo --json")
    data = json.loads(cap.stdout)
    if _report_class(request.config) is GPUReport:
        assert {"environment", "torch", "gpus", "diagnosis"} <= set(data)
    else:
        assert {"environment", "backend", "torch_version", "devices", "diagnosis"} <= set(data)


def test_gpuinfo_o_returns_report(ip, request):
    with capture_output() as cap:
        run(ip, "report = %gpuinfo -o")
    assert cap.outputs == []
    report = ip.user_ns["report"]
    assert type(report) is _report_class(request.config)
    assert report.to_dict()["pid"] == report.pid
    assert "torch" in report._repr_html_()


def test_gpuinfo_with_fake_h100(ip, fake_nvml, request):
    simulated_legs.skip_unless_cuda_machine(request.config, "an NVIDIA H100 through NVML")
    fake_nvml("h100_busy")
    with capture_output() as cap:
        run(ip, "%gpuinfo")
    text = cap.outputs[0].data["text/plain"]
    assert "NVIDIA H100 80GB HBM3" in text and "<- this process" in text
    with capture_output() as cap:
        run(ip, "%gpuinfo --no-processes")
    assert "<- this process" not in cap.outputs[0].data["text/plain"]


@pytest.mark.parametrize("line, words", [
    ("--bogus", "unrecognized arguments"),
    ("-i x", "invalid int value"),
    ("-i 99", "valid"),
])
def test_bad_input_is_one_line_usage_error(ip, fake_nvml, line, words):
    fake_nvml("eight_gpus")
    before = dict(ip.user_ns)
    error = run_error(ip, f"%gpuinfo {line}")
    assert isinstance(error, UsageError)
    assert "\n" not in str(error) and words in str(error) and "%gpuinfo" in str(error)
    assert {k for k in set(ip.user_ns) - set(before) if not k.startswith("_")} == set()


def test_index_names_valid_indices(ip, fake_nvml, fresh_env, torch_sees_gpus):
    fake_nvml("eight_gpus")
    torch_sees_gpus(8)  # torch's cuda:N is NVML's GPU N, on any machine
    error = run_error(ip, "%gpuinfo -i 8")
    assert "valid: 0, 1, 2, 3, 4, 5, 6, 7" in str(error)
    with capture_output() as cap:
        run(ip, "%gpuinfo -i 7")
    text = cap.outputs[0].data["text/plain"]
    assert fake_pynvml_uuid(7) in text and fake_pynvml_uuid(6) not in text
    report = run(ip, "%gpuinfo -i 7 -o")
    assert [g.nvml_index for g in report.gpus] == [7]


def fake_pynvml_uuid(index):
    import fake_pynvml

    return fake_pynvml.fake_uuid(f"a100-{index}")


@pytest.mark.fresh_process
def test_module_entry_point_subprocess():
    out = subprocess.run([sys.executable, "-m", "torchgpu_magic"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch" in out.stdout and "Environment" in out.stdout
    assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "torchgpu_magic", "--json", "--no-processes"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout)["torch"]["version"]
    out = subprocess.run([sys.executable, "-m", "torchgpu_magic", "-i", "999"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "999" in out.stderr and "Traceback" not in out.stderr


def test_main_in_process(capsys, fake_nvml, request):
    simulated_legs.skip_unless_cuda_machine(request.config, "NVIDIA GPUs split by MIG through NVML")
    from torchgpu_magic.__main__ import main

    fake_nvml("mig")
    assert main(["--no-processes"]) == 0
    assert "on (2 instances)" in capsys.readouterr().out
    assert main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["environment"]["driver_version"] == "550.163.01"


def test_missing_nvml_hint_is_said_once(ip, fake_nvml, monkeypatch, tmp_path, request):
    simulated_legs.skip_unless_cuda_machine(request.config, "a Linux machine with an NVIDIA GPU")
    from scripted_machine import linux

    from torchgpu_magic.gpus import machine, nvml

    monkeypatch.setattr(machine, "ROOT", str(linux(tmp_path).nvidia(driver="nvidia").root))  # a GPU is here
    fake_nvml(None)  # `import pynvml` fails: nothing is known of the driver, and the note says what to do
    hint = nvml.status().hint
    with capture_output() as cap:
        run(ip, "%gpuinfo")
    text = cap.outputs[0].data["text/plain"]
    assert text.count(hint) == 1, text


@pytest.mark.gpu
def test_gpu_used_memory_matches_nvidia_smi_within_one_mib():
    import shutil

    from torchgpu_magic.gpus import inventory, nvml

    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    nvml.reset()
    report = inventory.build_report(show_processes=False)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    used = {int(i): int(mib) for i, mib in (line.split(",") for line in smi.strip().splitlines())}
    print(smi)
    for entry in report.gpus:
        if entry.nvml_index is None or (entry.mapping is not None and entry.mapping.mig):
            continue
        assert abs(entry.snapshot.memory_used / 2**20 - used[entry.nvml_index]) <= 1, (entry, smi)
