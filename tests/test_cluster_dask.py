"""The magics across a real Dask ``LocalCluster`` with two worker processes on loopback, started here
(from this file, since worker processes re-import the parent's ``__main__``) and closed in teardown with
a bounded wait and no leftover processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from cluster_support import (
    ROOT,
    TESTS,
    cluster_processes,
    errors,
    execute,
    import_package,
    kernel,
    settle_threads,
    threads,
)
from conftest import run, run_error

distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

# A scheduler's HTTP server asks for port 8787 first: where a second scheduler runs here, or another leg of
# `make test` runs its own at the same time, distributed warns and takes another port, which is all we need
pytestmark = [pytest.mark.engines, pytest.mark.filterwarnings("ignore:Port 8787 is already in use")]


@pytest.fixture(scope="module")
def cluster_client():
    main = sys.modules["__main__"]
    added_spec = not hasattr(main, "__spec__")
    if added_spec:
        # IPython's user module stands as __main__ once a shell ran cells (the ipyparallel tests, when
        # they run first): spawning workers reads __main__.__spec__, None meaning "nothing to re-import"
        main.__spec__ = None
    with cluster_processes():
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=40)
        try:
            dask_client = distributed.Client(cluster)
            files = dask_client.run(import_package)
            assert all(f.startswith(ROOT) for f in files.values()), files
            dask_client.local_cluster = cluster  # for the tests that name the cluster object
            yield dask_client
        finally:
            try:
                dask_client.close(timeout=20)
            finally:
                cluster.close(timeout=20)
                if added_spec:  # the shell's reset may have cleared it already
                    vars(main).pop("__spec__", None)


@pytest.fixture
def client(cluster_client):
    """The module's client once both its workers are the scheduler's again: a test before may have
    stopped one (SIGSTOP) or interrupted it, and on a loaded machine (three legs of `make test` at once)
    the scheduler hears from it again only after a while; a test must not start with one worker."""
    cluster_client.wait_for_workers(2, timeout=120)
    return cluster_client


def _define(code: str) -> None:
    """On a worker: run ``code`` in ``__main__``, the namespace the cluster magics read there."""
    import sys

    exec(code, vars(sys.modules["__main__"]))


def _ended() -> int:
    """On a worker: how many runs of a cell marked their end (in ``ended``, which :func:`_define` made)."""
    import sys

    return len(vars(sys.modules["__main__"]).get("ended", ()))


@pytest.fixture(autouse=True)
def no_leftovers(client):
    """Every test leaves no thread of its own behind (no thread per worker, none per tick) and no call
    of ours running on a worker."""
    from torchgpu_magic.cluster import dask_worker

    before = threads()
    yield
    assert settle_threads(before) == [], "threads left behind"
    deadline = time.monotonic() + 10
    while any(client.run(dask_worker.running).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(client.run(dask_worker.running).values()), "calls of ours still running on the workers"


def _workers(client) -> list:
    info = client.scheduler_info(n_workers=-1)["workers"]
    return sorted(info, key=lambda address: info[address]["name"])


@pytest.fixture
def sh(ip, client):
    ip.user_ns["client"] = client
    return ip


def test_gpuinfo_cluster_on_dask(sh, client):
    report = run(sh, "%gpuinfo --cluster client -o")
    assert report.kind == "dask" and len(report.engines) == 2
    assert all(e["ok"] for e in report.engines)
    assert {e["label"] for e in report.engines} == {"worker 0", "worker 1"}
    assert {e["pid"] for e in report.engines} == set(client.run(os.getpid).values())
    text = sh.display_formatter.formatters["text/plain"](report)
    assert text.startswith("cluster client (dask): 2 engines on 1 host")


def test_whereis_and_cudatime_on_dask(sh, client):
    info = client.scheduler_info()["workers"]
    workers = sorted(info, key=lambda address: info[address]["name"])
    client.run(_define, "import torch, time; w = torch.zeros(4); pause = 0.002")
    client.run(_define, "w = w.to('meta'); pause = 0.05", workers=[workers[1]])
    try:
        report = run(sh, "%whereis --cluster client w -o")
        assert report.where("w") == "cpu on worker 0; meta on worker 1"
        assert "w" in report.mixed()
        result = run(sh, "%%cudatime --cluster client -n 2 -r 5 --warmup 1 -o\ntime.sleep(pause)")
        assert [label for label, _ in result.rows] == ["worker 0", "worker 1"]
        # each row is its own worker's: a sleep lasts at least its pause, and ten 2 ms sleeps do not all
        # last 50 ms (an order, no duration asserted: whatever the load, 1 is the slower)
        assert result.rows[1][1].min >= 0.05 > result.rows[0][1].min
    finally:
        client.run(_define, "del w, pause")


def test_dask_timeout_leaves_the_notebook_free(sh, client):
    """A worker busy past the time limit: its row says 'timeout', the call returns before the workers'
    cells end (an order, not a duration: none has marked its end yet), and the call is stopped on the
    workers (the no_leftovers check finds none running)."""
    from torchgpu_magic import cluster

    bridge = cluster.connect(sh.user_ns, "client")
    client.run(_define, "import time; pause = 3.0; ended = []")
    replies = bridge.run("cudatime", "", "time.sleep(pause)\nended.append(1)",
                         {"loops": 1, "samples": 1, "warmup": 0}, None, timeout=1.0)
    assert client.run(_ended) == {w: 0 for w in _workers(client)}  # returned while the cells still ran
    assert [r.problem for r in replies] == ["timeout", "timeout"]
    assert "our call there was stopped" in replies[0].message


# ---- a timing runs in a thread of the worker: its event loop keeps answering --------------------------

def test_cudatime_leaves_the_workers_event_loop_free(client):
    """A no-op Client.run sent while every worker times a cell answers while the timing still runs there
    (an order, not a duration; it answered only after the timing, 7.3 s, when the timing ran inside
    Client.run)."""
    from torchgpu_magic import cluster
    from torchgpu_magic.cluster import dask_worker

    client.run(_define, "import time; pause = 0.05")
    bridge = cluster.connect({"client": client}, "client")
    done: dict = {}
    options = {"loops": 1, "samples": 40, "warmup": 0, "max_time": 10.0}
    timing = threading.Thread(target=lambda: done.update(replies=bridge.run(
        "cudatime", "", "time.sleep(pause)", options, None, timeout=30)))
    timing.start()
    try:
        deadline = time.monotonic() + 20
        while sum(map(len, client.run(dask_worker.running).values())) < 2:
            assert time.monotonic() < deadline, "the timing never started"
            time.sleep(0.05)
        client.run(os.getpid)
        assert sum(map(len, client.run(dask_worker.running).values())) == 2  # the timing runs on
    finally:
        timing.join(30)
    assert [r.ok for r in done["replies"]] == [True, True], [r.error_text() for r in done["replies"]]
    from torchgpu_magic.cluster.timing import result_of

    assert all(result_of(r.value).n == 40 for r in done["replies"])


def test_hung_worker_one_client_run_per_tick_and_no_thread_per_worker(client):
    """The worker that reports its host for the panel is stopped (no heartbeat, no answer): the first
    tick waits out its deadline once, then the worker is left out, its row says since when it is
    silent, the other worker reports the host, each tick is one Client.run, and no thread is started."""
    from torchgpu_magic import cluster
    from torchgpu_magic.cluster.memory import ClusterSampler

    bridge = cluster.connect({"client": client}, "client")
    sampler = ClusterSampler(bridge, 0.5)
    sampler.tick(30)
    stopped = next(iter(sampler._reporters.values()))
    label = next(r["engine"] for r in sampler._engines.values() if r["pid"] == stopped)
    calls = []
    real_run = client.run
    stopped_address = next(a for a, pid in client.run(os.getpid).items() if pid == stopped)

    def counted(*args, **kwargs):
        calls.append((getattr(args[0], "__name__", args[0]), stopped_address in kwargs.get("workers", ())))
        return real_run(*args, **kwargs)

    before = threads()
    os.kill(stopped, signal.SIGSTOP)
    try:
        time.sleep(3.5)  # past the silence the scheduler's heartbeat record shows
        bridge.obj = _Counting(client, counted)
        first = sampler.tick()
        calls.clear()
        ticks = [sampler.tick() for _ in range(3)]
    finally:
        os.kill(stopped, signal.SIGCONT)
        bridge.obj = client
    assert threads() == before
    # one Client.run per tick, to the worker now reporting the host and never to the stopped one, so no
    # tick waits out a deadline on it (checked by what was asked, not by the clock)
    assert calls == [("dask_call", False)] * 3
    for snap in (first, *ticks):
        rows = {r["engine"]: r for r in snap.rows}
        other = next(name for name in rows if name != label)
        assert rows[label]["status"].startswith("silent since "), rows
        assert "figures from its last heartbeat" in rows[label]["status"]
        assert rows[label]["rss"] and rows[other]["status"] == ""
    assert stopped not in sampler._reporters.values()  # the other worker reports the host now
    time.sleep(1.0)  # let the worker catch up with its heartbeats


class _Counting:
    """The user's client, with its ``run`` counted (everything else passed through)."""

    def __init__(self, client, run):
        self._client, self.run = client, run

    def __getattr__(self, name):
        return getattr(self._client, name)


