"""What `%whereis` costs next to what it is compared with, measured side by side in one process, the two
arms interleaved (ABAB...) so machine noise hits both alike; each row prints both medians and the median
of the per-pair ratios.

Rows and issue 12's targets:
- the `--watch` post_run_cell hook with 1,000 tensors in the namespace, next to an empty cell through a
  real InteractiveShell (no hooks): ratio ≤ 2;
- `%whereis MODEL` (`module_report`) on 10,000 parameter tensors, next to a bare
  `sum(p.numel() for p in model.parameters())`: ratio ≤ 2;
- `%whereis` (`namespace_report`) on a namespace of 10,000 tensors, next to pytorch_memlab's
  `MemReporter().report()` over the same tensors (printing to a null stream): ratio ≤ 1. The arm is
  skipped with a one-line note when pytorch_memlab is not importable (`pip install pytorch-memlab`).

(`%%ontorch cpu` on the 1,000-op cell is benchmarks/bench_ontorch.py.)
Run: `python benchmarks/bench_placement.py [--pairs N]`.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from typing import Any, Callable


def _pairs(label: str, ours: Callable[[], Any], base: Callable[[], Any], base_label: str, pairs: int,
           target: float, inner: int = 1) -> None:
    """Run the arms alternately ``pairs`` times (each ``inner`` calls) and print one line."""
    ours(), base()  # first runs apart: caches, lazy imports
    mine, theirs, ratios = [], [], []
    for _ in range(pairs):
        t0 = time.perf_counter()
        for _ in range(inner):
            ours()
        t1 = time.perf_counter()
        for _ in range(inner):
            base()
        t2 = time.perf_counter()
        mine.append((t1 - t0) / inner)
        theirs.append((t2 - t1) / inner)
        ratios.append((t1 - t0) / (t2 - t1))
    ratio = statistics.median(ratios)
    verdict = "ok" if ratio <= target else "OVER TARGET"
    print(f"{label:<46} {statistics.median(mine) * 1e3:9.3f} ms;  {base_label} "
          f"{statistics.median(theirs) * 1e3:.3f} ms;  ratio {ratio:.2f} (target ≤ {target:g}: {verdict})")


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15, help="alternating pairs per row (default 15)")
    args = parser.parse_args(argv)

    import torch
    from IPython.core.interactiveshell import InteractiveShell

    import torchgpu_magic
    from torchgpu_magic import placement
    from torchgpu_magic.magics import instance
    from torchgpu_magic.magics.whereis import WhereIsMagics

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; {args.pairs} interleaved pairs per row; medians")

    shell = InteractiveShell.instance()
    torchgpu_magic.load_ipython_extension(shell)
    try:
        shell.user_ns.update({f"t{i}": torch.ones(4) for i in range(1_000)})
        shell.run_line_magic("whereis", "--watch on")  # a silent cell fires no post_run_cell: no hook
        magics = instance(shell).part(WhereIsMagics)
        _pairs("--watch hook per cell, 1,000 tensors", magics._watch_cell,
               lambda: shell.run_cell("pass", silent=True), "an empty cell", args.pairs, 2, inner=50)
    finally:
        torchgpu_magic.unload_ipython_extension(shell)

    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5000)])  # 10,000 parameter tensors
    assert len(list(model.parameters())) == 10_000
    _pairs("%whereis MODEL, 10,000 parameter tensors", lambda: placement.module_report("model", model),
           lambda: sum(p.numel() for p in model.parameters()), "parameters() walk", args.pairs, 2)

    ns = {f"t{i}": torch.ones(4) for i in range(10_000)}
    try:
        from pytorch_memlab import MemReporter
    except ImportError:
        print("%whereis vs pytorch_memlab: skipped (pytorch_memlab is not importable here)")
        return 0

    def memlab() -> None:
        # MemReporter walks gc.get_objects() for tensors; the namespace's tensors are what it finds.
        with contextlib.redirect_stdout(io.StringIO()):
            MemReporter().report()

    _pairs("%whereis table, 10,000 tensors", lambda: placement.namespace_report(ns).to_text(), memlab,
           "MemReporter().report()", args.pairs, 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
