"""``%whereis NAME``: one object in detail. A tensor's line, a module's placement tree (uniform subtrees
collapsed, runs of alike siblings merged, split and meta modules flagged), an optimizer's state
against its parameters, and the one-line placement shown by ``--repr``.

Never runs ``forward``, never moves anything; reports hold strings and numbers only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Optional

from ..errors import MagicInputError
from ..host import gc_paused
from ..render import Lines, Report, Reportable, Table, fmt_bytes, fmt_count, join_cells, separator
from .accounting import account, grad_state
from .bydesign import pinned
from .kinds import device_order, dtype_str, kind_of, shape_str, storage_key, torch_module
from .walk import Walk


@dataclass(repr=False)
class TensorLine(Reportable):
    """``%whereis NAME`` for a tensor: its one line."""

    lines: list

    def report(self) -> Report:
        return Report([Lines(self.lines)])

    def to_dict(self) -> dict:
        return {"lines": list(self.lines)}


def tensor_line(name: str, tensor: Any, ns: Optional[Mapping[str, Any]] = None) -> TensorLine:
    """``x · cpu · float32 · (3, 4) · 48 B · requires_grad · pinned · shares storage with y``."""
    acc = account(tensor)
    device = acc.devices[0]
    nbytes = acc.view_bytes
    parts = [name, device, dtype_str(tensor.dtype), shape_str(tuple(tensor.shape)), fmt_bytes(nbytes)]
    flags = {"requires_grad": tensor.requires_grad, "pinned": pinned(tensor, device) == "yes",
             "Parameter": type(tensor).__name__ == "Parameter"}
    parts += [flag for flag, on in flags.items() if on]
    key = next(iter(acc.storages))
    size = acc.nbytes()
    if isinstance(key, int) and size != nbytes:
        parts.append(f"a view of a {fmt_bytes(size)} storage")
    if ns is not None and isinstance(key, int):
        others = [n for n, obj, kind in Walk(ns) if kind == "tensor" and obj is not tensor
                  and storage_key(obj)[0] == key]
        if others:
            parts.append("shares storage with " + ", ".join(others[:5]) + (" ..." if len(others) > 5 else ""))
    grads = acc.nbytes(gradients=True)
    if grads:
        parts.append(f"gradient {fmt_bytes(grads)}")
    if acc.why:
        parts.append(acc.why)
    if device == "meta":
        parts.append("meta: no data")
    return TensorLine([f" {separator()} ".join(parts)])


@dataclass(frozen=True)
class ModuleRow:
    """One (possibly collapsed) line of a module's placement table."""

    name: str
    what: str
    devices: str
    dtypes: str
    params: int
    buffers: int
    nbytes: int
    trainable: str
    note: str


def _uniform(node: Any) -> bool:
    """One device, one dtype, and all or none of it trainable: a subtree that can show as one row."""
    return len(node.devices) <= 1 and len(node.dtypes) <= 1 and node.trainable in (0, node.params)


def _alike(a: Any, b: Any) -> bool:
    """Whether two uniform sibling subtrees can merge into one row (``layers.0..11  12 × Block``): same
    class, placement, sizes and notes. Fields are compared one by one, cheapest first, with no tuple
    built per sibling: 5,000 alike siblings are common."""
    return (a.params == b.params and a.cls == b.cls and a.buffers == b.buffers and a.trainable == b.trainable
            and a.devices == b.devices and a.dtypes == b.dtypes and a.notes == b.notes)


@dataclass(repr=False)
class _TableReport(Reportable):
    """A report of the object ``name`` shown as header lines, one table of ``rows``, and flag lines;
    subclasses provide ``table()`` and how a row reads as plain data (``_row_dict``)."""

    name: str
    header: list
    rows: list
    flags: list

    def report(self) -> Report:
        return Report([Lines(self.header), self.table(), Lines(self.flags)])

    def to_dict(self) -> dict:
        return {"name": self.name, "header": list(self.header), "rows": list(map(self._row_dict, self.rows)),
                "flags": list(self.flags)}