def _sleep(seconds):
    import time

    time.sleep(seconds)


def test_cudatime_leaves_out_workers_running_tasks(sh, client):
    """A worker running a task (its heartbeat says so) is not timed: the timing would measure both; also
    when an earlier magic's list of the workers, from before the task, is still kept."""
    client.run(_define, "import time")
    run(sh, "%gpuinfo --cluster client -o")  # the workers' records, idle, kept for the next magics
    task = client.submit(_sleep, 4.0, pure=False, workers=[_workers(client)[0]])
    try:
        deadline = time.monotonic() + 10
        while not client.processing()[_workers(client)[0]] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)  # a heartbeat or two: the scheduler's record of the worker shows the task
        result = run(sh, "%%cudatime --cluster client -n 1 -r 3 --warmup 0 -o\ntime.sleep(0.001)")
    finally:
        task.result()
    assert [label for label, _ in result.rows] == ["worker 1"]
    (label, problem), = result.failed
    assert label == "worker 0" and problem.startswith("busy: 1 task(s) running there")


# ---- the worker list kept between magics -----------------------------------------------------------------

@pytest.fixture
def identities(monkeypatch):
    """The times a bridge asked the scheduler for its workers."""
    from torchgpu_magic.cluster.dask_bridge import DaskBridge

    asked: list = []
    real = DaskBridge.identity
    monkeypatch.setattr(DaskBridge, "identity", lambda self: asked.append(1) or real(self))
    return asked


