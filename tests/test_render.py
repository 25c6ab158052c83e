"""The report model (torchgpu_magic/render.py): a title and parts rendered as text and HTML, and, for every
report class of the package, its text (through IPython's PlainTextFormatter) and its HTML (through the
HTML formatter) carrying the same lines, so the two cannot drift."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from html.parser import HTMLParser

import pytest
from conftest import bare, cuda_view
from fake_clock import FakeClock, fake_run
from IPython.core.formatters import HTMLFormatter, PlainTextFormatter

import torchgpu_magic
from torchgpu_magic.render import Fields, Lines, Report, Reportable, Table

MiB = 1024 * 1024


# ---- the model ------------------------------------------------------------------------------------------
def test_a_title_then_its_parts_indented_and_none_or_empty_parts_left_out():
    table = Table(["name", "bytes"], align="lr", title="on cpu")
    table.add("x", "48 B")
    report = Report([Lines(["first", "second"]), None, Lines([]), table, Fields([("memory", "N/A")])],
                    title="Title", indent="  ")
    assert report.to_text() == ("Title\n  first\n  second\n  on cpu\n  name  bytes\n  ----  -----\n"
                                "  x      48 B\n  memory: N/A")
    html = report.to_html()
    assert html.startswith('<div class="torchgpu-magic"><div><b>Title</b></div>')
    assert html.count("<table") == 2
    assert "<th style=\"text-align:left\">memory:</th><td style=\"text-align:left\">N/A</td>" in html


def test_gap_separates_the_title_and_parts_by_a_blank_line_and_sections_nest():
    notes = Report([Lines(["a note"])], title="Notes:", indent="  ")
    report = Report([Lines(["one"]), notes], title="Head", gap=True)
    assert report.to_text() == "Head\n\none\n\nNotes:\n  a note"
    assert Report([notes], indent="  ").to_text() == "  Notes:\n    a note"


def test_html_is_escaped_and_pre_lines_keep_their_columns():
    html = Report([Lines(["a < b & c"]), Lines(["  x  cpu", "  yy meta"], pre=True)]).to_html()
    assert "a &lt; b &amp; c" in html
    assert html.endswith('<pre class="torchgpu-magic-note">  x  cpu\n  yy meta</pre>')
    assert Report([]).to_text() == "" and Report([], title="only").to_text() == "only"


def test_a_report_class_shows_its_report_everywhere():
    class Shown(Reportable):
        def report(self):
            return Report([Lines(["body"])], title="shown", indent="  ")

    shown = Shown()
    assert str(shown) == shown.to_text() == PlainTextFormatter()(shown) == "shown\n  body"
    assert HTMLFormatter()(shown) == shown.report().to_html()


def test_a_class_with_its_own_repr_still_prints_its_report_in_ipython():
    """IPython takes a class's own __repr__ over an inherited _repr_pretty_: the model puts one beside it."""

    class Short(Reportable):
        def report(self):
            return Report([Lines(["the report"])])

        def __repr__(self):
            return "<Short>"

    assert repr(Short()) == "<Short>" and PlainTextFormatter()(Short()) == "the report"


# ---- every report class: the same lines as text and as HTML --------------------------------------------
class _HTMLLines(HTMLParser):
    """The lines a browser shows for our markup: a block element starts a line, a row's cells share one,
    a <pre> keeps its own lines."""

    BLOCKS = {"div", "p", "tr", "caption", "li", "pre", "table", "thead", "tbody", "ol", "ul", "br"}

    def __init__(self) -> None:
        super().__init__()
        self.lines = [""]
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.BLOCKS:
            self.lines.append("")
        elif tag in ("td", "th"):
            self.lines[-1] += " "
        self.pre += tag == "pre"

    def handle_endtag(self, tag):
        if tag in self.BLOCKS:
            self.lines.append("")
        self.pre -= tag == "pre"

    def handle_data(self, data):
        first, *rest = data.split("\n") if self.pre else [data]
        self.lines[-1] += first
        self.lines.extend(rest)


def _shown(lines):
    """The lines with their words only: indentation, alignment and tables' rules are layout."""
    words = (" ".join(line.split()) for line in lines)
    return [line for line in words if line and not re.fullmatch(r"[- ]+", line)]


