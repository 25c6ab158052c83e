"""``%%cudatime`` on a real GPU: against ``torch.profiler`` on kernels of known length, against
``triton.testing.do_bench`` on a large matmul, ``--cold`` and ``--flush-l2``, the empty-cell floor, and the
roofline's % of peak. Each check measures through the shell (``%%cudatime -o -q``, as a user would) and
hands its figures to a verdict function of its own, which the tests call with figures that miss.
Targets are docs/timing-method.md's "How to verify it on a real GPU" and issue 34's.
"""
from __future__ import annotations

import statistics
from typing import Any

from ..render import fmt_percent, fmt_seconds
from .outcome import FAIL, SKIPPED, Outcome, Skip, between, judged, within, worst
from .probe import Probe

SLEEP_LENGTHS = (10e-6, 100e-6, 1e-3, 10e-3, 100e-3)  # seconds
SLEEP_TOLERANCE = (1e-6, 0.005)  # max(1 us, 0.5 %) of the profiler's kernel time
MATMUL_TOLERANCE = 0.02
COLD_TOLERANCE_S = 1e-6  # --cold against the profiler's kernel time plus the cold empty-cell floor
FLUSH_TOLERANCE_S = 2e-6  # --cold --flush-l2 against --cold, on a kernel that touches no memory
FLUSH_SLOWDOWN = 1.2  # --flush-l2 on an 8 MiB reduction that fits in L2, against --cold alone
FLOOR_LIMITS = (1e-6, 10e-6)  # the empty cell per loop on the GPU clock: hot, cold (plausibility bounds)
MATMUL_PEAK = (0.60, 0.95)  # bf16 8192^2 matmul, fraction of the table's peak
COPY_PEAK = (0.70, 0.95)  # a 1 GiB copy, fraction of the memory bandwidth
ROUNDS = 3


def profiled_kernel_seconds(cycles: int, runs: int) -> float:
    """Median duration of the ``torch.cuda._sleep(cycles)`` kernel as ``torch.profiler`` (CUPTI) records
    it: a clock independent of the CUDA events ``%%cudatime`` reads."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from ..torchapi import gpu_spin

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            gpu_spin(cycles)
        torch.cuda.synchronize()
    spans = [e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA]
    if not spans:
        raise Skip("torch.profiler recorded no CUDA kernel (no CUPTI for this torch?)")
    return statistics.median(spans) / 1e6


def _cudatime(probe: Probe, options: str, body: str) -> Any:
    return probe.shell.run_cell_magic("cudatime", f"-o -q {options}", body)


def _calibrated(probe: Probe) -> float:
    """``_sleep`` cycles per second on this GPU at its working clock (see :mod:`torchgpu_magic.timing`)."""
    from .. import timing

    per_second = timing.sleep_cycles_per_ms(warm_s=0.5) * 1e3
    probe.say(f"calibration: {per_second / 1e6:.1f} _sleep cycles per microsecond")
    return per_second


# ---- %%cudatime against torch.profiler ----------------------------------------------------------------
def cudatime_vs_profiler(probe: Probe) -> Outcome:
    """``torch.cuda._sleep`` kernels from 10 us to 100 ms: ``%%cudatime``'s median against the profiler."""
    probe.cuda()
    per_second = _calibrated(probe)
    points = []
    for seconds in SLEEP_LENGTHS:
        cycles = max(1, int(per_second * seconds))
        probe.shell.user_ns["cycles"] = cycles
        ours = _cudatime(probe, "--max-time 3", "torch.cuda._sleep(cycles)").median
        reference = profiled_kernel_seconds(cycles, max(5, min(200, int(0.2 / seconds))))
        points.append((seconds, ours, reference))
        probe.say(f"_sleep {fmt_seconds(seconds)}: %%cudatime {ours * 1e6:.3f} us, profiler "
                  f"{reference * 1e6:.3f} us")
    return judge_sleep_points(points)


def judge_sleep_points(points: list) -> Outcome:
    """``points``: (nominal seconds, ours, profiler's) each; every point within max(1 us, 0.5 %)."""
    absolute, relative = SLEEP_TOLERANCE
    rows, misses, worst_share = [], [], (0.0, None)
    for nominal, ours, reference in points:
        tolerance = max(absolute, relative * reference)
        off = ours - reference
        rows.append(f"{fmt_seconds(nominal)} kernel: {fmt_seconds(ours)} vs {fmt_seconds(reference)}, off by "
                    f"{off * 1e6:+.2f} us (limit {tolerance * 1e6:.2f} us)")
        if not within(ours, reference, tolerance):
            misses.append(fmt_seconds(nominal))
        share = abs(off) / tolerance
        if share >= worst_share[0]:
            worst_share = (share, rows[-1])
    figure = f"{len(points)} lengths; worst: {worst_share[1]}"
    return judged(not misses, figure, "each within max(1 us, 0.5 %) of torch.profiler's kernel time",
                  f"outside at {', '.join(misses)}", rows)


