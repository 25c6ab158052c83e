"""Profiler events as ``torch.profiler`` gives them (torch's own ``FunctionEvent``), for the tests of what
reads them: with the Kineto activity newer torch carries on each event, or without it, as torch 2.11
(the GPU machine's) builds them, whose ``FunctionEvent`` takes no ``activity_type`` at all."""
from __future__ import annotations

import inspect
from typing import Any, Optional


def function_event(name: str, device: str = "CPU", start: float = 0, end: float = 1, annotation: bool = False,
                   activity: Optional[str] = None) -> Any:
    """A ``FunctionEvent`` named ``name`` on ``device`` ('CPU' or 'CUDA') from ``start`` to ``end`` us;
    ``activity`` None: none carried (torch 2.11's events); else carried, as newer torch's constructor
    sets it (set on the event where this torch's constructor does not take it)."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    takes = "activity_type" in inspect.signature(FunctionEvent.__init__).parameters
    extra = {"activity_type": activity} if takes else {}
    event = FunctionEvent(id=0, name=name, thread=0, start_us=start, end_us=end, use_device="cuda",
                          device_type=getattr(DeviceType, device), is_user_annotation=annotation, **extra)
    if activity is not None and not takes:
        event.activity_type = activity
    return event
