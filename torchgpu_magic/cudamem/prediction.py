"""``--predict`` and ``--fit``: a cell's memory on a device, from a run on fake tensors.

The cell runs once under ``FakeTensorMode`` on fake copies of what it uses (:mod:`.fakenamespace`),
tracked by MemTracker (:mod:`.run`) and accounted as the target's allocator would (:mod:`.allocator`), on
the target's own fake tensors or on cpu standing in for it (:mod:`.cudastandin`, :mod:`.cudakernels`,
:mod:`.targetdevice`). Nothing real is allocated, moved or changed (but for the one element per GPU that
:mod:`.targetdevice` explains), and no CUDA context is created: the cell's names live in a namespace of
their own, torch's global settings (default device and dtype, grad mode, the random generator, thread
count) are put back afterwards, and a cell fake tensors cannot run (a value read with ``.item()``, an
operator without a shape function) ends in one line saying why. :func:`fit` searches the largest batch
that fits.
"""
from __future__ import annotations

import contextlib
import logging
import re
import time
import traceback
import warnings
from dataclasses import asdict
from typing import Any, Iterator, Mapping, Optional

from .. import accelerators, devices
from ..errors import MagicInputError
from ..render import fmt_bytes
from ..torchapi import FAKE_TENSOR_LOGGER, fake_tensor_class, fake_tensor_mode_class
from .allocator import ALLOCATOR_SOURCE, CachingAllocatorModel, Ledger
from .cudastandin import StrayDeviceError, guarded
from .fakenamespace import fake_namespace, mark_target, names_read
from .report import CellMemory, FitResult
from .run import find_objects, report, run_tracked, version_note
from .targetdevice import (
    THREADS,
    Target,
    cublas_workspaces,
    cuda_context,
    describe_arch,
    device_facts,
    host_capacity,
)

__all__ = ["PredictionError", "names_read", "predict", "fit", "FIT_DOUBLINGS"]

FIT_DOUBLINGS = 20
"""How many times ``--fit`` doubles the batch before it stops looking further (2**20 times the current)."""

FIT_MARGIN = 0.05
"""The share of a GPU's capacity ``--fit`` leaves free: what a prediction cannot count and a step still
needs there (kernels CUDA loads into its context as the step runs, cuDNN's workspaces, the allocator's
fragmentation when memory runs short, other processes' contexts). A batch that fits with no slack at all
is the one that fails a few steps in."""

_DATA_DEPENDENT = ("DataDependentOutputException", "DynamicOutputShapeException",
                   "GuardOnDataDependentSymNode")


class PredictionError(MagicInputError):
    """A cell that cannot run on fake tensors; the message says why and where, in one line."""


@contextlib.contextmanager
def _torch_state_kept() -> Iterator[None]:
    """Whatever the cell sets of torch's global state comes back as it was: default device and dtype,
    grad mode, the cpu random generator, the intra-op thread count."""
    import torch

    saved = devices.current_state()
    grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        saved.restore()
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)


@contextlib.contextmanager
def _fake_module_moves() -> Iterator[None]:
    """``model.to(...)``, ``.cuda()``, ``.half()`` on fake modules, for the duration. torch converts a
    fake parameter by swapping it with its converted copy (``torch.utils.swap_tensors``), which refuses
    tensors that have weak references, and fake tensors always have some (fake mode's and MemTracker's
    tables); between two fake tensors the swap is made here as ``Module._apply``'s other path does it,
    by pointing the parameter at the converted data (``param.data = converted``), which keeps the
    parameter, and every optimizer's reference to it, the same object."""
    import torch

    FakeTensor = fake_tensor_class()
    original = torch.utils.swap_tensors

    def swap(t1: Any, t2: Any) -> None:
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor):
            with torch.no_grad():
                t1.data = t2
            return
        original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def _why(exc: BaseException, kind: str) -> str:
    """What went wrong, as a person can act on it."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else name
    if name in _DATA_DEPENDENT or "data-dependent" in text or "_local_scalar_dense" in text:
        return ("it needs real values, which fake tensors do not have (.item(), .tolist(), printing a "
                "tensor's values, nonzero, a boolean mask, a shape that depends on the data)")
    if name == "UnsupportedOperatorException" or "fake impl" in text or "meta" in text and "kernel" in text:
        found = re.search(r"([\w.]+::[\w.]+)", text)
        op = found.group(1) if found else text.split(":")[-1].strip()
        return (f"operator {op} has no shape function (fake or meta kernel), so it cannot run on fake "
                f"tensors (custom CUDA extensions often lack one)")
    if "convert all Tensors to FakeTensors" in text:
        return ("it reached a real tensor that is not one of the copies (one a function or class defined "
                "outside this notebook, or a class's method, reads from its globals; pass it in by name)")
    if "not compiled with CUDA" in text or "Torch not compiled" in text:
        return "it calls a torch.cuda function, which needs CUDA, and this torch has none"
    if any(words in text for words in ("NVIDIA driver", "driver version is insufficient", "no CUDA GPUs",
                                       "No CUDA GPUs")):
        # a CUDA build of torch where CUDA finds no driver, or no GPU: its own words send a person to
        # install a driver, right only where there is a GPU; %gpuinfo says which it is here
        return ("it calls a torch.cuda function, which needs a GPU, and torch's CUDA finds none here "
                f"(%gpuinfo says why; torch: {text})")
    if isinstance(exc, (AssertionError, RuntimeError)) and kind == "cuda" and "CUDA" in text:
        return f"it needs CUDA itself ({name}: {text})"
    return f"{name}: {text}"


def _where(exc: BaseException, filename: str) -> str:
    """'line 3 (loss.item())' for the innermost frame of the cell in ``exc``'s traceback; '' if none."""
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == filename:
            found = f"line {frame.lineno}" + (f" ({frame.line.strip()})" if frame.line else "") + ": "
    return found


