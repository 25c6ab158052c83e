"""panel.py and %gpumem: the widget model without a frontend, through a real InteractiveShell."""
from __future__ import annotations

import re
import sys
import threading
import time

import fake_pynvml
import pytest
import simulated_legs
from conftest import run, run_error
from fake_clock import VirtualTime
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import torchgpu_magic
from torchgpu_magic import gpumem as memory
from torchgpu_magic.gpumem import panel
from torchgpu_magic.magics import instance
from torchgpu_magic.magics.gpumem import GPUMemMagics

MiB = 1024 * 1024
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
H100 = memory.GPUTarget(None, 0, "NVIDIA H100 80GB HBM3")


def _threads() -> list:
    return [t for t in threading.enumerate() if t.name == memory.THREAD_NAME]


def _live_widgets() -> set:
    from ipywidgets.widgets.widget import _instances

    return set(_instances)


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    before = _live_widgets()
    yield
    assert _threads() == [], "a sampler thread is still running"
    assert _live_widgets() - before == set(), "widgets were left open"


def _wait_for(predicate, timeout=30.0):
    """Poll until ``predicate()`` holds; ``timeout`` only guards against a hang (a loaded machine is slow)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _magics(ip):
    """The shell's %gpumem magics object, which holds the panel and the cell log."""
    return instance(ip).part(GPUMemMagics)


def _panel(ip):
    return _magics(ip)._panel


def _virtual_panel(targets, interval=0.25, **kw):
    """A panel over a sampler on virtual time (tests/fake_clock.py), started and waiting after its first
    tick: the test moves the clock with ``p.clock.advance_to(t, p.sampler)``."""
    sampler = memory.Sampler(targets, interval=interval)
    sampler.schedule = clock = VirtualTime()
    p = panel.MemoryPanel(sampler, **kw)
    p.clock = clock
    sampler.start()
    clock.settle(sampler)
    return p


def _shown_model_ids(captured) -> list:
    return [o.data[WIDGET_MIME]["model_id"] for o in captured.outputs if WIDGET_MIME in o.data]


# ---- the panel model, no shell ---------------------------------------------------------------------
def test_panel_on_host_only_says_so_and_shows_rss():
    p = panel.MemoryPanel(memory.Sampler([], interval=0.1))
    try:
        p.sampler.sample_now()
        assert "no GPU: host memory only" in p.gpus.value
        assert 'class="tgm-host-rss"' in p.host.value and "RSS" in p.host.value
        assert p.empty_button.disabled
    finally:
        p.close()


def test_panel_shows_nvml_split_and_follows_changes(fake_nvml):
    module = fake_nvml("h100_busy")
    p = _virtual_panel([H100])
    try:
        assert "30.0 GiB" in p.gpus.value
        assert "12.0 GiB" in p.gpus.value and "79.6 GiB" in p.gpus.value
        assert "other processes" in p.gpus.value
        module.machine.gpus[0].compute[0].usedGpuMemory = 50 * 1024 * MiB
        p.clock.advance_to(0.25, p.sampler)
        assert "50.0 GiB" in p.gpus.value
        assert '<svg class="tgm-spark"' in p.gpus.value  # history is drawn
    finally:
        p.close()
    assert not p.sampler.running


def test_gpu_lost_shows_in_the_panel(fake_nvml):
    module = fake_nvml("h100_busy")
    p = _virtual_panel([H100])
    try:
        module.machine.gpus[0].errors.update(fake_pynvml._lost_errors())
        p.clock.advance_to(0.25, p.sampler)
        assert "fallen off the bus" in p.status.value
        assert p.sampler.running and p.sampler.last_error is None
    finally:
        p.close()


def test_updates_are_batched_one_message_per_widget(fake_nvml, monkeypatch):
    fake_nvml("h100_busy")
    p = panel.MemoryPanel(memory.Sampler([H100], interval=0.05))
    sent = []
    for w in (p.title, p.host, p.gpus, p.status, p.empty_button):
        monkeypatch.setattr(w, "_send", lambda msg, buffers=None, w=w: sent.append((w, msg)))
    try:
        p.sampler.sample_now()
        per_widget = {}
        for w, msg in sent:
            per_widget.setdefault(id(w), []).append(msg)
        assert per_widget, "no state was sent"
        assert all(len(msgs) == 1 for msgs in per_widget.values())
        assert all(msg["method"] == "update" for _, msg in sent)
    finally:
        p.close()


