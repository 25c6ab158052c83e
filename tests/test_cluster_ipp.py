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
from cluster_support import (
    ROOT,
    TESTS,
    cluster_processes,
    errors,
    execute,
    gpuinfo_here,
    import_package,
    kernel,
    settle_threads,
    threads,
)
from conftest import run, run_error

ipp = pytest.importorskip("ipyparallel")
psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.engines


def torch_has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def ipc():
    """Three engines on loopback; the package importable there (PYTHONPATH, inherited) and torch loaded
    once, so the tests' time limits measure our calls, not torch's import."""
    with cluster_processes():
        cluster = ipp.Cluster(n=3, log_level=40)
        try:
            client = cluster.start_and_connect_sync()
            client.wait_for_engines(3, timeout=60, block=True)
            files = client[:].apply_sync(import_package)
            assert all(f.startswith(ROOT) for f in files), files  # this worktree's package, not another
            yield cluster, client
        finally:
            cluster.stop_cluster_sync()


@pytest.fixture(scope="module")
def rc(ipc):
    return ipc[1]


@pytest.fixture(autouse=True)
def no_leftovers(rc, request):
    """Every test leaves no thread of its own behind (a sampler, a client we connected) and every
    engine idle (nothing of ours still queued or running there); the engine-killing test's dead engine
    keeps its queue until the controller notices, so only the live engines are checked after it."""
    before = threads()
    yield
    assert settle_threads(before) == [], "threads left behind"
    skip = {2} if request.node.name == "test_engine_killed_mid_call" else set()

    def queued() -> list:
        return [k for k, s in rc.queue_status().items() if k != "unassigned" and k not in skip and s["queue"]]

    deadline = time.monotonic() + 10
    while queued() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not queued(), f"requests left on the engines: {_left(rc, skip)}"


def _queued(rc) -> list:
    """The engines the controller counts requests queued or running on."""
    return [k for k, s in rc.queue_status().items() if k != "unassigned" and s["queue"]]


def _left(rc, skip: set) -> list:
    """What the controller still counts as queued on each engine: the request's id and type, whether
    this client sent it (and still waits for it), and its submission and completion as recorded."""
    found = []
    for key, status in rc.queue_status(verbose=True).items():
        if key == "unassigned" or key in skip:
            continue
        for msg_id in status["queue"]:
            records = rc.db_query({"msg_id": msg_id}, keys=["header", "submitted", "completed"])
            record = records[0] if records else {}
            found.append((key, msg_id, (record.get("header") or {}).get("msg_type"), msg_id in rc.history,
                          msg_id in rc.outstanding, record.get("submitted"), record.get("completed")))
    return found


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
    # asked on an engine: under a simulated machine the test process is not the engines' machine
    engine_has_cuda, first = rc[0].apply_sync(gpuinfo_here)
    assert causes == ["torch_cannot_use_gpu"] or engine_has_cuda
    if not engine_has_cuda:
        # the engines run on one machine: their first cause is the one %gpuinfo gives on each
        message, fix = first
        assert "engines 0, 1, 2" in report.flags[0].message and message in report.flags[0].message
        assert report.flags[0].fix == fix
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
    sh.user_ns["x"] = 3
    err = run_error(sh, "%gpuinfo --cluster x")
    assert isinstance(err, UsageError) and "x is a int, not an ipyparallel" in str(err)
    del sh.user_ns["rc"], sh.user_ns["x"]
    err = run_error(sh, "%gpuinfo --cluster")
    assert isinstance(err, UsageError) and "no ipyparallel Client/view/Cluster or Dask Client" in str(err)
    sh.user_ns["rc"] = rc
    err = run_error(sh, "%gpuinfo --cluster rc -i 0")
    assert isinstance(err, UsageError)


