"""``%gpuinfo --cluster``: every engine's report merged into one view of the cluster's GPUs.

GPUs are deduplicated by host and UUID (four engines on one host report its GPUs four times); each
engine's torch devices are matched to those physical GPUs through its own report's mapping; the GPU an
engine is *on* is the one whose NVML process list holds its PID, else the one its torch current (or
default) CUDA device is. The flags are the mistakes that are invisible from one process: engines sharing
one GPU (while others on the host sit idle), hosts with different drivers, engines with different torch
builds, engines whose torch cannot use a GPU; each comes with its fix.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..render import Lines, Report, Reportable, Table, fmt_bytes, fmt_value
from .bridge import FIX_PACKAGE, FIX_TORCH, engine_list

FIX_SHARED_IDLE = ("give each engine its own GPU: %ontorch local --cluster (the GPU of each engine's local "
                   "rank), or start each engine with its own CUDA_VISIBLE_DEVICES; with Dask, dask-cuda's "
                   "LocalCUDACluster starts one worker per GPU")
FIX_STRAY = ("choose each engine's GPU first thing, before any CUDA call: torch.cuda.set_device(local rank) "
             "or %%ontorch local (which sets it), then create tensors on that device ('cuda:N' or the "
             "default, never a bare 'cuda:0'); or start each engine with its own CUDA_VISIBLE_DEVICES, so it "
             "sees only its GPU. A context once made stays until its engine restarts")
CONTEXT_MAX = 1 << 30
"""The most GPU memory a bare CUDA context takes (300-600 MiB on recent GPUs and drivers): an engine
holding no more than this on a GPU where torch keeps nothing holds a stray context there."""
FIX_SHARED_FULL = ("the engines compete for this GPU's memory and compute: run one engine per GPU on this "
                   "host (fewer engines, or dask-cuda's LocalCUDACluster)")
FIX_ENGINE = {
    "no_package": FIX_PACKAGE,
    "no_torch": FIX_TORCH,
    "dead": "restart the engine (ipcluster / your launcher); the other engines' rows are current",
    "timeout": "the engine is busy (a long %px cell?) or stuck: wait, interrupt it, or raise --timeout",
    "busy": "wait for it to finish, or stop it as %px would (Ctrl-C in the %px cell, or "
            "rc.send_signal('SIGINT', targets=[N])); the other engines' rows are current",
    "stuck": "restart the engine if it does not recover (ipcluster / your launcher); the other engines' "
             "rows are current",
}
"""The fix for an engine that did not report, by its problem (else :data:`FIX_OTHER`)."""
FIX_OTHER = "see the message; the other engines' rows are current"


@dataclass
class Flag:
    """One finding about the cluster: what is wrong and the fix."""

    cause: str
    message: str
    fix: str


@dataclass(repr=False)
class ClusterGPUReport(Reportable):
    """What ``%gpuinfo --cluster`` shows: hosts and their GPUs (one row per physical GPU), engines (their
    torch, which physical GPU each torch device is, the GPU each is on), processes, and :attr:`flags`."""

    name: str
    kind: str
    engines: list  # one dict per engine: label, host, pid, ok, problem, report (plain %gpuinfo data), on
    gpus: list  # one dict per (host, uuid): host, nvml index, name, uuid, used, total, engines
    processes: list  # (host, nvml index, pid, name, used, engine label or '')
    flags: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "engines": self.engines, "gpus": self.gpus,
                "processes": [list(p) for p in self.processes],
                "flags": [asdict(f) for f in self.flags]}

    @property
    def hosts(self) -> list:
        return sorted({e["host"] for e in self.engines if e["host"]})

    def headline(self) -> str:
        down = sum(not e["ok"] for e in self.engines)
        hosts = len(self.hosts)
        n = len(self.engines)
        text = (f"cluster {self.name} ({self.kind}): {n} engine{'s' * (n != 1)}"
                f" on {hosts} host{'s' * (hosts != 1)}, {len(self.gpus)} GPU{'s' * (len(self.gpus) != 1)}")
        return text + (f"; {down} engine{'s' * (down != 1)} did not report" if down else "")

    def tables(self) -> list:
        gpus = Table(["host", "GPU", "name", "memory used / total", "util", "engines on it"], align="lrlrrl",
                     title="GPUs (one row per physical GPU, by host and UUID)")
        for g in self.gpus:
            on = ", ".join(g["engines"]) or "idle"
            if g.get("stray"):
                on += f" (+ stray contexts of {engine_list(g['stray'])})"
            gpus.add(g["host"], g["index"], g["name"], f"{fmt_bytes(g['used'])} / {fmt_bytes(g['total'])}",
                     fmt_value(g.get("util"), "%"), on)
        ranks = any((e.get("report") or {}).get("dist") for e in self.engines)
        engines = Table(["engine", "host", "pid"] + (["rank"] if ranks else []) +
                        ["torch", "torch devices -> GPU", "on GPU", "status"],
                        align="llr" + ("r" if ranks else "") + "llll", title="Engines")
        for e in self.engines:
            report = e.get("report") or {}
            torch = torch_build(report["environment"]) if report.get("environment") else "-"
            devices = ", ".join(f"cuda:{t} -> GPU {n}" for t, n in e.get("map", [])) or "-"
            on = ", ".join(f"GPU {i}" for i in e.get("on", [])) or "-"
            status = "ok" if e["ok"] else e["message"] if e["problem"] in ("busy", "stuck") \
                else f"{e['problem']}: {e['message']}"  # the fix is in the flags below
            if e["ok"] and report.get("diagnosis"):
                status = "torch cannot use a GPU"
            dist = report.get("dist")
            rank = ([f"{dist['rank']} of {dist['world_size']} ({dist['backend']})" if dist else "-"]
                    if ranks else [])
            engines.add(e["label"], e["host"] or "-", fmt_value(e["pid"]), *rank, torch, devices, on, status)
        out = [gpus, engines] if self.gpus else [engines]
        if self.processes:
            rows = [(host, index, pid, fmt_value(name), fmt_bytes(used), engine)
                    for host, index, pid, name, used, engine in self.processes]
            out.append(Table(["host", "GPU", "pid", "name", "GPU memory", "engine"], rows, align="lrrlrl",
                             title="Processes"))
        return out

    def report(self) -> Report:
        """The headline, the tables, and the flags with their fixes."""
        lines = [line for f in self.flags for line in (f"x {f.message}", f"  fix: {f.fix}")]
        flags = Report([Lines(lines)], title="Flags:", indent="  ") if self.flags else None
        return Report([*self.tables(), flags], title=self.headline(), gap=True)


def torch_build(env: dict) -> str:
    """'2.8.0+cu128 (CUDA 12.8)' / '2.13.0+cpu (CPU-only)' from a report's environment."""
    cuda = env.get("torch_cuda")
    return f"{env.get('torch_version')} ({'CUDA ' + cuda if cuda else 'CPU-only'})"


