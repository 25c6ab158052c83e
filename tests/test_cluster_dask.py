"""The magics across a real Dask ``LocalCluster`` with two worker processes on loopback, started here
(from this file, since worker processes re-import the parent's ``__main__``) and closed in teardown with
a bounded wait and no leftover processes."""
from __future__ import annotations

import os
import sys
import time

import pytest
from cluster_support import ROOT, cluster_processes, import_package
from conftest import run

distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")



@pytest.fixture(scope="module")
def client():
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
            yield dask_client
        finally:
            try:
                dask_client.close(timeout=20)
            finally:
                cluster.close(timeout=20)
                if added_spec:  # the shell's reset may have cleared it already
                    vars(main).pop("__spec__", None)


def _define(code: str) -> None:
    """On a worker: run ``code`` in ``__main__``, the namespace the cluster magics read there."""
    import sys

    exec(code, vars(sys.modules["__main__"]))


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
    client.run(_define, "import torch, time; w = torch.zeros(4); pause = 0.001")
    client.run(_define, "w = w.to('meta'); pause = 0.004", workers=[workers[1]])
    try:
        report = run(sh, "%whereis --cluster client w -o")
        assert report.where("w") == "cpu on worker 0; meta on worker 1"
        assert "w" in report.mixed()
        result = run(sh, "%%cudatime --cluster client -n 2 -r 5 --warmup 1 -o\ntime.sleep(pause)")
        assert [label for label, _ in result.rows] == ["worker 0", "worker 1"]
        assert result.rows[1][1].median > 2 * result.rows[0][1].median
    finally:
        client.run(_define, "del w, pause")


def test_dask_timeout_leaves_the_notebook_free(sh, client):
    """A worker busy past the time limit: its row says 'timeout' and the call returns on time."""
    from torchgpu_magic import cluster

    bridge = cluster.connect(sh.user_ns, "client")
    start = time.monotonic()
    client.run(_define, "import time; pause = 3.0")
    replies = bridge.run("cudatime", "", "time.sleep(pause)", {"loops": 1, "samples": 1, "warmup": 0},
                         None, timeout=1.0)
    assert time.monotonic() - start < 2.5
    assert [r.problem for r in replies] == ["timeout", "timeout"]
    time.sleep(3.5)  # let the workers finish before the next test
