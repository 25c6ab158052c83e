"""What this machine has, read without any GPU maker's software: its NVIDIA GPUs (and AMD's and Intel's),
their kernel driver, its OS.

NVML and CUDA can only say what the driver says; where there is no driver they cannot tell "no GPU" from
"a GPU without a driver", and the two need opposite advice (nothing to install, or a driver to install).
So this module reads what the operating system itself knows:

- Linux: the PCI bus in sysfs (``/sys/bus/pci/devices/*/{vendor,class,device}``): NVIDIA's vendor id
  0x10de with a display class (0x03: VGA 0x0300, 3D controller 0x0302) is an NVIDIA GPU whether or not a
  driver is installed, and each device's ``driver`` link names the kernel driver bound to it (``nvidia``,
  ``nouveau``, ``vfio-pci``). A container sees the host's PCI devices and the host's kernel, so this also
  tells, inside one, whether the host has a GPU and a loaded driver. AMD's vendor id 0x1002 and Intel's
  0x8086 are read the same way (their driver links name ``amdgpu``, ``i915``, ``xe``). The loaded NVIDIA
  kernel module and
  its version come from ``/proc/driver/nvidia/version`` (or ``/sys/module/nvidia``). Names come from the
  pci.ids database where the system has one (``/usr/share/misc/pci.ids``, ``/usr/share/hwdata/pci.ids``).
- WSL: no PCI bus to read; Windows' driver is shared into Linux through ``/dev/dxg`` (GPU
  paravirtualisation, WSL 2 only) and ``/usr/lib/wsl/lib`` (libcuda.so, libnvidia-ml.so.1 and nvidia-smi
  from the Windows driver) -- Microsoft's and NVIDIA's "CUDA on WSL" guides.
- macOS: no NVIDIA driver for any current macOS, so never an NVIDIA GPU torch can use.
- The distribution (``/etc/os-release``), to name its own driver package.

Every reader takes ``root`` (the file system to read), so tests script a sysfs tree in a temporary folder;
:func:`survey` reads :data:`ROOT` when given none (a test of the whole report points it at such a tree)
and also takes ``system`` and ``release`` (``platform.system()`` and ``platform.release()``). Standard
library only; nothing here raises for a file it cannot read.

A survey runs on every ``%gpuinfo`` (on every engine for ``--cluster``), and reading each PCI device's ids
was most of it: the ids are kept per bus listing (:func:`_bus`) and the names until the pci.ids file
changes, while what can change between two calls (the drivers bound, the kernel module, the listing
itself) is read every time. :func:`torchgpu_magic.caches.reset_caches` forgets what is kept.
"""
from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..caches import table

__all__ = ["ROOT", "NVIDIA_VENDOR", "AMD_VENDOR", "INTEL_VENDOR", "PCIGPU", "Distribution", "Machine",
           "pci_gpus", "kernel_driver", "distribution", "is_wsl", "wsl_gpu", "survey", "read_text"]

ROOT = "/"
NVIDIA_VENDOR = "0x10de"
AMD_VENDOR = "0x1002"  # AMD/ATI's PCI vendor id: Radeon, Instinct (and APUs' integrated graphics)
INTEL_VENDOR = "0x8086"  # Intel's: Arc, Data Center GPU Max (and CPUs' integrated graphics)
VENDOR_NAMES = {NVIDIA_VENDOR: "NVIDIA", AMD_VENDOR: "AMD", INTEL_VENDOR: "Intel"}
_DISPLAY_CLASS = "0x03"  # PCI base class 03h: display controller (VGA 0300, XGA 0301, 3D 0302, other 0380)
# AMD's Instinct MI300/MI325 list as "Processing accelerators [1200]" (apache/cloudstack#11701's lspci),
# its older Instincts and Radeons as display controllers; Intel's class 12h is its NPUs, no GPU
_GPU_CLASSES = {AMD_VENDOR: (_DISPLAY_CLASS, "0x12")}
_PCI_IDS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/pci.ids")


