"""devices.py for real: spec parsing, the errors people see, switching and restoring torch's defaults,
and moving objects. Runs on CPU with the `meta` device; CUDA paths are under the `gpu` marker."""

from __future__ import annotations

import re

import pytest
import simulated_legs
import torch

from torchgpu_magic import devices, torchapi
from torchgpu_magic.errors import MagicInputError

HAS_CUDA = torch.cuda.is_available()
CPU_ONLY_BUILD = torch.version.cuda is None and getattr(torch.version, "hip", None) is None
no_accelerator = pytest.mark.skipif(
    HAS_CUDA or devices._xpu_count() > 0 or devices._mps_available(), reason="an accelerator is present"
)


def _mode_depth() -> int:
    return torch._C._len_torch_function_stack()


@pytest.fixture(autouse=True)
def _clean_torch_state():
    """Each test must leave torch's default device, dtype and mode stack as it found them."""
    before = (torchapi.default_device_setting(), torch.get_default_dtype(), _mode_depth())
    yield
    after = (torchapi.default_device_setting(), torch.get_default_dtype(), _mode_depth())
    assert after == before


# ---- resolve / available_devices ------------------------------------------------------------------


def test_available_devices_lists_cpu_meta_and_each_gpu():
    found = devices.available_devices()
    assert found[0] == "cpu" and found[-1] == "meta"
    assert [d for d in found if d.startswith("cuda:")] == [f"cuda:{i}" for i in range(devices._cuda_count())]


@pytest.mark.parametrize("spec", ["cpu", "CPU", "  cpu ", "'cpu'", '"cpu"', "cpu:0", torch.device("cpu")])
def test_cpu_spellings(spec):
    assert devices.resolve(spec) == torch.device("cpu")


@pytest.mark.parametrize("spec", ["meta", " Meta", "META", "meta:0", torch.device("meta")])
def test_meta_spellings(spec):
    assert devices.resolve(spec) == torch.device("meta")


@no_accelerator
def test_auto_is_cpu_without_an_accelerator():
    assert devices.resolve("auto") == torch.device("cpu")
    assert devices.resolve(" AUTO ") == torch.device("cpu")


@pytest.mark.skipif(HAS_CUDA, reason="this build has a usable CUDA GPU")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_a_gpu_says_why_and_lists_what_exists(spec, request):
    with pytest.raises(devices.DeviceUnavailable) as info:
        devices.resolve(spec)
    message = str(info.value)
    assert "\n" not in message
    assert "not available" in message
    assert f"Devices here: {simulated_legs.devices_here(request.config)}" in message
    if CPU_ONLY_BUILD:
        assert "CPU-only build" in message


@pytest.mark.parametrize(
    "spec, guess",
    [
        ("cdua:0", "cuda:0"),
        ("gpu", "cuda"),
        ("gpu:1", "cuda:1"),
        ("mta", "meta"),
        ("atuo", "auto"),
        ("cpus", "cpu"),
    ],
)
def test_typos_get_a_did_you_mean(spec, guess):
    with pytest.raises(MagicInputError) as info:
        devices.resolve(spec)
    assert not isinstance(info.value, devices.DeviceUnavailable)  # a typo is not "unavailable"
    message = str(info.value)
    if devices._missing(guess.split(":")[0]) is None:  # the guess exists here: suggest it
        assert f"Did you mean '{guess}'?" in message
    else:  # never suggest what would fail next: say torch's name and why it is not here
        assert "Did you mean" not in message
        assert f"; torch calls it '{guess}', which is not available here: " in message
    assert message.count("Devices here:") == 1 and "Devices here: cpu" in message and "\n" not in message


