"""%%cudatime / %cudatime through a real InteractiveShell: every option, errors in cells, output shown once,
nesting with %%ontorch, state restored; and, under the `gpu` marker, the checks of the timing method on a
real GPU (calibrated _sleep kernels, first-run exclusion, launch-bound, other streams, --kernels)."""
from __future__ import annotations

import linecache
import os

import pytest
from conftest import run, run_error
from fake_clock import ScriptedHostClock
from fresh_process import run_fresh
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from torchgpu_magic import timing
from torchgpu_magic.timing import engine

FAST = "-n 2 -r 3 --warmup 0"


@pytest.fixture
def tip(ip):
    """The shell with torch, a small cpu tensor and a log list in the namespace. Cells of cpu tensors are
    timed on the host here and on a GPU machine alike, however initialised CUDA is."""
    run(ip, "import torch\nx = torch.ones(64, 64)\nlog = []")
    return ip


def test_cell_returns_a_result_with_every_field(tip):
    result = run(tip, f"%%cudatime -o -q {FAST}\ny = x @ x\nlog.append(1)")
    from torchgpu_magic.timing import TimingResult

    assert isinstance(result, TimingResult)
    assert result.device == "cpu" and result.kind == "host" and result.clock.startswith("perf_counter")
    assert result.loops == 2 and len(result.samples) == 3 == len(result.host_samples)
    assert result.device_samples is None and result.wall is None and result.memory_peak is None
    assert result.min <= result.median <= result.max and result.first_run > 0
    assert result.torch_version == __import__("torch").__version__ and result.device_name
    assert result.threads == __import__("torch").get_num_threads()
    assert result.floor is not None and result.floor > 0
    assert result.stop_reason == "fixed"
    # first run + 3 samples x 2 loops + the roofline's one counting run, nothing else
    assert tip.user_ns["log"] == [1] * 8
    assert "y" not in tip.user_ns  # like %timeit, names the cell binds stay inside the timing loop


def test_default_shows_text_and_html_and_returns_nothing(tip):
    with capture_output() as captured:
        value = run(tip, f"%%cudatime {FAST}\nx + 1")
    assert value is None
    [shown] = captured.outputs
    assert "host time per loop" in shown.data["text/plain"] and "<table" in shown.data["text/html"]
    assert "host time (perf_counter)" in shown.data["text/plain"]


def test_each_form_names_itself_in_its_header(tip):
    """The header names the form the user typed: %cudatime for a statement, %%cudatime for a cell."""
    line = run(tip, f"%cudatime -o -q {FAST} x + 1")
    cell = run(tip, f"%%cudatime -o -q {FAST}\nx + 1")
    assert line.to_text().startswith("%cudatime on cpu") and "%cudatime on cpu" in line._repr_html_()
    assert cell.to_text().startswith("%%cudatime on cpu")
    rows = run(tip, f"%cudatime -o -q {FAST} --threads 1,2 x + 1")
    assert rows.to_text().startswith("%cudatime comparison")
    assert all(result.magic == "%cudatime" for _, result in rows.rows)


def test_quiet_shows_nothing(tip):
    with capture_output() as captured:
        run(tip, f"r = %cudatime -o -q {FAST} x + 1")
    assert captured.outputs == [] and captured.stdout == ""
    assert tip.user_ns["r"].loops == 2


def test_line_magic_keeps_the_statement_verbatim(tip):
    run(tip, f'%cudatime -q {FAST} log.append("a  b   c")')
    assert set(tip.user_ns["log"]) == {"a  b   c"}
    run(tip, "v = 3")
    result = run(tip, f"%cudatime -o -q {FAST} -- -v")
    assert result.loops == 2


def test_setup_runs_once_per_row_before_the_cell(tip):
    run(tip, f"%%cudatime -q {FAST} log.append('setup'); k = 100\nlog.append(k)")
    assert tip.user_ns["log"] == ["setup"] + [100] * 8  # the counting run reuses the setup's scope


