"""Where this kernel runs: a hosted notebook service, a container, a virtual machine.

Each changes what "get a GPU" means: on Colab it is a menu, in a container a flag of the runtime that
started it, in a VM the machine type or a passthrough on its host. The markers, each from the service's
own code or documentation (no guesses; a service is named only where its environment says so):

- Google Colab: ``COLAB_RELEASE_TAG`` in the environment (kagglehub's ``src/kagglehub/env.py``,
  ``is_in_colab_notebook``), or ``google.colab`` imported (Colab's kernel imports it at start-up).
- Kaggle: ``KAGGLE_KERNEL_RUN_TYPE`` ('Interactive' or 'Batch'; kagglehub's ``is_in_kaggle_notebook``).
- Amazon SageMaker Studio Lab: the home folder ``/home/studio-lab-user`` (AWS's Studio Lab guide lists its
  conda environments under it, ``studio-lab-use-migrate.md``).
- Paperspace Gradient: ``PAPERSPACE_NOTEBOOK_REPO_ID`` (ZenML's ``src/zenml/environment.py``,
  ``in_paperspace_gradient``).
- Lightning AI Studios: ``LIGHTNING_CLOUD_SPACE_ID`` with ``LIGHTNING_INTERACTIVE=true`` (lightning-sdk's
  ``in_studio``).
- Databricks: ``DATABRICKS_RUNTIME_VERSION``, which every Databricks Runtime sets.

Containers: Docker's ``/.dockerenv``, Podman's ``/run/.containerenv``, Apptainer/Singularity's
``/.singularity.d`` (and ``APPTAINER_CONTAINER`` / ``SINGULARITY_CONTAINER``), Kubernetes'
``KUBERNETES_SERVICE_HOST`` (set in every pod), the ``container`` variable systemd-nspawn, LXC and Podman
set, and a container runtime's name in ``/proc/1/cgroup`` (cgroup v1) or in ``/proc/self/mountinfo`` (the
overlay root and the runtime's bind mounts of /etc/hostname, also under cgroup v2).
Virtual machines: DMI's ``sys_vendor`` / ``product_name`` (``/sys/class/dmi/id``), Xen's
``/sys/hypervisor/type``, and the CPU's ``hypervisor`` flag (``/proc/cpuinfo``) where neither names one.

Every reader takes ``root``, ``environ`` and ``modules`` (``sys.modules``) so that tests script them;
:func:`where` reads :data:`ROOT`, ``os.environ`` and ``sys.modules`` when given none. Standard library only.
What the files say of a container or a virtual machine cannot change while a process runs, so it is read
once per ``root`` (:func:`torchgpu_magic.caches.reset_caches` forgets it); the environment, every time.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping, Optional

from ..caches import cache
from .machine import read_text

ROOT = "/"

__all__ = ["ROOT", "Service", "SERVICES", "Place", "hosted_service", "container", "virtual_machine", "where"]


@dataclass(frozen=True)
class Service:
    """A hosted notebook service: its ``name``, how to switch this notebook to a GPU (``gpu``), and what
    switching does to the kernel's state (``switching``)."""

    name: str
    gpu: str
    switching: str


SERVICES = {
    "colab": Service(
        "Google Colab",
        "Runtime > Change runtime type > a GPU (T4 on the free tier)",
        "the new runtime starts empty: variables, pip installs and files under /content are lost, so run the "
        "notebook again"),
    "kaggle": Service(
        "Kaggle",
        "the notebook's Settings > Accelerator: a GPU (needs a phone-verified account)",
        "the session restarts: variables are lost; run the notebook again from the top"),
    "studiolab": Service(
        "Amazon SageMaker Studio Lab",
        "stop this project runtime, then under My Project choose the GPU compute type and start it again",
        "the runtime restarts: your files are kept, variables are lost; run the notebook again"),
    "paperspace": Service(
        "Paperspace Gradient",
        "stop this notebook, choose a GPU machine type for it, and start it again",
        "the notebook's machine restarts: files under /notebooks and /storage are kept, variables are lost"),
    "lightning": Service(
        "Lightning AI Studio",
        "switch the Studio to a GPU machine (the machine selector of the Studio)",
        "the Studio's files carry over, its running kernels restart: variables are lost"),
    "databricks": Service(
        "Databricks",
        "attach this notebook to a cluster of GPU instances running a Databricks Runtime for Machine "
        "Learning (GPU)",
        "the notebook's state (variables) stays with the old cluster; run the notebook again there"),
}


@dataclass(frozen=True)
class Place:
    """Where the kernel runs: a hosted ``service`` (:data:`SERVICES` key), a ``container`` runtime
    ('docker', 'podman', 'kubernetes', 'apptainer', 'lxc', 'containerd', 'container' when the runtime is not
    named), a ``vm`` (its hypervisor or cloud, 'a virtual machine' when unnamed); None each where not."""

    service: Optional[str] = None
    container: Optional[str] = None
    vm: Optional[str] = None

    @property
    def hosted(self) -> Optional[Service]:
        return SERVICES.get(self.service) if self.service else None

    def describe(self) -> str:
        """'Google Colab (a Docker container, on Google Compute Engine)', for the report's environment."""
        parts = []
        if self.container:
            parts.append(_CONTAINER_WORDS.get(self.container, f"a {self.container} container"))
        if self.vm:
            parts.append(f"on {self.vm}" if self.vm != "a virtual machine" else "in a virtual machine")
        if self.hosted is not None:
            return self.hosted.name + (f" ({', '.join(parts)})" if parts else "")
        return ", ".join(parts) if parts else "this machine directly (no container or virtual machine seen)"


