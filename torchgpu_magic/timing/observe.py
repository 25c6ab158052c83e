"""Which device a cell is timed on, decided from what the cell did.

"CUDA is initialised" is not "the cell used the GPU": ``%gpuinfo``, ``torch.cuda.get_device_name()`` or
an earlier cell initialise CUDA, and a cell of cpu tensors timed with CUDA events gets a false figure (and,
on a real GPU, a context it never asked for). So without ``--devices`` the setup and the first run are
watched by a ``TorchDispatchMode`` that notes the device of every tensor their ops read or write
(:func:`watch`), and :func:`choose_device` picks the device from that, from torch's default device, from
whether the cell itself initialised CUDA, and, for GPU work launched outside torch's dispatcher, from
whether its code names CUDA (:func:`names_cuda`). The same watch sums the bytes of the distinct storages the
ops touched per device: the working set the L2 note compares with the GPU's cache.

The watch keeps numbers and strings only (no reference to a tensor), runs for the first run alone (a
cell run under a Python dispatch mode is slower; the first run is excluded from the statistics anyway),
and tells ``torch.compile`` to ignore it, so compiled regions still compile (their inner ops are then not
seen). It shares its base class (:func:`torchgpu_magic.torchapi.dispatch_mode_base`: no ``torch._dynamo``
import) and its reading of an op's tensors (:func:`tensors_in`) with the roofline's counter
(:mod:`.counting`). torch is imported lazily.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from .. import accelerators, devices
from ..torchapi import dispatch_mode_base, fake_tensor_class, tree_leaves


@dataclass
class Touched:
    """What the watched code touched: ``devices`` in the order first seen ('cuda:0', 'cpu', 'meta'), the
    bytes of distinct storages per device, whether CUDA became initialised while watching, and whether
    the cell's code names CUDA."""

    devices: list = field(default_factory=list)
    nbytes: dict = field(default_factory=dict)
    cuda_initialised: bool = False
    names_cuda: bool = False  # the cell's code names CUDA (see names_cuda), set by the caller

    def working_set(self, device: Any) -> Optional[int]:
        """Bytes of the distinct storages touched on ``device``; None when none was seen there."""
        return self.nbytes.get(str(device)) or None


def tensors_in(*values: Any) -> list:
    """The tensors among an op's positional arguments, keyword arguments (a dict: its values) and results,
    in order. aten schemas nest tensors at most a list deep (``Tensor[]``, ``Tensor?[]``); anything deeper
    is flattened by pytree."""
    import torch

    found = []
    for value in values:
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) \
            else (value,)
        for item in items:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, (list, tuple, dict)):
                found += [leaf for leaf in tree_leaves(item) if isinstance(leaf, torch.Tensor)]
    return found


@functools.cache
def _mode_class() -> Any:
    """The TorchDispatchMode subclass, made once on first use."""
    class Watch(dispatch_mode_base()):
        """Notes the device and storage of every tensor an op reads or writes (fake tensors, which
        hold no memory and may claim devices this machine lacks, are left out)."""

        def __init__(self, touched: Touched) -> None:
            super().__init__()
            self.touched = touched
            self.seen: set = set()

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True  # torch.compile compiles as usual instead of falling back to eager

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            for tensor in tensors_in(args, kwargs, out):
                self.note(tensor)
            return out

        def note(self, tensor: Any) -> None:
            # torch's fake tensors exist only once their module is imported (importing it here
            # would cost seconds: it pulls in much of torch._dynamo's machinery)
            fake = fake_tensor_class(loaded_only=True)
            if fake is not None and isinstance(tensor, fake):
                return
            device = str(tensor.device)
            if device not in self.touched.nbytes:
                self.touched.devices.append(device)
                self.touched.nbytes[device] = 0
            if tensor.device.type == "meta":
                return
            with contextlib.suppress(RuntimeError, NotImplementedError, TypeError):  # sparse, storage-less
                storage = tensor.untyped_storage()
                key = (device, storage.data_ptr())
                if key not in self.seen:
                    self.seen.add(key)
                    self.touched.nbytes[device] += int(storage.nbytes())

    return Watch


@contextlib.contextmanager
def watch() -> Iterator[Touched]:
    """Watch the code in the block (the setup and the first run): yields the :class:`Touched` it fills."""
    touched = Touched()
    before = accelerators.cuda_state()  # asks nothing that could initialise CUDA
    try:
        with _mode_class()(touched):
            yield touched
    finally:
        touched.cuda_initialised = before != "initialised" and accelerators.cuda_state() == "initialised"


def choose_device(default: Any, touched: Optional[Touched], current_cuda: int, usable: tuple) -> Any:
    """The device ``%%cudatime`` times on without ``--devices``, as a pure function of its inputs.

    torch's ``default`` device when it is not cpu (inside ``%%ontorch cuda``; plain ``cuda`` is the
    current GPU, ``current_cuda``). For a cpu default, once the setup and first run were watched
    (``touched``): the first accelerator their tensors were on that can be timed here (``usable``
    kinds), else the current CUDA GPU if the cell itself initialised CUDA, else cpu. Before the watch
    (``touched`` None) a cpu default gives cpu.
    """
    import torch

    def indexed(device: Any) -> Any:
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", current_cuda)
        return device

    if default.type != "cpu":
        return indexed(default)
    if touched is None:
        return default
    for text in touched.devices:
        device = torch.device(text)
        if device.type not in ("cpu", "meta") and device.type in usable:
            return indexed(device)
    if (touched.cuda_initialised or touched.names_cuda) and "cuda" in usable:
        return torch.device("cuda", current_cuda)
    return default


def names_cuda(code: Any, namespace: dict) -> bool:
    """Whether a cell's code names CUDA: reads an attribute or global called ``cuda`` (``torch.cuda...``,
    ``x.cuda()``), holds a string constant naming a CUDA device (``'cuda'``, ``'cuda:1'``), or reads a name
    bound to a CUDA tensor. GPU work launched outside torch's dispatcher (``torch.cuda._sleep``, a Triton
    kernel called on tensors made before the cell) leaves the watch nothing else to see. Nested code
    (comprehensions, functions defined in the cell) is read too; nothing is run or evaluated."""
    import torch

    stack = [code]
    while stack:
        current = stack.pop()
        if "cuda" in current.co_names:
            return True
        for const in current.co_consts:
            if isinstance(const, str) and (const == "cuda" or const.startswith("cuda:")):
                return True
            if hasattr(const, "co_names"):
                stack.append(const)
        values = (namespace.get(name) for name in current.co_names)
        if any(isinstance(value, torch.Tensor) and value.device.type == "cuda" for value in values):
            return True
    return False


def timing_device(touched: Optional[Touched] = None) -> Any:
    """:func:`choose_device` for this process now: torch's default device, the accelerators usable here
    and, where it matters, the current CUDA GPU. Initialises nothing."""
    usable = tuple(accelerators.available_kinds())
    current = accelerators.current_index("cuda") if "cuda" in usable else 0
    return choose_device(devices.default_device(), touched, current, usable)
