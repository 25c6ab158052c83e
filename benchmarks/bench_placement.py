"""What `%whereis` costs, measured side by side in one process (medians of repeated runs).

Rows (each next to the cheapest loop that touches the same objects, so the ratio says what the report
adds on top of merely visiting them):
- `module_report` of a model with 10,000 parameter tensors (target ≤ 50 ms), next to
  `sum(p.numel() for p in model.parameters())`;
- a namespace of 100,000 objects (1,000 of them tensors) scanned by `namespace_snapshot` (what
  `--watch` and `%%ontorch`'s footer do) and by `namespace_report` (the `%whereis` table), target
  ≤ 100 ms, next to a bare `isinstance` loop over the namespace;
- the `--watch` post_run_cell hook through a real InteractiveShell with 1,000 tensors in the
  namespace (target ≤ 1 ms median per cell), next to what IPython spends on an empty cell.

Run: `python benchmarks/bench_placement.py`.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # first run apart: caches, lazy imports
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def _pair(label: str, ours: Callable[[], Any], base: Callable[[], Any], base_label: str, repeat: int,
          target_ms: float) -> None:
    ours_ms = []
    base_ms = []
    for _ in range(3):  # alternate the arms so machine noise hits both alike
        ours_ms.append(_median_ms(ours, repeat))
        base_ms.append(_median_ms(base, repeat))
    o, b = statistics.median(ours_ms), statistics.median(base_ms)
    verdict = "ok" if o <= target_ms else "OVER TARGET"
    print(f"{label:<48} {o:9.3f} ms  (target ≤ {target_ms:g} ms: {verdict});  "
          f"{base_label} {b:.3f} ms, ratio {o / b:.1f}×")


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="runs per median (default 15)")
    args = parser.parse_args(argv)

    import torch
    from IPython.core.interactiveshell import InteractiveShell

    import torchgpu_magic
    from torchgpu_magic import placement
    from torchgpu_magic.magics import instance
    from torchgpu_magic.magics.whereis import WhereIsMagics

    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5000)])  # 10,000 parameter tensors
    assert len(list(model.parameters())) == 10_000
    _pair("module_report, 10,000 parameter tensors", lambda: placement.module_report("model", model),
          lambda: sum(p.numel() for p in model.parameters()), "parameters() walk", args.repeat, 50)

    ns: dict = {f"v{i}": i for i in range(66_000)}
    ns.update({f"s{i}": str(i) for i in range(33_000)})
    ns.update({f"t{i}": torch.ones(4) for i in range(1_000)})
    assert len(ns) == 100_000
    tensor_type = torch.Tensor

    def bare() -> int:
        return sum(1 for v in ns.values() if isinstance(v, tensor_type))

    _pair("namespace_snapshot, 100,000 objects", lambda: placement.namespace_snapshot(ns), bare,
          "isinstance loop", args.repeat, 100)
    _pair("namespace_report (%whereis table), 100,000 objects", lambda: placement.namespace_report(ns), bare,
          "isinstance loop", args.repeat, 100)

    shell = InteractiveShell.instance()
    torchgpu_magic.load_ipython_extension(shell)
    try:
        shell.user_ns.update({f"t{i}": torch.ones(4) for i in range(1_000)})
        shell.run_line_magic("whereis", "--watch on")
        magics = instance(shell).part(WhereIsMagics)
        _pair("--watch hook per cell, 1,000 tensors", magics._watch_cell,
              lambda: shell.run_cell("pass", silent=True), "an empty cell (no hooks)",
              max(args.repeat, 200), 1)
    finally:
        torchgpu_magic.unload_ipython_extension(shell)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