def test_bare_cluster_with_a_client_and_its_views(sh, rc):
    """``rc`` and ``dv = rc[:]`` are one cluster: bare --cluster takes the view %px runs on when it is
    one of them, else the Client (every engine), instead of asking for a name."""
    sh.user_ns["dv"] = rc[:]
    sh.user_ns["two"] = rc[:2]
    report = run(sh, "%gpuinfo --cluster -o")
    assert report.name == "rc" and len(report.engines) == 3
    saved = sh.magics_manager.magics["line"].get("px")
    sh.user_ns["two"].activate()  # %px now runs on engines 0 and 1
    try:
        report = run(sh, "%gpuinfo --cluster -o")
        assert report.name == "two" and [e["label"] for e in report.engines] == ["engine 0", "engine 1"]
    finally:
        if saved is not None:
            sh.magics_manager.register(saved.__self__)


def test_cluster_object_as_name_and_the_client_connected_for_it(sh, rc, ipc):
    """--cluster NAME on the README's own ``ipp.Cluster`` variable: its client in the namespace is used;
    without one, a client is connected once, reused, and closed at %unload_ext."""
    from torchgpu_magic.cluster import find

    sh.user_ns["cluster"] = ipc[0]
    report = run(sh, "%gpuinfo --cluster cluster -o")
    assert report.name == "cluster" and len(report.engines) == 3 and not find._OWNED
    del sh.user_ns["rc"]
    report = run(sh, "%gpuinfo --cluster cluster -o")
    assert len(report.engines) == 3 and len(find._OWNED) == 1
    (_, own), = find._OWNED.values()
    assert own is not rc
    run(sh, "%whereis --cluster cluster -o")
    assert find._OWNED and list(find._OWNED.values())[0][1] is own  # reused, not one per call
    from torchgpu_magic import load_ipython_extension, unload_ipython_extension

    unload_ipython_extension(sh)
    assert not find._OWNED and own._closed
    load_ipython_extension(sh)


def test_cudatime_cluster_setup_is_not_read_as_the_name(sh, rc):
    result = run(sh, "%%cudatime -n 1 -r 3 --warmup 0 -o --cluster y = 20\ny + 1")
    assert [label for label, _ in result.rows] == ["engine 0", "engine 1", "engine 2"], result.failed
    result = run(sh, "%%cudatime --cluster rc -n 1 -r 3 --warmup 0 -o\n1 + 1")
    assert len(result.rows) == 3


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


def _install_stray_contexts(tests: str, pids: list) -> None:
    """On an engine: the scripted NVML (eight A100s) with engine ``i`` working on GPU ``i`` (10 GiB) and
    engines 1 and 2 also holding a bare 500 MiB context on GPU 0: the classic of engines that touched
    cuda:0 before choosing their GPU."""
    import sys

    if tests not in sys.path:
        sys.path.insert(0, tests)
    import fake_pynvml

    from torchgpu_magic.gpus import nvml

    def edit(machine):
        for i, pid in enumerate(pids):
            machine.gpus[i].compute = [fake_pynvml.FakeProcess(pid, 10240 * fake_pynvml.MiB)]
            machine.gpus[i].utilization = (30 + 10 * i, 5)
        machine.gpus[0].compute += [fake_pynvml.FakeProcess(pid, 500 * fake_pynvml.MiB) for pid in pids[1:]]

    sys.modules["_real_pynvml"] = sys.modules.get("pynvml")
    sys.modules["pynvml"] = fake_pynvml.make("eight_gpus", edit)
    nvml.reset()


