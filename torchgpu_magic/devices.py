"""Device specs and torch's default device: parse, validate, resolve, switch and restore.

Every magic's device option (``%%ontorch SPEC`` and ``--fallback``, ``%%cudatime --devices``, ``%%cudamem
DEVICE`` and ``--predict``, ``%gpumem holders DEVICE``, ``%whereis --device``) names devices the way a
person types them (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ``mps``, ``xpu``, ``meta``), and every one is
checked by :func:`device_option`, with one wording: it turns such a spec into a ``torch.device`` without
``eval``, and otherwise says in one line what was wrong and what the option takes here.
:func:`use_device` runs a block under torch's default-device mechanism (``torch.set_default_device``), a
default dtype and, for ``cuda:N``, the current CUDA device, and restores all three exactly afterwards,
however the block ends.

torch is imported inside the functions, so importing this module stays cheap.
"""
from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

from . import accelerators
from .caches import cache, table
from .errors import MagicInputError
from .torchapi import cuda_device_counter, default_device_setting, function_mode_depth

KINDS = ("cpu", "cuda", "mps", "xpu", "meta")
"""The device types a spec may name (besides ``auto``)."""

DTYPES = ("float16", "bfloat16", "float32", "float64")
"""The floating dtypes torch accepts as its default dtype."""

LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                   "PMI_LOCAL_RANK")
"""The variables launchers set to a process's rank among those on its host (torchrun, Open MPI, MPICH /
Intel MPI, Slurm, PMI), read in this order by ``local``."""

ORDER_VAR = "TORCHGPU_MAGIC_LOCAL_RANK"
"""Where ``%ontorch local --cluster`` leaves an engine's order among the engines on its host, for engines
no launcher gave a local rank."""

_FIXED = table()  # 'cpu' / 'meta' -> their torch.device, once resolved (they exist everywhere)
_SPEC = re.compile(r"^(?P<kind>[a-z]+)(?::(?P<index>\d+))?$")
_HINTS = {"gpu": "cuda", "nvidia": "cuda", "cuda0": "cuda:0", "rocm": "cuda", "hip": "cuda", "apple": "mps"}


class DeviceUnavailable(MagicInputError):
    """A well-formed spec for a device that does not exist here (``--fallback`` may replace it)."""


def available_devices() -> list[str]:
    """The devices usable here, in the order ``auto`` prefers accelerators: e.g. ``['cpu', 'meta']`` or
    ``['cpu', 'cuda:0', 'cuda:1', 'meta']``. Never initialises a CUDA context."""
    found = ["cpu"]
    found += [f"cuda:{i}" for i in range(_cuda_count())]
    found += [f"xpu:{i}" for i in range(_xpu_count())]
    if _mps_available():
        found.append("mps:0")
    found.append("meta")
    return found


EVERY = ("auto", "local") + KINDS
"""What a device option may take, at most: :data:`KINDS` and the words ``auto`` and ``local``."""


def resolve(spec: Any) -> Any:
    """A device spec as the ``torch.device`` that exists here: :func:`device_option` taking every device."""
    return device_option(spec)