def test_gpu_without_cuda_says_why_instead_of_suggesting_cuda(monkeypatch):
    monkeypatch.setattr(devices, "_cuda_count", lambda: 0)
    with pytest.raises(MagicInputError) as info:
        devices.resolve("gpu")
    message = str(info.value)
    assert message.startswith("unknown device 'gpu'; torch calls it 'cuda', which is not available here: ")
    assert "Did you mean" not in message
    monkeypatch.setattr(devices, "_cuda_count", lambda: 2)
    with pytest.raises(MagicInputError, match=r"Did you mean 'cuda'\?"):
        devices.resolve("gpu")


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "   ",
        "zzz",
        "cuda:-1",
        "cuda:x",
        "cpu:1",
        "meta:2",
        "cuda 0",
        "1",
        "__import__('os')",
        "cpu\nmeta",
        "torch.device('cpu')",
    ],
)
def test_malformed_specs_are_one_line_errors(spec):
    with pytest.raises(MagicInputError) as info:
        devices.resolve(spec)
    assert "\n" not in str(info.value)
    assert "Devices here:" in str(info.value)


def test_mps_and_xpu_absent_are_unavailable_not_malformed():
    if not devices._mps_available():
        with pytest.raises(devices.DeviceUnavailable, match="'mps' is not available"):
            devices.resolve("mps")
    if not devices._xpu_count():
        with pytest.raises(devices.DeviceUnavailable, match="'xpu:1' is not available"):
            devices.resolve("xpu:1")


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64", "FLOAT64", "torch.bfloat16"])
def test_parse_dtype_accepts_the_floating_defaults(name):
    assert devices.parse_dtype(name) == getattr(torch, name.lower().replace("torch.", ""))


@pytest.mark.parametrize("name", ["int8", "float", "half", "complex64", "", "float3"])
def test_parse_dtype_lists_the_valid_names(name):
    with pytest.raises(MagicInputError, match="valid: float16, bfloat16, float32, float64"):
        devices.parse_dtype(name)


# ---- every device a magic takes: one function, one wording -----------------------------------------
# (the magic's line with {spec} for the device, what its error starts with, what the option takes, whether
# the device must exist here). Every device-taking option of every magic.
OPTIONS = [
    ("%%ontorch {spec}\nx = 1", "%%ontorch: ", devices.EVERY, True),
    ("%ontorch {spec}", "%ontorch: ", devices.EVERY, True),
    ("%%ontorch cpu --fallback {spec}\nx = 1", "%%ontorch: --fallback: ", devices.EVERY, True),
    ("%%cudatime -n 1 -r 3 --devices {spec}\nx = 1", "%%cudatime: --devices: ",
     ("auto", "local", "cpu", "cuda", "mps", "xpu"), True),
    ("%cudatime -n 1 -r 3 --devices cpu,{spec} x = 1", "%cudatime: --devices: ",
     ("auto", "local", "cpu", "cuda", "mps", "xpu"), True),
    ("%%cudatime --cluster nowhere --devices {spec}\nx = 1", "%%cudatime: --devices: ",
     ("auto", "local", "cpu", "cuda", "mps", "xpu"), False),
    ("%%cudamem {spec}\nx = 1", "%%cudamem: ", ("cpu", "cuda", "mps", "xpu"), True),
    ("%%cudamem --predict {spec}\nx = 1", "%%cudamem: --predict: ", ("cpu", "cuda", "mps", "xpu"), False),
    ("%%cudamem --fit x --capacity 1GiB {spec}\nx = 1", "%%cudamem: --predict: ",
     ("cpu", "cuda", "mps", "xpu"), False),
    ("%gpumem holders {spec}", "%gpumem: ", ("cpu", "cuda", "mps", "xpu"), True),
    ("%whereis --device {spec}", "%whereis: --device: ", devices.KINDS, True),
]
BAD = ["gpu", "cpü", "cuda:7", "mps", "zzz", "cpu:1", "meta", "xpu:3"]


def _state(ip) -> tuple:
    """What a refused magic must leave as it was: torch's default device and dtype, the namespace."""
    return torchapi.default_device_setting(), torch.get_default_dtype(), dict(ip.user_ns)


