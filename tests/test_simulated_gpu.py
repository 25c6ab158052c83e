"""The decisions no CPU test reaches, on the simulated H100 (tests/simulated_gpu.py, fixture
``simulated_gpu``): which device a cell is timed on, ``--cold``'s headline, the count of the cell's waits
for the GPU, the first launch of a hot sample, the launch queue, the SM clock, ``--kernels`` without CUPTI,
``%gpuinfo`` without initialising CUDA, ``--cluster`` following the GPU, and ``%gpumem`` on a MIG slice.

These run in every leg: the fixture installs the simulation for the test (or resets the session's under
``--simulate-gpu``). The simulated GPU is a timeline on the simulated machine's clock (the host's CPU time
and its waits for the GPU), so its kernels (``_sleep``) have exactly known lengths and a loaded machine
changes no span; no real CUDA tensor exists there.
"""
from __future__ import annotations

import warnings

import pytest
from conftest import run, run_error
from IPython.utils.capture import capture_output
from simulated_gpu import LAUNCH_S

MiB = 2**20
CYCLES_PER_US = 1980  # the simulated H100's SM clock, 1980 MHz
LAUNCH_MS = LAUNCH_S * 1e3


@pytest.fixture
def sim(ip, simulated_gpu):
    """The shell and the simulated GPU, with torch and cpu tensors in the namespace."""
    run(ip, "import torch\na = torch.randn(64, 64)\nonce = []")
    return simulated_gpu


def assert_kernel_time(result, kernel):
    """The median is the kernel's time on the GPU: at least the kernel (which the host's enqueue alone is
    not), and at most the kernel plus what the GPU waited for the host's launches (less than the host's
    enqueue time and a launch latency). An order on the simulated machine's one clock, which no load moves."""
    assert kernel <= result.median <= kernel + result.host + LAUNCH_S, result.to_text()


def timed(ip, options, body):
    """``%%cudatime`` of ``body`` on the simulated cuda:0 (``--devices``), its one row's result."""
    return run(ip, f"%%cudatime -o -q --devices cuda:0 {options}\n{body}").rows[0][1]


# ---- the simulation itself ---------------------------------------------------------------------------
def test_the_devices_seen_before_the_gpu_appears_are_asked_again_after(request, monkeypatch):
    """The remembered CUDA count follows torch's C layer: a count taken without the GPU (as every earlier
    test in the ordinary leg takes it) must not hide the simulated one, nor outlive it."""
    import simulated_gpu

    from torchgpu_magic import devices

    if request.config._simulated_gpu is not None or simulated_gpu.usable():
        pytest.skip("needs the CPU build without the session's simulation")
    assert "cuda:0" not in devices.available_devices()
    with monkeypatch.context() as patch:
        simulated_gpu.install(patch)
        assert "cuda:0" in devices.available_devices() and str(devices.resolve("cuda:0")) == "cuda:0"
    assert "cuda:0" not in devices.available_devices()


