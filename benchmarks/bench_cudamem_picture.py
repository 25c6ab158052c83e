"""What drawing a step's memory costs `%%cudamem`: recording the curve on a real step, and drawing a long one.

1. Recording. The peers' 6-layer encoder step (``nn.TransformerEncoder``, d_model 512, 8 heads, feed-forward
   2048, batch 8 x 256 tokens, AdamW; loss, backward, step, zero_grad) through a real InteractiveShell,
   ``%%cudamem cpu -o -q`` (measured: the real step) and ``%%cudamem --predict cuda -o -q`` (predicted),
   in two arms on the same live objects, alternated round by round:
   - ``curve``: as shipped, every allocation and free recorded with its category, phase, module,
     operator and cell line;
   - ``no curve``: the same code with the recording switched off in place: the ledger's ``start`` leaves
     it off (so no row is appended and neither phase nor line is looked up on a free), the tracker's
     dispatch is MemTracker's own plus the cuBLAS-workspace hook, as before the curve (no operator
     name), and its ``context`` is never asked. What is left of the curve in this arm is a flag test per
     event and an empty call per allocation, so the ratio slightly understates the curve's cost.
   Each round runs the arms in turn (their order alternating); printed: the median of each arm's
   seconds, and the median and range of the per-round ratios, by the wall clock and by the process's
   CPU time (``time.process_time``: all its threads, none of the other processes that share this
   machine). Target (issue 33): the curve adds at most 10 % to `%%cudamem`'s own time. On the measured
   step the step's own arithmetic (tens of seconds on 2 cores) dwarfs both arms' bookkeeping; on the
   predicted one (fake tensors: no arithmetic) the time is all `%%cudamem`'s own. After the set-up,
   ``gc.freeze()`` (as the test suite does): else a full collection, which walks torch's million
   objects (about 0.2 s here, once in some ten runs, in either arm), lands on one arm at random and
   swamps a difference of a few percent. OpenMP's threads wait passively (``OMP_WAIT_POLICY=PASSIVE``,
   set before torch is imported, unless set already): spinning threads of a contended machine would
   otherwise count their spinning as the measured step's CPU time.
2. Drawing. A synthetic step of exactly 100,000 events (forward allocations, a backward that frees them
   while it allocates and frees temporaries, an optimizer step, repeated) recorded through a real
   Ledger, then the picture drawn as SVG and as text (the sampling included), best of 5. Target: under
   a second. Also the encoder step's own picture, and the SVG's size.

Run: `python benchmarks/bench_cudamem_picture.py [--rounds 15] [--measured-rounds 5]`.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SETUP = """
import torch
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(8, 256, 512)
"""
STEP = "loss = model(x).square().mean()\nloss.backward()\nopt.step()\nopt.zero_grad()\n"
ARMS = ("curve", "no curve")


def _shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "torchgpu_magic")
    result = shell.run_cell(SETUP)
    result.raise_error()
    gc.collect()
    gc.freeze()
    return shell


class NoCurve:
    """The recording switched off in place (see the module's docstring); undone on exit."""

    def __enter__(self) -> None:
        from torchgpu_magic.cudamem import run
        from torchgpu_magic.cudamem.allocator import Ledger

        tracker = run.tracker_class()
        base = tracker.__mro__[1]
        self.saved = [(Ledger, "start", Ledger.__dict__["start"]),
                      (tracker, "__torch_dispatch__", tracker.__dict__["__torch_dispatch__"])]
        start = Ledger.start

        def start_off(ledger: Any, where: Any, context: Any = None) -> None:
            start(ledger, where, None)
            ledger._recording = False

        def dispatch_before(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = base.__torch_dispatch__(self, func, types, args, kwargs)
            if self._on_matmul is not None and func.overloadpacket.__name__ in run._MATMULS:
                device = next((a.device for a in args if hasattr(a, "device")), None)
                if device is not None:
                    self._on_matmul(self.ledger(device))
            return out

        Ledger.start = start_off
        tracker.__torch_dispatch__ = dispatch_before

    def __exit__(self, *exc: Any) -> None:
        for owner, name, value in self.saved:
            setattr(owner, name, value)


def _time(shell: Any, line: str) -> tuple:
    """(wall seconds, CPU seconds, report) of one ``%%cudamem line -o -q`` on the step."""
    wall, cpu = time.perf_counter(), time.process_time()
    report = shell.run_cell_magic("cudamem", f"{line} -o -q", STEP)
    return time.perf_counter() - wall, time.process_time() - cpu, report


def recording(shell: Any, line: str, rounds: int) -> dict:
    """Wall and CPU seconds per arm, and per-round ratios (curve / no curve), for ``%%cudamem line``."""
    _time(shell, line)  # warm-up: AdamW's state exists, every kernel and code path has run once
    wall: dict = {arm: [] for arm in ARMS}
    cpu: dict = {arm: [] for arm in ARMS}
    events = None
    for round_ in range(rounds):
        for arm in (ARMS if round_ % 2 == 0 else ARMS[::-1]):
            if arm == "curve":
                took, used, report = _time(shell, line)
                events = report.series.events
            else:
                with NoCurve():
                    took, used, report = _time(shell, line)
                assert report.series.events == 0
            wall[arm].append(took)
            cpu[arm].append(used)
    return {"wall": wall, "cpu": cpu, "events": events,
            "ratios": {clock: [a / b for a, b in zip(arms["curve"], arms["no curve"])]
                       for clock, arms in (("wall", wall), ("cpu", cpu))}}


def synthetic_series(events: int, seed: int = 0) -> Any:
    """A series of exactly ``events`` events recorded through a real Ledger: steps of a forward that
    allocates activations, a backward that frees them while it allocates and frees temporaries, and an
    optimizer step that allocates and frees its own, planned one event at a time and cut at ``events``."""
    from torchgpu_magic.cudamem.allocator import Ledger

    rng = random.Random(seed)
    plan: list = []  # (phase, module, op, line, key, bytes and category to allocate, or None to free)
    key = 0
    while len(plan) < events:
        module = f"model.layers.{rng.randrange(6)}"
        live = []
        for _ in range(events // 25):
            key += 1
            live.append(key)
            size = rng.randrange(1 << 16, 1 << 22)
            plan.append(("forward", module, "aten.mm", 1, key, (size, "activations")))
        while live:
            plan.append(("backward", module, "aten.mm", 2, live.pop(), None))
            if rng.random() < 0.5:
                key += 1
                plan.append(("backward", module, "aten.mul", 2, key, (rng.randrange(1 << 12, 1 << 20),
                                                                      "temporaries")))
                plan.append(("backward", module, "aten.mul", 2, key, None))
        for _ in range(events // 200):
            key += 1
            plan.append(("optimizer step", None, "aten._foreach_add", 3, key, (1 << 20, "optimizer state")))
            plan.append(("optimizer step", None, "aten._foreach_add", 3, key, None))
    ledger = Ledger()
    for i in range(50):
        ledger.add(("param", i), 4 << 20, "parameters")
    now: list = [plan[0]]
    ledger.start(lambda: now[0][:2], lambda: now[0][2:4])
    for step in plan[:events]:
        now[0] = step
        if step[5] is None:
            ledger.remove(step[4])
        else:
            ledger.add(step[4], *step[5])
    ledger.stop()
    return ledger.series


def draw_seconds(series: Any, repeats: int = 5) -> dict:
    """Best-of-``repeats`` seconds to draw ``series`` as SVG and as text, and the SVG's bytes."""
    from torchgpu_magic.cudamem.picture import MemoryPicture

    svg, text = [], []
    size = 0
    for _ in range(repeats):
        start = time.perf_counter()
        drawn = MemoryPicture(series, "synthetic", 80 << 30, "--capacity").to_svg()
        svg.append(time.perf_counter() - start)
        size = len(drawn.encode())
        start = time.perf_counter()
        MemoryPicture(series, "synthetic", 80 << 30, "--capacity").to_text()
        text.append(time.perf_counter() - start)
    return {"svg": min(svg), "text": min(text), "bytes": size}


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the predicted step")
    parser.add_argument("--measured-rounds", type=int, default=5, help="rounds of the measured step")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads (OMP_WAIT_POLICY "
          f"{os.environ['OMP_WAIT_POLICY']}), load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shell = _shell()
    for label, line, rounds in (("predicted, %%cudamem --predict cuda", "--predict cuda", args.rounds),
                                ("measured, %%cudamem cpu", "cpu", args.measured_rounds)):
        out = recording(shell, line, rounds)
        print(f"encoder step, {label} ({out['events']:,} events, {rounds} rounds):")
        for clock in ("wall", "cpu"):
            curve, plain = (statistics.median(out[clock][arm]) for arm in ARMS)
            ratios = out["ratios"][clock]
            verdict = "ok" if statistics.median(ratios) <= 1.10 else "MISSED"
            print(f"  {clock:>4}: curve {curve:.3f} s, no curve {plain:.3f} s; ratio median "
                  f"{statistics.median(ratios):.3f} (range {min(ratios):.3f} to {max(ratios):.3f}; "
                  f"target <= 1.10: {verdict})")
    report = shell.run_cell_magic("cudamem", "cpu -o -q", STEP)
    own = draw_seconds(report.series)
    print(f"encoder step's picture ({report.series.events:,} events): SVG {own['svg'] * 1e3:.1f} ms "
          f"({own['bytes'] / 1024:.0f} KiB), text {own['text'] * 1e3:.1f} ms")
    series = synthetic_series(100_000)
    drawn = draw_seconds(series)
    verdict = "ok" if max(drawn["svg"], drawn["text"]) < 1.0 else "MISSED"
    print(f"synthetic step of {series.events:,} events: SVG {drawn['svg'] * 1e3:.0f} ms "
          f"({drawn['bytes'] / 1024:.0f} KiB), text {drawn['text'] * 1e3:.0f} ms (target under 1 s each: "
          f"{verdict})")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