def test_print_and_display_are_shown_once(tip):
    code = (f"%%cudatime -q {FAST} print('setup says hi')\n"
            "print('cell says hi')\nfrom IPython.display import display\ndisplay('shown')\nx.sum().item()")
    with capture_output() as captured:
        run(tip, code)
    assert captured.stdout.count("setup says hi") == 1
    assert captured.stdout.count("cell says hi") == 1
    assert len(captured.outputs) == 1


@pytest.mark.parametrize("options", ["", "--cold", "--flush-l2", "--kernels", "--devices cpu",
                                     "--threads 1,2", "--warmup 3"])
def test_item_and_print_work_in_every_mode(tip, options):
    with capture_output() as captured:
        code = f"%%cudatime -o -q -n 1 -r 3 --max-time 0.5 {options}\nprint('p')\nv = x.sum().item()"
        result = run(tip, code)
    assert captured.stdout.count("p\n") == 1
    assert result is not None


# The next two run on virtual time (tests/fake_clock.py): the cell runs, the clock reports scripted
# seconds, so what they check (the loop count, the stop at the budget) cannot depend on the machine's load.
def test_autorange_fills_a_millisecond(tip, monkeypatch):
    clock = ScriptedHostClock(lambda call, loops: 3e-6)
    monkeypatch.setattr(engine, "clock_for", lambda device: clock)
    result = run(tip, "%%cudatime -o -q -r 3\nlog.append(1)")
    assert result.loops == 500 and result.loops * result.median == pytest.approx(1.5e-3)  # 1-2-5: 500
    assert tip.user_ns["log"]  # the cell ran for real


def test_max_time_stops_a_noisy_cell_and_says_not_converged(tip, monkeypatch):
    # 1 to 3 ms a loop, spread evenly (a golden-ratio sequence): too noisy to converge within 0.3 s
    clock = ScriptedHostClock(lambda call, loops: 1e-3 * (1 + 2 * ((call * 0.6180339887) % 1)))
    monkeypatch.setattr(engine, "clock_for", lambda device: clock)
    result = run(tip, "%%cudatime -o -q -n 1 --max-time 0.3\ny = x + 1")
    assert result.stop_reason == "max-time" and not result.converged
    assert 0.3 <= result.elapsed < 0.3 + 3e-3 and len(result.samples) >= 3  # the last sample crossed it
    assert any(w.startswith("not converged within --max-time 0.3 s") for w in result.warnings)


def test_warmup_runs_exactly_n(tip):
    run(tip, "%%cudatime -q -n 1 -r 1 --warmup 4\nlog.append(1)")
    assert len(tip.user_ns["log"]) == 1 + 4 + 1 + 1  # first run, warm-up, one sample, the counting run


def test_cold_and_flush_notes(tip):
    cold = run(tip, f"%%cudatime -o -q {FAST} --cold\nx + 1")
    assert cold.cold and any("nothing to synchronize on cpu" in n for n in cold.notes)
    flushed = run(tip, f"%%cudatime -o -q {FAST} --flush-l2\nx + 1")
    assert flushed.flush_l2 and any(n.startswith("--flush-l2:") and "last-level cache" in n
                                    for n in flushed.notes)


def test_kernels_lists_top_cpu_ops_apart_from_the_samples(tip):
    result = run(tip, f"%%cudatime -o -q {FAST} --kernels\ny = x @ x\nlog.append(1)")
    names = [row.name for row in result.kernels]
    assert "aten::mm" in names
    assert result.kernels[0].time > 0 and 0 < result.kernels[0].share <= 1
    assert len(tip.user_ns["log"]) == 7 + 1 + 2  # the counting run, then the profiler pass's own loops
    assert "top ops by self CPU time" in result.to_text()
    table = run(tip, f"%%cudatime -o -q {FAST} --kernels --threads 1,2\ny = x @ x")
    text = table.to_text()
    assert text.count("top ops by self CPU time") == 2 and "cpu, 2 threads: top ops" in text