def build(name: str, kind: str, replies: Sequence[Any]) -> ClusterGPUReport:
    """Merge the engines' ``remote.gpuinfo`` replies into one :class:`ClusterGPUReport`."""
    gpus: dict = {}  # (host, uuid) -> row
    processes: dict = {}
    engines = []
    pid_engine = {(r.host, r.pid): r.engine for r in replies if r.ok}
    for reply in replies:
        row = {"label": reply.engine, "host": reply.host, "pid": reply.pid, "ok": reply.ok,
               "problem": reply.problem, "message": reply.message, "fix": reply.fix, "report": reply.value,
               "map": [], "on": []}
        engines.append(row)
        if not reply.ok:
            continue
        report = reply.value
        on, stray = _placed(report, reply.pid)
        for entry in report["gpus"]:
            snap = entry.get("snapshot") or {}
            mapping = entry.get("mapping") or {}
            uuid = snap.get("uuid") or mapping.get("uuid") or f"{reply.engine}/cuda:{entry['torch_index']}"
            index = entry["nvml_index"] if entry["nvml_index"] is not None else f"cuda:{entry['torch_index']}"
            key = (reply.host, uuid)
            gpu = gpus.setdefault(key, {"host": reply.host, "index": index, "uuid": uuid, "engines": [],
                                        "name": snap.get("name") or (entry.get("torch") or {}).get("name"),
                                        "used": snap.get("memory_used"), "total": snap.get("memory_total"),
                                        "util": snap.get("utilization_gpu"), "stray": [],
                                        "driver": report["environment"].get("driver_version")})
            if entry["torch_index"] is not None:
                row["map"].append((entry["torch_index"], index))
            for proc in entry.get("processes", []):
                processes[(reply.host, index, proc["pid"])] = (
                    reply.host, index, proc["pid"], proc["name"], proc["used_memory"],
                    pid_engine.get((reply.host, proc["pid"]), ""))
            if entry["nvml_index"] in stray:
                gpu["stray"].append(reply.engine)
                row.setdefault("stray", []).append((gpu["index"], stray[entry["nvml_index"]]))
            elif entry["nvml_index"] in on or (
                    not on and not stray and entry["torch_index"] == (report.get("current_device") or 0)):
                row["on"].append(gpu["index"])
                gpu["engines"].append(reply.engine)
    rows = sorted(gpus.values(), key=lambda g: (g["host"], str(g["index"])))
    out = ClusterGPUReport(name, kind, engines, rows,
                           sorted(processes.values(), key=lambda p: (p[0], str(p[1]), p[2])))
    out.flags = _flags(out)
    return out


