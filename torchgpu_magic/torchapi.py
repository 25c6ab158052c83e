"""The one user of torch's private API.

torch's public API cannot say some things this package needs: the identity of a tensor's memory, whether
a GPU already has a CUDA context, what an autograd node saved, a dispatch mode that ``torch.compile``
never traces without importing ``torch._dynamo``, torch's memory tracker and fake tensors. Each of those
reads lives here, and nowhere else, so that a torch release that renames one breaks one function in one
file (tests/test_torchapi.py runs each of them on the torch the tests run with: 2.13 here, 2.14.1 in the
CUDA-build leg, 2.11 on the GPU machine). Every other module asks here and never reaches past ``torch.``'s
public names.

torch is imported lazily, inside each function: importing this module costs nothing.
"""
from __future__ import annotations

import functools
import operator
import sys
import types
from typing import Any, Callable, Optional

# The C pointer of an untyped storage: the identity of a block of memory (two tensors that share
# memory share it), read as an attribute getter because accounting maps it over thousands of storages.
STORAGE_ID: Callable[[Any], int] = operator.attrgetter("_cdata")

FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"  # the logger torch's fake tensors warn through


def storage_id(storage: Any) -> int:
    """The identity of ``storage`` (an untyped storage): equal for every tensor viewing the same memory."""
    return storage._cdata


def has_primary_context(index: int) -> bool:
    """Whether the GPU ``cuda:index`` already has this process's CUDA context; asking creates none."""
    import torch

    return bool(torch._C._cuda_hasPrimaryContext(index))


def cublas_workspace_sizes() -> frozenset:
    """The sizes torch gives the cuBLAS and cuBLASLt workspaces it allocates through its caching
    allocator (``CUBLAS_WORKSPACE_CONFIG``'s, else the GPU generation's default), read from torch itself;
    empty where this torch cannot say (a CPU build, a torch without the getters). Call only once CUDA is
    initialised: torch reads the current GPU's properties."""
    import torch

    sizes = set()
    for name in ("_cuda_getCublasWorkspaceSize", "_cuda_getCublasLtWorkspaceSize"):
        getter = getattr(torch._C, name, None)
        if getter is None:
            continue
        try:
            sizes.add(int(getter()))
        except (RuntimeError, TypeError, ValueError):
            continue
    return frozenset(size for size in sizes if size > 0)


def gpu_spin(cycles: int) -> None:
    """Queue a kernel on the current CUDA stream that spins ``cycles`` GPU clock cycles
    (``torch.cuda._sleep``): a kernel of known length, as PyTorch's own tests use it."""
    import torch

    torch.cuda._sleep(int(cycles))


def tensor_base_clone() -> Any:
    """``torch._C.TensorBase.clone``: the function a function mode sees when a ``Parameter`` is
    deep-copied (its ``__deepcopy__`` clones through the C base class, not ``torch.Tensor.clone``)."""
    import torch

    return torch._C.TensorBase.clone


def function_mode_depth() -> int:
    """How many ``TorchFunctionMode``s are active (a ``with torch.device(...)`` block is one)."""
    import torch

    return int(torch._C._len_torch_function_stack())


def cuda_compiled() -> bool:
    """Whether this torch's C extension was built with CUDA (or ROCm); a stand-in may script it."""
    import torch

    return bool(getattr(torch._C, "_has_cuda", False))


def backend_linked(kind: str) -> bool:
    """Whether this torch's C library carries ``kind``'s device support (its device guard), so that even a
    fake tensor of that device can go through autograd (without it torch calls ``terminate``): CUDA and
    ROCm by ``torch._C._has_cuda``; XPU by the C type of its device properties, which only an XPU build
    registers; MPS by ``torch._C._has_mps`` on macOS, the only system with an MPS build."""
    import torch

    if kind == "cuda":
        return cuda_compiled()
    if kind == "xpu":
        return hasattr(torch._C, "_XpuDeviceProperties")
    if kind == "mps":
        return bool(getattr(torch._C, "_has_mps", False)) and sys.platform == "darwin"
    return False


def cuda_device_counter() -> Optional[Callable[[], int]]:
    """The C extension's own count of CUDA devices (what ``torch.cuda.device_count`` asks beneath its
    caches), or None on a build without it. Its identity changes when a stand-in replaces it."""
    import torch

    return getattr(torch._C, "_cuda_getDeviceCount", None)


