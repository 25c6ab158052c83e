"""%%ontorch / %ontorch through a real InteractiveShell, on CPU with the `meta` device.

The `ip` fixture (conftest) also checks that torch's default device, dtype and thread count are the
same at the end of every test as at its start."""

from __future__ import annotations

import re
import shlex
from contextlib import nullcontext

import pytest
import simulated_legs
import torch
from conftest import run, run_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from torchgpu_magic import devices, torchapi

HAS_CUDA = torch.cuda.is_available()
no_cuda = pytest.mark.skipif(HAS_CUDA, reason="torch sees a CUDA GPU here")


def _state():
    return (torchapi.default_device_setting(), torch.get_default_dtype(),
            torch._C._len_torch_function_stack())


CLEAN = (None, torch.float32, 0)


def cell(ip, code):
    """Run ``code``; return (result, what it printed, less the displayhook's ``Out[...]``) and fail on
    any error."""
    with capture_output() as cap:
        result = run(ip, code)
    return result, "\n".join(line for line in cap.stdout.splitlines() if not line.startswith("Out["))


def failing(ip, code):
    """Run ``code`` that must fail; return (exception, stdout)."""
    with capture_output() as cap:
        error = run_error(ip, code)
    return error, cap.stdout


@pytest.fixture
def tip(ip):
    run(ip, "import torch, numpy as np")
    return ip


# ---- where things land ------------------------------------------------------------------------------


def test_tensors_modules_and_parameters_land_on_meta(tip):
    value, out = cell(
        tip, "%%ontorch meta\nx = torch.ones(3)\nm = torch.nn.Linear(4, 2)\nz = torch.zeros_like(x)\nx.device"
    )
    assert value == torch.device("meta")
    ns = tip.user_ns
    assert ns["x"].device.type == "meta" and ns["z"].device.type == "meta"
    assert {p.device.type for p in ns["m"].parameters()} == {"meta"}
    assert out.strip() == "%%ontorch: ran on meta"
    assert torch.ones(1).device.type == "cpu" and _state() == CLEAN


def test_footer_lists_what_the_default_device_missed(tip):
    run(tip, "before = torch.ones(2)")
    _, out = cell(
        tip,
        "%%ontorch meta\n"
        "a = torch.from_numpy(np.ones(3))\n"
        "b = torch.zeros(2, device='cpu')\n"
        "c = torch.Tensor(4)\n"
        "d = before * 2\n"
        "e = torch.normal(0.0, 1.0, size=(2,))\n"
        "ok = torch.ones(5)\n"
        "before",
    )
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    footer = lines[0]
    assert footer.startswith("%%ontorch: ran on meta; not on meta: ")
    for name, summary in (
        ("a", "float64 (3,)"),
        ("b", "float32 (2,)"),
        ("c", "float32 (4,)"),
        ("d", ""),
        ("e", ""),
    ):
        assert f"{name} (cpu, {summary}" in footer
    assert "ok (" not in footer and "before (" not in footer  # on meta / unchanged by the cell


def test_footer_counts_modules_elsewhere_and_q_silences_it(tip):
    _, out = cell(tip, "%%ontorch meta\nnet = torch.nn.Linear(2, 2, device='cpu')")
    assert "net (cpu, Linear 6 params)" in out
    _, out = cell(tip, "%%ontorch meta -q\nnet2 = torch.nn.Linear(2, 2, device='cpu')")
    assert out == ""


def test_last_expression_is_the_cells_value_and_semicolon_silences_it(tip):
    value, _ = cell(tip, "%%ontorch meta\ny = 2\ny * 21")
    assert value == 42
    value, _ = cell(tip, "%%ontorch meta\ny * 21;")
    assert value is None


