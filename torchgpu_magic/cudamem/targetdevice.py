"""What ``%%cudamem`` predicts for: the target device, where its fake tensors can safely live, its
capacity, and the allowances for what fake tensors cannot see (the CUDA context, cuBLAS workspaces).

**Where fake tensors live.** ``FakeTensorMode`` can make fake ``cuda`` tensors on any build, but on a
build without CUDA the first autograd operation on one aborts the whole process (torch cannot find
CUDA's device guard and calls ``terminate``): a notebook kernel would die. So a target is predicted on
fake tensors of its own device only where this torch has that device's support and its runtime sees one
(:func:`resolve_target`); everywhere else on fake ``cpu`` tensors standing in for it, with the target's
allocator accounted by :mod:`.allocator` and its kernels' choices emulated by :mod:`.prediction`. The
check reads torch's C flags, not ``torch.cuda.is_available()``, which a test may script.

**Allowances.** Figures come from measurements and sources named beside each one; what has no figure
is said, never guessed silently. Standard library at import; torch is imported inside the functions.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from .. import accelerators
from ..errors import MagicInputError
from ..torchapi import backend_linked, cuda_compiled, cuda_device_counter
from .allocator import GIB, KIB, MIB

TARGET_KINDS = ("cpu", "cuda", "mps", "xpu")
"""The device types ``--predict`` and ``--fit`` predict for."""

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": KIB, "mib": MIB, "gib": GIB, "tib": 1024 * GIB,
          "k": KIB, "m": MIB, "g": GIB, "t": 1024 * GIB}

# GPU generations by compute capability (NVIDIA's CUDA C++ Programming Guide, "Compute Capabilities").
ARCHS = {"volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0),
         "blackwell": (10, 0)}

# The CUDA context one process holds on a GPU, not counted by torch's allocator: measured figures with
# CUDA's lazy module loading (the default since torch 1.13, CUDA >= 11.7). A bare context; the kernels a
# step loads lazily add to it.
CONTEXT_MEASURED = {
    "ampere": (256 * MIB, "RTX 3090, torch 2.7.1+cu128, a process holding a bare context, from NVML "
                          "(https://github.com/invoke-ai/InvokeAI/issues/9413)"),
    "ada": (426 * MIB, "RTX 6000 Ada, torch 2.10.0+cu130, after torch.cuda.mem_get_info, from nvidia-smi "
                       "(https://github.com/unslothai/unsloth-zoo/pull/1053)"),
}
_CUBLAS_SOURCE = "aten/src/ATen/cuda/CublasHandlePool.cpp"


@dataclass(frozen=True)
class Target:
    """The device a prediction is for. ``run_on`` is where its fake tensors live: the target itself
    (``native``) or ``cpu`` standing in for it, for the reason in ``why``."""

    device: str
    kind: str
    index: Optional[int]
    run_on: str
    native: bool
    why: str = ""

    def how(self) -> str:
        """How the figures are obtained, in words a report shows."""
        if self.native:
            return f"FakeTensorMode on fake {self.device} tensors"
        if self.kind != "cuda":  # no model of MPS's heaps or XPU's allocator: tensors' own bytes
            return (f"FakeTensorMode on fake cpu tensors standing in for {self.device} ({self.why}); "
                    f"tensor bytes as the {self.kind} allocator is asked for them")
        return (f"FakeTensorMode on fake cpu tensors standing in for {self.device} ({self.why}); "
                f"the {self.kind} allocator accounted by torchgpu_magic")


@dataclass(frozen=True)
class Allowance:
    """A figure added for what fake tensors cannot see: ``what`` it is, its ``nbytes``, ``source``, and
    whether it is handed out by torch's allocator (then it is part of the peak) or lies beside it."""

    what: str
    nbytes: int
    source: str
    in_allocator: bool


def parse_device(spec: str, option: str = "DEVICE") -> tuple:
    """``'cuda:1'`` -> ``('cuda', 1)``; ``'cpu'`` -> ``('cpu', None)``. Only the kinds of
    :data:`TARGET_KINDS`; anything else is a one-line :class:`MagicInputError`."""
    text = str(spec).strip().strip("'\"").lower()
    found = re.fullmatch(r"([a-z]+)(?::(\d+))?", text)
    if found is None or found.group(1) not in TARGET_KINDS or (found.group(1) == "cpu" and found.group(2)):
        raise MagicInputError(f"{option} {spec!r} is not a device this can predict for; it takes cpu, cuda, "
                              f"cuda:N, mps, xpu or xpu:N (a GPU you need not have)")
    return found.group(1), (int(found.group(2)) if found.group(2) is not None else None)


