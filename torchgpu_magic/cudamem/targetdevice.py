"""What ``%%cudamem`` predicts for: the target device, where its fake tensors can safely live, its
capacity, and the allowances for what fake tensors cannot see (the CUDA context, cuBLAS workspaces).

**Where fake tensors live.** ``FakeTensorMode`` can make fake ``cuda`` tensors on any build, but on a
build without CUDA the first autograd operation on one aborts the whole process (torch cannot find
CUDA's device guard and calls ``terminate``): a notebook kernel would die. And on a machine with the GPU,
fake ``cuda`` tensors are not free either: torch's fake tensors run ``torch.empty(1, device='cuda')`` for
each fake CUDA device (torch/_subclasses/fake_tensor.py ``init_gpu_context``), which creates a CUDA
context, half a GiB on an H100, where the user had none. So a target is predicted on fake tensors of its
own device only where this torch has CUDA, its runtime sees that GPU, and this process already holds a
CUDA context on it (:func:`resolve_target`; then the one-element tensor costs at most a 2 MiB cached
segment); everywhere else on fake ``cpu`` tensors standing in for it, with the target's allocator
accounted by :mod:`.allocator` and its kernels' choices emulated by :mod:`.cudakernels`. The checks read
torch's C flags and the driver's context state, not ``torch.cuda.is_available()``, which a test may
script, nor ``torch.cuda.is_initialized()``, which reading a GPU's properties sets without a context.

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
from ..host import memory_limits
from ..torchapi import backend_linked, cuda_compiled, cuda_device_counter, has_primary_context
from .allocator import GIB, KIB, MIB

TARGET_KINDS = ("cpu", "cuda", "mps", "xpu")
"""The device types ``--predict`` and ``--fit`` predict for."""

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": KIB, "mib": MIB, "gib": GIB, "tib": 1024 * GIB,
          "k": KIB, "m": MIB, "g": GIB, "t": 1024 * GIB}

# GPU generations by compute capability (NVIDIA's CUDA C++ Programming Guide, "Compute Capabilities").
ARCHS = {"volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0),
         "blackwell": (10, 0)}

# The CUDA context one process holds on a GPU, not counted by torch's allocator, with CUDA's lazy module
# loading (the default since torch 1.13, CUDA >= 11.7): a bare context; the kernels a step loads lazily
# add to it. Measured figures where there is one; Hopper's is the upper end of what issue 28's review
# gives for an H100 (0.5 to 0.6 GiB), not yet measured here: docs/gpu-validation.md lists the gpu test
# that checks it (tests/test_cudamem.py::test_gpu_the_hopper_context_allowance_covers_the_real_context).
CONTEXT_FIGURES = {
    "ampere": (256 * MIB, "measured: RTX 3090, torch 2.7.1+cu128, a process holding a bare context, from "
                          "NVML (https://github.com/invoke-ai/InvokeAI/issues/9413)"),
    "ada": (426 * MIB, "measured: RTX 6000 Ada, torch 2.10.0+cu130, after torch.cuda.mem_get_info, from "
                       "nvidia-smi (https://github.com/unslothai/unsloth-zoo/pull/1053)"),
    "hopper": (614 * MIB, "estimate: 0.5-0.6 GiB for an H100 (issue 28), the upper end; not yet measured "
                          "here (docs/gpu-validation.md)"),
}
_CUBLAS_SOURCE = "aten/src/ATen/cuda/CublasHandlePool.cpp"
THREADS = ("the cell's thread", "autograd's thread")
"""The threads whose cuBLAS handles get a workspace: the one running the cell (forward, optimizer step)
and autograd's device thread, which runs a CUDA backward."""


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
        # no model of MPS's heaps or XPU's allocator: tensors' own bytes
        figures = (f"tensor bytes as the {self.kind} allocator is asked for them" if self.kind != "cuda"
                   else f"the {self.kind} allocator accounted by torchgpu_magic")
        return f"FakeTensorMode on fake cpu tensors standing in for {self.device} ({self.why}); {figures}"


@dataclass(frozen=True)
class Allowance:
    """A figure added for what fake tensors cannot see: ``what`` it is, its ``nbytes``, ``source``, and
    whether it is handed out by torch's allocator (then it is part of the peak) or lies beside it."""

    what: str
    nbytes: int
    source: str
    in_allocator: bool