def test_stray_contexts_on_gpu0_are_named_as_such(sh, rc):
    pids = rc[:].apply_sync(os.getpid)
    rc[:].apply_sync(_install_stray_contexts, TESTS, pids)
    try:
        report = run(sh, "%gpuinfo --cluster rc -o")
        memory = run(sh, "%gpumem --cluster rc --text -o")
    finally:
        rc[:].apply_sync(_remove_fake_nvml)
    causes = [f.cause for f in report.flags]
    assert "shared_gpu" not in causes, report.to_text()
    (flag,) = [f for f in report.flags if f.cause == "stray_contexts"]
    assert "engines 1, 2 on" in flag.message and "GPU 0" in flag.message
    assert "1000 MiB in all" in flag.message and "500 MiB each" in flag.message
    assert "stray contexts" in flag.message
    assert "set_device" in flag.fix and "CUDA_VISIBLE_DEVICES" in flag.fix
    assert [e["on"] for e in report.engines] == [[0], [1], [2]]
    assert report.gpus[0]["engines"] == ["engine 0"] and report.gpus[0]["stray"] == ["engine 1", "engine 2"]
    text = sh.display_formatter.formatters["text/plain"](report)
    assert "stray contexts of engines 1, 2" in text and "30 %" in text
    # %gpumem --cluster: eight GPU rows (by host and UUID, not one set per engine), utilisation on each,
    # each engine under the GPU it uses
    assert len(memory.gpus) == 8 and [g["util"] for g in memory.gpus[:3]] == [30, 40, 50]
    assert [g["engines"] for g in memory.gpus[:4]] == [["engine 0", "engine 1", "engine 2"], ["engine 1"],
                                                       ["engine 2"], []]
    text = sh.display_formatter.formatters["text/plain"](memory)
    assert text.startswith("%gpumem --cluster: 3 engines on 1 host, 8 GPUs")
    assert "GPU 0  NVIDIA A100-SXM4-80GB" in text and "  engine 1" in text and "idle" in text


def test_one_engine_per_host_reports_its_gpus(sh, rc):
    """After the first tick, the host's GPUs travel once per tick: only the engine chosen as the host's
    reporter sends them; the others send their own figures only."""
    from torchgpu_magic import cluster

    pids = rc[:].apply_sync(os.getpid)
    host = rc[0].apply_sync(__import__("socket").gethostname)
    rc[:].apply_sync(_install_stray_contexts, TESTS, pids)
    try:
        bridge = cluster.connect(sh.user_ns, "rc")
        every = bridge.run("memory_tick", None, None)
        one = bridge.run("memory_tick", {host: pids[1]}, None)
    finally:
        rc[:].apply_sync(_remove_fake_nvml)
    assert all(r.ok and len(r.value["gpus"]) == 8 for r in every), [r.error_text() for r in every]
    assert all(r.ok for r in one), [r.error_text() for r in one]
    assert ["gpus" in r.value for r in one] == [False, True, False]
    assert all(len(repr(r.value)) < 1024 for r in one if "gpus" not in r.value)


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


