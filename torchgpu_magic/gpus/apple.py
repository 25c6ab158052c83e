"""The Mac itself, for ``%gpuinfo`` on Apple silicon: which chip, how much unified memory, which macOS, and
whether this Python runs translated by Rosetta (an x86_64 Python on an Apple silicon Mac, where no torch
can use the GPU).

Read from ``sysctl -n NAME`` (``machdep.cpu.brand_string``, ``hw.memsize``, ``kern.osproductversion``,
``hw.optional.arm64``, ``sysctl.proc_translated``), once per process, and only where it can answer: on
macOS, or where torch is an MPS build. A name the Mac does not know (``sysctl.proc_translated`` on an
Intel Mac) is None. Standard library only.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional

_FACTS: Any = None  # the MacFacts read once per process


@dataclass(frozen=True)
class MacFacts:
    """What ``sysctl`` says: the chip ('Apple M2 Max'), the memory in bytes, the macOS version ('14.5'),
    whether the Mac is Apple silicon, and whether this process is translated by Rosetta."""

    chip: Optional[str] = None
    memory: Optional[int] = None
    macos: Optional[str] = None
    apple_silicon: Optional[bool] = None
    translated: Optional[bool] = None


def _sysctl(name: str, command: str) -> Optional[str]:
    try:
        done = subprocess.run([command, "-n", name], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    value = done.stdout.strip()
    return value if done.returncode == 0 and value else None


def _flag(text: Optional[str]) -> Optional[bool]:
    return None if text is None else text == "1"


def mac_facts(torch_has_mps: bool = False) -> Optional[MacFacts]:
    """The Mac's facts (read once), or None where this is not a Mac and torch has no MPS build."""
    global _FACTS
    if _FACTS is None:
        command = shutil.which("sysctl")
        if command is None or not (sys.platform == "darwin" or torch_has_mps):
            return None
        memory = _sysctl("hw.memsize", command)
        _FACTS = MacFacts(_sysctl("machdep.cpu.brand_string", command),
                          int(memory) if memory and memory.isdigit() else None,
                          _sysctl("kern.osproductversion", command),
                          _flag(_sysctl("hw.optional.arm64", command)),
                          _flag(_sysctl("sysctl.proc_translated", command)))
    return _FACTS
