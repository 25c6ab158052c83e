"""A cell's run with its allocations tracked by torch's ``MemTracker``, measured (the real run) or on
fake tensors (for :mod:`.prediction`).

``torch.distributed._tools.mem_tracker.MemTracker`` is a ``TorchDispatchMode`` that records every tensor
storage an operation creates, sorts it into a category (parameter, buffer, gradient, activation,
temporary, optimizer state, other) and follows modules through forward and backward. It is private:
it is imported on first use, the torch versions it is tested with are pinned (:data:`TESTED_TORCH`),
and where it is missing (a build without ``torch.distributed``) or has changed shape, the magic says so
in one line. This module subclasses it only to hand each of its updates to a :class:`~.allocator.Ledger`
per device (so a CUDA target is accounted block by block), to note the phase and module at the peak and,
for the ledger's series, the operator and the cell line of each event, and to let a cell call its model
more than once (MemTracker refuses a second forward of a root module).
"""
from __future__ import annotations

import copy
import functools
import itertools
import sys
import threading
import time
import types
import warnings
from typing import Any, Callable, Iterable, Optional

from .. import accelerators
from ..errors import MagicInputError
from ..placement import kind_of
from ..torchapi import mem_tracker_class
from .allocator import ALLOCATOR_SOURCE, CachingAllocatorModel, Ledger, category_of
from .report import CellMemory, ModuleRow

TESTED_TORCH = ((2, 11), (2, 12), (2, 13))
"""The torch releases whose MemTracker this module is tested with (its private hooks are used)."""

_NEEDED = ("_update_snap", "_pre_fw_hook", "_update_peak_stats", "_mod_tracker", "_in_opt", "memory_tracking",
           "track_external", "_curr_mem_snap", "_peak_mem", "_peak_mem_snap")
_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "addmv", "mv", "dot",
                      "vdot", "addr", "_scaled_mm", "_int_mm"})
_WALK_DEPTH = 3
_TESTED = ", ".join(f"{a}.{b}" for a, b in TESTED_TORCH)


class TrackerUnavailable(MagicInputError):
    """This torch has no usable MemTracker; the message says why, in one line."""


def torch_version() -> tuple:
    """(major, minor) of the torch imported here."""
    import torch

    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def version_note() -> Optional[str]:
    """A line for reports when this torch is not one MemTracker is tested with here; else None."""
    import torch

    if torch_version() in TESTED_TORCH:
        return None
    return (f"note: torch {torch.__version__} is not among the releases %%cudamem is tested with "
            f"({_TESTED}); MemTracker is private to torch and may attribute differently")


