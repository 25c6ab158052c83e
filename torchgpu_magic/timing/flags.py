"""The warnings and notes a measurement earns (method step 8): noise, outliers, the empty-cell floor, the
launch-bound judgement (from the GPU's idle time between kernels, never from host vs device time), the
cell's waits for the GPU, work on other streams, and whether the working set fits in the L2 cache.

``host enqueue >= 0.9 x device`` misfires once CUDA's launch queue fills: a GPU-bound cell queuing more
than about a thousand launches a sample blocks the host until the GPU catches up, so host time equals
device time with the GPU never idle. Launch-bound is therefore said only from a ``--kernels`` profiler
pass: the kernels kept the GPU busy for less than half of the device time. Standard library only.
"""
from __future__ import annotations

from typing import Optional

from ..render import fmt_bytes, fmt_percent, fmt_seconds
from .stats import Stats

NOISY, UNRELIABLE = 0.10, 0.25  # IQR/median thresholds (torch.utils.benchmark's Measurement)
SLOW_OUTLIER = 4.0  # slowest > 4 x fastest (IPython's %timeit)
FLOOR_FACTOR = 10.0  # result < 10 x the empty-cell floor
LAUNCH_IDLE = 0.5  # launch-bound: kernels busy for less than half of the device time
OTHER_STREAMS = 1.5  # synchronized wall > 1.5 x device ...
OTHER_STREAMS_MIN_S = 100e-6  # ... and by more than this per sample (sync latency is ~10 us)


def other_streams(device: Optional[float], wall: Optional[float], loops: int, flush: bool,
                  cold: bool = False) -> bool:
    """Whether synchronized wall time is far above the current stream's device time (> 1.5 x, and by more
    than sync latency per sample): the cell queues work the events do not see. Not judged under
    ``--flush-l2``, whose untimed cache writes are in the wall time, nor under ``--cold``, whose wall time
    holds every loop's spin and synchronize."""
    return bool(device and wall is not None and not flush and not cold and wall > OTHER_STREAMS * device
                and (wall - device) * loops > OTHER_STREAMS_MIN_S)


def assess(stats: Stats, kind: str, host: Optional[float] = None, device: Optional[float] = None,
           wall: Optional[float] = None, loops: int = 1, floor: Optional[float] = None,
           cold: bool = False, flush: bool = False, syncs: Optional[int] = 0,
           busy: Optional[float] = None) -> list:
    """The method's flags (step 8) for per-loop ``stats`` and median host / device / wall times; ``syncs``
    is how often a warm run waited for the GPU, ``busy`` the seconds per loop the GPU spent in kernels
    in the ``--kernels`` pass (None without one)."""
    out = []
    rel = stats.rel_iqr
    if rel > UNRELIABLE:
        out.append(f"unreliable: IQR is {fmt_percent(rel)} of the median (> 25 %); the machine is busy or "
                   "the cell's work varies from run to run")
    elif rel > NOISY:
        out.append(f"noisy: IQR is {fmt_percent(rel)} of the median (> 10 %)")
    if stats.min > 0 and stats.max > SLOW_OUTLIER * stats.min:
        out.append(f"the slowest sample took {stats.max / stats.min:.1f} x the fastest: something is cached "
                   "between runs, or the machine was busy")
    if floor is not None and floor > 0 and stats.median < FLOOR_FACTOR * floor:
        how = ("with --cold" if cold else "hot") + (", without --flush-l2" if flush else "")
        out.append(f"the result is under 10 x the time of an empty cell ({fmt_seconds(floor)} per loop, "
                   f"measured {how}): mostly loop and clock overhead")
    if kind == "device" and not cold:
        if syncs:
            out.append(f"the cell waits for the GPU ({syncs} synchronizing call{'s' * (syncs != 1)} per run: "
                       ".item(), .cpu(), print(t), nonzero, synchronize...): host enqueue time includes the "
                       "waits, and the GPU idles while the host works between them")
        if device and busy is not None and busy < (1 - LAUNCH_IDLE) * device:
            idle = 1 - busy / device
            cause = "waits for the GPU above and host work between kernels" if syncs else \
                "the CPU cannot feed the GPU (many small kernels, or CPU work in the cell)"
            out.append(f"launch-bound: the GPU idled {fmt_percent(idle)} of the device time between kernels "
                       f"(kernels {fmt_seconds(busy)} of {fmt_seconds(device)} per loop, --kernels pass): "
                       f"{cause}")
    if kind in ("device", "wall") and other_streams(device, wall, loops, flush, cold):
        out.append(f"synchronized wall time ({fmt_seconds(wall)}) is {wall / device:.1f} x device time on "
                   "the current stream: the cell queues work on other streams (or devices) that its events "
                   "do not see, so the headline is the synchronized wall time")
    return out


def l2_note(working_set: Optional[int], l2: Optional[int], flush: bool) -> Optional[str]:
    """Whether the cell's working set fits in the GPU's L2 cache, said of a figure timed without
    ``--flush-l2``: a hot figure for a working set under L2 is what an L2-resident step takes, not one
    that streams it from memory, as a training step's larger one does."""
    if flush or not working_set or not l2:
        return None
    size = f"working set {fmt_bytes(working_set)} (the storages the first run's ops read and wrote)"
    if working_set <= l2:
        return (f"{size} fits in the {fmt_bytes(l2)} L2 cache: timed without --flush-l2, it stays there "
                "between loops, so this is an L2-resident figure; --flush-l2 times it from memory")
    return f"{size} is larger than the {fmt_bytes(l2)} L2 cache: the loops stream it from memory"
