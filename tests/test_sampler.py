"""gpumem/sampler.py: the interval, per-cell accounting and the Sampler thread, via the package's names."""
from __future__ import annotations

import math
import os
import threading

import fake_pynvml
import pytest
from fake_clock import VirtualTime

from torchgpu_magic import gpumem as memory
from torchgpu_magic import host
from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.gpumem import sampler as sampler_module
from torchgpu_magic.gpus import nvml

MiB = 1024 * 1024
H100 = memory.GPUTarget(None, 0, "NVIDIA H100 80GB HBM3")


def _sampler_threads() -> list:
    return [t for t in threading.enumerate() if t.name == memory.THREAD_NAME]


@pytest.fixture(autouse=True)
def _no_thread_left():
    yield
    assert _sampler_threads() == [], "a test left a sampler thread running"


@pytest.mark.parametrize("good", [0.05, 0.2, "0.5", 1, 60])
def test_interval_accepts_sane_values(good):
    assert memory.validate_interval(good) == float(good)


@pytest.mark.parametrize("bad", [0, -1, 0.01, 61, 1e9, "abc", None, math.nan, math.inf])
def test_interval_rejects_the_rest_with_the_valid_range(bad):
    with pytest.raises(MagicInputError, match="0.05 and 60|number of seconds"):
        memory.validate_interval(bad)


# ---- per-cell accounting ---------------------------------------------------------------------------
def test_cell_log_measures_rss_delta_and_peak():
    log = memory.CellLog(keep=3)
    log.start()
    block = bytearray(96 * MiB)
    block[:: 4096] = b"\x01" * len(block[:: 4096])  # touch every page so it is resident
    record = log.finish(7, "\n\nblock = bytearray(...)\nmore()")
    assert record.number == 7 and record.first_line == "block = bytearray(...)"
    assert record.rss_delta > 80 * MiB
    if record.rss_peak is not None:  # Linux: the kernel's high-water mark, reset before the cell
        assert record.rss_peak >= host.host_memory().rss - 8 * MiB
    del block
    for n in range(5):
        log.start()
        log.finish(n, "x")
    assert [r.number for r in log.records] == [2, 3, 4]
    assert log.finish(9, "no start") is None


def test_cell_peak_rss_is_this_cells_own():
    if not host.reset_peak_rss():
        pytest.skip("this OS cannot reset the peak RSS mark")
    big = bytearray(128 * MiB)
    big[:: 4096] = b"\x01" * len(big[:: 4096])
    del big
    log = memory.CellLog()
    log.start()
    record = log.finish(1, "pass")
    assert record.rss_peak < host.host_memory().rss + 32 * MiB  # the earlier 128 MiB is not counted


# ---- the sampler -----------------------------------------------------------------------------------
# The thread runs on virtual time (tests/fake_clock.py): each test moves the clock itself and looks at
# which ticks happened when, so none depends on how soon a loaded machine schedules the thread.
def _on_virtual_time(interval, work=lambda n: 0.0, **kw):
    """A sampler on virtual time whose callback notes each tick's (virtual) time and spends ``work(n)``
    virtual seconds in the n-th; returns (sampler, clock, tick times, snapshots)."""
    clock, times, snapshots = VirtualTime(), [], []

    def tick(snapshot):
        times.append(clock.now())
        snapshots.append(snapshot)
        clock.spend(work(len(times) - 1))

    sampler = memory.Sampler(kw.pop("targets", []), interval=interval, callback=tick, **kw)
    sampler.schedule = clock
    return sampler, clock, times, snapshots


def test_sampler_thread_is_named_daemon_and_ticks_without_drift():
    sampler, clock, times, _ = _on_virtual_time(0.25, work=lambda n: 0.0625)
    sampler.start()
    try:
        clock.settle(sampler)
        (thread,) = _sampler_threads()
        assert thread.daemon
        for n in range(1, 9):
            clock.advance_to(n * 0.25, sampler)
    finally:
        assert sampler.stop()
    # drift-free: the n-th tick is at start + n * interval, not start + n * (interval + work)
    assert times == [n * 0.25 for n in range(9)]


def test_after_a_stall_the_sampler_skips_the_missed_ticks_instead_of_bursting():
    sampler, clock, times, _ = _on_virtual_time(0.25, work=lambda n: 0.75 if n == 1 else 0.0)
    sampler.start()
    try:
        clock.settle(sampler)
        for moment in (0.25, 1.25, 1.5):  # the tick at 0.25 lasts until 1.0: those at 0.5 and 0.75 are gone
            clock.advance_to(moment, sampler)
    finally:
        assert sampler.stop()
    assert times == [0.0, 0.25, 1.25, 1.5]


def test_stop_ends_the_thread_within_one_interval():
    sampler, clock, times, _ = _on_virtual_time(5.0)
    sampler.start()
    clock.settle(sampler)
    assert sampler.stop()
    # no virtual time passed: the Event cut the 5 s wait short (a thread that slept would never end)
    assert clock.woken == [True] and clock.now() == 0.0 and times == [0.0]
    assert not sampler.running