def _cuda_runtime_devices() -> int:
    """How many GPUs this torch's CUDA runtime sees, read from its C flags: 0 on a build without CUDA."""
    import torch

    if not cuda_compiled() or (torch.version.cuda is None and torch.version.hip is None):
        return 0
    count = cuda_device_counter()
    try:
        return int(count()) if count is not None else 0
    except Exception:  # noqa: BLE001 - a broken driver: no device, and the prediction runs on cpu
        return 0


def resolve_target(spec: str, option: str = "DEVICE") -> Target:
    """The :class:`Target` for a device spec: fake tensors on the target itself where this torch can
    run autograd on them, else on cpu standing in (never fake ``cuda`` on a build without CUDA)."""
    import torch

    kind, index = parse_device(spec, option)
    device = kind if index is None else f"{kind}:{index}"
    if kind == "cpu":
        return Target(device, kind, None, "cpu", True)
    if kind != "cuda":
        if backend_linked(kind) and accelerators.device_count(kind) > (index or 0):
            return Target(device, kind, index, device, True)
        return Target(device, kind, index, "cpu", False,
                      f"this torch {torch.__version__} cannot run fake {kind} tensors here" if not
                      backend_linked(kind) else f"torch sees no {device} here")
    count = _cuda_runtime_devices()
    if count > (index or 0):
        return Target(device, kind, index, device, True)
    if count == 0:
        why = (f"this torch {torch.__version__} has no CUDA" if torch.version.cuda is None
               or not cuda_compiled() else "torch's CUDA runtime sees no GPU here")
    else:
        why = f"torch's CUDA runtime sees {count} GPU{'s' * (count != 1)}, not cuda:{index}"
    return Target(device, kind, index, "cpu", False, why)


def parse_size(text: str) -> int:
    """A memory size as people write it: ``80GiB``, ``80 GB``, ``81920MiB``, ``24G`` (single letters
    are binary, as in PyTorch's allocator settings), or plain bytes."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", str(text))
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS and unit != "":
        raise MagicInputError(f"--capacity {text!r} is not a size; write it as 80GiB, 80GB, 81920MiB or 24G "
                              f"(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; K, M, G, T are binary)")
    value = float(found.group(1)) * _UNITS.get(unit, 1)
    if value < 1:
        raise MagicInputError(f"--capacity {text!r} is not a positive size")
    return int(value)


def parse_arch(text: str) -> tuple:
    """A GPU generation: a name of :data:`ARCHS` (``hopper``), ``sm_90`` or ``9.0`` -> ``(9, 0)``."""
    name = str(text).strip().lower()
    if name in ARCHS:
        return ARCHS[name]
    found = re.fullmatch(r"(?:sm_?(\d{1,2})(\d)|(\d{1,2})\.(\d))", name)
    if found is None:
        raise MagicInputError(f"--arch {text!r} is not a GPU generation; it takes {', '.join(ARCHS)}, "
                              f"sm_90 or 9.0")
    major, minor = (found.group(1), found.group(2)) if found.group(1) else (found.group(3), found.group(4))
    return int(major), int(minor)


def generation(cc: Optional[tuple]) -> Optional[str]:
    """The generation's name for a compute capability: (8, 6) -> 'ampere', (9, 0) -> 'hopper'."""
    if cc is None:
        return None
    if cc == (8, 9):
        return "ada"
    if cc == (7, 5):
        return "turing"
    by_major = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell", 11: "blackwell", 12: "blackwell"}
    return by_major.get(cc[0])


