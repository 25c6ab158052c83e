"""gpumem/growth.py: a cell whose re-runs grow memory run after run (a list appended to each run) is
named once, with the names that grew and by how much, in %gpumem's per-cell line and in its panel."""
from __future__ import annotations

import re

import torch
from conftest import run
from IPython.utils.capture import capture_output

from torchgpu_magic.gpumem import growth
from torchgpu_magic.gpumem.records import CellGPU, CellRecord

MiB = 1024 * 1024
# 64 MiB a run, touched: RSS grows by as much (above glibc's largest mmap threshold, 32 MiB, so the memory is
# fresh pages each run, never heap that earlier tests freed)
APPEND = "hist.append(torch.ones(2 ** 24))"


def _record(number, rss=8 * MiB, gpus=()):
    return CellRecord(number, APPEND, 0.0, 0.01, rss, None, tuple(gpus))


def test_warns_once_after_three_growing_runs_naming_what_grew():
    watch = growth.GrowthWatch()
    ns = {"hist": []}
    lines = []
    for number in range(1, 6):
        ns["hist"].append(torch.ones(2 ** 21))  # 8 MiB
        lines.append(watch.observe(_record(number), APPEND, ns))
    assert lines[:2] == [None, None] and lines[3:] == [None, None]
    assert lines[2] == ("[gpumem] In[3] memory grew on each of 3 runs in a row of this cell (cpu +24.0 MiB); "
                        "names that grew since the second run: hist +8.00 MiB")


def test_a_gpu_record_counts_its_device():
    watch = growth.GrowthWatch()
    ns = {"hist": []}
    for number in range(1, 4):
        ns["hist"].append(torch.ones(10))
        line = watch.observe(_record(number, rss=0, gpus=[CellGPU(0, 64 * MiB, 64 * MiB)]), APPEND, ns)
    assert "(cuda:0 +192 MiB)" in line and "hist +40 B" in line


def test_no_warning_without_a_streak():
    watch = growth.GrowthWatch()
    ns = {"hist": []}
    assert watch.observe(_record(1), APPEND, ns) is None
    assert watch.observe(_record(2, rss=0), APPEND, ns) is None  # did not grow: the streak ends
    assert watch.observe(_record(3), APPEND, ns) is None
    assert watch.observe(_record(4), "x = 1", ns) is None  # another cell
    assert watch.observe(_record(5), APPEND, ns) is None
    assert watch.observe(_record(6, rss=MiB // 2), APPEND, ns) is None  # below the threshold


def test_growth_that_no_name_explains():
    watch = growth.GrowthWatch()
    for number in range(1, 4):
        line = watch.observe(_record(number), APPEND, {})
    assert line.endswith("no name grew: something else keeps a reference each run (%gpumem holders shows who "
                         "holds the memory)")


def _cell(ip, code):
    with capture_output() as captured:
        ip.run_cell(code, store_history=True)
    return captured.stdout


def test_the_per_cell_line_says_it_once(ip):
    run(ip, "import torch\nhist = []\n")
    ip.run_line_magic("gpumem", "--text")
    try:
        outs = [_cell(ip, APPEND) for _ in range(4)]
    finally:
        ip.run_line_magic("gpumem", "stop")
    warned = [i for i, out in enumerate(outs) if "memory grew" in out]
    assert warned == [2], outs
    line = next(x for x in outs[2].splitlines() if "memory grew" in x)
    assert re.fullmatch(r"\[gpumem\] In\[\d+\] memory grew on each of 3 runs in a row of this cell "
                        r"\(cpu \+[\d.]+ MiB\); names that grew since the second run: hist \+64\.0 MiB",
                        line), line


def test_the_panel_shows_it(ip):
    run(ip, "import torch\nhist = []\n")
    from torchgpu_magic.magics import instance
    from torchgpu_magic.magics.gpumem import GPUMemMagics

    with capture_output():
        ip.run_line_magic("gpumem", "--widget --refresh cell")
    try:
        for _ in range(3):
            _cell(ip, APPEND)
        live = instance(ip).part(GPUMemMagics)._panel
        assert "memory grew on each of 3 runs" in live.static_bundle()["text/plain"]
        assert 'class="tgm-growth"' in live.cells.value
    finally:
        ip.run_line_magic("gpumem", "stop")
