"""The mixed-device diagnosis: recognise torch's device-mismatch errors (current and older wordings),
name the tensors and modules the failing line and cell used, with their devices, and the line that
fixes it.

Names are resolved statically (no code runs) and the diagnosis keeps strings only, not the frames
or the objects.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..caches import cache
from ..placement import device_str, devices_of, dtype_str, kind_of, shape_str
from ..placement.walk import static_attr
from ..render import Lines, Report, Reportable
from .failing import FailingLine, line_of, user_frames

_D = r"([a-z]+(?::\d+)?)"  # a device as torch prints it: cpu, cuda:0, mps:0, meta, xla:0
_T = r"([\w:.\[\]]+)"  # a legacy type string: torch.cuda.FloatTensor, Variable[...], MPSFloatType, float
_SDPA = (rf"Expected query, key, and value to have the same device type, but got query\.device: {_D},? "
         rf"key\.device: {_D},? and value\.device: {_D}")
# torch's wordings of "these tensors are on different devices", from v0.3 to today, with the groups that
# name the devices (tests/device_error_wordings.py lists each wording with where it came from). The first
# pattern that matches decides, so the specific forms come before the general ones. ``True`` marks a pair
# of *types*: the same words report a dtype mismatch, so it counts only when the two types name two
# different known devices.
_MISMATCH = [
    # the common-device check, v1.7+ (TensorIterator, dispatcher, FakeTensor, torch.compile)
    (rf"Expected all tensors to be on the same device, but found at least two devices, {_D} and {_D}", False),
    (rf"Expected all tensors to be on the same device, but got \w+ is on {_D}, different from other tensors "
     rf"on {_D}", False),
    (r"[Ee]xpected all tensors to be on the same device\. Found: ((?:[a-z]+(?::\d+)?(?:, | and )?)+)", False),
    (r"Expected all tensors to be on the same device\. addmm:? expected '\w+' to be (?:a )?(CPU|CUDA)\b"
     r"[^,]*, but got (?:a |tensor on )?([A-Za-z]+(?::\d+)?)", False),
    (r"Expected all tensors to be on the same (?:common )?device", False),
    # Python references (_prims_common, _refs)
    (rf"Tensor on device {_D} is not on the expected device {_D}", False),
    (rf"Expected divisor \(b\) to be on the same device \({_D}\) as dividend \(a\), but it is found on {_D}",
     False),
    (rf"Attempting to copy from device {_D} to device {_D}, but cross-device copies are not allowed", False),
    (rf"[Ii]nput tensors must all be on the same device\. Input 0 is on device {_D} and input \d+ is on "
     rf"device {_D}", False),
    # FakeTensor, v2.0-v2.5
    (rf"Unhandled FakeTensor Device Propagation for \S+, found two different devices {_D}, {_D}", False),
    # legacy type / backend strings, v0.3-v1.5
    (rf"Expected object of type {_T} but found type {_T}", True),
    (r"Expected object of backend (\w+) but got backend (\w+)", True),
    (r"Expected object of device type (\w+) but got device type (\w+)", True),
    (r"expected backend (\w+) and dtype \w+ but got backend (\w+) and dtype \w+", True),
    (rf"expected device {_D} and dtype \w+ but got device {_D} and dtype \w+", True),
    (rf"expected device '?{_D}'? but got (?:device )?'?{_D}'?", False),
    (rf"reduce_op\(\): expected input and both outputs to be on same device, but input is on {_D}, output1 "
     rf"is on {_D} and output2 is on ?{_D}", False),
    (r"to have the same device as tensor for .*?; but device (-?\d+) does not equal (-?\d+)", False),
    (r"Tensor for (?:argument #\d+ )?'\w+' is on (CPU|GPU), (?:Tensor for (?:argument #\d+ )?'\w+' is on "
     r"(?:CPU|GPU), )?but expected (?:it|them) to be on (CPU|GPU)", False),
    (rf"[Aa]ll input tensors must be on the same device\. Received {_D} and {_D}", False),
    (rf"all input tensors and out must be on the same device, but inputs are on {_D} and out is on {_D}",
     False),
    (r"sparse_mask: arguments are located on different devices; self is on device (-?\d+), mask is on "
     r"device (-?\d+), out is on device (-?\d+)", False),
    (r"located on different (?:GPUs|devices)", False),
    # RNN / LSTM / GRU
    (rf"Input and (?:parameter|hidden) tensors are not at the same device, found input tensor at {_D} and "
     rf"(?:parameter|hidden) tensor at {_D}", False),
    # scaled_dot_product_attention (C++ and Python forms; the Python one is a ValueError)
    (_SDPA, False),
    # indexing
    (rf"self, index and (?:source|out) expected to be in the same device, but got "
     rf"(?:\(self\) |self\.device = ){_D}, (?:\(index\) |index\.device = ){_D}, and "
     rf"(?:\(source\) |source\.device = |out\.device = ){_D}", False),
    (rf"indices should be either on cpu or on the same device as the indexed tensor \({_D}\)", False),
    (rf"expected self and (?:mask|out) to be on the same device, but got (?:mask|out) on {_D} and self on "
     rf"{_D}", False),
    (r"masked_fill_: Expected inputs to be on same device", False),
    # convolution and MPS
    (rf"Input type \({_T}\) and (?:weight|bias) type \({_T}\) should be the same", True),
    (rf"input\(device='{_D}'\) and weight\(device={_D}'\)\s+must be on the same device", False),
    (rf"Tensor for argument \w+ is on {_D} but expected on {_D}", False),
    (r"Placeholder storage has not been allocated on MPS device", False),
    # DataParallel
    (rf"module must have its parameters and buffers on device {_D} \(device_ids\[0\]\) but found one of "
     rf"them on device: {_D}", False),
    # other kernels' own checks
    (rf"expected (?:\w+ and \w+|both inputs) to be on (?:the )?same device, but (?:\w+ )+is on {_D} and "
     rf"(?:\w+ )+is on {_D}", False),
    (rf"Expected b and A to be on the same device, but found b on {_D} and A on {_D}", False),
    (rf"Expected \w+ and input tensors to be on the same device, but got \w+ on {_D} and input on {_D}",
     False),
    (rf"multi_dot\(\): all tensors must be on the same device but tensor 0 is on {_D} and tensor \d+ on "
     rf"{_D}", False),
    (rf"Expected the output and input tensors to be on the same device, but got the output tensor on {_D}, "
     rf"(?:input tensor a|the 'input' tensor) on {_D}, and (?:input tensor b|the 'other' tensor) on {_D}",
     False),
    (rf"torch\.gradient expected each tensor to be on the same device, but got devices {_D} and {_D}", False),
    (rf"stft input and window must be on the same device but got self on {_D} and window on {_D}", False),
    (rf"\w+ and \w+ must have the same device type\. \w+: {_D} \w+: {_D}", False),
    (rf"should have same device type, but got \w+ tensor device type {_D} and input value tensor device "
     rf"type {_D}", False),
    (rf"Expected condition, x and y to be on the same device, but condition is on {_D} and x and y are on "
     rf"{_D} and {_D}", False),
    (r"Expected a '(\w+)' device type for generator but found '(\w+)'", False),
    (r"must have the same device\b|expects all tensors to have the same device|must be on the same device "
     r"as the input tensor|Tensors of the same index must be on the same device", False),
]
_KNOWN = {"cpu", "cuda", "mps", "meta", "xpu", "xla", "hip", "hpu", "mtia", "ipu", "lazy", "privateuseone"}
_WORDS = {"CPU": "cpu", "GPU": "cuda", "CUDA": "cuda", "MPS": "mps", "XPU": "xpu", "Meta": "meta"}


def _device_of_token(token: str) -> Optional[str]:
    """One device from a captured token, or None where it names none (a bare dtype such as 'float'):
    '1' (a CUDA index) is 'cuda:1', 'torch.cuda.FloatTensor' / 'Variable[...]' are 'cuda' / 'cpu',
    'MPSFloatType' is 'mps', 'CPU' / 'GPU' are 'cpu' / 'cuda', 'cuda:0' stays itself."""
    if re.fullmatch(r"-?\d+", token):
        return "cpu" if token == "-1" else f"cuda:{token}"
    legacy = re.fullmatch(r"(?:Variable\[)?torch\.(cuda\.)?[\w.]+?\]?", token)
    if legacy:
        return "cuda" if legacy.group(1) else "cpu"
    backend = re.fullmatch(r"(?:Sparse)?(CPU|CUDA|MPS|XPU|Meta|HIP)\w*Type", token)
    if backend:
        return _WORDS.get(backend.group(1), backend.group(1).lower())
    if token in _WORDS:
        return _WORDS[token]
    if re.fullmatch(r"[a-z]+(?::\d+)?", token) and token.split(":")[0] in _KNOWN:
        return token
    return None


@cache
def _patterns() -> list:
    """:data:`_MISMATCH` compiled (on the first error, not at import)."""
    return [(re.compile(p), pair) for p, pair in _MISMATCH]


def mismatch_devices(exc: BaseException) -> Optional[tuple]:
    """The devices a device-mismatch error names, each once in the order named (``()`` when it names
    none), or None when ``exc`` is not one. Recognises torch's wordings from v0.3 to today (a
    RuntimeError, or the ValueError of scaled_dot_product_attention's Python check); the type-pair
    wordings ("Input type (A) and weight type (B) should be the same") count only when the two types
    are on different devices, since the same words report a dtype mismatch."""
    if not isinstance(exc, (RuntimeError, ValueError)):
        return None
    text = str(exc)
    for pattern, pair in _patterns():
        found = pattern.search(text)
        if found is None:
            continue
        if isinstance(exc, ValueError) and pattern.pattern != _SDPA:
            return None
        tokens = [t for g in found.groups() if g is not None for t in re.split(r", | and ", g) if t]
        devices = [_device_of_token(t) for t in tokens]
        if pair and (None in devices or len(set(devices)) < 2):
            return None
        return tuple(dict.fromkeys(device for device in devices if device is not None))
    return None


@dataclass(frozen=True)
class Culprit:
    """A name the failing cell used, and where its object lives (strings only). ``where`` is 'line'
    (the user's failing line), 'inside' (the line that raised, in a function or ``forward`` it called)
    or 'cell' (elsewhere in the cell)."""

    name: str
    kind: str
    devices: tuple
    summary: str
    where: str


@dataclass(repr=False)
class Diagnosis(Reportable):
    """What a device-mismatch error involved: the names on the user's failing line (and, when it
    raised inside a function or ``forward`` defined in a cell, on the line that raised there) and in
    the cell, their devices, and the lines that fix it on the user's line. Strings only."""

    devices: tuple
    line: str
    lineno: Optional[int]
    culprits: list
    fixes: list
    inner_line: str = ""
    inner_lineno: Optional[int] = None
    inner_function: str = ""

    def lines(self) -> list:
        devices = f" ({', '.join(self.devices)})" if self.devices else ""
        out = [f"whereis: a device mismatch{devices}: the tensors of one operation must be on one device.",
               *FailingLine(self.line, self.lineno).lines()]
        groups = [("  used there:", "line")]
        if self.inner_line:
            groups.append((f"  inside {self.inner_function}(), line {self.inner_lineno}: "
                           f"{self.inner_line.strip()}", "inside"))
        groups.append(("  elsewhere in the cell:", "cell"))
        for title, where in groups:
            group = [c for c in self.culprits if c.where == where]
            if not group and where != "inside":
                continue
            out.append(title)
            if group:
                width = max(len(c.name) for c in group)
                for c in group:
                    out.append(f"    {c.name.ljust(width)}  {'+'.join(c.devices) or '-':<10}  {c.summary}")
        return out + ["Fix: " + fix for fix in self.fixes]

    def report(self) -> Report:
        """The lines, preformatted in HTML: the culprits' columns keep their alignment."""
        return Report([Lines(self.lines(), pre=True)])

    def to_dict(self) -> dict:
        return {"devices": list(self.devices), "line": self.line, "lineno": self.lineno,
                "inner_line": self.inner_line, "inner_lineno": self.inner_lineno,
                "inner_function": self.inner_function,
                "culprits": [dict(c.__dict__, on_failing_line=c.where == "line") for c in self.culprits],
                "fixes": list(self.fixes)}


