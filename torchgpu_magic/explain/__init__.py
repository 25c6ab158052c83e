"""Errors explained above their traceback: the user's failing line, the device mismatch, the out-of-memory
error.

- :mod:`.failing`: the user's failing line in a traceback (the innermost frame of the user's cell), which
  every explanation shows first;
- :mod:`.mismatch`: recognising a device-mismatch error from its wording and naming what it involved;
- :mod:`.oomerror`: recognising an out-of-memory error in any of PyTorch's wordings, and reading its figures;
- :mod:`.outofmemory`: the out-of-memory explanation: who holds the device's memory, by name, and what to do.

The IPython side (showing an explanation above the traceback, folding torch's frames) is
:mod:`torchgpu_magic.magics.explainers`. Modules are imported by name where used.
"""
