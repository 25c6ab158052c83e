"""Every wording of PyTorch's "these tensors are on different devices" error that we know of, as test data.

The mismatch diagnosis recognises a device mismatch from the text of the exception
(``explain.mismatch.mismatch_devices``), and PyTorch has phrased that error many ways over the years: in
ATen's TensorIterator, in the generated dispatcher checks, in the legacy TH/THC bindings, in the RNN,
attention, indexing, convolution and linear algebra kernels, in the MPS backend, in DataParallel, in
FakeTensor and torch.compile, and in the Python reference implementations. This module is the table those
tests read; it holds no tests itself.

Each row of ``WORDINGS`` is ``(message, expected, source)``:

* ``message``: the full message as torch prints it: the format string from the source with concrete
  devices, argument and operator names filled in, or a message copied from a user's traceback.
* ``expected``: what ``mismatch_devices(RuntimeError(message))`` should return: the devices the operands
  are on, each once, in the order the message names them, normalised as the current code does ("cuda:0",
  "cpu", "meta", "mps:0"; only the type, "cuda", "cpu" or "mps", where the message names a device type or a
  legacy tensor type such as ``torch.cuda.FloatTensor`` or ``MPSFloatType``; "CPU" and "GPU" become "cpu"
  and "cuda"; a bare CUDA index, as in "device 1 does not equal 0", becomes "cuda:1"). ``()`` for a device
  mismatch whose message names no device; ``None`` for a negative row: a dtype, shape or other error that
  looks similar and must get no device diagnosis.
* ``source``: where the wording comes from. "pytorch vX.Y path:LINE" is that release's source (v0.4 to
  v1.3 are the release tags, v2.0 and v2.4 those releases' trees, v2.13 the installed torch's own Python
  files); "pytorch 1.N.0a0 path:LINE" is the development master just before release 1.N, which printed the
  same text. A URL is a GitHub issue or pull request where a user posted the message from a real
  traceback. "(verified ...)" marks the rows whose exact text was raised for real with torch 2.13 on CPU
  and the meta device.

The rows were collected by grepping PyTorch's source at those releases (``aten/src/ATen``, ``aten/src/TH*``,
``c10``, ``torch/nn``, ``torch/_subclasses``, ``torch/_refs``, ``torch/_prims_common``, ``torch/_decomp``,
``torch/_meta_registrations.py``, ``torch/_dynamo``) for the phrases these checks use ("same device",
"device type", "is on", "expected device", "does not equal", "Received", "Placeholder storage", "parameters
and buffers", "FakeTensor Device", "should be the same", ...), keeping the checks that compare the devices
of two or more operands, and by searching GitHub issues for the tracebacks users posted.
"""

from __future__ import annotations