def _name_chains(source: str) -> list:
    """Dotted names (``x``, ``model.encoder``, ``self.fc``) in ``source``, in order, without strings
    and comments; IPython syntax that does not tokenize falls back to a regular expression."""
    import io
    import tokenize

    chains: list = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", source)
    current: list = []
    expect_name = True
    for tok in tokens:
        if tok.type == tokenize.NAME and expect_name:
            current.append(tok.string)
            expect_name = False
        elif tok.type == tokenize.OP and tok.string == "." and current and not expect_name:
            expect_name = True
        else:
            if current:
                chains.append(".".join(current))
            current, expect_name = [], True
            if tok.type == tokenize.NAME:
                current, expect_name = [tok.string], False
    return chains  # the last chain was closed by the ENDMARKER token that ends every tokenization


# How deep and how wide a name used on the failing line is looked into for tensors (``batch['x']``,
# ``inputs[0][1]``): enough for the batches users pass, bounded so a huge list costs nothing.
_ITEMS_DEPTH = 2
_ITEMS_WIDTH = 32


def _items(name: str, obj: Any, depth: int) -> list:
    """(name, tensor/module) inside a list, tuple or dict, to ``_ITEMS_DEPTH`` levels."""
    if depth == 0 or type(obj) not in (list, tuple, dict) or len(obj) > _ITEMS_WIDTH:
        return []
    pairs = obj.items() if isinstance(obj, dict) else enumerate(obj)
    found = []
    for key, item in list(pairs):
        sub = f"{name}[{key!r}]"
        if kind_of(item) in ("tensor", "module"):
            found.append((sub, item))
        else:
            found.extend(_items(sub, item, depth - 1))
    return found


