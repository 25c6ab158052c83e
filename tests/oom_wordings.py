"""Every wording of PyTorch's out-of-memory error that we know of, and the look-alikes that are not one, as
test data (the way tests/device_error_wordings.py lists the device-mismatch error).

``explain.oomerror.oom_facts`` recognises an out-of-memory error from its text and reads the figures it
prints.
PyTorch has written it many ways: CUDA's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``; before
it THC's ``cuda runtime error (2)``), the same file hipified for ROCm (``HIP out of memory``, with
``PYTORCH_HIP_ALLOC_CONF`` or the CUDA spelling of the variable, depending on the release), the
``cudaMallocAsync`` backend (``c10/cuda/CUDAMallocAsyncAllocator.cpp``), CUDA runtime and driver errors
(``C10_CUDA_CHECK``: ``CUDA error: out of memory``; ``C10_CUDA_DRIVER_CHECK``), the MPS heap allocator
(``aten/src/ATen/mps/MPSAllocator.mm``), the XPU caching allocator (``c10/xpu/XPUCachingAllocator.cpp``,
and Intel's extension before it), the CPU allocator (``c10/core/impl/alloc_cpu.cpp``, formerly
``c10/core/CPUAllocator.cpp``; TH's ``THGeneral.cpp`` before that).

Each row of ``WORDINGS`` is ``(message, expected, source)``:

* ``message``: the message as torch prints it: the format string of the source with values filled in, or
  a message copied from a user's traceback.
* ``expected``: ``(device, asked)`` that ``oom_facts(RuntimeError(message))`` must read: the device as
  torch names it ('cuda:0', 'cpu', 'mps', 'xpu:0'; 'cuda' where the message names no index; ROCm GPUs are
  'cuda' to torch) and the bytes asked (None where the message does not say). ``None`` for a look-alike
  that must not be taken for an out-of-memory error.
* ``source``: where the wording comes from: "pytorch PATH" is the source file at pytorch/pytorch's main
  branch as stored in the reference index (read for the format string), "pytorch vX.Y" a release that
  printed it, and a URL an issue where a user posted the message from a real traceback. "(verified)" marks
  a row raised for real here, with torch 2.13 on CPU.

The look-alikes, and why each is left out:

* ``CUDA error: out of resources`` (cudaErrorLaunchOutOfResources) and ``too many resources requested
  for launch``: a kernel asked for more registers or threads per block than the GPU has; no amount of
  freed memory changes that.
* ``CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)``: cuBLAS could not create its handle.
  It often follows a full GPU, but it is as often the first sign of an earlier asynchronous failure (an
  embedding index out of range reported this way: huggingface/transformers#12935, pytorch/pytorch#24838);
  torch's message gives no size and no device figures, so an explanation naming memory holders would be
  a guess. CUDA_LAUNCH_BLOCKING=1 first tells which it is.
* triton's ``out of resource: shared memory``: per-block shared memory of one kernel, not device memory.
* shape, dtype and device errors, ``an illegal memory access was encountered`` (a bad pointer), MPS'
  ``Placeholder storage has not been allocated`` (a device mismatch), a DataLoader worker killed by a
  signal (in a worker process, whose holders this kernel cannot see).
"""

from __future__ import annotations

GiB = 1024 ** 3
MiB = 1024 ** 2