@pytest.mark.parametrize("body, value", [
    ("y = 2\ny * 21", 42),
    ("y = 2\n(y *\n 21)\n# a comment after it", 42),
    ("y = 2; y * 21", 42),  # the expression shares its line: compiled from the tree each time
    ("y = 2\ny * 21;", None),
    ("y = 2\nfor i in range(2):\n    y += i", None),
])
def test_a_cell_run_again_reuses_its_code_and_behaves_the_same(tip, body, value):
    """The second run of the same cell reuses the first run's code: the same value, and a traceback
    with the same line numbers."""
    for _ in range(2):
        result, _ = cell(tip, f"%%ontorch meta -q\n{body}")
        assert result == value
    for _ in range(2):
        error, out = failing(tip, f"%%ontorch meta -q\n{body}\nraise ValueError('after')\n1 + 1")
        assert isinstance(error, ValueError)
        line = 2 + body.count("\n") + 1
        assert f"----> {line} raise ValueError('after')" in out, out
    for _ in range(2):  # an error in the shown expression itself, on its own line
        error, out = failing(tip, f"%%ontorch meta -q\n{body}\ny = 0\n\n1 / y")
        assert isinstance(error, ZeroDivisionError)
        assert f"----> {2 + body.count(chr(10)) + 3} 1 / y" in out, out


def test_a_cell_run_again_names_its_own_cell_in_tracebacks(tip):
    """The reused code is this run's cell's: an error in a function and a comprehension the cell defines
    shows this run's cell number and the line, in each run."""
    body = "%%ontorch meta -q\ndef f():\n    return [1 / 0 for _ in range(1)]\n\nf()"
    for _ in range(3):
        number = tip.execution_count
        with capture_output() as cap:
            result = tip.run_cell(body, store_history=True)
        assert isinstance(result.error_in_exec, ZeroDivisionError)
        out = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
        named = re.findall(r"Cell In\[(\d+)\]|<ipython-input-(\d+)-", out)  # IPython 8+ / IPython 7
        assert len(named) == 3 and {"".join(pair) for pair in named} == {str(number)}, out
        assert "----> 3     return [1 / 0" in out, out


def test_an_indented_cell_run_again_shows_its_cleaned_up_lines(tip):
    """A cell pasted indented is compiled from IPython's cleaned-up (dedented) text; run again, it reuses
    that code and registers that same text, so each run's traceback shows the line as it was compiled."""
    body = "%%ontorch meta -q\n    y = 0\n    1 / y"
    for _ in range(2):
        with capture_output() as cap:
            result = tip.run_cell(body, store_history=True)
        assert isinstance(result.error_in_exec, ZeroDivisionError)
        out = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
        assert re.search(r"----> 3 1 / y\n", out), out


# ---- restoring ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raise_",
    [
        "raise ValueError('mine')",
        "raise KeyboardInterrupt",
        "raise SystemExit(2)",
        "torch.ones(2, device='meta') + torch.ones(2, device='cpu')",
    ],
)
def test_defaults_restored_after_errors_and_interrupts(tip, raise_):
    # IPython answers a SystemExit in a cell with a UserWarning ("To exit: use 'exit', 'quit', or Ctrl-D.")
    expected = pytest.warns(UserWarning, match="To exit") if "SystemExit" in raise_ else nullcontext()
    with expected:
        error, out = failing(tip, f"%%ontorch meta --dtype float64\nw = torch.ones(1)\n{raise_}\n")
    assert not isinstance(error, UsageError)
    assert tip.user_ns["w"].device.type == "meta" and tip.user_ns["w"].dtype == torch.float64
    assert _state() == CLEAN
    assert "%%ontorch: ran on" not in out  # no footer for a failed cell


def test_error_shows_the_users_line_not_the_extensions_frames(tip):
    error, out = failing(tip, "%%ontorch meta\nfirst = 1\nraise ValueError('from the cell')\n")
    assert isinstance(error, ValueError)
    assert "----> 3 raise ValueError('from the cell')" in out
    # no frame of the extension (magics/ontorch.py, base.py, devices.py): at most one line naming them
    assert not any(name in out for name in ("ontorch.py", "base.py", "devices.py", "torchgpu_magic/"))


def test_nested_cells_unwind_in_order(tip):
    value, out = cell(
        tip,
        "%%ontorch meta --dtype float64\n%%ontorch cpu\ninner = torch.ones(1)\n(inner.device, inner.dtype)",
    )
    assert value == (torch.device("cpu"), torch.float64)
    assert out.splitlines() == [
        "%%ontorch: ran on cpu",
        "%%ontorch: ran on meta; not on meta: inner (cpu, float64 (1,)) "
        "(the default device skips from_numpy, torch.Tensor(), torch.normal, device= and older objects)",
    ]
    assert _state() == CLEAN