@dataclass(frozen=True)
class PCIGPU:
    """A display device on the PCI bus (NVIDIA's unless ``vendor`` says AMD's or Intel's): its address,
    device id, name (from pci.ids, where the system has it) and the kernel driver bound to it (None when
    none is)."""

    address: str
    device: str
    name: Optional[str] = None
    driver: Optional[str] = None
    vendor: str = NVIDIA_VENDOR

    def label(self) -> str:
        """How a report names it: the marketing name where pci.ids has one, else the PCI ids."""
        maker = VENDOR_NAMES.get(self.vendor, self.vendor)
        return f"{maker} {self.name}" if self.name else (
            f"{maker} device {self.vendor.replace('0x', '')}:{self.device.replace('0x', '')}")


@dataclass(frozen=True)
class Distribution:
    """The Linux distribution from os-release: ``id`` ('ubuntu'), ``like`` ('debian'), ``name``."""

    id: str
    like: tuple = ()
    name: str = ""

    def is_a(self, *ids: str) -> bool:
        return self.id in ids or any(i in ids for i in self.like)


@dataclass(frozen=True)
class Machine:
    """What the OS says about NVIDIA hardware here.

    ``nvidia_gpus`` is a tuple (empty: the PCI bus was read and has none) or None (it could not be read:
    not Linux, sysfs absent or empty, as under WSL or some sandboxes). ``kernel_driver`` is the loaded
    NVIDIA kernel module's version ('' when loaded and its version unknown), None when not loaded.
    ``wsl`` is True under Windows' WSL; ``wsl_gpu`` then says whether Windows shares a GPU (/dev/dxg) and
    ``wsl_nvidia`` whether that includes NVIDIA's driver (its files in /usr/lib/wsl/lib). ``amd_gpus`` and
    ``intel_gpus`` are AMD's and Intel's display devices on the bus, read as ``nvidia_gpus`` is (their
    CPUs' integrated graphics included).
    """

    system: str
    nvidia_gpus: Optional[tuple] = None
    kernel_driver: Optional[str] = None
    wsl: bool = False
    wsl_gpu: bool = False
    wsl_nvidia: bool = False
    distribution: Optional[Distribution] = None
    amd_gpus: Optional[tuple] = None
    intel_gpus: Optional[tuple] = None

    @property
    def has_nvidia_gpu(self) -> Optional[bool]:
        """True or False where this machine can say, None where it cannot (Windows, an unreadable bus)."""
        if self.system == "Darwin":
            return False
        if self.wsl:
            return True if self.wsl_nvidia else None
        return None if self.nvidia_gpus is None else bool(self.nvidia_gpus)

    def gpu_names(self) -> str:
        """'NVIDIA H100 80GB HBM3' or '2 x ...' or 'NVIDIA device 10de:2330, ...' for a report."""
        labels = [g.label() for g in self.nvidia_gpus or ()]
        if len(labels) > 1 and len(set(labels)) == 1:
            return f"{len(labels)} x {labels[0]}"
        return ", ".join(labels)


def read_text(root: str, path: str) -> Optional[str]:
    """The text of the file at ``path`` under ``root``; None where it cannot be read. Nothing here raises for
    a file it cannot read."""
    try:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def pci_gpus(root: str = "/", vendor: str = NVIDIA_VENDOR) -> Optional[tuple]:
    """The display devices of ``vendor`` (its PCI vendor id) on the PCI bus (:class:`PCIGPU`), in address
    order; None where the bus cannot be read or lists no device at all (a machine always has some: an
    empty list means a sandbox or a system without sysfs, not a machine without GPUs). The driver bound
    to each is read afresh every time (a driver can be bound or unbound at any moment); the devices'
    ids and names come from :func:`_bus` and :func:`_pci_names`, which keep them."""
    return _gpus_on(_bus(root), root, vendor)