@pytest.mark.fresh_process
def test_kernels_leaves_out_the_profilers_start_and_stop_markers_and_keeps_the_rest():
    """torch's profiler (Kineto) writes 'USDT: ... profiler_start' and 'profiler_stop' to the process's
    stderr at every pass; --kernels drops those lines, and only those: what else reaches stderr meanwhile
    (a library's warning, the cell's own) is written back."""
    done = run_fresh(
        "import sys\n"
        "cell('import os\\nx = torch.ones(64, 64)')\n"
        "with torch.profiler.profile():\n    torch.ones(2) * 2\n"  # this torch's own markers, for reference
        "sys.stderr.flush(); os.write(2, b'--- now the magic\\n')\n"
        "cell('%%cudatime -o -q -n 1 -r 3 --warmup 0 --no-roofline --kernels\\ny = x @ x\\n"
        "os.write(2, b\\'a real warning\\\\n\\')')\n")
    assert done.returncode == 0, done.stderr[-2000:]
    before, magic = done.stderr.split("--- now the magic\n")
    if "USDT:" not in before:
        pytest.skip("this torch's profiler writes no USDT markers")
    assert "USDT:" not in magic and "profiler_start" not in magic, magic
    assert magic.count("a real warning") >= 3 + 1 + 1  # the first run, 3 samples, the profiler pass