def test_the_default_client_s_workers_are_kept_too(sh, client, identities):
    """With no cluster object in the namespace, --cluster finds distributed's default client; its list
    of workers is kept between magics as a named client's is (the empty store was taken for none)."""
    from distributed import default_client

    assert default_client() is client
    saved = {name: sh.user_ns.pop(name) for name in list(sh.user_ns) if sh.user_ns[name] is client}
    try:
        for _ in range(2):
            assert len(run(sh, "%gpuinfo --cluster -o").engines) == 2
    finally:
        sh.user_ns.update(saved)
    assert len(identities) == 1


def test_one_magic_after_another_asks_the_scheduler_once_and_unload_forgets(sh, client, identities):
    """The scheduler's list of workers, fetched by one magic, serves the next ones (for REFRESH seconds);
    %unload_ext drops it, and it holds no reference to the client."""
    import gc
    import weakref

    from torchgpu_magic import load_ipython_extension, unload_ipython_extension
    from torchgpu_magic.cluster import Kept

    for line in ("%gpuinfo --cluster client -o", "%whereis --cluster client -o", "%gpuinfo --cluster -o"):
        assert len(run(sh, line).engines) == 2
    assert len(identities) == 1
    owner = sh.magics_manager.registry["TorchGPUMagics"]
    assert len(owner.cluster_kept) == 1
    unload_ipython_extension(sh)
    assert owner.cluster_kept is None
    load_ipython_extension(sh)
    run(sh, "%gpuinfo --cluster client -o")
    assert len(identities) == 2  # a fresh extension asks afresh

    class Stand:
        """Any object a weak reference can point at, as a Client."""

    kept, obj = Kept(), Stand()
    gone = weakref.ref(obj)
    assert kept.workers(obj) is kept.workers(obj)
    del obj
    gc.collect()
    assert gone() is None and len(kept) == 0