def _html_lines(markup):
    parser = _HTMLLines()
    parser.feed(markup)
    parser.close()
    return _shown(parser.lines)


def _timing_result(**kw):
    from torchgpu_magic import timing

    clock = FakeClock(lambda call, loops: 2e-3 + 1e-5 * (call % 3), kind="device", host_ratio=0.01)
    run = fake_run(clock, warmup=0, samples=9, loops=1)
    result = timing.result_from(run, clock, "cuda:0", (1000, 2048, 4096), 1e-8,
                                timing.Options(samples=9, **kw), 4, "2.13.0", "Fake GPU")
    result.kernels = [timing.KernelRow("aten::mm", 1, 1e-3, 0.9)]
    return result


def _timing_reports():
    from torchgpu_magic import timing
    from torchgpu_magic.cluster import timing as cluster_timing

    fast, slow = _timing_result(), _timing_result(cold=True)
    slow.warnings.append("noisy: IQR/median 12.0 %")
    cpu = timing.result_from(fake_run(FakeClock(lambda c, n: 1e-3), samples=5), FakeClock(lambda c, n: 1e-3),
                             "cpu", (None, None, None), None, timing.Options(samples=5), 1, "2.13.0", "CPU")
    rows = [("engine 0", cluster_timing.result_of(fast.to_dict())), ("engine 1", slow)]
    return [fast, cpu, timing.TimingComparison([("cpu", cpu), ("cuda:0", fast)]),
            cluster_timing.ClusterTiming(rows, failed=[("engine 2", "timeout: no answer in 5 s")],
                                         hosts={"engine 0": "a", "engine 1": "a"})]


def _gpu_reports(fake_nvml):
    from torchgpu_magic.gpus import inventory

    busy = fake_nvml("h100_busy").machine.gpus[0].uuid
    reports = [inventory.build_report(view_fn=lambda: cuda_view([bare(busy)]))]
    fake_nvml("gpu_lost")
    return reports + [inventory.build_report(view_fn=lambda: inventory.TorchView(version="2.13.0+cpu"))] \
        + _accelerator_reports()


def _accelerator_reports():
    """%gpuinfo's report where NVML does not see the GPU: an MI300X torch uses (AMD SMI's figures, a
    process, a warning), and a Mac whose torch cannot use MPS (the reason, no GPU rows)."""
    from torchgpu_magic.gpus.accelerated import AcceleratorReport, DeviceRow
    from torchgpu_magic.gpus.causes import Diagnosis

    mi300x = DeviceRow("cuda:0", "AMD Instinct MI300X", "gfx942", 304, 192 * 1024 * MiB, 4 * MiB, 6 * MiB,
                       5 * MiB, used=900 * MiB, total=192 * 1024 * MiB, utilization=3, temperature=41,
                       power=140.0, processes=[(4242, "python", 600 * MiB, True)])
    gpu_less = DeviceRow(None, "AMD Instinct MI300X")
    rocm = AcceleratorReport("ROCm", "2.13.0+rocm6.4", "ROCm, HIP 6.4", [("AMD GPUs (AMD SMI)", "2")],
                             [mi300x, gpu_less], [], {"HIP_VISIBLE_DEVICES": "0"}, ["a note"],
                             [Diagnosis("gfx", "gfx942 is not in this build", "install a build for it")],
                             pid=4242)
    mac = AcceleratorReport("MPS", "2.13.0", "no MPS", [("chip", "Apple M2 Max")], [],
                            [Diagnosis("no_mps", "this torch has no MPS", "pip install torch")],
                            {"PYTORCH_MPS_HIGH_WATERMARK_RATIO": None}, show_processes=False, pid=1)
    return [rocm, mac]