@pytest.mark.notebook
def test_kernels_in_a_real_kernel_shows_no_profiler_markers(monkeypatch):
    """ipykernel forwards the process's stderr to the notebook: the markers do not reach it either."""
    pytest.importorskip("nbclient", reason="needs nbclient and nbformat")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # ipykernel forwards file descriptor 2 outside pytest only
    import importlib.util

    import nbformat
    from conftest import ROOT
    from nbclient import NotebookClient

    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    nb = nbformat.v4.new_notebook()
    # The last cell writes a mark to file descriptor 2 and waits (up to 60 s) until ipykernel's thread that
    # forwards that descriptor has passed it on: what the profiler wrote there before the mark has been
    # forwarded by then, in order, whatever the machine's load (no sleep that a slow machine outlasts).
    cells = ["%load_ext torchgpu_magic\nimport torch\nx = torch.ones(64, 64)",
             "%%cudatime -n 1 -r 3 --warmup 0 --no-roofline --kernels\ny = x @ x",
             "import os, sys, threading\nforwarded, write = threading.Event(), sys.stderr.write\n"
             "def seen(text):\n    if 'end of fd 2' in text:\n        forwarded.set()\n"
             "    return write(text)\n"
             "sys.stderr.write = seen\nos.write(2, b'end of fd 2\\n')\nforwarded.wait(60)\n"
             "del sys.stderr.write"]
    nb.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    with runner.this_python_kernel() as kernel:
        NotebookClient(nb, kernel_name=kernel, timeout=300,
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    text = "".join(runner.cell_text(cell) for cell in nb.cells[1:])
    assert "end of fd 2" in text, text  # the descriptor was forwarded up to the end
    assert "top ops by self CPU time" in text and "USDT" not in text and "profiler_st" not in text, text


@pytest.mark.fresh_process
def test_the_marker_filter_writes_back_every_other_line():
    done = run_fresh(
        "from torchgpu_magic.timing.engine import markers_dropped\n"
        "with markers_dropped():\n"
        "    os.write(2, b'USDT:2026 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
        "    os.write(2, b'ERROR:2026 1:1 CuptiActivityApi.cpp:1] CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"
        "\\n')\n"
        "    os.write(2, b'USDT:2026 1:1 SyncActivityProfilerHandler.cpp:59] profiler_stop\\n')\n"
        "    os.write(2, b'x' * 200000)\n"
        "os.write(2, b'\\nafter\\n')\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "USDT" not in done.stderr and "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES" in done.stderr
    assert done.stderr.index("CUPTI_ERROR") < done.stderr.index("after") and "x" * 200000 in done.stderr


def test_threads_rows_set_and_restore_thread_counts(tip):
    import torch

    before = torch.get_num_threads()
    table = run(tip, f"%%cudatime -o -q {FAST} --threads 1,2\nlog.append(torch.get_num_threads())\nx @ x")
    assert torch.get_num_threads() == before
    assert [label for label, _ in table.rows] == ["cpu, 1 thread", "cpu, 2 threads"]
    assert [r.threads for _, r in table.rows] == [1, 2]
    assert sorted(set(tip.user_ns["log"])) == [1, 2]
    assert table.speedups()[0] == 1.0
    data = table.to_dict()
    assert [row["threads"] for row in data["rows"]] == [1, 2] and "speedup" in data["rows"][1]
    assert "speed-up" in table.to_text() and "<table" in table._repr_html_()


def test_devices_rows_switch_the_default_device_and_restore_it(tip):
    table = run(tip, f"%%cudatime -o -q {FAST} --devices cpu,cpu\nlog.append(str(torch.empty(0).device))")
    assert [label for label, _ in table.rows] == ["cpu", "cpu"]
    assert set(tip.user_ns["log"]) == {"cpu"}


def test_output_of_later_rows_is_silenced(tip):
    with capture_output() as captured:
        run(tip, f"%%cudatime -q {FAST} --threads 1,2\nprint('once')")
    assert captured.stdout.count("once") == 1


# ---- errors ------------------------------------------------------------------------------------------
def test_error_in_the_cell_is_raised_with_the_cells_own_traceback(tip):
    error = run_error(tip, f"%%cudatime {FAST}\nx + 1\n1 / 0")
    assert isinstance(error, ZeroDivisionError)
    tb = error.__traceback__
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    filename, lineno = frames[-1]
    assert lineno == 3 and linecache.getline(filename, lineno).strip() == "1 / 0"
    package = os.path.dirname(timing.__file__)  # the engine's frames are left out
    assert not any(name.startswith(package) for name, _ in frames)


def test_error_in_setup_points_at_the_setup(tip):
    error = run_error(tip, f"%%cudatime {FAST} y = undefined_name\nx + 1")
    assert isinstance(error, NameError)
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip() == "y = undefined_name"


def test_error_restores_threads_and_device(tip):
    import torch

    before = (torch.get_num_threads(), torch.empty(0).device)
    error = run_error(tip, f"%%cudatime {FAST} --threads 1 --devices cpu\nraise KeyError('k')")
    assert isinstance(error, KeyError)
    assert (torch.get_num_threads(), torch.empty(0).device) == before


@pytest.mark.parametrize("code, line, text", [
    (f"%%cudatime {FAST}\nx = (", 2, "x = ("),
    (f"%%cudatime {FAST}\ny = 1\nreturn 1", 3, "return 1"),
    (f"%%cudatime {FAST} y = (\nx = 1", 1, "y = ("),
    (f"%cudatime {FAST} x +", 1, "x +"),
])
def test_syntax_error_is_shown_from_the_users_text(tip, code, line, text):
    """As IPython shows a SyntaxError in a cell: the cell's line and a caret, no frames of the package."""
    from torchgpu_magic.magics.cudatime import CellSyntaxError

    with capture_output() as captured:
        result = tip.run_cell(code)
    error = result.error_in_exec
    assert isinstance(error, CellSyntaxError) and isinstance(error.error, SyntaxError)
    assert error.error.lineno == line and error.error.text.strip() == text
    shown = captured.stdout
    assert "SyntaxError" in shown and text in shown and f"line {line}" in shown
    assert "torchgpu_magic" not in shown and "Traceback" not in shown


def test_devices_error_lists_only_devices_it_takes(tip):
    from torchgpu_magic import devices

    takes = ", ".join([devices.option_name(d) for d in devices.available_devices() if d != "meta"] + ["auto"])
    for spec in ("bogus", "mps:7", "gpu", "meta"):
        error = run_error(tip, f"%cudatime {FAST} --devices {spec} 1 + 1")
        assert isinstance(error, UsageError) and str(error).startswith("%cudatime: --devices: ")
        assert str(error).endswith(f"Devices here: {takes}")  # one list of devices, the one --devices takes
        assert str(error).count("Devices here") == 1
    error = run_error(tip, f"%%cudatime {FAST} --devices gpu\n1 + 1")
    assert str(error).startswith("%%cudatime: --devices: unknown device 'gpu'")
    if not devices.available_devices()[1:-1]:  # no accelerator here: 'cuda' would fail next
        assert "Did you mean" not in str(error)


@pytest.mark.parametrize("line, words", [
    ("--bogus", "unrecognized arguments: --bogus"),
    ("-n 0", "-n must be a whole number"),
    ("-r x", "invalid int value: 'x'"),
    ("--max-time 0", "--max-time must be a number of seconds above 0"),
    ("--warmup -1", "--warmup must be a whole number"),
    ("--devices gpu", "unknown device 'gpu'"),
    ("--devices cpu,meta", "'meta' holds no data and runs no kernels, so there is nothing to time"),
    ("--devices cpu,,cpu", "--devices takes a comma-separated list"),
    ("--threads 0", "--threads takes whole numbers from 1 to 4096"),
    ("--threads 2,many", "got 'many'"),
    ("--peak fast", "--peak takes FLOPS[,BYTES_PER_S]"),
    ("--peak 1T,0", "got '1T,0'"),
    ("--peak 1e400", "got '1e400'"),  # inf, as Python reads it: the user's text, not (inf, None)
    ("--peak 1e12,1e999", "got '1e12,1e999'"),
    ("--peak 1T --no-roofline", "--peak goes with the roofline: drop --no-roofline"),
])
def test_bad_input_is_one_usage_error_before_anything_runs(tip, line, words):
    error = run_error(tip, f"%%cudatime {line}\nlog.append(1)")
    assert isinstance(error, UsageError)
    assert words in str(error) and "\n" not in str(error)
    assert str(error).startswith("%%cudatime: ")  # the cell magic, as typed; not %cudatime
    assert "Usage: %cudatime" not in str(error)
    assert tip.user_ns["log"] == []


def test_line_magic_without_statement_is_a_usage_error(tip):
    error = run_error(tip, "%cudatime -n 2")
    assert isinstance(error, UsageError) and "no statement to time" in str(error)


def test_cuda_is_refused_in_one_line_without_a_gpu(tip):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    error = run_error(tip, "%%cudatime --devices cuda\nlog.append(1)")
    assert isinstance(error, UsageError) and "'cuda' is not available" in str(error)
    assert tip.user_ns["log"] == []


# ---- nesting with %%ontorch --------------------------------------------------------------------------
def test_cudatime_inside_ontorch_times_on_its_device(tip):
    run(tip, f"%%ontorch cpu -q\nr = %cudatime -o -q {FAST} torch.ones(3)")
    assert tip.user_ns["r"].device == "cpu"
    error = run_error(tip, f"%%ontorch meta -q\nr2 = %cudatime -o -q {FAST} torch.ones(3)")
    assert isinstance(error, UsageError) and "cannot time on 'meta'" in str(error)


def test_ontorch_inside_cudatime_runs_each_loop_there(tip):
    import torch

    result = run(tip, f"%%cudatime -o -q {FAST}\n%%ontorch meta -q\nlog.append(torch.ones(1).device.type)")
    assert set(tip.user_ns["log"]) == {"meta"} and len(tip.user_ns["log"]) == 7 + 1  # + the counting run
    # the counting run saw the cell's work on meta, and keeps it out of the cpu row's figures
    assert result.roofline.other_devices == {"meta": {"bytes": 4, "flops": 0}}
    assert "roofline: 4 B on meta are left out (not the timed device)" in result.notes
    assert result.device == "cpu" and torch.empty(0).device.type == "cpu"


# ---- on a real GPU -----------------------------------------------------------------------------------
@pytest.fixture
def gip(tip):
    run(tip, "x = torch.ones(1, device='cuda')")
    # spin ~200 ms first, so the GPU calibrates at the boost clock the 1 % checks then run at
    tip.user_ns["cycles_50ms"] = int(timing.sleep_cycles_per_ms(warm_s=0.2) * 50)
    return tip


@pytest.mark.gpu
def test_gpu_sleep_device_time_within_1_percent_and_host_enqueue_tiny(gip):
    result = run(gip, "%%cudatime -o -q --max-time 5\ntorch.cuda._sleep(cycles_50ms)")
    assert result.kind == "device" and result.device.startswith("cuda")
    assert result.median == pytest.approx(50e-3, rel=0.01)
    assert result.host < result.median  # enqueueing the kernel is far shorter than running it
    assert result.memory_peak is not None and result.wall >= result.median


@pytest.mark.gpu
def test_gpu_first_run_is_excluded(gip):
    run(gip, "once = []")
    code = ("%%cudatime -o -q -r 5 --max-time 5\n"
            "if not once:\n    once.append(1)\n    torch.cuda._sleep(cycles_50ms * 4)\n"
            "torch.cuda._sleep(cycles_50ms // 10)")
    result = run(gip, code)
    assert result.first_run == pytest.approx(0.205, rel=0.05)
    assert result.max < 0.1 and result.median == pytest.approx(5e-3, rel=0.02)


@pytest.mark.gpu
def test_gpu_item_does_not_hang_in_any_mode(gip):
    for options in ("", "--cold", "--flush-l2", "--kernels"):
        result = run(gip, f"%%cudatime -o -q -r 5 --max-time 2 {options}\n(x * 2).sum().item()")
        assert result.median > 0


@pytest.mark.gpu
def test_gpu_launch_bound_on_a_thousand_tiny_ops(gip):
    result = run(gip, "%%cudatime -o -q -r 5 --max-time 3 --kernels\nfor _ in range(1000):\n    x.add_(1)")
    assert any(w.startswith("launch-bound: the GPU idled") for w in result.warnings), result.to_text()
    assert result.gpu_busy is not None and result.gpu_busy < 0.5 * result.device_time


@pytest.mark.gpu
def test_gpu_kernels_lists_the_sleep_kernel(gip):
    result = run(gip, "%%cudatime -o -q -r 5 --max-time 3 --kernels\ntorch.cuda._sleep(cycles_50ms // 10)")
    assert "spin_kernel" in result.kernels[0].name or "sleep" in result.kernels[0].name.lower()
    assert result.kernels[0].time == pytest.approx(5e-3, rel=0.05)


@pytest.mark.gpu
def test_gpu_side_stream_work_triggers_the_other_streams_note(gip):
    # -n 1: the events on the current stream see almost nothing, so the auto-range would pile up loops
    code = ("%%cudatime -o -q -n 1 -r 5 --warmup 1 side = torch.cuda.Stream()\n"
            "with torch.cuda.stream(side):\n    torch.cuda._sleep(cycles_50ms // 5)")
    result = run(gip, code)
    assert any("other streams" in w for w in result.warnings)
    assert result.kind == "wall" and result.median == pytest.approx(result.wall)


@pytest.mark.gpu
def test_gpu_devices_table_cpu_and_cuda(gip):
    table = run(gip, "%%cudatime -o -q -r 3 --max-time 2 --devices cpu,cuda:0 a = torch.randn(512, 512)\n"
                     "a @ a")
    assert [label for label, _ in table.rows] == ["cpu", "cuda:0"]
    assert [r.kind for _, r in table.rows] == ["host", "device"]


@pytest.mark.gpu
def test_gpu_cold_matches_the_profilers_kernel_time_and_both_cold_modes_agree(gip):
    # a 10 us kernel: the per-loop event pairs behind a spin leave out the host's gaps and launch latency;
    # what is left beside the kernel is the events' own cost, the cold empty-cell floor (1.3 us on an H200)
    gip.user_ns["cycles_10us"] = max(1, gip.user_ns["cycles_50ms"] // 5000)
    cold = run(gip, "%%cudatime -o -q --cold --max-time 5 --kernels\ntorch.cuda._sleep(cycles_10us)")
    flushed = run(gip, "%%cudatime -o -q --cold --flush-l2 --max-time 5\ntorch.cuda._sleep(cycles_10us)")
    assert cold.kernels, cold.to_text()
    assert cold.median == pytest.approx(cold.kernels[0].time + cold.floor, abs=1e-6), cold.to_text()
    assert abs(cold.median - flushed.median) < 2e-6


@pytest.mark.gpu
def test_gpu_l2_flush_slows_a_reduction_that_fits_in_l2(gip):
    # 8 MiB: well inside one half of an H100's L2 (two 25 MiB halves), and inside any L2 of 16 MiB or more.
    # Both runs --cold: an event pair per loop behind a spin, so the two differ in the cache alone.
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    if l2 < 16 * 2**20:
        pytest.skip(f"this GPU's L2 ({l2 // 2**20} MiB) is too small for an 8 MiB working set to stay in it")
    run(gip, "r = torch.ones(2 * 2**20, device='cuda')")  # 8 MiB of float32
    hot = run(gip, "%%cudatime -o -q --cold --max-time 5\nr.sum()")
    flushed = run(gip, "%%cudatime -o -q --cold --max-time 5 --flush-l2\nr.sum()")
    assert flushed.median > 1.2 * hot.median, (hot.to_text(), flushed.to_text())
    assert flushed.notes and "twice the L2 cache" in " ".join(flushed.notes)
    assert any("fits in the" in n for n in hot.notes) and hot.working_set >= 8 * 2**20


@pytest.mark.gpu
def test_gpu_a_cell_waiting_for_the_gpu_is_not_launch_bound(gip):
    run(gip, "a = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)\nb = a.clone()")
    result = run(gip, "%%cudatime -o -q --max-time 5\ny = a @ b\ny[0, 0].item()")
    assert result.host_syncs >= 1
    assert not any(w.startswith("launch-bound") for w in result.warnings)


@pytest.mark.gpu
def test_gpu_a_compiled_setup_still_converges_with_seven_samples(gip):
    # the first run compiles (tracing alone is tens of ms even with inductor's caches warm), the samples
    # then run the compiled kernel: the first run is far above the median, whatever the caches hold
    code = ("%%cudatime -o -q --max-time 2 f = torch.compile(lambda t: (t * 2).sin().sum())\n"
            "f(x)")
    result = run(gip, code)
    assert result.n >= 7 and result.first_run > 20 * result.median, result.to_text()


@pytest.mark.gpu
def test_gpu_a_cpu_cell_is_timed_on_the_host_and_one_that_initialises_cuda_on_the_gpu():
    done = run_fresh(
        "cpu = cell('%%cudatime -o -q -r 3 --max-time 1\\ntorch.ones(8) * 2')\n"
        "assert cpu.kind == 'host' and cpu.device == 'cpu', cpu.device\n"
        "assert not torch.cuda.is_initialized() and contexts() == []\n"
        "gpu = cell('%%cudatime -o -q -r 3 --max-time 1\\ntorch.ones(8, device=\"cuda\") * 2')\n"
        "assert gpu.kind == 'device' and gpu.device == 'cuda:0', gpu.device\n"
        "assert gpu.working_set and gpu.l2_cache and any('L2 cache' in n for n in gpu.notes), gpu.notes\n"
        "assert gpu.sm_clock is not None and gpu.sm_clock['max_mhz'], gpu.sm_clock\n"
        "again = cell('%%cudatime -o -q -r 3 --max-time 1\\ntorch.ones(8) * 2')\n"  # CUDA in use now
        "assert again.kind == 'host' and again.device == 'cpu', again.device\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
