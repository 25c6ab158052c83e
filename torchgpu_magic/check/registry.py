"""The checks by name, in the order the run takes them, each with what it checks and its time limit.

Each runs in a process of its own (:mod:`.child`): a check that fills the GPU, hangs in a driver call or
aborts takes only its own process down, and the next one starts on a GPU with nothing left over. The
limits are for an H100 with some room; the whole run has a deadline of its own (:mod:`.plan`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from . import context_checks, memory_checks, placement_checks, timing_checks


class Check(NamedTuple):
    """A check: ``title`` (what it compares), ``run`` (a :class:`~.probe.Probe` to an
    :class:`~.outcome.Outcome`), ``limit`` in seconds."""

    title: str
    run: Callable
    limit: float


CHECKS = {
    "versions": Check("torch, CUDA, driver and the GPUs", context_checks.versions, 45),
    "gpuinfo-vs-smi": Check("%gpuinfo's memory and utilisation vs nvidia-smi at the same moment",
                            context_checks.gpuinfo_vs_smi, 45),
    "no-context": Check("no CUDA context from %gpuinfo, %gpumem, %whereis, %%ontorch cpu, cpu %%cudatime "
                        "(also after %gpuinfo), %%cudamem --predict cuda, each in a fresh process",
                        context_checks.no_context, 90),
    "cudatime-vs-profiler": Check("%%cudatime vs torch.profiler on _sleep kernels, 10 us to 100 ms",
                                  timing_checks.cudatime_vs_profiler, 75),
    "cudatime-vs-do_bench": Check("%%cudatime vs triton.testing.do_bench on an 8192x8192 fp16 matmul",
                                  timing_checks.cudatime_vs_do_bench, 60),
    "cold-flush-l2": Check("--cold vs torch.profiler, --cold --flush-l2, the L2 flush on an 8 MiB sum",
                           timing_checks.cold_and_flush_l2, 60),
    "empty-cell-floor": Check("the empty-cell floor on the GPU clock, hot and cold",
                              timing_checks.empty_cell_floor, 45),
    "roofline": Check("the roofline's % of peak: bf16 matmul, 1 GiB copy", timing_checks.roofline, 60),
    "gpumem-figures": Check("%gpumem vs torch.cuda.memory_allocated/reserved and NVML's process list",
                            memory_checks.gpumem_figures, 45),
    "out-of-memory": Check("a real CUDA out-of-memory explained; %gpumem free gives back what it says",
                           memory_checks.out_of_memory, 75),
    "cudamem-predict": Check("%%cudamem --predict cuda vs the measured peak, GPT-2 124M, fp32 and bf16",
                             memory_checks.cudamem_prediction, 120),
    "whereis-adam": Check("%whereis on a cuda model with Adam: no false alarm",
                          placement_checks.whereis_adam, 45),
    "mismatch-diagnosis": Check("the diagnosis of a real cuda/cpu mismatch",
                                placement_checks.mismatch_diagnosis, 45),
    "ontorch-cuda": Check("%%ontorch cuda:0 with .cuda() inside", placement_checks.ontorch_cuda, 45),
}
