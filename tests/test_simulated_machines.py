"""Every magic on every simulated machine: what the simulated H100 gives, the M2 Max (mps), the Intel Max
1100 (xpu) and the MI300X under ROCm give too: device-time timing, the memory figures, the inventory,
the out-of-memory explanation, %%cudamem measured and predicted. The machines are tests/simulated_*.py,
installed per test (or the run's under ``--simulate NAME``; the others then skip).
"""
from __future__ import annotations

import json

import pytest
from conftest import run

MiB = 2**20
MACHINES = ("h100", "mps", "xpu", "rocm")
KIND = {"h100": "cuda", "rocm": "cuda", "mps": "mps", "xpu": "xpu"}
CLOCK = {"h100": "CUDA events", "rocm": "ROCm events", "mps": "MPS events", "xpu": "XPU events"}
NAMES = {"h100": "NVIDIA H100 80GB HBM3", "rocm": "AMD Instinct MI300X", "mps": "Apple M2 Max",
         "xpu": "Intel(R) Data Center GPU Max 1100"}


@pytest.fixture(params=MACHINES)
def machine(request, ip):
    """(name, simulation) of one simulated machine, with ``work(seconds)`` in the shell's namespace: device
    work of known length (a ``_sleep`` kernel on CUDA / ROCm, a command buffer / SYCL kernel on MPS / XPU)."""
    import torch

    name = request.param
    sim = request.getfixturevalue("simulated_gpu" if name == "h100" else f"simulated_{name}")
    if name in ("h100", "rocm"):
        hz = 2100e6 if name == "rocm" else 1980e6
        ip.user_ns["work"] = lambda seconds: torch.cuda._sleep(int(seconds * hz))
    else:
        ip.user_ns["work"] = sim.launch
    ip.user_ns["torch"] = torch
    return name, sim


def shown(captured):
    """What a captured cell printed and displayed, as plain text."""
    return captured.stdout + "".join(o.data.get("text/plain", "") for o in captured.outputs)


def standin(name, sim, shape, op_seconds):
    """A tensor on the machine's device whose ops each take ``op_seconds`` there (no data)."""
    import torch

    if name == "mps":
        from simulated_mps import mps_standin

        return mps_standin(sim, shape, torch.float32, op_seconds)
    from simulated_xpu import xpu_standin

    return xpu_standin(sim, shape, torch.float32, op_seconds)


# ---- %%cudatime -----------------------------------------------------------------------------------------
def test_cudatime_gives_device_time_from_the_backends_events(ip, machine):
    name, _ = machine
    kind = KIND[name]
    # CUDA and ROCm queue the start event behind a spin, so 200 us of work reads 200 us; MPS and XPU have
    # none, so a sample's device time also holds the host's gap before its first launch: 5 ms of work
    # keeps that gap small beside it
    seconds = 200e-6 if name in ("h100", "rocm") else 5e-3
    result = run(ip, f"%%cudatime -o -q -n 1 -r 5 --devices {kind}:0\nwork({seconds})").rows[0][1]
    assert (result.kind, result.clock) == ("device", CLOCK[name]), result.to_text()
    assert result.device == f"{kind}:0"
    assert result.min >= seconds * 0.999  # the events never time less than the work
    # ... nor more than the work plus the host's own time queueing it, whatever the machine's load
    assert result.median <= seconds + result.host + 1e-5
    if name in ("h100", "rocm"):  # the spin hides the launch: a sample the host kept up with is exact
        assert result.min == pytest.approx(seconds, rel=0.01)
    assert result.device_name == NAMES[name]


@pytest.mark.parametrize("name", ["mps", "xpu"])
def test_a_cell_of_tensors_on_the_device_is_timed_there_without_devices(ip, request, name):
    sim = request.getfixturevalue(f"simulated_{name}")
    ip.user_ns["x"] = standin(name, sim, (256, 256), 3e-3)  # far above the stand-in's own host cost
    result = run(ip, "%%cudatime -o -q -n 10 -r 5 --no-roofline\ny = x + x")
    assert result.device == ("mps:0" if name == "mps" else "xpu:0") and result.kind == "device"
    # without a spin to wait behind, a sample's device time also holds the host's dispatch before the
    # work: never less than the work, never more than the work plus the host's own time
    assert 3e-3 * 0.999 <= result.median <= 3e-3 + result.host + 1e-5