def _placed(report: dict, pid: Any) -> tuple:
    """The GPUs (NVML indices) engine ``pid`` works on, and those where it holds only a stray CUDA
    context (``{index: bytes}``), from NVML's process lists and torch's allocator. A GPU where the
    engine holds memory is a stray context when torch keeps nothing there and it is not torch's current
    device, or (torch unable to say) when the engine holds at most :data:`CONTEXT_MAX` there and more on
    another GPU."""
    held, unused, current = {}, {}, report.get("current_device")
    for entry in report["gpus"]:
        for proc in entry.get("processes", []):
            if proc["pid"] == pid:
                held[entry["nvml_index"]] = proc.get("used_memory") or 0
        torch = entry.get("torch") or {}
        if torch.get("reserved") is not None:  # unused: torch keeps nothing there and it is not current
            unused[entry["nvml_index"]] = not torch["reserved"] and entry["torch_index"] != current
    stray = {index: used for index, used in held.items()
             if (unused[index] if index in unused
                 else used <= CONTEXT_MAX and any(other > used for i, other in held.items() if i != index))}
    if len(stray) == len(held):  # one GPU, or nothing to tell the working GPU apart: call none stray
        return set(held), {}
    return set(held) - set(stray), stray


def _flags(report: ClusterGPUReport) -> list:
    flags = []
    for gpu in report.gpus:
        if gpu.get("stray"):
            holders = [e for e in report.engines
                       if e["host"] == gpu["host"] and any(i == gpu["index"] for i, _ in e.get("stray", []))]
            amounts = [used for e in holders for i, used in e["stray"] if i == gpu["index"]]
            one = len(holders) == 1
            default = ", the default GPU," if gpu["index"] == 0 else ""
            flags.append(Flag("stray_contexts", (
                f"{engine_list(gpu['stray'])} on {gpu['host']} hold{'s' * one} a CUDA context on GPU "
                f"{gpu['index']} besides the GPU {'it works' if one else 'they work'} on "
                f"({fmt_bytes(sum(amounts))} in all, about {fmt_bytes(sum(amounts) // len(amounts))} "
                "each): stray contexts, made when an engine touches CUDA (a tensor or model put on 'cuda', "
                f"a torch.cuda call) before choosing its own GPU, which lands on GPU {gpu['index']}{default} "
                "until then"), FIX_STRAY))
    for gpu in report.gpus:
        if len(gpu["engines"]) < 2:
            continue
        idle = [str(g["index"]) for g in report.gpus if g["host"] == gpu["host"] and not g["engines"]]
        said = f"{engine_list(gpu['engines'])} on {gpu['host']} share GPU {gpu['index']}"
        if idle:
            flags.append(Flag("shared_gpu", f"{said} while GPU{'s' * (len(idle) != 1)} {', '.join(idle)} on "
                              f"the same host sit{'s' * (len(idle) == 1)} idle", FIX_SHARED_IDLE))
        else:
            flags.append(Flag("shared_gpu", f"{said} ({gpu['name']})", FIX_SHARED_FULL))
    drivers: dict = {}
    for gpu in report.gpus:
        if gpu["driver"]:
            drivers.setdefault(gpu["driver"], set()).add(gpu["host"])
    if len(drivers) > 1:
        said = "; ".join(f"{d} on {', '.join(sorted(h))}" for d, h in sorted(drivers.items()))
        flags.append(Flag("drivers_differ", f"hosts run different NVIDIA drivers: {said}",
                          "install one driver version on every host, so every engine can run the same torch "
                          "build"))
    builds: dict = {}
    for e in report.engines:
        if e["ok"]:
            builds.setdefault("torch " + torch_build(e["report"]["environment"]), []).append(e["label"])
    if len(builds) > 1:
        said = "; ".join(f"{b} on {engine_list(labels)}" for b, labels in builds.items())
        flags.append(Flag("torch_builds_differ", f"engines run different torch builds: {said}",
                          "install the same torch build in every engine's environment (results and "
                          "speed differ between builds)"))
    cannot: dict = {}
    for e in report.engines:
        if e["ok"] and e["report"]["diagnosis"]:
            first = e["report"]["diagnosis"][0]
            cannot.setdefault((e["host"], first["message"], first["fix"]), []).append(e["label"])
    for (host, message, fix), labels in cannot.items():
        flags.append(Flag("torch_cannot_use_gpu",
                          f"{engine_list(labels)} on {host}: torch cannot use a GPU: {message}", fix))
    return flags + [Flag(f"engine_{e['problem']}", f"{e['label']} did not report: {e['message']}",
                         e.get("fix") or FIX_ENGINE.get(e["problem"], FIX_OTHER))
                    for e in report.engines if not e["ok"]]
