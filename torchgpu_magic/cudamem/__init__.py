"""``%%cudamem``'s core: a cell's memory by category, module and phase, measured or predicted.

- :mod:`.run`: the cell run with its allocations tracked by torch's ``MemTracker`` (measured, or on fake
  tensors for a prediction);
- :mod:`.allocator`: the ledger of a tracked run (live bytes by category, the peak and where it was) and
  the model of the CUDA caching allocator that accounts a CUDA target block by block;
- :mod:`.prediction`: ``--predict`` and ``--fit``, the cell run on fake tensors;
- :mod:`.fakenamespace`: the names a cell uses, and fake copies of them;
- :mod:`.cudastandin`: fake cpu tensors standing in for CUDA where this torch cannot run fake CUDA
  tensors (or running them would create a CUDA context);
- :mod:`.cudakernels`: CUDA's kernel choices where they change what is allocated (autocast's casts,
  attention, dropout), made in torch's dispatcher for the stand-in;
- :mod:`.targetdevice`: the target device's facts: where its fake tensors live, its capacity, and the
  allowances for what fake tensors cannot see (the CUDA context, each thread's cuBLAS workspace);
- :mod:`.series`: the step's memory over its events (each allocation and free, with its category, phase,
  module, operator and cell line), as the ledger records it;
- :mod:`.picture`: that series drawn, as inline SVG and as block characters for a terminal;
- :mod:`.report`: the reports (:class:`CellMemory`, :class:`StepComparison`, :class:`FitResult`),
  re-exported here.

torch is imported inside functions only, so importing this package is cheap.
"""
from __future__ import annotations

from .report import CellMemory, FitResult, ModuleRow, StepComparison
from .series import StepSeries

__all__ = ["CellMemory", "FitResult", "ModuleRow", "StepComparison", "StepSeries"]