def torch_function_disabled() -> Any:
    """A context in which tensor subclasses' ``__torch_function__`` is not called: how a function mode
    calls the function it intercepted without seeing it again."""
    import torch

    return torch._C.DisableTorchFunctionSubclass()


def is_higher_order_op(func: Any) -> bool:
    """Whether ``func``, seen by a dispatch mode, is a higher-order operator (``cond``, ``while_loop``,
    a compiled region) rather than an aten op with a schema."""
    import torch

    return isinstance(func, torch._ops.HigherOrderOperator)


def tree_leaves(value: Any) -> list:
    """The leaves of a nested list / tuple / dict, as torch's dispatcher flattens an op's arguments."""
    from torch.utils._pytree import tree_leaves as leaves

    return leaves(value)


def fake_tensor_class(loaded_only: bool = False) -> Optional[type]:
    """torch's ``FakeTensor`` class; with ``loaded_only``, None unless its module is imported already
    (importing it costs seconds: it pulls in much of ``torch._dynamo``'s machinery)."""
    if loaded_only:
        module = sys.modules.get("torch._subclasses.fake_tensor")
        return getattr(module, "FakeTensor", None) if module is not None else None
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def fake_tensor_mode_class() -> type:
    """torch's ``FakeTensorMode``: tensors with shapes, dtypes and devices but no storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode


def mem_tracker_class() -> type:
    """torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``): every storage an op makes, by
    category and module. Raises what the import raises where it is missing (a build without
    ``torch.distributed``)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker


def saved_tensor_names(node_type: type) -> tuple:
    """The attributes through which an autograd node of ``node_type`` exposes what it saved for backward
    without unpacking it (``_raw_saved_<name>``: a ``SavedTensor`` whose ``.data`` is the stored tensor,
    or what a ``saved_tensors_hooks`` pack function returned). Reading ``_saved_<name>`` instead would
    run the unpack hook, user code that may copy to the device."""
    return tuple(name for name in dir(node_type) if name.startswith("_raw_saved_"))


def dynamo_loaded() -> bool:
    """Whether ``torch._dynamo`` is imported (``torch.compile`` imports it; asking imports nothing)."""
    return "torch._dynamo" in sys.modules


def compiled_graphs() -> int:
    """How many graphs ``torch.compile`` has compiled in this process; 0 where dynamo is not loaded."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo_utils, "counters", None)
    return int(counters["stats"]["unique_graphs"]) if counters else 0


def dynamo_skip() -> Optional[Callable[[types.CodeType], Any]]:
    """A function marking a code object, and all it calls, as never compiled by ``torch.compile``: what
    ``torch._dynamo.disable`` does for a function, through torch's C layer, so that ``torch._dynamo`` is not
    imported; None on a torch without that layer."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    except (ImportError, AttributeError, TypeError):
        return None
    return lambda code: set_code_exec_strategy(code, strategy)


@functools.cache
def dispatch_mode_base() -> type:
    """The ``TorchDispatchMode`` base class of every dispatch mode in this package (made once).

    torch wraps a mode's ``__torch_dispatch__`` in ``torch._disable_dynamo``, which imports
    ``torch._dynamo`` at the first op: 4 to 7 s on a busy 2-core machine, which a notebook's first
    ``%%cudatime`` would pay. This base marks its subclasses' own code as never compiled through torch's
    C layer instead (:func:`dynamo_skip`); on a torch without that layer torch's wrapper is kept, unless
    the subclass says its runs never compile (``never_compiles``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    skip = dynamo_skip()

    class QuietMode(TorchDispatchMode):
        """A dispatch mode whose own code ``torch.compile`` never traces, without importing
        ``torch._dynamo`` to say so."""

        never_compiles = False

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # asked by TorchDispatchMode.__init_subclass__: True wraps __torch_dispatch__ in
            # torch._disable_dynamo (and imports torch._dynamo at the first op)
            return skip is None and not cls.never_compiles

        def __init_subclass__(cls, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            if skip is not None:
                for value in vars(cls).values():
                    if isinstance(value, (classmethod, staticmethod)):
                        value = value.__func__
                    if isinstance(value, types.FunctionType):
                        skip(value.__code__)

    return QuietMode