def test_mps_says_torch_keeps_no_peak_rather_than_a_false_zero(ip, simulated_mps):
    simulated_mps.allocate(64 * MiB)
    ip.user_ns["work"] = simulated_mps.launch
    text = run(ip, "%%cudatime -o -q -n 1 -r 3 --devices mps\nwork(1e-4)").rows[0][1].to_text()
    assert "64.0 MiB allocated before" in text and "peak N/A (torch keeps no peak" in text


def test_a_backend_whose_events_cannot_time_falls_back_to_synchronized_wall_time(ip, simulated_xpu,
                                                                                 monkeypatch):
    import torch

    class Untimed:
        def __init__(self, enable_timing=False):
            if enable_timing:
                raise RuntimeError("timing events are not supported on this device")

    monkeypatch.setattr(torch.xpu, "Event", Untimed)
    ip.user_ns["work"] = simulated_xpu.launch
    torch.xpu.init()  # as the cell's first XPU op would
    result = run(ip, "%%cudatime -o -q -n 1 -r 3 --devices xpu\nwork(2e-4)").rows[0][1]
    assert (result.kind, result.clock) == ("wall", "perf_counter + synchronize")
    assert result.median >= 2e-4  # the wall holds the work
    assert "torch's events cannot time on xpu:0" in result.to_text()


# ---- %gpumem ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mps", "xpu"])
def test_gpumem_shows_the_device_and_a_line_per_cell_with_its_memory(ip, request, name):
    from IPython.utils.capture import capture_output

    sim = request.getfixturevalue(f"simulated_{name}")
    ip.user_ns["sim"] = sim
    if name == "xpu":
        run(ip, "import torch\ntorch.xpu.init()")  # as the first xpu tensor would
    with capture_output() as started:
        run(ip, "%gpumem --text")
    try:
        label = "mps" if name == "mps" else "xpu:0"
        text = shown(started)
        assert label in text and NAMES[name] in text
        if name == "mps":  # current and driver-allocated memory against the working-set limit
            assert "driver-allocated / working-set limit" in text and "21.3 GiB" in text
            assert "torch keeps no peak on MPS" in text
        else:
            assert "used / total" in text and "48.0 GiB" in text
        with capture_output() as cell:
            run(ip, "sim.allocate(256 * 2**20)")
        assert f"{label} +256 MiB (peak 256 MiB)" in cell.stdout, cell.stdout
        record = run(ip, "%gpumem --records")[-1]
        assert [(g.label, g.delta) for g in record.gpus] == [(label, 256 * MiB)]
    finally:
        run(ip, "%gpumem stop")