@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")  # a second scheduler here: another port
def test_a_worker_added_or_stopped_since_the_list_was_kept_is_seen_without_waiting(client, identities,
                                                                                   monkeypatch):
    """With the list in hand taken as current, a call still reaches the workers the scheduler has now:
    one started since answers in its own row, and one stopped since is not asked (asking its address
    would hold the call for distributed's 30 s connect timeout) and has no row. (A cluster of its own,
    its workers in this process: the module's cluster spawns no new worker processes from a test.)"""
    from torchgpu_magic.cluster.dask_bridge import DaskBridge, Workers

    local = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                     dashboard_address=None, silence_logs=40, loop=client.loop)
    own = distributed.Client(local, set_as_default=False, loop=local.loop)
    try:
        kept = Workers()
        DaskBridge("own", own, kept=kept).identity()
        monkeypatch.setattr(DaskBridge, "current", lambda self: True)
        local.scale(2)
        own.wait_for_workers(2, timeout=60)
        identities.clear()
        replies = DaskBridge("own", own, kept=kept).run("whereis", [], timeout=20)
        assert [r.engine for r in replies] == ["worker 0", "worker 1"] and all(r.ok for r in replies), replies
        assert len(identities) == 1  # the list turned out stale: fetched afresh, nobody asked twice

        local.scale(1)
        deadline = time.monotonic() + 60
        while len(own.scheduler_info(n_workers=-1)["workers"]) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        identities.clear()
        replies = DaskBridge("own", own, kept=kept).run("whereis", [], timeout=20)
        assert [r.engine for r in replies] == ["worker 0"] and all(r.ok for r in replies), replies
        assert len(identities) == 1
        identities.clear()
        DaskBridge("own", own, kept=kept).run("whereis", [], timeout=20)
        assert not identities  # the same workers as the list in hand: nothing more to ask
    finally:
        own.close()
        local.close()


@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")  # a second scheduler here: another port
def test_bridges_of_one_client_share_the_workers_names_and_a_call_asks_the_scheduler_once(client,
                                                                                         identities,
                                                                                         monkeypatch):
    """A bridge made before a worker joined (a live panel's) names it as the bridge that fetched the
    list did, 'worker 1', not by its address; and a call whose list the scheduler's count does not
    confirm fetches it once, not again for the workers to ask. (A cluster of its own, in this process.)"""
    from torchgpu_magic.cluster.dask_bridge import DaskBridge, Workers

    local = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                     dashboard_address=None, silence_logs=40, loop=client.loop)
    own = distributed.Client(local, set_as_default=False, loop=local.loop)
    try:
        kept = Workers()
        panel = DaskBridge("own", own, kept=kept)
        panel.identity()
        local.scale(2)
        own.wait_for_workers(2, timeout=60)
        DaskBridge("own", own, kept=kept).identity()
        assert sorted(panel.label(key) for key in kept.records) == ["worker 0", "worker 1"]
        monkeypatch.setattr(DaskBridge, "current", lambda self: False)  # the count lags behind
        identities.clear()
        replies = DaskBridge("own", own, kept=kept).run("whereis", [], timeout=20)
        assert [r.engine for r in replies] == ["worker 0", "worker 1"] and all(r.ok for r in replies)
        assert len(identities) == 1
    finally:
        own.close()
        local.close()


# ---- where memory is: worker.data, distributed's own GPU monitoring ------------------------------------

def _tensor(n):
    import torch

    return torch.ones(n)


def test_whereis_shows_tensors_held_as_task_results(sh, client):
    future = client.submit(_tensor, 7, pure=False, workers=[_workers(client)[0]])
    future.result()
    report = run(sh, "%whereis --cluster client -o")
    name = f"dask result {future.key}"
    assert report.where(name) == "cpu on worker 0"
    assert report.names[name]["worker 0"]["kind"] == "tensor"
    del future


