"""Take the pictures of the docs again, each from a real run: ``make pictures``, or
``python docs/images/pictures.py [NAME ...]`` from the repository's root for some of them.

- ``panel``: ``gpumem-panel.png``, the ``%gpumem`` panel in JupyterLab in headless Chromium, taken by the
  browser test itself (``tests/test_browser.py`` with ``TORCHGPU_MAGIC_UPDATE_PICTURE=1``);
- ``oom``: ``oom-explanation.png``, the out-of-memory explanation as a notebook shows it: the cells of
  docs/examples.py's ``oom`` session run in a real kernel, the notebook exported to HTML by nbconvert,
  and the failing cell's output photographed in Chromium;
- ``cudamem``: ``cudamem-step.svg``, ``%%cudamem``'s chart of a training step's memory, drawn by
  ``docs/images/cudamem_step.py`` from a real step on this machine's cpu.

Chromium is Debian's (``/usr/bin/chromium``, ``make browser-deps``), driven by Playwright for Python; a
picture whose tools are missing is skipped with one line saying why, and the run fails at the end.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

IMAGES = Path(__file__).resolve().parent
ROOT = IMAGES.parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


class Missing(Exception):
    """A tool a picture needs is not here."""


def _env() -> dict:
    """This tree's package first, for every process a picture starts (kernels, JupyterLab, scripts)."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), path) if p))


def _chromium() -> str:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise Missing("no Chromium (make browser-deps installs Debian's)")


def panel() -> Path:
    """The browser test, which writes the panel's picture over the docs' when told to."""
    _chromium()
    env = dict(_env(), TORCHGPU_MAGIC_UPDATE_PICTURE="1", TORCHGPU_MAGIC_REQUIRE_BROWSER="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_browser.py"], cwd=ROOT, env=env)
    if proc.returncode:
        raise RuntimeError("the browser test failed; the panel's picture was not taken")
    return IMAGES / "gpumem-panel.png"


def _examples():
    spec = importlib.util.spec_from_file_location("docs_examples", ROOT / "docs" / "examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def oom() -> Path:
    """The oom session's cells in a notebook, run in a real kernel, exported to HTML, the failing cell's
    output photographed."""
    import nbformat
    from nbconvert import HTMLExporter

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise Missing("no Playwright for Python (the test extra installs it)") from None
    chromium = _chromium()
    sys.path.insert(0, str(ROOT / "notebooks"))
    import run as notebooks  # notebooks/run.py: a kernel that is this Python

    found = _examples().examples()  # the loop and a result shown, then the step that fails
    cells = [str(cell) for name in ("oom-setup", "oom-cpu") for cell in found[name][1].cells]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext torchgpu_magic")]
    nb.cells += [nbformat.v4.new_code_cell(cell) for cell in cells]
    nb.cells[-1].metadata["tags"] = ["raises-exception"]
    out = IMAGES / "oom-explanation.png"
    with tempfile.TemporaryDirectory(prefix="torchgpu-magic-pictures-") as tmp:
        path = Path(tmp) / "oom.ipynb"
        nbformat.write(nb, str(path))
        os.environ["PYTHONPATH"] = _env()["PYTHONPATH"]
        executed = notebooks.execute(path, timeout=300)
        body, _ = HTMLExporter().from_notebook_node(executed)
        page_path = Path(tmp) / "oom.html"
        page_path.write_text(body, encoding="utf-8")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 900})
                page.goto(page_path.as_uri())
                page.locator(".jp-Cell").last.locator(".jp-OutputArea").screenshot(path=str(out))
            finally:
                browser.close()
    return out


def cudamem() -> Path:
    """``%%cudamem``'s chart, by the script that draws it."""
    script = IMAGES / "cudamem_step.py"
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env())
    if proc.returncode:
        raise RuntimeError("docs/images/cudamem_step.py failed")
    return IMAGES / "cudamem-step.svg"


PICTURES: dict = {"panel": panel, "oom": oom, "cudamem": cudamem}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"the pictures to take: {', '.join(PICTURES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(PICTURES))
    if unknown:
        parser.error(f"no picture named {', '.join(unknown)}: use {', '.join(PICTURES)}")
    failed = []
    for name in args.names or list(PICTURES):
        take: Callable[[], Path] = PICTURES[name]
        try:
            print(f"pictures: {name}: wrote {take().relative_to(ROOT)}", flush=True)
        except (Missing, RuntimeError) as exc:
            print(f"pictures: {name}: not taken: {exc}", flush=True)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
