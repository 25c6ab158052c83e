"""``python -m torchgpu_magic.check`` (``make gpu-check OUT=dir``): the whole GPU validation in one command.

It says whether the extension is right on this machine's GPU: each magic driven through a real IPython
shell as a user drives it, its figures compared with an independent reference (``nvidia-smi``,
``torch.profiler``, ``triton.testing.do_bench``, torch's allocator, NVML's process list, the measured
peak), each comparison a verdict with its figure; from a checkout of the repository also ``pytest -m
gpu``, the benchmarks' GPU modes and the tour notebook. Every step runs in a process of its own under a
time limit, and the whole under a deadline (450 s by default, under 8 minutes on an H100); each writes one
log, and ``summary.md`` lists every step: pass, fail, timeout, or skipped with why (docs/gpu-validation.md).

This is the room above :mod:`torchgpu_magic.magics`: nothing in the package imports it. The arrows inside
point one way: ``__main__`` -> :mod:`.plan` -> :mod:`.registry` -> the checks (:mod:`.timing_checks`,
:mod:`.memory_checks`, :mod:`.placement_checks`, :mod:`.context_checks`) -> :mod:`.probe` -> :mod:`.outcome`;
:mod:`.runner` and :mod:`.summary` run and report the steps, and :mod:`.child` runs one check in its own
process.
"""