class ModuleReport(_TableReport):
    """A module's placement: one row per module, uniform subtrees collapsed, runs of identical
    siblings merged, split modules and meta / offloaded parameters flagged."""

    _row_dict = staticmethod(asdict)

    def table(self) -> Table:
        headers = ["module", "class", "devices", "dtypes", "params", "buffers", "bytes", "trainable", "note"]
        table = Table(headers, align="llllrrrll")
        for r in self.rows:
            table.add(r.name, r.what, r.devices, r.dtypes, fmt_count(r.params), fmt_count(r.buffers),
                      fmt_bytes(r.nbytes), r.trainable, r.note)
        return table


MAX_MODULE_ROWS = 200


def _node_row(node: Any, collapsed: bool) -> ModuleRow:
    notes = list(node.notes)
    if len(node.devices) > 1:
        notes.append("split across " + ", ".join(sorted(node.devices, key=device_order)))
    if "meta" in node.devices:
        notes.append("meta params: no data")
    if node.children and collapsed:
        notes.append(f"+{node.n_modules - 1} submodules, same placement")
    return ModuleRow(
        node.name, node.cls, join_cells(sorted(node.devices, key=device_order)),
        join_cells(sorted(dtype_str(d) for d in node.dtypes)), node.params, node.buffers, node.nbytes,
        grad_state(node.trainable, node.params), "; ".join(notes),
    )


def _emit(node: Any, rows: list, expand: bool) -> None:
    """Rows for ``node``; its children listed when ``expand`` or the subtree is not uniform, runs of
    consecutive siblings with the same class and placement merged into one row."""
    if not node.children or not (expand or not _uniform(node)):
        rows.append((node, True))
        return
    rows.append((node, False))
    i = 0
    children = node.children
    count = len(children)
    while i < count:
        j = i + 1
        first = children[i]
        if _uniform(first):  # a sibling alike a uniform one is uniform too
            while j < count and _alike(children[j], first):
                j += 1
        if j - i > 1:
            rows.append(children[i:j])
        else:
            _emit(first, rows, False)
        i = j


