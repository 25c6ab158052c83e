"""What `%whereis` costs next to what it is compared with, measured side by side in one process, the two
arms interleaved (ABAB...) so machine noise hits both alike; each row prints both medians and the median
of the per-pair ratios.

**Equal terms.** Both arms of a row work on the same live objects, and nothing else of the benchmark is
alive while a row runs: pytorch_memlab's `MemReporter` walks every tensor the garbage collector tracks
(`gc.get_objects()`), so an earlier row's model or namespace left alive would give it more to walk than
`%whereis` has (an earlier version of this script compared memlab's 21,000 tensors with our 10,000 and
reported a win that was not one). Each row builds its objects, runs, and drops them before the next;
the memlab row checks and prints how many tensors each arm sees. The garbage collector is on in both
arms, as in a notebook; `%whereis` pauses it during its own walk (as `%%cudatime` does while sampling).

Rows and issue 20's targets:
- the `--watch` post_run_cell hook with 1,000 tensors in the namespace, next to an empty cell through a
  real InteractiveShell (no hooks): ratio ≤ 2;
- `%whereis MODEL` (`module_report`) on an `nn.Sequential` of 5,000 `nn.Linear(8, 8)` (10,000 parameter
  tensors), next to a bare `parameters()` walk over the same model that sums the bytes and collects the
  devices (what the report's header says of it): ratio ≤ 2 reliably, 1.5 in reach (issue 30);
- `%whereis` (`namespace_report`, its text) on a namespace of 10,000 tensors, next to pytorch_memlab's
  `MemReporter().report()` over the same 10,000 tensors, the only ones alive (printing to a null
  stream): ratio ≤ 1. Skipped with a one-line note when pytorch_memlab is not importable
  (`pip install pytorch-memlab`).

(`%%ontorch cpu` on the 1,000-op cell is benchmarks/bench_ontorch.py.)
Clock: this thread's CPU time by default (`time.thread_time`): on a shared machine the wall clock of a
30 ms walk swings with the neighbours' load, the CPU time it costs does not wait on them; `--clock wall`
takes `perf_counter` instead.
Run: `python benchmarks/bench_placement.py [--pairs N] [--rows watch,model,memlab] [--clock cpu|wall]`.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import time
from typing import Any, Callable

CLOCK = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCK["cpu"]


def _pairs(label: str, ours: Callable[[], Any], base: Callable[[], Any], base_label: str, pairs: int,
           target: float, inner: int = 1) -> float:
    """Run the arms alternately ``pairs`` times (each ``inner`` calls), print one line, return the ratio."""
    ours(), base()  # first runs apart: caches, lazy imports
    mine, theirs, ratios = [], [], []
    for _ in range(pairs):
        t0 = clock()
        for _ in range(inner):
            ours()
        t1 = clock()
        for _ in range(inner):
            base()
        t2 = clock()
        mine.append((t1 - t0) / inner)
        theirs.append((t2 - t1) / inner)
        ratios.append((t1 - t0) / (t2 - t1))
    ratio = statistics.median(ratios)
    verdict = "ok" if ratio <= target else "OVER TARGET"
    print(f"{label:<46} {statistics.median(mine) * 1e3:9.3f} ms;  {base_label} "
          f"{statistics.median(theirs) * 1e3:.3f} ms;  ratio {ratio:.2f} (target ≤ {target:g}: {verdict})")
    return ratio


def _live_tensors() -> int:
    import warnings

    import torch

    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated aliases warns
        warnings.simplefilter("ignore")
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


def watch_row(pairs: int) -> None:
    """The --watch hook against an empty cell, 1,000 tensors in a real shell's namespace."""
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    import torchgpu_magic
    from torchgpu_magic.magics import instance
    from torchgpu_magic.magics.whereis import WhereIsMagics

    shell = InteractiveShell.instance()
    torchgpu_magic.load_ipython_extension(shell)
    try:
        shell.user_ns.update({f"t{i}": torch.ones(4) for i in range(1_000)})
        shell.run_line_magic("whereis", "--watch on")  # a silent cell fires no post_run_cell: no hook
        magics = instance(shell).part(WhereIsMagics)
        _pairs("--watch hook per cell, 1,000 tensors", magics._watch_cell,
               lambda: shell.run_cell("pass", silent=True), "an empty cell", pairs, 2, inner=50)
    finally:
        torchgpu_magic.unload_ipython_extension(shell)
        for name in [n for n in shell.user_ns if n.startswith("t") and n[1:].isdigit()]:
            del shell.user_ns[name]


def model_row(pairs: int) -> None:
    """%whereis MODEL against a bare parameters() walk of the same model summing bytes and devices."""
    import torch

    from torchgpu_magic import placement

    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(5000)])  # 10,000 parameter tensors
    assert len(list(model.parameters())) == 10_000

    def walk() -> tuple:
        nbytes, devices = 0, set()
        for p in model.parameters():
            nbytes += p.numel() * p.element_size()
            devices.add(p.device)
        return nbytes, devices

    _pairs("%whereis MODEL, 5,000 Linear(8, 8)", lambda: placement.module_report("model", model),
           walk, "parameters() walk, bytes and devices", pairs, 2)


def memlab_row(pairs: int) -> None:
    """The %whereis table against memlab's report, over the same 10,000 tensors, the only ones alive."""
    import torch

    from torchgpu_magic import placement

    try:
        from pytorch_memlab import MemReporter
    except ImportError:
        print("%whereis vs pytorch_memlab: skipped (pytorch_memlab is not importable here)")
        return
    gc.collect()
    before = _live_tensors()
    ns = {f"t{i}": torch.ones(4) for i in range(10_000)}
    seen_by_memlab = _live_tensors()
    seen_by_us = sum(1 for _, _, kind in placement.walk.Walk(ns) if kind == "tensor")
    print(f"  same live objects: memlab's gc walk finds {seen_by_memlab:,} tensors ({before} besides the "
          f"namespace's), %whereis walks {seen_by_us:,}")

    def memlab() -> None:
        import warnings

        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its isinstance over gc.get_objects() warns as above
            MemReporter().report()

    _pairs("%whereis table, 10,000 tensors", lambda: placement.namespace_report(ns).to_text(), memlab,
           "MemReporter().report()", pairs, 1)


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15, help="alternating pairs per row (default 15)")
    parser.add_argument("--rows", default="watch,model,memlab", help="rows to run (default: all)")
    parser.add_argument("--clock", choices=tuple(CLOCK), default="cpu",
                        help="this thread's CPU time (default) or the wall clock")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCK[args.clock]

    import os

    import torch

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; {args.pairs} interleaved pairs per row; medians; each row alone "
          f"with its own objects; {'CPU time' if args.clock == 'cpu' else 'wall clock'}; load average "
          f"{os.getloadavg()[0]:.1f}")
    rows = {"watch": watch_row, "model": model_row, "memlab": memlab_row}
    for name in args.rows.split(","):
        rows[name](args.pairs)
        gc.collect()  # the row's objects are gone before the next row starts
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