def _resolve_chain(chain: str, scopes: list) -> list:
    """(name, object) for each prefix of ``chain`` that resolves, without running code, to a tensor,
    module or optimizer in the first scope binding its head, and for the tensors and modules inside a
    list, tuple or dict it names (``batch['x']``)."""
    parts = chain.split(".")
    scope = next((scope for scope in scopes if parts[0] in scope), None)
    if scope is None:
        return []
    obj = scope[parts[0]]
    name = parts[0]
    found = [(name, obj)] if kind_of(obj) is not None else []
    for i, part in enumerate(parts[1:], start=2):
        try:
            obj = static_attr(obj, part)
        except (AttributeError, TypeError):  # a method (batch.values) or code: look into what resolved
            break
        name = ".".join(parts[:i])
        if kind_of(obj) is not None:
            found.append((name, obj))
    found.extend(_items(name, obj, _ITEMS_DEPTH))
    return found


def _resolve_all(source: str, scopes: list) -> list:
    """:func:`_resolve_chain` of every dotted name in ``source``, in order."""
    return [found for chain in _name_chains(source) for found in _resolve_chain(chain, scopes)]


def _culprit(name: str, obj: Any, where: str) -> Culprit:
    kind = kind_of(obj)
    if kind == "tensor":
        summary = f"tensor {dtype_str(obj.dtype)} {shape_str(tuple(obj.shape))}"
        if device_str(obj.device) == "meta":
            summary += "; meta: no data"
    else:
        summary = f"{type(obj).__name__} ({kind})"
    return Culprit(name, kind or "", devices_of(obj), summary, where)