def test_update_from_the_thread_never_prints(capfd):
    p = _virtual_panel([])
    try:
        for n in range(1, 6):
            p.clock.advance_to(n * 0.25, p.sampler)
    finally:
        p.close()
    assert len(p.sampler.history) == 6  # six ticks drew the panel from the thread
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_buttons_pause_reset_and_empty_cache():
    p = panel.MemoryPanel(memory.Sampler([], interval=0.05))
    p.sampler.start()
    try:
        p.pause_button.click()
        assert p.sampler.paused and p.pause_button.description == "Resume"
        assert "paused" in p.title.value
        p.pause_button.click()
        assert not p.sampler.paused and p.pause_button.description == "Pause"
        p.sampler.note_cell(memory.CellRecord(1, "x", 0.0, 0.0, 0, 10**12))
        p.reset_button.click()
        assert p.sampler.latest.host.peak_rss < 10**12
        p.empty_button.click()  # no CUDA here: nothing to give back, and no error
    finally:
        p.close()


def test_closing_the_widget_stops_the_sampler_and_closes_every_widget():
    closed = []
    p = _virtual_panel([], interval=5.0, on_close=lambda: closed.append(1))
    ids = p.model_ids()
    assert ids <= _live_widgets() and len(ids) >= 10
    p.widget.close()
    assert p.clock.woken == [True] and p.clock.now() == 0.0  # the close cut the 5 s wait short
    assert not p.sampler.running and p.closed and closed == [1]
    assert ids & _live_widgets() == set()
    p.close()  # idempotent
    assert closed == [1]


def test_sparkline_is_inline_svg_and_bounded():
    svg = panel.sparkline([(list(range(5000)), "#000"), ([1, 2, None, 3], "#f00")])
    assert svg.startswith("<svg") and "http" not in svg and "url(" not in svg
    assert svg.count("<polyline") == 2
    assert svg.count(",") <= panel.SPARK_POINTS + 3
    assert panel.sparkline([([1], "#000")]) == ""


# ---- %gpumem through the shell ---------------------------------------------------------------------
def test_gpumem_shows_one_live_model_and_stop_ends_it(ip):
    with capture_output() as first:
        run(ip, "%gpumem --widget --interval 0.1")
    (model_id,) = _shown_model_ids(first)
    assert len(_threads()) == 1
    with capture_output() as again:
        run(ip, "%gpumem --widget")
    assert _shown_model_ids(again) == [model_id]  # the same live model, not a second sampler
    assert len(_threads()) == 1
    assert _panel(ip).sampler.interval == 0.1
    run(ip, "%gpumem --widget --interval 0.5")
    assert _panel(ip).sampler.interval == 0.5 and len(_threads()) == 1
    with capture_output() as stopped:
        run(ip, "%gpumem stop")
    assert "stopped" in stopped.stdout
    assert _threads() == [] and _panel(ip) is None
    with capture_output() as again:
        run(ip, "%gpumem stop")
    assert "not running" in again.stdout


@pytest.mark.parametrize("line", ["--interval 0", "--interval -1", "--interval 1000", "--interval abc",
                                  "--interval nan", "--cells maybe", "bogus", "stop --interval 1",
                                  "--nope"])
def test_gpumem_bad_input_is_one_line_usage_error_and_changes_nothing(ip, line):
    error = run_error(ip, f"%gpumem {line}")
    assert isinstance(error, UsageError)
    assert str(error).startswith("%gpumem") and "\n" not in str(error)
    assert _threads() == [] and _panel(ip) is None


def test_interval_error_names_the_valid_range(ip):
    error = run_error(ip, "%gpumem --widget --interval 0")
    assert "between 0.05 and 60 seconds" in str(error)


