"""Where tensors, modules and optimizers live: the core of ``%whereis`` and the mixed-device diagnosis.

Split by concern, each module importing only ``common`` (the shared facts and helpers):

- ``scan``: the namespace snapshot (``--watch``, ``%%ontorch``'s footer) and the ``%whereis`` table;
- ``modules``: ``%whereis NAME`` for one tensor, module or optimizer, and the ``--repr`` line;
- ``names``: resolving that NAME without evaluating code;
- ``diagnosis``: recognising a device-mismatch error and naming what it involved.

Nothing here moves a tensor, runs ``forward`` or evaluates user code: objects are only inspected
(devices, dtypes, shapes, storage sizes). Nothing here keeps a user object alive either: snapshots and
reports hold names, strings, numbers and ``id()`` values, never the objects, so a report can be kept
around without pinning GPU memory. torch is imported lazily, on first use.

The public names are re-exported here, so callers keep writing ``placement.namespace_report(ns)``.
"""
from __future__ import annotations

from .common import (
    IPYTHON_NAMES,
    device_str,
    devices_of,
    dtype_str,
    fmt_count,
    is_floating,
    kind_of,
    shape_str,
    storage_key,
    tensor_nbytes,
)
from .diagnosis import Culprit, Diagnosis, diagnose, mismatch_devices
from .modules import (
    MAX_MODULE_ROWS,
    Lines,
    ModuleReport,
    ModuleRow,
    OptimizerReport,
    describe,
    module_report,
    optimizer_report,
    placement_line,
    tensor_line,
)
from .names import resolve
from .scan import (
    SNAPSHOT_CONTAINER_LIMIT,
    NamespaceReport,
    Placed,
    Row,
    changed,
    namespace_report,
    namespace_snapshot,
    watch_line,
)

__all__ = [
    "IPYTHON_NAMES", "MAX_MODULE_ROWS", "SNAPSHOT_CONTAINER_LIMIT", "Culprit", "Diagnosis", "Lines",
    "ModuleReport", "ModuleRow", "NamespaceReport", "OptimizerReport", "Placed", "Row", "changed",
    "describe", "device_str", "devices_of", "diagnose", "dtype_str", "fmt_count", "is_floating", "kind_of",
    "mismatch_devices", "module_report", "namespace_report", "namespace_snapshot", "optimizer_report",
    "placement_line", "resolve", "shape_str", "storage_key", "tensor_line", "tensor_nbytes", "watch_line",
]