@pytest.mark.parametrize(
    "code",
    [
        "%%time\n%%ontorch meta\nt = torch.ones(2)\nt.device",
        "%%ontorch meta\n%%time\nt = torch.ones(2)\nt.device",
    ],
)
def test_combined_with_time_either_way(tip, code):
    value, out = cell(tip, code)
    assert value == torch.device("meta")
    assert "Wall time" in out and "%%ontorch: ran on meta" in out
    assert _state() == CLEAN


def test_time_around_a_failing_cell_still_restores(tip):
    import IPython

    with capture_output() as cap:
        result = tip.run_cell("%%time\n%%ontorch meta --dtype float16\n1/0")
    assert "ZeroDivisionError" in cap.stdout
    if IPython.version_info[0] >= 8:  # IPython 7's %%time shows the error itself instead of raising it
        assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert _state() == CLEAN


# ---- the line form ------------------------------------------------------------------------------------


def test_line_form_sets_the_kernel_default_until_reset(tip):
    _, out = cell(tip, "%ontorch meta --dtype bfloat16")
    assert "default device is now meta" in out
    value, _ = cell(tip, "q = torch.ones(1)\n(q.device, q.dtype)")
    assert value == (torch.device("meta"), torch.bfloat16)
    _, out = cell(tip, "%ontorch")
    assert "default device meta (set by %ontorch meta --dtype bfloat16)" in out and "bfloat16" in out
    value, _ = cell(tip, "%%ontorch cpu\ntorch.ones(1).device")  # a cell inside the line form's default
    assert value == torch.device("cpu")
    assert torch.ones(1).device.type == "meta"
    _, out = cell(tip, "%ontorch --reset")
    assert "restored" in out
    assert _state() == CLEAN
    _, out = cell(tip, "%ontorch --reset")
    assert "nothing to reset" in out


def test_line_form_moves_too(tip):
    run(tip, "lm = torch.nn.Linear(2, 2)")
    _, out = cell(tip, "%ontorch meta --move lm --discard-data")
    assert out.splitlines() == [
        "%ontorch: moved to meta: lm (module, 24 B); 24 B in all",
        "%ontorch: torch's default device is now meta (undo with %ontorch --reset)",
    ]
    assert tip.user_ns["lm"].weight.device.type == "meta"
    cell(tip, "%ontorch --reset")
    assert _state() == CLEAN


def test_unload_undoes_the_line_form(tip):
    import torchgpu_magic

    cell(tip, "%ontorch meta --dtype float64")
    assert torchapi.default_device_setting() == torch.device("meta")
    torchgpu_magic.unload_ipython_extension(tip)
    assert _state() == CLEAN
    torchgpu_magic.load_ipython_extension(tip)


def test_line_form_inside_a_cell_is_refused(tip):
    error, _ = failing(tip, "%%ontorch meta\n%ontorch cpu")
    assert "would be undone when the cell ends" in str(error)
    assert _state() == CLEAN


@pytest.mark.skipif(
    HAS_CUDA or devices._mps_available() or devices._xpu_count() > 0, reason="has an accelerator"
)
def test_status_shows_default_and_auto_is_cpu_here(tip):
    _, out = cell(tip, "%ontorch")
    assert out.strip() == (
        "%ontorch: default device cpu (torch's own default), default dtype float32; "
        "auto here is cpu; devices here: cpu, meta"
    )
    value, out = cell(tip, "%%ontorch auto\ntorch.ones(1).device")
    assert value == torch.device("cpu") and out.strip() == "%%ontorch: ran on cpu"


# ---- unavailable devices and --fallback ---------------------------------------------------------------


@no_cuda
def test_cuda_here_is_a_usage_error_with_the_reason(tip, request):
    error, _ = failing(tip, "%%ontorch cuda:0\nran = 1")
    assert isinstance(error, UsageError)
    message = str(error)
    assert message.startswith("%%ontorch: 'cuda:0' is not available: ")
    assert f"Devices here: {simulated_legs.devices_here(request.config)}" in message
    assert "\n" not in message and "ran" not in tip.user_ns


