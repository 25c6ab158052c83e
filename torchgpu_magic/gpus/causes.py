"""Why torch cannot use a GPU here, and what to do: ``%gpuinfo``'s diagnosis.

NVML and torch alone cannot tell the causes apart: without a driver both say "nothing", whether the machine
has no NVIDIA GPU (nothing to install), has one without a driver (install one), is a container whose host
has both (start it with the GPU), or is a hosted notebook on a CPU runtime (switch the runtime). So the
diagnosis also reads what the machine has (:mod:`.machine`: the PCI bus, the kernel driver, WSL's files)
and where the kernel runs (:mod:`.hosting`: a service, a container, a VM), and names the real cause first,
with a fix that applies there. Advice never names what is not there: no driver to install where there is
no NVIDIA GPU, no container flag outside a container, no Windows step outside WSL or Windows; where the
machine cannot say whether it has an NVIDIA GPU (Windows, WSL without NVIDIA's files, a hidden PCI bus),
the advice says "if" rather than guess. A CUDA build of torch on a machine without an NVIDIA GPU is normal
(it is what ``pip install torch`` gives on Linux), and is said to be.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from .gpumap import parse_cuda_visible_devices
from .hosting import Place
from .machine import Distribution, Machine

__all__ = ["Diagnosis", "diagnose", "driver_package", "driver_install", "cuda_build_install",
           "container_gpu_fix"]


@dataclass
class Diagnosis:
    """Why torch cannot use a GPU: a ``cause`` code, what is wrong, and how to fix it. ``explains_nvml``
    marks a cause that accounts for NVML's own failure, whose note then says nothing more."""

    cause: str
    message: str
    fix: str
    explains_nvml: bool = False


# NVML's problems that mean "no working NVIDIA driver here".
_NO_DRIVER = ("library_not_found", "driver_not_loaded", "driver_mismatch")
# The CUDA builds of torch on download.pytorch.org, newest first: (the driver's CUDA it needs, its tag).
_CUDA_BUILDS = (((13, 0), "cu130"), ((12, 8), "cu128"), ((12, 6), "cu126"))
_DRIVER_DOWNLOAD = "https://www.nvidia.com/Download/index.aspx"


def version_tuple(text: Any) -> Optional[tuple]:
    """(major, minor) of a version such as '12.8' (or '14': minor 0); None where ``text`` has none."""
    match = re.match(r"(\d+)(?:\.(\d+))?", str(text)) if text else None
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def driver_package(dist: Optional[Distribution]) -> str:
    """NVIDIA's driver for this Linux distribution, in its own package manager's words."""
    if dist is not None and dist.is_a("ubuntu"):
        return "`sudo ubuntu-drivers install` (Ubuntu's recommended NVIDIA driver)"
    if dist is not None and dist.is_a("debian"):
        return ("`sudo apt install nvidia-driver`, with contrib and non-free in APT's sources (Debian's "
                "wiki: NvidiaGraphicsDrivers)")
    if dist is not None and dist.is_a("rhel", "centos"):
        return ("`sudo dnf install cuda-drivers` from NVIDIA's CUDA repository (NVIDIA's driver installation "
                "guide)")
    if dist is not None and dist.is_a("fedora"):
        return "`sudo dnf install akmod-nvidia xorg-x11-drv-nvidia-cuda` from RPM Fusion's nonfree repository"
    if dist is not None and dist.is_a("arch"):
        return "`sudo pacman -S nvidia-open` (the Arch wiki's NVIDIA page names the package for older GPUs)"
    name = dist.name if dist is not None and dist.name else "this Linux"
    return f"{name}'s NVIDIA driver package, or NVIDIA's installer ({_DRIVER_DOWNLOAD})"


def driver_install(dist: Optional[Distribution]) -> str:
    """How to install NVIDIA's driver on this Linux distribution, and how to see that it works."""
    return f"install the NVIDIA driver: {driver_package(dist)}; reboot, and `nvidia-smi` then lists the GPU"