@functools.cache
def tracker_class() -> type:
    """Our ``MemTracker`` subclass, built on first use; :class:`TrackerUnavailable` where torch has none."""
    import torch

    try:
        MemTracker = mem_tracker_class()
    except Exception as exc:  # noqa: BLE001 - any import failure: one line, never a traceback
        raise TrackerUnavailable(
            f"this torch {torch.__version__} has no MemTracker (torch.distributed._tools.mem_tracker: "
            f"{type(exc).__name__}: {exc}); %%cudamem needs a torch built with torch.distributed "
            f"(tested with {_TESTED})") from None
    missing = [name for name in _NEEDED if not hasattr(MemTracker(), name)]
    if missing:
        raise TrackerUnavailable(f"torch {torch.__version__}'s MemTracker lacks {', '.join(missing)}: its "
                                 f"private interface changed; %%cudamem is tested with torch 2.11 to 2.13")

    class Tracker(MemTracker):  # type: ignore[misc, valid-type]
        """MemTracker, with each update also handed to the ledger of its device."""

        def __init__(self, ledger_for: Callable[[str], Ledger],
                     on_matmul: Optional[Callable[[Any], None]] = None,
                     filename: Optional[str] = None) -> None:
            super().__init__()
            self._ledger_for = ledger_for
            self._on_matmul = on_matmul
            self._filename = filename
            self._thread = threading.get_ident()
            # the operator running: [its name, its cell line, (phase, module), the Python frame that
            # called it], the last three found when first asked; all None between operators
            self._now: list = [None, None, None, None]
            self.ledgers: dict = {}
            self.started = False
            self._stats_by_fqn: dict = {}  # module name -> its _ModMemStats, for _update_peak_stats

        def ledger(self, device: Any) -> Ledger:
            name = str(device)
            found = self.ledgers.get(name)
            if found is None:
                found = self.ledgers[name] = self._ledger_for(name)
                if self.started:
                    found.start(self.where, self.context)
            return found

        def start(self) -> None:
            self.started = True
            for ledger in self.ledgers.values():
                ledger.start(self.where, self.context)

        def where(self) -> tuple:
            """(phase, innermost module) now, for the ledger: found once per operator (modules and
            phases change between operators, never inside one)."""
            now = self._now
            if now[2] is not None:
                return now[2]
            running = self._mod_tracker.parents - {"Global"}
            module = max(running, key=lambda n: (n.count("."), n)) if running else None
            place = ("optimizer step" if self._in_opt else "backward" if self._mod_tracker.is_bw
                     else "forward" if running else "outside modules"), module
            if now[0] is not None:
                now[2] = place
            return place

        def context(self) -> tuple:
            """(operator, cell line) now, for the ledger's series: the line is looked up once per
            operator (0 when the run is not a cell's, or no frame of the cell is running)."""
            now = self._now
            line = now[1]
            if line is None:
                line = self._cell_line(now[3])
                if now[0] is not None:
                    now[1] = line
            return now[0], line

        def _cell_line(self, caller: Any) -> int:
            """The line of the cell's innermost frame: on this thread, from ``caller``, the frame that
            called the operator running (the tracker's own frames below it are never the cell's, and
            Python would build each of them anew at every operator to walk them), or, on another
            thread (the autograd engine's device threads), on the thread that runs the cell, which waits
            in ``backward``."""
            if self._filename is None:
                return 0
            if threading.get_ident() != self._thread:
                frame = sys._current_frames().get(self._thread)
            else:
                frame = caller if caller is not None else sys._getframe()
            while frame is not None:
                if frame.f_code.co_filename == self._filename:
                    return frame.f_lineno
                frame = frame.f_back
            return 0

        def _update_snap(self, u_type: Any, winfo: Any, old_mem_consumed: Any = None,
                         old_reftype: Any = None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            ledger = self.ledger(winfo.device)
            kind, key = u_type.name, id(winfo)
            if kind == "ADD":
                ledger.add(key, winfo.size * winfo.element_size, category_of(winfo.reftype.value))
            elif kind == "DEL":
                ledger.remove(key)
            elif kind == "SIZE":
                ledger.resize(key, winfo.size * winfo.element_size)
            elif kind == "REF":
                ledger.recategorize(key, category_of(winfo.reftype.value))

        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            # MemTracker raises on a second forward of a root module ("multiple iterative calls"); a
            # cell may loop over steps. A placeholder parent lets it take the call as a nested one: the
            # module's figures then cover every call.
            name = self._mod_tracker.get_known_fqn(module)
            again = (module in self.memory_tracking and not self._mod_tracker.is_bw
                     and set(self._mod_tracker.parents) - {name} == {"Global"})
            if again:
                self._mod_tracker.parents.add("<next call>")
            try:
                super()._pre_fw_hook(module, inputs)
            finally:
                if again:
                    self._mod_tracker.parents.discard("<next call>")
            stats = self.memory_tracking.get(module)
            if stats is not None:
                self._stats_by_fqn.setdefault(stats.mod_fqn, {})[id(stats)] = stats

        def _update_peak_stats(self, peak_state: Any) -> None:
            # MemTracker's own walks every module it has seen after every operator to find the running
            # ones (a weak-reference lookup each): O(operators x modules), most of the time of a GPT-2
            # prediction. The same update, visiting only the running modules through an index by name.
            current = self._curr_mem_snap
            for name in self._mod_tracker.parents:
                for stats in self._stats_by_fqn.get(name, {}).values():
                    if stats.mod_fqn != name or peak_state not in stats.snapshots:
                        continue
                    for device, snap in current.items():
                        if stats.local_peak.get(device, 0) < snap["Total"]:
                            stats.local_peak[device] = snap["Total"]
                            stats.snapshots[peak_state][-1][device] = copy.deepcopy(snap)
            for device, snap in current.items():
                if self._peak_mem.get(device, 0) < snap["Total"]:
                    self._peak_mem[device] = snap["Total"]
                    self._peak_mem_snap[device] = copy.deepcopy(snap)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            outer = self._now
            try:
                caller = sys._getframe(1)
            except ValueError:  # a device thread of the autograd engine: no Python frame below
                caller = None
            self._now = [_op_name(func), None, None, caller]
            try:
                out = super().__torch_dispatch__(func, types, args, kwargs)
                if self._on_matmul is not None and func.overloadpacket.__name__ in _MATMULS:
                    device = next((a.device for a in args if hasattr(a, "device")), None)
                    if device is not None:
                        self._on_matmul(self.ledger(device))
            finally:
                self._now = outer
            return out

    return Tracker


@functools.cache
def _op_name(func: Any) -> str:
    """An operator's name as the series shows it: 'aten.mm' (torch's operators live as long as torch)."""
    return str(func.overloadpacket)


def find_objects(values: Iterable[tuple]) -> list:
    """(path, object, kind) for the modules, optimizers and tensors in ``values`` ((name, value) pairs):
    the values themselves, or held in lists, tuples, dicts and user objects' attributes, up to 3 levels
    down; each object once."""
    found: list = []
    seen: set = set()

    def visit(path: str, obj: Any, depth: int) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        kind = kind_of(obj)
        if kind is not None:
            found.append((path, obj, kind))
        elif depth > 0 and isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj[:1000]):
                visit(f"{path}[{i}]", item, depth - 1)
        elif depth > 0 and isinstance(obj, dict):
            for key, item in list(obj.items())[:1000]:
                visit(f"{path}[{key!r}]", item, depth - 1)
        elif depth > 0 and _is_user_object(obj):
            for key, item in list(vars(obj).items())[:1000]:
                if isinstance(key, str) and not key.startswith("__"):
                    visit(f"{path}.{key}", item, depth - 1)

    for name, value in values:
        visit(name, value, _WALK_DEPTH)
    return found