# ---- %%cudatime against triton's do_bench ----------------------------------------------------------------
def cudatime_vs_do_bench(probe: Probe) -> Outcome:
    """An 8192x8192 fp16 matmul: ``%%cudatime``'s median against ``do_bench(return_mode="median")``,
    alternating rounds on the same tensors."""
    probe.cuda()
    do_bench = probe.require("triton.testing").do_bench
    probe.cell("a = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)\nb = torch.randn_like(a)")
    a, b = probe.shell.user_ns["a"], probe.shell.user_ns["b"]
    ours, theirs = [], []
    for _ in range(ROUNDS):
        ours.append(_cudatime(probe, "--max-time 3", "a @ b").median)
        theirs.append(do_bench(lambda: a @ b, return_mode="median") / 1e3)
    probe.say(f"%%cudatime {ours}, do_bench {theirs} (seconds per matmul, by round)")
    return judge_ratio("8192x8192 fp16 matmul", statistics.median(ours), statistics.median(theirs),
                       "triton.testing.do_bench", MATMUL_TOLERANCE)


def judge_ratio(what: str, ours: float, theirs: float, reference: str, tolerance: float) -> Outcome:
    """``ours / theirs`` within ``1 +- tolerance``."""
    ratio = ours / theirs
    return judged(abs(ratio - 1) <= tolerance,
                  f"{what}: %%cudatime {fmt_seconds(ours)} vs {reference} {fmt_seconds(theirs)}, ratio "
                  f"{ratio:.4f}",
                  f"ratio 1 +- {tolerance:g}")


# ---- --cold and --flush-l2 -----------------------------------------------------------------------------
def cold_and_flush_l2(probe: Probe) -> Outcome:
    """``--cold`` on a 10 us kernel against the profiler's kernel time plus the cold empty-cell floor
    (each cold loop's two events and the spin they wait behind cost the GPU that much, about 1.3 us on an
    H200, which the profiler's kernel duration leaves out); ``--cold --flush-l2`` on it (no memory
    touched: the same); and ``--flush-l2`` on an 8 MiB reduction that fits in L2 (slower by >= 1.2x)."""
    import torch

    from .. import timing

    index = probe.cuda()
    cycles = max(1, int(_calibrated(probe) * 10e-6))
    probe.shell.user_ns["cycles"] = cycles
    floor = timing.empty_cell_floor(torch.device("cuda", index), cold=True)
    reference = profiled_kernel_seconds(cycles, 200)
    cold = _cudatime(probe, "--cold --max-time 3", "torch.cuda._sleep(cycles)").median
    flushed = _cudatime(probe, "--cold --flush-l2 --max-time 3", "torch.cuda._sleep(cycles)").median
    l2 = torch.cuda.get_device_properties(index).L2_cache_size
    sums = None
    if l2 >= 16 * 2**20:
        probe.cell("r = torch.ones(2 * 2**20, device='cuda')")  # 8 MiB of float32
        sums = (_cudatime(probe, "--cold --max-time 3", "r.sum()").median,
                _cudatime(probe, "--cold --flush-l2 --max-time 3", "r.sum()").median)
    return judge_cold(reference, floor, cold, flushed, sums, l2)


def judge_cold(reference: float, floor: float, cold: float, flushed: float, sums: Any, l2: int) -> Outcome:
    """The three comparisons of :func:`cold_and_flush_l2`; ``floor`` the cold empty-cell floor, ``sums``
    (cold, flushed) of the 8 MiB reduction, None where the L2 is too small for it to stay there."""
    parts = [
        judged(within(cold, reference + floor, COLD_TOLERANCE_S),
               f"--cold 10 us kernel {fmt_seconds(cold)} vs profiler {fmt_seconds(reference)} + cold floor "
               f"{fmt_seconds(floor)}", "+- 1 us"),
        judged(within(flushed, cold, FLUSH_TOLERANCE_S),
               f"--cold --flush-l2 {fmt_seconds(flushed)} vs --cold {fmt_seconds(cold)}", "+- 2 us"),
    ]
    if sums is None:
        parts.append(Outcome(SKIPPED, why=f"this GPU's L2 ({l2 // 2**20} MiB) is too small for an 8 MiB "
                                            "working set to stay in it"))
    else:
        hot, cleared = sums
        parts.append(judged(cleared >= FLUSH_SLOWDOWN * hot,
                            f"8 MiB sum --cold {fmt_seconds(hot)}, with --flush-l2 {fmt_seconds(cleared)} "
                            f"({cleared / hot:.2f}x)", f">= {FLUSH_SLOWDOWN}x slower with --flush-l2"))
    return worst(parts)


