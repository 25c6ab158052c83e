"""What %%cudatime's roofline costs: the whole magic call with the counting run against --no-roofline, side
by side in one process on the same live tensors, for cells of three shapes; the counting run's own time
against one timed loop; and, in fresh processes, the first call of a process.

  * a small cell (one add on a 64x64 tensor, a few us)
  * a larger cell (an MLP training step: 3 Linear(512, 512) layers, batch 256, SGD, a few ms)
  * many small ops (200 in-place adds on 8-element tensors: the counter's per-op cost shows)
  * attention with an explicit causal mask (4 calls of scaled_dot_product_attention on (2, 4, 256, 64):
    the counter recognises the mask from its values, once per mask and counting run)
Both arms take a fixed 15 samples after 3 warm-up loops, so the stopping rule cannot decide how long a
call lasts. Arms alternate (with, without, with, without, ...) and each ratio is the median of the
per-pair ratios, so a busy machine's drift hits both arms alike. The fresh-process part runs `%%cudatime`
once in new processes, with and without the roofline, alternating: a TorchDispatchMode that let torch
wrap its __torch_dispatch__ in torch._disable_dynamo would import torch._dynamo there (seconds).

Usage: python benchmarks/bench_roofline.py [--pairs N] [--fresh N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

SETUP = """
import torch
torch.manual_seed(0)
x = torch.randn(64, 64)
small = [torch.randn(8) for _ in range(200)]
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 512))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
batch = torch.randn(256, 512)
q = torch.randn(2, 4, 256, 64)
causal = torch.ones(256, 256, dtype=torch.bool).tril()
"""
CELLS = {
    "small cell (x + 1, 64x64)": "y = x + 1",
    "larger cell (MLP training step)": ("optimizer.zero_grad()\nmodel(batch).sum().backward()\n"
                                        "optimizer.step()"),
    "many small ops (200 adds)": "for t in small:\n    t.add_(1)",
    "attention, explicit causal mask (4 calls)": ("for _ in range(4):\n"
                                                  "    torch.nn.functional.scaled_dot_product_attention("
                                                  "q, q, q, attn_mask=causal)"),
}
OPTIONS = "-o -q -r 15 --warmup 3"  # a fixed sample count: the stopping rule must not set the length


def shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "torchgpu_magic")
    ip.run_cell(SETUP).raise_error()
    return ip


def call(ip: Any, options: str, body: str) -> tuple:
    """One %%cudatime call: (seconds it took, its result)."""
    start = time.perf_counter()
    result = ip.run_cell_magic("cudatime", options, body)
    return time.perf_counter() - start, result


def in_process(ip: Any, pairs: int) -> None:
    for name, body in CELLS.items():
        call(ip, OPTIONS, body)  # warm: the first counting run of the process imports torch._dynamo
        ratios, counts, loops, with_s, without_s = [], [], [], [], []
        for _ in range(pairs):
            spent_with, result = call(ip, OPTIONS, body)
            spent_without, _ = call(ip, OPTIONS + " --no-roofline", body)
            ratios.append(spent_with / spent_without)
            with_s.append(spent_with)
            without_s.append(spent_without)
            counts.append(result.roofline.count_seconds)
            loops.append(result.median)
        count, loop = statistics.median(counts), statistics.median(loops)
        print(f"{name}: whole call {statistics.median(with_s) * 1e3:.0f} ms with the roofline, "
              f"{statistics.median(without_s) * 1e3:.0f} ms without = {statistics.median(ratios):.3f}x "
              f"(median of {pairs} pairs); counting run {count * 1e3:.2f} ms = {count / loop:.1f}x one timed "
              f"loop ({loop * 1e3:.3f} ms); counted {result.roofline.flops:,} FLOP and "
              f"{result.roofline.bytes:,} B per loop")


FRESH = """
import time
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "torchgpu_magic")
ip.run_cell("import torch\\nx = torch.randn(64, 64)").raise_error()
start = time.perf_counter()
ip.run_cell_magic("cudatime", "-o -q --max-time 0.5 {options}", "y = x + 1")
print(time.perf_counter() - start)
"""


def fresh(runs: int) -> None:
    spent: dict = {"with": [], "without": []}
    for _ in range(runs):
        for arm, options in (("with", ""), ("without", "--no-roofline")):
            done = subprocess.run([sys.executable, "-c", FRESH.format(options=options)], capture_output=True,
                                  text=True, env=dict(os.environ), check=True)
            spent[arm].append(float(done.stdout.strip().splitlines()[-1]))
    first, plain = statistics.median(spent["with"]), statistics.median(spent["without"])
    print(f"first call in a fresh process (small cell, --max-time 0.5): {first * 1e3:.0f} ms with the "
          f"roofline, {plain * 1e3:.0f} ms without: +{(first - plain) * 1e3:.0f} ms once per process "
          f"(median of {runs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--fresh", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # one intra-op thread: a 2-core machine shared with other jobs is noisy enough
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, 1 intra-op thread, load average {load:.2f}")
    in_process(shell(), args.pairs)
    if args.fresh:
        fresh(args.fresh)


if __name__ == "__main__":
    main()