def _memory_reports():
    from torchgpu_magic import gpumem
    from torchgpu_magic.gpumem.records import CellGPU, CellRecord, CellRecords

    h100 = gpumem.GPUTarget(0, 0, "NVIDIA H100 80GB HBM3")
    gpu = gpumem.GPUMemory(h100, used=10 * MiB, total=100 * MiB, process=9 * MiB, others=0,
                           allocated=4 * MiB, reserved=6 * MiB, peak=5 * MiB, problems=("lost",))
    snapshot = gpumem.collect([])
    records = CellRecords([CellRecord(n, f"cell_{n}()", 1.7e9 + n, 0.001 * n, n * MiB, 100 * MiB + n,
                                      (CellGPU(0, n * MiB, 2 * n * MiB),)) for n in range(1, 4)])
    return [snapshot, type(snapshot)(1.0, 1.7e9, snapshot.host, (gpu,), "initialised", ("NVML: lost",)),
            records, CellRecords()]


def _placement_reports():
    import torch

    from torchgpu_magic import placement

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2, device="meta"))
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    ns = {"x": torch.ones(3, 4), "model": model, "opt": optimizer}
    return [placement.describe("x", ns["x"], ns), placement.describe("model", model),
            placement.describe("opt", optimizer), placement.namespace_report(ns),
            placement.namespace_report({}), placement.namespace_report(ns, device="cuda:0")]


def _cluster_reports():
    from torchgpu_magic.cluster import LocalAssignment
    from torchgpu_magic.cluster.gpus import ClusterGPUReport, Flag
    from torchgpu_magic.cluster.memory import ClusterMemory
    from torchgpu_magic.cluster.placement import ClusterPlacement

    env = {"torch_version": "2.8.0+cu128", "torch_cuda": "12.8"}
    engines = [{"label": "engine 0", "host": "a", "pid": 11, "ok": True, "problem": "", "message": "",
                "report": {"environment": env, "dist": {"rank": 0, "world_size": 2, "backend": "nccl"}},
                "map": [(0, 0)], "on": [0]},
               {"label": "engine 1", "host": "", "pid": None, "ok": False, "problem": "timeout",
                "message": "no answer in 5 s", "report": None}]
    gpus = [{"host": "a", "index": 0, "name": "H100", "uuid": "GPU-1", "used": 2 * MiB, "total": 80 * MiB,
             "util": 3, "engines": ["engine 0"], "stray": ["engine 1"]}]
    processes = [("a", 0, 11, "python", MiB, "engine 0")]
    gpu_report = ClusterGPUReport("rc", "ipyparallel", engines, gpus, processes,
                                  [Flag("timeout", "engine 1 did not answer", "restart it")])
    key = ("a", "1")
    memory = ClusterMemory(
        [{"key": key, "host": "a", "index": 0, "name": "H100", "used": 2 * MiB, "total": 80 * MiB, "util": 3,
          "engines": ["engine 0"], "stale": False, "history": [MiB, 2 * MiB], "procs": {11: MiB}}],
        [{"engine": "engine 0", "host": "a", "pid": 11, "gpus": {key: (MiB, 2 * MiB)}, "rss": 50 * MiB,
          "status": "", "history": [40 * MiB, 50 * MiB]},
         {"engine": "engine 1", "host": "a", "pid": 12, "gpus": {}, "rss": None, "status": "busy since 10:00",
          "history": []}],
        [("[3]", {"engine 0": {"gpus": {"0": MiB}, "peak_rss": None}})], [("engine 1", "busy since 10:00")])
    placed = ClusterPlacement({"model": {"engine 0": {"kind": "module", "devices": ["cuda:0"], "summary": ""},
                                         "engine 1": {"kind": "module", "devices": ["cpu"], "summary": ""}}},
                              ["engine 0", "engine 1"], {"x": ["engine 1"]}, [("engine 2", "timeout")])
    return [gpu_report, ClusterGPUReport("rc", "dask", engines[:1], [], []), memory,
            ClusterMemory([], memory.rows[1:]), placed, ClusterPlacement({}, []),
            LocalAssignment([("engine 0", "a", "cuda:0", "LOCAL_RANK=0")])]


def _explain_reports():
    from torchgpu_magic.explain.mismatch import Culprit, Diagnosis

    culprits = [Culprit("model", "module", ("meta",), "Linear", "line"),
                Culprit("x", "tensor", ("cpu",), "x · cpu", "inside"),
                Culprit("weights", "tensor", ("cpu",), "w", "cell")]
    return [Diagnosis(("cpu", "meta"), "logits = model(x)", 2, culprits, ["model.to('cpu')"],
                      "return self.fc(x)", 4, "forward")]