def container_gpu_fix(runtime: Optional[str]) -> str:
    """How the container runtime that started this one hands it the host's GPUs and driver."""
    return {
        "docker": "start the container with `docker run --gpus all` (the NVIDIA Container Toolkit on the "
                  "host)",
        "podman": "start the container with `podman run --device nvidia.com/gpu=all` (CDI, from the NVIDIA "
                  "Container Toolkit on the host)",
        "kubernetes": "give the pod a `nvidia.com/gpu` resource limit in its pod spec (NVIDIA's device "
                      "plugin or GPU Operator on the node) and start it again",
        "apptainer": "start the container with `apptainer run --nv` (or `singularity run --nv`)",
    }.get(runtime or "", "start the container with the GPU handed to it: `docker run --gpus all`, "
                         "`podman run --device nvidia.com/gpu=all`, `apptainer run --nv`, or a "
                         "`nvidia.com/gpu` limit on Kubernetes")


def cuda_build_install(driver: Any, driver_cuda: Any) -> str:
    """The install line for the newest CUDA build of torch that this driver (which supports CUDA up to
    ``driver_cuda``) can run; or, for a driver older than any, what to update first."""
    have = version_tuple(driver_cuda)
    if have is None:
        return ("then install a CUDA build of torch that the driver supports "
                "(https://pytorch.org/get-started/locally/)")
    for need, tag in _CUDA_BUILDS:
        if have >= need:
            return (f"`pip uninstall -y torch`, then `pip install torch --index-url "
                    f"https://download.pytorch.org/whl/{tag}` (a CUDA {need[0]}.{need[1]} build, which "
                    f"driver {driver} supports), and restart the kernel")
    oldest = _CUDA_BUILDS[-1][0]
    return (f"driver {driver} supports CUDA up to {driver_cuda}, older than any current CUDA build of torch "
            f"needs ({oldest[0]}.{oldest[1]}): update the driver ({_DRIVER_DOWNLOAD}), then install one "
            "(https://pytorch.org/get-started/locally/)")


def _build_words(view: Any) -> str:
    if view.cuda:
        return (f"this CUDA build of torch ({view.version}) could use one; here everything runs on the CPU, "
                "which is normal")
    if view.hip:
        return f"this ROCm build of torch ({view.version}) runs on the CPU here"
    return f"this CPU build of torch ({view.version}) runs everything on the CPU"


def _run_elsewhere(view: Any, place: Place) -> str:
    """The fix where there is no NVIDIA GPU: nothing to install; another accelerator, the service's GPU
    runtime, or a machine with a GPU."""
    if place.hosted is not None:
        return f"for a GPU, {place.hosted.gpu}; {place.hosted.switching}"
    if view.other_accelerators:
        first = view.other_accelerators[0]
        return (f"nothing to install: run on {' or '.join(repr(a) for a in view.other_accelerators)} here "
                f"(`%%ontorch {first}`, torch.device({first!r})), or on the CPU")
    if place.vm is not None and place.container is None:
        return ("nothing to install; for a GPU, use a VM type with an NVIDIA GPU attached (a virtual "
                "machine sees only the GPUs attached or passed through to it)")
    return ("nothing to install; for a GPU, use a machine with an NVIDIA GPU, or a hosted notebook's GPU "
            "runtime")


def _no_nvidia_gpu(view: Any, machine: Machine, place: Place) -> Diagnosis:
    build = _build_words(view)
    if machine.system == "Darwin":
        where, build = "no NVIDIA GPU on a Mac", "macOS has no CUDA, so no CUDA build of torch runs here"
    elif place.hosted is not None:
        where = f"this {place.hosted.name} runtime has no GPU (a CPU runtime)"
    elif place.container is not None:
        where = "no NVIDIA GPU on this container's host (none on its PCI bus)"
    elif place.vm is not None:
        what = place.vm if place.vm.startswith(("a ", "an ")) else f"a {place.vm} virtual machine"
        where = f"no NVIDIA GPU in this machine, {what} (none on its PCI bus)"
    else:
        where = "no NVIDIA GPU in this machine (none on its PCI bus)"
    return Diagnosis("no_nvidia_gpu", f"{where}: {build}", _run_elsewhere(view, place), explains_nvml=True)


