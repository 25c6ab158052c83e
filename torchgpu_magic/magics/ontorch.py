"""``%%ontorch``: run a cell, or the rest of the session, on a chosen device."""
from __future__ import annotations

import functools
import sys
from itertools import compress
from operator import ne
from types import CodeType
from typing import Any, Optional

from IPython.core.error import UsageError
from IPython.core.magic import line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..errors import MagicInputError
from .base import MagicsPart, TorchGPUMagics, parse_args, usage_errors
from .shell import ends_with_semicolon, register_cell, show

# type -> whether the footer watches its instances for in-place changes (modules, optimizers, containers)
_HELD_TYPE: dict = {}
_IPYTHON = frozenset({"In", "Out", "exit", "quit", "get_ipython"})  # IPython's own names: never the user's


def _rebound(keys: list, ids: list, ns: dict) -> set:
    """The names of ``ns`` that are new or bound to another object than ``keys`` / ``ids`` (the
    namespace's names and their objects' ids before a cell) say. By position at C speed when the cell
    only added names, which is what cells do; by name otherwise."""
    now_keys, now_ids = list(ns), list(map(id, ns.values()))
    if now_keys[:len(keys)] == keys:
        names = set(compress(now_keys, map(ne, now_ids, ids)))
        names.update(now_keys[len(keys):])
        return names
    before = dict(zip(keys, ids))
    return {name for name, obj_id in zip(now_keys, now_ids) if before.get(name) != obj_id}


def _top_name(name: str) -> str:
    """The namespace name an entry of a snapshot sits under: ``batch`` for ``batch[0]`` or ``d['w']``."""
    return name.split("[", 1)[0].split(".", 1)[0]