def _holders_reports(monkeypatch):
    """The holders, what %gpumem free gave back, the out-of-memory explanation. Their text wraps to 100
    columns where HTML leaves wrapping to the browser: wrapping is layout, so they are compared unwrapped."""
    import torch

    from torchgpu_magic.explain.failing import FailingLine
    from torchgpu_magic.explain.oomerror import OOMFacts
    from torchgpu_magic.explain.outofmemory import OOMExplanation
    from torchgpu_magic.holders import devicestate, holdings, report
    from torchgpu_magic.holders.free import FreeReport, FreeStep

    monkeypatch.setattr(report, "WIDTH", 10_000)
    x = torch.ones(256, 1024)
    cpu = report.holders_report({"x": x, "alias": x, "small": torch.ones(4)}, "cpu")
    state = devicestate.DeviceState("cuda:0", total=80 * 1024 * MiB, free=MiB, allocated=60 * MiB,
                                    reserved=90 * MiB, largest_free_block=MiB,
                                    others=((7, "python", 9 * MiB),), requested=59 * MiB,
                                    notes=("no CUDA context on cuda:0 yet",))
    gpu = report.device_holders(holdings.Holdings(), "cuda:0", state)
    freed = FreeReport([FreeStep("the failed cell's traceback", ["x", "y"], {"cpu": MiB, "cuda:0": 2 * MiB},
                                 {"cpu": 2 * MiB, "cuda:0": 2 * MiB}),
                        FreeStep("torch's cache", ["torch.cuda.empty_cache()"], {"cuda:0": 4 * MiB})],
                       {"cpu": "RSS", "cuda:0": "torch reserved"},
                       [(f"t{i}", "cpu", MiB, f"del t{i} frees 1.00 MiB") for i in range(12)],
                       {"cpu": MiB, "cuda:0": 4 * MiB}, {"cuda:0": 4 * MiB})
    facts = OOMFacts("cuda", "cuda:0", "allocator", asked=2 * MiB, total=80 * 1024 * MiB, free=MiB)
    failing = FailingLine("y = big(x)", 1, "return x @ x", 4, "forward")
    oom = OOMExplanation("cuda:0", facts, gpu, [(MiB, "del x frees 1.00 MiB"), (None, "a smaller batch")],
                         failing=failing)
    too_big = OOMExplanation("cuda:0", facts, gpu, [(None, "the request alone is more")], too_big=True)
    return [cpu, cpu.section("cpu"), report.HoldersReport([]), gpu, freed, FreeReport([], {"cpu": "RSS"}),
            oom, too_big, OOMExplanation("cpu", OOMFacts("cpu", "cpu", "cpu"), cpu.section("cpu"), [])]