def device_facts(target: Target) -> tuple:
    """``(capacity, source, compute capability)`` of the target where torch knows the device (a GPU
    here, as torch reports it), else ``(None, None, None)``. Never creates a CUDA context:
    ``torch.cuda.get_device_properties`` reads the driver's device table. MPS's capacity is Metal's
    working-set limit (unified memory: the share of RAM the GPU may use); XPU's its total memory. A ROCm
    GPU has no CUDA compute capability: its generation is left to --arch."""
    import torch

    if target.kind == "mps":
        limit = accelerators.working_set_limit()
        source = ("torch.mps.recommended_max_memory(): Metal's recommendedMaxWorkingSetSize, the share of "
                  "unified memory the GPU may use")
        return (limit, source, None) if limit is not None else (None, None, None)
    if target.kind == "xpu":
        if not accelerators.device_count("xpu") > (target.index or 0):
            return None, None, None
        facts = accelerators.facts(("xpu", target.index or 0))
        return facts.memory, f"torch.xpu.get_device_properties().total_memory ({facts.name})", None
    if target.kind != "cuda":
        return None, None, None
    index = target.index if target.index is not None else 0
    try:
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None, None, None
        props = torch.cuda.get_device_properties(index)
        source = f"torch.cuda.get_device_properties({index}).total_memory ({props.name})"
        cc = None if accelerators.is_rocm() else (int(props.major), int(props.minor))
        return int(props.total_memory), source, cc
    except Exception:  # noqa: BLE001 - a GPU torch cannot describe: no capacity, said in the report
        return None, None, None


def host_capacity() -> tuple:
    """``(bytes, source)`` of the memory this process may hold, for a cpu target: the machine's RAM
    (psutil), or less where a limit says so (a container's cgroup ``memory.max``, ``ulimit -v``; see
    :func:`torchgpu_magic.host.memory_limits`): the counterpart of a GPU's ``total_memory``. Not what is
    free now, which leaves out the tensors the cell's objects already hold and so would count them
    twice."""
    from ..host import memory_limits

    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no psutil: no capacity, said in the report
        return None, None
    limits = [limit for limit in memory_limits() if limit.limit < total]
    if limits:
        least = min(limits, key=lambda limit: limit.limit)
        source = least.name + (f", {least.where}" if least.where else "")
        return least.limit, f"{source}; the machine has {total / GIB:.1f} GiB of RAM"
    return total, "total RAM (psutil)"


def cublas_workspaces(cc: Optional[tuple]) -> list:
    """The cuBLAS and cuBLASLt workspaces torch allocates through the caching allocator at a device's
    first matrix product, honouring ``CUBLAS_WORKSPACE_CONFIG`` / ``CUBLASLT_WORKSPACE_SIZE``."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    pairs = re.findall(r":(\d+):(\d+)", config or "")
    if pairs:
        size = sum(int(a) * KIB * int(b) for a, b in pairs)
        why = f"CUBLAS_WORKSPACE_CONFIG={config}"
    elif cc is None:
        size, why = 4096 * 8 * KIB, "GPU generation unknown: Hopper's 32 MiB, the largest default"
    elif cc == (9, 0):
        size, why = 4096 * 8 * KIB, "default on sm_90 (:4096:8)"
    else:
        size, why = 4096 * KIB * 2 + 16 * KIB * 8, "default off sm_90 (:4096:2:16:8)"
    out = [Allowance("cuBLAS workspace", size, f"{why}; {_CUBLAS_SOURCE}", True)]
    lt_text = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "")
    lt = int(lt_text) * KIB if lt_text.isdigit() else 1024 * KIB
    if os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "") not in ("1", "true", "True"):
        out.append(Allowance("cuBLASLt workspace", min(lt, size),
                             f"CUBLASLT_WORKSPACE_SIZE {'=' + lt_text if lt_text else 'default 1024 KiB'}, "
                             f"at most the cuBLAS one; {_CUBLAS_SOURCE}", True))
    return out


def cuda_context(cc: Optional[tuple]) -> Allowance:
    """The CUDA context's allowance for a generation: its measured figure, or the largest measured one
    (said so) where there is none."""
    name = generation(cc)
    if name in CONTEXT_MEASURED:
        nbytes, source = CONTEXT_MEASURED[name]
        return Allowance("CUDA context", nbytes, f"measured on {name}: {source}", False)
    nbytes, source = max(CONTEXT_MEASURED.values())
    which = f"no measured figure for {name}" if name else "GPU generation unknown"
    return Allowance("CUDA context", nbytes, f"{which}: the largest measured, {source}", False)


def describe_arch(cc: Optional[tuple], source: str) -> str:
    """``'hopper (sm_90, from --arch)'`` or ``'unknown'``."""
    if cc is None:
        return "unknown (name it with --arch)"
    return f"{generation(cc) or 'unknown'} (sm_{cc[0]}{cc[1]}, {source})"

