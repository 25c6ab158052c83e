"""``%whereis``, the device-mismatch diagnosis and ``%%ontorch`` on a real GPU: a cuda model with Adam after
a step (no false "state not on its params' device": Adam keeps its step counters on the cpu by design),
a real cuda/cpu mismatch explained with the fix, and ``%%ontorch cuda:0`` with ``.cuda()`` inside. Each
runs through the shell and hands what it saw to a verdict function the tests call with text that misses.
"""
from __future__ import annotations

from typing import Any

from .outcome import Outcome, judged
from .probe import Probe

FALSE_ALARM = "state not on its params' device"
FIX = "x = x.to(next(model.parameters()).device)"


def whereis_adam(probe: Probe) -> Outcome:
    """``%whereis model opt`` on a cuda MLP and its Adam after one step."""
    from IPython.core.formatters import PlainTextFormatter

    index = probe.cuda()
    probe.cell("model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))"
               ".cuda()\nopt = torch.optim.Adam(model.parameters())\n"
               "model(torch.randn(4, 64, device='cuda')).sum().backward()\nopt.step()")
    report = probe.shell.run_line_magic("whereis", "-o model opt")
    text = PlainTextFormatter()(report)
    probe.say(text)
    states = probe.shell.user_ns["opt"].state.values()
    moments = sum(v.numel() * v.element_size() for s in states for k, v in s.items() if k != "step")
    return judge_whereis(text, f"cuda:{index}", moments)


def judge_whereis(text: str, device: str, moment_bytes: int) -> Outcome:
    """The report shows the model and its Adam state on ``device`` and raises no false alarm."""
    alarm = FALSE_ALARM in text
    return judged(device in text and not alarm and moment_bytes > 0,
                  f"model and Adam state ({moment_bytes:,} bytes of moments) on {device}; "
                  + ("a false 'state not on its params' device'" if alarm else "no mismatch flagged"),
                  f"on {device}, no '{FALSE_ALARM}'",
                  "the report flags Adam's cpu step counters as misplaced" if alarm else
                  f"{device} is not in the report" if device not in text else "")


def mismatch_diagnosis(probe: Probe) -> Outcome:
    """``y = model(x)`` with the model on cuda and ``x`` on the cpu: the explanation above the traceback."""
    index = probe.cuda()
    probe.cell("model = torch.nn.Linear(3, 2).cuda()\nx = torch.ones(4, 3)")
    out, result = probe.captured("y = model(x)")
    head = out.stdout.split("-" * 20)[0].strip()
    shown = [head] if head.startswith("whereis:") else []
    shown += [o.data.get("text/plain", "") for o in out.outputs
              if o.data.get("text/plain", "").startswith("whereis:")]
    return judge_mismatch(result.error_in_exec, "\n".join(shown), f"cuda:{index}")


def judge_mismatch(error: Any, explained: str, device: str) -> Outcome:
    """The cell failed, and its explanation names ``device`` and gives the fix that moves ``x``."""
    head = explained.splitlines()[0] if explained else "(no explanation shown)"
    return judged(error is not None and device in explained and FIX in explained, f"explained: {head[:140]}",
                  f"names {device} and says `{FIX}`",
                  "the cell did not fail" if error is None else "" if explained else "no explanation shown")


def ontorch_cuda(probe: Probe) -> Outcome:
    """``%%ontorch cuda:0``: a new tensor and a ``.cuda()`` inside land on cuda:0, the current device is 0
    inside, and the default device is the cpu again after."""
    import torch

    probe.cuda()
    inside = probe.cell("%%ontorch cuda:0\na = torch.ones(2)\nb = torch.zeros(2, device='cpu').cuda()\n"
                        "(a.device, b.device, torch.cuda.current_device())")
    after = torch.ones(1).device
    return judge_ontorch(inside, after)


def judge_ontorch(inside: Any, after: Any) -> Outcome:
    """``inside`` is (new tensor's device, ``.cuda()``'s device, current device) in the cell."""
    import torch

    expected = (torch.device("cuda", 0), torch.device("cuda", 0), 0)
    ok = tuple(inside or ()) == expected and after == torch.device("cpu")
    return judged(ok, f"inside: {inside}; after: new tensors on {after}",
                  "cuda:0, cuda:0, current 0 inside; cpu after")