def test_torch_distributed_ranks_beside_their_gpus(sh, rc):
    """The torch.distributed route: engines joined into a process group (gloo on loopback, as the
    notebook does) show their ranks in %gpuinfo --cluster."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rc[:].scatter("rank", list(range(len(rc.ids))), flatten=True, block=True)
    rc[:].push({"world": len(rc.ids), "port": port}, block=True)
    rc[:].execute("import torch.distributed as dist\n"
                  "dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, "
                  "world_size=world)", block=True)
    try:
        report = run(sh, "%gpuinfo --cluster rc -o")
    finally:
        rc[:].execute("dist.destroy_process_group(); del rank, world, port", block=True)
    assert [e["report"]["dist"] for e in report.engines] == [
        {"rank": r, "world_size": 3, "backend": "gloo"} for r in range(3)]
    text = report.to_text()
    assert "rank" in text.split("Engines")[1].splitlines()[1] and "2 of 3 (gloo)" in text


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

def test_cudatime_cluster_rows_spread_and_crowded_cpu_engines(sh, rc):
    """Three CPU engines on this 2-core host, each with torch's default threads: the slow one is not
    called a straggler with GPU advice; the report says the host is oversubscribed."""
    rc[:].execute("import time; pause = 0.002", block=True)
    rc[2].execute("pause = 0.02", block=True)
    result = run(sh, "%%cudatime --cluster rc -n 2 -r 5 --warmup 1 -o\ntime.sleep(pause)")
    assert [label for label, _ in result.rows] == ["engine 0", "engine 1", "engine 2"]
    assert result.stragglers() == ["engine 2"]
    assert result.spread > 2
    assert all(r.n == 5 and r.loops == 2 for _, r in result.rows)
    text = sh.display_formatter.formatters["text/plain"](result)
    assert "spread: slowest / median" in text and "slower" in text
    assert "straggler" not in text and "GPU?" not in text
    assert "the engines time on the CPU and share too few cores (host " in text
    assert "runs 3 engines x torch threads" in text and "torch.set_num_threads" in text
    data = result.to_dict()
    assert data["stragglers"] == ["engine 2"] and len(data["rows"]) == 3
    (crowded,) = data["crowded_hosts"].values()
    assert crowded["engines"] == 3 and crowded["threads"] > crowded["cpus"]
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


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs for two one-thread engines")
def test_cudatime_cluster_straggler_on_cpus_enough(sh, rc):
    """Two one-thread engines on two CPUs: the slow one is a straggler, with CPU advice, not GPU advice."""
    rc[:2].execute("import time, torch; saved = torch.get_num_threads(); torch.set_num_threads(1); "
                   "pause = 0.002", block=True)
    rc[1].execute("pause = 0.02", block=True)
    sh.user_ns["two"] = rc[:2]
    try:
        result = run(sh, "%%cudatime --cluster two -n 2 -r 5 --warmup 1 -o\ntime.sleep(pause)")
    finally:
        rc[:2].execute("torch.set_num_threads(saved)", block=True)
    text = result.to_text()
    assert result.stragglers() == ["engine 1"] and "straggler: engine 1" in text
    assert "a slower CPU, or other work on its host?" in text and "GPU" not in text.split("spread:")[1]


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


# ---- busy engines ---------------------------------------------------------------------------------

def _hold(seconds: float) -> int:
    """On an engine: a long task (a %px training loop) that peaks 48 MiB above its start."""
    import time

    block = bytearray(48 * 2**20)
    block[::4096] = b"1" * len(block[::4096])
    time.sleep(seconds)
    del block
    return 1


def _wait_busy(rc, engine: int) -> None:
    deadline = time.monotonic() + 10
    while not rc.queue_status()[engine]["queue"]:
        assert time.monotonic() < deadline, "the engine never started the task"
        time.sleep(0.05)


def test_busy_engine_is_not_asked_and_says_since_when(sh, rc):
    busy = rc[1].apply_async(_hold, 4.0)
    _wait_busy(rc, 1)
    report = run(sh, "%gpuinfo --cluster rc -o")
    whereis = run(sh, "%whereis --cluster rc -o")
    # no wait on the busy engine: it was never asked (asked, it would answer after its task or time out)
    rows = {e["label"]: e for e in report.engines}
    assert rows["engine 0"]["ok"] and rows["engine 2"]["ok"]
    assert rows["engine 1"]["problem"] == "busy" and rows["engine 1"]["message"].startswith("busy since ")
    assert "%px cell or task runs there" in rows["engine 1"]["message"]
    assert ("engine 1", rows["engine 1"]["message"]) in [(lb, p) for lb, p in whereis.failed]
    assert rc.queue_status()[1]["queue"] == 1  # nothing of ours queued behind the task
    busy.get(10)


def test_the_controller_is_not_asked_where_the_clients_record_says(sh, rc, monkeypatch):
    """Engines all idle, or one busy with this client's own task: the call asks the controller nothing
    (the client's record says which engines have its work pending), and still says which is busy."""
    from torchgpu_magic.cluster.ipp_bridge import IPyParallelBridge

    run(sh, "%whereis --cluster rc -o")  # the engines' first call apart: it may take past the grace
    asked = []
    ask = IPyParallelBridge._ask
    monkeypatch.setattr(IPyParallelBridge, "_ask", lambda self, keys: asked.append(keys) or ask(self, keys))
    assert not run(sh, "%whereis --cluster rc -o").failed
    busy = rc[1].apply_async(_hold, 2.0)
    _wait_busy(rc, 1)
    (label, problem), = run(sh, "%whereis --cluster rc -o").failed
    assert label == "engine 1" and problem.startswith("busy since "), problem
    assert asked == []
    busy.get(10)


def test_an_engine_busy_with_another_clients_task_gets_ours_withdrawn(sh, rc, ipc):
    """Work this client does not know of (another notebook's client) is seen in the controller's counts
    only, which the call reads while its request travels: that engine's request is withdrawn (aborted,
    so it never runs behind the task), its row says busy, and the next call does not ask it at all."""
    other = ipc[0].connect_client_sync()
    try:
        busy = other[1].apply_async(_hold, 4.0)
        _wait_busy(rc, 1)
        report = run(sh, "%gpuinfo --cluster rc -o")
        whereis = run(sh, "%whereis --cluster rc -o")
        rows = {e["label"]: e for e in report.engines}
        assert rows["engine 0"]["ok"] and rows["engine 2"]["ok"]
        assert rows["engine 1"]["message"].startswith("busy since at least ")
        assert rows["engine 1"]["message"].endswith(
            "our request was withdrawn, so nothing of ours runs behind it")
        (label, problem), = whereis.failed
        assert label == "engine 1" and problem.startswith("busy since at least "), problem
        assert problem.endswith("not asked, so nothing queues behind it") and "more queued" not in problem
        ours = [m for m in rc.outstanding if rc.metadata[m].get("label") == "torchgpu_magic"]
        assert len(ours) == 1 and rc.queue_status()[1]["queue"] == 2  # the task, and ours withdrawn
        busy.get(10)
        deadline, record = time.monotonic() + 10, {}
        while not record.get("result_content") and time.monotonic() < deadline:
            time.sleep(0.02)
            (record,) = rc.db_query({"msg_id": ours[0]}, keys=["result_content"])
        assert record["result_content"]["status"] == "aborted"  # it never ran
    finally:
        other.close()


def test_a_request_the_controller_still_counts_does_not_withdraw_a_slow_call(rc, monkeypatch):
    """The controller drops a request a moment after its answer reaches the client: a call slower than
    the grace, whose first exact look at the controller counts one request more than ours there (one
    just answered), is looked at again after a pause, not withdrawn, and answers."""
    from torchgpu_magic.cluster.ipp_bridge import IPyParallelBridge

    rc[:].execute("import time", block=True)
    looks = []
    others = IPyParallelBridge._others

    def stale_first(self, sent):
        counts = others(self, sent)
        looks.append(counts)
        return {key: count + (len(looks) == 1) for key, count in counts.items()}

    monkeypatch.setattr(IPyParallelBridge, "_others", stale_first)
    options = {"loops": 1, "samples": 5, "warmup": 0, "max_time": 10.0}
    (reply,) = IPyParallelBridge("rc", rc[[0]]).run("cudatime", "", "time.sleep(0.03)", options, None)
    assert reply.ok, reply.message
    assert len(looks) >= 2 and looks[-1] == {0: 0}  # looked at again: only ours counted there


def test_a_stopped_engine_is_stuck_for_the_next_magic_too(sh, rc):
    """An engine stopped (SIGSTOP) while idle: the call's request there times out and stays queued;
    the next call, of another magic, tells that request as ours from the client's record and says 'not
    answering since', without queueing another there."""
    pid = rc[1].apply_sync(os.getpid)
    os.kill(pid, signal.SIGSTOP)
    try:
        report = run(sh, "%gpuinfo --cluster rc --timeout 1 -o")
        rows = {e["label"]: e for e in report.engines}
        assert rows["engine 0"]["ok"] and rows["engine 1"]["problem"] == "timeout", rows["engine 1"]
        whereis = run(sh, "%whereis --cluster rc -o")
        (label, problem), = whereis.failed
        assert label == "engine 1" and problem.startswith("not answering since "), problem
        assert rc.queue_status()[1]["queue"] == 1
    finally:
        os.kill(pid, signal.SIGCONT)


def test_each_engines_seconds_are_ipyparallels_own(rc):
    """The round trip per engine, read from the records without ipyparallel's parsing of every date,
    is the figure ipyparallel gives."""
    from torchgpu_magic.cluster.ipp_bridge import _seconds

    result = rc[:].apply_async(_hold, 0.01)
    result.get(10)
    mine = _seconds(result, -1.0)
    theirs = [(r - s).total_seconds() for s, r in zip(result["submitted"], result["received"])]
    assert mine == theirs and all(t > 0 for t in mine)


def test_panel_refreshes_the_others_while_one_engine_works_and_keeps_its_peaks(sh, rc, capsys):
    """%gpumem --cluster while engine 1 runs a long task: the rows refresh at the interval (engine 1's
    too: its process memory is read by another engine of its host), engine 1's row says busy since when,
    no sample request queues on it, and a notebook cell's peak on engine 1 arrives once it is free,
    under that cell."""
    run(sh, "%gpumem --cluster rc --widget --interval 0.25")
    try:
        live = sh.magics_manager.registry["GPUMemMagics"]._cluster_live
        base = {r["engine"]: r["rss"] for r in live[0].latest.rows}["engine 1"]
        busy = rc[1].apply_async(_hold, 4.0)
        _wait_busy(rc, 1)
        time.sleep(live[0].deadline)  # a tick sent just as the task arrived waits this long, once
        ticks, deadline = set(), time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ticks.add(live[0].latest.time)
            time.sleep(0.02)
        assert len(ticks) >= 4, "the panel waited on the busy engine"
        rows = {r["engine"]: r for r in live[0].latest.rows}
        assert rows["engine 1"]["status"].startswith("busy since") and rows["engine 0"]["status"] == ""
        assert rows["engine 1"]["rss"] >= base + 40 * 2**20  # its row live while it works: the task's 48 MiB
        # the task, and at most the one request of ours sent as it arrived (aborted: it will not run);
        # not one per tick
        assert rc.queue_status()[1]["queue"] <= 2
        cell = sh.run_cell("1 + 1", store_history=True)  # a notebook cell while engine 1 works
        label = f"[{cell.execution_count}]"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any("engine 1" in per for lb, per in live[0].latest.cells
                                                      if label in lb):
            time.sleep(0.05)
        cells = [(lb, per) for lb, per in live[0].latest.cells if label in lb]
        assert any("engine 0" in per and "engine 2" in per for _, per in cells), cells
        (peak,) = [per["engine 1"] for _, per in cells if "engine 1" in per]
        assert peak["peak_rss"] >= base + 40 * 2**20  # the task's 48 MiB, kept for the cell
        busy.get(10)
    finally:
        run(sh, "%gpumem stop")
    assert capsys.readouterr().out.strip().endswith("%gpumem: cluster sampler stopped, panel closed")
    run(sh, "%gpumem stop")
    assert capsys.readouterr().out.strip() == "%gpumem: not running"


def test_stale_client_is_one_line(sh, monkeypatch):
    """A client whose cluster was stopped: one line within the controller's time limit, not a 30 s
    wait that blames busy engines (the limit cut to 1 s here: the wait is the whole of this test).
    That cluster encrypts its channels (CURVE): while it runs, the magics reach it as any other."""
    from IPython.core.error import UsageError

    from torchgpu_magic.cluster import ipp_bridge

    monkeypatch.setattr(ipp_bridge, "ASK_TIMEOUT", 1.0)
    monkeypatch.setenv("IPP_ENABLE_CURVE", "1")

    with cluster_processes():
        other = ipp.Cluster(n=1, log_level=40)
        old = other.start_and_connect_sync()
        sh.user_ns["old"] = old
        try:
            old.wait_for_engines(1, timeout=60, block=True)
            assert old.curve_serverkey
            assert not run(sh, "%whereis --cluster old -o").failed
        finally:
            other.stop_cluster_sync()
        try:
            err = run_error(sh, "%gpuinfo --cluster old")
        finally:
            old.close()
    assert isinstance(err, UsageError) and "\n" not in str(err)
    # the controller's time limit ended the wait (its wording), not a 30 s wait on the engines
    assert "did not answer in 1 s: the cluster was stopped or its controller died" in str(err)
    assert "rc = ipp.Client()" in str(err)


def test_ctrl_c_in_a_kernel_interrupts_the_engines_too(rc, ipc):
    """SIGINT to a real kernel while %%cudatime --cluster runs: one line, and no engine is left
    running the magic (the engines were interrupted too, as %px does)."""
    cluster = ipc[0]
    url = os.path.join(cluster.profile_dir, "security", f"ipcontroller-{cluster.cluster_id}-client.json")
    rc[:].execute("import time", block=True)
    with cluster_processes(), kernel() as (manager, kc):
        setup = execute(kc, f"import ipyparallel as ipp\nrc = ipp.Client({url!r})\n"
                            "rc.wait_for_engines(3, timeout=60)\n%load_ext torchgpu_magic")
        assert not errors(setup), setup
        msg_id = kc.execute("%%cudatime --cluster rc -n 1 -r 400 --warmup 0\ntime.sleep(0.05)")
        deadline = time.monotonic() + 30
        while not all(s["queue"] for k, s in rc.queue_status().items() if k != "unassigned"):
            assert time.monotonic() < deadline, "the engines never started the timing"
            time.sleep(0.05)
        time.sleep(0.5)
        manager.interrupt_kernel()
        outputs = execute(kc, "", timeout=60, msg_id=msg_id)
        (error,) = errors(outputs)
        # the controller drops an answered request a moment after the answer passes: a few seconds for
        # that, where an engine still running the timing (400 x 50 ms) would hold it for 20
        deadline = time.monotonic() + 5
        while _queued(rc) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _queued(rc)
        execute(kc, "rc.close()")
    assert error["ename"] == "ClusterInterrupted" and len(error["traceback"]) == 1, error
    line = error["traceback"][0]
    assert "%%cudatime --cluster interrupted; interrupted it on engines 0, 1, 2 too, as %px does" in line
    assert "did not stop" not in line, line
    assert not left  # none runs it any more
    assert rc[:].apply_async(os.getpid).get(5)


def test_ctrl_c_before_the_controller_is_asked_still_interrupts_our_call(rc, monkeypatch):
    """Ctrl-C in a call's first moments, before the controller was asked what runs where (the call was
    sent with no question first): the controller is asked then, and the engine running ours is
    interrupted, not left running it."""
    from torchgpu_magic.cluster import ClusterInterrupted
    from torchgpu_magic.cluster.ipp_bridge import IPyParallelBridge

    rc[:].execute("import time", block=True)

    def ctrl_c(self, *args):
        deadline = time.monotonic() + 10
        while not rc.queue_status()[0]["queue"]:
            assert time.monotonic() < deadline, "the engine never started the timing"
            time.sleep(0.02)
        raise KeyboardInterrupt

    monkeypatch.setattr(IPyParallelBridge, "_confirm", ctrl_c)
    options = {"loops": 1, "samples": 400, "warmup": 0, "max_time": 60.0}
    with pytest.raises(ClusterInterrupted) as err:
        IPyParallelBridge("rc", rc[[0]]).run("cudatime", "", "time.sleep(0.05)", options, None, timeout=60)
    assert "interrupted it on engine 0 too, as %px does" in str(err.value), err.value
    assert "did not stop" not in str(err.value)


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
    assert rows["engine 1"]["message"].startswith("No module named 'torchgpu_magic' (on ")
    assert "pip install torchgpu-magic" in rows["engine 1"]["fix"]
    flag = next(f for f in report.flags if f.cause == "engine_no_package")
    assert "pip install torchgpu-magic" in flag.fix and "pip install" not in flag.message
    assert any(f.cause == "engine_no_package" for f in report.flags)
    assert "did not report" in report.headline()


def test_engine_killed_mid_call(sh, rc):
    """Last in the module: engine 2 is killed while the cell is being timed everywhere; its row says so,
    the others report, and the magic returns within its time limit."""
    pid = rc[2].apply_sync(os.getpid)
    rc[:].execute("import time", block=True)
    killer = threading.Timer(2.0, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        result = run(sh, "%%cudatime --cluster rc -n 1 -r 40 --warmup 0 --timeout 20 -o\ntime.sleep(0.1)")
    finally:
        killer.cancel()
    assert [label for label, _ in result.rows] == ["engine 0", "engine 1"]
    (label, problem), = result.failed
    assert label == "engine 2" and problem.split(":")[0] in ("dead", "timeout")
    assert "engine 2" in result.to_text()
    after = run(sh, "%gpuinfo --cluster rc --timeout 10 -o")  # the next call still answers
    assert sum(e["ok"] for e in after.engines) == 2

