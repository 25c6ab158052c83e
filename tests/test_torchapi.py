"""torchapi.py, the one user of torch's private API: every accessor works on the torch these tests run with
(2.13 on the ordinary legs, 2.14.1 on the CUDA-build leg, 2.11 on the GPU machine), so a release that
renames one of torch's private names fails here, in one place."""
from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch

from torchgpu_magic import torchapi


def test_storage_identity_is_shared_by_views_and_differs_between_tensors():
    a = torch.zeros(8)
    view, other = a[2:], torch.zeros(8)
    key = torchapi.STORAGE_ID(a.untyped_storage())
    assert key == torchapi.STORAGE_ID(view.untyped_storage()) != torchapi.STORAGE_ID(other.untyped_storage())
    assert isinstance(key, int)


def test_a_backend_is_linked_only_where_its_device_guard_is(monkeypatch):
    """The simulated Mac and Intel GPU script torch's flags (``_has_mps``, ``_has_xpu``), not its device
    guards: there fake mps / xpu tensors would abort the process, and backend_linked must say no."""
    assert torchapi.backend_linked("cuda") == torchapi.cuda_compiled()
    assert torchapi.backend_linked("npu") is False
    if torch.version.cuda is None and not torch._C._has_mps and not torch._C._has_xpu:  # a CPU build
        assert not torchapi.backend_linked("mps") and not torchapi.backend_linked("xpu")
        monkeypatch.setattr(torch._C, "_has_mps", True)
        monkeypatch.setattr(torch._C, "_has_xpu", True)
        assert not torchapi.backend_linked("mps") and not torchapi.backend_linked("xpu")


def test_cuda_facts_answer_without_creating_a_context():
    assert isinstance(torchapi.cuda_compiled(), bool)
    counter = torchapi.cuda_device_counter()
    assert counter is None or callable(counter)
    if torch.cuda.is_available():
        assert counter() == torch.cuda.device_count()
        assert isinstance(torchapi.has_primary_context(0), bool)


def test_cublas_workspace_sizes_come_from_torch_or_nothing():
    sizes = torchapi.cublas_workspace_sizes()
    assert isinstance(sizes, frozenset) and all(isinstance(s, int) and s > 0 for s in sizes)
    if not hasattr(torch._C, "_cuda_getCublasWorkspaceSize"):  # a CPU build has no getter
        assert sizes == frozenset()
    elif torch.cuda.is_available():
        torch.cuda.init()
        assert torch._C._cuda_getCublasWorkspaceSize() in torchapi.cublas_workspace_sizes()


def test_function_mode_depth_counts_a_device_block():
    depth = torchapi.function_mode_depth()
    with torch.device("meta"):
        assert torchapi.function_mode_depth() == depth + 1
    assert torchapi.function_mode_depth() == depth


