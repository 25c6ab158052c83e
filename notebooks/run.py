"""Execute a notebook for real in a Jupyter kernel and print what each cell showed.

`make demo` runs the tour with it; the tests use :func:`execute`. The kernel is always this Python
(the one running this script, with torchgpu_magic installed), whatever kernelspecs the machine has:
a temporary ``python3`` kernelspec pointing at ``sys.executable`` goes first on ``JUPYTER_PATH``.
Cells tagged ``raises-exception`` may fail (they show an error on purpose); any other error fails the run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import nbformat
from nbclient import NotebookClient
from traitlets.config import Config


@contextmanager
def this_python_kernel() -> Iterator[str]:
    """Make the ``python3`` kernel name mean this interpreter for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="torchgpu-magic-kernel-") as tmp:
        spec_dir = Path(tmp, "kernels", "python3")
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (torchgpu_magic)",
            "language": "python",
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (tmp, old) if p)
        try:
            yield "python3"
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


def kernel_config(folder: str) -> Config:
    """How a kernel started here talks to this process: over IPC sockets in ``folder`` (files only this
    user can reach; an absolute path, since the kernel runs in another directory) where the platform has
    them, not TCP on loopback, which ipykernel warns is unencrypted."""
    if os.name != "posix":
        return Config()
    return Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "kernel")}})


def execute(path: Path, timeout: int = 600, cwd: Optional[Path] = None) -> Any:
    """Run every cell of the notebook at ``path`` in a fresh kernel; return the executed notebook.

    Raises nbclient's ``CellExecutionError`` on an error in a cell not tagged ``raises-exception``.
    """
    nb = nbformat.read(str(path), as_version=4)
    with this_python_kernel() as kernel, tempfile.TemporaryDirectory(prefix="torchgpu-magic-ipc-") as ipc:
        client = NotebookClient(
            nb,
            kernel_name=kernel,
            timeout=timeout,
            resources={"metadata": {"path": str(cwd or path.parent)}},
            config=kernel_config(ipc),
        )
        client.execute()
    return nb


def cell_text(cell: Any) -> str:
    """The text a person would read under a code cell: streams, plain-text results, errors."""
    parts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data:
                parts.append(data["text/plain"] + "\n")
            elif "application/vnd.jupyter.widget-view+json" in data:
                parts.append("[live widget]\n")
        elif kind == "error":  # the traceback as a person reads it, colours taken out
            frames = [re.sub(r"\x1b\[[0-9;]*m", "", part) for part in out.get("traceback", [])]
            parts.append("\n".join(frames) + "\n" if frames else f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts)


def main(argv: Optional[list] = None) -> int:
    """Command line: run a notebook, print each cell's text output, optionally save HTML / notebook."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--html", type=Path, help="also write the executed notebook as HTML here")
    parser.add_argument("--output", type=Path, help="also write the executed notebook (outputs kept) here")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = parser.parse_args(argv)

    nb = execute(args.notebook, timeout=args.timeout)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        print(f"In [{cell.get('execution_count')}]: " + cell.source.replace("\n", "\n" + " " * 8))
        text = cell_text(cell)
        if text:
            print(text.rstrip("\n"))
        print()
    if args.output:
        nbformat.write(nb, str(args.output))
        print(f"executed notebook written to {args.output}")
    if args.html:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_notebook_node(nb)
        args.html.write_text(body, encoding="utf-8")
        print(f"HTML written to {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
