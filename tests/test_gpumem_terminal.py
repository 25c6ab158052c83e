"""%gpumem in terminal IPython: a real TerminalInteractiveShell in a pseudo-terminal, driven by pexpect.

ipywidgets is installed here, so this checks that the choice is made by the frontend (a terminal cannot
show a widget), not by whether ``import ipywidgets`` works: a snapshot, one line after each cell, and no
sampler thread.
"""
from __future__ import annotations

import os
import re
import sys

import pytest
from conftest import ROOT

pexpect = pytest.importorskip("pexpect")

PROMPT = r"In \[\d+\]: "


@pytest.fixture
def terminal():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p),
               TERM="dumb", PYTHONIOENCODING="utf-8")
    child = pexpect.spawn(sys.executable, ["-m", "IPython", "--simple-prompt", "--no-banner",
                                           "--colors=NoColor", "--HistoryManager.enabled=False"],
                          env=env, encoding="utf-8", timeout=120, dimensions=(50, 200))
    child.expect(PROMPT)
    yield child
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()


def _run(child, line: str) -> str:
    """Send one line as a cell; the text it printed up to the next prompt."""
    child.sendline(line)
    child.expect(PROMPT)
    return child.before


def test_terminal_gets_a_snapshot_a_line_per_cell_and_no_thread(terminal):
    assert "TerminalInteractiveShell" in _run(terminal, "type(get_ipython()).__name__")
    _run(terminal, "%load_ext torchgpu_magic")
    started = _run(terminal, "%gpumem")
    assert "Memory (this process)" in started and "RSS" in started
    assert "one line after each cell" in started
    assert "live panel" not in started
    terminal.sendline("block = bytearray(64 * 2**20); block[::4096] = b'1' * len(block[::4096])")
    terminal.expect(r"In \[(\d+)\]: ")  # the prompt after the cell: the cell's own number is one less
    number = int(terminal.match.group(1)) - 1
    out = terminal.before
    match = re.search(rf"\[gpumem\] In\[{number}\] [\d.]+ \S+ · host \+([\d.]+) MiB \(peak [\d.]+ \S+\)", out)
    assert match, out
    assert 60 <= float(match.group(1)) <= 80
    threads = _run(terminal, "import threading; print(sorted(t.name for t in threading.enumerate()))")
    assert "torchgpu-magic-gpumem" not in threads
    assert "[gpumem]" in threads  # that cell got its line too
    _run(terminal, "records = %gpumem --records")
    records = _run(terminal, "records[0].first_line")
    assert "block = bytearray(64 * 2**20)" in records
    assert "per-cell lines stopped" in _run(terminal, "%gpumem stop")
    assert "[gpumem]" not in _run(terminal, "x = 1")