@no_cuda
def test_fallback_runs_on_cpu_and_says_so_in_one_line(tip):
    value, out = cell(tip, "%%ontorch cuda:0 --fallback cpu\ntorch.ones(1).device")
    assert value == torch.device("cpu")
    lines = out.strip().splitlines()
    assert lines[0].startswith("%%ontorch: 'cuda:0' is not available") and lines[0].endswith(
        "running on cpu instead (--fallback)"
    )
    assert lines[1] == "%%ontorch: ran on cpu"


def test_fallback_does_not_hide_typos_and_is_itself_validated(tip):
    error, _ = failing(tip, "%%ontorch cdua:0 --fallback cpu\nran = 1")
    if devices._missing("cuda") is None:
        assert "Did you mean 'cuda:0'?" in str(error)
    else:  # a typo of a device absent here: torch's name and why, not a suggestion that fails next
        assert "unknown device 'cdua:0'; torch calls it 'cuda:0', which is not available here" in str(error)
    error, _ = failing(tip, "%%ontorch meta --fallback mte\nran = 1")
    assert str(error).startswith("%%ontorch: --fallback: unknown device 'mte'. Did you mean 'meta'?")
    assert "ran" not in tip.user_ns


# ---- --move and --dtype -------------------------------------------------------------------------------


def test_move_moves_and_reports_bytes(tip):
    run(
        tip,
        "model = torch.nn.Linear(3, 2)\nbatch = torch.ones(4, 3)\nopt = torch.optim.SGD(model.parameters())",
    )
    value, out = cell(tip, "%%ontorch meta --move model,batch,opt --discard-data\n"
                           "(model.weight.device, batch.device)")
    assert value == (torch.device("meta"), torch.device("meta"))
    assert out.splitlines()[0] == (
        "%%ontorch: moved to meta: model (module, 32 B), batch (tensor, 48 B), "
        "opt (already there); 80 B in all"
    )
    ns = tip.user_ns
    assert ns["opt"].param_groups[0]["params"] == list(ns["model"].parameters())  # follows the model
    _, out = cell(tip, "%%ontorch meta --move batch -q\npass")
    assert out == ""


def test_move_to_meta_is_refused_unless_asked_and_meta_cannot_move_back(tip):
    run(tip, "model = torch.nn.Linear(3, 2)\nx = torch.ones(3)\nw0 = model.weight")
    error, _ = failing(tip, "%%ontorch meta --move model,x\nran = 1")
    assert str(error) == ("%%ontorch: --move: moving model, x to meta would drop their values (meta keeps "
                          "shapes only; nothing can move back); add --discard-data to do it anyway")
    ns = tip.user_ns
    assert ns["model"].weight is ns["w0"] and ns["x"].device.type == "cpu" and "ran" not in ns
    error, _ = failing(tip, "%ontorch meta --move x")
    assert str(error).startswith("%ontorch: --move: moving x to meta would drop its values")
    run(tip, "%ontorch --reset -q")
    run(tip, "%%ontorch meta --move model --discard-data -q\npass")
    error, _ = failing(tip, "%%ontorch cpu --move model\nran = 1")
    assert str(error) == ("%%ontorch: --move: model is on meta, which holds no values to copy to cpu; create "
                          "it there instead: model.to_empty(device='cpu'), then load its weights")
    assert ns["model"].weight.device.type == "meta" and "ran" not in ns
    run(tip, "%%ontorch meta --move x --discard-data -q\npass")
    error, _ = failing(tip, "%%ontorch cpu --move x\nran = 1")
    assert str(error) == ("%%ontorch: --move: x is on meta, which holds no values to copy to cpu; create it "
                          "there instead: x = torch.empty(x.shape, dtype=x.dtype, device='cpu'), then fill "
                          "it")
    error, _ = failing(tip, "%%ontorch cpu --discard-data\nran = 1")
    assert str(error) == "%%ontorch: --discard-data goes with --move NAME,..."