def test_torch_function_disabled_and_the_base_clone():
    """A function mode sees ``TensorBase.clone`` when a Parameter is deep-copied (fakenamespace.py turns
    that clone into a fake), and a tensor subclass's ``__torch_function__`` is not called while disabled."""
    import copy

    from torch.overrides import TorchFunctionMode

    clone = torchapi.tensor_base_clone()
    seen = []

    class Seeing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Seeing():
        copy.deepcopy(torch.nn.Parameter(torch.zeros(2)))
    assert clone in seen

    class Tracing(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append("subclass")
            with torchapi.torch_function_disabled():
                return func(*args, **(kwargs or {}))

    t = torch.zeros(2).as_subclass(Tracing)
    seen.clear()
    t + 1
    assert seen == ["subclass"]
    seen.clear()
    with torchapi.torch_function_disabled():
        t + 1
    assert seen == []


def test_higher_order_ops_and_pytree_leaves():
    assert not torchapi.is_higher_order_op(torch.ops.aten.add.Tensor)
    cond = getattr(torch.ops.higher_order, "cond", None)
    if cond is not None:
        assert torchapi.is_higher_order_op(cond)
    a, b = torch.zeros(1), torch.ones(1)
    assert torchapi.tree_leaves({"x": [a, (b, 3)]}) == [a, b, 3]


def test_fake_tensors_and_the_mode():
    fake_mode = torchapi.fake_tensor_mode_class()()
    with fake_mode:
        x = torch.empty(2**40, dtype=torch.uint8)
    assert isinstance(x, torchapi.fake_tensor_class())
    assert torchapi.fake_tensor_class(loaded_only=True) is torchapi.fake_tensor_class()
    import logging

    assert logging.getLogger(torchapi.FAKE_TENSOR_LOGGER).name == torchapi.FAKE_TENSOR_LOGGER


@pytest.mark.fresh_process
def test_fake_tensor_class_loaded_only_imports_nothing():
    code = ("import sys, torch\nfrom torchgpu_magic import torchapi\n"
            "loaded = 'torch._subclasses.fake_tensor' in sys.modules\n"
            "assert (torchapi.fake_tensor_class(loaded_only=True) is not None) == loaded\n"
            "assert ('torch._subclasses.fake_tensor' in sys.modules) == loaded\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_mem_tracker_has_what_cudamem_uses():
    try:
        tracker = torchapi.mem_tracker_class()
    except ImportError:
        pytest.skip("this torch has no torch.distributed")
    from torchgpu_magic.cudamem.run import _NEEDED

    for name in _NEEDED:
        assert hasattr(tracker(), name), name


def test_saved_tensor_names_read_what_backward_keeps_without_unpacking():
    w = torch.randn(3, 3, requires_grad=True)
    y = (w * w).sum()
    node = y.grad_fn.next_functions[0][0]  # MulBackward0: saves both inputs
    names = torchapi.saved_tensor_names(type(node))
    assert names and all(n.startswith("_raw_saved_") for n in names)
    saved = [getattr(node, n).data for n in names]
    assert any(s is not None and s.data_ptr() == w.data_ptr() for s in saved)
    del y, node
    gc.collect()


def test_dynamo_state_is_read_without_importing_it():
    assert isinstance(torchapi.dynamo_loaded(), bool)
    assert torchapi.compiled_graphs() >= 0
    code = ("import sys, torch\nfrom torchgpu_magic import torchapi\n"
            "assert not torchapi.dynamo_loaded() and torchapi.compiled_graphs() == 0\n"
            "assert 'torch._dynamo' not in sys.modules\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_the_dispatch_base_sees_ops_and_skips_dynamo():
    base = torchapi.dispatch_mode_base()
    assert base is torchapi.dispatch_mode_base()
    seen = []

    class Seeing(base):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Seeing():
        torch.ones(2) + 1
    assert torch.ops.aten.add.Tensor in seen
    assert torchapi.dynamo_skip() is not None  # the C layer that marks code as never compiled is there
    assert not Seeing._should_skip_dynamo()


@pytest.mark.gpu
def test_gpu_spin_runs_a_kernel_of_known_length():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torchapi.gpu_spin(1000)
    start.record()
    torchapi.gpu_spin(50_000_000)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 1.0  # 5e7 cycles at under 3 GHz: more than 16 ms


def test_an_ops_argument_names_come_from_its_schema():
    assert torchapi.argument_names(torch.ops.aten.softmax.int) == ["self", "dim", "dtype"]
    names = torchapi.argument_names(torch.ops.aten._scaled_dot_product_flash_attention.default)
    assert names[:5] == ["query", "key", "value", "dropout_p", "is_causal"]


def test_in_place_ops_by_tag_and_by_name_agree_on_every_aten_op():
    """torch 2.11 (the GPU machine's) has no ``Tag.inplace``: the name rule it falls back to says the same
    as the tag for every aten op of a torch that has both."""
    overloads = []
    for name in torch._C._dispatch_get_all_op_names():  # the dispatcher's ops (not TorchScript's list ops)
        base, _, overload = name.removeprefix("aten::").partition(".")
        packet = getattr(torch.ops.aten, base, None) if name.startswith("aten::") else None
        if packet is not None and hasattr(packet, overload or "default"):
            overloads.append(getattr(packet, overload or "default"))
    assert len(overloads) > 1000
    assert torchapi.is_inplace(torch.ops.aten.add_.Tensor) and not torchapi.is_inplace(torch.ops.aten.add.out)
    if hasattr(torch.Tag, "inplace"):
        assert [op for op in overloads
                if torchapi.named_inplace(op) != (torch.Tag.inplace in op.tags)] == []


def test_profiler_activity_is_read_where_torch_carries_it_and_told_apart_where_it_does_not():
    from profiler_events import function_event

    def event(name, device, annotation=False, activity=None):
        return function_event(name, device, annotation=annotation, activity=activity)

    rows = [("aten::add", "CPU", False, "cpu_op"), ("cudaLaunchKernel", "CPU", False, "cuda_runtime"),
            ("cuLaunchKernel", "CPU", False, "cuda_runtime"), ("hipDeviceSynchronize", "CPU", False,
                                                               "cuda_runtime"),
            ("step", "CPU", True, "user_annotation"), ("step", "CUDA", True, "gpu_user_annotation"),
            ("add_kernel", "CUDA", False, "kernel"), ("Memcpy DtoH (Device -> Pageable)", "CUDA", False,
                                                      "gpu_memcpy"),
            ("Memset (Device)", "CUDA", False, "gpu_memset"), ("mylib::op", "CPU", False, "cpu_op"),
            ("Lazy Function Loading", "CPU", False, "overhead")]  # as torch 2.11 on an H200 listed them
    for name, device, annotation, activity in rows:
        assert torchapi.profiler_activity(event(name, device, annotation)) == activity, name
        assert torchapi.profiler_activity(event(name, device, annotation, "kernel")) == "kernel"


def test_ops_with_a_kernel_of_their_own_for_a_dispatch_key():
    """The ops CUDA's autocast casts, read from the dispatcher (registered on every build)."""
    autocast = torchapi.ops_with_kernel("AutocastCUDA")
    aten = torch.ops.aten
    cast = {aten.mm.default, aten.pow.Tensor_Scalar, aten.layer_norm.default, aten.softmax.int}
    assert cast <= set(autocast)
    assert aten.relu.default not in autocast and aten.gelu.default not in autocast


def test_python_kernels_run_only_inside_their_block_and_leave_nothing_behind():
    import torch.nn.functional as F

    op = torch.ops.aten.dropout.default
    torchs_own = dict(op.py_kernels)  # torch registers some itself (decompositions): they stay
    x = torch.ones(8)
    with torchapi.PythonKernels({(op, "CompositeImplicitAutograd"): lambda t, p, train: t * 0 + 7}):
        assert F.dropout(x, 0.5, training=True).tolist() == [7.0] * 8
        with torch.inference_mode():  # also where autograd's keys are skipped
            assert F.dropout(x, 0.5, training=True).tolist() == [7.0] * 8
    assert F.dropout(x, 0.0, training=True).tolist() == [1.0] * 8
    assert op.py_kernels == torchs_own


def test_eager_python_kernels_set_torchs_own_decompositions_aside_for_the_block():
    """torch registers Python decompositions at CompositeImplicitAutograd for its tracing (matmul's among
    them, once its decompositions are imported); the Python dispatcher would run them instead of the C++
    kernels eager mode runs."""
    import torch._decomp  # noqa: F401 - registers them

    key = torch._C.DispatchKey.CompositeImplicitAutograd
    matmul = torch.ops.aten.matmul.default
    assert key in matmul.py_kernels
    own = matmul.py_kernels[key]
    with torchapi.PythonKernels({}, eager=True):
        assert key not in matmul.py_kernels
        assert (torch.ones(2, 3) @ torch.ones(3, 4)).sum() == 24
    assert matmul.py_kernels[key] is own


def test_dispatch_keys_included_excluded_and_called_directly():
    aten = torch.ops.aten
    a = torch.ones(2, 2)
    seen = []

    def autocast_cuda(x, y):
        seen.append("AutocastCUDA")
        with torchapi.dispatch_key_excluded("AutocastCUDA"):
            return aten.mm.default(x, y)

    with torchapi.PythonKernels({(aten.mm.default, "AutocastCUDA"): autocast_cuda}):
        torch.mm(a, a)  # cpu tensors: the key is not in their set
        assert seen == []
        prev = torch.is_autocast_enabled("cuda")
        torch.set_autocast_enabled("cuda", True)
        try:
            with torchapi.dispatch_key_included("AutocastCUDA"):
                torch.mm(a, a)
        finally:
            torch.set_autocast_enabled("cuda", prev)
    assert seen == ["AutocastCUDA"]
    assert torchapi.redispatch(aten.mm.default, "CPU", (a, a), {}).tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_a_wrapper_tensor_on_a_device_this_process_need_not_have():
    class Shaped(torch.Tensor):
        __torch_function__ = torchapi.disabled_torch_function()

        @staticmethod
        def __new__(cls, meta):
            return torchapi.wrapper_tensor(cls, meta, torch.device("cuda", 0))

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError(str(func))

    shaped = Shaped(torch.empty(3, 4, dtype=torch.bfloat16, device="meta"))
    assert (shaped.device, shaped.shape, shaped.dtype) == (torch.device("cuda", 0), (3, 4), torch.bfloat16)
    leaves, spec = torchapi.tree_flatten(((shaped, [1, shaped]), {"k": 2}))
    assert len(leaves) == 4 and torchapi.tree_unflatten(leaves, spec)[1] == {"k": 2}


def test_outside_modes_sets_aside_function_modes_dispatch_modes_and_the_python_dispatcher():
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append("function")
            return func(*args, **(kwargs or {}))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append("dispatch")
            return func(*args, **(kwargs or {}))

    with Functions(), Ops():
        with torchapi.OutsideModes():
            torch.ones(2) + 1
        assert seen == []
        torch.ones(2) + 1
    assert "function" in seen and "dispatch" in seen