@pytest.mark.parametrize("line, prefix, takes, exists", OPTIONS, ids=[o[0].split("{")[0] for o in OPTIONS])
def test_every_device_option_is_checked_by_one_function_with_one_wording(ip, line, prefix, takes, exists):
    from conftest import run, run_error
    from IPython.core.error import UsageError

    from torchgpu_magic.magics.cudatime import NOTHING_TO_TIME

    refused = {"meta": NOTHING_TO_TIME} if "cudatime" in line else None  # why --devices refuses meta
    run(ip, "import torch\nx = torch.ones(3)")
    for spec in BAD:
        try:
            devices.device_option(spec, takes, exists, refused)
        except MagicInputError as exc:
            expected = str(exc)
        else:
            continue  # a device this machine has (under --simulate-gpu, cuda is one)
        before = _state(ip)
        error = run_error(ip, line.format(spec=spec))
        assert isinstance(error, UsageError), (line, spec, error)
        message = str(error)
        assert "\n" not in message and message.startswith(prefix + expected), (message, expected)
        assert f"'{spec}'" in message and "\\x" not in message  # the user's text as typed
        assert re.search(r"[.?] (Devices here|It takes): \w", message), message  # what is valid
        assert _state(ip) == before


@pytest.mark.parametrize("line, prefix, takes, exists", OPTIONS, ids=[o[0].split("{")[0] for o in OPTIONS])
def test_no_device_option_is_checked_anywhere_else(ip, monkeypatch, line, prefix, takes, exists):
    """Every option's device goes through devices.device_option: replaced by one that refuses everything,
    every magic says what it says, with its own prefix."""
    from conftest import run, run_error

    run(ip, "import torch\nx = torch.ones(3)")

    def refuse(spec, *args, **kwargs):
        raise MagicInputError(f"refused {spec!r} here")

    monkeypatch.setattr(devices, "device_option", refuse)
    error = run_error(ip, line.format(spec="cpu"))
    assert str(error).startswith(f"{prefix}refused 'cpu' here"), str(error)


def test_cudamem_suggests_a_predict_it_accepts(ip):
    """%%cudamem DEVICE for a GPU absent here suggests --predict in words --predict takes (cuda, not gpu),
    and that suggestion then runs."""
    from conftest import run, run_error

    if devices._cuda_count():
        pytest.skip("a CUDA GPU is here: %%cudamem gpu measures on it")
    run(ip, "import torch\nx = torch.ones(3)")
    for spec, meant in (("gpu", "cuda"), ("cuda:3", "cuda:3"), ("GPU:1", "cuda:1")):
        message = str(run_error(ip, f"%%cudamem {spec}\ny = x * 2"))
        assert message.endswith(f"; to predict for it without one, use --predict {meant}"), message
        run(ip, f"%%cudamem --predict {meant} -q\ny = x * 2")
    assert "--predict" not in str(run_error(ip, "%%cudamem cpü\ny = x * 2"))  # a typo of cpu, which is here


def test_user_text_is_echoed_as_typed_and_control_characters_escaped():
    assert devices.shown("cpü") == "cpü"
    assert devices.shown("cp\nu\x1b") == "cp\\nu\\x1b"
    with pytest.raises(MagicInputError, match="unknown device 'cpü'"):
        devices.resolve("cpü")


# ---- use_device -------------------------------------------------------------------------------------


def test_use_device_meta_puts_tensors_modules_and_parameters_on_meta():
    with devices.use_device(torch.device("meta")) as device:
        assert device == torch.device("meta")
        assert torch.ones(3).device.type == "meta"
        assert torch.tensor([1.0]).device.type == "meta"
        layer = torch.nn.Linear(4, 2)
        assert {p.device.type for p in layer.parameters()} == {"meta"}
        assert devices.default_device() == torch.device("meta")
    assert torch.ones(3).device.type == "cpu"


def test_use_device_sets_and_restores_dtype():
    with devices.use_device(torch.device("meta"), torch.float64):
        assert torch.ones(1).dtype == torch.float64
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("exc", [ValueError("boom"), KeyboardInterrupt(), SystemExit(3)])
def test_use_device_restores_after_any_exception(exc):
    with pytest.raises(type(exc)):
        with devices.use_device(torch.device("meta"), torch.float16):
            raise exc
    assert torch.ones(1).device.type == "cpu"
    assert torch.get_default_dtype() == torch.float32
    assert torchapi.default_device_setting() is None