def _run_on_fakes(code: Any, filename: str, ns: Mapping[str, Any], names: list, target: Target,
                  cc: Optional[tuple], resize: Optional[dict]) -> tuple:
    """One run of ``code`` on fake copies; returns (ledgers, rows, fqns, workspaces, caught warnings)."""
    fake_mode = fake_tensor_mode_class()(allow_non_fake_inputs=False)
    cuda = target.kind == "cuda"
    added: list = []  # the workspaces allocated, in order
    threads: set = set()  # (ledger, thread) pairs whose workspaces are allocated

    def on_matmul(ledger: Ledger) -> None:
        # the backward's products run on autograd's device thread, whose cuBLAS handle gets its own
        thread = THREADS[1] if ledger.where()[0] == "backward" else THREADS[0]
        if (id(ledger), thread) in threads:
            return
        threads.add((id(ledger), thread))
        for item in cublas_workspaces(cc, thread):
            ledger.add(("workspace", item.what), item.nbytes, "workspaces")
            added.append(item)

    with _torch_state_kept():
        fake_ns, copies = fake_namespace(ns, names, fake_mode, target.run_on, resize)
        mark_target(copies, foreach=cuda)
        objects = find_objects(copies)
        del copies
        rules = guarded(target.kind, target.run_on, target.native, cc)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logger = logging.getLogger(FAKE_TENSOR_LOGGER)
            level = logger.level
            logger.setLevel(logging.CRITICAL)  # its log of a failed op would print in the cell's output
            try:
                with fake_mode, rules, _fake_module_moves():
                    result = run_tracked(lambda: exec(code, fake_ns), objects,
                                         lambda name: Ledger(CachingAllocatorModel() if cuda else None),
                                         on_matmul if cuda else None, filename)
            except StrayDeviceError as exc:
                raise PredictionError(f"--predict stopped this cell: {exc}") from None
            except MagicInputError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure of the fake run: one line, why and where
                raise PredictionError(f"--predict cannot run this cell on fake tensors: "
                                      f"{_where(exc, filename)}{_why(exc, target.kind)}; nothing of yours "
                                      f"was changed") from None
            finally:
                logger.setLevel(level)
                fake_ns.clear()
                objects.clear()
    notes = sorted({f"warning during the prediction: {str(w.message).splitlines()[0]}" for w in caught
                    if str(w.message).strip()})[:3]
    return (*result, added, notes)


def _limits(target: Target) -> list:
    """What a prediction for ``target`` does not count, named."""
    if target.kind == "cuda":
        out = ["cuDNN workspaces (convolutions), kernels CUDA loads into its context as the step runs, "
               "fragmentation beyond the allocator's rules when memory runs short, other processes"]
    else:
        out = [f"the {target.kind} allocator's own rounding, caching and fragmentation; memory outside "
               "tensors"]
    if not target.native:
        out.append(f"kernel choices that differ between cpu and {target.kind} beyond those emulated "
                   f"(autocast's casts, attention, dropout, optimizer foreach): LSTM / GRU's cuDNN kernels, "
                   f"the fast paths of nn modules in eval mode, fused optimizers' internals; tensors the "
                   f"cell puts on the cpu count as on {target.kind}")
    out.append("custom extensions' own allocations; code fake tensors cannot run ends the prediction instead")
    return out


