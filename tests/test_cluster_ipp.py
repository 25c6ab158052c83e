"""The magics across a real ipyparallel cluster: a controller and three engines on loopback, started here
and stopped in teardown (bounded time, no leftover processes). No mocks: the engines run our functions;
the only stand-in is the scripted NVML (tests/fake_pynvml.py) installed on the engines for the sharing
flag, as the single-process tests install it.

The engine-killing test runs last in this module: it takes one engine away.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from cluster_support import ROOT, TESTS, cluster_processes, import_package
from conftest import run, run_error

ipp = pytest.importorskip("ipyparallel")
psutil = pytest.importorskip("psutil")



def torch_has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def rc():
    """Three engines on loopback; the package importable there (PYTHONPATH, inherited) and torch loaded
    once, so the tests' time limits measure our calls, not torch's import."""
    with cluster_processes():
        cluster = ipp.Cluster(n=3, log_level=40)
        try:
            client = cluster.start_and_connect_sync()
            client.wait_for_engines(3, timeout=60, block=True)
            files = client[:].apply_sync(import_package)
            assert all(f.startswith(ROOT) for f in files), files  # this worktree's package, not another
            yield client
        finally:
            cluster.stop_cluster_sync()


@pytest.fixture
def sh(ip, rc):
    ip.user_ns["rc"] = rc
    return ip


# ---- %gpuinfo --cluster ------------------------------------------------------------------------

def test_gpuinfo_cluster_reports_every_engine(sh, rc):
    report = run(sh, "%gpuinfo --cluster rc -o")
    assert [e["label"] for e in report.engines] == [f"engine {i}" for i in rc.ids]
    assert all(e["ok"] for e in report.engines)
    assert {e["pid"] for e in report.engines} == set(rc[:].apply_sync(os.getpid))
    causes = [f.cause for f in report.flags]
    assert causes == ["torch_cannot_use_gpu"] or torch_has_cuda()
    if not torch_has_cuda():
        assert "CPU-only" in report.flags[0].message and "engines 0, 1, 2" in report.flags[0].message
        assert "install a CUDA build" in report.flags[0].fix
    text = sh.display_formatter.formatters["text/plain"](report)
    assert text.startswith("cluster rc (ipyparallel): 3 engines on 1 host") and "Engines" in text
    assert "<table" in report._repr_html_()
    json.dumps(report.to_dict())


def test_gpuinfo_cluster_without_name_and_json(sh, capsys):
    run(sh, "%gpuinfo --cluster --json --no-processes")
    data = json.loads(capsys.readouterr().out)
    assert data["name"] == "rc" and len(data["engines"]) == 3


def test_cluster_name_errors(sh, rc):
    from IPython.core.error import UsageError

    err = run_error(sh, "%gpuinfo --cluster nope")
    assert isinstance(err, UsageError) and "nope is not defined" in str(err)
    assert "rc (ipyparallel)" in str(err)
    sh.user_ns["view"] = rc[:]
    err = run_error(sh, "%gpuinfo --cluster")
    assert isinstance(err, UsageError) and "rc (ipyparallel), view (ipyparallel)" in str(err)
    report = run(sh, "%gpuinfo --cluster view -o")
    assert len(report.engines) == 3
    del sh.user_ns["rc"], sh.user_ns["view"]
    err = run_error(sh, "%gpuinfo --cluster")
    assert isinstance(err, UsageError) and "no ipyparallel Client/view or Dask Client" in str(err)
    err = run_error(sh, "%gpuinfo --cluster rc -i 0")
    assert isinstance(err, UsageError)


def _install_fake_nvml(tests: str, pids: list, spare: int) -> int:
    """On an engine: put the scripted NVML (eight A100s) where torchgpu_magic.gpus.nvml finds pynvml, with
    ``pids`` (two engines) on GPU 0 and ``spare`` (the third) on GPU 1."""
    import sys

    if tests not in sys.path:
        sys.path.insert(0, tests)
    import fake_pynvml

    from torchgpu_magic.gpus import nvml

    def edit(machine):
        machine.gpus[0].compute = [fake_pynvml.FakeProcess(pid, 2048 * fake_pynvml.MiB) for pid in pids]
        machine.gpus[1].compute = [fake_pynvml.FakeProcess(spare, 1024 * fake_pynvml.MiB)]

    sys.modules["_real_pynvml"] = sys.modules.get("pynvml")
    sys.modules["pynvml"] = fake_pynvml.make("eight_gpus", edit)
    nvml.reset()
    return len(pids)


def _remove_fake_nvml() -> None:
    import sys

    from torchgpu_magic.gpus import nvml

    real = sys.modules.pop("_real_pynvml", None)
    if real is not None:
        sys.modules["pynvml"] = real
    else:
        sys.modules.pop("pynvml", None)
    nvml.reset()


def test_gpuinfo_cluster_flags_engines_sharing_a_gpu(sh, rc):
    """Engines 0 and 1 on GPU 0, engine 2 on GPU 1, GPUs 2-7 idle (scripted NVML on every engine)."""
    pids = rc[:].apply_sync(os.getpid)
    rc[:].apply_sync(_install_fake_nvml, TESTS, pids[:2], pids[2])
    try:
        report = run(sh, "%gpuinfo --cluster rc -o")
    finally:
        rc[:].apply_sync(_remove_fake_nvml)
    assert len(report.gpus) == 8  # three engines saw the same eight GPUs: one row each, by host and UUID
    gpu0 = report.gpus[0]
    assert gpu0["index"] == 0 and gpu0["engines"] == ["engine 0", "engine 1"]
    assert report.gpus[1]["engines"] == ["engine 2"]
    shared = [f for f in report.flags if f.cause == "shared_gpu"]
    assert len(shared) == 1
    assert "engines 0, 1" in shared[0].message and "share GPU 0" in shared[0].message
    assert "GPUs 2, 3, 4, 5, 6, 7 on the same host sit idle" in shared[0].message
    assert "%ontorch local" in shared[0].fix and "CUDA_VISIBLE_DEVICES" in shared[0].fix
    assert "LocalCUDACluster" in shared[0].fix
    assert "drivers_differ" not in [f.cause for f in report.flags]
    text = report.to_text()
    assert "engine 0, engine 1" in text and "idle" in text
    procs = {(p[2], p[5]) for p in report.processes}
    assert (pids[0], "engine 0") in procs and (pids[2], "engine 2") in procs


def _second_host(on: bool, driver: str = "") -> None:
    """On an engine: stand in for a node of its own (its host name) whose driver is ``driver``."""
    import socket
    import sys

    if on:
        socket._torchgpu_saved = socket.gethostname
        socket.gethostname = lambda: "node2"
        sys.modules["pynvml"].machine.driver = driver
    else:
        socket.gethostname = socket._torchgpu_saved


def test_gpuinfo_cluster_flags_hosts_with_different_drivers(sh, rc):
    pids = rc[:].apply_sync(os.getpid)
    rc[:].apply_sync(_install_fake_nvml, TESTS, pids[:1], pids[1])
    rc[2].apply_sync(_second_host, True, "550.54.15")
    try:
        report = run(sh, "%gpuinfo --cluster rc -o")
    finally:
        rc[2].apply_sync(_second_host, False)
        rc[:].apply_sync(_remove_fake_nvml)
    assert "node2" in report.hosts and len(report.hosts) == 2
    assert len(report.gpus) == 16  # the same scripted UUIDs, but on two hosts: two GPUs each
    flag = next(f for f in report.flags if f.cause == "drivers_differ")
    assert "550.54.15 on node2" in flag.message and "570.172.08 on" in flag.message


def test_gpuinfo_cluster_flags_differing_torch_builds(sh, rc):
    rc[2].apply_sync(_fake_torch_version, "2.8.0+cu128")
    try:
        report = run(sh, "%gpuinfo --cluster rc -o")
    finally:
        rc[2].apply_sync(_fake_torch_version, None)
    flag = next(f for f in report.flags if f.cause == "torch_builds_differ")
    assert "2.8.0+cu128" in flag.message and "engine 2" in flag.message


def _fake_torch_version(version):
    """On an engine: make torch_view() report another torch version (or put the real one back)."""
    import torch

    saved = getattr(torch, "_torchgpu_saved_version", None)
    if version is None:
        torch.__version__ = saved
        return None
    torch._torchgpu_saved_version = torch.__version__
    torch.__version__ = version
    return None


# ---- %whereis --cluster --------------------------------------------------------------------------

def test_whereis_cluster_merges_by_name_and_flags_device_types(sh, rc):
    rc[:].execute("import torch; x = torch.ones(3); model = torch.nn.Linear(2, 2)", block=True)
    rc[1].execute("model = model.to('meta')", block=True)
    try:
        report = run(sh, "%whereis --cluster rc -o")
        assert report.where("x") == "cpu on engines 0, 1, 2"
        assert report.where("model") == "cpu on engines 0, 2; meta on engine 1"
        assert set(report.mixed()) == {"model"}
        text = report.to_text()
        assert "model lives on different device types on different engines" in text
        named = run(sh, "%whereis --cluster model")  # one cluster here: 'model' is a NAME
        assert named is None
        one = run(sh, "%whereis --cluster rc x missing_name -o")
        assert set(one.names) == {"x"} and one.missing == {"missing_name": ["engine 0", "engine 1",
                                                                            "engine 2"]}
    finally:
        rc[:].execute("del x, model", block=True)


# ---- %%cudatime --cluster ------------------------------------------------------------------------

def test_cudatime_cluster_rows_spread_and_straggler(sh, rc):
    rc[:].execute("import time; pause = 0.001", block=True)
    rc[2].execute("pause = 0.004", block=True)
    result = run(sh, "%%cudatime --cluster rc -n 2 -r 5 --warmup 1 -o\ntime.sleep(pause)")
    assert [label for label, _ in result.rows] == ["engine 0", "engine 1", "engine 2"]
    assert result.stragglers() == ["engine 2"]
    assert result.spread > 2
    assert all(r.n == 5 and r.loops == 2 for _, r in result.rows)
    text = sh.display_formatter.formatters["text/plain"](result)
    assert "straggler" in text and "spread: slowest / median" in text
    data = result.to_dict()
    assert data["stragglers"] == ["engine 2"] and len(data["rows"]) == 3
    from torchgpu_magic.timing import TimingComparison

    assert isinstance(result, TimingComparison)


def test_cudatime_cluster_rows_carry_each_engines_roofline(sh, rc):
    rc[:].execute("import torch; a = torch.ones(32, 32)", block=True)
    result = run(sh, "%%cudatime --cluster rc -n 1 -r 3 --warmup 0 --peak 1T,10G -o\ny = a @ a")
    assert all(r.roofline.flops == 2 * 32 ** 3 and r.roofline.peak_name == "--peak" for _, r in result.rows)
    text = sh.display_formatter.formatters["text/plain"](result)
    assert "achieved (% of peak)" in text and text.count("FLOP/s (") == 3
    assert result.to_dict()["rows"][0]["roofline"]["bound"] == "memory"
    skipped = run(sh, "%%cudatime --cluster rc -n 1 -r 3 --warmup 0 --no-roofline -o\ny = a @ a")
    assert all(r.roofline is None for _, r in skipped.rows) and "achieved" not in skipped.to_text()


def test_cudatime_cluster_reports_the_cells_error_per_engine(sh, rc):
    result = run(sh, "%%cudatime --cluster -n 1 -r 3 -o\nundefined_name_here")
    assert not result.rows and len(result.failed) == 3
    assert "NameError" in result.failed[0][1]


# ---- %%ontorch local -----------------------------------------------------------------------------

def _set_env(name, value):
    import os

    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _get_env(name):
    import os

    return os.environ.get(name)


def test_ontorch_local_with_local_rank_per_engine(sh, rc, capsys):
    for engine in rc.ids:
        rc[engine].apply_sync(_set_env, "LOCAL_RANK", str(engine))
    try:
        assignment = None
        run(sh, "%ontorch local --cluster rc")
        out = capsys.readouterr().out
        assert "LOCAL_RANK=2" in out
        from torchgpu_magic import cluster

        assignment = cluster.local_devices(cluster.connect(sh.user_ns, "rc"))
        hows = [row[3] for row in assignment.rows]
        assert all(f"LOCAL_RANK={i}" in how for i, how in zip(rc.ids, hows))
    finally:
        for engine in rc.ids:
            rc[engine].apply_sync(_set_env, "LOCAL_RANK", None)
    if not torch_has_cuda():
        assert {row[2] for row in assignment.rows} == {"cpu"}


def test_ontorch_local_cluster_order_without_launcher_variables(sh, rc):
    from torchgpu_magic import cluster, devices

    try:
        assignment = cluster.local_devices(cluster.connect(sh.user_ns, "rc"))
        hows = [row[3] for row in assignment.rows]
        for order, how in enumerate(hows):  # one host: orders 0, 1, 2 in engine order
            assert f"{devices.ORDER_VAR}={order}" in how
        orders = rc[:].apply_sync(_get_env, devices.ORDER_VAR)
        assert orders == ["0", "1", "2"]
    finally:
        rc[:].apply_sync(_set_env, devices.ORDER_VAR, None)


# ---- %gpumem --cluster ---------------------------------------------------------------------------

def test_gpumem_cluster_text_table(sh, rc):
    snap = run(sh, "%gpumem --cluster rc --text -o")
    assert [r["engine"] for r in snap.rows] == ["engine 0", "engine 1", "engine 2"]
    assert all(r["rss"] and r["rss"] > 0 for r in snap.rows)
    text = sh.display_formatter.formatters["text/plain"](snap)
    assert text.startswith("%gpumem --cluster") and "process RSS" in text


def test_gpumem_cluster_panel_peaks_per_cell_and_stop(sh, rc):
    import threading as th

    from torchgpu_magic.cluster.memory import THREAD_NAME

    run(sh, "%gpumem --cluster rc --widget --interval 0.2")
    try:
        assert any(t.name == THREAD_NAME for t in th.enumerate())
        live = sh.magics_manager.registry["GPUMemMagics"]._cluster_live

        def cell_and_wait(count):
            run(sh, "1 + 1")  # a notebook cell: its peaks per engine come on the next tick
            deadline = time.monotonic() + 15
            while len(live[0].latest.cells) < count and time.monotonic() < deadline:
                time.sleep(0.05)
            return live[0].latest

        cell_and_wait(1)  # the engines' peaks are reset from here
        rc[:].execute("import numpy; big = numpy.ones(32 * 2**20 // 8); del big", block=True)
        latest = cell_and_wait(2)
        label, peaks = latest.cells[-1]
        assert set(peaks) == {"engine 0", "engine 1", "engine 2"}
        rss = {r["engine"]: r["rss"] for r in latest.rows}
        for engine, peak in peaks.items():  # 32 MiB allocated and freed inside the cell, on every engine
            assert peak["peak_rss"] >= rss[engine] + 24 * 2**20, (engine, peak, rss[engine])
        assert "peak per cell and engine" in live[1].widget.value
    finally:
        run(sh, "%gpumem stop")
    assert not any(t.name == THREAD_NAME for t in th.enumerate())


# ---- engines that cannot answer ------------------------------------------------------------------

def _block_package(on: bool) -> None:
    """On an engine: make torchgpu_magic unimportable (as on an engine where it is not installed), or
    importable again."""
    import sys

    class Blocker:
        torchgpu_block = True

        def find_spec(self, name, path=None, target=None):
            if name == "torchgpu_magic" or name.startswith("torchgpu_magic."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "torchgpu_block", False)]
    if on:
        for name in [n for n in sys.modules if n == "torchgpu_magic" or n.startswith("torchgpu_magic.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, Blocker())


def test_engine_without_the_package(sh, rc):
    rc[1].apply_sync(_block_package, True)
    try:
        report = run(sh, "%gpuinfo --cluster rc -o")
    finally:
        rc[1].apply_sync(_block_package, False)
    rows = {e["label"]: e for e in report.engines}
    assert rows["engine 0"]["ok"] and rows["engine 2"]["ok"]
    assert not rows["engine 1"]["ok"] and rows["engine 1"]["problem"] == "no_package"
    assert "pip install torchgpu-magic" in rows["engine 1"]["message"]
    assert any(f.cause == "engine_no_package" for f in report.flags)
    assert "did not report" in report.headline()


def test_engine_killed_mid_call(sh, rc):
    """Last in the module: engine 2 is killed while the cell is being timed everywhere; its row says so,
    the others report, and the magic returns within its time limit."""
    pid = rc[2].apply_sync(os.getpid)
    rc[:].execute("import time", block=True)
    killer = threading.Timer(2.0, os.kill, (pid, signal.SIGKILL))
    start = time.monotonic()
    killer.start()
    try:
        result = run(sh, "%%cudatime --cluster rc -n 1 -r 40 --warmup 0 --timeout 20 -o\ntime.sleep(0.1)")
    finally:
        killer.cancel()
    assert time.monotonic() - start < 30
    assert [label for label, _ in result.rows] == ["engine 0", "engine 1"]
    (label, problem), = result.failed
    assert label == "engine 2" and problem.split(":")[0] in ("dead", "timeout")
    assert "engine 2" in result.to_text()
    after = run(sh, "%gpuinfo --cluster rc --timeout 10 -o")  # the next call still answers
    assert sum(e["ok"] for e in after.engines) == 2