def _driver_cause(problem: Any, gpus: list, machine: Machine, place: Place) -> Optional[Diagnosis]:
    """Why the NVIDIA driver does not answer where a GPU is (or may be) present; None where NVML's own
    problem and hint say it (WSL with NVIDIA's files present)."""
    code = problem.code
    names = ", ".join(sorted({str(g.name) for g in gpus})) or machine.gpu_names()
    the_gpu = f"an NVIDIA GPU ({names})" if names else "an NVIDIA GPU"
    unsure = "; if not, nothing to install: everything runs on the CPU"
    install = driver_install(machine.distribution)
    version = f" {machine.kernel_driver}" if machine.kernel_driver else ""  # the loaded kernel module's
    if machine.system == "Windows":
        if code != "library_not_found":
            return Diagnosis("no_driver", "the NVIDIA driver does not answer", problem.hint, True)
        return Diagnosis(
            "no_driver", "no NVIDIA driver on this Windows (NVML's nvml.dll was not found)",
            f"if this PC has an NVIDIA GPU, install its driver ({_DRIVER_DOWNLOAD}, or the NVIDIA App) and "
            f"restart{unsure}", True)
    if machine.wsl:
        if not machine.wsl_gpu:
            return Diagnosis(
                "wsl_no_gpu", "this WSL has no GPU access from Windows (no /dev/dxg: WSL 1, or a Windows "
                "without GPU support in WSL)",
                "GPU access needs WSL 2 (`wsl --set-version <distro> 2` in Windows) and, on Windows, the "
                f"driver of this PC's NVIDIA GPU, if it has one{unsure}", True)
        if not machine.wsl_nvidia:
            return Diagnosis(
                "no_driver", "Windows shares no NVIDIA driver with WSL (no NVIDIA files in /usr/lib/wsl)",
                "if this PC has an NVIDIA GPU, install its driver on Windows, not inside WSL, then "
                f"`wsl --shutdown` and start WSL again{unsure}", True)
        return None
    if place.container is not None:
        fix = container_gpu_fix(place.container)
        box = "pod" if place.container == "kubernetes" else "container"
        if machine.has_nvidia_gpu is None and not gpus:
            return Diagnosis(
                "no_driver", f"no NVIDIA driver in this {box} (no libnvidia-ml.so.1), and no PCI bus to tell "
                "whether its host has an NVIDIA GPU",
                f"if the host has an NVIDIA GPU and driver, {fix}{unsure}", True)
        loaded = machine.kernel_driver is not None or \
            any(g.driver == "nvidia" for g in machine.nvidia_gpus or ())
        if loaded:
            return Diagnosis(
                "driver_not_in_container", f"the host has {the_gpu} and its NVIDIA driver{version} loaded, "
                f"but this {box} was started without them (no libnvidia-ml.so.1 here)", fix, True)
        return Diagnosis(
            "no_driver", f"this {box}'s host has {the_gpu} but no NVIDIA driver loaded",
            f"on the host, not in this {box}, install the NVIDIA driver ({_DRIVER_DOWNLOAD}, or the host's "
            f"package); then {fix}", True)
    if code == "driver_mismatch":
        return Diagnosis("driver_mismatch", "the NVIDIA driver is half-upgraded: its library and kernel "
                         "module differ", problem.hint, True)
    if code == "driver_not_loaded":
        return Diagnosis("driver_not_loaded", f"this machine has {the_gpu} and the NVIDIA driver's library, "
                         "but its kernel module is not loaded", problem.hint, True)
    if machine.has_nvidia_gpu is None and not gpus:
        return Diagnosis(
            "no_driver", "no NVIDIA driver here (no libnvidia-ml.so.1), and no PCI bus to tell whether this "
            "machine has an NVIDIA GPU", f"if it has one, {install}{unsure}", True)
    bound = {g.driver for g in machine.nvidia_gpus or ()}
    if "vfio-pci" in bound:
        return Diagnosis(
            "gpu_for_vm", f"this machine's NVIDIA GPU ({names}) is bound to vfio-pci: it is set aside for a "
            "virtual machine", "run the notebook in that virtual machine, or unbind the GPU from vfio-pci "
            f"and {install}", True)
    if "nouveau" in bound:
        return Diagnosis("nouveau", f"this machine's NVIDIA GPU ({names}) runs on nouveau, the open-source "
                         "driver, which CUDA cannot use", install, True)
    if machine.kernel_driver is not None:
        return Diagnosis(
            "driver_libraries_missing", f"the NVIDIA kernel driver{version} is loaded, but its libraries "
            "(libnvidia-ml.so.1, libcuda.so.1) are missing or not on the loader's path",
            f"reinstall the driver with its libraries, matching the loaded{version}: "
            f"{driver_package(machine.distribution)}; then `nvidia-smi` lists the GPU", True)
    return Diagnosis("no_driver", f"this machine has {the_gpu} but no NVIDIA driver", install, True)


