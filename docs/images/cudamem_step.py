"""Draw the README's picture of `%%cudamem`: a real training step's memory over its events.

The step is the 6-layer encoder of docs/benchmarks.md's `%%cudamem` rows (``nn.TransformerEncoder``,
d_model 512, 8 heads, feed-forward 2048, batch 8 x 256 tokens, AdamW), run for real on this machine's
cpu through a real InteractiveShell: one step first, so that AdamW's state exists as in any step after
the first, then ``%%cudamem cpu --svg docs/images/cudamem-step.svg`` on the next. The picture is the
magic's own SVG, unchanged; the report's text form is printed.

Run from the repository's root: `python docs/images/cudamem_step.py` (about a minute on 2 cores).
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "cudamem-step.svg"
SETUP = """
import torch
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(8, 256, 512)
"""
STEP = "loss = model(x).square().mean()\nloss.backward()\nopt.step()\nopt.zero_grad()\n"


def main() -> int:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "torchgpu_magic")
    for code in (SETUP, STEP):
        shell.run_cell(code).raise_error()
    report = shell.run_cell_magic("cudamem", f"cpu --svg {OUT} -o -q", STEP)
    print(report.picture().to_text())
    print(f"saved {OUT} ({OUT.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