@gc_paused()
def module_report(name: str, module: Any) -> ModuleReport:
    """Where ``module``'s parameters and buffers are, module by module. Never runs forward and never
    moves anything; the garbage collector is paused during the walk
    (:func:`~torchgpu_magic.host.gc_paused`)."""
    torch = torch_module()
    header = []
    if isinstance(module, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        raw_ids = getattr(module, "device_ids", None) or []
        ids = [f"cuda:{d}" if isinstance(d, int) else str(d) for d in raw_ids]
        out = getattr(module, "output_device", None)
        out = f"cuda:{out}" if isinstance(out, int) else out
        kind = "DataParallel" if isinstance(module, torch.nn.DataParallel) else "DistributedDataParallel"
        if kind == "DataParallel" and not ids:
            where = "no GPU visible, so it runs .module as is"
        elif kind == "DataParallel":
            where = f"replicates .module onto {', '.join(ids)} at each forward, outputs gathered on {out}"
        else:
            where = f"one process per device, device_ids {', '.join(ids) or 'None'}, output_device {out}"
        header.append(f"{name} is a {kind} wrapper: {where}; the parameters below live on {name}.module.")
    elif type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod"):
        header.append(f"{name} is a torch.compile wrapper; the parameters below belong to ._orig_mod.")
    acc = account(module, gradients=False)
    tree, hooks = acc.tree, acc.hooks
    tree.name = name
    where = ", ".join(f"{fmt_bytes(acc.shares[d].nbytes)} on {d}" for d in acc.devices)
    header.append(f"{name}: {tree.cls}, {fmt_count(tree.params)} params, {where}" if acc.devices
                  else f"{name}: {tree.cls}, no parameters or buffers")
    flat: list = []
    _emit(tree, flat, True)
    rows = []
    for item in flat[:MAX_MODULE_ROWS]:
        if isinstance(item, list):  # a run of alike siblings (layers.0..11): the first one's row, for all
            first, count = item[0], len(item)
            rows.append(replace(
                _node_row(first, False), name=f"{first.name}..{item[-1].name.rsplit('.', 1)[-1]}",
                what=f"{count} × {first.cls}", params=first.params * count, buffers=first.buffers * count,
                nbytes=sum(n.nbytes for n in item), note="; ".join(first.notes),
            ))
        else:
            rows.append(_node_row(*item))
    flags = []
    if len(flat) > MAX_MODULE_ROWS:
        flags.append(f"... {len(flat) - MAX_MODULE_ROWS} more rows not shown")
    split = [r.name for r in rows if "split across" in r.note and r.name != name]
    if len(tree.devices) > 1:
        advice = ("accelerate's hooks move inputs and weights between them" if hooks
                  else "inputs must be on the device of the layer that reads them")
        flags.append(f"{name} is split across {', '.join(sorted(tree.devices, key=device_order))}"
                     + (f" (inside: {', '.join(split[:5])})" if split else "") + f": {advice}.")
    offloading = [places for _, places in hooks if places]
    if offloading:
        places = sorted(set().union(*offloading))
        runs_on = sorted({device for device, _ in hooks if device is not None})
        flags.append(f"Offloaded by accelerate: the weights of {len(offloading)} module(s) live on "
                     f"{' and '.join(places)} (meta tensors stand in for them) and are loaded onto "
                     f"{', '.join(runs_on)} for each forward; the forward runs as is.")
    if "meta" in tree.devices:
        flags.append("Parameters on meta have no data: materialise them (module.to_empty(device=...) then "
                     "load_state_dict), or check the loading options (device_map, low_cpu_mem_usage).")
    return ModuleReport(name, header, rows, flags)


class OptimizerReport(_TableReport):
    """Where an optimizer's state lives compared with its parameters, per parameter group."""

    _row_dict = list

    def table(self) -> Table:
        table = Table(["group", "params", "param devices", "state devices", "state bytes"], align="rrllr")
        for group, n, pdev, sdev, nbytes in self.rows:
            table.add(group, n, pdev, sdev, fmt_bytes(nbytes))
        return table


def optimizer_report(name: str, optimizer: Any) -> OptimizerReport:
    """Per parameter group: how many parameters, on which devices, and where their state tensors
    (momentum, Adam's moments...) are, from the optimizer's :func:`~.accounting.account`; step counters
    kept on the cpu by torch's design are said apart, and state that is not where torch needs it is
    flagged."""
    acc = account(optimizer)
    rows = [(index, n, join_cells(pdev), join_cells(sdev) if sdev else "(no state yet)", nbytes)
            for index, (n, pdev, sdev, nbytes) in enumerate(acc.groups)]
    where = ", ".join(f"{fmt_bytes(share.nbytes)} on {device}" for device, share in acc.shares.items()
                      if share.nbytes)
    header = [f"{name}: {type(optimizer).__name__}, {len(optimizer.param_groups)} param group(s), "
              f"state {where or fmt_bytes(0)}"]
    flags = []
    if not optimizer.state:
        flags.append("No state yet: it is created on the parameters' devices by the first step().")
    flags += [f"Step counters: {fmt_bytes(size)} on {where}, {why}." for _, where, size, why in acc.kept_off]
    if acc.misplaced:
        flags.append(
            f"{len(acc.misplaced)} state tensor(s) are not on their parameter's device (the model was moved "
            "after the optimizer stepped): step() will fail. Recreate the optimizer after moving the model, "
            "or load its state_dict after the move (load_state_dict moves state to each parameter's device)."
        )
    return OptimizerReport(name, header, rows, flags)


def describe(name: str, obj: Any, ns: Optional[Mapping[str, Any]] = None) -> Any:
    """The ``%whereis NAME`` report for one object: a line for a tensor, a table for a module or an
    optimizer. Raises MagicInputError for anything else."""
    kind = kind_of(obj)
    if kind == "tensor":
        return tensor_line(name, obj, ns)
    if kind == "module":
        return module_report(name, obj)
    if kind == "optimizer":
        return optimizer_report(name, obj)
    raise MagicInputError(f"{name} is a {type(obj).__name__}, not a tensor, nn.Module or optimizer")


def placement_line(obj: Any) -> str:
    """One line saying where a tensor or module is: ``Linear · cuda:0 · float32 · 4 params · 16 B``."""
    sep = f" {separator()} "
    acc = account(obj, gradients=False)
    if acc.kind == "tensor":
        return sep.join([type(obj).__name__, acc.devices[0], dtype_str(obj.dtype),
                         shape_str(tuple(obj.shape)), fmt_bytes(acc.view_bytes)])
    dtypes = sorted({d for share in acc.shares.values() for d in share.dtypes})
    return sep.join([type(obj).__name__, "+".join(acc.devices) or "no tensors", "+".join(dtypes) or "-",
                     f"{fmt_count(acc.tree.params)} params", fmt_bytes(acc.nbytes())])

