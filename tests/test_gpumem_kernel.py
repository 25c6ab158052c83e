"""%gpumem in a real Jupyter kernel (nbclient): the panel's static snapshot in the saved notebook and in
its nbconvert HTML export (rendered in headless Chromium with the network cut off), and its per-cell
figures beside ipyexperiments' on the same allocations."""
from __future__ import annotations

import copy
import importlib.util
import re

import pytest
from conftest import ROOT

pytestmark = pytest.mark.notebook
pytest.importorskip("nbclient", reason="needs nbclient and nbformat (the IPython 7 leg has neither)")

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ALLOC_CELL = ("block = bytearray(256 * 2**20)  # kept: the snapshot must show this cell\n"
              "block[::4096] = b'1' * len(block[::4096])\n"
              "import time; time.sleep(2.5)  # past SNAPSHOT_EVERY, so the snapshot is rewritten after it")
_spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


def _execute(sources: list, keep_after: int = -1) -> tuple:
    """Run the cells one by one in a fresh kernel (this Python); the executed notebook, and a copy as it
    was after cell ``keep_after`` (as JupyterLab saves it by default: outputs, no widget state)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    saved = None
    with runner.this_python_kernel() as kernel:
        client = NotebookClient(nb, kernel_name=kernel, timeout=180, resources={"metadata": {"path": "."}})
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
                errors = [o for o in cell.outputs if o.output_type == "error"]
                assert not errors, f"{cell.source}\n{errors[0]['ename']}: {errors[0]['evalue']}"
                if index == keep_after:
                    saved = copy.deepcopy(nb)
    return nb, saved


def _panel_output(nb) -> dict:
    (output,) = [o for o in nb.cells[1].outputs if o.output_type == "display_data"]
    return output["data"]


def _render(html_text: str, tmp_path, name: str):
    """Open an nbconvert HTML export in headless Chromium with every non-file request refused; return
    the visible text of the panel snapshot, its RSS figure and its cell rows."""
    from test_browser import CHROMIUM_ARGS, _chromium

    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed")
    path = tmp_path / f"{name}.html"
    path.write_text(html_text, encoding="utf-8")
    refused = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()

            def route(r):
                if r.request.url.startswith("file://"):
                    r.continue_()
                else:
                    refused.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.goto(path.as_uri())
            snapshot = page.locator(".tgm-snapshot")
            snapshot.wait_for(state="visible", timeout=30_000)
            box = snapshot.bounding_box()
            assert box and box["height"] > 40 and box["width"] > 100, box
            shown = snapshot.inner_text()
            rss = page.locator(".tgm-snapshot .tgm-host-rss").inner_text()
            rows = page.locator(".tgm-snapshot .tgm-cell").all_inner_texts()
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
        finally:
            browser.close()
    return shown, rss, rows


def test_static_snapshot_is_saved_and_renders_in_the_html_export(tmp_path):
    from nbconvert import HTMLExporter
    from test_browser import _bytes

    nb, saved_open = _execute(["%load_ext torchgpu_magic", "%gpumem --interval 0.5", ALLOC_CELL,
                               "%gpumem stop"], keep_after=2)
    # while the panel ran: the saved output keeps the widget's view and a current text/html snapshot
    live = _panel_output(saved_open)
    assert WIDGET_MIME in live and "block = bytearray(256 * 2**20)" in live["text/html"]
    assert "%gpumem a snapshot" in live["text/plain"] and "[gpumem]" in live["text/plain"]
    # after %gpumem stop: the snapshot alone, with its last state
    final = _panel_output(nb)
    assert WIDGET_MIME not in final and "panel closed" in final["text/html"]
    for name, notebook in (("open", saved_open), ("stopped", nb)):
        body, _ = HTMLExporter().from_notebook_node(notebook)
        shown, rss, rows = _render(body, tmp_path, name)
        assert "Host" in shown and "RSS" in shown
        assert _bytes(rss) > 200 * 2**20  # the kernel held the 256 MiB block when the snapshot was taken
        assert any("block = bytearray(256 * 2**20)" in row for row in rows), rows


def test_per_cell_figures_agree_with_ipyexperiments():
    """ipyexperiments needs a Jupyter kernel (it reads ``get_ipython().kernel``), so both run in one."""
    pytest.importorskip("ipyexperiments", reason="ipyexperiments is not installed")
    nb, _ = _execute([
        "from ipyexperiments import IPyExperimentsCPU\nexp = IPyExperimentsCPU(exp_enable=False)\n"
        "%load_ext torchgpu_magic\n%gpumem --text",
        "kept = bytearray(256 * 2**20); kept[::4096] = b'1' * len(kept[::4096])",
        "theirs_kept = exp.cl.data.cpu.used_delta",
        "import time\ntmp = bytearray(256 * 2**20); tmp[::4096] = b'1' * len(tmp[::4096])\n"
        "time.sleep(0.5); del tmp",
        "import psutil\ntheirs_peak = exp.cl.data.cpu.peaked_delta\n"
        "rss_now = psutil.Process().memory_info().rss",
        "records = %gpumem --records\n"
        "print('RESULT', records[0].rss_delta, theirs_kept, records[2].rss_peak - rss_now, theirs_peak)",
    ])
    text = runner.cell_text(nb.cells[-1])
    ours_kept, theirs_kept, ours_peak, theirs_peak = map(
        int, re.search(r"RESULT (-?\d+) (-?\d+) (-?\d+) (-?\d+)", text).groups())
    mib = 2**20
    # the kept 256 MiB: RSS after minus before, both ways
    assert 240 * mib < ours_kept < 280 * mib and abs(ours_kept - theirs_kept) < 8 * mib
    # the freed 256 MiB: their polling thread's peak above the cell's start, our kernel high-water mark
    # above the RSS it returned to
    assert 240 * mib < ours_peak < 280 * mib and abs(ours_peak - theirs_peak) < 16 * mib
