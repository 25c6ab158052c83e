"""%%cudamem's picture in real Chromium: a notebook executed in a real kernel (nbclient), exported to static
HTML by nbconvert (its default "lab" template, as `jupyter nbconvert --to html` writes it), and opened in
Debian's headless Chromium by Playwright with every network request refused, so the picture must show
from what the output itself holds.

Checked on the page: each picture's bands, peak mark and phase names are visible, the bands are what
Chromium paints where they are drawn (``elementFromPoint``) in their colours (pixels of a screenshot of the
picture, read back through a canvas), the peak label names the peak, and nothing the output holds asks for
a network resource. Screenshots go to ``test-artifacts/`` (``cudamem-picture*.png``).

Needs ``/usr/bin/chromium`` and Playwright for Python, as tests/test_browser.py: missing either skips,
unless TORCHGPU_MAGIC_REQUIRE_BROWSER=1, which fails instead.
"""
from __future__ import annotations

import base64
import importlib.util
import re

import pytest
from conftest import ROOT
from test_browser import ARTIFACTS, CHROMIUM_ARGS, _chromium, _missing

pytestmark = pytest.mark.browser

SETUP = ("%load_ext torchgpu_magic\nimport torch\ntorch.manual_seed(0)\n"
         "model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), "
         "torch.nn.Linear(1024, 512))\n"
         "opt = torch.optim.AdamW(model.parameters())\nx = torch.randn(256, 512)")
STEP = "loss = model(x).square().mean()\nloss.backward()\nopt.step()\nopt.zero_grad()"
CELLS = [SETUP, f"%%cudamem\n{STEP}", f"%%cudamem --compare\n{STEP}"]


def _exported_page(tmp_path) -> tuple:
    """Execute the cells in a real kernel, export the notebook to HTML; (path, executed notebook)."""
    pytest.importorskip("nbclient", reason="needs nbclient, nbformat and nbconvert")
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    with runner.this_python_kernel() as kernel:
        NotebookClient(nb, kernel_name=kernel, timeout=600,
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    body, _ = HTMLExporter().from_notebook_node(nb)
    path = tmp_path / "cudamem.html"
    path.write_text(body, encoding="utf-8")
    return path, nb


_PIXELS = """async ([png, points]) => {
    const image = new Image();
    image.src = 'data:image/png;base64,' + png;
    await image.decode();
    const canvas = document.createElement('canvas');
    canvas.width = image.width; canvas.height = image.height;
    const context = canvas.getContext('2d');
    context.drawImage(image, 0, 0);
    return points.map(([x, y]) => Array.from(context.getImageData(Math.round(x), Math.round(y), 1, 1).data));
}"""


def _hex(color: str) -> tuple:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


def _near(rgba: list, rgb: tuple, tolerance: int = 40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(rgba, rgb))


def test_the_picture_shows_in_the_exported_html_in_chromium(tmp_path):
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright for Python is not installed (pip install -e '.[test]')")
    from torchgpu_magic.cudamem.picture import COLORS

    path, nb = _exported_page(tmp_path)
    for cell in nb.cells[1:]:
        [html] = [o.data["text/html"] for o in cell.outputs if o.output_type == "display_data"]
        assert "<svg" in html and "<script" not in html and not re.search(r"(?:src|href)=", html)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            asked: list = []

            def refuse(route) -> None:  # the template's own scripts (MathJax, require.js) included
                asked.append(route.request.url)
                route.abort()

            page.route(re.compile(r"^(?!file:|data:|about:).*"), refuse)
            page.goto(path.as_uri())
            pictures = page.locator("svg.tgm-memory-picture")
            pictures.first.wait_for(state="visible", timeout=30_000)
            assert pictures.count() == 3  # one picture, then measured and predicted side by side
            page.screenshot(path=str(ARTIFACTS / "cudamem-picture-page.png"), full_page=True)
            for index in range(3):
                _check_picture(page, pictures.nth(index), COLORS, index)
            side = page.locator(".torchgpu-magic-picture").nth(1).bounding_box()
            boxes = [pictures.nth(i).bounding_box() for i in (1, 2)]
            assert boxes[0]["y"] == boxes[1]["y"] and boxes[1]["x"] > boxes[0]["x"]  # side by side
            assert side["width"] >= boxes[1]["x"] + boxes[1]["width"] - boxes[0]["x"] - 1
            # what was asked for is the template's own (MathJax, require.js from CDNs), never the output's
            assert all(url.startswith(("https://cdn", "https://unpkg")) for url in asked), asked
        finally:
            browser.close()


def _check_picture(page, svg, colors: dict, index: int) -> None:
    """Bands, peak mark and phase names visible and painted where and how they are drawn."""
    svg.scroll_into_view_if_needed()
    box = svg.bounding_box()
    width = float(svg.get_attribute("width"))
    scale = box["width"] / width
    bands = svg.locator("polygon.tgm-band")
    assert bands.count() >= 4
    names = {bands.nth(i).get_attribute("data-category") for i in range(bands.count())}
    assert {"parameters", "optimizer state", "activations"} <= names
    peak_text = svg.locator(".tgm-peak text")
    assert peak_text.is_visible() and peak_text.text_content().startswith("peak ")
    phase_names = [t.text_content() for t in svg.locator(".tgm-phase-name").all() if t.is_visible()]
    assert "backward" in phase_names and any(n in phase_names for n in ("forward", "fwd"))
    # where the parameters' band starts (its first point, half way down to the axis) and the peak's dot
    first = svg.locator('polygon[data-category="parameters"]').get_attribute("points").split()
    x0, y0 = map(float, first[0].split(","))
    bottom = float(first[-1].split(",")[1])
    circle = svg.locator(".tgm-peak circle")
    cx, cy = float(circle.get_attribute("cx")), float(circle.get_attribute("cy"))
    points = [(x0 + 4, (y0 + bottom) / 2), (cx, cy)]
    on_page = [(box["x"] + x * scale, box["y"] + y * scale) for x, y in points]
    hit = page.evaluate("(ps) => ps.map(([x, y]) => { const e = document.elementFromPoint(x, y);"
                        " return e && (e.getAttribute('data-category') || e.tagName); })", on_page)
    assert hit == ["parameters", "circle"], hit
    png = svg.screenshot(path=str(ARTIFACTS / f"cudamem-picture-{index}.png"))
    inside = [(x * scale, y * scale) for x, y in points]
    pixels = page.evaluate(_PIXELS, [base64.b64encode(png).decode(), inside])
    assert _near(pixels[0], _hex(colors["parameters"])), pixels[0]
    assert _near(pixels[1], (0x22, 0x22, 0x22)), pixels[1]
