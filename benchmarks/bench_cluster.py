"""What the cluster forms cost, measured side by side in one run on local clusters (ipyparallel engines and
a Dask ``LocalCluster`` whose scheduler runs in this process, as when a notebook starts one).

Rows (arms interleaved round by round, medians reported; the machine is shared and noisy):

ipyparallel, N engines:
- ``%gpuinfo --cluster`` against one bare round trip to all N (``remote.ping``) plus the single-engine
  report time: target ratio <= 1.5;
- ``%gpumem --cluster``: this process's CPU time per tick (every thread: the sampler's and ipyparallel's
  I/O thread), less what it spends idle meanwhile; at 1 Hz, ms per tick / 10 is the % of one core (target
  <= 1 %). For the sampler as it is on all N engines and on half of them (the difference is the cost per
  engine), and for the 'before' arm (one apply per engine, the function shipped by value);
- a tick with one engine busy (a long task) against a tick with all idle: target ratio ~1 (the busy
  engine is not asked);
- bytes per engine per tick: what our request and reply carry (pickled arguments, the reply's value)
  and what ipyparallel's messages add (headers, metadata): target < 1 KB of ours;
- ``%%cudatime --cluster`` on all N at once against the same on one engine (and on 2).

Dask, W workers:
- ``%gpumem --cluster``, notebook-side CPU per tick with the scheduler in this process: one
  ``Client.run`` to all workers per tick (now) against one ``Client.run`` per worker, each from its own
  thread (before issue 23);
- a tick against a bare ``Client.run`` of an empty function to all workers (before: 1.8-3.7x);
- bytes per worker per tick (pickled request arguments and reply).

The magics on equal terms (``--only magics``; issue 30), 2 engines and 2 workers: ``%gpuinfo --cluster NAME
-o`` and ``%whereis --cluster NAME -o`` through a real InteractiveShell, each against the bare round trip
the user would otherwise make to the same engines, the arms alternated, median of the per-pair ratios:
``rc[:].apply_sync(lambda: 1)`` on ipyparallel (target <= 1.3; the rows above compare with the package's
own ping, which is not a bare round trip), ``client.run(lambda: 1)`` on Dask (target <= 1.5).

Run: ``PYTHONPATH=$PWD python benchmarks/bench_cluster.py [--engines 8] [--workers 4] [--rounds 5]
[--only ipyparallel|dask|magics] [--pairs 30]``. The engines and workers need this package importable:
they inherit this process's PYTHONPATH. Equal terms: both arms of a row ask the same engines or workers,
holding the same objects, in the same run.
"""
from __future__ import annotations

import argparse
import pickle
import statistics
import threading
import time
from typing import Any, Callable

from torchgpu_magic import cluster
from torchgpu_magic.cluster import dask_worker, remote
from torchgpu_magic.cluster.dask_bridge import DaskBridge
from torchgpu_magic.cluster.ipp_bridge import IPyParallelBridge
from torchgpu_magic.cluster.memory import ClusterSampler

CELL = "time.sleep(0.002)"
OPTIONS = {"loops": 5, "samples": 9, "warmup": 1, "max_time": 10.0}


class PerEngineBridge(IPyParallelBridge):
    """The ipyparallel 'before' arm: one ``apply_async`` per engine with the function itself (shipped by
    value), as the bridge sent before issue 14's follow-up."""

    def _send(self, live: list, replies: dict, target: str, args: tuple, kwargs: dict) -> list:
        return [([key], self.client[[key]].apply_async(remote.call, target, args, kwargs)) for key in live]