def test_per_cell_accounting_through_the_shell(ip):
    with capture_output():
        run(ip, "%gpumem --widget --interval 0.2")
    first = ip.execution_count  # cells that store history are numbered, as in a notebook
    ip.run_cell("block = bytearray(64 * 1024 * 1024); block[::4096] = b'1' * len(block[::4096])",
                store_history=True).raise_error()
    ip.run_cell("del block", store_history=True).raise_error()
    p = _panel(ip)
    assert _wait_for(lambda: "del block" in p.cells.value)  # drawn by the sampler's next tick
    cells = p.cells.value
    assert "block = bytearray(64 * 1024 * 1024)" in cells and "del block" in cells
    records = list(_magics(ip)._cells.records)
    assert [r.first_line for r in records] == ["block = bytearray(64 * 1024 * 1024); block[::4096] = "
                                               "b'1' * len(block[::4096])", "del block"]
    assert [r.number for r in records] == [first, first + 1]
    assert f"[{first}]" in cells
    assert records[0].rss_delta > 48 * MiB
    assert records[1].rss_delta < -48 * MiB
    assert records[0].rss_peak is None or records[0].rss_peak > 64 * MiB
    with capture_output():
        run(ip, "%gpumem --widget --cells off")
    assert _magics(ip)._cells is None and _wait_for(lambda: "off" in p.cells.value)
    assert _magics(ip)._pre_cell not in ip.events.callbacks["pre_run_cell"]
    run(ip, "x = 1")
    with capture_output():
        run(ip, "%gpumem --widget")  # showing the panel again keeps the user's choice
    assert _magics(ip)._cells is None
    with capture_output():
        run(ip, "%gpumem --widget --cells on")
    run(ip, "y = 2")
    assert _wait_for(lambda: "y = 2" in p.cells.value)
    run(ip, "%gpumem stop")


def test_closing_the_widget_unhooks_the_cell_events(ip):
    with capture_output():
        run(ip, "%gpumem --widget --interval 0.1")
    magics = _magics(ip)
    assert magics._post_cell in ip.events.callbacks["post_run_cell"]
    _panel(ip).widget.close()
    assert _threads() == [] and magics._panel is None
    assert magics._post_cell not in ip.events.callbacks["post_run_cell"]


def test_unload_stops_the_sampler_within_one_interval(ip, monkeypatch):
    clock = VirtualTime()
    monkeypatch.setattr(memory.Sampler, "schedule", clock)
    with capture_output():
        run(ip, "%gpumem --widget --interval 5")
    clock.settle(_panel(ip).sampler)
    torchgpu_magic.unload_ipython_extension(ip)
    assert clock.woken == [True] and clock.now() == 0.0  # the unload cut the 5 s wait short
    assert _threads() == []
    torchgpu_magic.load_ipython_extension(ip)


def _hooks(ip) -> dict:
    """The event callbacks by function (a reload makes a new GPUMemMagics, so not by bound method)."""
    return {k: [getattr(cb, "__func__", cb) for cb in v] for k, v in ip.events.callbacks.items()}


def test_hundred_cycles_leave_no_thread_no_widget_no_hook(ip):
    events_before = _hooks(ip)
    for i in range(100):
        with capture_output():
            run(ip, "%gpumem --widget --interval 0.05")
        if i % 2:
            run(ip, "%gpumem stop")
        else:
            torchgpu_magic.unload_ipython_extension(ip)
            torchgpu_magic.load_ipython_extension(ip)
    assert _threads() == []
    assert _hooks(ip) == events_before


def test_without_ipywidgets_prints_a_snapshot_and_the_install_hint(ip, monkeypatch, fake_nvml, request):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets now raises ImportError
    fake_nvml("no_gpus")
    machine = getattr(request.config, "_simulated_machine", None)
    if machine not in simulated_legs.NOT_CUDA:
        request.getfixturevalue("torch_sees_gpus")(0)  # no GPU, on any CUDA machine
    with capture_output() as out:
        run(ip, "%gpumem")
    text = out.stdout + "".join(o.data.get("text/plain", "") for o in out.outputs)
    assert "RSS" in text
    if machine in simulated_legs.NOT_CUDA:  # the simulated Mac, Intel GPU, MI300X: its GPU is shown
        kind = simulated_legs.DEVICE_KIND[machine]
        assert "no GPU:" not in text and any(line.strip().startswith(kind) for line in text.splitlines())
    else:
        assert "no GPU: host memory only" in text
    assert "pip install torchgpu-magic[widgets]" in text
    assert _threads() == []


def test_gpumem_on_scripted_nvml_shows_the_gpu(ip, fake_nvml, fresh_env, torch_sees_gpus):
    fake_nvml("h100_busy")
    torch_sees_gpus(1)  # CUDA not initialised: the GPU is watched as NVML names it, on any machine
    with capture_output():
        run(ip, "%gpumem --widget --interval 0.05")
    p = _panel(ip)
    assert [t.nvml_index for t in p.sampler.targets] == [0]
    assert _wait_for(lambda: "NVIDIA H100 80GB HBM3" in p.gpus.value and "30.0 GiB" in p.gpus.value)
    run(ip, "%gpumem stop")


