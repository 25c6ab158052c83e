"""Why torch cannot use the GPU of a Mac, an AMD machine or an Intel GPU: each cause in a line, with the
fix a person can act on (the NVIDIA causes are :mod:`torchgpu_magic.gpus.inventory`'s).

Pure functions of what was read (torch's build and view, the Mac's ``sysctl`` facts, AMD SMI's GPUs,
how many GPUs NVML sees, the environment), so each cause is tested on its own. Standard library only.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

from .causes import Diagnosis, version_tuple

MPS_MACOS = (12, 3)  # the first macOS with the MPS backend (torch's "MPS backend" notes)
ROCM_WHEELS = "pip install torch --index-url https://download.pytorch.org/whl/rocm6.4"
HIDING = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def mac_causes(torch_version: str, built: bool, available: bool, mac: Any) -> list:
    """Why torch cannot use the Mac's GPU: an x86_64 Python under Rosetta, a torch without MPS, a macOS
    older than MPS. ``mac`` is :class:`~.apple.MacFacts` (or None where sysctl could not say)."""
    if available:
        return []
    causes = []
    if mac is not None and mac.translated:
        causes.append(Diagnosis(
            "rosetta", "this Python is an x86_64 build running under Rosetta on Apple silicon: no x86_64 "
                       "torch can use the GPU (MPS needs an arm64 process)",
            "install an arm64 Python (python.org's universal2 installer, or Miniforge for osx-arm64) and "
            "torch in it; `python -c 'import platform; print(platform.machine())'` must say arm64"))
    if not built:
        causes.append(Diagnosis(
            "no_mps_build", f"torch {torch_version} was built without MPS (torch.backends.mps.is_built() is "
                            "False)", "pip install torch: the macOS arm64 wheels include MPS"))
    macos = version_tuple(mac.macos if mac is not None else None)
    if macos is not None and macos < MPS_MACOS:
        causes.append(Diagnosis(
            "macos_too_old", f"macOS {mac.macos} is older than MPS needs ({'.'.join(map(str, MPS_MACOS))} or "
                             "later)", "update macOS"))
    if not causes:
        causes.append(Diagnosis(
            "unknown", "torch.backends.mps.is_available() is False on this Mac",
            "run `python -c 'import torch; torch.zeros(1, device=\"mps\")'` to see torch's own error"))
    return causes


def rocm_causes(view: Any, amd: Sequence[str], amd_problem: Optional[str], nvidia_gpus: int,
                env: Mapping[str, Optional[str]], kfd: Optional[str] = None, unbound: Sequence[str] = ()
                ) -> list:
    """Why torch cannot use an AMD GPU, or a ROCm torch any GPU. ``view`` says torch's build and what
    it sees (``version``, ``cuda``, ``hip``, ``is_available``); ``amd`` names the AMD GPUs here (AMD SMI's,
    else the PCI bus's), ``amd_problem`` why AMD SMI cannot list them; ``nvidia_gpus`` how many NVIDIA GPUs
    NVML or the PCI bus see; ``kfd`` what is wrong with ``/dev/kfd``; ``unbound`` the AMD GPUs on the PCI
    bus no kernel driver is bound to."""
    if view.is_available:
        return []
    names = ", ".join(sorted(set(amd)))
    causes = []
    if view.hip and nvidia_gpus and not amd:
        causes.append(Diagnosis(
            "rocm_build_on_nvidia", f"torch {view.version} is a ROCm build (HIP {view.hip}), but this "
                                    f"machine's GPUs are NVIDIA's ({nvidia_gpus} seen by NVML)",
            "install a CUDA build of torch (https://pytorch.org/get-started/locally/)"))
    if not view.hip and amd:
        build = f"a CUDA build (CUDA {view.cuda})" if view.cuda else "a CPU-only build"
        causes.append(Diagnosis(
            "cuda_build_on_amd" if view.cuda else "cpu_only_build",
            f"torch {view.version} is {build}; this machine's GPUs are AMD's ({names}), which a ROCm "
            "build uses",
            f"install a ROCm build of torch matching the driver's ROCm: {ROCM_WHEELS}"))
    if unbound:
        causes.append(Diagnosis(
            "no_amdgpu_driver", f"no kernel driver is bound to {', '.join(unbound)} (amdgpu is not loaded)",
            "install AMD's GPU driver (amdgpu-dkms, with ROCm: https://rocm.docs.amd.com), then reboot"))
    if view.hip and not amd and not nvidia_gpus:
        if kfd:
            causes.append(Diagnosis("no_kfd_access", kfd,
                                    "add the user to the 'render' and 'video' groups (`sudo usermod -aG "
                                    "render,video $USER`, then log in again); in a container, pass "
                                    "--device=/dev/kfd --device=/dev/dri"))
        causes.append(Diagnosis(
            "no_amd_gpu", "AMD SMI lists no AMD GPU" + (f" ({amd_problem})" if amd_problem else ""),
            "is the amdgpu driver loaded and a GPU attached? (`amd-smi list`, `rocminfo`)"))
    hidden = [name for name in HIDING if env.get(name) is not None and (
        name != "CUDA_VISIBLE_DEVICES" or env.get("HIP_VISIBLE_DEVICES") is None)]
    if view.hip and amd and hidden:
        shown = ", ".join(f"{name}={env[name]!r}" for name in hidden)
        causes.append(Diagnosis(
            "hidden_by_visible_devices", f"{shown} hides every GPU from HIP ({len(amd)} present: {names})",
            f"unset {' and '.join(hidden)} or list the GPUs to use (e.g. '0'), then restart the kernel: the "
            "HIP runtime reads them once, when it starts"))
    if not causes:
        causes.append(Diagnosis(
            "unknown", f"torch.cuda.is_available() is False on this ROCm build although AMD SMI sees {names}",
            "run `rocminfo` and `python -c 'import torch; torch.cuda.init()'` to see HIP's own error"))
    return causes


def gfx_problem(amd: Sequence[Any], arch_list: Sequence[str], env: Mapping[str, Optional[str]]) -> Optional[
        Diagnosis]:
    """A GPU whose graphics target this ROCm torch has no kernels for (a consumer card such as gfx1031),
    which fails at the first kernel with "HIP error: invalid device function"; and the override people set
    for it, HSA_OVERRIDE_GFX_VERSION, which makes the runtime report another target of the same family."""
    if not arch_list:
        return None
    built = {a.split(":")[0] for a in arch_list}
    override = env.get("HSA_OVERRIDE_GFX_VERSION")
    for gpu in amd:
        arch = str(gpu.arch).split(":")[0]
        if not arch.startswith("gfx") or arch in built:
            continue
        if override:
            as_arch = _override_target(override)
            if as_arch in built:
                return Diagnosis("gfx_override", f"{gpu.name} is {arch}, which torch has no kernels for; "
                                                 f"HSA_OVERRIDE_GFX_VERSION={override} runs it as {as_arch}",
                                 "works within one family (gfx103x as gfx1030); across families kernels "
                                 "crash or compute wrong results")
            return Diagnosis("unsupported_gfx", f"{gpu.name} is {arch} and HSA_OVERRIDE_GFX_VERSION="
                                                f"{override} makes it {as_arch}: torch has kernels for "
                                                "neither",
                             f"torch's targets: {', '.join(sorted(built))}")
        return Diagnosis(
            "unsupported_gfx", f"{gpu.name} is {arch}: this torch has no kernels for it (built for "
                               f"{', '.join(sorted(built))}); its first kernel fails with 'HIP error: "
                               "invalid device function'",
            "install a torch built for it (ROCm's own wheels cover more targets), or, at your own risk, set "
            "HSA_OVERRIDE_GFX_VERSION to a supported target of the same family (e.g. 10.3.0 for a gfx103x "
            "card) before the kernel starts")
    return None


def _override_target(value: str) -> str:
    """The target HSA_OVERRIDE_GFX_VERSION names: '10.3.0' -> 'gfx1030', '9.4.2' -> 'gfx942'."""
    parts = value.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return f"an unreadable target ({value!r})"
    return f"gfx{int(parts[0])}{int(parts[1])}{int(parts[2]):x}"


def kfd_problem(path: str = "/dev/kfd") -> Optional[str]:
    """What keeps this user from ROCm's compute device ``/dev/kfd``, or None (it opens, or this is no
    Linux machine with one)."""
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return "this user cannot open /dev/kfd (ROCm's compute device): not in its group"
    return None


def xpu_causes(torch_version: str, built: bool, available: bool, env: Mapping[str, Optional[str]],
               present: Sequence[str] = ()) -> list:
    """Why torch cannot use an Intel GPU: a torch without XPU, a device mask hiding it, no Level Zero
    driver. ``present`` names the Intel GPUs the PCI bus shows."""
    if available:
        return []
    if not built:
        return [Diagnosis("no_xpu_build", f"torch {torch_version} was built without XPU",
                          "install an XPU build: pip install torch --index-url "
                          "https://download.pytorch.org/whl/xpu")]
    mask = env.get("ZE_AFFINITY_MASK")
    if mask is not None:
        return [Diagnosis("hidden_by_affinity_mask", f"ZE_AFFINITY_MASK={mask!r} hides every Intel GPU",
                          "unset ZE_AFFINITY_MASK or name the GPUs to use, then restart the kernel")]
    seen = f", although the PCI bus shows {', '.join(present)}" if present else ""
    return [Diagnosis("no_level_zero", f"torch's XPU build finds no Intel GPU (torch.xpu.device_count() is 0)"
                                       f"{seen}",
                      "install Intel's GPU driver with Level Zero (`clinfo -l`, `sycl-ls` list the GPUs)")]
