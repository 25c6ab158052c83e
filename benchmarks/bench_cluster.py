"""What the cluster forms cost, measured side by side in one run on a local ipyparallel cluster.

Rows (arms interleaved, round by round, medians reported; the machine is shared and noisy):
- ``%gpuinfo --cluster`` on N engines against one bare round trip to all N (``remote.ping``) plus the
  single-engine report time (``inventory.build_report`` timed on an engine): target ratio <= 1.5;
- ``%gpumem --cluster`` at 1 Hz with N engines: this process's CPU time over wall time while the main
  thread sleeps, minus an idle window: target <= 1 % of one core; the bridge as it is (one apply to all
  engines per tick) against the one it replaced (one apply per engine, kept here as the 'before' arm);
- ``%%cudatime --cluster`` (the cell timed on all N at once, fixed loops and samples) against the same
  ``%%cudatime`` on one engine: target <= 5 % added; also on 2 engines, since on a 2-core machine N > 2
  engines share the cores and time each other's CPU work.

Run: ``PYTHONPATH=$PWD python benchmarks/bench_cluster.py [--engines 8] [--rounds 5] [--window 10]``.
The engines need this package importable: they inherit this process's PYTHONPATH. Equal terms: both
arms of a row ask the same engines, holding the same objects, in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import ipyparallel as ipp

from torchgpu_magic import cluster
from torchgpu_magic.cluster.bridge import IPyParallelBridge
from torchgpu_magic.cluster.memory import ClusterSampler

CELL = "time.sleep(0.002)"
OPTIONS = {"loops": 5, "samples": 9, "warmup": 1, "max_time": 10.0}


class PerEngineBridge(IPyParallelBridge):
    """The 'before' arm: one ``apply_async`` per engine, as the bridge sent before issue 14's follow-up."""

    def _send(self, live: list, replies: dict, target: str, args: tuple, kwargs: dict) -> list:
        from torchgpu_magic.cluster import remote

        return [([key], self.client[[key]].apply_async(remote.call, target, args, kwargs)) for key in live]


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
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
        print(f"%gpuinfo --cluster, {args.engines} engines: {f * 1e3:.1f} ms; bare round trip "
              f"{p * 1e3:.1f} ms + one engine's report {s * 1e3:.1f} ms = {(p + s) * 1e3:.1f} ms; "
              f"ratio {f / (p + s):.2f} (target <= 1.5)")

        before = PerEngineBridge("rc", rc)
        arms = {"idle": None, "per engine": before, "one apply": bridge}
        shares: dict = {arm: [] for arm in arms}
        for _ in range(max(2, args.rounds // 2)):
            for arm, through in arms.items():
                sampler = None if through is None else ClusterSampler(through, 1.0)
                if sampler is not None:
                    sampler.start()
                cpu, wall = time.process_time(), time.perf_counter()
                time.sleep(args.window)
                share = (time.process_time() - cpu) / (time.perf_counter() - wall)
                if sampler is not None:
                    sampler.stop()
                shares[arm].append(share)
        idle, old, new = (statistics.median(shares[arm]) for arm in shares)
        print(f"%gpumem --cluster at 1 Hz, {args.engines} engines: notebook-side CPU, idle "
              f"{idle * 100:.3f} % of one core; per-engine applies before: +{(old - idle) * 100:.3f} %; "
              f"one apply to all now: +{(new - idle) * 100:.3f} % (target <= 1 %)")

        two = cluster.connect({"two": rc[:2]}, "two")
        alone, pair, everywhere = [], [], []
        for _ in range(args.rounds):
            for arm, out in ((one, alone), (two, pair), (bridge, everywhere)):
                start = time.perf_counter()
                cluster.time_cell(arm, "", CELL, OPTIONS)
                out.append(time.perf_counter() - start)
        a, t, e = statistics.median(alone), statistics.median(pair), statistics.median(everywhere)
        print(f"%%cudatime --cluster: one engine {a * 1e3:.0f} ms; 2 engines {t * 1e3:.0f} ms "
              f"({(t / a - 1) * 100:+.1f} %); {args.engines} engines {e * 1e3:.0f} ms "
              f"({(e / a - 1) * 100:+.1f} %) (target <= +5 %; engines beyond the cores share them)")
    finally:
        ipc.stop_cluster_sync()


if __name__ == "__main__":
    main()