# ---- records, modes, snapshots ---------------------------------------------------------------------
def test_records_are_returned_kept_after_stop_and_exported(ip, tmp_path):
    with capture_output():
        run(ip, "%gpumem --widget --interval 0.5")
    ip.run_cell("a = 1", store_history=True).raise_error()
    ip.run_cell("b = 2", store_history=True).raise_error()
    records = run(ip, "%gpumem --records -o")
    assert [r.first_line for r in records][-2:] == ["a = 1", "b = 2"]
    with capture_output():
        run(ip, "%gpumem stop")
    kept = run(ip, "%gpumem --records")
    assert [r.first_line for r in kept][-3:] == ["a = 1", "b = 2", "%gpumem --records -o"]
    kept.to_csv(tmp_path / "cells.csv")
    assert "a = 1" in (tmp_path / "cells.csv").read_text()
    assert run_error(ip, "%gpumem --records --interval 1").args[0].startswith("%gpumem: --records")


def test_a_shell_without_a_kernel_gets_text_mode_lines_and_no_thread(ip):
    with capture_output() as started:
        run(ip, "%gpumem")
    shown = "".join(o.data.get("text/plain", "") for o in started.outputs)
    assert "Memory (this process)" in shown and "one line after each cell" in started.stdout
    assert _threads() == [] and _panel(ip) is None
    with capture_output() as cell:
        ip.run_cell("block = bytearray(32 * 1024 * 1024); block[::4096] = b'1' * len(block[::4096])",
                    store_history=True).raise_error()
    (line,) = [x for x in cell.stdout.splitlines() if x.startswith("[gpumem]")]
    assert " · host +3" in line and "MiB" in line  # +32.x MiB, or +3x MiB with the interpreter's own
    assert _threads() == []
    with capture_output() as stopped:
        run(ip, "%gpumem stop")
    assert "per-cell lines stopped" in stopped.stdout
    with capture_output() as after:
        run(ip, "x = 1")
    assert "[gpumem]" not in after.stdout
    assert run_error(ip, "%gpumem --text --widget").args[0].startswith("%gpumem: --text and --widget")


def test_kernel_frontend_gets_the_panel_whatever_is_importable(ip, monkeypatch):
    from torchgpu_magic.magics import gpumem

    monkeypatch.setattr(gpumem, "shows_widgets", lambda shell: True)
    with capture_output() as out:
        run(ip, "%gpumem --interval 0.2")
    assert len(_shown_model_ids(out)) == 1 and len(_threads()) == 1
    with capture_output() as text:
        run(ip, "%gpumem --text")  # the explicit choice wins, and the panel closes
    assert _threads() == [] and _panel(ip) is None and "one line after each cell" in text.stdout
    run(ip, "%gpumem stop")


def test_colab_refreshes_the_panel_after_each_cell_from_the_main_thread(ip, monkeypatch):
    import types

    from torchgpu_magic.magics import gpumem

    monkeypatch.setattr(gpumem, "shows_widgets", lambda shell: True)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    drawn_on = []
    real_update = panel.MemoryPanel.update

    def update(self, snapshot):
        drawn_on.append(threading.current_thread() is threading.main_thread())
        real_update(self, snapshot)

    monkeypatch.setattr(panel.MemoryPanel, "update", update)
    with capture_output():
        run(ip, "%gpumem --interval 0.05")
    assert _threads() == [], "no thread in Colab: its updates would not show"
    p = _panel(ip)
    stamp = p.title.value
    time.sleep(1.1)
    ip.run_cell("made_in_colab = bytearray(1024)", store_history=True).raise_error()
    assert "made_in_colab = bytearray(1024)" in p.cells.value  # drawn at once, not on a later tick
    assert p.title.value != stamp
    assert drawn_on and all(drawn_on)
    with capture_output():
        run(ip, "%gpumem --refresh thread")  # the option overrides the detection
    assert len(_threads()) == 1
    with capture_output():
        run(ip, "%gpumem --refresh cell")
    assert _wait_for(lambda: _threads() == [])
    run(ip, "%gpumem stop")