def _monitor_gpu(tests: str, on: bool, dask_worker=None) -> None:
    """On a worker: distributed's own NVML monitoring against the scripted NVML (one H100 at 87 %, 42 GiB
    used), as on a GPU worker with pynvml installed; or the worker's own monitor back."""
    import sys

    from distributed.diagnostics import nvml
    from distributed.system_monitor import SystemMonitor

    if not on:
        dask_worker.monitor = dask_worker._torchgpu_saved_monitor
        nvml.pynvml, nvml.NVML_STATE = dask_worker._torchgpu_saved_nvml
        return
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import fake_pynvml

    dask_worker._torchgpu_saved_monitor = dask_worker.monitor
    dask_worker._torchgpu_saved_nvml = (nvml.pynvml, nvml.NVML_STATE)
    nvml.pynvml = fake_pynvml.make("h100_busy")
    nvml.NVML_STATE = nvml.NVMLState.UNINITIALIZED
    dask_worker.monitor = SystemMonitor()


def test_gpu_memory_from_the_workers_own_monitoring(sh, client):
    worker = _workers(client)[1]
    client.run(_monitor_gpu, TESTS, True, workers=[worker])
    try:
        snap = run(sh, "%gpumem --cluster client --text -o")
    finally:
        client.run(_monitor_gpu, TESTS, False, workers=[worker])
    (gpu,) = snap.gpus
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["total"] == 81559 * 2**20 and gpu["util"] == 87
    assert gpu["engines"] == ["worker 1"]
    text = snap.to_text()
    assert "GPU 0  NVIDIA H100 80GB HBM3" in text and "87 %" in text


# ---- one line where a traceback was ----------------------------------------------------------------

def test_closed_dask_cluster_is_one_line(sh):
    from IPython.core.error import UsageError

    before = threads()
    local = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                     dashboard_address=None, silence_logs=40,
                                     loop=sh.user_ns["client"].loop)
    old = distributed.Client(local, set_as_default=False, loop=local.loop)
    local.close()
    sh.user_ns.update(old=old, lc=local)
    try:
        err = run_error(sh, "%gpuinfo --cluster old")
        assert isinstance(err, UsageError) and "\n" not in str(err)
        assert "this Dask Client is closed (its cluster was closed" in str(err)
        assert "distributed.Client(cluster)" in str(err)
        err = run_error(sh, "%gpumem --cluster lc --text")
        assert isinstance(err, UsageError) and "this Dask cluster is closed" in str(err)
    finally:
        old.close()
    assert settle_threads(before) == []


def test_worker_without_the_package_says_what_to_install_where(sh, client):
    from test_cluster_ipp import _block_package

    worker = _workers(client)[1]
    client.run(_block_package, True, workers=[worker])
    try:
        report = run(sh, "%gpuinfo --cluster client -o")
    finally:
        client.run(_block_package, False, workers=[worker])
    rows = {e["label"]: e for e in report.engines}
    assert rows["worker 0"]["ok"] and rows["worker 1"]["problem"] == "no_package", rows["worker 1"]
    message, fix = rows["worker 1"]["message"], rows["worker 1"]["fix"]
    assert message.startswith("No module named 'torchgpu_magic' (on ")
    assert f"Python {sys.executable}" in message
    assert "pip install torchgpu-magic" in fix and "PipInstall(['torchgpu-magic'])" in fix
    assert "Exception: ModuleNotFoundError" not in message
    flag = next(f for f in report.flags if f.cause == "engine_no_package")
    assert flag.fix == fix


# ---- the names --cluster takes ------------------------------------------------------------------------

def test_cluster_names_dask(sh, client):
    from IPython.core.error import UsageError

    from torchgpu_magic.cluster import find

    sh.user_ns["cluster"] = client.local_cluster
    report = run(sh, "%gpuinfo --cluster cluster -o")
    assert len(report.engines) == 2 and not find._OWNED  # through the live client of that cluster
    del sh.user_ns["client"], sh.user_ns["cluster"]
    report = run(sh, "%gpuinfo --cluster -o")  # nothing in the namespace: distributed.default_client()
    assert report.name == "default_client()" and len(report.engines) == 2
    other = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                     dashboard_address=None, silence_logs=40,
                                     loop=client.loop)
    try:
        sh.user_ns.update(client=client, second=distributed.Client(other, set_as_default=False,
                                                                   loop=client.loop))
        err = run_error(sh, "%gpuinfo --cluster")
        assert isinstance(err, UsageError) and "several clusters here (client; second)" in str(err)
    finally:
        sh.user_ns["second"].close()
        other.close()


