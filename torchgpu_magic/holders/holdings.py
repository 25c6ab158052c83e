"""Who holds memory, by name: every storage a notebook keeps alive, counted once, under the first holder
that reaches it, in this order:

1. the user's names (``x``, ``model`` with its parameters, buffers and gradients apart, ``opt`` with its
   state; a list or an object holding tensors is one holder, under the name ``del`` would take);
2. IPython's output history (``Out[n]``, with ``_``, ``__``, ``___`` and ``_n`` as its other names);
3. the frames of a failed cell's traceback, by function and local name (``forward: attn``), which the
   traceback keeps alive through ``sys.last_traceback`` and IPython's own references; and those of every
   earlier failed cell a reference cycle through IPython's ``run_code`` frame still keeps alive (see
   :mod:`.failed`);
4. the autograd graphs those hold (``graph of total_loss``: the tensors saved for backward that a
   ``grad_fn`` reaches, see :mod:`.graphs`).

Objects are read through :func:`torchgpu_magic.placement.account`, the one accounting of an object's
tensors (storages once, each with its role). What :func:`collect` returns holds names, numbers and storage
keys, never an object: the walk keeps nothing once it returns. :mod:`.report` turns it into the
report for one device, with torch's cache and other processes beside the names.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Iterator, Mapping, Optional

from ..host import gc_paused
from ..placement import account, device_str, kind_of, storage_key
from ..placement.kinds import DEVICE_TEXT, device_order
from ..placement.walk import Walk
from ..torchapi import STORAGE_ID
from .failed import last_tracebacks
from .graphs import GraphWalk

FRAME_LIMIT = 200  # frames of one traceback looked into
LOCALS_LIMIT = 1_000  # locals of one frame
# Devices whose tensors hold no memory of their own: meta has no data, accelerate's 'disk' is a file.
_NO_MEMORY = ("meta", "disk")
# Frames of these packages are machinery (IPython's run_code, this package's hooks), never a holder.
_MACHINERY = ("IPython", "ipykernel", "torchgpu_magic")


class Holder:
    """One holder: its display ``name``, ``source`` ('name', 'output', 'traceback' or 'graph', in the order
    they claim storages), ``root`` (the user name, output or frame a graph belongs to; the holder's own
    name otherwise), ``what`` it is (a tensor's (dtype, shape), formatted only when shown), and per device the
    bytes first counted here, by role (``counted[device][role]``); ``shared[device]`` are bytes it holds
    that an earlier holder counts. A plain slotted class whose dicts are made on first use: a namespace of
    10,000 tensors makes 10,000 of them."""

    __slots__ = ("name", "source", "root", "what", "counted", "shared", "index", "dtypes", "scalar", "kind",
                 "library")

    def __init__(self, name: str, source: str, root: str, what: Any, index: int) -> None:
        self.name, self.source, self.root, self.what, self.index = name, source, root, what, index
        self.scalar = False  # a one-element tensor with a graph: a loss kept (or summed) as a tensor
        self.kind = ""  # 'tensor', 'module', 'optimizer' for one object; 'container' for several
        self.library = False  # a frame of torch's own (a module's _call_impl holding its input as args)
        self.counted: Optional[dict] = None
        self.shared: Optional[dict] = None
        self.dtypes: Optional[dict] = None  # device -> {dtype: bytes} of activations (mixed precision)

    def nbytes(self, device: str) -> int:
        return sum(self.counted.get(device, {}).values()) if self.counted else 0

    def parts(self, device: str) -> dict:
        return dict(self.counted.get(device, {})) if self.counted else {}

    def activations(self, device: str, dtype: Any) -> int:
        """Bytes of ``dtype`` counted here on ``device`` (kept for traceback and graph holders)."""
        return self.dtypes.get(device, {}).get(dtype, 0) if self.dtypes else 0


class Holdings:
    """Every storage reached, once: ``storages[key] = (device, bytes, first holder, role)``, the holder
    that counts it and its role there, and ``more[key]`` the holders reaching it after; the
    :class:`Holder` list in claiming order, and what the walks left out (``cut``)."""

    def __init__(self) -> None:
        self.storages: dict = {}
        self.more: dict = {}
        self.holders: list = []
        self.cut: list = []
        self.module_frames: list = []  # the traceback's own frames running a module's method ('Net.forward')

    def new(self, name: str, source: str, what: Any, root: Optional[str] = None) -> Holder:
        holder = Holder(name, source, root or name, what, len(self.holders))
        self.holders.append(holder)
        return holder

    def claim(self, holder: Holder, key: Any, device: str, role: str, size: int, dtype: Any = None) -> None:
        """Holder ``holder`` reaches storage ``key``: counted here if no one reached it before."""
        if device in _NO_MEMORY:
            return
        entry = self.storages.get(key)
        if entry is None:
            self.storages[key] = (device, size, holder.index, role)
            if holder.counted is None:
                holder.counted = {}
            roles = holder.counted.setdefault(device, {})
            roles[role] = roles.get(role, 0) + size
            if dtype is not None:
                if holder.dtypes is None:
                    holder.dtypes = {}
                kinds = holder.dtypes.setdefault(device, {})
                kinds[dtype] = kinds.get(dtype, 0) + size
        elif entry[2] != holder.index and holder.index not in self.more.get(key, ()):
            self.more.setdefault(key, []).append(holder.index)
            if holder.shared is None:
                holder.shared = {}
            holder.shared[device] = holder.shared.get(device, 0) + size

    def owners(self, key: Any) -> list:
        """Every holder of storage ``key``, the one counting it first."""
        return [self.storages[key][2], *self.more.get(key, ())]

    def devices(self) -> list:
        """Devices with memory counted, accelerators first."""
        return sorted({entry[0] for entry in self.storages.values()}, key=device_order)

    def freed_by(self, released: Any) -> dict:
        """{device: bytes} of the storages every holder of which is in ``released`` (holder indices):
        what letting go of those holders gives back."""
        out: dict = {}
        more = self.more
        for key, (device, size, first, _) in self.storages.items():
            if first in released and all(i in released for i in more.get(key, ())):
                out[device] = out.get(device, 0) + size
        return out


def release_groups(holdings: Holdings) -> list:
    """Per holder, what lets go of it: ('name', its user name) with the graph that name holds, or
    'output' / 'traceback' (with the graphs they hold)."""
    roots = {h.root: h.source for h in holdings.holders if h.source in ("name", "output", "traceback")}
    sources = [h.source if h.source != "graph" else roots.get(h.root, "name") for h in holdings.holders]
    return [("name", h.root) if source == "name" else source for h, source in zip(holdings.holders, sources)]


class Released:
    """What each release gives back on one device, from one pass over the storages (a pass per name
    would be quadratic in a namespace of 10,000 tensors): ``free`` the storages only the traceback and
    the output history hold (``traceback``, ``output``: those only one of them holds), ``alone[name]``
    those only ``name`` holds, ``with_free[name]`` those ``name`` holds with only the traceback or the
    output history besides."""

    def __init__(self, holdings: Holdings, device: str) -> None:
        groups = release_groups(holdings)
        only = {"output": 0, "traceback": 0}  # what only the output history / the traceback holds
        alone: dict = {}
        with_free: dict = {}
        free = 0
        more = holdings.more
        freeable = ("output", "traceback")
        for key, (where, size, first, _) in holdings.storages.items():
            if where != device:
                continue
            others = more.get(key)
            if others is None:  # one holder: the common case, kept short
                group = groups[first]
                if group.__class__ is tuple:
                    alone[group[1]] = alone.get(group[1], 0) + size
                else:
                    free += size
                    only[group] += size
                continue
            held = {groups[first], *(groups[i] for i in others)}
            names = held.difference(freeable)
            if not names:
                free += size
                if len(held) == 1:
                    only[groups[first]] += size
            elif len(names) == 1:
                name = next(iter(names))[1]
                table = alone if len(held) == 1 else with_free
                table[name] = table.get(name, 0) + size
        self.free, self.traceback, self.output = free, only["traceback"], only["output"]
        self.alone, self.with_free = alone, with_free


def _tensor(holdings: Holdings, holder: Holder, tensor: Any, role: str = "tensor",
            dtypes: bool = False) -> None:
    """Claim a tensor's storage (and its gradient's, for a leaf) for ``holder``, under placement's
    :func:`~torchgpu_magic.placement.storage_key` (the key accounts use, so a parameter reached through a
    model and through a frame or a graph is one storage); ``dtypes``: note the bytes by dtype
    (activations, for the mixed-precision advice)."""
    try:
        device = DEVICE_TEXT.get(tensor.device) or device_str(tensor.device)
    except (RuntimeError, TypeError, AttributeError):
        return
    key, size = storage_key(tensor)
    holdings.claim(holder, key, device, role, size, tensor.dtype if dtypes else None)
    if tensor.requires_grad and tensor.is_leaf:
        grad = tensor.grad
        if grad is not None:
            _tensor(holdings, holder, grad, "gradient")


def _object(holdings: Holdings, holder: Holder, obj: Any, kind: str) -> None:
    """Claim everything a module or optimizer holds, through its account (storages once, roles)."""
    acc = account(obj)
    if acc is None:
        return
    for key, (device, role, size) in acc.storages.items():
        holdings.claim(holder, key, device, role, size)
    if kind == "optimizer":  # it also keeps its parameters (and their gradients) alive
        for group in obj.param_groups:
            for param in group.get("params", ()):
                _tensor(holdings, holder, param, "parameter")


def _describe(found: list, root: str, value: Any) -> Any:
    """What a holder named ``root`` (bound to ``value``) is: a tensor's (dtype, shape), formatted when
    shown; 'Linear'; or for a container 'list: 3 tensors, 1 module'."""
    if len(found) == 1 and found[0][0] == root:
        name, obj, kind = found[0]
        return (obj.dtype, obj.shape) if kind == "tensor" else type(obj).__name__
    counts = Counter(kind for _, _, kind in found)
    parts = [f"{n:,} {kind}{'s' if n != 1 else ''}" for kind, n in counts.items()]
    return f"{type(value).__name__}: " + ", ".join(parts)


def _hold(holdings: Holdings, name: str, source: str, found: list, value: Any, graph_roots: list,
          root: Optional[str] = None, own: Optional[str] = None) -> Holder:
    """A holder shown as ``name`` (``root``: the name its graph is named after, ``own``: the name
    ``found`` is relative to; both ``name`` by default) for the (name, object, kind) ``found`` under
    ``value``: its storages claimed, its tensors with a ``grad_fn`` kept for the graph walk."""
    root = root or name
    own = own or root
    holder = holdings.new(name, source, _describe(found, own, value), root=root)
    single = len(found) == 1 and found[0][0] == own
    holder.kind = found[0][2] if single else "container"
    activations = source == "traceback"
    tensors = []
    for _, obj, kind in found:
        if kind == "tensor":
            _tensor(holdings, holder, obj, dtypes=activations)
            if obj.grad_fn is not None:
                tensors.append(obj)
        else:
            _object(holdings, holder, obj, kind)
    if tensors:
        graph_roots.append((holder, tensors))
        holder.scalar = single and tensors[0].numel() == 1
    return holder


def _names(ns: Mapping[str, Any], holdings: Holdings, graph_roots: list) -> set:
    """The user's names as holders, in namespace order (what one top-level name holds, in containers or
    attributes, is one holder: what ``del`` would free); returns the ids of their modules and optimizers."""
    walk = Walk(ns)
    held: set = set()
    holders = holdings.holders
    storages = holdings.storages
    devices = DEVICE_TEXT
    root, found = None, []
    for name, obj, kind in walk:  # the walk yields everything under one top-level name together
        plain = "[" not in name and "." not in name
        if plain and kind == "tensor":  # the common case, kept short: a name bound to a tensor
            if found:
                _hold(holdings, root, "name", found, ns.get(root), graph_roots)
                root, found = None, []
            holder = Holder(name, "name", name, (obj.dtype, obj.shape), len(holders))
            holder.kind = "tensor"
            holders.append(holder)
            device = devices.get(obj.device)
            if device is not None and device not in _NO_MEMORY and not obj.requires_grad:
                try:  # Holdings.claim for a tensor without gradient, inlined: 10,000 of them cost this loop
                    storage = obj.untyped_storage()
                    key = STORAGE_ID(storage)  # placement.storage_key's key, read inline
                except (RuntimeError, TypeError, NotImplementedError, AttributeError):
                    key = None
                if key is not None and key not in storages:
                    size = storage.nbytes()
                    storages[key] = (device, size, holder.index, "tensor")
                    holder.counted = {device: {"tensor": size}}
                    continue
            _tensor(holdings, holder, obj)
            if obj.grad_fn is not None:
                graph_roots.append((holder, [obj]))
                holder.scalar = obj.numel() == 1
            continue
        top = name if plain else name.split("[", 1)[0].split(".", 1)[0]
        if top != root:
            if found:
                _hold(holdings, root, "name", found, ns.get(root), graph_roots)
            root, found = top, []
        found.append((name, obj, kind))
        if kind != "tensor":
            held.add(id(obj))
    if found:
        _hold(holdings, root, "name", found, ns.get(root), graph_roots)
    holdings.cut.extend(walk.cut)
    return held


def _outputs(ns: Mapping[str, Any], holdings: Holdings, graph_roots: list) -> None:
    """``Out[n]`` entries holding tensors, modules or optimizers (one level into containers), with ``_``,
    ``__``, ``___`` as other names of the same entry or as holders of their own."""
    out = ns.get("Out")
    entries: list = []
    if isinstance(out, dict):
        entries.extend((f"Out[{k}]", value) for k, value in sorted(out.items(), key=lambda kv: str(kv[0])))
    entries.extend((name, ns[name]) for name in ("_", "__", "___") if name in ns)
    by_id: dict = {}
    for name, value in entries:
        if id(value) in by_id:
            by_id[id(value)][0].append(name)
            continue
        found = _placeables(name, value)
        if found:
            by_id[id(value)] = ([name], found, value)
    for names, found, value in by_id.values():
        label = names[0] + (f" (also {', '.join(names[1:])})" if len(names) > 1 else "")
        _hold(holdings, label, "output", found, value, graph_roots, root=names[0])


def _placeables(name: str, value: Any, depth: int = 2) -> list:
    """(name, object, kind) for ``value`` when it is a tensor, module or optimizer, else for those inside
    it (a list, tuple or dict, ``depth`` levels down; the first 1,000 items)."""
    kind = kind_of(value)
    if kind is not None:
        return [(name, value, kind)]
    if depth == 0 or type(value) not in (list, tuple, dict):
        return []
    items = list(value.items() if isinstance(value, dict) else enumerate(value))[:1_000]
    return [found for key, item in items for found in _placeables(f"{name}[{key!r}]", item, depth - 1)]


def holds_tensors(value: Any) -> bool:
    """Whether ``value`` is, or holds two levels into lists, tuples and dicts, a tensor, module or
    optimizer (an output history entry worth dropping)."""
    return bool(_placeables("", value))


def _frames(tracebacks: Iterable[Any]) -> Iterator[tuple]:
    """(frame, whether it is torch's) for the frames of each traceback (or exception: its own, and those
    of its ``__cause__`` and ``__context__`` chain), each once, skipping IPython's and this package's, and
    any that hides itself from tracebacks (a ``__tracebackhide__`` local)."""
    items = [item for item in tracebacks if item is not None]
    exceptions = [item for item in items if isinstance(item, BaseException)]
    tbs = [item for item in items if not isinstance(item, BaseException)]
    seen: set = set()
    done: set = set()
    while exceptions:
        exc = exceptions.pop(0)
        if id(exc) in done:
            continue
        done.add(id(exc))
        tbs.append(exc.__traceback__)
        exceptions.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
    mine: list = []
    torch_frames: list = []
    for tb in tbs:
        while tb is not None and len(mine) + len(torch_frames) < FRAME_LIMIT:
            frame = tb.tb_frame
            tb = tb.tb_next
            if id(frame) in seen:
                continue
            seen.add(id(frame))
            local_vars = frame.f_locals
            if local_vars is frame.f_globals:  # a cell's (module) frame: its names are the user's
                continue
            if local_vars.get("__tracebackhide__"):  # machinery by IPython's (and pytest's) own rule
                continue
            package = (frame.f_globals.get("__name__", "") or "").split(".")[0]
            if package not in _MACHINERY:
                (torch_frames if package == "torch" else mine).append(frame)
    # The user's own frames name what they hold first, innermost (where it failed) first; torch's frames
    # (a module's _call_impl holding its input as args) after them.
    yield from ((frame, False) for frame in reversed(mine))
    yield from ((frame, True) for frame in reversed(torch_frames))


def _traceback(tracebacks: Iterable[Any], holdings: Holdings, graph_roots: list, held: set) -> None:
    """Each local of each frame that holds a tensor, module or optimizer, as 'function: local'. A module
    or optimizer the user names is left to that name (``self`` in ``forward``)."""
    for frame, in_torch in _frames(tracebacks):
        function = frame.f_code.co_name
        local_vars = frame.f_locals
        if not in_torch and kind_of(local_vars.get("self")) == "module":
            holdings.module_frames.append(f"{type(local_vars['self']).__name__}.{function}")
        for local, value in list(local_vars.items())[:LOCALS_LIMIT]:
            found = [(n, o, k) for n, o, k in _placeables(local, value)
                     if not (k != "tensor" and id(o) in held)]
            if not found:
                continue
            holder = _hold(holdings, f"{function}: {local}", "traceback", found, value, graph_roots,
                           own=local)
            holder.library = in_torch
        local_vars = frame = None


def _graphs(holdings: Holdings, graph_roots: list, budget: int) -> None:
    """One 'graph of X' holder per holder X whose tensors have a ``grad_fn``: what their graphs saved."""
    for owner, tensors in graph_roots:
        if budget <= 0:
            holdings.cut.append((f"graph of {owner.root}", "the graph walk's node budget was spent"))
            continue
        walk = GraphWalk(tensors, budget)
        holder = holdings.new(f"graph of {owner.root}", "graph", "", root=owner.root)
        saved = 0
        for tensor in walk:
            saved += 1
            _tensor(holdings, holder, tensor, "saved", dtypes=True)
        budget -= walk.nodes
        holder.what = f"{saved:,} tensor{'s' if saved != 1 else ''} saved for backward, {walk.nodes:,} nodes"
        if walk.cut:
            holdings.cut.append((holder.name, f"stopped after {walk.nodes:,} nodes"))


def collect(ns: Mapping[str, Any], tracebacks: Iterable[Any] = (), graph_limit: int = 50_000) -> Holdings:
    """Every storage the namespace ``ns`` (a shell's user namespace, with its ``Out``), the frames of
    ``tracebacks`` (exceptions or traceback objects; ``sys.last_*`` are added) and the autograd graphs
    they hold keep alive, each counted once under the first holder reaching it. Reads only; the result
    holds names, numbers and storage keys, no object."""
    holdings = Holdings()
    graph_roots: list = []
    with gc_paused():
        try:
            held = _names(ns, holdings, graph_roots)
            _outputs(ns, holdings, graph_roots)
            _traceback(list(tracebacks) + last_tracebacks(), holdings, graph_roots, held)
            _graphs(holdings, graph_roots, graph_limit)
        finally:
            graph_roots.clear()
    return holdings