def test_gpus_are_remapped_on_the_main_thread_never_in_the_sampler_thread(ip, monkeypatch):
    """gpu_map asks torch under warnings.catch_warnings, which is process-wide: done in the sampler
    thread it could swallow the warnings of the user's running cell."""
    import warnings

    from torchgpu_magic import accelerators
    from torchgpu_magic.gpumem import figures

    state = ["not imported"]
    for module in (accelerators, figures):
        monkeypatch.setattr(module, "cuda_state", lambda: state[0])
    monkeypatch.setattr(accelerators, "state", lambda kind=None: state[0])  # MPS, XPU: their own state
    from torchgpu_magic.gpumem import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "cuda_state", lambda: state[0], raising=False)
    asked_on = []
    real_targets = GPUMemMagics._targets

    def targets(self):
        asked_on.append(threading.current_thread().name)
        return real_targets(self)

    monkeypatch.setattr(GPUMemMagics, "_targets", targets)
    entered_on = []
    real_catch = warnings.catch_warnings

    class Recording(real_catch):
        def __enter__(self):
            entered_on.append(threading.current_thread().name)
            return super().__enter__()

    monkeypatch.setattr(warnings, "catch_warnings", Recording)
    with capture_output():
        run(ip, "%gpumem --widget --interval 0.05")
    time.sleep(0.2)
    import torch

    # as after the user's first `import torch`; on ROCm, whose GPUs are watched through torch and AMD SMI
    # whatever CUDA's state, after its first `.cuda()`
    state[0] = "initialised" if torch.version.hip else "not initialised"
    ip.run_cell("import warnings as w\nwith w.catch_warnings(record=True) as got:\n"
                "    w.simplefilter('always')\n    for i in range(50):\n        w.warn(f'user {i}')\n"
                "n_warnings = len(got)", store_history=True).raise_error()
    time.sleep(0.3)
    assert ip.user_ns["n_warnings"] == 50
    assert len(asked_on) >= 2, "the state change was not followed"
    main = threading.main_thread().name
    assert set(asked_on) == {main}
    assert memory.THREAD_NAME not in entered_on
    run(ip, "%gpumem stop")


def test_the_panels_bundle_carries_text_and_html_snapshots(ip, monkeypatch):
    with capture_output() as out:
        run(ip, "%gpumem --widget --interval 0.2")
    (bundle,) = [o.data for o in out.outputs if WIDGET_MIME in o.data]
    assert 'class="tgm-snapshot"' in bundle["text/html"] and "tgm-host-rss" in bundle["text/html"]
    assert "<script" not in bundle["text/html"] and "http" not in bundle["text/html"]
    assert bundle["text/plain"].startswith("%gpumem a snapshot") and "RSS" in bundle["text/plain"]
    ip.run_cell("snap_cell = 1", store_history=True).raise_error()
    fresh = _panel(ip).static_bundle()
    assert "snap_cell = 1" in fresh["text/html"] and "[gpumem]" in fresh["text/plain"]
    with capture_output() as stopped:
        run(ip, "%gpumem stop")
    # the panel's output is rewritten with its last state (the plain shell prints it)
    (final,) = [o.data for o in stopped.outputs]
    assert WIDGET_MIME not in final  # the view is gone: the snapshot alone
    assert "panel closed: the figures as they were last" in final["text/plain"]
    assert "snap_cell = 1" in final["text/html"]


def test_records_returned_by_o_are_live_and_stay_after_stop(ip):
    with capture_output():
        records = run(ip, "%gpumem --text -o")
    assert len(records) == 0
    with capture_output():
        ip.run_cell("a = 1", store_history=True).raise_error()
        ip.run_cell("b = 2", store_history=True).raise_error()
    assert [r.first_line for r in records][-2:] == ["a = 1", "b = 2"]  # filled as the cells ran
    with capture_output():
        run(ip, "%gpumem stop")
        ip.run_cell("c = 3", store_history=True).raise_error()
    assert "c = 3" not in [r.first_line for r in records]
    assert [r.first_line for r in run(ip, "%gpumem --records")] == [r.first_line for r in records]


def test_widget_in_a_terminal_is_not_reprinted_after_each_cell(ip, monkeypatch):
    from torchgpu_magic.magics import gpumem

    monkeypatch.setattr(gpumem, "SNAPSHOT_EVERY", 0.0)  # every cell would be due a rewrite
    with capture_output() as started:
        run(ip, "%gpumem --widget")
    assert len(started.outputs) == 1  # shown once
    with capture_output() as cells:
        for code in ("a = 1", "b = 2", "c = 3"):
            ip.run_cell(code, store_history=True).raise_error()
    assert cells.outputs == [] and "Memory" not in cells.stdout
    with capture_output() as stopped:
        run(ip, "%gpumem stop")
    (final,) = [o.data["text/plain"] for o in stopped.outputs]
    assert "panel closed" in final and re.search(r"\[gpumem\] In\[\d+\] ", final)