def _gpus_on(bus: Optional[dict], root: str, vendor: str) -> Optional[tuple]:
    """:func:`pci_gpus` of the bus ``bus`` (:func:`_bus`), which a survey reads once for all three
    vendors."""
    if bus is None:
        return None
    classes = _GPU_CLASSES.get(vendor, (_DISPLAY_CLASS,))
    found = [(address, device) for address, klass, device in bus.get(vendor, ()) if klass.startswith(classes)]
    names = _pci_names(root, frozenset(device for _, device in found), vendor) if found else {}
    return tuple(PCIGPU(address, device, names.get(device), _driver(root, address), vendor)
                 for address, device in found)


def _driver(root: str, address: str) -> Optional[str]:
    """The kernel driver bound to the PCI device at ``address``; None when none is (no ``driver`` link)."""
    try:
        return os.path.basename(os.readlink(os.path.join(root, "sys/bus/pci/devices", address, "driver")))
    except OSError:
        return None


_BUS = table()  # root -> (the bus's listing as read, its devices by vendor)
_NAMES = table()  # (root, vendor, device ids, the database's (path, size, mtime)) -> {device id: name}


def _bus(root: str) -> Optional[dict]:
    """``{vendor: ((address, class, device), ...)}``: every device on the PCI bus, by vendor, in address
    order; None where the bus cannot be read or lists none. Reading the ids is most of a survey's cost
    (three small files per device, every device of the machine), and they cannot change while the
    device stays at its address, so they are read again only when the bus's listing changes (a device
    added or removed); a listing whose files could not all be read is not kept. Grouped by vendor once
    per listing: a GPU server's bus lists some hundred devices, which each vendor's look went through."""
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        listing = os.listdir(base)
    except OSError:
        return None
    if not listing:
        return None
    kept = _BUS.get(root)
    if kept is not None and kept[0] == listing:  # listed as last time, in the same order: unchanged
        return kept[1]
    read = {address: tuple(read_text(base, f"{address}/{name}") for name in ("vendor", "class", "device"))
            for address in sorted(listing)}
    bus: dict = {}
    for address, texts in read.items():
        vendor, klass, device = ((text or "").strip().lower() for text in texts)
        bus.setdefault(vendor, []).append((address, klass, device))
    bus = {vendor: tuple(devices) for vendor, devices in bus.items()}
    if all(text is not None for texts in read.values() for text in texts):
        _BUS[root] = (listing, bus)
    return bus


def _pci_names(root: str, devices: frozenset, vendor: str = NVIDIA_VENDOR) -> dict:
    """Device id -> name from the pci.ids database (``vendor``'s block only), where the system has one;
    kept until the database file changes (its size or modification time), since reading it means
    reading the whole file (over a megabyte)."""
    return _first_file(root, _PCI_IDS, _NAMES, (vendor, devices),
                       lambda text: _names_in(text or "", devices, vendor)) or {}


def _first_file(root: str, paths: tuple, kept: dict, key: tuple,
                parse: Callable[[Optional[str]], Any]) -> Any:
    """``parse`` of the text (None: unreadable) of the first of ``paths`` that exists under ``root``, kept
    in ``kept`` until that file changes; where it answers False, the next file speaks; else None."""
    for path in paths:
        try:
            stat = os.stat(os.path.join(root, path))
        except OSError:
            continue
        at = (root, *key, path, stat.st_size, stat.st_mtime_ns)
        if at not in kept:
            kept[at] = parse(read_text(root, path))
        if kept[at] is not False:
            return kept[at]
    return None


def _names_in(text: str, devices: frozenset, vendor: str) -> dict:
    """Device id -> name for ``devices`` of ``vendor`` in the text of a pci.ids database."""
    names: dict = {}
    inside = False
    for line in text.splitlines():
        if line.startswith(vendor.replace("0x", "") + " "):
            inside = True
        elif inside and line and not line.startswith(("\t", "#")):
            break
        elif inside and line.startswith("\t") and not line.startswith("\t\t"):
            ident, _, name = line.strip().partition(" ")
            if f"0x{ident.lower()}" in devices:
                names[f"0x{ident.lower()}"] = name.strip()
    return names