def predict(code: Any, filename: str, ns: Mapping[str, Any], names: list, target: Target,
            capacity: Optional[int] = None, cc: Optional[tuple] = None, top: int = 8,
            resize: Optional[dict] = None) -> CellMemory:
    """The prediction of one run of ``code`` (compiled with ``filename``) for ``target``: ``names`` (from
    :func:`names_read`) are copied from ``ns`` as fakes; ``capacity`` (bytes) overrides the device's
    own; ``cc`` names the GPU generation (else the device's, when there is one)."""
    start = time.perf_counter()
    own_capacity, source, own_cc = device_facts(target)
    cc_source = "from --arch" if cc is not None else "this GPU"
    cc = cc if cc is not None else own_cc
    if capacity is not None:
        source = "--capacity"
    elif target.kind == "cpu":
        capacity, source = host_capacity()
    else:
        capacity = own_capacity
    ledgers, rows, fqns, workspaces, notes = _run_on_fakes(code, filename, ns, names, target, cc, resize)
    device = next((d for d in ledgers if d.split(":")[0] == target.run_on.split(":")[0]), None)
    ledger = ledgers.get(device) if device is not None else Ledger()
    allowances = [asdict(a) for a in workspaces]
    if target.kind == "cuda":
        allowances.append(asdict(cuda_context(cc)))
        notes.insert(0, f"GPU generation: {describe_arch(cc, cc_source)}")
        if accelerators.is_rocm():
            notes.insert(1, "ROCm: the allowances are CUDA's figures (its context, cuBLAS workspaces); HIP's "
                            "runtime and hipBLAS hold their own, not measured here")
        notes.insert(1, f"allocated and reserved: every tensor through a model of {ALLOCATOR_SOURCE}")
    notes += [n for n in [version_note()] if n]
    return report("predicted", target.device, target.how(), ledger, rows.get(device, []), fqns,
                  allowances=allowances, capacity=capacity, capacity_source=source, top=top,
                  limits=_limits(target), notes=notes, seconds=time.perf_counter() - start)


def batch_tensors(ns: Mapping[str, Any], names: list) -> tuple:
    """``(tensors, current first dimension)`` for ``--fit NAME[,NAME...]``: each name a tensor or a list,
    tuple or dict of tensors, all with one first dimension; anything else is a one-line error."""
    import torch

    tensors: list = []
    for name in names:
        if name not in ns:
            raise MagicInputError(f"--fit: no name {name!r} in the namespace")
        value = ns[name]
        items = list(value.values()) if isinstance(value, dict) else list(value) \
            if isinstance(value, (list, tuple)) else [value]
        found = [t for t in items if isinstance(t, torch.Tensor) and t.dim() > 0]
        if not found:
            raise MagicInputError(f"--fit: {name} is a {type(value).__name__}, not a tensor (or a list, "
                                  f"tuple or dict of tensors) with a first dimension to grow")
        tensors += found
    sizes = sorted({t.shape[0] for t in tensors})
    if len(sizes) > 1:
        raise MagicInputError(f"--fit: the tensors of {', '.join(names)} have different first dimensions "
                              f"({', '.join(map(str, sizes))}); name tensors that share the batch dimension")
    return tensors, sizes[0]


def fit(code: Any, filename: str, ns: Mapping[str, Any], names: list, target: Target, fit_names: list,
        capacity: Optional[int] = None, cc: Optional[tuple] = None, top: int = 8) -> FitResult:
    """The largest first dimension of the tensors named by ``fit_names`` whose predicted run fits (on a
    GPU, with :data:`FIT_MARGIN` of its capacity left free, which the report says): doubling from the
    current size until one does not fit (halving when the current one does not), then bisecting between
    the last that fits and the first that does not."""
    began = time.perf_counter()
    tensors, current = batch_tensors(ns, fit_names)
    names = sorted(set(names) | set(fit_names))
    seen: dict = {}

    def at(size: int) -> CellMemory:
        if size not in seen:
            try:
                report = predict(code, filename, ns, names, target, capacity, cc, top,
                                 resize={id(t): size for t in tensors})
            except PredictionError as exc:
                reason = str(exc).split("--predict ", 1)[-1]
                raise PredictionError(f"--fit, at first dimension {size}: {reason}") from None
            if report.capacity is None:
                raise MagicInputError(f"--fit needs a capacity: {target.device} has none known here; "
                                      f"give --capacity SIZE (e.g. --capacity 79GiB)")
            if target.kind == "cuda":  # the search fits into a GPU's capacity less FIT_MARGIN
                margin = int(report.capacity * FIT_MARGIN)
                report.capacity, report.capacity_source = report.capacity - margin, (
                    f"{report.capacity_source}: {fmt_bytes(report.capacity)}, less a {FIT_MARGIN * 100:g} % "
                    f"margin of {fmt_bytes(margin)} for what a prediction cannot count: kernels loaded as "
                    "the step runs, cuDNN workspaces, fragmentation")
            seen[size] = report
        return seen[size]

    size = start = max(current, 1)
    limit = start * 2 ** FIT_DOUBLINGS
    lo = hi = None
    while lo is None or hi is None:  # doubling while it fits, halving while it does not, to 1 or the limit
        if at(size).fits:
            lo, size = size, size * 2
        else:
            hi, size = size, size // 2
        if not 1 <= size <= limit:
            break
    while lo is not None and hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid).fits else (lo, mid)
    first = seen[start]
    return FitResult(names=list(fit_names), device=target.device, capacity=first.capacity,
                     capacity_source=first.capacity_source, current=current, best=lo,
                     predictions=[(s, r.needs, bool(r.fits)) for s, r in seen.items()],
                     at_best=seen.get(lo) if lo is not None else None,
                     limit=limit if hi is None else None, seconds=time.perf_counter() - began)
