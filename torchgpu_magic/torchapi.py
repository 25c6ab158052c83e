"""The one user of torch's private API.

torch's public API cannot say some things this package needs: the identity of a tensor's memory, whether a
GPU already has a CUDA context, what an autograd node saved, the default-device setting itself, a dispatch
mode that ``torch.compile`` never traces without importing ``torch._dynamo``, torch's memory tracker and
fake tensors. Each of those reads lives here, and nowhere else, so that a torch release that renames one
breaks one function in one file (tests/test_torchapi.py runs each of them on the torch the tests run with:
2.13 here, 2.14.1 in the CUDA-build leg, 2.11 on the GPU machine). Every other module asks here and never
reaches past ``torch.``'s public names.

torch is imported lazily, inside each function: importing this module costs nothing.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import re
import sys
import types
from typing import Any, Callable, Optional

# The C pointer of an untyped storage: the identity of a block of memory (two tensors that share
# memory share it), an attribute getter because accounting maps it over thousands of storages.
STORAGE_ID: Callable[[Any], int] = operator.attrgetter("_cdata")

FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"  # the logger torch's fake tensors warn through


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
        if getter is not None:
            with contextlib.suppress(RuntimeError, TypeError, ValueError):
                sizes.add(int(getter()))
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


def default_device_setting() -> Any:
    """torch's own default-device setting: None, or the device given to ``set_default_device`` (kept in
    the ``device_context`` of the ``threading.local`` ``torch._GLOBAL_DEVICE_CONTEXT``)."""
    import torch

    holder = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return None if holder is None else holder.device


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


def is_inplace(op: Any) -> bool:
    """Whether an aten op overload is an in-place variant (``add_``, not ``add`` or ``add.out``): torch's
    ``Tag.inplace`` where this torch has it (it is newer than 2.11), else the rule torchgen tags by, the
    op's base name ending in one underscore (``add_``, ``_foreach_add_``) or an in-place dunder
    (``__iadd__``)."""
    import torch

    tag = getattr(torch.Tag, "inplace", None)
    return tag in op.tags if tag is not None else named_inplace(op)


def named_inplace(op: Any) -> bool:
    """:func:`is_inplace` by the op's name alone, for a torch without ``Tag.inplace``."""
    base = op._schema.name.split("::")[-1]
    if base.startswith("__") and base.endswith("__"):
        return base.startswith("__i")
    return base.endswith("_")


PROFILER_RUNTIME = re.compile(r"^(cuda|cu|hip)[A-Z]")  # CUDA runtime / driver and HIP calls by their names


def profiler_activity(event: Any) -> str:
    """The Kineto activity of a ``torch.profiler`` event (``cpu_op``, ``kernel``, ``gpu_memcpy``,
    ``gpu_memset``, ``cuda_runtime``, ``user_annotation``, ``gpu_user_annotation``...). Newer torch
    carries it on each ``FunctionEvent`` (``activity_type``); torch 2.11 does not, and there it is told from
    what every version carries: the device the event ran on, the user-annotation flag, and the names the
    runtime, copies and operators have (``cudaLaunchKernel``, ``Memcpy HtoD``, ``aten::add``)."""
    activity = getattr(event, "activity_type", None)
    if activity:
        return activity
    from torch.autograd import DeviceType

    name = event.name
    annotation = event.is_user_annotation  # torch 2.11 has it too, as the H200 run printed
    if event.device_type != DeviceType.CPU:
        if annotation:
            return "gpu_user_annotation"
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        return "gpu_memset" if name.startswith("Memset") else "kernel"
    if annotation:
        return "user_annotation"
    if PROFILER_RUNTIME.match(name):
        return "cuda_runtime"
    # an operator is named by its namespace (aten::add, mylib::op); the rest are CUPTI's own rows
    # ('Activity Buffer Request', 'Lazy Function Loading'), which newer torch calls overhead
    return "cpu_op" if "::" in name else "overhead"


def argument_names(op: Any) -> list:
    """The names of an op overload's arguments, in its schema's order (``self``, ``dim``, ``dtype``...)."""
    return [argument.name for argument in op._schema.arguments]


def tree_flatten(value: Any) -> tuple:
    """``(leaves, spec)`` of a nested list / tuple / dict, as torch's dispatcher flattens an op's
    arguments; :func:`tree_unflatten` builds it back from (changed) leaves."""
    from torch.utils._pytree import tree_flatten as flatten

    return flatten(value)


def tree_unflatten(leaves: list, spec: Any) -> Any:
    """The nested value :func:`tree_flatten` took apart, with ``leaves`` in its places."""
    from torch.utils._pytree import tree_unflatten as unflatten

    return unflatten(leaves, spec)


def fake_tensor_class(loaded_only: bool = False) -> Optional[type]:
    """torch's ``FakeTensor`` class; with ``loaded_only``, None unless its module is imported already
    (importing it costs seconds: it pulls in much of ``torch._dynamo``'s machinery)."""
    if loaded_only:
        return getattr(sys.modules.get("torch._subclasses.fake_tensor"), "FakeTensor", None)
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


