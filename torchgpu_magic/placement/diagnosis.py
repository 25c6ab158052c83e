"""The mixed-device diagnosis: recognise torch's device-mismatch errors (current and older wordings),
name the tensors and modules the failing line and cell used, with their devices, and the line that
fixes it.

Names are resolved statically (no code runs) and the diagnosis keeps strings only, not the frames
or the objects.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .common import _static_attr, device_str, devices_of, dtype_str, kind_of, shape_str

_DEV = r"([a-z]+(?::\d+)?)"
# torch's wordings for "these tensors are on different devices", current and older, with the groups
# that name the devices (an older "torch.cuda.FloatTensor" names a device type by its 'cuda.').
_MISMATCH = [
    rf"Expected all tensors to be on the same device, but found at least two devices, {_DEV} and {_DEV}",
    rf"Expected all tensors to be on the same device, but got \w+ is on {_DEV}, different from other tensors "
    rf"on {_DEV}",
    r"Expected all tensors to be on the same device",
    rf"Tensor on device {_DEV} is not on the expected device {_DEV}",
    r"Expected object of device type (\w+) but got device type (\w+)",
    r"Expected object of type torch\.((?:cuda\.)?)\w+ but found type torch\.((?:cuda\.)?)\w+",
    r"Input type \(torch\.((?:cuda\.)?)\w+\) and weight type \(torch\.((?:cuda\.)?)\w+\) should be the same",
    r"Tensor for argument #\d+ '\w+' is on (CPU|GPU), but expected (?:it|them) to be on (CPU|GPU)",
    r"Expected a '(\w+)' device type for generator but found '(\w+)'",
    r"indices should be either on cpu or on the same device as the indexed tensor \(([a-z:0-9]+)\)",
]


def mismatch_devices(exc: BaseException) -> Optional[tuple]:
    """The devices a device-mismatch ``RuntimeError`` names (possibly ``()``), or None when ``exc``
    is not one. "Input type ... and weight type ... should be the same" counts only when the two
    types differ in device (the same words are used for a dtype mismatch)."""
    import re

    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    for pattern in _MISMATCH:
        found = re.search(pattern, text)
        if found is None:
            continue
        groups = [g for g in found.groups() if g is not None]
        if pattern.startswith(r"Expected object of type") or pattern.startswith(r"Input type"):
            devices = tuple("cuda" if g else "cpu" for g in groups)
            if len(set(devices)) < 2:
                return None
            return devices
        names = {"CPU": "cpu", "GPU": "cuda"}
        return tuple(names.get(g, g) for g in groups)
    return None


@dataclass(frozen=True)
class Culprit:
    """A name the failing cell used, and where its object lives (strings only)."""

    name: str
    kind: str
    devices: tuple
    summary: str
    on_failing_line: bool


@dataclass(repr=False)
class Diagnosis:
    """What a device-mismatch error involved: the names on the failing line and in the cell that
    refer to tensors or modules, their devices, and the line that fixes it. Strings only."""

    devices: tuple
    line: str
    lineno: Optional[int]
    culprits: list
    fixes: list

    def lines(self) -> list:
        devices = f" ({', '.join(self.devices)})" if self.devices else ""
        out = [f"whereis: a device mismatch{devices}: the tensors of one operation must be on one device."]
        on_line = [c for c in self.culprits if c.on_failing_line]
        elsewhere = [c for c in self.culprits if not c.on_failing_line]
        if self.line:
            where = f"line {self.lineno}" if self.lineno else "the failing line"
            out.append(f"On {where}: {self.line.strip()}")
        for title, group in (("  used there:", on_line), ("  elsewhere in the cell:", elsewhere)):
            if group:
                out.append(title)
                width = max(len(c.name) for c in group)
                for c in group:
                    out.append(f"    {c.name.ljust(width)}  {'+'.join(c.devices) or '-':<10}  {c.summary}")
        for fix in self.fixes:
            out.append("Fix: " + fix)
        return out

    def to_text(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        from ..render import html_lines

        return html_lines(self.lines())

    def to_dict(self) -> dict:
        return {"devices": list(self.devices), "line": self.line, "lineno": self.lineno,
                "culprits": [c.__dict__.copy() for c in self.culprits], "fixes": list(self.fixes)}


def _name_chains(source: str) -> list:
    """Dotted names (``x``, ``model.encoder``, ``self.fc``) in ``source``, in order, without strings
    and comments; IPython syntax that does not tokenize falls back to a regular expression."""
    import io
    import re
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
    if current:
        chains.append(".".join(current))
    return chains


def _resolve_chain(chain: str, scopes: list) -> list:
    """(name, object) for each prefix of ``chain`` that resolves, without running code, to a tensor,
    module or optimizer in the first scope binding its head."""
    parts = chain.split(".")
    for scope in scopes:
        if parts[0] in scope:
            obj = scope[parts[0]]
            break
    else:
        return []
    found = []
    if kind_of(obj) is not None:
        found.append((parts[0], obj))
    for i, part in enumerate(parts[1:], start=2):
        try:
            obj = _static_attr(obj, part)
        except (AttributeError, TypeError):
            break
        if kind_of(obj) is not None:
            found.append((".".join(parts[:i]), obj))
    return found


def _culprit(name: str, obj: Any, on_line: bool) -> Culprit:
    kind = kind_of(obj)
    if kind == "tensor":
        summary = f"tensor {dtype_str(obj.dtype)} {shape_str(tuple(obj.shape))}"
    else:
        summary = f"{type(obj).__name__} ({kind})"
    return Culprit(name, kind or "", devices_of(obj), summary, on_line)


def _fixes(found: list) -> list:
    """The lines that would fix the mismatch: move tensors to their module's device, or to the
    accelerator the other tensors are on."""
    modules = [(n, o) for n, o in found if kind_of(o) == "module"]
    tensors = [(n, o) for n, o in found if kind_of(o) == "tensor"]
    fixes = []
    for name, module in modules:
        where = devices_of(module)
        if len(where) > 1:
            fixes.append(f"{name} is split across {', '.join(where)}: move all of it with "
                         f"{name}.to(device), or give each part inputs on its own device.")
            return fixes
    if modules:
        name, module = modules[0]
        target = devices_of(module)
        if target:
            for tname, tensor in tensors:
                if device_str(tensor.device) != target[0] and "." not in tname:
                    fixes.append(f"{tname} = {tname}.to(next({name}.parameters()).device)")
            if target[0] == "meta":
                fixes.append(f"{name} is on meta (no data): it cannot compute; load its weights onto a real "
                             f"device ({name}.to_empty(device=...) then load_state_dict).")
        if fixes:
            return fixes
    on = [device_str(t.device) for _, t in tensors]
    # The accelerator is where work is meant to run (meta stands in for one on CPU-only machines).
    accelerators = [d for d in on if d != "cpu"]
    target = accelerators[0] if accelerators else (on[0] if on else "")
    ref = next((n for n, t in tensors if device_str(t.device) == target), None)
    for tname, tensor in tensors:
        if device_str(tensor.device) != target and ref is not None and "." not in tname:
            fixes.append(f"{tname} = {tname}.to({ref}.device)")
    if not fixes:
        fixes.append("move every tensor of the failing operation to one device with .to(device) "
                     "(a module's device: next(model.parameters()).device).")
    return fixes


def diagnose(
    exc: BaseException,
    cell_source: str,
    user_ns: Mapping[str, Any],
    is_cell_file: Any,
) -> Optional[Diagnosis]:
    """A :class:`Diagnosis` of ``exc`` when it is a device-mismatch error, else None.

    The failing line is the deepest traceback frame whose file ``is_cell_file(filename)`` accepts
    (a notebook cell); its names are resolved in that frame's locals and globals, the cell's other
    names in ``user_ns``. Only static lookups: no code is evaluated, nothing is kept.
    """
    import linecache

    devices = mismatch_devices(exc)
    if devices is None:
        return None
    frame = None
    lineno = None
    tb = exc.__traceback__
    while tb is not None:
        if is_cell_file(tb.tb_frame.f_code.co_filename):
            frame, lineno = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    line = ""
    found_line: list = []
    if frame is not None:
        line = linecache.getline(frame.f_code.co_filename, lineno or 0)
        scopes = [frame.f_locals, frame.f_globals, user_ns]
        for chain in _name_chains(line.strip()):
            found_line.extend(_resolve_chain(chain, scopes))
    frame = tb = None  # drop the frames: the diagnosis keeps strings only
    found_cell: list = []
    for chain in _name_chains(cell_source):
        found_cell.extend(_resolve_chain(chain, [user_ns]))
    culprits = []
    seen: set = set()
    involved: list = []
    for on_line, group in ((True, found_line), (False, found_cell)):
        for name, obj in group:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            culprits.append(_culprit(name, obj, on_line))
            if on_line or not found_line:
                involved.append((name, obj))
    fixes = _fixes(involved)
    return Diagnosis(tuple(devices), line.rstrip("\n"), lineno, culprits, fixes)