def diagnose(view: Any, problem: Any, gpus: list, env: dict, machine: Machine, place: Place) -> list:
    """Every reason torch cannot use a GPU here, the real cause first (empty when it can).

    ``view`` is torch's :class:`~.gpumap.TorchView`, ``problem`` NVML's :class:`~.snapshots.NVMLProblem` (or
    None), ``gpus`` the GPUs NVML sees, ``env`` the report's environment (driver versions,
    ``CUDA_VISIBLE_DEVICES``), ``machine`` and ``place`` what :func:`.machine.survey` and
    :func:`.hosting.where` found."""
    if view.is_available and view.devices:
        return []
    code = problem.code if problem is not None else None
    nvml_blind = code in _NO_DRIVER or code == "bindings_missing"
    absent = not gpus and (code is None or nvml_blind) and (
        machine.has_nvidia_gpu is False
        or (machine.has_nvidia_gpu is None and place.hosted is not None and code != "bindings_missing"))
    if absent:
        return [_no_nvidia_gpu(view, machine, place)]
    causes = []
    if code in _NO_DRIVER:
        cause = _driver_cause(problem, gpus, machine, place)
        if cause is not None:
            causes.append(cause)
    elif problem is None and not gpus:
        if place.container is not None:
            causes.append(Diagnosis("no_gpu", "the NVIDIA driver is here, but no GPU was given to this "
                                    "container", container_gpu_fix(place.container)))
        else:
            names = machine.gpu_names()
            seen = f" ({names} on the PCI bus)" if names else ""
            causes.append(Diagnosis("no_gpu", f"the NVIDIA driver works but finds no GPU{seen}",
                                    "`sudo dmesg | grep -i nvidia` says why: a GPU too new or too old for "
                                    "this driver, or one that has fallen off the bus"))
    names = sorted({str(g.name) for g in gpus})
    seen = f"{len(gpus)} NVIDIA GPU{'s' if len(gpus) != 1 else ''} ({', '.join(names)})" if gpus else ""
    if not view.cuda and not view.hip:
        gpu_names = ", ".join(names) or machine.gpu_names()
        count = len(gpus) or len(machine.nvidia_gpus or ())
        what = (f"this machine's {count} NVIDIA GPUs" if count > 1 else "this machine's NVIDIA GPU") + (
            f" ({gpu_names})" if gpu_names else "")
        driver_ok = problem is None and bool(gpus)
        if driver_ok:
            fix = cuda_build_install(env["driver_version"], env["cuda_driver_version"])
        else:
            fix = ("once the driver works, " if code in _NO_DRIVER else "") + (
                "install a CUDA build of torch that the driver supports (https://pytorch.org/get-started/locally/)")
        message = f"torch {view.version} is a CPU-only build: {what} needs a CUDA build of torch"
        causes.insert(0 if driver_ok else len(causes), Diagnosis("cpu_only_build", message, fix))
    visible = env["CUDA_VISIBLE_DEVICES"]
    if visible is not None and gpus and not parse_cuda_visible_devices(visible, gpus):
        causes.append(Diagnosis(
            "hidden_by_cuda_visible_devices",
            f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU ({seen} present)",
            "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (e.g. '0'), then restart the kernel: "
            "CUDA reads it once, when it starts"))
    if view.cuda:
        need, have = version_tuple(view.cuda), version_tuple(env["cuda_driver_version"])
        if need and have and have[0] < need[0]:
            causes.append(Diagnosis(
                "driver_too_old",
                f"driver {env['driver_version']} supports CUDA up to {env['cuda_driver_version']}, "
                f"but torch {view.version} was built with CUDA {view.cuda}",
                f"update the NVIDIA driver to one for CUDA {need[0]}.x, or install a torch built for "
                f"CUDA {have[0]}.x"))
    if view.other_accelerators:
        first = view.other_accelerators[0]
        causes.append(Diagnosis(
            "other_accelerator",
            f"torch can use another accelerator here instead: {', '.join(view.other_accelerators)}",
            f"run on it with torch.device({first!r}) (or %%ontorch {first})"))
    if not causes:
        said = f" torch warned: {view.warnings[0]}" if view.warnings else ""
        where = seen or machine.gpu_names() or "a GPU"
        causes.append(Diagnosis(
            "unknown", f"torch.cuda.is_available() is False although {where} is here.{said}",
            "run `nvidia-smi` and `python -c 'import torch; torch.cuda.init()'` to see CUDA's own error"))
    return causes
