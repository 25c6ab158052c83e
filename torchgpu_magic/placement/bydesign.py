"""Where torch keeps state off the device on purpose, collected in one place so that no placement view
calls it a mistake. Each rule names the torch 2.13 source it follows:

- **Optimizer step counters.** Adam, AdamW, Adamax, Adadelta, Adagrad, NAdam, RAdam, RMSprop, Rprop and
  Adafactor create ``state['step']`` (NAdam also ``mu_product``) as a 0-dim tensor on the cpu unless the
  parameter group is ``capturable`` or ``fused`` ("note [special device hosting for step]" in
  ``torch/optim/adam.py``: a kernel launch per step would cost more than the number), and
  ``Optimizer._process_value_according_to_param_policy`` keeps ``step`` where it is when a state dict is
  loaded. A capturable or fused group keeps it on the parameter's device instead, and there it must be.
- **GradScaler.** ``_scale`` and ``_growth_tracker`` are made on the device of the first output scaled
  (``_lazy_init_scale_growth_tracker`` in ``torch/amp/grad_scaler.py``) and copied to each output's
  device on use (``scale()``, ``_MultiDeviceReplicator``): fine on any device.
- **RNG states.** ``torch.get_rng_state()``, ``torch.cuda.get_rng_state()`` and ``Generator.get_state()``
  return cpu ``uint8`` tensors (the CPU generator's Mersenne-Twister state; 16 bytes of seed and Philox
  offset for CUDA, XPU and MPS), and ``set_rng_state`` takes them only there.
- **Pinned host buffers.** Page-locked cpu memory (``pin_memory()``, ``DataLoader(pin_memory=True)``) is on
  the cpu so that copies to the GPU can be asynchronous: its place is the point.
- **DataLoader outputs.** A DataLoader's workers build batches on the cpu; moving them (``.to(device)``)
  is the training loop's job, and no default device reaches them.

Standard library only: torch is reached through the objects passed in, or ``sys.modules``.
"""
from __future__ import annotations

import ast
import sys
from typing import Any, Mapping, Optional

from .. import accelerators
from ..caches import cache
from ..torchapi import has_primary_context

STEP_KEYS = frozenset({"step", "mu_product"})
"""Optimizer state keys torch keeps on the cpu as 0-dim bookkeeping unless capturable or fused."""

STEP_WHY = "where torch keeps them unless the optimizer is capturable or fused"
SCALER_WHY = "a GradScaler's scale: copied to each output's device when used, so fine on any device"
RNG_WHY = "an RNG state: torch keeps generator states on cpu (set_rng_state takes them only there)"
PINNED_WHY = "pinned host memory: a staging buffer for fast copies to the GPU, on cpu by design"
LOADER_WHY = "a DataLoader's batch: made on cpu by its workers; move it in the loop with .to(device)"

_PHILOX_STATE_BYTES = 16  # seed + offset: CUDA, XPU and MPS generators (CUDAGeneratorImpl::get_state)


def step_on_param_device(group: Mapping[str, Any]) -> bool:
    """Whether a parameter group keeps its step counters on the parameters' device (capturable or fused)."""
    return bool(group.get("capturable") or group.get("fused"))


def is_step(key: Any, tensor: Any) -> bool:
    """Whether optimizer state ``key`` holding ``tensor`` is step bookkeeping (a 0-dim ``step`` or
    ``mu_product``) rather than per-element state such as Adam's moments."""
    try:
        return key in STEP_KEYS and tensor.dim() == 0
    except (AttributeError, RuntimeError):
        return False


def pinned_possible() -> bool:
    """Whether any tensor here can be in pinned memory: only once a CUDA context exists (pinned memory
    comes from one). Asked once per report, so that without CUDA no tensor is asked at all."""
    try:
        return accelerators.cuda_state() == "initialised" and any(
            has_primary_context(i) for i in range(accelerators.device_count("cuda")))
    except (RuntimeError, AttributeError):
        return False


def pinned(tensor: Any, device: str) -> str:
    """'yes' / 'no' for a cpu tensor in page-locked memory or not; '-' on other devices, where it means
    nothing. ``device`` is the tensor's device as a string, which the callers already have."""
    if device != "cpu":
        return "-"
    # torch's is_pinned asks cudaPointerGetAttributes, which creates a CUDA context on the current GPU
    # when none has one yet. Pinned memory comes from a CUDA context, so without one the answer is no.
    if not pinned_possible():
        return "no"
    try:
        return "yes" if tensor.is_pinned() else "no"
    except (RuntimeError, AttributeError):
        return "no"


@cache
def _cpu_state_bytes() -> int:
    """The CPU generator's state size (-1 before torch is imported)."""
    torch = sys.modules.get("torch")
    return int(torch.get_rng_state().numel()) if torch is not None else -1


def looks_like_rng_state(tensor: Any) -> bool:
    """A 1-D cpu ``uint8`` tensor the size of a generator state (the CPU generator's, or 16 bytes)."""
    try:
        if str(tensor.dtype) != "torch.uint8" or tensor.dim() != 1 or tensor.device.type != "cpu":
            return False
        return tensor.numel() in (_PHILOX_STATE_BYTES, _cpu_state_bytes())
    except (AttributeError, RuntimeError):
        return False


def tensor_why(tensor: Any, device: str, is_pinned: Optional[str] = None) -> Optional[str]:
    """Why a tensor on ``device`` is on the cpu on purpose (an RNG state, pinned memory); None when it is
    not one of those, or not on the cpu. ``is_pinned`` is :func:`pinned`'s answer when the caller has it."""
    if device != "cpu":
        return None
    if looks_like_rng_state(tensor):
        return RNG_WHY
    if (is_pinned or pinned(tensor, device)) == "yes":
        return PINNED_WHY
    return None


def holder_why(obj: Any) -> Optional[str]:
    """Why the tensors held by ``obj`` (an object the namespace walk looks into) are fine on any device:
    a GradScaler's; None for other holders."""
    scaler = any(k.__name__ == "GradScaler" and k.__module__.startswith("torch.") for k in type(obj).__mro__)
    return SCALER_WHY if scaler else None


def _is_loader(obj: Any) -> bool:
    """A DataLoader, or an iterator over one (``it = iter(loader)``)."""
    return any(k.__module__.startswith("torch.utils.data")
               and (k.__name__ == "DataLoader" or k.__name__.endswith("DataLoaderIter"))
               for k in type(obj).__mro__)


def _targets(node: ast.AST) -> list:
    """The names an assignment or ``for`` target binds: ``x``, ``(x, y)``, ``[x, (y, z)]``."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [name for item in node.elts for name in _targets(item)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def loader_names(source: str, ns: Mapping[str, Any]) -> set:
    """The names ``source`` (a cell) binds to a DataLoader's batches: the targets of ``for ... in L``,
    ``for i, ... in enumerate(L)``, ``... = next(iter(L))`` and ``... = next(it)`` where ``L`` names a
    DataLoader in ``ns`` and ``it`` an iterator over one.
    Parsing only: nothing runs. Empty when the source does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()

    def from_loader(expr: Any) -> bool:
        while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.args \
                and expr.func.id in ("iter", "next", "enumerate"):
            expr = expr.args[0]
        return isinstance(expr, ast.Name) and _is_loader(ns.get(expr.id))

    found: set = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and from_loader(node.iter):
            found.update(_targets(node.target))
        elif isinstance(node, ast.Assign) and from_loader(node.value):
            for target in node.targets:
                found.update(_targets(target))
    return found