# A runtime's words in a report; any other (containerd, systemd-nspawn) is 'a <runtime> container'.
_CONTAINER_WORDS = {
    "docker": "a Docker container", "podman": "a Podman container", "kubernetes": "a Kubernetes pod",
    "apptainer": "an Apptainer/Singularity container", "lxc": "an LXC container", "container": "a container",
}


def hosted_service(environ: Mapping[str, str], modules: Mapping[str, object]) -> Optional[str]:
    """The :data:`SERVICES` key of the hosted notebook this kernel runs on, or None."""
    markers = {  # in this order: the first service whose marker is there
        "colab": environ.get("COLAB_RELEASE_TAG") or "google.colab" in modules,
        "kaggle": environ.get("KAGGLE_KERNEL_RUN_TYPE"),
        "studiolab": environ.get("HOME", "").rstrip("/") == "/home/studio-lab-user",
        "paperspace": environ.get("PAPERSPACE_NOTEBOOK_REPO_ID"),
        "lightning": (environ.get("LIGHTNING_CLOUD_SPACE_ID")
                      and environ.get("LIGHTNING_INTERACTIVE", "").lower() == "true"),
        "databricks": environ.get("DATABRICKS_RUNTIME_VERSION"),
    }
    return next((service for service, seen in markers.items() if seen), None)


# Words in /proc/1/cgroup or /proc/self/mountinfo that name a container runtime, most specific first.
_RUNTIME_WORDS = (("kubepods", "kubernetes"), ("kubelet", "kubernetes"), ("libpod", "podman"),
                  ("docker", "docker"), ("containerd", "containerd"), ("lxc", "lxc"))


def container(root: str = "/", environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The container runtime this process runs under ('docker', 'podman', 'kubernetes', 'apptainer', 'lxc',
    'containerd', 'systemd-nspawn', or 'container' when one is certain but unnamed), or None. The
    environment is read every time; what the files say, once per ``root`` (:func:`_container_files`)."""
    environ = os.environ if environ is None else environ
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    apptainer, cgroup, podman, docker, mounts = _container_files(root)
    if environ.get("APPTAINER_CONTAINER") or environ.get("SINGULARITY_CONTAINER") or apptainer:
        return "apptainer"
    if cgroup:
        return cgroup
    if podman:
        return "podman"
    if docker:
        return "docker"
    named = environ.get("container", "").strip().lower()
    if named:
        return named if named in ("podman", "docker", "lxc", "systemd-nspawn") else "container"
    return mounts


@cache
def _container_files(root: str) -> tuple:
    """What the files say of a container, in :func:`container`'s order: (Apptainer's folder, the runtime
    named in PID 1's cgroup, Podman's marker, Docker's marker, the runtime named by the bind mount of
    /etc/hostname or /etc/resolv.conf). Kept for the process's life: the container a process runs in
    is set when it starts (``%gpuinfo`` runs this on every call, on every engine of a cluster)."""
    cgroup = read_text(root, "proc/1/cgroup") or ""
    named = next((runtime for word, runtime in _RUNTIME_WORDS if word in cgroup), None)
    mounted = None
    for line in (read_text(root, "proc/self/mountinfo") or "").splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] in ("/etc/hostname", "/etc/resolv.conf"):
            mounted = next((runtime for word, runtime in _RUNTIME_WORDS if word in line), None)
            if mounted:
                break
    return (os.path.isdir(os.path.join(root, ".singularity.d")), named,
            os.path.exists(os.path.join(root, "run/.containerenv")),
            os.path.exists(os.path.join(root, ".dockerenv")), mounted)


# DMI vendor / product words -> how a report names the VM.
_VMS = (("Google Compute Engine", "Google Compute Engine"), ("Amazon EC2", "Amazon EC2"),
        ("Microsoft Corporation", "Hyper-V (or Azure)"), ("VMware", "VMware"),
        ("innotek", "VirtualBox"), ("VirtualBox", "VirtualBox"), ("QEMU", "a QEMU/KVM virtual machine"),
        ("KVM", "a KVM virtual machine"), ("Xen", "Xen"), ("OpenStack", "OpenStack"),
        ("DigitalOcean", "DigitalOcean"), ("Parallels", "Parallels"), ("BHYVE", "bhyve"))


@cache
def virtual_machine(root: str = "/") -> Optional[str]:
    """The hypervisor or cloud of the virtual machine this runs in ('Amazon EC2', 'a KVM virtual machine',
    'a virtual machine' when unnamed), or None on bare metal (or where it cannot be told). Kept per
    ``root`` for the process's life: the machine a process runs on does not change under it."""
    dmi = " ".join((read_text(root, f"sys/class/dmi/id/{name}") or "").strip()
                   for name in ("sys_vendor", "product_name", "bios_vendor"))
    for word, name in _VMS:
        if word.lower() in dmi.lower():
            return name
    hypervisor = (read_text(root, "sys/hypervisor/type") or "").strip()
    if hypervisor:
        return hypervisor.capitalize()
    for line in (read_text(root, "proc/cpuinfo") or "").splitlines():
        if line.startswith("flags") and " hypervisor" in f" {line.split(':', 1)[-1]}":
            return "a virtual machine"
    return None


def where(root: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
          modules: Optional[Mapping[str, object]] = None) -> Place:
    """Where this kernel runs (or the scripted ``root`` / ``environ`` / ``modules``)."""
    root = ROOT if root is None else root
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    return Place(hosted_service(environ, modules), container(root, environ), virtual_machine(root))