def test_on_mps_the_peak_is_tracked_by_sampling_where_torch_keeps_none(simulated_mps):
    from torchgpu_magic import accelerators, gpumem

    sampler = gpumem.Sampler(gpumem.accelerator_targets(), interval=0.05)
    simulated_mps.allocate(512 * MiB)
    sampler.sample_now()
    simulated_mps.free(384 * MiB)
    (gpu,) = sampler.sample_now().gpus
    assert accelerators.peak("mps") is None  # torch has none to give
    assert (gpu.allocated, gpu.peak, gpu.reserved, gpu.total) == (128 * MiB, 512 * MiB, 512 * MiB,
                                                                    32 * 2**30 * 2 // 3)


def test_gpumem_on_rocm_reads_amd_smi_for_the_gpu_and_this_process(ip, simulated_rocm):
    import torch
    from IPython.utils.capture import capture_output

    from torchgpu_magic import gpumem

    torch.cuda.init()
    torch.cuda.get_device_properties(0)
    torch.cuda.synchronize()  # HIP's context: the runtime holds its memory on the GPU
    (target,) = gpumem.accelerator_targets()
    assert (target.label, target.name, target.amdsmi_index, target.nvml_index) == (
        "cuda:0", "AMD Instinct MI300X OAM", 0, None)
    (gpu,) = gpumem.collect([target]).gpus
    assert (gpu.total, gpu.process, gpu.others) == (196288 * MiB, 512 * MiB, 0)
    with capture_output() as started:
        run(ip, "%gpumem --text")
    run(ip, "%gpumem stop")
    assert "AMD SMI used / total" in shown(started) and "cuda:0 AMD Instinct MI300X OAM" in shown(started)


# ---- the out-of-memory explanation -----------------------------------------------------------------------
def _explanation(ip, code):
    """What a failing cell printed above its traceback: the out-of-memory explanation."""
    import re

    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        ip.run_cell(code, store_history=True)
    text = captured.stdout
    assert text.startswith("gpumem: out of memory on "), text
    return re.split(r"^-{20,}$", text, maxsplit=1, flags=re.M)[0]


def test_mps_out_of_memory_is_explained_with_the_watermark_advice_and_its_risk(ip, simulated_mps):
    """MPSAllocator's own wording: its limit, 1.7 x the working-set limit (36.3 GiB on a 32 GB M2 Max),
    counts the other allocations too (26 GiB here), so 8 GiB more fails although the 12 GiB of tensors
    would fit in the Mac's memory: raising the watermark is offered, only with its risk."""
    ip.user_ns["sim"] = simulated_mps
    text = _explanation(ip, "sim.allocate(30 * 2**30)\nsim.free(26 * 2**30)\nsim.allocate(8 * 2**30)")
    assert text.startswith("gpumem: out of memory on mps: asked 8.00 GiB")
    assert "more than mps has in all" not in text
    advice = text.split("What to do")[1]
    assert "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in advice and "Only with its risk" in advice
    assert "36.3 GiB" in advice and "21.3 GiB" in advice and "restart the kernel" in advice


def test_mps_request_beyond_the_macs_memory_is_not_offered_the_watermark(ip, simulated_mps):
    ip.user_ns["sim"] = simulated_mps
    text = _explanation(ip, "sim.allocate(40 * 2**30)")
    assert "more than mps has in all (36.3 GiB)" in text
    assert "32.0 GiB of unified memory in all" in text and "Only with its risk" not in text


def test_xpu_out_of_memory_is_explained_with_the_devices_figures(ip, simulated_xpu):
    import torch

    torch.xpu.init()
    ip.user_ns["sim"] = simulated_xpu
    text = _explanation(ip, "sim.allocate(30 * 2**30)\nsim.allocate(30 * 2**30)")
    assert text.startswith("gpumem: out of memory on xpu:0: asked 30.0 GiB; 18.0 GiB free when it failed; "
                           "18.0 GiB free now, of 48.0 GiB")
    assert "PYTORCH_MPS" not in text


def test_rocm_out_of_memory_in_hips_wording_is_explained_on_the_gpu(ip, simulated_rocm):
    import torch

    torch.cuda.init()
    ip.user_ns["torch"] = torch
    text = _explanation(ip, 'raise torch.OutOfMemoryError("HIP out of memory. Tried to allocate 2.00 GiB. '
                            'GPU 0 has a total capacity of 191.98 GiB of which 1.20 GiB is free. Of the '
                            'allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by '
                            'PyTorch but unallocated.")')
    assert text.startswith("gpumem: out of memory on cuda:0: asked 2.00 GiB; 1.20 GiB free when it failed")


# ---- %%cudamem -------------------------------------------------------------------------------------------
MODEL = "import torch\nmodel = torch.nn.Linear(1024, 1024)\nx = torch.randn(64, 1024)"
STEP = "y = model(x)\ny.sum().backward()"


def _text(ip, report):
    return ip.display_formatter.formatters["text/plain"](report)


@pytest.mark.parametrize("name", ["mps", "xpu", "rocm"])
def test_cudamem_predicts_for_the_machines_gpu_with_its_capacity(ip, request, name):
    request.getfixturevalue(f"simulated_{name}")
    run(ip, MODEL)
    kind = "cuda" if name == "rocm" else name
    base = run(ip, f"%%cudamem --predict cpu -o -q\n{STEP}").peak  # the cell's tensors alone
    report = run(ip, f"%%cudamem --predict {kind} -o -q\n{STEP}")
    text = _text(ip, report)
    # MPS and XPU: the tensors' bytes; CUDA's model adds the caching allocator's rounding and cuBLAS
    assert report.mode == "predicted" and (report.peak == base if name != "rocm" else
                                           report.peak >= base + 33 * MiB)
    assert f"standing in for {kind}" in text  # a CPU build cannot run fake GPU tensors: cpu stands in
    capacity = {"mps": 32 * 2**30 * 2 // 3, "xpu": 49136 * MiB, "rocm": 200998912 * 1024}[name]
    assert report.capacity == capacity
    if name == "mps":  # unified memory: the capacity is the working-set limit; no CUDA allowances
        assert "recommendedMaxWorkingSetSize" in text and "CUDA context" not in text
    if name == "rocm":
        assert "ROCm: the allowances are CUDA's figures" in text and "GPU generation: unknown" in text


def test_cudamem_predicts_for_a_mac_without_one(ip, request):
    if getattr(request.config, "_simulated_machine", None) == "mps":
        pytest.skip("this run simulates a Mac")
    run(ip, MODEL)
    report = run(ip, f"%%cudamem --predict mps -o -q\n{STEP}")
    assert report.capacity is None and report.peak == run(ip, f"%%cudamem --predict cpu -o -q\n{STEP}").peak
    report = run(ip, f"%%cudamem --predict mps --capacity 21GiB -o -q\n{STEP}")
    assert report.capacity == 21 * 2**30 and "fits in 21.0 GiB" in _text(ip, report)


@pytest.mark.parametrize("name", ["mps", "xpu"])
def test_cudamem_measures_on_the_device_with_torchs_figure_where_torch_keeps_one(ip, request, name):
    sim = request.getfixturevalue(f"simulated_{name}")
    ip.user_ns["sim"] = sim
    run(ip, MODEL + ("\ntorch.xpu.init()" if name == "xpu" else ""))
    report = run(ip, f"%%cudamem {name} -o -q\nsim.allocate(3 * 2**20)\n{STEP}")
    text = _text(ip, report)
    assert report.mode == "measured" and report.device == f"{name}:0"
    if name == "xpu":
        assert report.torch_max_allocated == 3 * MiB
        assert "torch's max_memory_allocated during the cell: 3.00 MiB" in text
    else:
        assert report.torch_max_allocated is None and "torch keeps no peak on MPS" in text


# ---- %gpuinfo --------------------------------------------------------------------------------------------
def test_gpuinfo_on_the_mac_names_the_chip_and_its_unified_memory(ip, simulated_mps):
    report = run(ip, "%gpuinfo -o")
    text = _text(ip, report)
    assert report.torch_can_use_gpu and report.backend == "MPS" and not report.diagnosis
    (gpu,) = report.devices
    assert (gpu.label, gpu.name, gpu.units, gpu.capacity) == ("mps", "Apple M2 Max", 38, 32 * 2**30 * 2 // 3)
    assert text.startswith("torch can use 1 GPU (MPS) | torch ") and "Apple M2 Max" in text
    assert ("unified memory", "32.0 GiB") in report.machine and ("macOS", "14.5") in report.machine
    assert "working-set limit (torch.mps.recommended_max_memory(), 21.3 GiB)" in text


def test_gpuinfo_on_rocm_reads_amd_smi_without_initialising_hip(ip, simulated_rocm):
    import torch

    report = run(ip, "%gpuinfo -o")
    assert not torch.cuda.is_initialized()  # named from AMD SMI, as NVIDIA's GPUs are from NVML
    (gpu,) = report.devices
    assert (gpu.label, gpu.name, gpu.arch, gpu.units) == ("cuda:0", "AMD Instinct MI300X OAM", "gfx942", 304)
    assert (gpu.total, gpu.temperature, gpu.power) == (196288 * MiB, 38, 132)
    assert report.build == "ROCm, HIP 6.4.43482-0f2d60242" and report.torch_can_use_gpu
    assert "named from AMD SMI" in _text(ip, report)
    torch.cuda.init()
    torch.cuda.synchronize()
    (gpu,) = run(ip, "%gpuinfo -o").devices  # HIP initialised: torch names it, and this process is listed
    assert gpu.name == "AMD Instinct MI300X" and [p[3] for p in gpu.processes] == [True]


def test_gpuinfo_on_rocm_without_amd_smi_shows_torchs_view_with_a_note(ip, simulated_rocm, monkeypatch):
    import sys

    from torchgpu_magic.gpus import amdsmi

    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not installed: import amdsmi fails
    amdsmi.reset()
    report = run(ip, "%gpuinfo -o")
    (gpu,) = report.devices
    assert gpu.name == "AMD Instinct MI300X" and report.torch_can_use_gpu  # torch's own name
    assert "cannot import amdsmi" in _text(ip, report) and "pip install amdsmi" in _text(ip, report)


def test_gpuinfo_on_rocm_says_hip_visible_devices_hides_the_gpu(ip, simulated_rocm, monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")
    report = run(ip, "%gpuinfo -o")
    assert not report.torch_can_use_gpu
    (cause,) = report.diagnosis
    assert cause.cause == "hidden_by_visible_devices" and "HIP_VISIBLE_DEVICES=''" in cause.message
    assert "restart the kernel" in cause.fix
    assert [d.label for d in report.devices] == [None]  # the GPU is listed, torch cannot see it


def test_gpuinfo_on_rocm_warns_of_a_gfx_target_torch_has_no_kernels_for(ip, simulated_rocm, monkeypatch):
    from torchgpu_magic.gpus import amdsmi

    gpu = simulated_rocm.amdsmi.machine.gpus[0]
    gpu.market_name, gpu.gfx = "AMD Radeon RX 6700 XT", "gfx1031"
    amdsmi.reset()
    (warning,) = run(ip, "%gpuinfo -o").warnings
    assert warning.cause == "unsupported_gfx" and "HSA_OVERRIDE_GFX_VERSION" in warning.fix
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "10.3.0")
    (warning,) = run(ip, "%gpuinfo -o").warnings
    assert warning.cause == "gfx_override" and "runs it as gfx1030" in warning.message


def test_gpuinfo_on_the_intel_gpu_names_it_through_torch(ip, simulated_xpu):
    report = run(ip, "%gpuinfo -o")
    (gpu,) = report.devices
    assert (gpu.label, gpu.name, gpu.capacity) == ("xpu:0", "Intel(R) Data Center GPU Max 1100", 49136 * MiB)
    assert report.torch_can_use_gpu and report.backend == "XPU"
    assert run(ip, "%gpuinfo -o -i 0").devices[0].label == "xpu:0"
    with pytest.raises(Exception, match="no GPU index 3 torch can use; valid: xpu:0"):
        run(ip, "%gpuinfo -i 3")


@pytest.mark.parametrize("name", ["mps", "xpu", "rocm"])
def test_gpuinfo_reads_as_well_in_plain_text_as_in_html(ip, request, name):
    request.getfixturevalue(f"simulated_{name}")
    report = run(ip, "%gpuinfo -o")
    text, page = _text(ip, report), report._repr_html_()
    assert text.splitlines()[0] in page.replace("&#x27;", "'")
    for device in report.devices:
        assert str(device.name) in text and str(device.name) in page
    data = json.loads(report.to_json())  # and as data (%gpuinfo --json)
    assert [d["name"] for d in data["devices"]] == [str(d.name) for d in report.devices]