def _renamed(code: Any, filename: str) -> Any:
    """``code`` under ``filename``, with the code objects it holds (functions, lambdas, comprehensions
    defined in the cell): a cell's code run again under its new cell number, for its tracebacks."""
    if code.co_filename == filename:
        return code
    consts = tuple(_renamed(const, filename) if isinstance(const, CodeType) else const
                   for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


@magics_class
class OnTorchMagics(MagicsPart):
    """``%%ontorch`` and ``%ontorch``: the device context comes from :mod:`torchgpu_magic.devices`; this
    class runs the cell body, moves what ``--move`` names, prints the footer, and keeps the line form's
    saved state for ``--reset``."""

    def __init__(self, shell: Any, owner: TorchGPUMagics) -> None:
        super().__init__(shell, owner)
        self._saved: Any = None  # devices.DeviceState from before the line form's first change
        self._setting = ""  # what the line form set, for `%ontorch` with no argument
        self._depth = 0  # how many %%ontorch cells are running (nested ones included)
        self._codes: dict = {}  # (cell source, compiler flags) -> its compiled code: see _compile
        self._footer_caches: Any = None  # (before, after) placement.SnapshotCache of the footer

    @magic_arguments()
    @argument("spec", nargs="?", default=None,
              help="device: auto, local (the GPU of this engine's local rank), cpu, cuda, cuda:N, mps, xpu, "
                   "xpu:N or meta")
    @argument("--fallback", metavar="DEVICE", default=None,
              help="run on DEVICE (and say so) when SPEC is not available here")
    @argument("--dtype", metavar="NAME", default=None,
              help="default floating dtype: float16, bfloat16, float32 or float64")
    @argument("--move", metavar="NAME[,NAME...]", default=None,
              help="move these tensors / modules / optimizers' state to the device first")
    @argument("--discard-data", action="store_true",
              help="let --move take objects to meta, which keeps their shapes and drops their values")
    @argument("-q", "--quiet", action="store_true", help="no footer or move report")
    @argument("--reset", action="store_true",
              help="line form: undo %%ontorch SPEC, restoring the default device and dtype from before")
    @argument("--cluster", nargs="?", const="", default=None, metavar="NAME",
              help="with SPEC local, line form: tell each engine of the ipyparallel Client/view or Dask "
                   "Client NAME its order on its host, and show what local picks on each")
    @line_cell_magic
    @usage_errors
    def ontorch(self, line: str = "", cell: Optional[str] = None) -> Any:
        """Run a cell on a chosen device without editing it (``%%ontorch SPEC``), or make SPEC the kernel's
        default (``%ontorch SPEC``, until ``%ontorch --reset``; ``%ontorch`` alone says what is set). What it
        changes is put back however the cell ends; a footer names what the cell left on another device.

        Reference: https://github.com/torchgpu-magic/torchgpu-magic/blob/main/docs/ontorch.md
        """
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of a cell's traceback
        try:
            run = self._prepare(line, cell)
        except MagicInputError as exc:
            raise UsageError(f"{'%%' if cell is not None else '%'}ontorch: {exc}") from None
        except UsageError as exc:  # the cell form's errors name the cell magic
            if cell is not None and str(exc).startswith("%ontorch:"):
                raise UsageError("%" + str(exc)) from None
            raise
        return run() if run is not None else None

    def _prepare(self, line: str, cell: Optional[str]) -> Any:
        """Validate the options and do what needs no cell; return the cell's run (a callable) or None.
        Every refusal happens here, before anything changes."""
        from .. import devices

        args = parse_args(self.ontorch, line)
        if args.cluster is not None:
            return self._cluster(args, cell)
        if cell is None and args.spec is None and not args.reset:
            if args.fallback or args.dtype or args.move or args.quiet:
                raise UsageError("%ontorch: options need a device: %ontorch SPEC [options]")
            print(self._status())
            return None
        if args.reset:
            if cell is not None or args.spec or args.fallback or args.dtype or args.move:
                raise UsageError("%ontorch: --reset stands alone, as the line magic: %ontorch --reset")
            self._reset(report=not args.quiet)
            return None
        if args.spec is None:
            here = ", ".join(devices.available_devices())
            raise UsageError(f"%ontorch: which device? %%ontorch SPEC [options]; devices here: {here}, auto")
        if cell is None and self._depth:
            raise UsageError("%ontorch: SPEC inside a %%ontorch cell would be undone when the cell ends; "
                             "run it in a cell of its own")
        magic = "%ontorch" if cell is None else "%%ontorch"
        device, note = self._device(args.spec, args.fallback, magic)
        dtype = devices.parse_dtype(args.dtype) if args.dtype is not None else None
        targets = self._targets(args.move)
        if args.discard_data and not targets:
            raise UsageError("%ontorch: --discard-data goes with --move NAME,...")
        if cell is None:
            moved = self._move(targets, device, args.discard_data)
            if note:
                print(note)
            self._report_move(moved, device, args.quiet, magic)
            self._set_default(device, dtype, line)
            if not args.quiet:
                print(f"%ontorch: torch's default device is now {device}"
                      f"{f', default dtype {args.dtype}' if dtype is not None else ''}"
                      " (undo with %ontorch --reset)")
            return None
        if note:
            print(note)
        return functools.partial(self._run_cell, cell, line, device, dtype, targets, args.quiet,
                                 args.discard_data)

    def _cluster(self, args: Any, cell: Optional[str]) -> None:
        """``%ontorch local --cluster [NAME]``: each engine learns its order among the engines on its
        host (used by ``local`` where no launcher variable gives a local rank); shows what local picks."""
        from .. import cluster

        if cell is not None or (args.spec or "").strip().lower() != "local" or args.move or args.dtype \
                or args.fallback or args.reset:
            raise UsageError("%ontorch: --cluster goes with the line form and SPEC local only: "
                             "%ontorch local --cluster [NAME]; then %%px %%ontorch local on the engines")
        assignment = cluster.local_devices(self.cluster_bridge(args.cluster))
        show(assignment, quiet=args.quiet)

    def _device(self, spec: str, fallback: Optional[str], magic: str) -> tuple:
        """Resolve SPEC (and always validate --fallback); (device, one-line note or '')."""
        from .. import devices

        try:
            backup = devices.resolve(fallback) if fallback is not None else None
        except MagicInputError as exc:
            raise UsageError(f"%ontorch: --fallback: {exc}") from None
        try:
            if spec.strip().strip("'\"").lower() == "local":
                device, how = devices.local_device()
                return device, f"%ontorch local: {how}"
            return devices.resolve(spec), ""
        except devices.DeviceUnavailable as exc:
            if backup is None:
                raise
            reason = devices.without_device_list(str(exc))
            return backup, f"{magic}: {reason}; running on {backup} instead (--fallback)"

    def _targets(self, move: Optional[str]) -> list:
        """Validate --move NAME[,NAME...] against the namespace: [(name, kind)]; nothing moves here."""
        from .. import devices
        from ..placement import kind_of, moves

        if move is None:
            return []
        names = [name.strip() for name in move.split(",")]
        if not all(name.isidentifier() for name in names):
            raise UsageError(f"%ontorch: --move '{devices.shown(move)}': give variable names separated by "
                             "commas: --move model,x")
        ns = self.shell.user_ns
        missing = [name for name in names if name not in ns]
        if missing:
            raise UsageError(f"%ontorch: --move: no variable named {', '.join(missing)} "
                             "(give names of tensors, nn.Modules or optimizers)")
        targets = []
        for name in dict.fromkeys(names):
            kind = kind_of(ns[name])
            if kind is None:
                raise UsageError(f"%ontorch: --move: {moves.not_movable(name, ns[name])}")
            targets.append((name, kind))
        return targets

    def _move(self, targets: list, device: Any, discard_data: bool) -> list:
        """Move the validated targets, all or nothing (:func:`torchgpu_magic.placement.moves.move`), and
        bind the new objects; [(name, kind, bytes, note)]. A refusal or failure raises MagicInputError,
        nothing moved."""
        if not targets:
            return []
        from ..placement import moves

        ns = self.shell.user_ns
        kinds = dict(targets)
        moved = moves.move([(name, ns[name]) for name, _ in targets], device, discard_data, ns)
        for name, obj, _, _ in moved:
            ns[name] = obj
        return [(name, kinds[name], nbytes, note) for name, _, nbytes, note in moved]

    @staticmethod
    def _report_move(moved: list, device: Any, quiet: bool, magic: str) -> None:
        """One line naming what moved and how many bytes."""
        if not moved or quiet:
            return
        from ..render import fmt_bytes

        parts = [f"{name} ({kind}, {fmt_bytes(nbytes)}{'; ' + note if note else ''})" if nbytes
                 else f"{name} (already there)" for name, kind, nbytes, note in moved]
        total = sum(nbytes for _, _, nbytes, _ in moved)
        print(f"{magic}: moved to {device}: {', '.join(parts)}; {fmt_bytes(total)} in all")

    def _set_default(self, device: Any, dtype: Any, line: str) -> None:
        """The line form: change the kernel's default, remembering the first state for --reset."""
        from .. import devices

        if self._saved is None:
            self._saved = devices.current_state()
        self.add_closer(self._reset)  # once: a closer already waiting is not added again
        devices.apply(device, dtype, self._saved)
        self._setting = f"set by %ontorch {' '.join(line.split())}"

    def _reset(self, report: bool = False) -> None:
        """Undo the line form: restore the default device, dtype and current device from before it."""
        saved, self._saved, self._setting = self._saved, None, ""
        if saved is not None:
            saved.restore()
        if report:
            from .. import devices

            done = "restored; " if saved is not None else "nothing to reset; "
            print(f"%ontorch: {done}torch's default device is {devices.default_device()}")

    def _status(self) -> str:
        """What ``%ontorch`` alone prints: the default device and who set it, the dtype, what auto is."""
        import torch

        from .. import devices

        how = self._setting or "torch's own default"
        dtype = str(torch.get_default_dtype()).replace("torch.", "")
        here = ", ".join(devices.available_devices())
        return (f"%ontorch: default device {devices.default_device()} ({how}), default dtype {dtype}; "
                f"auto here is {devices.resolve('auto')}; devices here: {here}")

    def _run_cell(self, cell: str, line: str, device: Any, dtype: Any, targets: list,
                  quiet: bool, discard_data: bool) -> Any:
        """Run the cell body under ``devices.use_device``; print the footer after a clean run."""
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of a cell's traceback
        from .. import devices, placement

        ns = self.shell.user_ns
        compiled = self._compile(cell, line)  # first: a syntax error moves and changes nothing
        if not quiet:  # footer: what the cell binds anew, and the insides of models and containers
            if self._footer_caches is None:  # one each: alternating mappings would make one start over
                self._footer_caches = (placement.SnapshotCache(), placement.SnapshotCache())
            codes = [code for code in compiled[:2] if code is not None]
            watch = placement.names_bound(codes, compiled[2], ns)
            if watch is not None:
                watch.update(name for name, _ in targets)
            keys, ids, held = self._watched(ns, watch)
            before = placement.namespace_snapshot(held, self._footer_caches[0])
        self._depth += 1
        try:
            with devices.use_device(device, dtype):
                try:
                    moved = self._move(targets, device, discard_data)
                except MagicInputError as exc:
                    raise UsageError(f"%%ontorch: {exc}") from None
                self._report_move(moved, device, quiet, "%%ontorch")
                value = self._run(*compiled[:2])
        finally:
            self._depth -= 1
        if not quiet:
            if watch is None:
                names = _rebound(keys, ids, ns)
            else:
                names = {name for name, obj_id in zip(keys, ids) if name in ns and id(ns[name]) != obj_id}
            names.update(held)  # the names bound anew, and what may have changed in place
            touched = {name: ns[name] for name in ns.keys() & names}  # the few names, not the namespace
            changes = placement.changed_elsewhere(before, touched, device, self._footer_caches[1])
            if len(changes) > 1:  # listed in the namespace's order: a walk of its names, only when it shows
                position = {name: i for i, name in enumerate(ns)}
                changes.sort(key=lambda placed: position.get(_top_name(placed.name), len(position)))
            line = placement.footer_line(device, changes, ns, cell)
            sys.stdout.write(line + "\n")  # one write, where print makes two
        return value

    def _watched(self, ns: dict, watch: Optional[set]) -> tuple:
        """What the footer notes before the cell: (names, their objects' ids, the held ones by name).

        ``watch`` (from :func:`~torchgpu_magic.placement.names_bound`) is the names the cell can bind or
        change; None means any, and then the whole namespace is read, in one pass. After a busy cell the
        namespace's objects are out of the CPU's caches, and touching one costs more than the Python
        work on it (about 0.2 us a name, measured), which is why the few names a cell mentions are read
        rather than all of them whenever that is enough. Names the cell binds that did not exist yet
        have no id here, so they count as bound anew after it."""
        if watch is None:
            keys, values = list(ns), list(ns.values())
        else:
            keys = list(watch)
            values = list(map(ns.get, keys))
        ids = list(map(id, values))
        held = self._held(keys, values)
        return keys, ids, held

    @staticmethod
    def _held(keys: list, values: list) -> dict:
        """Names bound to modules, optimizers or containers: objects a cell can change in place.

        The footer snapshots only these before the cell, and after it only these plus the names the
        cell bound anew (an id check), instead of the whole namespace twice: a full snapshot costs about
        2 us per tensor, which in a namespace of hundreds of tensors was most of %%ontorch's overhead.
        """
        import torch

        kinds = (torch.nn.Module, torch.optim.Optimizer, list, tuple, dict)
        types = list(map(type, values))
        try:
            try:
                flags = list(map(_HELD_TYPE.__getitem__, types))  # at C speed, per type cached
            except KeyError:  # a type not seen yet
                for typ in set(types).difference(_HELD_TYPE):
                    _HELD_TYPE[typ] = issubclass(typ, kinds)
                flags = list(map(_HELD_TYPE.__getitem__, types))
        except TypeError:  # an unhashable metaclass: ask each object
            return {name: obj for name, obj in zip(keys, values)
                    if name[:1] != "_" and isinstance(obj, kinds)}
        found = compress(zip(keys, values), flags)
        return {name: obj for name, obj in found if name[:1] != "_" and name not in _IPYTHON}

    def _stock(self, cell: str) -> bool:
        """True when IPython's transforms would leave ``cell`` as it is: no extension added transforms
        and the body has none of the characters they act on (``%``, ``!``, ``?``). Tokenizing a long
        body a second time (IPython already did so for the magic's cell) is otherwise the largest part
        of what the magic adds to a fast cell."""
        shell = self.shell
        manager = shell.input_transformer_manager
        own = "IPython.core.inputtransformer2"
        return (
            not shell.input_transformers_post
            and not any(char in cell for char in "%!?")
            and all(
                getattr(t, "__module__", "") == own
                for t in [*manager.cleanup_transforms, *manager.line_transforms, *manager.token_transformers]
            )
        )

    def _compile(self, cell: str, line: str) -> tuple:
        """Compile ``cell`` the way a cell is compiled: IPython's transforms, and tracebacks that show the
        cell's own lines and number; (the body's code, the last expression's code or None when the cell
        shows no value, the transformed source).

        The body is compiled once and executed by :meth:`_run` rather than through a nested ``run_cell``,
        so an exception propagates to the enclosing cell (which shows it as usual and stops "Run all"),
        and so ``%%time`` / ``%%cudatime`` around or inside it work as they do on any cell.

        A cell run again (notebooks re-run the same cells) is not compiled again: without IPython AST
        transformers its code depends only on its text and the compiler's flags, so the code objects of
        its first run serve, under the file name of this run (:func:`_renamed`). Building Python's AST
        objects and compiling from them costs more than the rest of what the magic adds to a fast cell
        (320 us on the benchmark's cell). A cell kept is kept with the text its code was compiled from.
        """
        import ast

        shell = self.shell
        # One comment line in place of the magic's line keeps traceback line numbers those of the cell.
        header = f"# %%ontorch {line}\n"
        stock = self._stock(cell)
        source = header + (cell if stock else shell.transform_cell(cell))
        plain = not shell.ast_transformers
        key = (source, shell.compile.flags)
        kept = self._codes.get(key) if plain else None
        if kept is not None:  # its source: the cleaned-up text when the cell needed IPython's cleanup
            code, last, source = kept
            filename = register_cell(shell, source)
            return _renamed(code, filename), last and _renamed(last, filename), source
        try:
            tree = shell.compile.ast_parse(source)
        except SyntaxError:
            if not stock:
                raise
            # indented, or prompts pasted in: IPython's cleanup transforms decide, and report errors
            source = header + shell.transform_cell(cell)
            tree = shell.compile.ast_parse(source)
        filename = register_cell(shell, source)
        tree = shell.transform_ast(tree)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = "\n".join(source.splitlines()[tree.body[-1].lineno - 1:])
            if not ends_with_semicolon(tail):
                last = shell.compile(ast.Expression(tree.body.pop().value), filename, "eval")
        code = shell.compile(tree, filename, "exec")
        if plain:
            if len(self._codes) >= 64:
                self._codes.clear()
            self._codes[key] = (code, last, source)
        return code, last, source

    def _run(self, code: Any, last: Any) -> Any:
        """Run the compiled cell in the user namespace; the last expression's value, or None."""
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of a cell's traceback
        ns = self.shell.user_ns
        exec(code, ns)
        return eval(last, ns) if last is not None else None
