"""``%gpumem free``'s core: give back what the failed cell and IPython's history hold, without touching the
user's names, and say what each step gave back, measured before and after.

The steps come from the caller, each a source and a function that lets go of its references and returns
what it let go of (the magic knows IPython's: ``sys.last_*`` and the traceback IPython keeps; the output
history's entries that hold tensors). After each, ``gc.collect()`` frees what only cycles kept, and the
memory is measured again: on the cpu this process's RSS, on a GPU torch's allocated bytes. Last, torch's
cache is emptied on each device that has one (``torch.cuda.empty_cache()``, ``torch.mps.empty_cache()``,
``torch.xpu.empty_cache()``). The report then lists the user's names that still hold memory, each with
the ``del`` that would free it.

What was given back to a GPU is the fall of torch's reserved memory from before the first step to after
the cache was emptied (and NVML's figure for this process, where it can be read): a tensor released by a
step goes to torch's cache first, so the steps' figures (allocated) and the cache's (reserved) overlap
and are never added up. On the cpu it is the steps' falls in RSS.
"""
from __future__ import annotations

import gc
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from .. import accelerators
from ..gpus import gpumap, processes
from ..host import HostCounters
from ..render import Lines, Report, Reportable, fmt_bytes
from . import devicestate
from .holdings import Released, collect

KEPT_SHOWN = 10  # names listed as still holding memory


@dataclass(repr=False)
class FreeStep:
    """One source let go: its name, what was released (names of references), per device the bytes
    measured free afterwards (``freed``; a device whose figure did not fall reads 0), and the bytes that
    only this source held before, as the holders count them (``held``)."""

    source: str
    released: list
    freed: dict
    held: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(repr=False)
class FreeReport(Reportable):
    """What ``%gpumem free`` gave back, step by step, how it was measured per device (``measured``), what
    each device got back over the whole run (``returned``: the cpu's RSS falls, a GPU's fall in torch's
    reserved memory; ``nvml``: NVML's fall for this process where it could be read), and the user's names
    that still hold memory (``kept``: (name, device, bytes, the del that frees it))."""

    steps: list
    measured: dict
    kept: list = field(default_factory=list)
    returned: dict = field(default_factory=dict)
    nvml: dict = field(default_factory=dict)

    def total(self) -> dict:
        """{device: bytes given back}: the headline's figures."""
        return dict(self.returned)

    def report(self) -> Report:
        """The headline with how it was measured, each step indented under it, the names still holding."""
        total = self.total()
        given = ", ".join(f"{fmt_bytes(b)} on {d}" for d, b in total.items() if b) or "nothing measurable"
        how = [f"{d} {how}" for d, how in self.measured.items()]
        how += [f"NVML: this process's {d} figure fell {fmt_bytes(b)}" for d, b in self.nvml.items()]
        steps = []
        for step in self.steps:
            host = step.source == "torch's cache" or all(d == "cpu" for d in step.freed if step.freed[d])
            freed = ", ".join(f"{fmt_bytes(b)} on {d}" for d, b in step.freed.items() if b)
            released = ", ".join(f"{fmt_bytes(b)} on {d}" for d, b in step.freed.items() if b and d != "cpu")
            back = ", ".join(f"{fmt_bytes(b)} on cpu" for d, b in step.freed.items() if b and d == "cpu")
            more = ", ..." if len(step.released) > 6 else ""
            what = f" ({', '.join(step.released[:6])}{more})" if step.released else " (nothing held)"
            held = ", ".join(f"{fmt_bytes(b)} on {d}" for d, b in step.held.items() if b)
            if host:
                result = f"gave back {freed or 'nothing measurable'}"
            else:  # a GPU's tensors go to torch's cache: the cache step gives them back
                result = (f"gave back {back}; " if back else "") + f"released {released} into torch's cache"
            steps.append(f"{step.source}{what}: " + (f"held {held}; " if held else "") + result)
        if any(step.held.get("cpu", 0) > step.freed.get("cpu", 0) for step in self.steps):
            steps.append("(on the cpu, freed memory the C allocator keeps for reuse does not leave the RSS)")
        kept = [f"{name}: {fmt_bytes(size)} on {device}; {fix}"
                for name, device, size, fix in self.kept[:KEPT_SHOWN]]
        if len(self.kept) > KEPT_SHOWN:
            kept.append(f"... and {len(self.kept) - KEPT_SHOWN} more: %gpumem holders lists them")
        return Report([Report([Lines(steps)], indent="  "),
                       Report([Lines(kept)], title="Your names still hold (not touched):", indent="  ")
                       if kept else None],
                      title=f"%gpumem free: gave back {given} (measured: " + "; ".join(how) + ")")

    def to_dict(self) -> dict:
        return {"steps": [s.to_dict() for s in self.steps], "measured": dict(self.measured),
                "total": self.total(), "nvml": dict(self.nvml),
                "kept": [{"name": n, "device": d, "bytes": b, "fix": f} for n, d, b, f in self.kept]}


