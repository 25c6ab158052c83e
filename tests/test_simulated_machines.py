"""Every magic on every simulated machine: what the simulated H100 gives, the M2 Max (mps), the Intel Max
1100 (xpu) and the MI300X under ROCm give too: device-time timing, the memory figures, the inventory,
the out-of-memory explanation, %%cudamem measured and predicted. The machines are tests/simulated_*.py,
installed per test (or the run's under ``--simulate NAME``; the others then skip).
"""
from __future__ import annotations

import pytest
from conftest import run

MiB = 2**20
MACHINES = ("h100", "mps", "xpu", "rocm")
KIND = {"h100": "cuda", "rocm": "cuda", "mps": "mps", "xpu": "xpu"}
CLOCK = {"h100": "CUDA events", "rocm": "ROCm events", "mps": "MPS events", "xpu": "XPU events"}


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
    assert result.median == pytest.approx(seconds, rel=0.01 if name in ("h100", "rocm") else 0.05)
    assert result.min >= seconds * 0.999  # the events never time less than the work
    assert result.device_name == {"h100": "NVIDIA H100 80GB HBM3", "rocm": "AMD Instinct MI300X",
                                  "mps": "Apple M2 Max", "xpu": "Intel(R) Data Center GPU Max 1100"}[name]


@pytest.mark.parametrize("name", ["mps", "xpu"])
def test_a_cell_of_tensors_on_the_device_is_timed_there_without_devices(ip, request, name):
    sim = request.getfixturevalue(f"simulated_{name}")
    ip.user_ns["x"] = standin(name, sim, (256, 256), 3e-3)  # far above the stand-in's own host cost
    result = run(ip, "%%cudatime -o -q -n 10 -r 5 --no-roofline\ny = x + x")
    assert result.device == ("mps:0" if name == "mps" else "xpu:0") and result.kind == "device"
    # without a spin to wait behind, a sample's device time holds the host's first dispatch: over ten
    # loops of 3 ms queued back to back that is a few percent
    assert result.median == pytest.approx(3e-3, rel=0.05)


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