# ---- Ctrl-C -----------------------------------------------------------------------------------------------

def test_ctrl_c_in_a_kernel_stops_the_timing_on_the_workers(client):
    from torchgpu_magic.cluster import dask_worker

    client.run(_define, "import time")
    with cluster_processes(), kernel() as (manager, kc):
        setup = execute(kc, f"import distributed\nclient = distributed.Client({client.scheduler.address!r})\n"
                            "%load_ext torchgpu_magic")
        assert not errors(setup), setup
        msg_id = kc.execute("%%cudatime --cluster client -n 1 -r 400 --warmup 0\ntime.sleep(0.05)")
        deadline = time.monotonic() + 30
        while sum(map(len, client.run(dask_worker.running).values())) < 2:
            assert time.monotonic() < deadline, "the workers never started the timing"
            time.sleep(0.05)
        manager.interrupt_kernel()
        outputs = execute(kc, "", timeout=60, msg_id=msg_id)
        running = client.run(dask_worker.running)
        execute(kc, "client.close()")
    (error,) = errors(outputs)
    assert error["ename"] == "ClusterInterrupted" and len(error["traceback"]) == 1, error
    assert "%%cudatime --cluster interrupted; interrupted it on workers 0, 1 too" in error["traceback"][0]
    assert not any(running.values())  # no worker runs the magic any more


def _wait_running(watcher, count: int, seconds: float = 60) -> None:
    """Until ``count`` workers run a call of ours (a timing sent to the kernel has reached them)."""
    from torchgpu_magic.cluster import dask_worker

    deadline = time.monotonic() + seconds
    while sum(map(len, watcher.run(dask_worker.running).values())) < count:
        assert time.monotonic() < deadline, "the workers never started the timing"
        time.sleep(0.05)


def _text(outputs: list) -> str:
    return "\n".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") or "\n".join(
        o.get("traceback", [])) for o in outputs)


