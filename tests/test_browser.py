"""%gpumem in a real JupyterLab, driven in Debian's headless Chromium by Playwright.

Starts JupyterLab on 127.0.0.1 (free port, a token, a temporary root, no browser of its own, no news or
update checks) with a ``python3`` kernelspec that is this Python, opens a notebook, runs
``%load_ext torchgpu_magic`` and ``%gpumem --interval 0.2``, checks the panel renders, that the RSS
figure grows while a cell holds a big allocation, and that ``%gpumem stop`` stops it and leaves the
panel's last state in its output as a static snapshot. Screenshots go to
``test-artifacts/``; with TORCHGPU_MAGIC_UPDATE_PICTURE=1 the panel's picture also replaces
``docs/images/gpumem-panel.png`` (the README's), so a normal run never dirties the tree.

Needs ``/usr/bin/chromium`` (``make browser-deps``) and Playwright for Python (never its own browser
download). Missing either skips, unless TORCHGPU_MAGIC_REQUIRE_BROWSER=1 (CI), which fails instead.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "test-artifacts"
README_IMAGE = ROOT / "docs" / "images" / "gpumem-panel.png"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ALLOC_MIB = 512
CELLS = [
    "%load_ext torchgpu_magic\nimport time",
    "%gpumem --interval 0.2",
    f"block = bytearray({ALLOC_MIB} * 2**20)  # a big host allocation ...\n"
    "block[::4096] = b'1' * len(block[::4096])  # ... made resident page by page\n"
    "time.sleep(4)",
    "del block",
    "%gpumem stop",
]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _missing(reason: str) -> None:
    if os.environ.get("TORCHGPU_MAGIC_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser test required (TORCHGPU_MAGIC_REQUIRE_BROWSER=1) but {reason}")
    pytest.skip(reason)


def _chromium() -> str:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.path.exists(candidate):
            return candidate
    _missing("Debian's chromium is not installed (make browser-deps)")
    raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bytes(text: str) -> float:
    """'1.23 GiB' -> bytes."""
    match = re.fullmatch(r"\s*([-+]?[\d.]+)\s*([KMGT]?i?B)\s*", text)
    assert match, f"not a byte figure: {text!r}"
    return float(match.group(1)) * UNITS[match.group(2)]


def _setup(tmp: Path) -> tuple:
    """Root dir with the notebook, a kernelspec for this Python, quiet lab settings; the environment."""
    import nbformat

    root = tmp / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (torchgpu_magic)",
                                 "language": "python"}
    nbformat.write(nb, str(root / "gpumem.ipynb"))
    spec = tmp / "data" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (torchgpu_magic)", "language": "python"}))
    settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ)
    env.update({
        "JUPYTER_PATH": os.pathsep.join(p for p in (str(tmp / "data"), env.get("JUPYTER_PATH")) if p),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
    })
    return root, env


def _wait_server(url: str, server: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"JupyterLab exited ({server.returncode}): see"
                                 " test-artifacts/jupyterlab.log")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"JupyterLab did not answer within {timeout:.0f} s")


def test_gpumem_panel_in_jupyterlab():
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright for Python is not installed (pip install -e '.[test]')")
    ARTIFACTS.mkdir(exist_ok=True)
    port, token = _free_port(), secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="torchgpu-magic-lab-") as tmp_name:
        root, env = _setup(Path(tmp_name))
        log = open(ARTIFACTS / "jupyterlab.log", "wb")  # noqa: SIM115 - closed in finally
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
             "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly"]
            + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_server(f"{base}/api/status?token={token}", server)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    page.set_default_timeout(60_000)
                    try:
                        _drive(page, f"{base}/lab/tree/gpumem.ipynb?token={token}")
                    except Exception:
                        page.screenshot(path=str(ARTIFACTS / "gpumem-failure.png"), full_page=True)
                        raise
                finally:
                    browser.close()
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=15)
            log.close()


_KERNEL_STATUS = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return kernel && kernel.connectionStatus === 'connected' ? kernel.status : null;
}"""


