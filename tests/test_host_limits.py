"""host.py's limits: what this process may take, not what the system has. A cgroup (v2 ``memory.max``, v1
``memory.limit_in_bytes``, at its own level or an ancestor's) and ``ulimit -v`` / ``-d`` are read from a
scripted tree (``host.ROOT``) and scripted rlimits (``host.GETRLIMIT``), laid out as the kernel lays them
out: ``/proc/self/cgroup``'s ``0::PATH`` (v2) or ``N:memory:PATH`` (v1) line, the cgroup's files under
``/sys/fs/cgroup`` (v1: ``/sys/fs/cgroup/memory``), and ``/proc/self/status``' ``VmSize`` / ``VmData``
(Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/memory.rst, proc(5), getrlimit(2))."""
from __future__ import annotations

import resource
from pathlib import Path

import pytest

from torchgpu_magic import host

GiB = 1024 ** 3
MiB = 1024 ** 2
STATUS = ("Name:\tpython\nVmPeak:\t 3000000 kB\nVmSize:\t 2097152 kB\nVmHWM:\t  400000 kB\n"
          "VmRSS:\t  390000 kB\nVmData:\t 1048576 kB\n")


def tree(tmp: Path, cgroup: str, files: dict) -> str:
    """A scripted root: ``proc/self/cgroup`` and ``proc/self/status``, and ``files`` ({path: text})."""
    (tmp / "proc" / "self").mkdir(parents=True)
    (tmp / "proc" / "self" / "cgroup").write_text(cgroup)
    (tmp / "proc" / "self" / "status").write_text(STATUS)
    for path, text in files.items():
        target = tmp / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(tmp)


def no_rlimits(which):
    return (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def test_a_cgroup_v2_limit_set_on_an_ancestor_counts(tmp_path):
    """systemd puts a user session in user.slice/user-1000.slice/session-3.scope; a MemoryMax on the
    slice binds the session (memory.max 'max' below it), and its inactive file cache is not counted."""
    root = tree(tmp_path, "0::/user.slice/user-1000.slice/session-3.scope\n", {
        "sys/fs/cgroup/user.slice/memory.max": f"{8 * GiB}\n",
        "sys/fs/cgroup/user.slice/memory.current": f"{6 * GiB}\n",
        "sys/fs/cgroup/user.slice/memory.stat": f"anon {5 * GiB}\nfile {GiB}\ninactive_file {512 * MiB}\n",
        "sys/fs/cgroup/user.slice/user-1000.slice/memory.max": "max\n",
        "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.max": "max\n",
        "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.current": f"{GiB}\n",
        "sys/fs/cgroup/memory.max": "max\n",  # the root has no memory.max; a file saying max is the same
    })
    (limit,) = host.memory_limits(root, no_rlimits)
    assert (limit.name, limit.where) == ("the cgroup's memory.max", "/sys/fs/cgroup/user.slice/memory.max")
    assert (limit.limit, limit.used, limit.available) == (8 * GiB, 6 * GiB - 512 * MiB, 2 * GiB + 512 * MiB)
    assert limit.describe() == ("the cgroup's memory.max (8.00 GiB, 5.50 GiB used; "
                                "/sys/fs/cgroup/user.slice/memory.max)")


def test_a_container_sees_its_own_cgroup_at_the_mounts_root(tmp_path):
    """Docker on cgroup v1: /proc/self/cgroup names the host's path (/docker/ID), the container's mount of
    the memory controller shows the container's own cgroup at its root."""
    root = tree(tmp_path, "12:pids:/docker/4f1c\n4:memory:/docker/4f1c\n1:name=systemd:/docker/4f1c\n", {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{4 * GiB}\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{3 * GiB}\n",
        "sys/fs/cgroup/memory/memory.stat": f"cache {GiB}\ntotal_inactive_file {256 * MiB}\n",
    })
    (limit,) = host.memory_limits(root, no_rlimits)
    assert limit.name == "the cgroup's memory.limit_in_bytes (v1)" and limit.limit == 4 * GiB
    assert limit.used == 3 * GiB - 256 * MiB
    assert limit.where == "/sys/fs/cgroup/memory/memory.limit_in_bytes"


def test_no_limit_where_v1_says_unlimited_and_on_a_machine_without_cgroups(tmp_path):
    root = tree(tmp_path, "4:memory:/process_api/c1d4\n0::/\n", {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
        "sys/fs/cgroup/memory/process_api/c1d4/memory.limit_in_bytes": "9223372036854771712\n",
    })
    assert host.memory_limits(root, no_rlimits) == []
    assert host.memory_limits(str(tmp_path / "nowhere"), no_rlimits) == []


def test_ulimit_v_and_d_count_against_the_address_space_and_data_in_use(tmp_path):
    root = tree(tmp_path, "0::/\n", {"sys/fs/cgroup/memory.max": "max\n"})
    caps = {resource.RLIMIT_AS: 6_000_000 * 1024, resource.RLIMIT_DATA: 3 * GiB}

    def rlimits(which):
        return (caps.get(which, resource.RLIM_INFINITY), resource.RLIM_INFINITY)

    found = {lim.name: lim for lim in host.memory_limits(root, rlimits)}
    space, data = found["ulimit -v (RLIMIT_AS)"], found["ulimit -d (RLIMIT_DATA)"]
    assert (space.limit, space.used, space.where) == (6_000_000 * 1024, 2 * GiB, "")
    assert (data.limit, data.used) == (3 * GiB, GiB)
    assert host.binding_limit([space, data], available=19 * GiB, total=31 * GiB) is data  # 2 GiB left


def test_the_binding_limit_is_the_one_leaving_least_and_none_binds_above_the_system():
    roomy = host.MemoryLimit("the cgroup's memory.max", "/x", 64 * GiB, GiB)
    tight = host.MemoryLimit("ulimit -v (RLIMIT_AS)", "", 6 * GiB, 2 * GiB)
    assert host.binding_limit([roomy], available=16 * GiB, total=32 * GiB) is None
    assert host.binding_limit([roomy, tight], available=16 * GiB, total=32 * GiB) is tight


def test_host_memory_says_what_this_process_may_still_take(tmp_path, monkeypatch):
    root = tree(tmp_path, "0::/pod\n", {
        "sys/fs/cgroup/pod/memory.max": f"{GiB}\n", "sys/fs/cgroup/pod/memory.current": f"{256 * MiB}\n"})
    monkeypatch.setattr(host, "ROOT", root)
    monkeypatch.setattr(host, "GETRLIMIT", no_rlimits)
    memory = host.host_memory()
    assert memory.limit is not None and memory.limit.where == "/sys/fs/cgroup/pod/memory.max"
    assert memory.usable == 768 * MiB < memory.available and memory.capacity == GiB <= memory.total


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux only")
def test_this_machine_is_read_without_error():
    for limit in host.memory_limits():
        assert limit.limit > 0 and limit.used >= 0


def test_cudamem_capacity_on_the_cpu_is_the_limit(tmp_path, monkeypatch):
    """``%%cudamem``'s cpu capacity was the machine's RAM whatever the container allowed."""
    from torchgpu_magic.cudamem import targetdevice

    root = tree(tmp_path, "0::/pod\n", {"sys/fs/cgroup/pod/memory.max": f"{GiB}\n"})
    monkeypatch.setattr(host, "ROOT", root)
    monkeypatch.setattr(host, "GETRLIMIT", no_rlimits)
    capacity, source = targetdevice.host_capacity()
    assert capacity == GiB
    assert source.startswith("the cgroup's memory.max, /sys/fs/cgroup/pod/memory.max; the machine has ")