def parse_device(spec: str) -> tuple:
    """``'cuda:1'`` -> ``('cuda', 1)``; ``'cpu'`` -> ``('cpu', None)``. Only the kinds of
    :data:`TARGET_KINDS`; anything else is a one-line :class:`MagicInputError`."""
    text = str(spec).strip().strip("'\"").lower()
    found = re.fullmatch(r"([a-z]+)(?::(\d+))?", text)
    if found is None or found.group(1) not in TARGET_KINDS or (found.group(1) == "cpu" and found.group(2)):
        raise MagicInputError(f"DEVICE {spec!r} is not a device this can predict for; it takes cpu, cuda, "
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


def _has_context(index: int) -> bool:
    """Whether this process already holds a CUDA context on GPU ``index`` (asking creates none)."""
    try:
        return has_primary_context(index)
    except Exception:  # noqa: BLE001 - a driver that cannot say: as if there were none
        return False


def resolve_target(spec: str) -> Target:
    """The :class:`Target` for a device spec: fake tensors on the target itself where this torch can
    run autograd on them and doing so creates no CUDA context (this process already holds one on that
    GPU), else on cpu standing in (never fake ``cuda`` on a build without CUDA)."""
    import torch

    kind, index = parse_device(spec)
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
    if count > (index or 0) and _has_context(index or 0):
        return Target(device, kind, index, device, True)
    if count > (index or 0):
        why = (f"cuda:{index or 0} has no CUDA context in this process yet, and fake CUDA tensors would "
               "create one")
    elif count == 0:
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
    found = re.fullmatch(r"(?:sm_?(\d{1,2})|(\d{1,2})\.)(\d)", name)
    if found is None:
        raise MagicInputError(f"--arch {text!r} is not a GPU generation; it takes {', '.join(ARCHS)}, "
                              f"sm_90 or 9.0")
    return int(found.group(1) or found.group(2)), int(found.group(3))


def generation(cc: Optional[tuple]) -> Optional[str]:
    """The generation's name for a compute capability: (8, 6) -> 'ampere', (9, 0) -> 'hopper'."""
    if cc is None:
        return None
    by_major = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell", 11: "blackwell", 12: "blackwell"}
    return {(7, 5): "turing", (8, 9): "ada"}.get(cc) or by_major.get(cc[0])


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


def cublas_workspace_size(cc: Optional[tuple]) -> tuple:
    """``(bytes, why)``: the cuBLAS workspace torch gives each cuBLAS handle and stream on a GPU of
    generation ``cc``: ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KIB:COUNT`` pairs) where set, else 32 MiB on
    Hopper and Blackwell (compute capability 9.x to 12.x) and ``:4096:2:16:8`` (8.125 MiB) before
    (CublasHandlePool.cpp ``parseChosenWorkspaceSize``)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    pairs = re.findall(r":(\d+):(\d+)", config or "")
    if pairs:
        return sum(int(a) * KIB * int(b) for a, b in pairs), f"CUBLAS_WORKSPACE_CONFIG={config}"
    if cc is None:
        return 4096 * 8 * KIB, "GPU generation unknown: Hopper's and Blackwell's 32 MiB, the largest default"
    if 9 <= cc[0] <= 12:
        return 4096 * 8 * KIB, f"default on sm_{cc[0]}{cc[1]} (:4096:8, Hopper and Blackwell)"
    return 4096 * KIB * 2 + 16 * KIB * 8, f"default on sm_{cc[0]}{cc[1]} (:4096:2:16:8)"


def cublas_workspaces(cc: Optional[tuple], thread: str) -> list:
    """The cuBLAS (and, where not shared, cuBLASLt) workspaces torch allocates through the caching
    allocator for one thread's handle at its first matrix product: ``thread`` is 'the cell's thread'
    (the forward, the optimizer) or "autograd's thread": the backward runs on autograd's own device
    thread, which has its own cuBLAS handle, so it gets a second workspace (a workspace per handle and
    stream). cuBLASLt uses the cuBLAS workspace (unified by default since pytorch/pytorch#168175 and
    #175879) unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=0``, when it gets its own of
    ``CUBLASLT_WORKSPACE_SIZE`` KiB (default 1024)."""
    size, why = cublas_workspace_size(cc)
    out = [Allowance(f"cuBLAS workspace ({thread})", size, f"{why}; {_CUBLAS_SOURCE}", True)]
    # off only for 0 / false, as c10's ``check_env`` reads a flag
    if os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").strip().lower() in ("0", "false"):
        lt_text = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "").strip()
        lt = int(lt_text) * KIB if lt_text.isdigit() else 1024 * KIB
        size_said = f"={lt_text}" if lt_text.isdigit() else " default 1024 KiB"
        out.append(Allowance(f"cuBLASLt workspace ({thread})", lt,
                             f"TORCH_CUBLASLT_UNIFIED_WORKSPACE=0: its own, CUBLASLT_WORKSPACE_SIZE"
                             f"{size_said}; {_CUBLAS_SOURCE}", True))
    return out


def cuda_context(cc: Optional[tuple]) -> Allowance:
    """The CUDA context's allowance for a generation: its figure (measured, or the estimate said so), or
    the largest one (said so) where there is none."""
    name = generation(cc)
    if name in CONTEXT_FIGURES:
        nbytes, source = CONTEXT_FIGURES[name]
        return Allowance("CUDA context", nbytes, f"{name}: {source}", False)
    nbytes, source = max(CONTEXT_FIGURES.values())
    which = f"no figure for {name}" if name else "GPU generation unknown"
    return Allowance("CUDA context", nbytes, f"{which}: the largest, {source}", False)


def describe_arch(cc: Optional[tuple], source: str) -> str:
    """``'hopper (sm_90, from --arch)'`` or ``'unknown'``."""
    if cc is None:
        return "unknown (name it with --arch)"
    return f"{generation(cc) or 'unknown'} (sm_{cc[0]}{cc[1]}, {source})"