class ThreadPerWorkerBridge(DaskBridge):
    """The Dask 'before' arm: ``Client.run`` on each worker from its own daemon thread, joined with a
    deadline, as the bridge did before issue 23."""

    def run(self, target: str, *args: Any, timeout: float = 30.0, keys: Any = None, **kwargs: Any) -> list:
        from torchgpu_magic.cluster.bridge import Reply, envelope

        keys = self.engines() if keys is None else list(keys)
        done: dict = {}

        def ask(key: Any) -> None:
            try:
                done[key] = self.obj.run(remote.call, target, args, kwargs, workers=[key],
                                         on_error="return").get(key)
            except BaseException as exc:  # noqa: BLE001 - the arm reports it as its reply
                done[key] = exc

        threads = [threading.Thread(target=ask, args=(key,), daemon=True) for key in keys]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        replies = []
        for key, thread in zip(keys, threads):
            thread.join(max(0.0, deadline - time.monotonic()))
            reply = Reply(self.label(key), key, False)
            replies.append(envelope(reply, done[key]) if isinstance(done.get(key), dict) else reply)
        return replies


def _report_time() -> float:
    """On an engine: seconds to build the %gpuinfo report there."""
    import time

    from torchgpu_magic.gpus import inventory

    start = time.perf_counter()
    inventory.build_report()
    return time.perf_counter() - start


def _warm() -> None:
    import time  # noqa: F401 - the timed cell's module, in the engine's namespace below

    import torchgpu_magic.gpus.inventory  # noqa: F401
    from torchgpu_magic.cluster import remote

    remote.namespace()["time"] = __import__("time")