def test_move_with_an_optimizer_keeps_it_on_the_models_parameters(tip):
    run(tip, "model = torch.nn.Linear(3, 2)\nopt = torch.optim.Adam(model.parameters())\n"
             "model(torch.ones(1, 3)).sum().backward()\nopt.step()")
    error, _ = failing(tip, "%%ontorch meta --move model --discard-data\nran = 1")
    assert str(error) == ("%%ontorch: --move: opt holds parameters of model, which this move replaces; move "
                          "them together (--move model,opt) so opt follows them")
    assert tip.user_ns["model"].weight.device.type == "cpu"
    _, out = cell(tip, "%%ontorch meta --move model,opt --discard-data\n"
                       "same = [id(p) for p in opt.param_groups[0]['params']] == "
                       "[id(p) for p in model.parameters()]")
    ns = tip.user_ns
    assert ns["same"] is True
    state = ns["opt"].state[ns["model"].weight]
    assert state["exp_avg"].device.type == "meta" and len(ns["opt"].state) == 2
    # exp_avg and exp_avg_sq moved; the two 4-byte steps stay on cpu, where torch keeps them
    assert "opt (optimizer, 64 B; its 8 B of step counters stay on cpu, as torch keeps them)" in out


def test_move_with_an_unknown_name_moves_nothing(tip):
    run(tip, "batch = torch.ones(2)\nk = 3")
    for line, expected in (
        ("--move batch,nope", "no variable named nope"),
        ("--move batch,k", "k is a int; --move takes tensors"),
        ("--move 'batch nope'", "give variable names separated by commas"),
    ):
        error, _ = failing(tip, f"%%ontorch meta {line}\nran = 1")
        assert isinstance(error, UsageError) and expected in str(error), str(error)
        assert tip.user_ns["batch"].device.type == "cpu" and "ran" not in tip.user_ns


def test_dtype_for_the_cell_and_bad_names(tip):
    value, _ = cell(
        tip, "%%ontorch meta --dtype float16\ntorch.ones(1).dtype, torch.nn.Linear(1, 1).weight.dtype"
    )
    assert value == (torch.float16, torch.float16)
    assert torch.get_default_dtype() == torch.float32
    error, _ = failing(tip, "%%ontorch meta --dtype int32\nran = 1")
    assert str(error) == "%%ontorch: unknown dtype 'int32'; valid: float16, bfloat16, float32, float64"
    error, _ = failing(tip, "%ontorch meta --dtype int32")
    assert str(error) == "%ontorch: unknown dtype 'int32'; valid: float16, bfloat16, float32, float64"


# ---- fuzz: every rejected input is a one-line UsageError and changes nothing -----------------------


_SPECS = st.one_of(
    st.sampled_from(
        [
            "cpu",
            "meta",
            "auto",
            "cuda",
            "cuda:0",
            "cuda:7",
            "mps",
            "xpu",
            "cdua",
            "gpu",
            "META ",
            "cpu:1",
            "",
            "-",
            "--",
            "'meta'",
            "$t",
            "{t}",
            "meta meta",
            "None",
        ]
    ),
    st.text(alphabet="cpumetaxdi:0123 -'\"{}$,", max_size=10),
)
_OPTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("--dtype"), st.sampled_from(["float64", "bfloat16", "int8", "half", "", "float"])),
        st.tuples(st.just("--fallback"), _SPECS),
        st.tuples(
            st.just("--move"), st.sampled_from(["t", "m", "t,m", "nope", "t,nope", "n", ",", "t,,m", "m t"])
        ),
        st.tuples(st.sampled_from(["-q", "--reset", "--bogus", "-x", "--discard-data"])),
    ),
    max_size=3,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_SPECS, options=_OPTIONS, form=st.sampled_from(["cell", "line"]), quote=st.booleans())
def test_fuzz_rejected_input_is_a_one_line_usage_error_and_changes_nothing(tip, spec, options, form, quote):
    run(tip, "t = torch.ones(2)\nm = torch.nn.Linear(2, 2)\nn = 3\nran = False")
    ids = {name: id(tip.user_ns[name]) for name in ("t", "m", "n")}
    words = [spec] + [part for option in options for part in option]
    line = " ".join(shlex.quote(w) for w in words) if quote else " ".join(words)
    code = f"%%ontorch {line}\nran = True" if form == "cell" else f"%ontorch {line}"
    result = tip.run_cell(code, silent=True)
    error = result.error_before_exec or result.error_in_exec
    if error is None:  # accepted: the cell ran and left nothing behind; a line form is undone by --reset
        if form == "cell":
            assert tip.user_ns["ran"] is True
        run(tip, "%ontorch --reset -q")
        assert _state() == CLEAN
        return
    assert isinstance(error, UsageError), repr(error)
    prefix = "%%ontorch: " if form == "cell" else "%ontorch: "
    assert "\n" not in str(error) and str(error).startswith(prefix), str(error)
    assert _state() == CLEAN
    assert tip.user_ns["ran"] is False
    assert {name: id(tip.user_ns[name]) for name in ("t", "m", "n")} == ids
    assert tip.user_ns["t"].device.type == "cpu" and tip.user_ns["m"].weight.device.type == "cpu"