def _used_devices() -> list:
    """``(kind, index)`` of every accelerator device this process has used (never initialises one; MPS
    once its driver has allocated anything; a lost GPU's left out: the cpu is still measured)."""
    return devicestate.used_devices(lambda device: device[0] != "mps" or accelerators.reserved(device))


def measure(host: HostCounters) -> dict:
    """{device: (in use, reserved or the process's figure)} now: cpu (RSS, RSS), each initialised
    accelerator device (torch allocated, torch reserved; MPS's driver-allocated memory)."""
    out: dict = {"cpu": (host.rss(), host.rss())}
    for at in _used_devices():
        out[accelerators.device_label(*at)] = (accelerators.allocated(at), accelerators.reserved(at))
    return out


def _drop(before: dict, after: dict, which: int) -> dict:
    """Per device, how much the figure ``which`` (0: in use, 1: reserved) fell; 0 where it did not."""
    out = {}
    for device, figures in before.items():
        now = (after.get(device) or (None, None))[which]
        if figures[which] is not None and now is not None:
            out[device] = max(0, figures[which] - now)
    return out


def empty_caches() -> list:
    """Empty torch's cache on every backend this process uses; the calls made."""
    kinds = sorted({kind for kind, _ in _used_devices()})
    for kind in kinds:
        accelerators.empty_cache(kind)
    return [f"torch.{kind}.empty_cache()" for kind in kinds]


def _nvml_process() -> dict:
    """This process's NVML figure per initialised CUDA GPU (for the cache step); {} where NVML cannot say."""
    out = {}
    for index in (index for kind, index in _used_devices() if kind == "cuda"):
        try:
            target = gpumap.nvml_target(index)
            if target is not None:
                process = processes.process_figures(target[0], os.getpid(), target[1])[2]
                if isinstance(process, int):
                    out[f"cuda:{index}"] = process
        except Exception:  # noqa: BLE001 - NVML failing costs this figure only
            continue
    return out


def give_back(steps: Sequence[tuple], ns: Mapping[str, Any], tracebacks: Sequence[Any] = ()) -> FreeReport:
    """Run ``steps`` ((source, 'traceback' or 'output', release); ``release()`` lets go of references and
    returns their names), each followed by ``gc.collect()`` and a measurement, then empty torch's caches;
    list the names in ``ns`` still holding memory, with the ``del`` that frees each. ``tracebacks`` are
    what keeps the last error's frames (beside ``sys.last_*``), to count what each step held before."""
    holdings = collect(ns, tracebacks)
    tracebacks = ()  # the caller's list would keep the very frames the first step lets go of
    by_device = {device: Released(holdings, device) for device in holdings.devices()}
    held = {group: {device: getattr(released, group) for device, released in by_device.items()}
            for group in ("traceback", "output")}
    holdings = None
    host = HostCounters()
    try:
        first = before = measure(host)
        gpu = "torch reserved before and after (steps: torch allocated)"
        measured = {device: "RSS" if device == "cpu" else gpu for device in before}
        nvml_first = _nvml_process()
        done = []
        for source, group, release in steps:
            released = list(release())
            gc.collect()
            after = measure(host)
            done.append(FreeStep(source, released, _drop(before, after, 0), held.get(group, {})))
            before = after
        calls = empty_caches()
        if calls:
            after = measure(host)
            done.append(FreeStep("torch's cache", calls,
                                 {d: b for d, b in _drop(before, after, 1).items() if d != "cpu"}))
            before = after
        returned = {d: b for d, b in _drop(first, before, 1).items() if d != "cpu"}
        returned = {"cpu": sum(step.freed.get("cpu", 0) for step in done), **returned}
        nvml_last = _nvml_process()
        nvml = {d: max(0, b - nvml_last[d]) for d, b in nvml_first.items() if d in nvml_last}
    finally:
        host.close()
    return FreeReport(done, measured, kept(ns), returned, nvml)


def kept(ns: Mapping[str, Any]) -> list:
    """(name, device, bytes, the del that frees it) for each user name still holding memory, largest
    first: 'del x frees N' when that alone frees it, else the names sharing its storage ('del x, y
    together'). One pass over the storages per device, whatever the number of names."""
    holdings = collect(ns, tracebacks=())
    holders = holdings.holders
    sharers: dict = {}  # holder index -> the other names holding what it counts
    for key, (_, _, first, _) in holdings.storages.items():
        for i in holdings.more.get(key, ()):
            if holders[i].source == "name" and holders[i].root != holders[first].root:
                listed = sharers.setdefault(first, [])
                if holders[i].root not in listed:
                    listed.append(holders[i].root)
    found = []
    for device in holdings.devices():
        released = Released(holdings, device)
        for h in holders:
            size = h.nbytes(device) if h.source == "name" else 0
            if not size:
                continue
            alone = released.alone.get(h.root, 0)
            if alone:
                fix = f"del {h.root} frees {fmt_bytes(alone)}"
            elif h.index in sharers:
                fix = f"del {', '.join([h.root, *sharers[h.index]])} together"
            else:
                fix = f"del {h.root}"
            found.append((h.root, device, size, fix))
    found.sort(key=lambda k: -k[2])
    return found
