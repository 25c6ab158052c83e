"""The step's memory over its events (cudamem/series.py) and its picture (cudamem/picture.py): the series a
ledger records, replayed to the ledger's own figures; every event's category, phase, module, operator and
cell line; the picture's values equal to the report's table, measured and predicted; a long series thinned
with its peak kept exact; the SVG self-contained; the text within 100 columns, as IPython's
PlainTextFormatter and a real terminal IPython show it; ``--compare`` and ``--svg``."""
from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import threading
import xml.etree.ElementTree as ET

import pytest
from conftest import ROOT, run, run_error
from IPython.core.error import UsageError
from IPython.core.formatters import PlainTextFormatter

from torchgpu_magic.cudamem import CellMemory, StepComparison
from torchgpu_magic.cudamem import picture as picture_module
from torchgpu_magic.cudamem.allocator import CATEGORIES, PHASES, Ledger
from torchgpu_magic.cudamem.picture import TEXT_COLUMNS, MemoryPicture, SideBySide
from torchgpu_magic.cudamem.report import INDENT
from torchgpu_magic.render import fmt_bytes

MIB = 2**20
STEP = "loss = model(x).square().mean()\nloss.backward()\nopt.step()\n"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def mip(ip):
    """A two-layer MLP without bias (1024 -> 512 -> 1024, 4 MiB), AdamW and a 64 x 1024 batch."""
    run(ip, "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(1024, 512, "
            "bias=False), torch.nn.ReLU(), torch.nn.Linear(512, 1024, bias=False))\n"
            "opt = torch.optim.AdamW(model.parameters())\nx = torch.randn(64, 1024)")
    return ip


def _replayed(series) -> dict:
    """The series' columns (``to_dict``), replayed here by hand: the total and the bytes of each category
    after each row, from the kinds and sizes alone."""
    columns = series.to_dict()
    live = {name: columns[name][0] for name in CATEGORIES}
    totals, by_row = [], []
    for kind, category, source, size in zip(columns["kind"], columns["category"], columns["from category"],
                                            columns["bytes"]):
        if kind == "alloc":
            live[category] += size
        elif kind == "free":
            live[category] -= size
        elif kind == "recategorize":
            live[source] -= size
            live[category] += size
        totals.append(sum(live.values()))
        by_row.append(dict(live))
    return {"columns": columns, "totals": totals, "by_row": by_row}


def test_a_ledgers_series_replays_to_its_own_figures():
    ledger = Ledger()
    ledger.add("w", 100, "parameters")
    where, context = ["forward", "model.0"], ["aten.mm", 2]
    ledger.start(lambda: tuple(where), lambda: tuple(context))
    ledger.add("act", 400, "activations")
    where[:], context[:] = ["backward", "model.1"], ["aten.t", 3]
    ledger.remove("act")
    ledger.add("tmp", 300, "temporaries")
    ledger.recategorize("tmp", "gradients")
    ledger.resize("tmp", 350)
    ledger.stop()
    ledger.add("late", 10**9, "other")  # after the run: not a row either
    series = ledger.series
    columns = series.to_dict()
    assert columns["kind"] == ["start", "alloc", "free", "alloc", "recategorize", "free", "alloc"]
    assert columns["bytes"] == [100, 400, 400, 300, 300, 300, 350]
    assert columns["total"] == [100, 500, 100, 400, 400, 100, 450] == _replayed(series)["totals"]
    assert columns["phase"] == ["before the cell"] + ["forward"] + ["backward"] * 5
    assert columns["module"][1:3] == ["model.0", "model.1"]
    assert columns["op"][:3] == [None, "aten.mm", "aten.t"]
    assert columns["line"] == [None, 2, 3, 3, 3, 3, 3] and columns["from category"][4] == "temporaries"
    assert series.peak_row == 1 and series.where(1)["phase"] == ledger.peak_phase == "forward"
    assert series.phase_peaks() == ledger.phase_peaks
    assert dict(zip(CATEGORIES, series.categories_at([series.peak_row])[0])) == ledger.peak_categories
    assert series.highest()["gradients"] == 350 and series.events == 6 and len(series) == 7
    assert set(columns) >= {"row", "total", *CATEGORIES} and len({len(v) for v in columns.values()}) == 1