def test_use_device_nests_and_unwinds_in_order():
    with devices.use_device(torch.device("meta"), torch.float64):
        with devices.use_device(torch.device("cpu")):
            assert torch.ones(1).device.type == "cpu"
            assert torch.ones(1).dtype == torch.float64  # dtype not given: inherited
            with devices.use_device(torch.device("meta"), torch.bfloat16):
                assert torch.ones(1).dtype == torch.bfloat16
            assert torch.ones(1).dtype == torch.float64
        assert torch.ones(1).device.type == "meta"
    assert torch.ones(1).device.type == "cpu"


def test_cpu_leaves_no_device_mode_behind():
    """cpu is torch's default anyway: no DeviceContext, so no per-call cost (pytorch #92701)."""
    with devices.use_device(torch.device("cpu")):
        assert torchapi.default_device_setting() is None
        assert _mode_depth() == 0
    with devices.use_device(torch.device("meta")):
        assert _mode_depth() == 1


def test_restores_a_default_someone_else_set_exactly():
    torch.set_default_device("meta")
    try:
        with devices.use_device(torch.device("cpu")):
            assert torch.ones(1).device.type == "cpu"
        assert torchapi.default_device_setting() == torch.device("meta")
        assert torch.ones(1).device.type == "meta"
    finally:
        torch.set_default_device(None)


def test_restores_even_when_the_block_changes_the_default_itself():
    with devices.use_device(torch.device("meta")):
        torch.set_default_device("cpu")
        torch.set_default_dtype(torch.float64)
    assert torchapi.default_device_setting() is None
    assert torch.get_default_dtype() == torch.float32


def test_inside_a_torch_device_block_cpu_still_means_cpu():
    with torch.device("meta"):
        with devices.use_device(torch.device("cpu")):
            assert torch.ones(1).device.type == "cpu"
        assert torch.ones(1).device.type == "meta"


def test_current_state_roundtrip():
    state = devices.current_state()
    devices.apply(torch.device("meta"), torch.float16, state)
    assert torch.ones(1).device.type == "meta"
    state.restore()
    assert devices.current_state() == state


def test_synchronize_is_a_no_op_on_cpu_and_meta():
    devices.synchronize(torch.device("cpu"))
    devices.synchronize("meta")


# ---- on a real GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_cuda_resolves_with_index_and_out_of_range_lists_gpus():
    count = torch.cuda.device_count()
    assert devices.resolve("cuda").type == "cuda" and devices.resolve("cuda").index is not None
    assert devices.resolve("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(devices.DeviceUnavailable) as info:
        devices.resolve(f"cuda:{count}")
    assert f"torch sees {count} CUDA" in str(info.value) and "cuda:0" in str(info.value)
    assert devices.resolve("auto").type == "cuda"


@pytest.mark.gpu
def test_gpu_use_device_makes_cuda_the_default_and_restores_it():
    with devices.use_device(torch.device("cuda", 0)):
        assert torch.ones(1).device == torch.device("cuda", 0)
        assert torch.zeros(1, device="cpu").cuda().device == torch.device("cuda", 0)
        devices.synchronize(torch.device("cuda", 0))
    assert torch.ones(1).device.type == "cpu"


@pytest.mark.gpu
def test_gpu_use_device_sets_current_device_for_dot_cuda_and_restores_it():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: on one, the last GPU is the current one already, so nothing switches")
    last = torch.cuda.device_count() - 1
    before = torch.cuda.current_device()
    assert before != last
    with devices.use_device(torch.device("cuda", last)):
        assert torch.cuda.current_device() == last
        assert torch.ones(1).device == torch.device("cuda", last)
        assert torch.zeros(1, device="cpu").cuda().device == torch.device("cuda", last)
        assert torch.zeros(1, device="cuda").device == torch.device("cuda", last)
        devices.synchronize(torch.device("cuda", last))
    assert torch.cuda.current_device() == before
    assert torch.ones(1).device.type == "cpu"
