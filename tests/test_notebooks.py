"""Every notebook in notebooks/ runs in a real Jupyter kernel (nbclient) without unexpected errors."""
from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path):
    nb = runner.execute(path, timeout=300)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if not expected:
            assert not errors, f"cell failed:\n{cell.source}\n{errors[0]['ename']}: {errors[0]['evalue']}"
        text = runner.cell_text(cell)
        assert "Traceback" not in text or expected, f"traceback printed by:\n{cell.source}\n{text}"


def test_tour_loads_the_extension_first():
    import nbformat

    nb = nbformat.read(str(ROOT / "notebooks" / "tour.ipynb"), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert code[0].strip() == "%load_ext torchgpu_magic"