def test_the_simulation_answers_as_one_h100_with_cuda_13_before_any_kernel(simulated_gpu):
    import torch

    from torchgpu_magic.gpus import nvml

    assert torch.cuda.is_available() and torch.cuda.device_count() == 1 and torch.version.cuda == "13.0"
    assert not torch.cuda.is_initialized()
    props = torch.cuda.get_device_properties(0)
    assert torch.cuda.is_initialized()  # torch's own lazy init ran
    assert (props.name, props.major, props.L2_cache_size) == ("NVIDIA H100 80GB HBM3", 9, 50 * MiB)
    assert not torch._C._cuda_hasPrimaryContext(0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_started = simulated_gpu.clock.now()
    start.record()
    torch.cuda._sleep(1000 * CYCLES_PER_US)  # 1 ms
    end.record()
    host = (simulated_gpu.clock.now() - host_started) * 1e3
    assert end.query() is False and torch._C._cuda_hasPrimaryContext(0)
    torch.cuda.synchronize()
    # the 1 ms kernel, plus at most what the GPU waited for the host to launch it (all on one clock)
    assert 1.0 <= start.elapsed_time(end) <= 1.0 + host + LAUNCH_MS
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        torch.cuda.set_sync_debug_mode("default")
    assert [str(w.message)[:40] for w in seen] == ["Synchronization debug mode is a prototyp"]  # once
    with pytest.raises(NotImplementedError, match="CUDA"):
        torch.ones(1, device="cuda")  # a real CUDA tensor fails: a test reaching one took the CUDA path
    assert nvml.gpu_snapshot(0).name == props.name and nvml.driver_version() == "580.159.04"


# ---- which device (item 1) ----------------------------------------------------------------------------
def test_gpuinfo_names_the_gpu_without_initialising_cuda(ip, sim):
    import torch

    report = run(ip, "%gpuinfo -o")
    assert not torch.cuda.is_initialized() and not torch._C._cuda_hasPrimaryContext(0)
    assert report.torch_can_use_gpu and report.gpus[0].torch_index == 0
    assert report.gpus[0].torch.name == "NVIDIA H100 80GB HBM3" and report.gpus[0].nvml_index == 0
    assert "named from NVML" in report.to_text()


def test_gpuinfo_reads_the_gpus_identities_from_nvml_once(ip, sim, monkeypatch):
    """Before CUDA is initialised, naming torch's GPUs from NVML and matching them to NVML's GPUs are one
    reading of the GPUs' identities, not two (%gpuinfo runs on every call, on every engine of a cluster)."""
    from torchgpu_magic.gpus import gpumap, nvml

    asked: list = []
    real = nvml.gpu_snapshot
    monkeypatch.setattr(nvml, "gpu_snapshot", lambda index, identity_only=False: asked.append(
        (index, identity_only)) or real(index, identity_only))
    report = run(ip, "%gpuinfo -o")
    assert report.gpus[0].torch.name == "NVIDIA H100 80GB HBM3" and "named from NVML" in report.to_text()
    assert asked == [(0, True), (0, False)]  # the identity once, then the figures
    asked.clear()
    (mapping,) = gpumap.gpu_map()  # as the memory panel and the OOM explanation ask
    assert mapping.nvml_index == 0 and asked == [(0, True)]


def test_a_cpu_cell_run_after_cuda_was_initialised_is_timed_on_the_host(ip, sim):
    import torch

    with capture_output():
        run(ip, "%gpuinfo")
    torch.cuda.get_device_properties(0)  # what %gpuinfo did before: CUDA initialised, no kernel run
    assert torch.cuda.is_initialized()
    result = run(ip, "%%cudatime -o -q -n 2 -r 3\ny = a @ a")
    assert (result.device, result.kind, result.clock) == ("cpu", "host", "perf_counter (host time)")
    assert not torch._C._cuda_hasPrimaryContext(0)  # no context for a cell that never used the GPU
    assert not any("launch-bound" in w for w in result.warnings)


def test_a_cell_that_initialises_cuda_is_timed_on_the_gpu(ip, sim):
    body = f"torch.cuda.init()\ntorch.cuda._sleep({200 * CYCLES_PER_US})"
    result = run(ip, f"%%cudatime -o -q -n 1 -r 3\n{body}")
    assert (result.device, result.kind) == ("cuda:0", "device")
    assert_kernel_time(result, 200e-6)


def test_a_cell_of_gpu_work_outside_torchs_dispatcher_is_timed_on_the_gpu(ip, sim):
    """A bare torch.cuda._sleep (or a Triton kernel on tensors made earlier) touches no tensor through an
    op: the cell names CUDA, and CUDA already in use is not enough without that."""
    import torch

    torch.cuda.init()
    result = run(ip, f"%%cudatime -o -q -n 1 -r 3\ntorch.cuda._sleep({200 * CYCLES_PER_US})")
    assert (result.device, result.kind) == ("cuda:0", "device")
    assert_kernel_time(result, 200e-6)


# ---- --cold's headline (item 2) -------------------------------------------------------------------------
def test_the_sleep_calibration_reads_the_gpus_clock_not_the_launch_latency(sim):
    """The calibration every kernel-length check stands on: on the H200 a start event recorded on an idle
    GPU fired a launch latency before the kernel began, and the calibration came out 1.7 % slow."""
    from torchgpu_magic import timing

    assert timing.sleep_cycles_per_ms() == pytest.approx(CYCLES_PER_US * 1e3, rel=1e-4)


@pytest.mark.parametrize("us", [10, 50, 100])
def test_cold_headline_is_the_kernels_device_time(ip, sim, us):
    result = timed(ip, "--cold -r 7 --max-time 2", f"torch.cuda._sleep({us * CYCLES_PER_US})")
    assert result.kind == "device", result.to_text()
    assert result.median == pytest.approx(us * 1e-6, abs=0.5e-6)
    assert not any("other streams" in w for w in result.warnings)
    assert result.wall > result.median + 40e-6  # each loop's wall holds the spin and the synchronize


# ---- the count of the cell's waits for the GPU (item 4) ---------------------------------------------------
@pytest.mark.parametrize("options", ["", "--cold"])
def test_an_empty_cell_waits_for_nothing_and_torchs_prototype_notice_stays_quiet(ip, sim, options):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = timed(ip, f"-r 3 --max-time 1 {options}", "pass")
    assert result.host_syncs == 0 and not any("waits for the GPU" in w for w in result.warnings)
    assert not any("prototype" in str(w.message) for w in seen)


def test_a_cell_that_waits_for_the_gpu_every_run_says_so(ip, sim):
    result = timed(ip, "-n 1 -r 3", f"torch.cuda._sleep({20 * CYCLES_PER_US})\n"
                                    "torch.cuda.current_stream().synchronize()")
    assert result.host_syncs == 1
    assert any(w.startswith("the cell waits for the GPU (1 synchronizing call per run")
               for w in result.warnings)


def test_a_wait_in_the_first_run_only_is_not_the_cells(ip, sim):
    """torch.compile's and triton's autotuning synchronize in the first run; later runs do not wait."""
    body = ("if not once:\n    once.append(1)\n    torch.cuda.current_stream().synchronize()\n"
            f"torch.cuda._sleep({20 * CYCLES_PER_US})")
    result = timed(ip, "-n 1 -r 3", body)
    assert result.host_syncs == 0


def test_the_simulated_gpu_never_sees_the_host_held_up_by_the_machine(simulated_gpu):
    """A host held up between its calls (here 50 ms asleep, as a test preempted on a loaded machine is held
    up) costs the simulated machine's clock only what the host did: the GPU's span stays the kernel's,
    plus at most the host's own time; so no figure read off the simulated GPU depends on the load."""
    import time

    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_started = simulated_gpu.clock.now()
    start.record()
    time.sleep(0.05)
    torch.cuda._sleep(1000 * CYCLES_PER_US)  # 1 ms
    end.record()
    host = (simulated_gpu.clock.now() - host_started) * 1e3
    end.synchronize()
    assert host < 50  # the 50 ms the host was held up are not on the clock
    assert 1.0 <= start.elapsed_time(end) <= 1.0 + host + LAUNCH_MS


def test_a_first_run_that_raises_keeps_the_cells_own_warnings(ip, sim):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        error = run_error(ip, "%%cudatime -q --devices cuda:0\nimport warnings\n"
                              "warnings.warn('careful: the cell says so')\n1 / 0")
    assert isinstance(error, ZeroDivisionError)
    assert any("careful: the cell says so" in str(w.message) for w in seen)


# ---- hot samples: the first launch (item 7) and the launch queue ------------------------------------------
def test_a_hot_sample_leaves_the_first_launch_out(ip, sim):
    """Each sample starts on an idle GPU: its start event is queued behind a spin, so a 200 us kernel timed
    one loop a sample reads 200 us, not 200 us plus the first launch's latency."""
    result = timed(ip, "-n 1 -r 15 --warmup 3", f"torch.cuda._sleep({200 * CYCLES_PER_US})")
    assert result.median == pytest.approx(200e-6, abs=1e-6), result.to_text()
    assert result.wall >= result.median and result.wall < result.median + 45e-6  # the spin left out


def test_a_gpu_bound_cell_that_fills_the_launch_queue_is_not_called_launch_bound(ip, sim):
    """12,000 launches of 20 us: once 1,024 are queued the host blocks on CUDA's full launch queue, so host
    time is device time less the last 1,024 kernels' (over 0.9 x of it) while the GPU never idles; host >=
    0.9 x device would call that launch-bound."""
    result = timed(ip, "-n 1 -r 3 --warmup 1",
                   f"for _ in range(12000):\n    torch.cuda._sleep({20 * CYCLES_PER_US})")
    assert result.host >= 0.9 * result.device_time  # what the old rule looked at
    assert not any(w.startswith("launch-bound") for w in result.warnings), result.to_text()


# ---- the SM clock around the samples ---------------------------------------------------------------
def test_samples_taken_below_75_percent_of_the_max_clock_are_counted_and_explained(ip, sim, monkeypatch):
    import pynvml

    gpu = sim.nvml_module.machine.gpus[0]
    slow = [False]

    def clock():
        slow[0] = not slow[0]
        return 1200 if slow[0] else 1980

    monkeypatch.setitem(gpu.clocks, "sm", clock)
    power_cap = pynvml.nvmlClocksEventReasonSwPowerCap
    monkeypatch.setattr(gpu, "clock_reasons", lambda: power_cap if slow[0] else 0)
    result = timed(ip, "-n 1 -r 10 --warmup 1", f"torch.cuda._sleep({100 * CYCLES_PER_US})")
    assert result.sm_clock == {"max_mhz": 1980, "samples": 10, "below_max": 5, "below_75": 5,
                               "lowest_mhz": 1200, "median_mhz": 1590, "reasons": ["power cap"]}
    assert any(w.startswith("the GPU ran under 75 % of its max SM clock in 5 of 10 samples (lowest 1200 MHz "
                            "of 1980 MHz: power cap)") for w in result.warnings)


def test_at_full_clock_nothing_is_said_about_clocks(ip, sim):
    result = timed(ip, "-n 1 -r 5 --warmup 1", f"torch.cuda._sleep({100 * CYCLES_PER_US})")
    assert result.sm_clock["samples"] == 5 and result.sm_clock["below_max"] == 0
    assert not any("SM clock" in line for line in result.warnings + result.notes)


# ---- the L2 note and --kernels on the simulated GPU ------------------------------------------------
def test_the_l2_note_compares_the_working_set_with_the_gpus_l2(simulated_gpu):
    import torch
    from fake_clock import FakeClock, fake_run

    from torchgpu_magic import timing

    clock = FakeClock(lambda call, loops: 1e-3, kind="device")
    run_ = fake_run(clock, warmup=0, samples=5)
    opts = timing.Options(samples=5)
    cuda = torch.device("cuda", 0)
    fits = timing.result_from(run_, clock, cuda, (0, 0, 0), None, opts, 1, "t", "H100", working_set=8 * MiB)
    assert fits.l2_cache == 50 * MiB and any("fits in the 50.0 MiB L2 cache" in n for n in fits.notes)
    big = timing.result_from(run_, clock, cuda, (0, 0, 0), None, opts, 1, "t", "H100", working_set=2**30)
    assert any("larger than the 50.0 MiB L2 cache" in n for n in big.notes)
    flushed = timing.result_from(run_, clock, cuda, (0, 0, 0), None, timing.Options(samples=5, flush_l2=True),
                                 1, "t", "H100", working_set=8 * MiB)
    assert not any("L2 cache:" in n for n in flushed.notes)


def test_kernels_without_cupti_say_so_rather_than_listing_nothing(ip, sim):
    result = timed(ip, "-n 1 -r 3 --kernels", "y = a[0]\nwith torch.profiler.record_function('step'):\n"
                                              f"    torch.cuda._sleep({20 * CYCLES_PER_US})")
    assert result.kernels == [] and "CUPTI" in result.kernels_empty  # the simulation has no CUPTI
    assert "torch ops but no CUDA activity" in result.kernels_empty  # the view's; 'step' is no op


# ---- --cluster follows the GPU (item 6) ------------------------------------------------------------------
def test_an_engine_times_a_gpu_cell_on_the_gpu_as_the_local_magic_does(ip, sim):
    from torchgpu_magic.cluster import remote

    options = dict(loops=1, samples=3, warmup=1, max_time=2.0, cold=False, flush_l2=False, kernels=False)
    body = f"torch.cuda.init()\ntorch.cuda._sleep({200 * CYCLES_PER_US})"
    reply = remote.call("cudatime", ("", body, options), {})
    assert reply["ok"], reply
    assert (reply["value"]["device"], reply["value"]["clock"]) == ("cuda:0", "CUDA events")
    assert reply["value"]["median"] == pytest.approx(200e-6, rel=0.01)
    cpu = remote.call("cudatime", ("", "a @ a", options), {})["value"]
    assert (cpu["device"], cpu["kind"]) == ("cpu", "host")


# ---- %gpumem on a MIG slice before CUDA is initialised (item 7) ------------------------------------------
def test_gpumem_watches_the_mig_slice_torch_will_use_before_cuda_is_initialised(ip, sim, fake_nvml,
                                                                                 fresh_env):
    import torch

    fake_nvml("mig")
    with capture_output() as shown:
        run(ip, "%gpumem --text")
    run(ip, "%gpumem stop")
    text = shown.stdout + "".join(o.data.get("text/plain", "") for o in shown.outputs)
    assert not torch.cuda.is_initialized()
    assert "MIG 3g.20gb" in text and "13.0 MiB / 19.5 GiB" in text, text  # the slice, not the 40 GB GPU