def device_option(spec: Any, takes: tuple = EVERY, exists: bool = True,
                  refused: Optional[dict] = None) -> Any:
    """THE check of a device a magic's option names, for every magic and option, with one wording:
    the ``torch.device`` it means, or a one-line :class:`MagicInputError` that says what was wrong and
    lists what is valid.

    ``takes``: the kinds (of :data:`KINDS`) and words (``auto``, ``local``) the option takes.
    ``exists``: the device must exist here (then ``cuda`` and ``xpu`` resolve to the current device of
    that kind with its index, ``mps`` to ``mps:0``, ``auto`` to the best accelerator, ``local`` to
    :func:`local_device`'s pick, so the result names exactly where tensors go; the list of valid ones is
    the devices here); without it only the spelling is checked (a prediction for a GPU you need not
    have: ``cuda`` stays ``cuda``, and the list is the forms the option takes). ``refused``: why a kind
    the option does not take is refused, in words (``meta``: nothing to time). Case, surrounding
    whitespace and quotes are ignored; ``torch.device`` objects are taken too.

    Raises :class:`MagicInputError` for a malformed or misspelt spec (with a did-you-mean among what the
    option takes, or torch's name for it and why that is not here) and for a kind the option does not
    take; :class:`DeviceUnavailable`, its subclass, for a well-formed one absent here (``--fallback`` may
    replace it). The exception's ``meant`` is the spec in torch's words when that is known (``cuda`` for
    ``gpu``), for a caller that suggests it elsewhere.
    """
    import torch

    # cpu and meta exist everywhere: once resolved, no parse, no list of the devices here, no new
    # torch.device per cell (%%ontorch cpu asks before every cell)
    typed = "" if isinstance(spec, torch.device) else str(spec).strip().strip("'\"").strip()
    fixed = _FIXED.get(typed.lower())
    if fixed is not None and fixed.type in takes:
        return fixed
    valid = _valid(takes, exists)
    if isinstance(spec, torch.device):
        kind, index = spec.type, spec.index
        text = str(spec)
    else:
        text = typed.lower()
        if not text:
            raise MagicInputError(f"no device given. {valid}")
        match = _SPEC.match(text)
        if text in ("auto", "local"):
            kind, index = text, None
        elif match is None or match.group("kind") not in KINDS:
            raise _unknown(typed, takes, exists, valid)
        else:
            kind = match.group("kind")
            index = None if match.group("index") is None else int(match.group("index"))
    if kind not in takes:
        reason = (refused or {}).get(kind, "is not a device this takes")
        raise _meaning(MagicInputError(f"'{shown(text)}' {reason}. {valid}"), None)
    if kind in ("cpu", "meta") and index not in (None, 0):
        message = f"'{shown(text)}': {kind} has no index {index}; use '{kind}'. {valid}"
        raise _meaning(MagicInputError(message), kind)
    if kind == "mps" and index not in (None, 0):
        raise _meaning(DeviceUnavailable(f"'{shown(text)}' does not exist: there is one MPS device, 'mps'. "
                                         f"{valid}"), "mps")
    if not exists:
        return torch.device(kind) if kind in ("cpu", "meta", "auto", "local") or index is None \
            else torch.device(kind, index)
    if kind == "auto":
        return _auto()
    if kind == "local":
        return local_device()[0]
    if kind in ("cpu", "meta"):
        if index is None and not isinstance(spec, torch.device):
            _FIXED[text] = torch.device(kind)
        return torch.device(kind)
    if kind in ("cuda", "xpu"):
        return _resolve_indexed(kind, index, valid)
    if kind == "mps":
        if not _mps_available():
            raise _meaning(DeviceUnavailable(f"'mps' is not available: {_missing('mps')}. {valid}"), "mps")
        return torch.device("mps", 0)
    raise _unknown(text, takes, exists, valid)  # a torch.device of a kind we do not handle (e.g. 'hpu')


def option_name(device: Any) -> str:
    """How a device is written as an option's value: 'cpu', 'cuda:1', 'mps' (the one MPS device)."""
    text = str(device)
    return "mps" if text == "mps:0" else text


def local_device() -> tuple:
    """``local``: the GPU of this process's local rank on its host, modulo the GPUs it sees; (device, how
    it chose, in words). The rank comes from the first of :data:`LOCAL_RANK_VARS` that is set, else from
    :data:`ORDER_VAR`; without any, the current GPU. Without a GPU, what ``auto`` picks."""
    import torch

    count, kind = _cuda_count(), "cuda"
    if not count:
        count, kind = _xpu_count(), "xpu"
    name = next((name for name in LOCAL_RANK_VARS + (ORDER_VAR,) if os.environ.get(name, "").strip()), "")
    value = os.environ.get(name, "").strip()
    if value and not value.isdigit():
        raise MagicInputError(f"local: {name}={shown(value)!r} is not a rank (a whole number >= 0)")
    if not count:
        device = _auto()
        said = f"{name}={value}, but " if value else ""
        return device, f"{said}torch sees no CUDA or XPU GPU here, so local is {device}"
    if not value:
        device = torch.device(kind, _current_index(kind))
        return device, (f"no local-rank variable is set ({', '.join(LOCAL_RANK_VARS)}): the current GPU, "
                        f"{device}")
    rank = int(value)
    device = torch.device(kind, rank % count)
    gpus = f"{count} GPU{'s' if count != 1 else ''}"
    return device, f"{name}={rank}: local rank {rank} mod the {gpus} this process sees is {device}"


def parse_dtype(name: str) -> Any:
    """The torch dtype for one of :data:`DTYPES` (case-insensitive, ``torch.`` prefix allowed)."""
    import torch

    text = str(name).strip().lower().removeprefix("torch.")
    if text not in DTYPES:
        raise MagicInputError(f"unknown dtype '{shown(name)}'; valid: {', '.join(DTYPES)}")
    return getattr(torch, text)


synchronize = accelerators.synchronize
"""The device layer's :func:`~torchgpu_magic.accelerators.synchronize`, by this module's name too."""


# ---- switching and restoring ---------------------------------------------------------------------