def _cudamem_reports():
    """A step's memory measured (its picture, both tables, allowances and notes), predicted with a
    capacity, the two compared, and the --fit searches with and without a size that fits."""
    from torchgpu_magic.cudamem import CellMemory, FitResult, StepComparison
    from torchgpu_magic.cudamem.allocator import Ledger
    from torchgpu_magic.cudamem.report import ModuleRow

    ledger = Ledger()
    ledger.add("weight", 4 * MiB, "parameters")
    where, context = ["forward", "model.0"], ["aten.mm", 1]
    ledger.start(lambda: tuple(where), lambda: tuple(context))
    ledger.add("act", 8 * MiB, "activations")
    where[:], context[:] = ["backward", "model.0"], ["aten.mm", 2]
    ledger.add("grad", 4 * MiB, "gradients")
    ledger.remove("act")
    ledger.stop()
    ledger.series.texts = {1: "loss = model(x).sum()", 2: "loss.backward()"}
    rows = [ModuleRow("model", "Sequential", 4 * MiB, 1, 8 * MiB, 8 * MiB, 12 * MiB),
            ModuleRow("model.0", "Linear", 4 * MiB, 2, 8 * MiB, 8 * MiB, 12 * MiB)]

    def cell(mode, **kw):
        return CellMemory(mode, "cuda:0", "a test", ledger.peak, ledger.peak_phase, "model.0",
                          dict(ledger.phase_peaks), dict(ledger.peak_categories), ledger.baseline, ledger.end,
                          dict(ledger.end_categories), modules=rows, **{"series": ledger.series, **kw})

    measured = cell("measured", limits=["what torch allocates outside tensors"], notes=["a < b & c"],
                    torch_max_allocated=16 * MiB, torch_allocated_before=4 * MiB, other_devices={"cpu": MiB},
                    seconds=1.5)
    predicted = cell("predicted", reserved_peak=20 * MiB, capacity=14 * MiB, capacity_source="--capacity",
                     allowances=[{"what": "CUDA context", "nbytes": 400 * MiB, "in_allocator": False,
                                  "source": "measured"}])
    searched = [(8, 20 * MiB, True), (16, 70 * MiB, True), (32, 90 * MiB, False)]
    found = FitResult(["x"], "cuda:0", 80 * MiB, "--capacity", 8, 16, searched, predicted, 16, 2.0)
    too_big = [(8, 9 * MiB, False), (1, 2 * MiB, False)]
    none = FitResult(["x", "y"], "cuda:0", MiB, "--capacity", 8, None, too_big, None)
    return [measured, predicted, cell("measured", series=None), StepComparison(measured, predicted), found,
            none]


def _report_classes():
    """Every class of the package that shows itself as HTML, but the model's own and private bases."""
    found = set()
    for info in pkgutil.walk_packages(torchgpu_magic.__path__, "torchgpu_magic."):
        if info.name.endswith(".panel"):  # the widget's module imports ipywidgets
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name != Report.__module__ and hasattr(cls, "_repr_html_") \
                    and not cls.__name__.startswith("_"):
                found.add(cls)
    return found


@pytest.fixture
def reports(fake_nvml, fresh_env, monkeypatch):
    return (_timing_reports() + _gpu_reports(fake_nvml) + _memory_reports() + _placement_reports()
            + _cluster_reports() + _explain_reports() + _holders_reports(monkeypatch) + _cudamem_reports())


def test_every_report_class_renders_through_the_model(reports):
    """Each class is data plus its report(): none writes its own text or HTML, and each has an example
    here (a new report class without one fails)."""
    classes = _report_classes()
    for cls in classes:
        assert issubclass(cls, Reportable), cls
        own = {name for name in ("to_text", "_repr_html_", "_repr_pretty_", "__str__")
               if vars(cls).get(name, getattr(Reportable, name)) is not getattr(Reportable, name)}
        assert not own, (cls, own)
    assert classes <= {type(report) for report in reports}, classes - {type(report) for report in reports}


def _pictures(part):
    """The picture parts of a report model at any depth: the parts that are none of the model's own."""
    if isinstance(part, Report):
        return [found for inner in part.parts if inner is not None for found in _pictures(inner)]
    return [] if isinstance(part, (Lines, Fields, Table)) else [part]


def test_every_report_reads_the_same_as_text_and_as_html(reports):
    """A picture (a chart: SVG in HTML, block characters in text) is not the same lines in both, and need
    not be (tests/test_cudamem_picture.py checks each against the figures): it is taken out of both, and
    the rest must match. A picture is a part only, shown in the report that holds it."""
    drawn = 0
    for report in reports:
        text = PlainTextFormatter()(report)
        assert text == report.to_text() and text, type(report)
        markup, lines = HTMLFormatter()(report), _shown(text.splitlines())
        for picture in _pictures(report.report()):
            assert not hasattr(picture, "_repr_html_") and not hasattr(picture, "_repr_pretty_"), picture
            html = picture.to_html()
            assert html in markup, type(picture)
            markup = markup.replace(html, "", 1)
            own = _shown(picture.to_text().splitlines())
            at = next((i for i in range(len(lines)) if lines[i:i + len(own)] == own), None)
            assert at is not None, type(picture)
            lines[at:at + len(own)] = []
            drawn += 1
        assert _html_lines(markup) == lines, type(report)
    assert drawn == 4  # the measured and predicted steps', the two side by side, the one --fit found