def test_interval_change_takes_effect_at_once():
    sampler, clock, times, _ = _on_virtual_time(30.0)
    sampler.start()
    try:
        clock.settle(sampler)
        sampler.interval = 0.25  # cuts the 30 s wait short: a tick now, then every 0.25 s
        clock.settle(sampler)
        clock.advance_to(0.25, sampler)
        clock.advance_to(0.5, sampler)
    finally:
        sampler.stop()
    assert times == [0.0, 0.0, 0.25, 0.5]
    with pytest.raises(MagicInputError):
        sampler.interval = 0


def test_history_is_bounded():
    sampler = memory.Sampler([], interval=0.05, history_seconds=0.2)
    for _ in range(20):
        sampler.sample_now()
    assert len(sampler.history) == 5
    sampler.interval = 0.1  # fewer samples cover the same time: the oldest go
    assert len(sampler.history) == 3


def test_callback_errors_are_kept_not_raised():
    ticks = []

    def broken(_):
        ticks.append(1)
        raise RuntimeError("view is gone")

    sampler = memory.Sampler([], interval=0.25, callback=broken)
    sampler.schedule = clock = VirtualTime()
    sampler.start()
    try:
        clock.settle(sampler)
        clock.advance_to(0.25, sampler)
        assert sampler.running and len(ticks) == 2  # the error of the first tick stopped nothing
    finally:
        sampler.stop()
    assert sampler.last_error == "RuntimeError: view is gone"


def test_pause_and_resume():
    sampler, clock, times, _ = _on_virtual_time(0.25)
    sampler.start()
    try:
        clock.settle(sampler)
        clock.advance_to(0.25, sampler)
        sampler.pause()
        clock.advance_to(0.5, sampler)
        clock.advance_to(0.75, sampler)
        assert times == [0.0, 0.25] and sampler.running  # paused: the schedule goes on, no sample
        sampler.resume()  # samples at once, then on the new schedule
        clock.settle(sampler)
        clock.advance_to(1.0, sampler)
    finally:
        sampler.stop()
    assert times == [0.0, 0.25, 0.75, 1.0]


def test_gpu_lost_mid_run_becomes_a_problem_not_a_traceback(fake_nvml):
    module = fake_nvml("h100_busy")
    sampler, clock, _, got = _on_virtual_time(0.25, targets=[H100])
    sampler.start()
    try:
        clock.settle(sampler)
        assert got[-1].gpus[0].process == 30720 * MiB
        module.machine.gpus[0].errors.update(fake_pynvml._lost_errors())
        clock.advance_to(0.25, sampler)
        assert sampler.running and len(got) == 2
    finally:
        sampler.stop()
    lost = got[-1].gpus[0]
    assert lost.used is nvml.NA and lost.process is None
    assert any("fallen off the bus" in p for p in lost.problems)
    assert sampler.last_error is None


def test_sampler_follows_nvml_figures(fake_nvml):
    module = fake_nvml("h100_busy")
    sampler = memory.Sampler([H100], interval=0.05)
    assert sampler.sample_now().gpus[0].process == 30720 * MiB
    module.machine.gpus[0].compute[0].usedGpuMemory = 40960 * MiB
    assert sampler.sample_now().gpus[0].process == 40960 * MiB


def test_peaks_fold_samples_and_cells():
    sampler = memory.Sampler([], interval=0.05)
    first = sampler.sample_now()
    assert first.host.peak_rss >= first.host.rss
    record = memory.CellRecord(1, "x", 0.0, 0.1, 0, first.host.rss + 512 * MiB,
                               (memory.CellGPU(0, 0, 3 * MiB),))
    sampler.note_cell(record)
    assert sampler.sample_now().host.peak_rss == first.host.rss + 512 * MiB
    assert sampler._peaks["cuda:0"] == 3 * MiB
    sampler.reset_peaks()
    assert sampler.latest.host.peak_rss < first.host.rss + 512 * MiB


def test_hundred_start_stop_cycles_leave_no_thread():
    sampler = memory.Sampler([], interval=0.05)
    for _ in range(100):
        sampler.start()
        assert sampler.stop()
    for _ in range(20):
        other = memory.Sampler([], interval=0.05)
        other.start()
        other.stop()
    assert _sampler_threads() == []


class _ScriptedCuda:
    """The device layer's allocator figures for one initialised cuda:0, on scripted figures: allocations
    of known size, exact (what accelerators.allocated / peak / reset_peak read from torch)."""

    def __init__(self) -> None:
        self.allocated_bytes = 0
        self.peak_bytes = 0

    def initialised_devices(self) -> list:
        return [("cuda", 0)]

    def allocated(self, device: tuple) -> int:
        return self.allocated_bytes

    def peak(self, device: tuple) -> int:
        return self.peak_bytes

    def reset_peak(self, device: tuple) -> bool:
        self.peak_bytes = self.allocated_bytes
        return True

    def alloc(self, n: int) -> None:
        self.allocated_bytes += n
        self.peak_bytes = max(self.peak_bytes, self.allocated_bytes)