# ---- the dispatcher, where --predict emulates another device's kernel choices (cudamem/cudakernels.py) --
@functools.cache
def _aten_ops() -> tuple:
    """``(name, op overload)`` of every aten op the dispatcher knows (made once: 70 ms)."""
    import torch

    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        op_name, _, overload = name[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, op_name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None:
            found.append((name, op))
    return tuple(found)


def ops_with_kernel(key: str) -> list:
    """The aten op overloads that register a kernel of their own for dispatch key ``key`` (for instance
    'AutocastCUDA': the ops CUDA's autocast casts), read from the dispatcher's registrations."""
    import torch

    return [op for name, op in _aten_ops() if torch._C._dispatch_has_kernel_for_dispatch_key(name, key)]


class PythonKernels:
    """Python kernels for ``(op overload, dispatch key name)`` pairs, run by torch's Python dispatcher, for
    the duration of a ``with`` block in this thread: the dispatcher is enabled for the block, each kernel
    is added to its op's ``py_kernels`` on entry (in place of one torch registered there, which comes
    back on exit) and taken out on exit, and each op's dispatch cache is cleared both times (what
    ``OpOverload.py_impl`` does, made undoable). Outside the block, and in other threads, torch's Python
    dispatcher is off and the kernels are never consulted. With ``eager``, the Python decompositions torch
    registers for its own tracing (``CompositeImplicitAutograd`` kernels in Python: ``matmul``, ``lstm``,
    the upsamplings...) are set aside for the block as well, so that every other op runs its C++ kernels,
    as it does outside the Python dispatcher."""

    def __init__(self, kernels: dict, eager: bool = False) -> None:
        self.kernels = kernels
        self.eager = eager
        self._guard: Any = None
        self._replaced: dict = {}

    def __enter__(self) -> PythonKernels:
        import torch

        kernels = dict(self.kernels)
        if self.eager:
            composite = torch._C.DispatchKey.CompositeImplicitAutograd
            for _, op in _aten_ops():
                if composite in op.py_kernels and (op, "CompositeImplicitAutograd") not in kernels:
                    kernels[(op, "CompositeImplicitAutograd")] = None
        self.kernels = kernels
        for (op, key), fn in kernels.items():
            dispatch_key = getattr(torch._C.DispatchKey, key)
            if dispatch_key in op.py_kernels:
                self._replaced[(op, key)] = op.py_kernels[dispatch_key]
            if fn is None:  # set aside
                op.py_kernels.pop(dispatch_key, None)
            else:
                op.py_kernels[dispatch_key] = fn
            op._dispatch_cache.clear()
        self._guard = torch._C._EnablePythonDispatcher()
        self._guard.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        try:
            self._guard.__exit__(*exc)
        finally:
            for op, key in self.kernels:
                dispatch_key = getattr(torch._C.DispatchKey, key)
                if (op, key) in self._replaced:
                    op.py_kernels[dispatch_key] = self._replaced.pop((op, key))
                else:
                    op.py_kernels.pop(dispatch_key, None)
                op._dispatch_cache.clear()


def dispatch_key_included(key: str) -> Any:
    """A context in which dispatch key ``key`` joins every op's dispatch key set in this thread (unless it
    is excluded there: torch's autocast keys stay excluded while autocast is off)."""
    import torch

    return torch._C._IncludeDispatchKeyGuard(getattr(torch._C.DispatchKey, key))


def dispatch_key_excluded(key: str) -> Any:
    """A context in which dispatch key ``key`` is skipped by every op in this thread (what an autocast
    kernel does around the op it calls)."""
    import torch

    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key)))


def redispatch(op: Any, key: str, args: tuple, kwargs: dict) -> Any:
    """Call ``op``'s kernel for dispatch key ``key`` itself (and the dispatcher from there on)."""
    import torch

    return op.redispatch(torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key)), *args, **kwargs)


def wrapper_tensor(cls: type, meta: Any, device: Any) -> Any:
    """A tensor of subclass ``cls`` with ``meta``'s shape, strides and dtype on ``device``, holding no data
    (``Tensor._make_wrapper_subclass``): what an op sees of a tensor on a device this process need not
    have; creating one touches no device."""
    import torch

    return torch.Tensor._make_wrapper_subclass(cls, meta.shape, strides=meta.stride(), dtype=meta.dtype,
                                               device=device)


def disabled_torch_function() -> Any:
    """torch's ``__torch_function__`` that does nothing: a tensor subclass that only works at the dispatch
    level sets it as its own."""
    import torch

    return torch._C._disabled_torch_function_impl


class OutsideModes(contextlib.ExitStack):
    """For the duration: no torch function mode, no dispatch mode and no Python dispatcher in this thread
    (all restored afterwards), so that ops reach a tensor subclass's own ``__torch_dispatch__``."""

    def __enter__(self) -> OutsideModes:
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        for guard in (torch._C.DisableTorchFunction(), _disable_current_modes(),
                      torch._C._DisablePythonDispatcher()):
            self.enter_context(guard)
        return self