# ---- on a real GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_cuda0_and_dot_cuda_inside(tip):
    value, out = cell(
        tip,
        "%%ontorch cuda:0\na = torch.ones(2)\nb = torch.zeros(2, device='cpu').cuda()\n"
        "(a.device, b.device, torch.cuda.current_device())",
    )
    assert value == (torch.device("cuda", 0), torch.device("cuda", 0), 0)
    assert out.strip() == "%%ontorch: ran on cuda:0"
    assert torch.ones(1).device.type == "cpu"


@pytest.mark.gpu
def test_gpu_index_out_of_range_is_refused(tip):
    count = torch.cuda.device_count()
    error, _ = failing(tip, f"%%ontorch cuda:{count}\nran = 1")
    assert f"'cuda:{count}' does not exist: torch sees {count} CUDA" in str(error)
    assert "ran" not in tip.user_ns


@pytest.mark.gpu
def test_gpu_last_gpu_is_current_inside(tip):
    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip("needs two GPUs: on one, the last GPU is the current one already, so nothing switches")
    before = torch.cuda.current_device()
    assert before != count - 1
    value, _ = cell(tip, f"%%ontorch cuda:{count - 1}\n(torch.ones(1).device, torch.zeros(1).cuda().device, "
                         "torch.cuda.current_device())")
    assert value == (torch.device("cuda", count - 1),) * 2 + (count - 1,)
    assert torch.cuda.current_device() == before


@pytest.mark.gpu
def test_gpu_move_a_model_to_cuda_and_back(tip):
    run(tip, "gm = torch.nn.Linear(64, 64)")
    _, out = cell(tip, "%%ontorch cuda:0 --move gm\ny = gm(torch.ones(1, 64))")
    assert "gm (module, 16.2 KiB)" in out
    assert tip.user_ns["gm"].weight.device.type == "cuda" and tip.user_ns["y"].device.type == "cuda"
    _, out = cell(tip, "%%ontorch cpu --move gm\npass")
    assert tip.user_ns["gm"].weight.device.type == "cpu"
    assert "gm (module, 16.2 KiB)" in out


# ---- IPython syntax in the body, and in-place changes in the footer ----------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "    x = torch.ones(1)\n    y = x.device",  # indented: IPython's cleanup dedents it
        ">>> x = torch.ones(1)\n>>> y = x.device",  # pasted from a Python prompt
        "%time x = torch.ones(1)\ny = x.device",  # a line magic inside
        "x = torch.ones(1)\ny = x.device  # what?",  # '?' in a comment: IPython's path, same result
    ],
)
def test_ipython_syntax_in_the_body_works_as_in_any_cell(tip, body):
    cell(tip, f"%%ontorch meta\n{body}")
    assert tip.user_ns["y"] == torch.device("meta")


def test_footer_sees_models_and_containers_changed_in_place(tip):
    run(tip, "net = torch.nn.Linear(2, 2, device='meta')\nbatch = [torch.ones(1, device='meta')]")
    _, out = cell(tip, "%%ontorch meta\nnet.to_empty(device='cpu')\nbatch[0] = torch.zeros(1, device='cpu')")
    assert "net (cpu, Linear 6 params)" in out and "batch[0] (cpu, float32 (1,))" in out


def test_rebound_names_found_by_position_and_by_name():
    """The footer's change finder: names added or rebound; a deleted name sends it to the by-name path."""
    from torchgpu_magic.magics.ontorch import _rebound

    a, b, c = object(), object(), object()
    ns = {"a": a, "b": b}
    keys, ids = list(ns), list(map(id, ns.values()))
    ns["b"], ns["c"] = c, a  # rebound, added
    assert _rebound(keys, ids, ns) == {"b", "c"}
    del ns["a"]  # no longer a prefix of the old names
    assert _rebound(keys, ids, ns) == {"b", "c"}
    assert _rebound(list(ns), list(map(id, ns.values())), ns) == set()