WORDINGS: list[tuple[str, tuple | None, str]] = [
    # ---- the common-device check, "Expected all tensors to be on the same device" (v1.7 and later) ----
    ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
     ("cuda:0", "cpu"),
     "pytorch 1.8.0a0 aten/src/ATen/native/TensorIterator.cpp:387"),
    ("Expected all tensors to be on the same device, but found at least two devices, cpu and cuda:0! "
     "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)",
     ("cpu", "cuda:0"),
     "https://github.com/vladmandic/sdnext/issues/1726"),
    ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1! "
     "(when checking arugment for argument mat1 in method wrapper_addmm)",
     ("cuda:0", "cuda:1"),
     "pytorch v1.9 aten/src/ATen/core/adaption.cpp:19 at pytorch/pytorch@131c37be "
     "(the 'arugment' typo, fixed in 1.10.0a0)"),
    ("Expected all tensors to be on the same device, but got mat1 is on cpu, different from other tensors "
     "on cuda:0 (when checking argument in method wrapper_CUDA_addmm)",
     ("cpu", "cuda:0"),
     "https://github.com/ClownsharkBatwing/RES4LYF/pull/223"),
    ("Expected all tensors to be on the same device, but found at least two devices, cpu and meta!",
     ("cpu", "meta"),
     "pytorch v2.13 torch/_subclasses/fake_tensor.py:159 (FakeTensorDeviceMismatchError; verified: "
     "x @ y on FakeTensors made from a cpu and a meta tensor)"),
    ("Tensor device mismatch\n"
     "  Explanation: Expected all tensors to be on the same device, but found at least two devices, "
     "cpu and meta!\n"
     "  Hint: Move inputs, parameters, and buffers to the same device.\n\n"
     "  Developer debug context: call_function <built-in function matmul>\n\n"
     " For more details about this graph break, please visit: "
     "https://meta-pytorch.github.io/compile-graph-break-site/gb/gb5173.html\n\n"
     "from user code:\n"
     '   File "<ipython-input-1-c3e9f4b716b6>", line 2, in f\n'
     "    return x @ y\n"
     "           ^^^^^\n\n"
     "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're "
     'reporting a bug to PyTorch). For even more developer context, set TORCH_LOGS="+dynamo"\n',
     ("cpu", "meta"),
     "pytorch v2.13 torch/_dynamo/utils.py:4135 (verified: torch.compile(backend='eager') of x @ y "
     "with a cpu and a meta tensor, in an IPython cell)"),
    ("Expected all tensors to be on the same device, but found at least two devices.",
     (),
     "pytorch v2.4 aten/src/ATen/native/mps/operations/TensorCompare.mm:381"),
    ("Expected all tensors to be on the same device. Found: cuda:0, cuda:0, cpu and cuda:0",
     ("cuda:0", "cpu"),
     "pytorch 1.7.0a0 aten/src/ATen/native/cuda/LinearAlgebra.cu:250"),
    ("Expected all tensors to be on the same device. addmm: expected 'mat1' to be a CPU tensor, but "
     "got tensor on cuda:0",
     ("cpu", "cuda:0"),
     "pytorch v2.4 aten/src/ATen/native/sparse/SparseTensorMath.cpp:1265"),
    # ---- the Python reference implementations (torch._prims_common, torch._refs) ----
    ("Tensor on device meta is not on the expected device cpu!",
     ("meta", "cpu"),
     "pytorch v2.13 torch/_prims_common/__init__.py:924 "
     "(verified: torch.ones(3) + torch.ones(3, device='meta'))"),
    ("Expected divisor (b) to be on the same device (cpu) as dividend (a), but it is found on meta!",
     ("cpu", "meta"),
     "pytorch v2.13 torch/_refs/__init__.py:1290 (verified: torch._refs.div, rounding_mode='floor')"),
    ("Attempting to copy from device cpu to device meta, but cross-device copies are not allowed!",
     ("cpu", "meta"),
     "pytorch v2.13 torch/_prims_common/wrappers.py:206 (verified: torch.add with a meta out=)"),
    ("Input tensors must all be on the same device. Input 0 is on device cpu and input 1 is on "
     "device meta.",
     ("cpu", "meta"),
     "pytorch v2.13 torch/_refs/__init__.py:4780 (verified: torch.block_diag)"),
    # ---- torch.compile's FakeTensor device propagation (v2.0 to v2.x) ----
    ("Unhandled FakeTensor Device Propagation for aten.copy_.default, found two different devices "
     "cpu, cuda:0",
     ("cpu", "cuda:0"),
     "pytorch v2.0 torch/_subclasses/fake_tensor.py:921"),
    ("Failed running call_function <built-in function add>(*(FakeTensor(..., device='cuda:0', "
     "size=(1, 4)), FakeTensor(..., size=(4,))), **{}):\n"
     "Unhandled FakeTensor Device Propagation for aten.add.Tensor, found two different devices "
     "cuda:0, cpu\n\n"
     "from user code:\n"
     '   File "<string>", line 25, in forward',
     ("cuda:0", "cpu"),
     "https://github.com/WGQZYJZ/Empirical-Study-on-LLM-based-DL-Compiler-Testing-Techniques/blob/HEAD/"
     "WhiteFox/torch-exec/_results-torch-titan/step53-3shot-cuda/jit_fail/binary=4_9.py "
     "(format: pytorch v2.4 torch/_dynamo/utils.py:1899)"),
    # ---- the legacy TH/THC and early ATen wordings (v0.3 to v1.6) ----
    ("Expected object of type torch.cuda.FloatTensor but found type torch.FloatTensor for "
     "argument #3 'other'",
     ("cuda", "cpu"),
     "https://github.com/pytorch/pytorch/issues/4265"),
    ("Expected object of type Variable[torch.FloatTensor] but found type "
     "Variable[torch.cuda.FloatTensor] for argument #1 'mat2'",
     ("cpu", "cuda"),
     "https://github.com/pytorch/pytorch/issues/9869"),
    ("Expected object of backend CUDA but got backend CPU for argument #2 'mat2'",
     ("cuda", "cpu"),
     "pytorch v1.0 aten/src/ATen/Utils.h:69"),
    ("Expected object of device type cuda but got device type cpu for argument #1 'self' in call to "
     "_th_index_select",
     ("cuda", "cpu"),
     "https://github.com/Nmegha2601/activitygraph_transformer/issues/9"),
    ("expected backend CUDA and dtype Float but got backend CPU and dtype Float",
     ("cuda", "cpu"),
     "pytorch v1.1 aten/src/ATen/native/TensorIterator.cpp:129"),
    ("expected device cpu and dtype Float but got device cuda:0 and dtype Float",
     ("cpu", "cuda:0"),
     "https://github.com/qfgaohao/pytorch-ssd/issues/78"),
    ("expected device cuda:0 but got device cpu",
     ("cuda:0", "cpu"),
     "https://github.com/sgrvinod/a-PyTorch-Tutorial-to-Object-Detection/issues/26"),
    ("binary_op(): expected both inputs to be on same device, but input a is on cuda:0 and input b "
     "is on cpu",
     ("cuda:0", "cpu"),
     "pytorch v1.0 aten/src/ATen/native/TensorIterator.cpp:463"),
    ("reduce_op(): expected input and both outputs to be on same device, but input is on cuda:0, "
     "output1 is on cuda:0 and output2 is oncpu",
     ("cuda:0", "cpu"),
     "pytorch v1.2 aten/src/ATen/native/TensorIterator.cpp:591 (no space before the last device)"),
    ("Expected tensor for argument #1 'input' to have the same device as tensor for argument #2 "
     "'weight'; but device 1 does not equal 0 (while checking arguments for cudnn_convolution)",
     ("cuda:1", "cuda:0"),
     "https://github.com/Cadene/pretrained-models.pytorch/issues/196"),
    ("Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU (while checking "
     "arguments for addmm)",
     ("cpu", "cuda"),
     "https://github.com/IDSIA/hhmarl_2D/issues/12"),
    ("Tensor for 'out' is on CPU, Tensor for argument #1 'self' is on CPU, but expected them to be "
     "on GPU (while checking arguments for addmm)",
     ("cpu", "cuda"),
     "https://github.com/something678/TodKat/issues/4"),
    ("All input tensors must be on the same device. Received cuda:0 and cpu",
     ("cuda:0", "cpu"),
     "https://github.com/MengHao666/Minimal-Hand-pytorch/issues/6"),
    ("torch.cat(): all input tensors must be on the same device. Received cpu and mps:0",
     ("cpu", "mps:0"),
     "pytorch v2.4 aten/src/ATen/native/mps/operations/Shape.mm:275"),
    ("torch.cat(): all input tensors and out must be on the same device, but inputs are on cuda:0 "
     "and out is on cpu",
     ("cuda:0", "cpu"),
     "pytorch 1.10.0a0 aten/src/ATen/native/cuda/Shape.cu:490"),
    ("arguments are located on different GPUs at "
     "/pytorch/aten/src/THC/generic/THCTensorMathBlas.cu:236",
     (),
     "https://github.com/DeepInsight-PCALab/CompactBilinearPooling-Pytorch/issues/6"),
    ("sparse_mask: arguments are located on different devices; self is on device 0, mask is on "
     "device 1, out is on device 0",
     ("cuda:0", "cuda:1"),
     "pytorch v1.3 aten/src/ATen/native/sparse/cuda/SparseCUDATensor.cpp:19"),
    # ---- RNN, LSTM and GRU ----
    ("Input and parameter tensors are not at the same device, found input tensor at cpu and "
     "parameter tensor at meta",
     ("cpu", "meta"),
     "pytorch v2.4 aten/src/ATen/native/RNN.h:39 (verified: nn.LSTM(3, 4).to('meta') on a cpu input)"),
    ("Input and hidden tensors are not at the same device, found input tensor at cpu and hidden "
     "tensor at meta",
     ("cpu", "meta"),
     "pytorch v2.4 aten/src/ATen/native/RNN.h:39 (verified: nn.GRU with a meta hidden state)"),
    ("Input and hidden tensors are not at the same device, found input tensor at cuda:0 and hidden "
     "tensor at cpu",
     ("cuda:0", "cpu"),
     "https://github.com/pytorch/pytorch/issues/52186"),
    # ---- scaled_dot_product_attention ----
    ("Expected query, key, and value to have the same device type, but got query.device: cpu "
     "key.device: meta and value.device: cpu instead.",
     ("cpu", "meta"),
     "pytorch v2.4 aten/src/ATen/native/transformers/attention.cpp:493 "
     "(verified: F.scaled_dot_product_attention with a meta key)"),
    ("Expected query, key, and value to have the same device type, but got query.device: cuda:0, "
     "key.device: cpu, and value.device: cpu instead.",
     ("cuda:0", "cpu"),
     "pytorch v2.13 torch/nn/attention/_utils.py:53 (raised as ValueError)"),
    # ---- indexing ----
    ("index_add(): self, index and source expected to be in the same device, but got (self) cpu, "
     "(index) meta, and (source) cpu",
     ("cpu", "meta"),
     "pytorch v2.13 torch/_decomp/decompositions.py:3352 (verified: index_add_ with a meta index)"),
    ("index_copy_(): self, index and source expected to be in the same device, but got (self) "
     "cuda:0, (index) cpu, and (source) cuda:0",
     ("cuda:0", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/TensorAdvancedIndexing.cpp:295"),
    ("put_(): self, index and source expected to be in the same device, but got self.device = "
     "cuda:0, index.device = cpu, and source.device = cuda:0",
     ("cuda:0", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/TensorAdvancedIndexing.cpp:671"),
    ("indices should be either on cpu or on the same device as the indexed tensor (cuda:0)",
     ("cuda:0",),
     "pytorch v2.4 aten/src/ATen/native/TensorAdvancedIndexing.cpp:431 "
     "(cpu is an allowed place there, not an operand's device)"),
    ("expected self and mask to be on the same device, but got mask on cpu and self on cuda:0",
     ("cpu", "cuda:0"),
     "pytorch v2.4 aten/src/ATen/native/cuda/Indexing.cu:2163"),
    ("masked_fill_: Expected inputs to be on same device",
     (),
     "pytorch v2.4 aten/src/ATen/native/cuda/Indexing.cu:2199"),
    # ---- convolution: the input's and the weight's or bias's type strings; MPS ----
    ("Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same or "
     "input should be a MKLDNN tensor and weight is a dense tensor",
     ("cuda", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/Convolution.cpp:805"),
    ("Input type (torch.cuda.FloatTensor) and bias type (torch.FloatTensor) should be the same",
     ("cuda", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/Convolution.cpp:786"),
    ("Input type (torch.FloatTensor) and weight type (torch.cuda.HalfTensor) should be the same",
     ("cpu", "cuda"),
     "pytorch v1.0 aten/src/ATen/native/Convolution.cpp:341"),
    ("Input type (MPSFloatType) and weight type (torch.FloatTensor) should be the same",
     ("mps", "cpu"),
     "https://github.com/pytorch/ignite/issues/2977"),
    ("Input type (MPSBFloat16Type) and weight type (CPUBFloat16Type) should be the same",
     ("mps", "cpu"),
     "https://github.com/loscrossos/core_framepackstudio/issues/4"),
    ("slow_conv2d_forward_mps: input(device='mps:0') and weight(device=cpu')  must be on the same "
     "device",
     ("mps:0", "cpu"),
     "pytorch v2.4 aten/src/ATen/mps/MPSFallback.mm:65"),
    ("Tensor for argument weight is on cpu but expected on mps",
     ("cpu", "mps"),
     "pytorch v2.4 aten/src/ATen/native/mps/operations/Linear.mm:21"),
    ("Placeholder storage has not been allocated on MPS device!",
     (),
     "pytorch v2.4 aten/src/ATen/native/mps/OperationUtils.mm:368"),
    # ---- DataParallel ----
    ("module must have its parameters and buffers on device cuda:0 (device_ids[0]) but found one of "
     "them on device: cpu",
     ("cuda:0", "cpu"),
     "pytorch v2.4 torch/nn/parallel/data_parallel.py:172"),
    # ---- other kernels' own checks ----
    ("grid_sampler(): expected input and grid to be on same device, but input is on cuda:0 and grid "
     "is on cpu",
     ("cuda:0", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/GridSamplerUtils.h:39"),
    ("weight_norm: expected v_in and g_in to be on the same device, but v_in is on cuda:0 and g_in "
     "is on cpu",
     ("cuda:0", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/WeightNorm.cpp:90"),
    ("Expected b and A to be on the same device, but found b on cpu and A on cuda:0 instead.",
     ("cpu", "cuda:0"),
     "pytorch v2.4 aten/src/ATen/native/LinearAlgebraUtils.h:279"),
    ("torch.linalg.householder_product: Expected tau and input tensors to be on the same device, but "
     "got tau on meta and input on cpu",
     ("meta", "cpu"),
     "pytorch v2.13 torch/_meta_registrations.py:1197 (verified: a meta tau)"),
    ("multi_dot(): all tensors must be on the same device but tensor 0 is on cpu and tensor 1 on meta",
     ("cpu", "meta"),
     "pytorch v2.4 aten/src/ATen/native/LinearAlgebra.cpp:994 (verified: torch.linalg.multi_dot)"),
    ("tensordot: Expected the output and input tensors to be on the same device, but got the output "
     "tensor on meta, input tensor a on cpu, and input tensor b on cpu",
     ("meta", "cpu"),
     "pytorch 1.10.0a0 aten/src/ATen/native/Linear.cpp:697 (verified: torch.tensordot, meta out=)"),
    ("torch.gradient expected each tensor to be on the same device, but got devices cpu and meta!",
     ("cpu", "meta"),
     "pytorch v2.4 aten/src/ATen/native/ReduceOps.cpp:1032 (verified: a meta spacing)"),
    ("stft input and window must be on the same device but got self on cpu and window on meta",
     ("cpu", "meta"),
     "pytorch v2.13 torch/_refs/__init__.py:3584 (verified: torch.stft with a meta window)"),
    ("X1 and X2 must have the same device type. X1: cuda X2: cpu",
     ("cuda", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/Distance.cpp:87"),
    ("torch.searchsorted(): boundaries and input value tensors should have same device type, but got "
     "boundaries tensor device type cuda:0 and input value tensor device type cpu",
     ("cuda:0", "cpu"),
     "pytorch v2.4 aten/src/ATen/native/BucketizationUtils.h:122"),
    ("Expected condition, x and y to be on the same device, but condition is on cpu and x and y are "
     "on cuda:0 and cuda:0 respectively",
     ("cpu", "cuda:0"),
     "pytorch 1.7.0a0 aten/src/ATen/native/TensorCompare.cpp:135"),
    ("Expected a 'cuda' device type for generator but found 'cpu'",
     ("cuda", "cpu"),
     "https://github.com/hcnoh/knowledge-tracing-collection-pytorch/issues/8"),
    ("meshgrid expects all tensors to have the same device",
     (),
     "pytorch v2.4 aten/src/ATen/native/TensorShape.cpp:3644 (verified: torch.meshgrid, cpu and meta)"),
    ("quantile() q tensor must be on the same device as the input tensor",
     (),
     "pytorch v2.4 aten/src/ATen/native/Sorting.cpp:218 (verified: a meta q)"),
    ("Tensors of the same index must be on the same device and the same dtype except `step` tensors "
     "that can be CPU and float32/64 notwithstanding",
     (),
     "pytorch v2.4 aten/src/ATen/native/ForeachUtils.h:334"),
    # ---- negative rows: dtype, shape and other errors that look alike ----
    ("Input type (torch.FloatTensor) and weight type (torch.DoubleTensor) should be the same",
     None,
     "pytorch v2.4 aten/src/ATen/native/Convolution.cpp:783"),
    ("Input type (float) and bias type (double) should be the same",
     None,
     "pytorch v2.13 (verified: F.conv2d with a float32 input and weight and a float64 bias)"),
    ("expected scalar type Float but found Double",
     None,
     "pytorch v2.13 (verified: F.conv2d with a float32 input and a float64 weight)"),
    ("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)",
     None,
     "pytorch v2.13 (verified: torch.ones(2, 3) @ torch.ones(4, 5))"),
    ("Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: "
     "double and value.dtype: float instead.",
     None,
     "pytorch v2.4 aten/src/ATen/native/transformers/attention.cpp:489 (verified: a float64 key)"),
    ("Expected object of type torch.FloatTensor but found type torch.DoubleTensor for argument #2 "
     "'mat2'",
     None,
     "pytorch v0.4 aten/src/ATen/Utils.h:18"),
    ("expected device cpu and dtype Byte but got device cpu and dtype Bool",
     None,
     "pytorch v1.2 aten/src/ATen/native/TensorIterator.cpp:170"),
    ("expected backend CPU and dtype Float but got backend CPU and dtype Long",
     None,
     "pytorch v1.1 aten/src/ATen/native/TensorIterator.cpp:129"),
    ("Expected tensor for argument #1 'input' to have the same type as tensor for argument #2 "
     "'weight'; but type Variable[CUDAHalfType] does not equal Variable[CUDAFloatType] (while "
     "checking arguments for cudnn_convolution)",
     None,
     "pytorch v1.0 aten/src/ATen/TensorUtils.cpp:138"),
    ("Input and parameter tensors are not the same dtype, found input tensor with Double and "
     "parameter tensor with Float",
     None,
     "pytorch v2.4 aten/src/ATen/native/RNN.h:44"),
    ("Expected b and A to have the same dtype, but found b of type Float and A of type Double instead.",
     None,
     "pytorch v2.4 aten/src/ATen/native/LinearAlgebraUtils.h:283"),
    ("multi_dot(): all tensors must have be the same dtype but tensor 0 is Float and tensor 1 is "
     "Double",
     None,
     "pytorch 1.10.0a0 aten/src/ATen/native/LinearAlgebra.cpp:610"),
    ("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. If "
     "you are running on a CPU-only machine, please use torch.load with "
     "map_location=torch.device('cpu') to map your storages to the CPU.",
     None,
     "pytorch v2.13 torch/serialization.py:635"),
]