def _user_name(obj: Any, user_ns: Mapping[str, Any]) -> Optional[str]:
    """A public name of ``user_ns`` bound to ``obj``, or to a module that contains it (a submodule seen
    as ``self.fc`` inside ``forward``); None when the user has no name for it."""
    public = [(name, value) for name, value in list(user_ns.items()) if name[:1] != "_"]
    found = next((name for name, value in public if value is obj), None)
    if found is None and kind_of(obj) == "module":
        found = next((name for name, value in public
                      if kind_of(value) == "module" and any(m is obj for m in value.modules())), None)
    return found


def _move_fix(name: str, obj: Any, device_expr: str) -> str:
    """The line that moves what ``name`` holds (a tensor, or a list/tuple/dict of them) to the device."""
    moved = {dict: "{{k: v.to({d}) for k, v in {n}.items()}}", list: "[t.to({d}) for t in {n}]",
             tuple: "tuple(t.to({d}) for t in {n})"}.get(type(obj), "{n}.to({d})")
    return f"{name} = " + moved.format(n=name, d=device_expr)


def _fixes(line: list, context: list, user_ns: Mapping[str, Any]) -> list:
    """The lines that fix the mismatch on the user's line: move its tensors (or the containers that hold
    them) to the device of the module it calls, or of the accelerator the other tensors are on.
    ``line`` are the user line's (name, object) pairs, ``context`` those of the line that raised
    inside a function the user called, and of the cell."""
    modules = [(n, o) for n, o in line if kind_of(o) == "module"]
    if not modules:
        named = [_user_name(obj, user_ns) for _, obj in context if kind_of(obj) == "module"]
        modules = [(name, user_ns[name]) for name in named if name is not None]
    for name, module in modules:
        where = devices_of(module)
        if len(where) > 1:
            return [f"move all of {name} to one device with {name}.to(device), or give each part inputs on "
                    f"its own device."]
    # Tensors the user can rebind: plain names, or the container a tensor item came from.
    movable: dict = {}
    for name, obj in line:
        base = name.split("[")[0]
        if kind_of(obj) != "tensor" or "." in base:
            continue
        holder = user_ns.get(base, obj) if "[" in name else obj
        if "[" in name and type(holder) not in (list, tuple, dict):
            continue
        movable.setdefault(base, (holder, []))[1].append(device_str(obj.device))
    if modules:
        name, module = modules[0]
        target = devices_of(module)
        elsewhere = {d for _, devices in movable.values() for d in devices}
        if target == ("cpu",) and len(elsewhere) == 1 and "cpu" not in elsewhere:
            # The batch is on the accelerator and the module was never moved there: move the module.
            named = [base for base, (holder, _) in movable.items() if kind_of(holder) == "tensor"]
            device_expr = f"{named[0]}.device" if named else repr(next(iter(elsewhere)))
            return [f"{name}.to({device_expr})"]
        if target:
            expr = f"next({name}.parameters()).device"
            fixes = [_move_fix(base, holder, expr) for base, (holder, devices) in movable.items()
                     if any(d != target[0] for d in devices)]
            if target[0] == "meta" and not fixes:
                fixes = [f"give {name} real weights: {name}.to_empty(device=...) then "
                         f"{name}.load_state_dict(...)."]
            if fixes:
                return fixes
    on = [device_str(t.device) for _, t in line + context if kind_of(t) == "tensor"]
    # The accelerator is where work is meant to run (meta stands in for one on CPU-only machines).
    target = next((d for d in on if d != "cpu"), on[0] if on else "")
    ref = next((n for n, t in line if kind_of(t) == "tensor" and device_str(t.device) == target
                and "[" not in n and "." not in n), None)
    expr = f"{ref}.device" if ref is not None else repr(target)
    fixes = [_move_fix(base, holder, expr) for base, (holder, devices) in movable.items()
             if target and any(d != target for d in devices)]
    return fixes or ["move every tensor of the failing operation to one device with .to(device) "
                     "(a module's device: next(model.parameters()).device)."]


