"""Why torch cannot use a GPU, situation by situation: each names the real cause first, in one or two lines,
with a fix that applies there, and no advice names hardware, drivers or containers that are not there.

Every input is scripted at its boundary: the machine's file system (tests/scripted_machine.py: the PCI bus
in sysfs, /proc, os-release, container and WSL files) in a temporary folder, the environment variables and
``sys.modules`` as dicts, NVML through the real pynvml over the scripted library (tests/fake_pynvml.py), and
torch's view as torch_view() builds it. Then the same through %gpuinfo in a real shell, and, unscripted,
on this machine (whose PCI bus has no NVIDIA device: checked by the test itself).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import types
from typing import Callable, NamedTuple

import pytest
from conftest import ROOT, run
from IPython.core.formatters import PlainTextFormatter
from IPython.utils.capture import capture_output
from scripted_machine import ARCH, DEBIAN, FEDORA, NVRM, ROCKY, UBUNTU, Tree, linux

from torchgpu_magic.gpus import hosting, machine, nvml
from torchgpu_magic.gpus import inventory as inv
from torchgpu_magic.gpus.causes import cuda_build_install, driver_install
from torchgpu_magic.gpus.gpumap import TorchView
from torchgpu_magic.gpus.machine import Distribution

CUDA_BUILD = TorchView(version="2.14.1+cu130", cuda="13.0", cudnn=92400)  # what pip gives on Linux
CPU_BUILD = TorchView(version="2.13.0+cpu")
MAC_BUILD = TorchView(version="2.13.0", other_accelerators=["mps"])

# Words that belong to one kind of place or hardware; a situation without it must not say them.
CONTAINER = ("docker", "--gpus", "container", "podman", "apptainer", "kubernetes", "nvidia.com/gpu")
DRIVER_ADVICE = (
    "install the NVIDIA driver",
    "ubuntu-drivers",
    "nvidia-driver",
    "akmod",
    "pacman",
    "modprobe",
    "nvidia-smi",
    "reboot",
    "nvidia.com/Download",
)
WINDOWS = ("WSL", "Windows")
MAC = ("mps", "Mac")
HOSTED = ("Colab", "Kaggle", "Studio Lab", "Paperspace", "Lightning", "Databricks", "runtime type")
VM = ("virtual machine", "VM type", "passed through", "vfio")
NO_GPU_SAID = ("no NVIDIA GPU", "nothing to install")
BUILD_LINE = ("--index-url", "pip install torch")


def _linux(tmp_path, **kw):
    return linux(tmp_path / "root", **kw)


class Situation(NamedTuple):
    """How to build it (tmp_path -> (tree or None, system, environ, modules and the kernel release)), the NVML
    scenario, torch's view, the first cause expected, words the advice must say, and words it must not."""

    build: Callable
    nvml: str
    view: TorchView
    cause: str
    must: tuple
    never: tuple