WORDINGS: list[tuple[str, tuple | None, str]] = [
    # ---- CUDA's caching allocator, 2.1 and later: "GPU N has a total capacity of ..." ----
    ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 0 "
     "bytes "
     "is free. Process 4242 has 1.50 GiB memory in use. Including non-PyTorch memory, this process has "
     "6.48 GiB memory in use. 7.00 GiB allowed; Of the allocated memory 5.90 GiB is allocated by PyTorch, "
     "with "
     "64.00 MiB allocated in private pools (e.g., CUDA Graphs), and 320.00 MiB is reserved by PyTorch but "
     "unallocated. If reserved but unallocated memory is large try setting "
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
     "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-"
     "cuda-alloc-conf)",
     ("cuda:0", 20 * MiB),
     "pytorch c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc: proc_info, allowed_info, "
     "private_pool_msg, the docs.pytorch.org link)"),
    ("CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which "
     "11.06 "
     "MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated "
     "memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If "
     "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
     "to "
     "avoid fragmentation.  See documentation for Memory Management  "
     "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     ("cuda:0", 22 * MiB),
     "https://github.com/pytorch/pytorch/issues/16417 (a 2024 comment: the 2.2-2.7 form)"),
    ("CUDA out of memory. Tried to allocate 158.00 MiB. GPU 0 has a total capacity of 23.69 GiB of which "
     "115.69 MiB is free. Process 21422 has 23.57 GiB memory in use. Of the allocated memory 22.14 GiB is "
     "allocated by PyTorch, and 910.35 MiB is reserved by PyTorch but unallocated. If reserved but "
     "unallocated "
     "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
     "See documentation for Memory Management  "
     "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     ("cuda:0", 158 * MiB),
     "https://github.com/OpenHelix-Team/cobra/issues/24 (another process listed, in a container)"),
    ("CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacty of 79.15 GiB of which 38.09 "
     "GiB is free. Including non-PyTorch memory, this process has 41.06 GiB memory in use. Of the allocated "
     "memory 39.10 GiB is allocated by PyTorch, and 427.46 MiB is reserved by PyTorch but unallocated. If "
     "reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See "
     "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
     ("cuda:0", 64 * MiB),
     "https://github.com/pytorch/pytorch/issues/111363 (2.1: the 'capacty' typo and the max_split_size_mb "
     "hint)"),
    ("CUDA out of memory. Tried to allocate 496.00 MiB. GPU 0 has a total capacty of 14.75 GiB of which "
     "235.06 "
     "MiB is free. Process 20398 has 14.52 GiB memory in use. Of the allocated memory 14.06 GiB is allocated "
     "by "
     "PyTorch, and 330.42 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
     "large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
     "and "
     "PYTORCH_CUDA_ALLOC_CONF",
     ("cuda:0", 496 * MiB),
     "https://github.com/FoundationVision/GenerateU/issues/10 (2.1, a process listed)"),
    ("CUDA out of memory. Tried to allocate 1.70 GiB. GPU 3 has a total capacty of 6.00 GiB of which 0 bytes "
     "is "
     "free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by PyTorch "
     "but "
     "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
     "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
     ("cuda:3", int(1.70 * GiB)),
     "https://github.com/carolchenyx/MGFN./issues/35 (2.1, no process line; GPU index changed to 3)"),
    # ---- the same allocator, 0.4 to 2.0: "(GPU N; ... total capacity; ...)" ----
    ("CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 MiB already "
     "allocated; 9.28 GiB free; 4.68 MiB cached)",
     ("cuda:0", int(12.5 * MiB)),
     "https://github.com/pytorch/pytorch/issues/16417 (1.0: 'cached')"),
    ("CUDA out of memory. Tried to allocate 26.00 MiB (GPU 0; 1024.00 MiB total capacity; 435.61 MiB already "
     "allocated; 24.17 MiB free; 26.39 MiB cached)",
     ("cuda:0", 26 * MiB),
     "https://github.com/pytorch/examples/issues/621 (1.2)"),
    ("CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already "
     "allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)",
     ("cuda:0", int(2.26 * GiB)),
     "https://github.com/pytorch/pytorch/issues/59778 (1.5-1.9: 'reserved in total by PyTorch')"),
    ("CUDA out of memory. Tried to allocate 10.84 GiB (GPU 1; 23.65 GiB total capacity; 1.06 GiB already "
     "allocated; 10.26 GiB free; 12.53 GiB reserved in total by PyTorch)",
     ("cuda:1", int(10.84 * GiB)),
     "https://github.com/pytorch/pytorch/issues/35901 (GPU index changed to 1)"),
    ("CUDA out of memory. Tried to allocate 1.39 GiB (GPU 0; 6.00 GiB total capacity; 4.04 GiB already "
     "allocated; 478.00 MiB free; 4.15 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
     "memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
     "and "
     "PYTORCH_CUDA_ALLOC_CONF",
     ("cuda:0", int(1.39 * GiB)),
     "https://github.com/CompVis/taming-transformers/issues/194 (1.10-2.0: the max_split_size_mb hint)"),
    ("CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 11.77 GiB total capacity; 4.74 GiB already "
     "allocated; 6.02 GiB free; 4.77 GiB allowed; 4.74 GiB reserved in total by PyTorch) If reserved memory "
     "is "
     ">> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for "
     "Memory "
     "Management and PYTORCH_CUDA_ALLOC_CONF",
     ("cuda:0", 2 * MiB),
     "https://github.com/pytorch/pytorch/issues/111729 ('4.77 GiB allowed': set_per_process_memory_fraction, "
     "1.8-2.0; figures other than those quoted there filled in)"),
    # ---- ROCm: the same allocator hipified ----
    ("HIP out of memory. Tried to allocate 124.00 MiB. GPU 0 has a total capacity of 19.94 GiB of which "
     "554.47 "
     "MiB is free. Of the allocated memory 15.87 GiB is allocated by PyTorch, and 165.29 MiB is reserved by "
     "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
     "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
     "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     ("cuda:0", 124 * MiB),
     "https://github.com/huggingface/autotrain-advanced/issues/737 (PYTORCH_HIP_ALLOC_CONF)"),
    ("HIP out of memory. Tried to allocate 2.00 MiB. GPU 7 has a total capacity of 287.98 GiB of which "
     "203.49 "
     "GiB is free. Of the allocated memory 68.63 GiB is allocated by PyTorch, and 14.93 GiB is reserved by "
     "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
     "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     ("cuda:7", 2 * MiB),
     "https://github.com/pytorch/pytorch/issues/175431 (the CUDA spelling of the variable)"),
    ("HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 255.98 GiB of which "
     "244.65 "
     "GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, with 17.00 "
     "MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by PyTorch but "
     "unallocated. "
     "If reserved but unallocated memory is large try setting "
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
     "to avoid fragmentation.  See documentation for Memory Management  "
     "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     ("cuda:0", 2 * MiB),
     "https://github.com/ROCm/TheRock/issues/2118 (allowed and private pools)"),
    # ---- the cudaMallocAsync backend ----
    ("Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 9.43 "
     "GiB\n"
     "Requested               : 640.00 MiB\nDevice limit            : 11.59 GiB\nFree (according to CUDA): "
     "7.12 MiB\nPyTorch limit (set by user-supplied memory fraction)\n                        : "
     "17179869184.00 "
     "GiB",
     ("cuda:0", 640 * MiB),
     "pytorch c10/cuda/CUDAMallocAsyncAllocator.cpp (mallocAsync, PYTORCH_CUDA_ALLOC_CONF=backend:"
     "cudaMallocAsync); https://github.com/Comfy-Org/ComfyUI/issues/2021"),
    # ---- CUDA runtime and driver errors (allocations outside the caching allocator) ----
    ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, "
     "so "
     "the stacktrace below might be incorrect.\nFor debugging consider passing "
     "CUDA_LAUNCH_BLOCKING=1\nCompile "
     "with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n",
     ("cuda", None),
     "https://github.com/kijai/ComfyUI-WanVideoWrapper/issues/565 (C10_CUDA_CHECK; torch.AcceleratorError "
     "since 2.8, a RuntimeError)"),
    ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API "
     "call,so "
     "the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
     ("cuda", None),
     "https://github.com/taohan10200/IIM/issues/28 (1.10-1.13)"),
    ("CUDA error: out of memory", ("cuda", None), "https://github.com/danieltan07/spatialaffinitynetwork/issues/7"),
    ("CUDA driver error: out of memory", ("cuda", None),
     "pytorch c10/cuda/driver_api.h (C10_CUDA_DRIVER_CHECK: 'CUDA driver error: ' and the driver's string, "
     "here CUDA_ERROR_OUT_OF_MEMORY's, e.g. mapping an expandable segment)"),
    ("HIP error: out of memory", ("cuda", None), "C10_HIP_CHECK: the hipified C10_CUDA_CHECK on ROCm"),
    ("cuda runtime error (2) : out of memory at /pytorch/torch/lib/THC/generic/THCStorage.cu:58",
     ("cuda", None),
     "https://github.com/jiesutd/NCRFpp/issues/121 (0.3-0.4: THC)"),
    ("cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCTensorRandom.cu:25",
     ("cuda", None),
     "https://github.com/rowanz/neural-motifs/issues/58 (0.4-1.0: ATen's THC)"),
    ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, unhandled cuda error, NCCL "
     "version 2.14.3\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out "
     "of memory'",
     ("cuda", None),
     "NCCL's own cudaMalloc failing inside ProcessGroupNCCL (the 'Cuda failure' line is NCCL's)"),
    # ---- Triton's launcher: its own CUDA driver calls (loading a kernel's module, a launch) ----
    ("Triton Error [CUDA]: out of memory", ("cuda", None),
     "triton-lang/triton third_party/nvidia/backend/driver.c (gpuAssert: 'Triton Error [CUDA]: ' and "
     "cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY), which is 'out of memory'; raised as a RuntimeError by a "
     "torch.compile'd or hand-written Triton kernel)"),
    ("Triton Error [HIP]:  Code: 2, Messsage: out of memory", ("cuda", None),
     "triton-lang/triton third_party/amd/backend/driver.py (gpuAssert: '%s Code: %d, Messsage: %s' of the "
     "prefix 'Triton Error [HIP]: ', hipErrorOutOfMemory = 2 and hipGetErrorString's 'out of memory')"),
    # ---- torch.OutOfMemoryError whatever it says (a library raising torch's type) ----
    # (checked in the tests by type: tests/test_placement_oom.py)
    # ---- MPS ----
    ("MPS backend out of memory (MPS allocated: 17.36 GB, other allocations: 613.56 MB, max allowed: 18.13 "
     "GB). "
     "Tried to allocate 192.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper "
     "limit for memory allocations (may cause system failure).",
     ("mps", 192 * MiB),
     "pytorch aten/src/ATen/mps/MPSAllocator.mm (alloc_buffer_block, high watermark set); "
     "https://github.com/pytorch/pytorch/issues/105839"),
    ("MPS backend out of memory (MPS allocated: 9.57 GiB, other allocations: 17.35 GiB, max allowed: 27.20 "
     "GiB). Tried to allocate 292.50 MiB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to "
     "disable "
     "upper limit for memory allocations (may cause system failure).",
     ("mps", int(292.5 * MiB)),
     "https://github.com/Comfy-Org/ComfyUI/issues/7440 (2.6+: binary units spelled GiB)"),
    ("MPS backend out of memory (MPS allocated: 72.40 GB, other allocations: 15.71 GB). Tried to allocate "
     "256 "
     "bytes on shared pool.",
     ("mps", 256),
     "pytorch aten/src/ATen/mps/MPSAllocator.mm (the branch without a high watermark: "
     "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0; figures from https://github.com/BoBo0037/bobo-fun/issues/8)"),
    ("Invalid buffer size: 19.45 GB",
     ("mps", int(19.45 * GiB)),
     "https://github.com/pytorch/pytorch/issues/141909 (MPSAllocator: one buffer larger than the device's "
     "maxBufferLength)"),
    # ---- XPU ----
    ("XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a total capacity of 5.65 GiB of which 5.65 "
     "GiB "
     "is free. Of the allocated memory 195.50 KiB is allocated by PyTorch, and 1.81 MiB is reserved by "
     "PyTorch "
     "but unallocated. Please use `empty_cache` to release all unoccupied cached memory.",
     ("xpu:0", int(4.66 * GiB)),
     "pytorch c10/xpu/XPUCachingAllocator.cpp; https://github.com/intel/torch-xpu-ops/issues/3011 (2.9+)"),
    ("XPU out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 15.11 GiB. Of the "
     "allocated "
     "memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. Please use "
     "`empty_cache` to release all unoccupied cached memory.",
     ("xpu:0", 8 * GiB),
     "https://github.com/intel/intel-extension-for-pytorch/issues/846 (2.5-2.8: no free figure)"),
    ("XPU out of memory. Tried to allocate 1.00 GiB (GPU 0; 15.56 GiB total capacity; 990.00 MiB already "
     "allocated; 990.00 MiB reserved in total by PyTorch)",
     ("xpu:0", GiB),
     "https://github.com/intel/intel-extension-for-pytorch/issues/629 (Intel's extension, before upstream "
     "XPU)"),
    # ---- the CPU allocator ----
    ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
     "allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)",
     ("cpu", 2 ** 50),
     "pytorch c10/core/impl/alloc_cpu.cpp (posix_memalign); torch.empty(2**50, dtype=torch.uint8) "
     "(verified)"),
    ("[enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate memory: you tried to "
     "allocate "
     "1178729664 bytes. Error code 12 (Cannot allocate memory)",
     ("cpu", 1178729664),
     "https://github.com/nguyenvanhoang7398/FANG/issues/1 (1.2-1.9: c10/core/CPUAllocator.cpp)"),
    ("[enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough memory: "
     "you "
     "tried to allocate 26214400 bytes.",
     ("cpu", 26214400),
     "https://github.com/lllyasviel/Fooocus/issues/237 (Windows: _aligned_malloc)"),
    ("[enforce fail at ..\\c10\\core\\CPUAllocator.cpp:72] data. DefaultCPUAllocator: not enough memory: you "
     "tried to allocate 113246208 bytes. Buy new RAM!",
     ("cpu", 113246208),
     "https://github.com/varunagrawal/tiny-faces-pytorch/issues/12 (Windows, 1.x)"),
    ("[enforce fail at CPUAllocator.cpp:56] posix_memalign(&data, gAlignment, nbytes) == 0. 12 vs 0",
     ("cpu", None),
     "https://github.com/pytorch/pytorch/pull/20618 ('Before': 1.1)"),
    ("$ Torch: not enough memory: you tried to allocate 72GB. Buy new RAM! at "
     "/pytorch/torch/lib/TH/THGeneral.c:270",
     ("cpu", 72 * GiB),
     "https://github.com/pytorch/pytorch/issues/5434 (0.3: TH)"),
    ("$ Torch: not enough memory: you tried to allocate 3GB. Buy new RAM! at "
     "..\\aten\\src\\TH\\THGeneral.cpp:201",
     ("cpu", 3 * GiB),
     "https://github.com/CETC-TFAI/MaCA/issues/20 (1.0-1.4: ATen's TH)"),
    # ---- look-alikes: must not be taken for an out-of-memory error ----
    ("CUDA error: out of resources\nCUDA kernel errors might be asynchronously reported at some other API "
     "call, "
     "so the stacktrace below might be incorrect.", None,
     "cudaErrorLaunchOutOfResources: a launch's registers / threads per block"),
    ("CUDA error: too many resources requested for launch\nCUDA kernel errors might be asynchronously "
     "reported at "
     "some other API call, so the stacktrace below might be incorrect.", None,
     "https://github.com/Wan-Video/Wan2.2/issues/118"),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", None,
     "https://github.com/huggingface/transformers/issues/12935 (an embedding index out of range)"),
    ("cublas runtime error : resource allocation failed at "
     "/opt/conda/conda-bld/pytorch_1556653099582/work/aten/"
     "src/THC/THCGeneral.cpp:228", None,
     "https://github.com/pytorch/pytorch/issues/24838 (1.1: the same, from THC)"),
    ("out of resource: shared memory, Required: 98304, Hardware limit: 65536. Reducing block sizes or "
     "`num_stages` may help.", None, "triton's OutOfResources (a kernel's shared memory per block)"),
    ("CUDA error: an illegal memory access was encountered", None, "a bad pointer, not a full device"),
    ("Triton Error [CUDA]: an illegal memory access was encountered", None,
     "Triton's launcher reporting a bad pointer (the same driver.c gpuAssert), not a full device"),
    ("mat1 and mat2 shapes cannot be multiplied (64x1024 and 512x10)", None, "a shape error (verified)"),
    ("The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0", None,
     "a broadcasting error (verified)"),
    ("expected scalar type Float but found Half", None, "a dtype error"),
    ("Trying to create tensor with negative dimension -1: [-1]", None, "a bad shape (verified)"),
    ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!", None,
     "a device mismatch (%whereis' diagnosis)"),
    ("Placeholder storage has not been allocated on MPS device!", None, "a device mismatch on MPS"),
    ("DataLoader worker (pid(s) 4242) exited unexpectedly", None,
     "a worker killed (often by the host's OOM killer) in another process"),
    ("CUDA error: device-side assert triggered", None, "a kernel's assertion"),
]
