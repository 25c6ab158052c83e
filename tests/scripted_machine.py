"""A machine's file system as %gpuinfo's readers see it, written into a temporary folder: the PCI bus in
sysfs, the NVIDIA kernel module's /proc file, os-release, container and VM markers, WSL's files.

The contents are the real files' formats: sysfs holds one hex value per file (``vendor`` 0x10de, ``class``
0x030200 for a 3D controller, 0x030000 for VGA, 0x040300 for an NVIDIA GPU's HDMI audio function) and a
``driver`` link to ``/sys/bus/pci/drivers/<name>``; ``/proc/driver/nvidia/version`` is the line the
NVIDIA module writes; pci.ids is the database's own layout (a vendor line, tab-indented device lines).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

UBUNTU = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nID=debian\n'
FEDORA = 'NAME="Fedora Linux"\nVERSION="42 (Workstation Edition)"\nID=fedora\nPRETTY_NAME="Fedora Linux 42"\n'
ROCKY = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nPRETTY_NAME="Rocky Linux 9.6"\n'
ARCH = 'NAME="Arch Linux"\nPRETTY_NAME="Arch Linux"\nID=arch\n'
NVRM = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 13.3.0\n"
)
PCI_IDS = (
    "# pci.ids excerpt\n10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n"
    "\t2684  AD102 [GeForce RTX 4090]\n\t22ba  AD102 High Definition Audio Controller\n"
    "10df  Emulex Corporation\n"
)
CPUINFO_VM = (
    "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae mce sse sse2 ht syscall nx lm hypervisor\n"
)
CPUINFO_METAL = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae mce sse sse2 ht syscall nx lm\n"


class Tree:
    """A root folder to point the readers at; methods add what a machine has."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def write(self, path: str, text: str = "") -> Tree:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return self

    def pci(
        self, address: str, vendor: str, klass: str, device: str = "0x0000", driver: Optional[str] = None
    ) -> Tree:
        base = f"sys/bus/pci/devices/{address}"
        self.write(f"{base}/vendor", f"{vendor}\n").write(f"{base}/class", f"{klass}\n")
        self.write(f"{base}/device", f"{device}\n")
        if driver:
            os.symlink(f"../../../bus/pci/drivers/{driver}", self.root / base / "driver")
        return self

    def board(self) -> Tree:
        """What every x86 machine's bus has: a host bridge and a virtio network device."""
        return self.pci("0000:00:00.0", "0x8086", "0x060000", "0x1237").pci(
            "0000:00:03.0", "0x1af4", "0x020000", "0x1000", "virtio-pci"
        )

    def nvidia(
        self,
        device: str = "0x2330",
        driver: Optional[str] = None,
        address: str = "0000:01:00.0",
        klass: str = "0x030200",
    ) -> Tree:
        """An NVIDIA GPU (and, like a real card, its audio function, which is no GPU)."""
        self.pci(address, "0x10de", klass, device, driver)
        return self.pci(address[:-1] + "1", "0x10de", "0x040300", "0x22ba", "snd_hda_intel")


def linux(tmp: Path, os_release: str = UBUNTU, vm: bool = False) -> Tree:
    """A Linux machine's root with a readable PCI bus of its own (no NVIDIA device yet)."""
    tree = Tree(tmp).board().write("etc/os-release", os_release)
    return tree.write("proc/cpuinfo", CPUINFO_VM if vm else CPUINFO_METAL).write(
        "usr/share/misc/pci.ids", PCI_IDS
    )