def home_device(objects: Iterable[tuple]) -> str:
    """Where the cell's objects live (from :func:`find_objects`): the device of the first module's first
    parameter or buffer, or of the first tensor; 'cpu' when they hold none. ``--compare`` measures the
    step there and predicts it for the same device."""
    for _, obj, kind in objects:
        if kind == "module":
            found = next(itertools.chain(obj.parameters(), obj.buffers()), None)
        else:
            found = obj if kind == "tensor" else None
        if found is not None:
            return str(found.device)
    return "cpu"


def _is_user_object(obj: Any) -> bool:
    """An instance of a class from user code or a library (a ``Trainer``, a dataclass), whose
    attributes may hold models: not a class, function, module or builtin."""
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType,
                        types.BuiltinFunctionType)):
        return False
    return type(obj).__module__ not in ("builtins", "types") and type(getattr(obj, "__dict__", None)) is dict


def module_names(objects: Iterable[tuple]) -> dict:
    """``id(module) -> 'model.transformer.h.0'`` for every submodule of the modules found."""
    names: dict = {}
    for path, obj, kind in objects:
        if kind == "module":
            for sub, module in obj.named_modules(remove_duplicate=False):
                names.setdefault(id(module), f"{path}.{sub}" if sub else path)
    return names


def run_tracked(run: Callable[[], Any], objects: list, ledger_for: Callable[[str], Ledger],
                on_matmul: Optional[Callable[[Any], None]] = None, filename: Optional[str] = None) -> tuple:
    """Run ``run()`` under the tracker, the ``objects`` (from :func:`find_objects`) tracked as what the
    cell holds before it starts; ``filename`` is the cell's (as compiled), whose lines the ledgers'
    series name. Returns ``(ledgers by device, module rows by device, fqn -> name)``; the run's own
    exception propagates after everything is undone (the tracker's hooks, and the
    ``warnings.formatwarning`` torch's ModTracker replaces when a module is re-entered)."""
    tracker = tracker_class()(ledger_for, on_matmul, filename)
    tracker.track_external(*[obj for _, obj, _ in objects])
    saved_format = warnings.formatwarning
    try:
        with warnings.catch_warnings():
            # ModTracker's own notes on modules gone before their backward hook fires (a temporary
            # module, or one a cell drops): nothing the user can act on.
            warnings.filterwarnings("ignore", message="Module is None. Skipping")
            with tracker:
                tracker.start()
                run()
    finally:
        warnings.formatwarning = saved_format
        for ledger in tracker.ledgers.values():
            ledger.stop()
    names = module_names(objects)
    rows: dict = {}
    fqns: dict = {}
    for module, stats in list(tracker.memory_tracking.items()):
        name = names.get(id(module), stats.mod_fqn)
        fqns[stats.mod_fqn] = name
        for device in tracker.ledgers:
            rows.setdefault(device, []).append(_row(name, module, stats, device))
    for ledger in tracker.ledgers.values():
        ledger.series.name_modules(fqns)
        ledger.series.read_lines(filename)
    return tracker.ledgers, rows, fqns