def diagnose(
    exc: BaseException,
    cell_source: str,
    user_ns: Mapping[str, Any],
    is_cell_file: Any,
) -> Optional[Diagnosis]:
    """A :class:`Diagnosis` of ``exc`` when it is a device-mismatch error, else None.

    The user's failing line is the line of the user's cell that ran (the outermost traceback frame whose
    file ``is_cell_file(filename)`` accepts, or inside a cell magic the line of the cell the magic ran:
    :func:`~.failing.user_frames`); when the error was raised deeper, in a function or ``forward`` defined in
    a cell, the deepest such frame is shown too, in its own terms (``self``, ``x``). Names are resolved
    in each frame's locals and globals (and ``user_ns``), the cell's other names in ``user_ns``. Only
    static lookups: no code is evaluated, nothing is kept.
    """
    devices = mismatch_devices(exc)
    if devices is None:
        return None
    frames = user_frames(exc.__traceback__, is_cell_file)
    failing = line_of(frames)
    found_line: list = []
    found_inner: list = []
    cell_scopes: list = [user_ns]
    if frames:
        outer = frames[0].frame
        cell_scopes = [outer.f_locals, outer.f_globals, user_ns]
        found_line = _resolve_all(failing.line.strip(), cell_scopes)
        # The code that ran is the cell as its magic compiled it (whose locals, in %%cudatime's loop,
        # are the cell's names): its text, not the magic's line and options, is the cell's.
        cell_source = "".join(linecache.getlines(outer.f_code.co_filename)) or cell_source
        if len(frames) > 1:
            inner = frames[-1].frame
            found_inner = _resolve_all(failing.inner_line.strip(), [inner.f_locals, inner.f_globals, user_ns])
    found_cell = _resolve_all(cell_source, cell_scopes)
    frames = outer = inner = cell_scopes = None  # drop the frames: the diagnosis keeps strings only
    culprits = []
    seen: set = set()
    for where, group in (("line", found_line), ("inside", found_inner), ("cell", found_cell)):
        for name, obj in group:
            key = (id(obj), where == "inside")
            if key in seen or (where == "cell" and (id(obj), True) in seen):
                continue
            seen.add(key)
            culprits.append(_culprit(name, obj, where))
    context = found_inner if found_line else found_inner + found_cell
    line_objs = found_line if found_line or found_inner else found_cell
    fixes = _fixes(line_objs, context, user_ns)
    return Diagnosis(tuple(devices), failing.line, failing.lineno, culprits, fixes, failing.inner_line,
                     failing.inner_lineno, failing.inner_function)