@dataclass
class DeviceState:
    """What :func:`apply` changes, captured by :func:`current_state` so it can be put back exactly.

    ``default_device`` is torch's raw setting: None when nothing was ever set (tensors go to cpu and
    torch adds no per-call cost), or the device exactly as it was given (``cuda`` without an index
    follows the current CUDA device, so it must not come back as ``cuda:0``). ``current`` holds the
    current device of accelerators already initialised; ``guards`` the ``torch.cuda.device`` /
    ``torch.xpu.device`` contexts :func:`apply` entered, exited newest first by :meth:`restore` (torch's
    own way back, which does not create a CUDA context on a GPU that had none).
    """

    default_device: Any
    dtype: Any
    current: tuple  # ((kind, index), ...)
    guards: list = field(default_factory=list)

    def restore(self) -> None:
        """Put torch back into this state (current devices, default dtype, default device)."""
        import torch

        while self.guards:
            self.guards.pop().__exit__(None, None, None)
        for kind, index in self.current:
            module = accelerators.backend_module(kind)
            if module.current_device() != index:  # the block itself switched devices
                module.set_device(index)
        if torch.get_default_dtype() != self.dtype:  # setting it costs more than asking
            torch.set_default_dtype(self.dtype)
        if default_device_setting() != self.default_device:
            torch.set_default_device(self.default_device)


def current_state() -> DeviceState:
    """Capture torch's default device, default dtype and the current device of the accelerators that are
    already initialised (never initialising one: that would create a CUDA context)."""
    import torch

    # An initialised backend has a device, so is_initialized() alone decides, and it asks nothing else
    # (counting devices asks NVML before CUDA starts): %%ontorch captures this around every cell.
    current = tuple((kind, accelerators.current_index(kind)) for kind in ("cuda", "xpu")
                    if accelerators.started(kind))
    return DeviceState(default_device_setting(), torch.get_default_dtype(), current)


def apply(device: Any, dtype: Optional[Any], state: DeviceState) -> None:
    """Make ``device`` torch's default device (and ``dtype`` its default dtype when given; for ``cuda:N`` /
    ``xpu:N`` also the current device, so ``.cuda()`` and ``'cuda'`` mean N). ``state`` comes from
    :func:`current_state` before the first change, and ``state.restore()`` undoes them all;
    :func:`use_device` does both.

    For cpu the default-device setting is cleared rather than set: cpu is torch's default anyway, and a
    cleared setting spares every torch call the device-mode cost of pytorch issue #92701.
    """
    import torch

    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type in ("cuda", "xpu") and device.index is not None:
        guard = accelerators.backend_module(device.type).device(device.index)
        guard.__enter__()
        state.guards.append(guard)
    if dtype is not None:
        torch.set_default_dtype(dtype)
    target = None if device.type == "cpu" and device.index in (None, 0) else device
    if default_device_setting() != target:
        torch.set_default_device(target)
    # A `with torch.device(...)` block outside us is a mode on torch's function-mode stack: override it.
    # (Only then is torch.get_default_device() asked: it searches that stack, a cost on every cell.)
    if target is None and function_mode_depth() and torch.get_default_device() != device:
        torch.set_default_device(device)


@contextmanager
def use_device(device: Any, dtype: Optional[Any] = None) -> Iterator[Any]:
    """Run the block with ``device`` as torch's default device (and ``dtype`` as default dtype, and for
    ``cuda:N`` the current CUDA device); restore all of them exactly when the block ends, however it
    ends (exception, ``KeyboardInterrupt``, ``SystemExit``). Nestable. Yields the ``torch.device``."""
    import torch

    if not isinstance(device, torch.device):
        device = torch.device(device)
    saved = current_state()
    try:
        apply(device, dtype, saved)
        yield device
    finally:
        saved.restore()


def default_device() -> Any:
    """The device a plain ``torch.empty(0)`` would land on now (with its index)."""
    import torch

    return torch.get_default_device()


# ---- helpers -------------------------------------------------------------------------------------


def _cuda_count() -> int:
    """How many CUDA devices torch sees, remembered: ``%%ontorch`` and ``%%cudatime`` ask before every
    cell, and before CUDA is initialised ``torch.cuda.is_available()`` asks NVML each time. Asked again
    when ``CUDA_VISIBLE_DEVICES`` changes (which, before CUDA starts, changes the count: the reason torch
    does not cache it then) or when torch's functions, or its C extension's device count, are replaced (a
    stand-in for a GPU)."""
    import torch

    return _count_of(torch.cuda.is_available, torch.cuda.device_count, cuda_device_counter(),
                     os.environ.get("CUDA_VISIBLE_DEVICES"))


@cache(maxsize=1)
def _count_of(is_available: Any, device_count: Any, counter: Any, visible: Optional[str]) -> int:
    """The count those functions give under that ``CUDA_VISIBLE_DEVICES`` (the latest one kept)."""
    return device_count() if is_available() else 0


