"""One AMD Instinct MI300X under ROCm 6.4, simulated under a CPU-only build of torch: the ``rocm`` leg
(``pytest --simulate rocm``) and the fixture ``simulated_rocm``.

A ROCm build of torch is torch's ``cuda`` API over HIP: ``torch.version.hip`` is set and
``torch.version.cuda`` is None, ``torch.cuda.*`` and ``torch.accelerator`` answer for the AMD GPU, the
device type is ``cuda``. So this leg is the simulated GPU of tests/simulated_gpu.py (its
``torch._C._cuda_*`` stand-ins, its timeline, its events) with the MI300X's properties as torch prints
them on ROCm (name, ``gcnArchName='gfx942:sramecc+:xnack-'``, 304 compute units, a 4 MB L2, 200998912 KB
of VRAM: ``rocminfo`` on an MI300X, ROCm/rocprof-compute-viewer#29), a ``_sleep`` at its 2100 MHz, and
HIP's visibility variables read as HIP reads them. There is no NVIDIA driver: ``import pynvml`` works
(torchgpu_magic depends on nvidia-ml-py) but ``nvmlInit`` fails with "NVML Shared Library Not Found"
(tests/fake_pynvml.py's ``no_library``). AMD SMI is tests/fake_amdsmi.py's ``mi300x``.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

import fake_amdsmi
import fake_pynvml
import simulated_gpu
import torch

MiB = 2**20
HIP_VERSION = "6.4.43482-0f2d60242"
CLOCK_HZ = 2100e6  # the MI300X's peak engine clock (rocminfo: Max Clock Freq. 2100 MHz)
CYCLES_PER_US = 2100
HIP_RUNTIME = 512 * MiB  # what the HIP runtime itself holds on the GPU once initialised (scripted)
UUID = "6aff74a1-0000-1000-80b4-3a2f9d0c1e55"


class Properties:
    """``torch.cuda.get_device_properties(0)`` of an MI300X on a ROCm build."""

    def __init__(self) -> None:
        self.name = "AMD Instinct MI300X"
        self.major, self.minor = 9, 4
        self.gcnArchName = "gfx942:sramecc+:xnack-"
        self.total_memory = 200998912 * 1024
        self.multi_processor_count = 304
        self.L2_cache_size = 4 * MiB
        self.uuid = UUID
        self.pci_bus_id, self.pci_device_id, self.pci_domain_id = 0x0C, 0, 0
        self.is_integrated = self.is_multi_gpu_board = 0
        self.warp_size = 64
        self.max_threads_per_multi_processor = 2048
        self.memory_clock_rate, self.memory_bus_width, self.clock_rate = 1300000, 8192, 2100000

    def __repr__(self) -> str:
        return ("_CudaDeviceProperties(name='AMD Instinct MI300X', major=9, minor=4, "
                "gcnArchName='gfx942:sramecc+:xnack-', total_memory=196288MB, multi_processor_count=304, "
                f"uuid={self.uuid}, L2_cache_size=4MB)")


def visible_count() -> int:
    """How many GPUs HIP enumerates on this one-GPU machine: ROCR_VISIBLE_DEVICES filters first (the
    runtime), then HIP_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES (HIP honours it too); an empty value, an
    index other than 0 or a UUID that is not this GPU's hides it."""
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        if value is not None and not _lists_this_gpu(value):
            return 0
    if os.environ.get("HIP_VISIBLE_DEVICES") is None:
        value = os.environ.get("CUDA_VISIBLE_DEVICES")
        if value is not None and not _lists_this_gpu(value):
            return 0
    return 1


def _lists_this_gpu(value: str) -> bool:
    """Whether the list's first entry is this GPU: index 0, or a UUID ('GPU-' and a prefix of its own)."""
    first = value.split(",")[0].strip()
    if first.upper().startswith("GPU-"):
        return len(first) > 4 and UUID.startswith(first[4:].lower())
    return first == "0"


class SimulatedROCm:
    """The simulated GPU of tests/simulated_gpu.py, as an MI300X under ROCm."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda  # simulated_gpu.SimulatedGPU: timeline, contexts, current device
        self.properties = Properties()
        self.amdsmi = fake_amdsmi.make("mi300x", self._link_processes)

    def _link_processes(self, machine: Any) -> None:
        machine.process_lookup = lambda: (
            [(os.getpid(), "python3", HIP_RUNTIME)] if self.cuda.contexts else [])

    def reset(self) -> None:
        self.cuda.reset()

    @property
    def timeline(self) -> Any:
        return self.cuda.timeline

    def sleep(self, cycles: int) -> None:
        self.cuda.work()
        self.cuda.timeline.launch(int(cycles) / CLOCK_HZ)

    def get_properties(self, device: int) -> Properties:
        if device >= visible_count():
            raise RuntimeError("HIP error: invalid device ordinal")
        return self.properties


def usable() -> Optional[str]:
    return simulated_gpu.usable()


def install(patch: Any) -> SimulatedROCm:
    """The simulated GPU installed with ``patch``, turned into an MI300X under ROCm. Call only where
    :func:`usable` says None."""
    from torchgpu_magic.gpus import amdsmi, nvml

    cuda = simulated_gpu.install(patch)
    sim = SimulatedROCm(cuda)
    patch.setattr(torch.version, "cuda", None)
    patch.setattr(torch.version, "hip", HIP_VERSION)
    patch.setattr(cuda, "device_count", visible_count)
    patch.setattr(cuda, "get_properties", sim.get_properties)  # cudart's mem_get_info reads it too
    patch.setattr(torch._C, "_cuda_getDeviceCount", visible_count, raising=False)
    patch.setattr(torch._C, "_cuda_sleep", sim.sleep, raising=False)
    arch = "gfx900 gfx906 gfx908 gfx90a gfx942 gfx1030 gfx1100"  # a ROCm 6.4 wheel's targets
    patch.setattr(torch._C, "_cuda_getArchFlags", lambda: arch, raising=False)
    patch.setattr(torch.cuda, "_get_device_properties", sim.get_properties, raising=False)
    patch.setitem(sys.modules, "pynvml", fake_pynvml.make("no_library"))
    patch.setitem(sys.modules, "amdsmi", sim.amdsmi)
    nvml.reset()
    amdsmi.reset()
    return sim