def test_footer_says_what_is_on_the_cpu_by_design_apart_from_what_is_not(tip):
    run(tip, "ds = torch.utils.data.TensorDataset(torch.ones(4, 2), torch.zeros(4))\n"
             "it = iter(torch.utils.data.DataLoader(ds, batch_size=2))")
    _, out = cell(tip, "%%ontorch meta\nrng = torch.get_rng_state()\na = torch.from_numpy(np.ones(3))\n"
                       "xb, yb = next(it)\nh = torch.ones(2)")
    assert out.startswith("%%ontorch: ran on meta; not on meta: a (cpu, float64 (3,)) (the default device "
                          "skips")
    assert "; on cpu by design: rng (an RNG state: torch keeps generator states on cpu" in out
    assert ("xb, yb (a DataLoader's batch: made on cpu by its workers; move it in the loop with "
            ".to(device))") in out
    assert "h (" not in out


def test_move_explains_that_a_gradscaler_needs_no_move(tip):
    run(tip, "scaler = torch.amp.GradScaler('cpu')\nscaler.scale(torch.ones(2))")
    error, _ = failing(tip, "%%ontorch meta --move scaler\nran = 1")
    assert str(error) == ("%%ontorch: --move: scaler is a GradScaler, which needs no move: it copies its "
                          "scale to each output's device when used; --move takes tensors, nn.Modules and "
                          "optimizers")
    rows = {r.name: r for r in tip.run_line_magic("whereis", "-o").rows}
    assert "fine on any device" in rows["scaler._scale"].note


def test_cuda_availability_is_asked_once_not_before_every_cell(tip, monkeypatch):
    real = torch.cuda.is_available
    asked = []

    def counting():
        asked.append(1)
        return real()

    monkeypatch.setattr(torch.cuda, "is_available", counting)
    for _ in range(5):
        cell(tip, "%%ontorch cpu\nx = torch.ones(2)")
    # not before every cell: at most once, when the first cell builds the list of devices here (a test
    # before this one may have left cpu remembered: then never); saving the state asks is_initialized()
    assert len(asked) <= 1
    for _ in range(5):
        cell(tip, "%ontorch")  # what auto is here: the remembered count
    assert len(asked) <= 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # before CUDA starts this changes what it sees
    cell(tip, "%ontorch")
    assert len(asked) == 2


def test_footer_watches_what_the_cells_code_and_the_notebooks_helpers_can_bind(tip):
    run(tip, "def load():\n    global data\n    data = torch.ones(2, device='cpu')\n"
             "class Trainer:\n    def setup(self):\n        global weights\n"
             "        weights = torch.zeros(1, device='cpu')\n"
             "trainer = Trainer()")
    _, out = cell(tip, "%%ontorch meta\nload()\ntrainer.setup()\nmine = torch.ones(1, device='cpu')")
    assert "data (cpu, float32 (2,))" in out and "weights (cpu, float32 (1,))" in out
    assert "mine (cpu, float32 (1,))" in out
    _, out = cell(tip, "%%ontorch meta\nglobals()['hidden'] = torch.ones(3, device='cpu')")
    assert "hidden (cpu, float32 (3,))" in out  # bound by a way the code does not name: all watched


def test_the_names_a_cell_binds_are_read_from_code_only():
    import types

    from torchgpu_magic import placement

    def names(source, ns=None):
        return placement.names_bound([compile(source, "<cell>", "exec")], source, ns or {})

    assert {"x", "y", "np"} <= names("import numpy as np\nx = 1\nfor y in range(2): pass")
    assert names("exec('z = 1')") is None and names("get_ipython().run_line_magic('time', '')") is None
    assert names("from os import *") is None and names("import sys\nsys.modules['__main__'].k = 1") is None
    ns = {"helper": types.FunctionType(compile("global g\ng = 1", "<h>", "exec"), {}, "helper")}
    ns["helper"].__module__ = "__main__"
    assert "g" in names("helper()", ns)