# ---- the empty-cell floor ------------------------------------------------------------------------------
def empty_cell_floor(probe: Probe) -> Outcome:
    """What an empty cell measures on the GPU clock, hot and cold (the floor ``%%cudatime`` flags results
    against), and a 100 us kernel, well above it, not flagged as near it."""
    import torch

    from .. import timing

    index = probe.cuda()
    device = torch.device("cuda", index)
    hot, cold = timing.empty_cell_floor(device), timing.empty_cell_floor(device, cold=True)
    probe.shell.user_ns["cycles"] = max(1, int(_calibrated(probe) * 100e-6))
    result = _cudatime(probe, "--max-time 3", "torch.cuda._sleep(cycles)")
    flagged = [w for w in result.warnings if "empty cell" in w]
    probe.say(f"floor hot {hot * 1e9:.1f} ns, cold {cold * 1e9:.1f} ns; 100 us kernel: "
              f"{result.median * 1e6:.2f} us, floor in its result {result.floor}, warnings {result.warnings}")
    return judge_floor(hot, cold, result.median, flagged)


def judge_floor(hot: float, cold: float, kernel: float, flagged: list) -> Outcome:
    """The floors under their plausibility bounds, and the 100 us kernel not flagged as near them."""
    hot_limit, cold_limit = FLOOR_LIMITS
    ok = hot <= hot_limit and cold <= cold_limit and not flagged
    why = ("; ".join(([f"hot floor over {fmt_seconds(hot_limit)}"] if hot > hot_limit else [])
                     + ([f"cold floor over {fmt_seconds(cold_limit)}"] if cold > cold_limit else [])
                     + ([f"a {fmt_seconds(kernel)} kernel flagged: {flagged[0]}"] if flagged else [])))
    near = "flagged" if flagged else "not flagged"
    return judged(ok, f"empty cell {fmt_seconds(hot)} per loop hot, {fmt_seconds(cold)} cold; a 100 us "
                      f"kernel {fmt_seconds(kernel)}, {near} as near the floor",
                  f"hot <= {fmt_seconds(hot_limit)}, cold <= {fmt_seconds(cold_limit)}, a 100 us kernel not "
                  "flagged", why)


# ---- the roofline --------------------------------------------------------------------------------------
def roofline(probe: Probe) -> Outcome:
    """The roofline's % of peak on an 8192x8192 bf16 matmul (compute) and a 1 GiB fp32 copy (memory).
    Skipped only for a GPU the peak table does not list; a listed GPU whose roofline has no figures
    (its counting run failed) fails, with the report's reason."""
    import torch

    from ..timing import peaks

    index = probe.cuda()
    name = torch.cuda.get_device_name(index)
    if peaks.lookup(name) is None:
        raise Skip(f"{name} is not in the roofline's peak table: no % of peak to check")
    probe.cell("a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\nb = torch.randn_like(a)")
    result = _cudatime(probe, "--max-time 3", "a @ b")
    matmul = result.roofline
    probe.say(f"matmul: {matmul.line() if matmul else None}")
    if matmul is None or matmul.peak_name is None or matmul.flops_fraction is None:
        notes = [n for n in result.notes if n.startswith("roofline")]
        return Outcome(FAIL, f"{name} is in the peak table, but the matmul's roofline has no % of peak",
                       "a % of peak", why="; ".join(notes) or "no roofline line in the report")
    probe.cell("del a, b\np = torch.randn(2**28, device='cuda')\nq = torch.empty_like(p)")  # 1 GiB each
    copy = _cudatime(probe, "--max-time 3", "q.copy_(p)").roofline
    probe.say(f"copy: {copy.line() if copy else None}")
    return judge_roofline(matmul.flops_fraction, matmul.bound, copy.bandwidth_fraction if copy else None,
                          copy.bound if copy else None, matmul.peak_name)


def judge_roofline(flops_fraction: Any, matmul_bound: Any, bandwidth_fraction: Any, copy_bound: Any,
                   peak_name: str) -> Outcome:
    """The matmul at 60-95 % of the compute peak and compute-bound; the copy at 70-95 % of the memory
    bandwidth and memory-bound."""
    return worst([
        judged(between(flops_fraction, *MATMUL_PEAK) and matmul_bound == "compute",
               f"bf16 matmul at {fmt_percent(flops_fraction)} of {peak_name}'s peak, {matmul_bound}-bound",
               "60-95 %, compute-bound"),
        judged(between(bandwidth_fraction, *COPY_PEAK) and copy_bound == "memory",
               f"1 GiB copy at {fmt_percent(bandwidth_fraction)} of the memory bandwidth, {copy_bound}-bound",
               "70-95 %, memory-bound"),
    ])
