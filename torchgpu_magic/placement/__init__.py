"""Where tensors, modules and optimizers live: the core of ``%whereis`` and ``%%ontorch --move``, and what
the explanations (:mod:`torchgpu_magic.explain`) and the holders of memory read objects with.

Split by concern:

- ``kinds``: the cheap per-tensor reads (kind of an object, device and dtype names, shapes, storage and
  bytes, the order devices are listed in), cached per type and device;
- ``tree``: the one walk of a module tree, every tensor's facts read at once, figures per module;
- ``accounting``: the one account of an object's tensors (each with its role: parameter, buffer,
  gradient, optimizer state, step counters; storages counted once; devices; bytes per device and role)
  that every view below reads, and the trainable-share cell;
- ``bydesign``: where torch keeps state off the device on purpose (optimizer step counters, GradScaler,
  RNG states, pinned buffers, DataLoader batches), so no view calls it a mistake;
- ``walk``: the bounded walk over a namespace, and static attribute lookup;
- ``offload``: where accelerate keeps offloaded weights, and where the forward runs;
- ``scan``: the namespace snapshot (``--watch``, ``%%ontorch``'s footer), the names a cell's code can
  bind, and the footer's line;
- ``table``: the ``%whereis`` table (names, containers and user objects walked, gradients counted);
- ``modules``: ``%whereis NAME`` for one tensor, module or optimizer, and the ``--repr`` line;
- ``names``: resolving that NAME without evaluating code;
- ``moves``: ``%%ontorch --move``, all or nothing (the one module here that changes objects, on request).

Apart from ``moves``, nothing here moves a tensor, runs ``forward`` or evaluates user code: objects are
only inspected (devices, dtypes, shapes, storage sizes). Nothing here keeps a user object alive either:
snapshots and reports hold names, strings, numbers and ``id()`` values, never the objects, so a report can
be kept around without pinning GPU memory. torch is imported lazily, on first use.

The public names are re-exported here, so callers keep writing ``placement.namespace_report(ns)``.
"""
from __future__ import annotations

from .accounting import account, devices_of
from .kinds import device_str, dtype_str, kind_of, shape_str, storage_key
from .modules import describe, module_report, optimizer_report, placement_line
from .names import resolve
from .scan import (
    SnapshotCache,
    changed,
    changed_elsewhere,
    footer_line,
    names_bound,
    namespace_snapshot,
    watch_line,
)
from .table import DEFAULT_TOP, namespace_report

__all__ = [
    "DEFAULT_TOP", "SnapshotCache", "account", "names_bound", "changed", "changed_elsewhere", "footer_line",
    "describe", "device_str", "devices_of", "dtype_str", "kind_of", "module_report", "namespace_report",
    "namespace_snapshot", "optimizer_report", "placement_line", "resolve", "shape_str", "storage_key",
    "watch_line",
]