SITUATIONS = {
    "cloud VM without a GPU, CUDA build": Situation(
        lambda t: (_linux(t, vm=True), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_nvidia_gpu",
        (
            "no NVIDIA GPU",
            "CUDA build of torch",
            "runs on the CPU, which is normal",
            "nothing to install",
            "VM type",
        ),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + HOSTED + BUILD_LINE,
    ),
    "laptop without an NVIDIA GPU, CPU build": Situation(
        lambda t: (_linux(t), "Linux", {}, {}),
        "no_library",
        CPU_BUILD,
        "no_nvidia_gpu",
        ("no NVIDIA GPU in this machine", "CPU build", "nothing to install"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + HOSTED + VM + BUILD_LINE,
    ),
    "driver installed, no GPU": Situation(
        lambda t: (_linux(t), "Linux", {}, {}),
        "no_gpus",
        CUDA_BUILD,
        "no_nvidia_gpu",
        ("no NVIDIA GPU in this machine", "nothing to install"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + HOSTED + VM + BUILD_LINE,
    ),
    "container on a host without a GPU": Situation(
        lambda t: (_linux(t).write(".dockerenv"), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_nvidia_gpu",
        ("no NVIDIA GPU on this container's host", "nothing to install"),
        ("--gpus", "docker run", "nvidia.com/gpu") + DRIVER_ADVICE + WINDOWS + MAC + HOSTED + BUILD_LINE,
    ),
    "GPU without a driver, Ubuntu": Situation(
        lambda t: (_linux(t).nvidia(), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("NVIDIA GH100 [H100 SXM5 80GB]", "no NVIDIA driver", "sudo ubuntu-drivers install"),
        CONTAINER + WINDOWS + MAC + HOSTED + VM + NO_GPU_SAID + BUILD_LINE,
    ),
    "GPU without a driver, Debian": Situation(
        lambda t: (_linux(t, os_release=DEBIAN).nvidia("0x2684"), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("GeForce RTX 4090", "sudo apt install nvidia-driver", "non-free"),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("ubuntu-drivers", "dnf"),
    ),
    "GPU without a driver, Fedora": Situation(
        lambda t: (_linux(t, os_release=FEDORA).nvidia(), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("akmod-nvidia", "RPM Fusion"),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("ubuntu-drivers", "apt"),
    ),
    "GPU without a driver, Rocky": Situation(
        lambda t: (_linux(t, os_release=ROCKY).nvidia(), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("sudo dnf install cuda-drivers",),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("ubuntu-drivers", "akmod", "apt"),
    ),
    "GPU without a driver, Arch": Situation(
        lambda t: (_linux(t, os_release=ARCH).nvidia(), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("sudo pacman -S nvidia-open",),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("ubuntu-drivers", "dnf", "apt"),
    ),
    "GPU on nouveau": Situation(
        lambda t: (_linux(t).nvidia(driver="nouveau"), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "nouveau",
        ("nouveau", "which CUDA cannot use", "ubuntu-drivers"),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID,
    ),
    "GPU set aside for a VM": Situation(
        lambda t: (_linux(t).nvidia(driver="vfio-pci"), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "gpu_for_vm",
        ("vfio-pci", "virtual machine"),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID,
    ),
    "kernel module loaded, libraries missing": Situation(
        lambda t: (
            _linux(t).nvidia(driver="nvidia").write("proc/driver/nvidia/version", NVRM),
            "Linux",
            {},
            {},
        ),
        "no_library",
        CUDA_BUILD,
        "driver_libraries_missing",
        ("580.95.05", "libnvidia-ml.so.1", "reinstall"),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID,
    ),
    "driver installed, kernel module not loaded": Situation(
        lambda t: (_linux(t).nvidia(), "Linux", {}, {}),
        "no_driver",
        CUDA_BUILD,
        "driver_not_loaded",
        ("kernel module is not loaded", "modprobe"),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID,
    ),
    "Docker container started without --gpus": Situation(
        lambda t: (
            _linux(t).nvidia(driver="nvidia").write("proc/driver/nvidia/version", NVRM).write(".dockerenv"),
            "Linux",
            {},
            {},
        ),
        "no_library",
        CUDA_BUILD,
        "driver_not_in_container",
        ("the host has an NVIDIA GPU", "580.95.05", "`docker run --gpus all`"),
        DRIVER_ADVICE + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("podman", "apptainer"),
    ),
    "Podman container without the GPU": Situation(
        lambda t: (_linux(t).nvidia(driver="nvidia").write("run/.containerenv"), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "driver_not_in_container",
        ("podman run --device nvidia.com/gpu=all",),
        DRIVER_ADVICE + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("docker",),
    ),
    "Kubernetes pod without a GPU limit": Situation(
        lambda t: (_linux(t).nvidia(driver="nvidia"), "Linux", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {}),
        "no_library",
        CUDA_BUILD,
        "driver_not_in_container",
        ("nvidia.com/gpu", "pod spec"),
        DRIVER_ADVICE + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("docker", "podman"),
    ),
    "Apptainer without --nv": Situation(
        lambda t: (_linux(t).nvidia(driver="nvidia"), "Linux", {"APPTAINER_CONTAINER": "/img/pt.sif"}, {}),
        "no_library",
        CUDA_BUILD,
        "driver_not_in_container",
        ("apptainer run --nv",),
        DRIVER_ADVICE + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("docker", "podman"),
    ),
    "container whose host has a GPU but no driver": Situation(
        lambda t: (_linux(t).nvidia().write(".dockerenv"), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("on the host, not in this container", "`docker run --gpus all`"),
        WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("ubuntu-drivers",),
    ),
    "container that cannot see the PCI bus": Situation(
        lambda t: (Tree(t / "root").write(".dockerenv"), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("if the host has an NVIDIA GPU and driver", "`docker run --gpus all`", "if not, nothing to install"),
        WINDOWS + MAC + HOSTED + ("ubuntu-drivers",),
    ),
    "bare Linux that cannot see its PCI bus": Situation(
        lambda t: (Tree(t / "root").write("etc/os-release", UBUNTU), "Linux", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("if it has one", "ubuntu-drivers", "if not, nothing to install"),
        CONTAINER + WINDOWS + MAC + HOSTED,
    ),
    "container with the driver but no GPU given": Situation(
        lambda t: (_linux(t).nvidia(driver="nvidia").write(".dockerenv"), "Linux", {}, {}),
        "no_gpus",
        CUDA_BUILD,
        "no_gpu",
        ("no GPU was given to this container", "--gpus all"),
        DRIVER_ADVICE + WINDOWS + MAC + HOSTED + NO_GPU_SAID,
    ),
    "WSL 2, Windows shares no NVIDIA driver": Situation(
        lambda t: (
            Tree(t / "root")
            .write("dev/dxg")
            .write("usr/lib/wsl/drivers/iigd_dch.inf_amd64_1/x")
            .write("etc/os-release", UBUNTU),
            "Linux",
            {},
            {"release": "5.15.167.4-microsoft-standard-WSL2"},
        ),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("Windows shares no NVIDIA driver", "if this PC has an NVIDIA GPU", "wsl --shutdown"),
        CONTAINER + MAC + HOSTED + ("ubuntu-drivers", "apt", "no NVIDIA GPU in", "PCI bus"),
    ),
    "WSL 1": Situation(
        lambda t: (
            Tree(t / "root").write("etc/os-release", UBUNTU),
            "Linux",
            {},
            {"release": "4.4.0-19041-Microsoft"},
        ),
        "no_library",
        CUDA_BUILD,
        "wsl_no_gpu",
        ("WSL 2", "wsl --set-version"),
        CONTAINER + MAC + HOSTED + ("ubuntu-drivers", "apt", "PCI bus"),
    ),
    "Mac with mps": Situation(
        lambda t: (None, "Darwin", {}, {}),
        "no_library",
        MAC_BUILD,
        "no_nvidia_gpu",
        ("no NVIDIA GPU on a Mac", "'mps'", "%%ontorch mps"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + HOSTED + VM + BUILD_LINE + ("PCI",),
    ),
    "Windows without an NVIDIA driver": Situation(
        lambda t: (None, "Windows", {}, {}),
        "no_library",
        CUDA_BUILD,
        "no_driver",
        ("if this PC has an NVIDIA GPU", "nvidia.com/Download", "if not, nothing to install"),
        CONTAINER + MAC + HOSTED + ("WSL", "ubuntu-drivers", "PCI bus"),
    ),
    "Colab CPU runtime": Situation(
        lambda t: (
            Tree(t / "root").write(".dockerenv"),
            "Linux",
            {"COLAB_RELEASE_TAG": "release-colab_20251020"},
            {"google.colab": types.ModuleType("google.colab")},
        ),
        "no_library",
        CUDA_BUILD,
        "no_nvidia_gpu",
        ("Google Colab runtime has no GPU", "Runtime > Change runtime type", "variables", "lost"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + BUILD_LINE + ("Kaggle",),
    ),
    "Kaggle CPU session": Situation(
        lambda t: (_linux(t).write(".dockerenv"), "Linux", {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, {}),
        "no_library",
        CUDA_BUILD,
        "no_nvidia_gpu",
        ("Kaggle runtime has no GPU", "Accelerator", "restarts"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + BUILD_LINE + ("Colab",),
    ),
    "SageMaker Studio Lab CPU runtime": Situation(
        lambda t: (_linux(t, vm=True), "Linux", {"HOME": "/home/studio-lab-user"}, {}),
        "no_library",
        CUDA_BUILD,
        "no_nvidia_gpu",
        ("Amazon SageMaker Studio Lab runtime has no GPU", "GPU compute type"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + BUILD_LINE + ("Colab", "VM type"),
    ),
    "Paperspace Gradient CPU machine": Situation(
        lambda t: (_linux(t), "Linux", {"PAPERSPACE_NOTEBOOK_REPO_ID": "r8a7k2x9"}, {}),
        "no_library",
        CUDA_BUILD,
        "no_nvidia_gpu",
        ("Paperspace Gradient runtime has no GPU", "GPU machine type", "/storage"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + BUILD_LINE,
    ),
    "Lightning AI Studio on CPU": Situation(
        lambda t: (
            _linux(t),
            "Linux",
            {"LIGHTNING_CLOUD_SPACE_ID": "01jx", "LIGHTNING_INTERACTIVE": "true"},
            {},
        ),
        "no_library",
        CUDA_BUILD,
        "no_nvidia_gpu",
        ("Lightning AI Studio", "GPU machine"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + BUILD_LINE,
    ),
    "CPU build on a machine whose GPU and driver work (CUDA 13)": Situation(
        lambda t: (
            _linux(t).nvidia(driver="nvidia").write("proc/driver/nvidia/version", NVRM),
            "Linux",
            {},
            {},
        ),
        "h100",
        CPU_BUILD,
        "cpu_only_build",
        (
            "CPU-only build",
            "NVIDIA H100 80GB HBM3",
            "pip install torch --index-url https://download.pytorch.org/whl/cu130",
            "580.159.04",
            "restart the kernel",
        ),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + HOSTED + NO_GPU_SAID,
    ),
    "CPU build, eight A100s on a CUDA 12.8 driver": Situation(
        lambda t: (_linux(t).nvidia("0x20b2", driver="nvidia"), "Linux", {}, {}),
        "eight_gpus",
        CPU_BUILD,
        "cpu_only_build",
        ("whl/cu128", "570.172.08"),
        CONTAINER + DRIVER_ADVICE + WINDOWS + MAC + HOSTED + NO_GPU_SAID,
    ),
    "CPU build, driver too old for any CUDA build": Situation(
        lambda t: (_linux(t).nvidia("0x1eb8", driver="nvidia"), "Linux", {}, {}),
        "old_driver",
        CPU_BUILD,
        "cpu_only_build",
        ("470.256.02", "update the driver"),
        CONTAINER + WINDOWS + MAC + HOSTED + NO_GPU_SAID + ("download.pytorch.org/whl",),
    ),
}


def situation(name, tmp_path, fake_nvml):
    """The report for SITUATIONS[name], every input scripted."""
    build, scenario, view, *_ = SITUATIONS[name]
    tree, system, environ, extra = build(tmp_path)
    modules = {k: v for k, v in extra.items() if k != "release"}
    root = str(tree.root) if tree is not None else str(tmp_path / "empty")
    here = machine.survey(root, system=system, release=extra.get("release"))
    place = hosting.where(root, environ, modules)
    fake_nvml(scenario)
    return inv.build_report(view_fn=lambda: view, here=here, place=place)


def says(text, words):
    """Whether ``text`` says ``words`` as words (any case): 'Mac' is not in 'machine'."""
    return re.search(r"(?<![\w])" + re.escape(words) + r"(?![\w])", text, re.IGNORECASE) is not None


def advice(report):
    """What the report tells a person to believe and do: the diagnosis and the notes (the environment
    table lists facts, N/A where there is no driver, and is not advice)."""
    return "\n".join(report._diagnosis_lines() + report._notes())


@pytest.mark.parametrize("name", list(SITUATIONS))
def test_each_situation_names_its_real_cause_first_with_a_fix_that_applies(
    name, tmp_path, fake_nvml, fresh_env
):
    *_, cause, must, never = SITUATIONS[name]
    report = situation(name, tmp_path, fake_nvml)
    said = advice(report)
    assert report.diagnosis and report.diagnosis[0].cause == cause, said
    first = report.diagnosis[0]
    assert "\n" not in first.message and "\n" not in first.fix  # one line each: the cause, the fix
    for words in must:
        assert words in said, f"{name}: {words!r} missing from:\n{said}"
    for words in never:
        assert not says(said, words), f"{name}: {words!r} does not apply here:\n{said}"


@pytest.mark.parametrize(
    "name",
    [
        "cloud VM without a GPU, CUDA build",
        "Docker container started without --gpus",
        "Colab CPU runtime",
        "GPU without a driver, Ubuntu",
        "Mac with mps",
    ],
)
def test_the_terminal_and_html_say_the_same_first(name, tmp_path, fake_nvml, fresh_env):
    report = situation(name, tmp_path, fake_nvml)
    text = PlainTextFormatter()(report)
    assert text == report.to_text()
    lines = text.splitlines()
    assert lines[2] == "Why torch cannot use a GPU:"
    assert (
        lines[3].endswith(report.diagnosis[0].message) and lines[4] == f"    fix: {report.diagnosis[0].fix}"
    )
    page = report._repr_html_()
    body = page[: page.index("<table")]
    assert html.escape(report.diagnosis[0].message) in body and html.escape(report.diagnosis[0].fix) in body
    assert body.index(html.escape(report.diagnosis[0].message)) < body.index(
        html.escape(report.diagnosis[0].fix)
    )


def test_no_nvidia_gpu_headline_and_environment(tmp_path, fake_nvml, fresh_env):
    report = situation("cloud VM without a GPU, CUDA build", tmp_path, fake_nvml)
    assert report.to_text().splitlines()[0] == (
        "torch cannot use a GPU | torch 2.14.1+cu130 (CUDA 13.0) | no NVIDIA GPU"
    )
    table = report._environment_table().to_text()
    assert (
        "NVIDIA GPUs on the PCI bus    none" in table and "NVIDIA kernel driver          not loaded" in table
    )
    assert "runs in                       in a virtual machine" in table
    data = report.to_dict()
    assert data["machine"]["nvidia_gpus"] == [] and data["place"] == {
        "service": None,
        "container": None,
        "vm": "a virtual machine",
    }


def test_a_gpu_on_the_bus_is_named_with_its_driver_in_the_environment(tmp_path, fake_nvml, fresh_env):
    report = situation("Docker container started without --gpus", tmp_path, fake_nvml)
    table = report._environment_table().to_text()
    assert "NVIDIA GH100 [H100 SXM5 80GB] at 0000:01:00.0 (nvidia driver)" in table
    assert "NVIDIA kernel driver          580.95.05" in table and "a Docker container" in table


def test_nvml_note_is_not_repeated_where_the_cause_explains_it(tmp_path, fake_nvml, fresh_env):
    for name in ("cloud VM without a GPU, CUDA build", "GPU without a driver, Ubuntu"):
        report = situation(name, tmp_path / name.split()[0], fake_nvml)
        assert not any(n.startswith("NVML:") for n in report._notes()), report._notes()


# ---- the readers --------------------------------------------------------------------------------


def test_pci_bus_gpus_drivers_and_names(tmp_path):
    tree = linux(tmp_path).nvidia(driver="nvidia").nvidia("0x2684", address="0000:41:00.0", klass="0x030000")
    gpus = machine.pci_gpus(str(tree.root))
    assert [(g.address, g.device, g.driver) for g in gpus] == [
        ("0000:01:00.0", "0x2330", "nvidia"),
        ("0000:41:00.0", "0x2684", None),
    ]  # the audio functions are no GPUs
    assert [g.label() for g in gpus] == ["NVIDIA GH100 [H100 SXM5 80GB]", "NVIDIA AD102 [GeForce RTX 4090]"]
    assert machine.pci_gpus(str(linux(tmp_path / "none").root)) == ()
    assert machine.pci_gpus(str(tmp_path / "no-sysfs")) is None
    (tmp_path / "empty/sys/bus/pci/devices").mkdir(parents=True)
    assert machine.pci_gpus(str(tmp_path / "empty")) is None  # a bus with no device is a sandbox


def test_a_device_pci_ids_does_not_know_is_named_by_its_ids(tmp_path):
    tree = linux(tmp_path).nvidia("0x2b85")
    (gpu,) = machine.pci_gpus(str(tree.root))
    assert gpu.label() == "NVIDIA device 10de:2b85"


def test_kernel_module_version(tmp_path):
    tree = Tree(tmp_path)
    assert machine.kernel_driver(str(tree.root)) is None
    tree.write("sys/module/nvidia/version", "550.163.01\n")
    assert machine.kernel_driver(str(tree.root)) == "550.163.01"
    tree.write(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  Thu May  2 14:37:44 UTC 2024\n",
    )
    assert machine.kernel_driver(str(tree.root)) == "470.256.02"
    tree.write("proc/driver/nvidia/version", NVRM)
    assert machine.kernel_driver(str(tree.root)) == "580.95.05"


def test_distribution_and_wsl(tmp_path):
    assert machine.distribution(str(Tree(tmp_path).write("etc/os-release", ROCKY).root)) == Distribution(
        "rocky", ("rhel", "centos", "fedora"), "Rocky Linux 9.6"
    )
    assert machine.distribution(str(tmp_path / "none")) is None
    assert machine.is_wsl(release="5.15.167.4-microsoft-standard-WSL2")
    assert machine.is_wsl(release="4.4.0-19041-Microsoft") and not machine.is_wsl(release="6.8.0-48-generic")
    tree = Tree(tmp_path / "wsl").write("dev/dxg").write("usr/lib/wsl/lib/libnvidia-ml.so.1")
    assert machine.wsl_gpu(str(tree.root)) == (True, True)
    here = machine.survey(str(tree.root), system="Linux", release="5.15.167.4-microsoft-standard-WSL2")
    assert here.wsl and here.has_nvidia_gpu is True and here.nvidia_gpus is None
    assert machine.survey(str(tree.root), system="Darwin").has_nvidia_gpu is False
    assert machine.survey(str(tree.root), system="Windows").has_nvidia_gpu is None


def test_the_os_release_is_read_once_per_version_of_its_file(tmp_path, monkeypatch):
    """%gpuinfo surveys the machine on every call (on every engine of a cluster): the os-release file is
    parsed once, and again when it changes (a distribution upgraded in place); an empty one in /etc
    leaves the one in /usr/lib to say."""
    tree = Tree(tmp_path).write("etc/os-release", ROCKY)
    root = str(tree.root)
    reads: list = []
    real = machine.read_text
    monkeypatch.setattr(machine, "read_text", lambda base, path: reads.append(path) or real(base, path))
    assert machine.distribution(root).id == "rocky"
    assert machine.distribution(root).id == "rocky" and reads == ["etc/os-release"]
    tree.write("etc/os-release", 'ID=ubuntu\nID_LIKE=debian\nPRETTY_NAME="Ubuntu 24.04.3 LTS"\n')
    assert machine.distribution(root) == Distribution("ubuntu", ("debian",), "Ubuntu 24.04.3 LTS")
    tree.write("etc/os-release", "").write("usr/lib/os-release", ROCKY)
    assert machine.distribution(root).id == "rocky"


def test_each_distribution_gets_its_own_package():
    assert "ubuntu-drivers" in driver_install(Distribution("linuxmint", ("ubuntu", "debian")))
    assert "apt install nvidia-driver" in driver_install(Distribution("debian"))
    assert "cuda-drivers" in driver_install(Distribution("almalinux", ("rhel", "centos", "fedora")))
    assert "akmod-nvidia" in driver_install(Distribution("fedora"))
    assert "pacman" in driver_install(Distribution("endeavouros", ("arch",)))
    other = driver_install(Distribution("opensuse-tumbleweed", ("opensuse", "suse"), "openSUSE Tumbleweed"))
    assert "openSUSE Tumbleweed's NVIDIA driver package" in other and "apt" not in other


def test_the_cuda_build_matches_the_driver():
    assert "whl/cu130" in cuda_build_install("580.159.04", "13.0")
    assert "whl/cu128" in cuda_build_install("570.172.08", "12.8")
    assert "whl/cu126" in cuda_build_install("560.35.03", "12.6")
    assert "update the driver" in cuda_build_install("550.163.01", "12.4")


@pytest.mark.parametrize(
    "environ, modules, key",
    [
        ({"COLAB_RELEASE_TAG": "release-colab_20251020"}, {}, "colab"),
        ({}, {"google.colab": object()}, "colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, {}, "kaggle"),
        ({"HOME": "/home/studio-lab-user"}, {}, "studiolab"),
        ({"PAPERSPACE_NOTEBOOK_REPO_ID": "r8a7k2x9"}, {}, "paperspace"),
        ({"LIGHTNING_CLOUD_SPACE_ID": "01jx", "LIGHTNING_INTERACTIVE": "true"}, {}, "lightning"),
        ({"LIGHTNING_CLOUD_SPACE_ID": "01jx"}, {}, None),  # a Lightning job, not an interactive Studio
        ({"DATABRICKS_RUNTIME_VERSION": "16.4"}, {}, "databricks"),
        ({"HOME": "/home/me", "PATH": "/usr/bin"}, {"google": object()}, None),
    ],
)
def test_hosted_services_by_their_own_markers(environ, modules, key):
    assert hosting.hosted_service(environ, modules) == key


def test_containers_from_more_than_dockerenv(tmp_path):
    def runtime(tree, environ=None):
        return hosting.container(str(tree.root), environ or {})

    assert runtime(Tree(tmp_path / "bare")) is None
    assert runtime(Tree(tmp_path / "d").write(".dockerenv")) == "docker"
    assert runtime(Tree(tmp_path / "p").write("run/.containerenv")) == "podman"
    assert runtime(Tree(tmp_path / "a").write(".singularity.d/env/90-environment.sh")) == "apptainer"
    assert runtime(Tree(tmp_path / "k"), {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == "kubernetes"
    assert runtime(Tree(tmp_path / "n"), {"container": "systemd-nspawn"}) == "systemd-nspawn"
    v1 = "12:memory:/kubepods/burstable/pod6c1a/3f2e\n11:cpu:/kubepods/burstable/pod6c1a/3f2e\n"
    assert runtime(Tree(tmp_path / "c1").write("proc/1/cgroup", v1)) == "kubernetes"
    assert (
        runtime(
            Tree(tmp_path / "c2")
            .write("proc/1/cgroup", "0::/\n")
            .write(
                "proc/self/mountinfo",
                "612 590 259:1 /var/lib/docker/containers/3f2e/hostname /etc/hostname rw - "
                "ext4 /dev/nvme0n1p1 rw\n",
            )
        )
        == "docker"
    )
    assert (
        runtime(
            Tree(tmp_path / "c3")
            .write("proc/1/cgroup", "0::/init.scope\n")
            .write("proc/self/mountinfo", "22 27 0:21 / /proc rw,relatime - proc proc rw\n")
        )
        is None
    )


def test_virtual_machines(tmp_path):
    assert (
        hosting.virtual_machine(str(Tree(tmp_path / "m").write("proc/cpuinfo", "flags\t: fpu sse\n").root))
        is None
    )
    assert (
        hosting.virtual_machine(
            str(Tree(tmp_path / "f").write("proc/cpuinfo", "flags\t: fpu sse hypervisor\n").root)
        )
        == "a virtual machine"
    )
    assert (
        hosting.virtual_machine(
            str(Tree(tmp_path / "g").write("sys/class/dmi/id/product_name", "Google Compute Engine\n").root)
        )
        == "Google Compute Engine"
    )
    assert (
        hosting.virtual_machine(
            str(Tree(tmp_path / "e").write("sys/class/dmi/id/sys_vendor", "Amazon EC2\n").root)
        )
        == "Amazon EC2"
    )
    assert (
        hosting.virtual_machine(str(Tree(tmp_path / "x").write("sys/hypervisor/type", "xen\n").root)) == "Xen"
    )


# ---- %gpuinfo and python -m torchgpu_magic --------------------------------------------------------

MARKERS = (
    "COLAB_RELEASE_TAG",
    "KAGGLE_KERNEL_RUN_TYPE",
    "PAPERSPACE_NOTEBOOK_REPO_ID",
    "LIGHTNING_CLOUD_SPACE_ID",
    "DATABRICKS_RUNTIME_VERSION",
    "KUBERNETES_SERVICE_HOST",
    "APPTAINER_CONTAINER",
    "SINGULARITY_CONTAINER",
    "container",
)


@pytest.fixture
def scripted_place(monkeypatch, tmp_path, fake_nvml, torch_sees_gpus, fresh_env):
    """Point %gpuinfo's readers at a scripted machine, with this environment and these modules, and torch
    answering as a CUDA 13 build that sees no GPU."""
    for name in MARKERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    torch_sees_gpus(0)

    def install(name):
        build, scenario, *_ = SITUATIONS[name]
        tree, system, environ, extra = build(tmp_path)
        assert system == "Linux" and "release" not in extra
        monkeypatch.setattr(machine, "ROOT", str(tree.root))
        monkeypatch.setattr(hosting, "ROOT", str(tree.root))
        for key, value in environ.items():
            monkeypatch.setenv(key, value)
        for key, value in extra.items():
            monkeypatch.setitem(sys.modules, key, value)
        fake_nvml(scenario)

    return install


@pytest.mark.parametrize(
    "name",
    [
        "cloud VM without a GPU, CUDA build",
        "Docker container started without --gpus",
        "Colab CPU runtime",
        "Kubernetes pod without a GPU limit",
        "GPU without a driver, Fedora",
    ],
)
def test_gpuinfo_in_the_shell(name, ip, scripted_place):
    *_, cause, must, never = SITUATIONS[name]
    scripted_place(name)
    with capture_output() as cap:
        run(ip, "%gpuinfo")
    text, page = cap.outputs[0].data["text/plain"], cap.outputs[0].data["text/html"]
    report = run(ip, "%gpuinfo -o")
    assert report.diagnosis[0].cause == cause
    advice_text = advice(report)
    for words in must:
        assert words in advice_text and words in text and html.escape(words) in page
    for words in never:
        assert not says(advice_text, words)


def _bus_has_no_nvidia_device() -> bool:
    """Whether this machine's PCI bus is readable and has no NVIDIA device of any class (read here, apart
    from the code under test)."""
    base = "/sys/bus/pci/devices"
    try:
        vendors = [open(os.path.join(base, d, "vendor")).read().strip().lower() for d in os.listdir(base)]
    except OSError:
        return False
    return bool(vendors) and "0x10de" not in vendors


def _on_this_machine() -> str:
    import torch

    if torch.cuda.is_available():
        return "torch can use a GPU here"
    if torch.accelerator.current_accelerator() is not None:
        return f"torch can use an accelerator here ({torch.accelerator.current_accelerator().type})"
    if not _bus_has_no_nvidia_device():
        return "this machine's PCI bus is unreadable or has an NVIDIA device"
    if hosting.hosted_service(os.environ, sys.modules):
        return "a hosted notebook: its own advice"
    return ""


@pytest.mark.skipif(bool(_on_this_machine()), reason=_on_this_machine() or "runs")
def test_this_machine_unscripted(ip):
    """Nothing scripted: this machine has no NVIDIA device on its PCI bus, so on whatever torch is here (the
    CUDA build in the cudabuild leg) the report says so, and offers no driver and no container flag."""
    import torch

    nvml.reset()
    with capture_output() as cap:
        run(ip, "%gpuinfo")
    text = cap.outputs[0].data["text/plain"]
    out = subprocess.run(
        [sys.executable, "-m", "torchgpu_magic"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr
    for said in (text, out.stdout):
        assert said.splitlines()[0].endswith("| no NVIDIA GPU"), said
        assert "no NVIDIA GPU" in said.splitlines()[3] and "nothing to install" in said.splitlines()[4]
        if torch.version.cuda:
            assert f"this CUDA build of torch ({torch.__version__}) could use one" in said
            assert "runs on the CPU, which is normal" in said
        else:
            assert "this CPU build of torch" in said
        advice_part = said.split("\nEnvironment\n")[0] + said.split("\nNotes:")[-1] * ("\nNotes:" in said)
        for words in ("--gpus", "docker run", "install the NVIDIA driver", "nvidia-smi", "ubuntu-drivers"):
            assert words not in advice_part, said


@pytest.mark.notebook
@pytest.mark.skipif(bool(_on_this_machine()), reason=_on_this_machine() or "runs")
def test_this_machine_in_a_jupyter_kernel(tmp_path):
    """The same in a real Jupyter kernel (nbclient) on this interpreter: the cause and its fix, in the HTML
    a notebook shows and in the plain text a terminal or an export shows."""
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    path = tmp_path / "gpuinfo.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%load_ext torchgpu_magic"),
                                         nbformat.v4.new_code_cell("%gpuinfo")])
    nbformat.write(nb, str(path))
    (out,) = runner.execute(path, timeout=120).cells[1].outputs
    text, page = out["data"]["text/plain"], out["data"]["text/html"]
    cause, fix = text.splitlines()[3:5]
    assert "no NVIDIA GPU" in cause and fix.strip().startswith("fix: nothing to install")
    assert html.escape(cause.strip()[2:]) in page and html.escape(fix.strip()[5:]) in page
    assert "--gpus" not in text and "install the NVIDIA driver" not in text


# ---- what the readers keep between calls (%gpuinfo runs them on every call, on every engine) ----------


def test_a_survey_reads_the_pci_ids_once_and_sees_every_change_that_can_happen(tmp_path, monkeypatch):
    """The ids of the devices on the bus are read once per listing, the pci.ids database once per
    version of its file; a driver bound or unbound, a device added and a kernel module loaded since the
    last survey are seen by the next one."""
    from torchgpu_magic import caches

    tree = linux(tmp_path).nvidia()
    root = str(tree.root)
    reads: list = []
    real = machine.read_text
    monkeypatch.setattr(machine, "read_text", lambda base, path: reads.append(path) or real(base, path))
    first = machine.survey(root, "Linux", "6.8.0")
    assert first.nvidia_gpus[0].driver is None and first.kernel_driver is None
    assert any(path.endswith("/vendor") for path in reads) and "usr/share/misc/pci.ids" in reads
    reads.clear()
    listings: list = []
    real_listdir = os.listdir
    monkeypatch.setattr(machine.os, "listdir", lambda path: listings.append(path) or real_listdir(path))
    assert machine.survey(root, "Linux", "6.8.0") == first
    assert not [path for path in reads if path.endswith(("/vendor", "/class", "/device", "pci.ids"))], reads
    assert [path for path in listings if path.endswith("pci/devices")] == [f"{root}/sys/bus/pci/devices"]

    os.symlink("../../../bus/pci/drivers/nvidia", tree.root / "sys/bus/pci/devices/0000:01:00.0/driver")
    tree.write("proc/driver/nvidia/version", NVRM)
    bound = machine.survey(root, "Linux", "6.8.0")
    assert bound.nvidia_gpus[0].driver == "nvidia" and bound.kernel_driver == "580.95.05"
    (tree.root / "sys/bus/pci/devices/0000:01:00.0/driver").unlink()
    assert machine.survey(root, "Linux", "6.8.0").nvidia_gpus[0].driver is None

    tree.nvidia("0x2684", address="0000:41:00.0")  # a device added: the new listing is read afresh
    assert [g.label() for g in machine.survey(root, "Linux", "6.8.0").nvidia_gpus] == [
        "NVIDIA GH100 [H100 SXM5 80GB]", "NVIDIA AD102 [GeForce RTX 4090]"]
    tree.write("usr/share/misc/pci.ids", "10de  NVIDIA Corporation\n\t2330  H100 renamed\n")
    assert machine.survey(root, "Linux", "6.8.0").nvidia_gpus[0].label() == "NVIDIA H100 renamed"

    tree.write("sys/bus/pci/devices/0000:41:00.0/device", "0x2330\n")  # never on a live bus: only a reset
    assert machine.survey(root, "Linux", "6.8.0").nvidia_gpus[1].device == "0x2684"
    caches.reset_caches()
    assert machine.survey(root, "Linux", "6.8.0").nvidia_gpus[1].device == "0x2330"


def test_a_bus_listing_with_unreadable_ids_is_read_again(tmp_path):
    """A device whose files could not be read (appearing as the bus was read) is not kept as it was."""
    tree = linux(tmp_path).write("sys/bus/pci/devices/0000:01:00.0/vendor", "0x10de\n")
    assert machine.pci_gpus(str(tree.root)) == ()
    tree.write("sys/bus/pci/devices/0000:01:00.0/class", "0x030200\n")
    tree.write("sys/bus/pci/devices/0000:01:00.0/device", "0x2330\n")
    assert [g.device for g in machine.pci_gpus(str(tree.root))] == ["0x2330"]


def test_where_keeps_what_the_files_say_and_reads_the_environment_every_time(tmp_path):
    """The container and the virtual machine a process runs in are read once per root; the environment
    (a hosted service's variables, Kubernetes') on every call."""
    from torchgpu_magic import caches

    tree = linux(tmp_path, vm=True).write(".dockerenv")
    root = str(tree.root)
    assert hosting.where(root, {}, {}) == hosting.Place(None, "docker", "a virtual machine")
    (tree.root / ".dockerenv").unlink()
    tree.write("proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu\n")
    assert hosting.where(root, {}, {}) == hosting.Place(None, "docker", "a virtual machine")
    assert hosting.where(root, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KAGGLE_KERNEL_RUN_TYPE": "Batch"},
                         {}) == hosting.Place("kaggle", "kubernetes", "a virtual machine")
    caches.reset_caches()
    assert hosting.where(root, {}, {}) == hosting.Place(None, None, None)
