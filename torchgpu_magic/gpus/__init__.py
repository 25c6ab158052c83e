"""``%gpuinfo``'s core: which GPUs there are and whether torch can use them.

- ``nvml``: the only importer of pynvml (lazy init under a lock, NA for what a GPU cannot say);
- ``amdsmi``: the only importer of AMD SMI's ``amdsmi`` (ROCm's GPUs; lazily imported, never required);
- ``library``: what those two share: the library brought up on first use, once, under a lock;
- ``apple``: the Mac itself from ``sysctl`` (chip, unified memory, macOS, Rosetta) for Apple silicon;
- ``snapshots``: what NVML says about a GPU, as plain records (``nvml`` fills them), and its errors as
  short codes with a hint a person can act on;
- ``processes``: a GPU's per-process memory (this process's share, the others'), and whether NVML's
  process list names this PID namespace's processes at all (a container without ``--pid=host``);
- ``gpumap``: torch's view of its GPUs, matched to NVML's by UUID under ``CUDA_VISIBLE_DEVICES``;
- ``machine``: what the OS says without NVIDIA's software (NVIDIA GPUs on the PCI bus, the kernel driver,
  WSL's files, the distribution);
- ``hosting``: where the kernel runs (a hosted notebook service, a container, a VM);
- ``causes``: why torch cannot use a GPU here, the real cause first, with a fix that applies there;
- ``inventory``: the report;
- ``accelerated``: the report where NVML does not see the GPU (MPS, ROCm with AMD SMI, XPU, PrivateUse1),
  and the choice between the two reports;
- ``backendcauses``: why torch cannot use a Mac's, an AMD or an Intel GPU (Rosetta, a build without the
  backend, HIP's visibility variables, an unsupported gfx target and HSA_OVERRIDE_GFX_VERSION...).

Importing this package imports none of them: callers name the module they need
(``from torchgpu_magic.gpus import nvml``), so that ``%gpumem`` does not pay for the report's code.
"""