def test_records_across_1000_cells_are_bounded_in_order_and_exact(monkeypatch):
    import tracemalloc

    cuda = _ScriptedCuda()
    monkeypatch.setattr(sampler_module, "accelerators", cuda)
    log = memory.CellLog(keep=100)

    def cells(first: int, count: int) -> None:
        for n in range(first, first + count):
            log.start()
            cuda.alloc(4096 * n)  # a temporary buffer: counts in the peak only
            cuda.alloc(-4096 * n)
            cuda.alloc(512 * (n % 7) - 512 * 3)  # what the cell keeps (or frees)
            log.finish(n, f"\n  cell_{n}()  \nsecond line")

    cells(0, 1000)
    records = log.records
    assert len(records) == 100 and records.dropped == 900
    assert [r.number for r in records] == list(range(900, 1000))
    for r in records:
        n = r.number
        (g,) = r.gpus
        assert r.first_line == f"cell_{n}()"
        assert g.delta == 512 * (n % 7) - 512 * 3
    # peaks exactly: the allocation before the cell plus the temporary buffer
    allocated = 0
    for n in range(1000):
        if n >= 900:
            g = records[n - 900].gpus[0]
            assert g.peak == allocated + 4096 * n, n
        allocated += 512 * (n % 7) - 512 * 3
    assert records[0].start <= records[-1].start and all(r.seconds >= 0 for r in records)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cells(1000, 1000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(log.records) == 100 and log.records.dropped == 1900
    assert grown < 64 * 1024, f"1000 more cells grew memory by {grown} B"


@pytest.mark.gpu
def test_cell_deltas_are_exact_for_real_cuda_allocations():
    import torch

    torch.zeros(1, device="cuda")  # CUDA initialised before the cells, as after a first .cuda()
    log = memory.CellLog()
    log.start()
    kept = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    temporary = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    del temporary
    before_del = torch.cuda.memory_allocated(0)
    record = log.finish(1, "kept = ...")
    g = next(g for g in record.gpus if g.torch_index == 0)
    assert g.delta == MiB
    assert g.peak == before_del + 4 * MiB
    del kept
    log.start()
    record = log.finish(2, "del kept")
    assert next(g for g in record.gpus if g.torch_index == 0).delta == 0


def test_host_counters_agree_with_psutil_and_reset_the_peak():
    import psutil

    counters = host.HostCounters()
    try:
        rss = counters.rss()
        assert abs(rss - psutil.Process().memory_info().rss) < 16 * MiB
        both = counters.rss_and_peak()
        assert abs(both[0] - rss) < 16 * MiB
        if counters.reset_peak():
            big = bytearray(64 * MiB)
            big[::4096] = b"\x01" * len(big[::4096])
            del big
            now, peak = counters.rss_and_peak()
            assert peak >= now + 48 * MiB
    finally:
        counters.close()


def test_cell_nvml_delta_is_this_process_usage_after_minus_before(fake_nvml, monkeypatch):
    module = fake_nvml("h100_busy")
    cuda = _ScriptedCuda()
    monkeypatch.setattr(sampler_module, "accelerators", cuda)
    log = memory.CellLog(targets=[memory.GPUTarget(0, 0, "NVIDIA H100 80GB HBM3")])
    log.start()
    cuda.alloc(2 * MiB)
    module.machine.gpus[0].compute[0].usedGpuMemory = 40960 * MiB  # the context and cache grew
    (g,) = log.finish(1, "x = torch.ones(...)").gpus
    assert (g.torch_index, g.delta, g.peak, g.nvml_delta) == (0, 2 * MiB, 2 * MiB, 10240 * MiB)
    log.start()
    module.machine.gpus[0].errors.update(fake_pynvml._lost_errors())
    (g,) = log.finish(2, "y").gpus
    assert g.nvml_delta is None and g.delta == 0  # NVML lost: no NVML figure, torch's still there


def test_cell_nvml_delta_on_a_mig_slice_asks_the_slice(fake_nvml, monkeypatch):
    """A non-root user on a MIG slice: the whole GPU refuses its process lists, the slice answers, so the
    per-cell NVML delta must come from the slice (asking the parent gives no figure at all)."""
    module = fake_nvml("mig_user")
    gpu = module.machine.gpus[0]
    mine = fake_pynvml.FakeProcess(os.getpid(), 1024 * MiB, gpuInstanceId=2, computeInstanceId=0)
    gpu.compute.append(mine)
    cuda = _ScriptedCuda()
    monkeypatch.setattr(sampler_module, "accelerators", cuda)
    slice_uuid = gpu.migs[1].uuid
    log = memory.CellLog(targets=[memory.GPUTarget(0, 0, "MIG 3g.20gb", slice_uuid)])
    log.start()
    mine.usedGpuMemory = 1536 * MiB
    (g,) = log.finish(1, "x = torch.ones(...)").gpus
    assert g.nvml_delta == 512 * MiB