def _xpu_count() -> int:
    return accelerators.device_count("xpu")


def _mps_available() -> bool:
    return accelerators.device_count("mps") > 0


def _current_index(kind: str) -> int:
    return accelerators.current_index(kind)


def _auto() -> Any:
    import torch

    if _cuda_count():
        return torch.device("cuda", _current_index("cuda"))
    if _xpu_count():
        return torch.device("xpu", _current_index("xpu"))
    if _mps_available():
        return torch.device("mps", 0)
    return torch.device("cpu")


def _resolve_indexed(kind: str, index: Optional[int], valid: str) -> Any:
    import torch

    name = kind if index is None else f"{kind}:{index}"
    count = _cuda_count() if kind == "cuda" else _xpu_count()
    if count == 0:
        raise _meaning(DeviceUnavailable(f"'{name}' is not available: {_missing(kind)}. {valid}"), name)
    if index is None:
        return torch.device(kind, _current_index(kind))
    if index >= count:
        names = ", ".join(f"{kind}:{i}" for i in range(count))
        message = (f"'{kind}:{index}' does not exist: torch sees {count} {kind.upper()} "
                   f"device{'s' if count != 1 else ''} ({names}). {valid}")
        raise _meaning(DeviceUnavailable(message), name)
    return torch.device(kind, index)


def _meaning(error: MagicInputError, meant: Optional[str]) -> MagicInputError:
    """``error`` with ``meant``: the spec in torch's words (``cuda`` for ``gpu``), or None."""
    error.meant = meant  # type: ignore[attr-defined]
    return error


def _valid(takes: tuple, exists: bool) -> str:
    """What an option takes, as its errors end: the devices here of the kinds it takes (and ``auto``), or
    without ``exists`` the forms it takes."""
    if exists:
        here = [option_name(name) for name in available_devices() if name.split(":")[0] in takes]
        return "Devices here: " + ", ".join(here + ["auto"] * ("auto" in takes))
    forms = {"cuda": "cuda, cuda:N", "xpu": "xpu, xpu:N"}
    words = KINDS + ("auto", "local")
    return "It takes: " + ", ".join(forms.get(kind, kind) for kind in words if kind in takes)


def shown(text: str, limit: int = 40) -> str:
    """User text made safe for a one-line message, as the user typed it: characters that do not print
    (newlines, escapes) escaped, at most ``limit`` long; ``cpü`` stays ``cpü``."""
    text = str(text)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def without_device_list(message: str) -> str:
    """A device error's message without its closing "Devices here: ..." list, for a caller that lists
    the devices it takes itself (``%%cudatime --devices``, ``--fallback``)."""
    return message.split(" Devices here:")[0].rstrip(".")


def _missing(kind: str) -> Optional[str]:
    """Why device type ``kind`` is not usable here, or None when it is (cpu, meta and auto always are)."""
    import torch

    if kind == "xpu":
        return None if _xpu_count() else "torch sees no Intel XPU here"
    if kind == "mps" and not _mps_available():
        built = torch.backends.mps.is_built()
        return "no Apple-silicon GPU is usable" if built else "this torch has no MPS support"
    if kind != "cuda" or _cuda_count():
        return None
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"this torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return "CUDA_VISIBLE_DEVICES is empty, which hides every GPU"
    if visible is not None:
        return f"torch sees no CUDA GPU (driver missing or CUDA_VISIBLE_DEVICES={visible!r} hides them)"
    return "torch sees no CUDA GPU (no NVIDIA driver, or the driver is older than this torch needs)"


def _unknown(text: str, takes: tuple, exists: bool, valid: str) -> MagicInputError:
    """A malformed or misspelt spec: a did-you-mean for a device the option takes (and, with ``exists``,
    that exists here); for one that does not exist (``gpu`` on a machine without CUDA), torch's name for
    it and why it is not available, so the message suggests nothing that would fail next."""
    kind, _, index = text.strip().lower().partition(":")
    close = difflib.get_close_matches(kind, [k for k in KINDS + ("auto",) if k in takes], n=1, cutoff=0.5)
    guess = _HINTS.get(kind) or (close[0] if close else None)
    if guess and index.isdigit() and guess in ("cuda", "xpu"):
        guess = f"{guess}:{int(index)}"
    if guess is not None and guess.split(":")[0] not in takes:
        guess = None
    missing = _missing(guess.split(":")[0]) if guess and exists else None
    if guess is None:
        hint = "."
    elif missing is None:
        hint = f". Did you mean '{guess}'?"
    else:
        hint = f"; torch calls it '{guess}', which is not available here: {missing}."
    return _meaning(MagicInputError(f"unknown device '{shown(text)}'{hint} {valid}"), guess)