def kernel_driver(root: str = "/") -> Optional[str]:
    """The loaded NVIDIA kernel module's version ('580.95.05'), '' when it is loaded but says no version,
    None when it is not loaded. Inside a container this is the host's: the kernel is shared."""
    text = read_text(root, "proc/driver/nvidia/version")
    if text is not None:
        match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", text)
        return match.group(1) if match else ""
    if os.path.isdir(os.path.join(root, "sys/module/nvidia")):
        return (read_text(root, "sys/module/nvidia/version") or "").strip()
    return None


def distribution(root: str = "/") -> Optional[Distribution]:
    """The distribution named by ``/etc/os-release`` (or ``/usr/lib/os-release``), or None."""
    return _first_file(root, ("etc/os-release", "usr/lib/os-release"), _RELEASES, (),
                       lambda text: _release(text) if text else False)  # empty or unreadable: the next


_RELEASES = table()  # (root, path, size, mtime) -> the distribution it names (False: empty): read once


def _release(text: str) -> Optional[Distribution]:
    """The distribution an os-release text names, or None."""
    fields = {key.strip(): value.strip().strip('"').strip("'")
              for key, sep, value in (line.partition("=") for line in text.splitlines()) if sep}
    if not fields.get("ID"):
        return None
    return Distribution(fields["ID"].lower(), tuple(fields.get("ID_LIKE", "").lower().split()),
                        fields.get("PRETTY_NAME") or fields.get("NAME", ""))


def is_wsl(root: str = "/", release: Optional[str] = None) -> bool:
    """Whether Linux runs under Windows' WSL: its kernel release says 'microsoft' (WSL 1: 'Microsoft',
    WSL 2: '...-microsoft-standard-WSL2')."""
    text = release if release is not None else (read_text(root, "proc/sys/kernel/osrelease") or "")
    return "microsoft" in text.lower()


def wsl_gpu(root: str = "/") -> tuple:
    """``(shared, nvidia)`` under WSL: whether Windows shares a GPU with Linux (/dev/dxg, WSL 2's GPU
    paravirtualisation) and whether NVIDIA's Windows driver is among it (its libraries in /usr/lib/wsl/lib,
    or its folder in /usr/lib/wsl/drivers)."""
    shared = os.path.exists(os.path.join(root, "dev/dxg"))
    lib = os.path.join(root, "usr/lib/wsl/lib")
    nvidia = any(os.path.exists(os.path.join(lib, name)) for name in ("libnvidia-ml.so.1", "libcuda.so.1"))
    try:
        folders = os.listdir(os.path.join(root, "usr/lib/wsl/drivers"))
    except OSError:
        folders = []
    nvidia = nvidia or any(folder.lower().startswith("nv") for folder in folders)
    return shared, nvidia


def survey(root: Optional[str] = None, system: Optional[str] = None,
           release: Optional[str] = None) -> Machine:
    """Everything this module reads, for this machine (or the tree at ``root``, :data:`ROOT` by default)."""
    root = ROOT if root is None else root
    system = platform.system() if system is None else system
    if system != "Linux":
        return Machine(system)
    release = platform.release() if release is None and root == "/" else release
    wsl = is_wsl(root, release)
    shared, nvidia = wsl_gpu(root) if wsl else (False, False)
    bus = None if wsl else _bus(root)  # None: no bus to read, so no GPU lists
    return Machine(system, nvidia_gpus=_gpus_on(bus, root, NVIDIA_VENDOR), kernel_driver=kernel_driver(root),
                   wsl=wsl, wsl_gpu=shared, wsl_nvidia=nvidia, distribution=distribution(root),
                   amd_gpus=_gpus_on(bus, root, AMD_VENDOR), intel_gpus=_gpus_on(bus, root, INTEL_VENDOR))