def _hold(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _noop() -> None:
    return None


def idle_rate(seconds: float = 2.0) -> float:
    """This process's CPU time over wall time while it sleeps (its own threads: the clients' I/O, an
    in-process scheduler's heartbeats)."""
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def cpu_per_tick(tick: Callable[[], Any], idle: float, ticks: int = 20) -> float:
    """CPU seconds this process spends per call of ``tick`` (all its threads: process time), less what
    it spends idle over the same wall time; ticks 50 ms apart, as a sampler's are apart."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(ticks):
        tick()
        time.sleep(0.05)
    return ((time.process_time() - cpu) - idle * (time.perf_counter() - wall)) / ticks


def per_tick(arms: dict, rounds: int) -> dict:
    """Median CPU seconds per tick of each arm, the arms interleaved round by round."""
    out: dict = {arm: [] for arm in arms}
    for _ in range(rounds):
        idle = idle_rate()
        for arm, tick in arms.items():
            out[arm].append(cpu_per_tick(tick, idle))
    return {arm: statistics.median(values) for arm, values in out.items()}


def ipp_bytes(rc: Any, target: str, args: tuple, replies: list) -> tuple:
    """(ours in, ours out, ipyparallel's in, ipyparallel's out): the bytes of one call of ``target``
    to one engine and of its reply, as ipyparallel frames them (its serialisation of our entry, the
    arguments and the answer; the session's header, parent header and metadata), split into what we
    send (pickled arguments and reply) and what ipyparallel adds; the replies' mean for the reply."""
    from ipyparallel.serialize import pack_apply_message, serialize_object

    session = rc.session
    request = pack_apply_message(remote.Entry(), (target, args, {}), {})
    ours_in = len(pickle.dumps(args))
    msg = session.msg("apply_request", content={}, metadata={"targets": [0], "engine": "x" * 36})
    frames_in = sum(len(session.pack(msg[part])) for part in ("header", "parent_header", "metadata",
                                                               "content")) + 64  # + signature, delimiter
    outs, frames_out = [], []
    for reply in replies:
        data = {"host": reply.host, "pid": reply.pid, "ok": reply.ok, "cpus": reply.cpus,
                "threads": reply.threads, "value": reply.value}
        outs.append(len(pickle.dumps(data)))
        answer = session.msg("apply_reply", content={"status": "ok"}, parent=msg,
                             metadata={"engine": "x" * 36, "started": "2026-01-01T00:00:00.000000Z"})
        frames_out.append(sum(len(b) for b in serialize_object(data)) + 64 + sum(
            len(session.pack(answer[part])) for part in ("header", "parent_header", "metadata", "content")))
    return (ours_in, statistics.mean(outs), frames_in + sum(len(b) for b in request) - ours_in,
            statistics.mean(frames_out) - statistics.mean(outs))


def bench_ipyparallel(args: argparse.Namespace) -> None:
    import ipyparallel as ipp

    ipc = ipp.Cluster(n=args.engines, log_level=40)
    rc = ipc.start_and_connect_sync()
    try:
        rc.wait_for_engines(args.engines, timeout=300, block=True)
        rc[:].apply_sync(_warm)
        bridge = cluster.connect({"rc": rc}, "rc")
        one = cluster.connect({"one": rc[0]}, "one")
        cluster.gpu_report(bridge)  # first call: imports on the engines
        ping, single, full = [], [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            bridge.run("ping")
            ping.append(time.perf_counter() - start)
            single.append(rc[0].apply_sync(_report_time))
            start = time.perf_counter()
            cluster.gpu_report(bridge)
            full.append(time.perf_counter() - start)
        p, s, f = (statistics.median(x) for x in (ping, single, full))
        print(f"ipyparallel, {args.engines} engines")
        print(f"  %gpuinfo --cluster: {f * 1e3:.1f} ms; bare round trip {p * 1e3:.1f} ms + one engine's "
              f"report {s * 1e3:.1f} ms = {(p + s) * 1e3:.1f} ms; ratio {f / (p + s):.2f} (target <= 1.5)")

        n, half = args.engines, args.engines // 2
        now = ClusterSampler(IPyParallelBridge("rc", rc), 1.0)
        now.tick(60)
        part = ClusterSampler(IPyParallelBridge("half", rc[:half]), 1.0)
        old = PerEngineBridge("rc", rc)  # the tick before: every engine, one apply each, in full
        arms = {"one apply per engine (before)": lambda: old.run("memory_tick", None, None, timeout=5),
                f"now, {half} engines on 1 host": part.tick,
                f"now, {n} engines on 1 host": now.tick,
                # every engine as its own host (each reports itself): what a tick costs per host
                f"{half} hosts": lambda: bridge.run("host_tick", {}, timeout=5, only=rc.ids[:half]),
                f"{n} hosts": lambda: bridge.run("host_tick", {}, timeout=5, only=rc.ids)}
        for tick in arms.values():
            tick()
        costs = per_tick(arms, args.rounds)
        said = "; ".join(f"{arm} {cost * 1e3:.2f} ms" for arm, cost in costs.items())
        v = list(costs.values())
        engine, host = (v[2] - v[1]) / (n - half), (v[4] - v[3]) / (n - half)
        base = v[2] - n * engine  # one host's call, the controller's queue counts, the sampler's own work
        at64 = base + 64 * engine + 7 * host
        print(f"  %gpumem --cluster, notebook-side CPU per tick (all threads, less idle): {said}")
        print(f"    per engine {engine * 1e3:.3f} ms, per host {host * 1e3:.2f} ms, the rest "
              f"{base * 1e3:.2f} ms; at 1 Hz: {n} engines on 1 host {v[2] * 100:.2f} % of one core, before "
              f"{v[0] * 100:.2f} %; 64 engines on 8 hosts, from these: {at64 * 100:.2f} % (target <= 1 %)")

        sampler = ClusterSampler(IPyParallelBridge("rc", rc), 1.0)
        sampler.tick(60)
        last = rc.ids[-1]  # not the engine reporting the host
        calm, busy = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            sampler.tick()
            calm.append(time.perf_counter() - start)
            task = rc[last].apply_async(_hold, 3.0)
            while not rc.queue_status()[last]["queue"]:
                time.sleep(0.01)
            start = time.perf_counter()
            sampler.tick()
            busy.append(time.perf_counter() - start)
            task.get()
        c, b = statistics.median(calm), statistics.median(busy)
        print(f"  a tick with engine {last} busy: {b * 1e3:.1f} ms; all idle {c * 1e3:.1f} ms; ratio "
              f"{b / c:.2f} (target ~1: the busy engine is not asked)")

        pids, reporters = sampler._pids(), dict(sampler._reporters)
        leader = next(iter(sampler._leaders().values()))
        hosted = bridge.run("host_tick", pids, only=[leader])
        host_in, host_out, host_fin, host_fout = ipp_bytes(rc, "host_tick", (pids,),
                                                           [r for r in hosted if r.value is not None])
        queue = len(rc.session.pack({str(e): {"queue": 0, "completed": 12345, "tasks": 0} for e in rc.ids}))
        cells = [sampler._token, 1]
        full = bridge.run("memory_tick", reporters, cells)
        full_in, full_out, full_fin, full_fout = ipp_bytes(rc, "memory_tick", (reporters, cells),
                                                           [r for r in full if "gpus" not in r.value])
        mine = (host_in + host_out + queue) / n
        print(f"  bytes per tick: to the host's engine {host_in} in + {host_out:.0f} out for {n} engines, "
              f"controller's queue counts {queue} ({mine:.0f} per engine of ours; ipyparallel adds "
              f"{host_fin + host_fout:.0f} per host and call); after a cell, per engine {full_in} in + "
              f"{full_out:.0f} out (ipyparallel adds {full_fin + full_fout:.0f}) (target < 1 KB of ours per "
              "engine)")

        two = cluster.connect({"two": rc[:2]}, "two")
        alone, pair, everywhere = [], [], []
        for _ in range(args.rounds):
            for arm, out in ((one, alone), (two, pair), (bridge, everywhere)):
                start = time.perf_counter()
                cluster.time_cell(arm, "", CELL, OPTIONS)
                out.append(time.perf_counter() - start)
        a, t, e = statistics.median(alone), statistics.median(pair), statistics.median(everywhere)
        print(f"  %%cudatime --cluster: one engine {a * 1e3:.0f} ms; 2 engines {t * 1e3:.0f} ms "
              f"({(t / a - 1) * 100:+.1f} %); {args.engines} engines {e * 1e3:.0f} ms "
              f"({(e / a - 1) * 100:+.1f} %) (target <= +5 %; engines beyond the cores share them)")
    finally:
        ipc.stop_cluster_sync()


def bench_dask(args: argparse.Namespace) -> None:
    import distributed

    local = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                     dashboard_address=None, silence_logs=40)
    client = distributed.Client(local)
    try:
        client.run(_warm)
        bridge = DaskBridge("client", client)
        before = ThreadPerWorkerBridge("client", client)
        now = ClusterSampler(bridge, 1.0)
        now.tick(60)
        keys = bridge.engines()
        arms = {"a thread and a Client.run per worker (before)": lambda: before.run("memory_tick", None, None,
                                                                                     timeout=5),
                f"now, {args.workers} workers on 1 host": now.tick,
                f"{args.workers} hosts (each worker its own)": lambda: bridge.run("host_tick", {}, timeout=5,
                                                                                   only=keys)}
        for tick in arms.values():
            tick()
        costs = per_tick(arms, args.rounds)
        said = "; ".join(f"{arm} {cost * 1e3:.2f} ms" for arm, cost in costs.items())
        v = list(costs.values())
        host = (v[2] - v[1]) / max(1, args.workers - 1)
        print(f"Dask, {args.workers} workers (scheduler in this process: its work for our calls counts)")
        print(f"  %gpumem --cluster, notebook-side CPU per tick (all threads, less idle): {said}")
        print(f"    per host {host * 1e3:.2f} ms; at 1 Hz now {v[1] * 100:.2f} % of one core, before "
              f"{v[0] * 100:.2f} %; 64 workers on 8 hosts, from these: {(v[1] + 7 * host) * 100:.2f} % "
              f"(target <= 1 %)")

        sampler = ClusterSampler(bridge, 1.0)
        sampler.tick(60)
        bare, now, old = [], [], []
        for _ in range(args.rounds * 2):
            for arm, out in ((lambda: client.run(_noop), bare), (sampler.tick, now),
                             (lambda: before.run("memory_tick", None, None), old)):
                start = time.perf_counter()
                arm()
                out.append(time.perf_counter() - start)
        b, n, o = statistics.median(bare), statistics.median(now), statistics.median(old)
        print(f"  a tick: {n * 1e3:.1f} ms, {n / b:.2f}x a bare Client.run to all ({b * 1e3:.1f} ms); "
              f"before {o * 1e3:.1f} ms, {o / b:.2f}x")

        replies = bridge.run("memory_tick", None, [sampler._token, 0])
        sent = len(pickle.dumps((dask_worker.dask_call, ("memory_tick", (None, [sampler._token, 0]), {}, 4.0,
                                                         "0" * 32, dask_worker.process_group()))))
        back = statistics.mean(len(pickle.dumps({"host": r.host, "pid": r.pid, "ok": r.ok, "cpus": r.cpus,
                                                 "threads": r.threads, "value": r.value})) for r in replies)
        print(f"  bytes per worker per tick: {sent} in (the function by reference and its arguments), "
              f"{back:.0f} out (target < 1 KB)")
    finally:
        client.close()
        local.close()


def _one() -> int:
    return 1


def _magic_rows(label: str, shell: Any, name: str, bare: Callable[[], Any], pairs: int,
                target: float) -> None:
    """``%gpuinfo --cluster NAME -o`` and ``%whereis --cluster NAME -o`` against ``bare``, alternated."""
    arms = {"bare": bare,
            "%gpuinfo --cluster": lambda: shell.run_line_magic("gpuinfo", f"--cluster {name} -o"),
            "%whereis --cluster": lambda: shell.run_line_magic("whereis", f"--cluster {name} -o")}
    for arm in arms.values():  # first calls apart: imports on both sides, the bridge's first look
        for _ in range(3):
            arm()
    times: dict = {arm: [] for arm in arms}
    order = list(arms)
    for round_ in range(pairs):
        # the bare call first, the magics in turn after it: neither magic always follows the bare call
        for arm in order[:1] + (order[1:] if round_ % 2 else order[:0:-1]):
            start = time.perf_counter()
            arms[arm]()
            times[arm].append(time.perf_counter() - start)
    base = times["bare"]
    print(f"{label}: bare {statistics.median(base) * 1e3:.2f} ms")
    for arm in list(arms)[1:]:
        ratio = statistics.median(a / b for a, b in zip(times[arm], base))
        verdict = "met" if ratio <= target else "MISSED"
        took = statistics.median(times[arm]) * 1e3
        print(f"  {arm:<20} {took:7.2f} ms  {ratio:.2f}x (target <= {target:g}: {verdict})")


def bench_magics(args: argparse.Namespace) -> None:
    """The two report magics against a bare round trip to the same 2 engines / 2 workers (issue 30)."""
    import distributed
    import ipyparallel as ipp
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "torchgpu_magic")
    ipc = ipp.Cluster(n=2, log_level=40)
    rc = ipc.start_and_connect_sync()
    try:
        rc.wait_for_engines(2, timeout=300, block=True)
        rc[:].apply_sync(_warm)
        shell.user_ns["rc"] = rc
        _magic_rows("ipyparallel, 2 engines, against rc[:].apply_sync(lambda: 1)", shell, "rc",
                    lambda: rc[:].apply_sync(_one), args.pairs, 1.3)
    finally:
        shell.user_ns.pop("rc", None)
        ipc.stop_cluster_sync()
    local = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None, silence_logs=40)
    client = distributed.Client(local)
    try:
        client.run(_warm)
        shell.user_ns["client"] = client
        _magic_rows("Dask, 2 workers, against client.run(lambda: 1)", shell, "client",
                    lambda: client.run(_one), args.pairs, 1.5)
    finally:
        shell.user_ns.pop("client", None)
        client.close()
        local.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=100, help="alternated calls per arm of the magics rows")
    parser.add_argument("--only", choices=("ipyparallel", "dask", "magics"), default=None)
    args = parser.parse_args()
    import os

    print(f"load average before: {os.getloadavg()[0]:.2f}")
    if args.only in (None, "magics"):
        bench_magics(args)
    if args.only in (None, "ipyparallel"):
        bench_ipyparallel(args)
    if args.only in (None, "dask"):
        bench_dask(args)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