def _kernel_status(page) -> str:
    return page.evaluate(_KERNEL_STATUS)


def _wait_idle(page, timeout_ms: int = 60_000) -> None:
    page.wait_for_function(f"() => ({_KERNEL_STATUS})() === 'idle'", timeout=timeout_ms)


def _run_cell(page, index: int, wait: bool = True) -> None:
    """Select cell ``index`` and run it; with ``wait``, until its prompt shows an execution count."""
    page.evaluate(f"""() => {{
        const nb = window.jupyterapp.shell.currentWidget.content;
        nb.activeCellIndex = {index};
        window.jupyterapp.commands.execute('notebook:run-cell');  // not awaited: the cell may run on
    }}""")
    if wait:
        page.wait_for_function(f"""() => {{
            const cell = window.jupyterapp.shell.currentWidget.content.widgets[{index}];
            return cell.model.executionCount !== null && cell.promptNode.textContent.indexOf('*') < 0;
        }}""", timeout=60_000)


def _rss(page) -> float:
    return _bytes(page.inner_text(".torchgpu-magic-gpumem .tgm-host-rss"))


def _drive(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    _wait_idle(page, 90_000)  # the kernel (this Python) has started and is connected
    _run_cell(page, 0)  # %load_ext
    _run_cell(page, 1)  # %gpumem --interval 0.2
    panel = page.wait_for_selector(".torchgpu-magic-gpumem .tgm-host-rss", timeout=60_000)
    assert panel is not None
    assert "no GPU: host memory only" in page.inner_text(".torchgpu-magic-gpumem") or \
        page.locator(".torchgpu-magic-gpumem .tgm-gpu").count() > 0
    stamp = page.inner_text(".torchgpu-magic-gpumem .tgm-time")
    page.wait_for_function(
        "s => document.querySelector('.torchgpu-magic-gpumem .tgm-time').textContent !== s",
        arg=stamp, timeout=10_000)  # live: the sampler keeps updating the view
    before = _rss(page)

    _run_cell(page, 2, wait=False)  # allocates ALLOC_MIB and sleeps: the panel must show it meanwhile
    deadline = time.monotonic() + 20
    grown = before
    while time.monotonic() < deadline and grown - before < 0.8 * ALLOC_MIB * 2**20:
        time.sleep(0.2)
        grown = _rss(page)
    status = _kernel_status(page)
    assert grown - before >= 0.8 * ALLOC_MIB * 2**20, f"RSS {before:.0f} -> {grown:.0f} B"
    assert status == "busy", "the figure must change while the cell still runs"
    _wait_idle(page)
    page.wait_for_selector(".torchgpu-magic-gpumem .tgm-cell", timeout=10_000)
    cells = page.inner_text(".torchgpu-magic-gpumem table")
    assert "block = bytearray" in cells
    time.sleep(0.5)
    page.screenshot(path=str(ARTIFACTS / "gpumem-notebook.png"), full_page=True)
    page.locator(".torchgpu-magic-gpumem").screenshot(path=str(ARTIFACTS / "gpumem-panel.png"))
    if os.environ.get("TORCHGPU_MAGIC_UPDATE_PICTURE") == "1":
        shutil.copyfile(ARTIFACTS / "gpumem-panel.png", README_IMAGE)

    _run_cell(page, 3)  # del block
    _run_cell(page, 4)  # %gpumem stop
    page.wait_for_selector("text=sampler stopped, panel closed", timeout=30_000)
    # the widget's model is closed, so JupyterLab removes its view from the page
    page.wait_for_function("() => !document.querySelector('.torchgpu-magic-gpumem')", timeout=10_000)
    # ... and the output keeps the panel's last state as a static snapshot (what a saved notebook shows)
    snapshot = page.wait_for_selector(".tgm-snapshot", timeout=10_000)
    assert "panel closed" in snapshot.inner_text() and "block = bytearray" in snapshot.inner_text()
    page.screenshot(path=str(ARTIFACTS / "gpumem-stopped.png"), full_page=True)