@pytest.mark.parametrize("how", ["", "--predict cpu", "--predict cuda --capacity 80GiB"])
def test_the_curve_and_its_picture_equal_the_reports_table(mip, how):
    report = run(mip, f"%%cudamem {how} -o -q\n{STEP}")
    series = report.series
    replay = _replayed(series)
    peak = series.peak_row
    assert replay["totals"][peak] == max(replay["totals"]) == report.peak
    table = {n: report.categories.get(n, 0) for n in CATEGORIES}
    assert replay["by_row"][peak] == table
    highs: dict = {PHASES[0]: replay["totals"][0]}
    for phase, kind, total in zip(replay["columns"]["phase"], replay["columns"]["kind"], replay["totals"]):
        if kind == "alloc":
            highs[phase] = max(highs.get(phase, 0), total)
    assert highs == report.phase_peaks
    assert replay["totals"][0] == report.before and replay["totals"][-1] == report.after
    figures = report.picture().figures()
    assert (figures["peak"], figures["phase"], figures["phase_peaks"]) == (report.peak, report.peak_phase,
                                                                          report.phase_peaks)
    assert figures["module"] == report.peak_module
    assert {n: figures["categories"][n] for n in CATEGORIES} == table
    svg = report.picture().to_svg()
    for name in CATEGORIES:  # each band's title names its category and its bytes at the peak
        if figures["highest"][name]:
            assert f"<title>{name}: {fmt_bytes(report.categories[name])} at the peak" in svg
    assert f"peak {fmt_bytes(report.peak)} · {report.peak_phase}" in svg
    text = PlainTextFormatter()(report)
    assert f"peak {fmt_bytes(report.peak)} · {report.peak_phase}" in text


def test_each_event_names_its_module_operator_and_cell_line(mip):
    run(mip, "def outside(t):\n    return t.flip(0).sum()")
    cell = ("def inside(t):\n    return t.cumsum(0).sum()\n"  # lines 1-2
            "loss = model(x).square().mean()\n"  # 3
            "loss.backward()\n"  # 4
            "extra = outside(x) + inside(x)\n"  # 5
            "opt.step()\n")  # 6
    for how in ("", "--predict cpu"):
        series = run(mip, f"%%cudamem {how} -o -q\n{cell}").series
        rows = series.to_dict()
        forward = [i for i, p in enumerate(rows["phase"]) if p == "forward"]
        assert {rows["module"][i] for i in forward} - {"model"} == {"model.0", "model.1", "model.2"}
        assert "aten.mm" in {rows["op"][i] for i in forward}
        assert _sources(series, "phase", "forward") == {"loss = model(x).square().mean()"}
        assert _sources(series, "phase", "backward") == {"loss.backward()"}
        assert _sources(series, "phase", "optimizer step") == {"opt.step()"}
        # a function from an earlier cell: the line of this cell that called it; one defined in this
        # cell: its own line, the innermost frame of the cell
        assert _sources(series, "op", "aten.flip") == {"extra = outside(x) + inside(x)"}
        assert _sources(series, "op", "aten.cumsum") == {"return t.cumsum(0).sum()"}
        numbers = {text: number for number, text in series.texts.items()}
        assert numbers["opt.step()"] - numbers["return t.cumsum(0).sum()"] == 4  # the cell's own numbering
        where = series.where(series.peak_row)
        assert (where["phase"], where["source"]) == ("optimizer step", "opt.step()")
        assert where["line"] == numbers["opt.step()"] and where["op"].startswith("aten.")


def _sources(series, column: str, value: str) -> set:
    """The cell's source lines named by the rows whose ``column`` is ``value``."""
    rows = series.to_dict()
    return {series.texts[line] for line, found in zip(rows["line"], rows[column]) if found == value}


def test_the_cell_line_of_an_event_on_another_thread_is_the_waiting_cells():
    """The autograd engine runs a CUDA backward on its own device threads, where no frame of the cell is:
    the line is then the one the cell's thread waits on."""
    from torchgpu_magic.cudamem import run as tracking

    tracker = tracking.tracker_class()(lambda name: Ledger(), filename="<cell-under-test>")
    seen: list = []
    ready, done = threading.Event(), threading.Event()

    def worker() -> None:
        ready.wait()
        seen.append(tracker.context())
        done.set()

    code = compile("thread = threading.Thread(target=worker)\nthread.start()\n"
                   "ready.set(); done.wait()\nthread.join()\n", "<cell-under-test>", "exec")
    exec(code, {"threading": threading, "worker": worker, "ready": ready, "done": done})
    assert seen == [(None, 3)]  # asked while the cell's thread was on line 3, waiting