def test_ctrl_c_leaves_a_kernels_own_local_cluster_alive_and_dead_workers_say_so():
    """A LocalCluster started by the notebook's kernel: its worker processes share the kernel's process
    group, to which an interrupt is sent, and Dask's workers die of SIGINT (both did, and the next
    %%cudatime --cluster printed an empty table, %gpuinfo --cluster '0 engines on 0 hosts'). Interrupting
    %%cudatime --cluster and %cudatime --cluster now leaves them alive (the same processes answer after),
    and the line names the form typed. Workers killed by an interrupt outside our calls are rows that
    say they died and what to do, and doing it brings them back; a client that sees no worker at all
    says so in one line."""
    with cluster_processes(), kernel() as (manager, kc):
        setup = execute(kc, "import distributed\ncluster = distributed.LocalCluster(n_workers=2, "
                            "threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40)\n"
                            "client = distributed.Client(cluster)\n%load_ext torchgpu_magic\n"
                            "print(cluster.scheduler_address)", timeout=180)
        assert not errors(setup), setup
        address = [o["text"] for o in setup if o["msg_type"] == "stream"][-1].strip().splitlines()[-1]
        watcher = distributed.Client(address, set_as_default=False)
        try:
            pids = watcher.run(os.getpid)
            said = {}
            for form in ("%%cudatime --cluster client -n 1 -r 400 --warmup 0\nimport time\ntime.sleep(0.05)",
                         "%cudatime --cluster client -n 1 -r 400 --warmup 0 __import__('time').sleep(0.05)"):
                msg_id = kc.execute(form)
                _wait_running(watcher, 2)
                manager.interrupt_kernel()
                said[form[:11]] = errors(execute(kc, "", timeout=90, msg_id=msg_id))
                assert watcher.run(os.getpid) == pids  # the same two worker processes, alive
            for magic, errs in said.items():
                (error,) = errs
                assert error["ename"] == "ClusterInterrupted" and len(error["traceback"]) == 1, error
                assert error["traceback"][0].startswith(f"KeyboardInterrupt: {magic.split()[0]} --cluster "
                                                        "interrupted; interrupted it on workers 0, 1 too")
            after = execute(kc, "%gpuinfo --cluster client", timeout=120)
            assert not errors(after) and "2 engines on 1 host" in _text(after), _text(after)

            for pid in pids.values():  # an interrupt outside our calls: the workers die of it
                os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + 60
            while watcher.scheduler_info()["workers"] and time.monotonic() < deadline:
                time.sleep(0.2)
            fix = ("start its workers afresh: client.cluster.scale(0), then client.cluster.scale(2) in a "
                   "cell of its own")
            gpus = _text(execute(kc, "%gpuinfo --cluster client", timeout=120))
            assert "2 engines did not report" in gpus and gpus.count("dead: its worker process exited") == 2
            assert fix in gpus, gpus
            timed = _text(execute(kc, "%%cudatime --cluster client -n 1 -r 3 --warmup 0\npass", timeout=120))
            assert "worker 0" in timed and "worker 1" in timed and timed.count("dead: its worker") == 2, timed
            bare = execute(kc, f"other = distributed.Client({address!r}, set_as_default=False)\n"
                               "%gpuinfo --cluster other", timeout=120)
            assert "lists no workers" in _text(bare) and "0 engines" not in _text(bare), _text(bare)

            execute(kc, "other.close()\nclient.cluster.scale(0)")  # the fix, as it says
            again = execute(kc, "client.cluster.scale(2)\nclient.wait_for_workers(2, timeout=120)\n"
                                "%gpuinfo --cluster client", timeout=240)
            assert not errors(again) and "2 engines on 1 host" in _text(again), _text(again)
        finally:
            watcher.close()
            execute(kc, "client.close(); cluster.close()", timeout=120)