def _row(name: str, module: Any, stats: Any, device: str) -> ModuleRow:
    """One module's :class:`~.cellmem.ModuleRow` on ``device`` from MemTracker's snapshots."""
    snaps = stats.snapshots

    def totals(state: Any) -> list:
        return [next((v.get("Total", 0) for d, v in snap.items() if str(d) == device), 0)
                for snap in snaps[state]]

    by = {state.name: totals(state) for state in snaps}
    pre_fw, post_fw, peak_fw = by.get("PRE_FW", []), by.get("POST_FW", []), by.get("PEAK_FW", [])
    pre_bw, peak_bw = by.get("PRE_BW", []), by.get("PEAK_BW", [])
    params = sum(p.numel() * p.element_size() for p in module.parameters(recurse=True)
                 if str(p.device) == device)
    return ModuleRow(
        name=name, type=type(module).__name__, params=params, calls=len(pre_fw),
        forward_peak=max((b - a for a, b in zip(pre_fw, peak_fw)), default=0),
        forward_kept=sum(b - a for a, b in zip(pre_fw, post_fw)),
        backward_peak=max((b - a for a, b in zip(pre_bw, peak_bw)), default=0))


def report(mode: str, device: str, how: str, ledger: Ledger, rows: list, fqns: dict,
           **extra: Any) -> CellMemory:
    """A :class:`~.cellmem.CellMemory` from one device's ledger and module rows."""
    return CellMemory(mode=mode, device=device, how=how, peak=ledger.peak, peak_phase=ledger.peak_phase,
                      peak_module=fqns.get(ledger.peak_module, ledger.peak_module),
                      phase_peaks=dict(ledger.phase_peaks), categories=dict(ledger.peak_categories),
                      before=ledger.baseline, after=ledger.end, after_categories=dict(ledger.end_categories),
                      reserved_peak=ledger.reserved_peak,
                      modules=rows, series=ledger.series, **extra)


def measure(run: Callable[[], Any], values: list, device: Optional[str], top: int,
            filename: Optional[str] = None) -> CellMemory:
    """The real run of a cell (compiled as ``filename``), tracked: ``values`` are the (name, object)
    pairs the cell uses. Reports ``device`` (default: the device with the highest peak, a GPU before the
    cpu on a tie) and, on a CUDA device, torch's own ``max_memory_allocated`` for the cell beside the
    tracked peak."""
    import torch

    objects = find_objects(values)
    before = _reset_peaks()
    start = time.perf_counter()
    ledgers, rows, fqns = run_tracked(
        run, objects, lambda name: Ledger(CachingAllocatorModel() if name.startswith("cuda") else None),
        filename=filename)
    seconds = time.perf_counter() - start
    chosen = device if device is not None else max(ledgers, key=lambda d: (ledgers[d].peak, d != "cpu"),
                                                   default="cpu")
    if chosen not in ledgers:  # 'cuda' matches 'cuda:0'; a device the run never used gets an empty ledger
        chosen = next((name for name in ledgers if name.split(":")[0] == chosen), chosen)
    ledger = ledgers.setdefault(chosen, Ledger())
    extra: dict = {"top": top, "seconds": seconds, "notes": [n for n in [version_note()] if n],
                   "other_devices": {d: led.peak for d, led in ledgers.items() if d != chosen}}
    if chosen in before:
        extra["torch_max_allocated"] = accelerators.peak(chosen)
        extra["torch_allocated_before"] = before[chosen]
    elif chosen.startswith("mps"):
        extra["notes"].append("torch keeps no peak on MPS (torch.mps has current and driver-allocated "
                              "memory only): the tracked peak is the one figure")
    if chosen.startswith("cuda"):
        extra["notes"].insert(0, f"allocated and reserved: every tensor through a model of "
                                 f"{ALLOCATOR_SOURCE}")
    extra["limits"] = ["memory the cell's objects held before it that the cell does not name; "
                       "what torch allocates outside tensors (cuBLAS/cuDNN workspaces, the CUDA context)"]
    how = f"torch's MemTracker on the real run ({torch.__version__})"
    return report("measured", chosen, how, ledger, rows.get(chosen, []), fqns, **extra)


def _reset_peaks() -> dict:
    """``{'cuda:0': allocated now}`` for each accelerator device torch has initialised in this process and
    keeps a peak for, whose peak counter is reset so that ``max_memory_allocated`` afterwards is the
    cell's; {} without one. (This changes what the user's own ``max_memory_allocated`` reports, as
    ``%gpumem`` does.)"""
    before = {}
    try:
        for kind in accelerators.initialised_kinds():
            for index in range(accelerators.device_count(kind)):
                if accelerators.reset_peak((kind, index)):
                    before[f"{kind}:{index}"] = accelerators.allocated((kind, index))
    except Exception:  # noqa: BLE001 - a scripted or broken backend: no allocator figures
        return {}
    return before