def test_to_pandas_and_to_dict_give_the_series_for_plotting(mip):
    report = run(mip, f"%%cudamem -o -q\n{STEP}")
    columns = report.series.to_dict()
    frame = report.series.to_pandas()
    assert frame.index.name == "row" and len(frame) == len(report.series) == len(columns["total"])
    assert list(frame["total"]) == columns["total"] and frame["total"].max() == report.peak
    assert set(CATEGORIES) <= set(frame.columns)
    assert frame.loc[report.series.peak_row, "phase"] == report.peak_phase
    data = report.to_dict()
    json.dumps(data)
    assert data["series"]["total"] == columns["total"]


def _long_series(events: int):
    """A ledger's series of ``events`` events: repeated waves of allocations and frees, one higher."""
    ledger = Ledger()
    where = ["forward", None]
    ledger.start(lambda: tuple(where), lambda: ("aten.empty", 1))
    key = 0
    for wave in range(events // 200):
        where[0] = "forward" if wave % 2 == 0 else "backward"
        size = 3 * MIB if wave == 137 else MIB
        for _ in range(100):
            key += 1
            ledger.add(key, size, "activations")
        for k in range(key - 99, key + 1):
            ledger.remove(k)
    return ledger.series


def test_a_long_series_is_thinned_to_the_pixels_but_its_peak_stays_exact():
    series = _long_series(100_000)
    assert series.events == 100_000
    rows = series.sample(600)
    totals = series.totals()
    assert len(rows) <= 4 * 600 + 3 and series.peak_row in rows
    assert max(totals[r] for r in rows) == totals[series.peak_row] == 300 * MIB
    assert min(totals[r] for r in rows) == min(totals) == 0  # the troughs are kept too
    picture = MemoryPicture(series, "long")
    svg = picture.to_svg()
    [band] = re.findall(r'<polygon class="tgm-band"[^>]*points="([^"]*)"', svg)
    assert len(band.split()) <= 4 * 700 + 5
    assert "peak 300 MiB" in svg
    lines = picture.to_text().splitlines()
    assert max(len(line) for line in lines) <= 100 and any("peak 300 MiB" in line for line in lines)


def _two_phases(events: int, forward: int):
    """A ledger's series of ``events`` allocations, the first ``forward`` in the forward, the rest in the
    backward."""
    ledger = Ledger()
    where = ["forward", None]
    ledger.start(lambda: tuple(where))
    for key in range(events):
        where[0] = "forward" if key < forward else "backward"
        ledger.add(key, MIB, "activations")
    return ledger.series


@pytest.mark.parametrize("forward", [1, 3, 40])
def test_the_phase_row_under_the_text_chart_fits_any_length_of_series(forward):
    """Between as many rows as columns and twice as many, a column's slice is one or two rows: each column
    still names the phase of most of its rows (a short phase once left a column with none, and raised)."""
    for events in range(85, 200):
        lines = MemoryPicture(_two_phases(events, forward), "short").to_text().splitlines()
        axis = next(i for i, line in enumerate(lines) if line.lstrip().startswith("0 B"))
        assert len(lines[axis + 1]) == len(lines[axis]) and "backward" in lines[axis + 1], (events, lines)


def test_the_svg_is_one_self_contained_element(mip):
    report = run(mip, f"%%cudamem --predict cuda --capacity 80GiB -o -q\n{STEP}")
    svg = report.picture().to_svg()
    root = ET.fromstring(svg)  # well-formed XML: a valid .svg file as it is
    assert root.tag == f"{SVG}svg" and root.get("viewBox")
    assert "<script" not in svg and "href" not in svg and "url(" not in svg and "<style" not in svg
    assert re.findall(r"https?://[^\"]+", svg) == ["http://www.w3.org/2000/svg"]  # the namespace only
    bands = root.findall(f".//{SVG}polygon")
    assert {b.get("data-category") for b in bands} == {n for n, v in report.picture().highest.items() if v}
    assert all(b.find(f"{SVG}title") is not None for b in bands)
    names = {t.text for t in root.iter(f"{SVG}text") if t.get("class") == "tgm-phase-name"}
    assert {"backward", "optimizer step"} <= names
    assert "workspaces" in svg  # the cuBLAS workspaces of a CUDA prediction are a band of their own
    html = report._repr_html_()
    assert html.count("<svg") == 1 and html.index("<svg") < html.index("By category")


@pytest.mark.parametrize("capacity, drawn", [("40MiB", True), ("80GiB", False)])
def test_the_capacity_is_a_line_on_the_scale_or_named_above_it(mip, capacity, drawn):
    report = run(mip, f"%%cudamem --predict cpu --capacity {capacity} -o -q\n{STEP}")
    picture = report.picture()
    svg, text = picture.to_svg(), picture.to_text()
    assert ('class="tgm-capacity"><line' in svg) is drawn
    assert (picture.scale == report.capacity) is drawn and (picture.scale == report.peak) is not drawn
    if drawn:
        assert re.search(rf"^ *{re.escape(fmt_bytes(report.capacity))} ┤", text, re.M)
    else:
        assert "capacity 80.0 GiB (--capacity): above the chart" in text
        assert "above the chart, the peak is" in svg


def test_the_text_chart_fits_100_columns_with_the_peak_marked_and_the_phases_under_it(mip):
    report = run(mip, f"%%cudamem -o -q\n{STEP}")
    text = PlainTextFormatter()(report)
    drawn = textwrap.indent(report.picture(TEXT_COLUMNS - len(INDENT)).to_text(), INDENT)  # as it reports it
    assert drawn in text and max(len(line) for line in drawn.splitlines()) <= 100
    assert max(len(line) for line in report.picture(60).to_text().splitlines()) <= 60  # narrower, if asked
    lines = text.splitlines()
    [marker] = [line for line in lines if "▼" in line]
    assert "peak" in marker and "optimizer step" in marker and re.search(r"line \d+: opt\.step\(\) ", marker)
    axis = next(i for i, line in enumerate(lines) if "┼──" in line)
    chart = lines[axis - 8:axis]
    assert chart[0].strip().startswith(fmt_bytes(report.peak)) and all("│" in r or "┤" in r for r in chart)
    column = marker.index("▼")
    assert chart[0][column] != " "  # the peak's column reaches the top row
    phases = lines[axis + 1]
    assert "backward" in phases and "optimizer step" in phases and "├" in phases
    assert "█ parameters" in text and "▓ optimizer state" in text and "events in order" in text
    assert text.index("▼") < text.index("By category")


def test_without_unicode_the_text_chart_is_ascii(mip, monkeypatch):
    report = run(mip, f"%%cudamem -o -q\n{STEP}")
    monkeypatch.setattr(picture_module, "can_print", lambda text: False)
    text = report.picture().to_text()
    assert text.isascii()
    assert re.search(r"^ *(v peak .*|peak .*opt\.step\(\) v)$", text, re.M)
    assert "# parameters" in text and "+-----" in text and "|" in text


def test_a_cell_that_allocates_nothing_still_draws(mip):
    report = run(mip, "%%cudamem -o -q\ny = 1 + 1")
    assert report.series.events == 0 and report.peak == report.before
    ET.fromstring(report.picture().to_svg())
    assert "0 events in order" in report.picture().to_text()


def test_compare_shows_one_step_measured_and_predicted_side_by_side(mip):
    result = run(mip, f"%%cudamem --compare -o -q\n{STEP}")
    assert isinstance(result, StepComparison) and isinstance(result.measured, CellMemory)
    assert (result.measured.mode, result.predicted.mode) == ("measured", "predicted")
    assert result.measured.device == result.predicted.device == "cpu"  # where the model is
    # on cpu both are MemTracker's count of the same operators, byte for byte
    assert (result.predicted.peak, result.predicted.phase_peaks) == (result.measured.peak,
                                                                     result.measured.phase_peaks)
    side = result.picture()
    assert isinstance(side, SideBySide) and len({p.scale for p in side.pictures}) == 1
    html = result._repr_html_()
    assert html.count("<svg") == 2 and "measured on cpu" in html and "predicted for cpu" in html
    ET.fromstring(side.to_svg())
    text = PlainTextFormatter()(result)
    assert text.startswith("%%cudamem --compare: one step measured on cpu and predicted for cpu")
    assert text.count("▼") == 2 and "predicted / measured" in text and "1.0000" in text
    assert max(len(line) for line in text.splitlines()) <= 100  # both charts, indented in the report
    json.dumps(result.to_dict())


def test_compare_predicts_for_the_device_it_names(mip):
    result = run(mip, f"%%cudamem cpu --compare -o -q\n{STEP}")
    assert result.predicted.device == "cpu"
    for line, says in (("--compare --predict", "leave out --predict and --fit"),
                       ("--compare --fit x --capacity 1GiB", "leave out --predict and --fit")):
        error = run_error(mip, f"%%cudamem {line}\n{STEP}")
        assert isinstance(error, UsageError) and says in str(error) and "\n" not in str(error)
    error = run_error(mip, "%%cudamem --compare\n%whereis\nmodel(x)")
    assert isinstance(error, UsageError) and "--compare does not run IPython magics" in str(error)


def test_svg_saves_the_picture(mip, tmp_path):
    path = tmp_path / "step.svg"
    run(mip, f"%%cudamem --svg {path} -q\n{STEP}")
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg" and root.findall(f".//{SVG}polygon")
    both = tmp_path / "both.svg"
    run(mip, f"%%cudamem --compare --svg {both} -q\n{STEP}")
    assert len(ET.parse(both).getroot().findall(f"{SVG}svg")) == 2  # measured and predicted, side by side
    fitted = tmp_path / "fit.svg"
    result = run(mip, f"%%cudamem --predict cpu --fit x --capacity 64MiB --svg {fitted} -o -q\n{STEP}")
    assert f"peak {fmt_bytes(result.at_best.peak)}" in fitted.read_text()


def test_bad_svg_paths_are_one_line_errors_before_the_cell_runs(mip, tmp_path):
    cases = [(str(tmp_path / "step.png"), "--svg takes a file name ending in .svg"),
             (str(tmp_path / "missing" / "step.svg"), "there is no directory"),
             (str(tmp_path / "folder.svg"), "is a directory")]
    (tmp_path / "folder.svg").mkdir()
    if hasattr(os, "geteuid") and os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases.append((str(locked / "step.svg"), "cannot be written here"))
    for path, says in cases:
        error = run_error(mip, f"%%cudamem --svg {path}\nran = True\n{STEP}")
        assert isinstance(error, UsageError) and says in str(error) and "\n" not in str(error), error
        assert "ran" not in mip.user_ns


def test_the_report_shows_the_picture_as_text_and_html(mip):
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        run(mip, f"%%cudamem --predict cpu\n{STEP}")
    [shown] = captured.outputs  # (captured, stdout cannot print '▼': the chart is drawn in ASCII)
    assert "events in order (allocations and frees)" in shown.data["text/plain"]
    assert "<svg" in shown.data["text/html"]
    assert "tgm-band" in shown.data["text/html"]


@pytest.mark.fresh_process
def test_the_chart_in_a_real_terminal_ipython():
    """Terminal IPython in a pseudo-terminal 100 columns wide: the report's chart as it prints there."""
    pexpect = pytest.importorskip("pexpect")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p), TERM="dumb", PYTHONIOENCODING="utf-8")
    child = pexpect.spawn(sys.executable, ["-m", "IPython", "--simple-prompt", "--no-banner",
                                           "--colors=NoColor", "--HistoryManager.enabled=False"],
                          env=env, encoding="utf-8", timeout=180, dimensions=(60, 100))
    prompt = r"In \[\d+\]: "
    try:
        child.expect(prompt)
        for line in ("%load_ext torchgpu_magic",
                     "import torch; model = torch.nn.Linear(256, 256); x = torch.randn(32, 256)",
                     "get_ipython().run_cell_magic('cudamem', 'cpu', 'model(x).sum().backward()')"):
            child.sendline(line)
            child.expect(prompt)
        out = child.before.replace("\r\n", "\n")
    finally:
        child.sendline("exit")
        child.expect(pexpect.EOF)
        child.close()
    lines = out.splitlines()
    assert "%%cudamem measured on cpu" in out and "By category" in out
    [marker] = [line for line in lines if "▼" in line]
    assert "peak" in marker and "backward" in marker
    assert any("┼──" in line for line in lines) and any("├" in line and "backward" in line for line in lines)
    chart = [line for line in lines if "┤" in line or "│" in line or "▼" in line]
    assert chart and max(len(line) for line in chart) <= 100


@pytest.mark.gpu
def test_a_cuda_backward_on_the_engines_threads_names_the_cells_line(ip):
    """On a GPU the autograd engine runs the backward on a device thread of its own, where no frame of
    the cell is: each backward event must still name the line that called ``backward()``, and the
    series must equal the report's table there too."""
    run(ip, "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), "
            "torch.nn.Linear(1024, 1024)).cuda()\nopt = torch.optim.AdamW(model.parameters())\n"
            "x = torch.randn(256, 1024, device='cuda')")
    report = run(ip, f"%%cudamem cuda -o -q\n{STEP}")
    rows = report.series.to_dict()
    backward = [i for i, phase in enumerate(rows["phase"]) if phase == "backward"]
    assert backward and _sources(report.series, "phase", "backward") == {"loss.backward()"}
    assert report.series.totals()[report.series.peak_row] == report.peak
    assert report.series.phase_peaks() == report.phase_peaks