def test_calls_on_a_worker_run_side_by_side_and_their_threads_end_when_idle(monkeypatch):
    """A long call on a worker (a timing) leaves a short one (the panel's tick) a thread of its own; a
    failure reaches the caller; and the threads end once no call comes, so none stays for the life of a
    process that in-process workers share with the notebook."""
    from torchgpu_magic.cluster import dask_worker

    monkeypatch.setattr(dask_worker, "IDLE", 0.05)
    pool = dask_worker._Threads()
    release = threading.Event()
    long = pool.submit(release.wait, 10)
    assert pool.submit(lambda: "tick").result(10) == "tick" and not long.done()
    release.set()
    assert long.result(10) is True
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(10)
    assert pool.submit(lambda: "again").result(10) == "again"
    deadline = time.monotonic() + 10
    while any(t.name == "torchgpu_magic call" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [t for t in threading.enumerate() if t.name == "torchgpu_magic call"]


FORKED = """
import os, sys
from torchgpu_magic.cluster import dask_worker
assert dask_worker._THREADS.submit(lambda: 1).result(10) == 1  # a thread now waits, idle
first, second = dask_worker.call_id(), dask_worker.call_id()
assert first != second and first[:20] == second[:20]
pid = os.fork()
if pid == 0:  # the child: its call must run and its ids be its own, else it exits with 1
    try:
        ran = dask_worker._THREADS.submit(lambda: 2).result(10) == 2
        os._exit(0 if ran and dask_worker.call_id()[:20] != first[:20] else 1)
    except BaseException:
        os._exit(1)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.mark.fresh_process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_its_own_threads_for_our_calls():
    """A process forked from one whose threads for our calls sat idle has none of those threads: its first
    call must start one, not be handed to a thread that does not exist there (and wait out its deadline).
    Its call ids are its own (they share a prefix drawn once per process). Forked in a process of its
    own: a fork here would stop IPython's history thread in this one."""
    out = subprocess.run([sys.executable, "-c", FORKED], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_named_cluster_is_taken_without_touching_the_rest_of_the_namespace(client):
    """``--cluster NAME`` reads only NAME: the namespace is looked through only to list what is there
    (a lazy proxy elsewhere in it is not made to resolve)."""
    from torchgpu_magic import cluster

    touched: list = []

    class Lazy:
        @property
        def __class__(self):
            touched.append(True)
            return type(self)

    bridge = cluster.connect({"client": client, "lazy": Lazy()}, "client")
    assert bridge.obj is client and not touched


def test_sigint_is_held_off_only_for_the_notebooks_own_process_group():
    """On a worker in the caller's process group our calls hold SIGINT off, nested calls sharing one hold
    and the handler from before coming back with the last; a worker elsewhere keeps its handler."""
    from torchgpu_magic.cluster import dask_worker

    before = signal.getsignal(signal.SIGINT)
    host, group = dask_worker.process_group()
    with dask_worker.sigint_held((host, group)):
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        with dask_worker.sigint_held((host, group)):
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == before
    for caller in ((host, group + 1), ("elsewhere", group), None):
        with dask_worker.sigint_held(caller):
            assert signal.getsignal(signal.SIGINT) == before


def test_the_workers_entry_takes_one_request():
    """Dask reads the signature of a ``Client.run`` function twice per call on every worker (whether it
    takes ``dask_worker``, ``dask_scheduler``), at a cost that grows with its parameters: the entry takes
    the request as one tuple, besides the worker."""
    import inspect

    from torchgpu_magic.cluster import dask_worker

    assert list(inspect.signature(dask_worker.dask_call).parameters) == ["request", "dask_worker"]


def test_holding_sigint_off_never_formats_the_handler_it_replaces():
    """A worker's SIGINT handler is asyncio's runner bound to its task, whose repr walks the task's stack:
    ``signal.signal`` formatted it on every call (trying the handler as an enum member, it builds the
    failure's message), a tenth of a bare ``Client.run``. The hold swaps handlers without that, and
    puts the same handler back."""
    from torchgpu_magic.cluster import dask_worker

    formatted = []

    class Handler:
        def __call__(self, signum, frame):
            raise KeyboardInterrupt

        def __repr__(self):
            formatted.append(1)
            return "Handler()"

    handler = Handler()
    before = signal.signal(signal.SIGINT, handler)
    try:
        with dask_worker.sigint_held(dask_worker.process_group()):
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert not formatted  # before signal.getsignal, which formats it too
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_interrupt_while_torch_imports_is_not_raised_inside_the_import(monkeypatch):
    """An interrupt landing inside 'import torch' left torch half made in the worker ('duplicate
    registrations' for every later call): it waits until the import is done, and the call then ends
    without running; meanwhile the call does not count as running ours."""
    from torchgpu_magic.cluster import dask_worker, remote

    importing, release, landed, ran = threading.Event(), threading.Event(), [], []

    def slow_import():
        importing.set()
        try:
            release.wait(10)
        except KeyboardInterrupt:
            landed.append(True)

    monkeypatch.setattr(dask_worker, "_import_torch", slow_import)
    monkeypatch.setattr(remote, "call", lambda *args: ran.append(args) or {"ok": True})
    out: dict = {}
    thread = threading.Thread(
        target=lambda: out.update(reply=dask_worker._tracked("cid-1", None, "ping", (), {})))
    thread.start()
    assert importing.wait(10)
    assert dask_worker.running() == ["cid-1"]  # importing, before the call: ours, running
    assert dask_worker.interrupt("cid-1") == 1  # told: it will not run the call
    assert dask_worker.running() == []
    release.set()
    thread.join(10)
    assert not landed and not ran and out["reply"]["message"] == "interrupted"
    assert "cid-1" not in dask_worker._CANCELLED and not dask_worker._ACTIVE


def test_the_interrupt_line_names_the_form_typed_and_the_workers_that_died():
    from torchgpu_magic.cluster.bridge import Bridge

    line = str(Bridge("c", None, magic="%cudatime").interrupted("cudatime", ["worker 0"], [], ["worker 1"],
                                                                  "start it again"))
    assert line == ("%cudatime --cluster interrupted; interrupted it on worker 0 too, as %px does; worker 1 "
                    "died (no longer listed by the cluster): start it again")
    assert str(Bridge("c", None).interrupted("cudatime", [], [])) == "%%cudatime --cluster interrupted"
