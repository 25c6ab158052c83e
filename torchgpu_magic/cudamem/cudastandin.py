"""Fake cpu tensors standing in for a device this torch cannot run fake tensors on (``cuda`` on a build
without CUDA, or where running them would create a CUDA context: :mod:`.targetdevice` says why), and
the target's kernel choices.

:func:`guarded` makes sure no ``cuda`` tensor is ever made: every device the cell names (``device='cuda'``,
``.to('cuda')``, ``.cuda()``, ``torch.device('cuda')``, ``torch.set_default_device('cuda')``) is read as the
stand-in, at the level of Python calls (before torch would try to initialise CUDA) and again at the level of
the operators they run; a ``cuda`` tensor that still appeared would stop the run with an exception before any
operation used it. ``torch.autocast('cuda', ...)`` turns on torch's own CUDA autocast state (built without the
availability check a CUDA-less torch would fail). Whatever the target, a device fake tensors cannot live on
here (``cuda`` in a prediction for cpu) is refused the same way, in one line.

Where cpu and CUDA kernels allocate differently (autocast's casts, attention, dropout), CUDA's choice is
made by :mod:`.cudakernels`, in the dispatcher, however the op is reached.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from ..torchapi import dispatch_mode_base, torch_function_disabled
from .cudakernels import kernels


class StrayDeviceError(RuntimeError):
    """A device fake tensors cannot live on here was named, or a tensor of one appeared; raised before
    anything uses it."""


class _Devices:
    """The device rules of one fake run for ``target``: ``remap`` (its type, where cpu stands in) is read
    as ``run_on``; a type not ``allowed`` (cpu, meta, a ``native`` target) is refused before it exists."""

    def __init__(self, target: str, run_on: str, native: bool) -> None:
        import torch

        self.remap, self.run_on, self.target = None if native else target, torch.device(run_on), target
        self.allowed = {"cpu", "meta"} | ({target} if native else set())

    def _refuse(self, kind: str, where: Any) -> None:
        name = str(getattr(where, "__qualname__", where)).replace("TensorBase.", "Tensor.")
        raise StrayDeviceError(
            f"the cell puts tensors on {kind} ({name}), where fake tensors "
            f"cannot live on this torch; predicting for {self.target}, it follows only {self.target}"
            + ("" if kind == self.target else f" (predict for {kind} with --predict {kind})"))

    def device(self, value: Any, where: Any, loose: bool = True) -> Any:
        """``value`` with the remapped type read as ``run_on``; a refused type raises. A device is named
        by a torch.device, and, when ``loose`` (an argument that can only be a device, as ``Tensor.to``'s
        first), by a string ('cuda:1') or an int (``to(0)`` means cuda:0)."""
        import torch

        if isinstance(value, torch.device):
            kind = value.type
        elif loose and isinstance(value, str):
            try:
                kind = torch.device(value.strip()).type
            except RuntimeError:
                return value
        elif loose and isinstance(value, int) and not isinstance(value, bool):
            kind = "cuda"
        else:
            return value
        if kind == self.remap:
            return self.run_on
        if kind not in self.allowed:
            self._refuse(kind, where)
        return value

    def check(self, values: Any, where: Any) -> None:
        """Refuse the tensors in ``values`` (a value, or a list or tuple of values or of lists of them)
        on a device they cannot live on."""
        import torch

        for value in values if isinstance(values, (list, tuple)) else (values,):
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor) and tensor.device.type not in self.allowed:
                    self._refuse(tensor.device.type, where)


def _function_mode(rules: _Devices) -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    class StandIn(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                if rules.remap == "cuda":
                    return args[0]  # already where the target keeps it
                rules.device("cuda", func)
            if func is torch.Tensor.cpu and rules.remap is not None:
                return args[0]  # a copy to the host: not on the target, and cpu is the stand-in
            if "device" in kwargs:
                kwargs["device"] = rules.device(kwargs["device"], func)
            to = func is torch.Tensor.to
            args = tuple(rules.device(a, func, loose=to and i == 1) for i, a in enumerate(args))
            rules.check(args, func)
            with torch_function_disabled():
                out = func(*args, **kwargs)
            rules.check(out, func)
            return out

    return StandIn()


def _dispatch_mode(rules: _Devices) -> Any:
    class StandInOps(dispatch_mode_base()):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if kwargs.get("device") is not None:
                kwargs["device"] = rules.device(kwargs["device"], func)
            out = func(*args, **kwargs)
            rules.check(out, func)
            return out

    return StandInOps()


@contextlib.contextmanager
def _cuda_autocast(autocast: Any) -> Iterator[None]:
    """``torch.autocast('cuda', dtype)`` (and ``torch.cuda.amp.autocast``) on this torch, for the duration:
    built as for cpu (a torch without CUDA refuses 'cuda'), then pointed at 'cuda', so that entering it
    sets torch's CUDA autocast state, which :mod:`.cudakernels` applies; ``torch.clear_autocast_cache``
    (called as the outermost region ends) also clears ``autocast``'s emulated weight cache. torch's class
    and function are restored afterwards."""
    import torch
    from torch.amp import autocast_mode

    cls = autocast_mode.autocast
    original, clear = cls.__init__, torch.clear_autocast_cache

    def init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True,
             cache_enabled: Any = None) -> None:
        if isinstance(device_type, str) and device_type == "cuda":
            dtype = torch.get_autocast_dtype("cuda") if dtype is None else dtype
            original(self, "cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
            self.device = "cuda"
            return
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def clear_both() -> None:
        autocast.weights.clear()
        clear()

    cls.__init__, torch.clear_autocast_cache = init, clear_both
    try:
        yield
    finally:
        cls.__init__, torch.clear_autocast_cache = original, clear


@contextlib.contextmanager
def guarded(kind: str, run_on: str, native: bool, cc: Optional[tuple]) -> Iterator[None]:
    """Run a block of a prediction for ``kind`` on fake ``run_on`` tensors. Fake tensors are allowed on
    cpu and meta, and on the target where it runs natively; any other device the cell names is refused
    in one line before a tensor of it exists. Where ``run_on`` stands in for the target (not
    ``native``), the target's device names are remapped and, for ``cuda``, its autocast, attention and
    dropout kernels emulated (:func:`.cudakernels.kernels`, for GPU generation ``cc``). Enter it inside
    the ``FakeTensorMode``, so that its operator-level mode sits above fake mode."""
    rules = _Devices(kind, run_on, native)
    with contextlib.ExitStack() as stack:
        if kind == "cuda" and not native:
            autocast = stack.enter_context(kernels(cc))
            stack.enter_context(_cuda_autocast(autocast))
        stack.enter_context(_function_mode(rules))
        stack.enter_context(_dispatch_mode(rules))
        yield
