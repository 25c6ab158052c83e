"""What every adapter over a user's cluster shares: the :class:`Reply` per engine, how failures are
classified (with a fix a person can act on), the :class:`Bridge` interface, and the one-line exceptions
for a cluster that is gone (:class:`ClusterGone`) and for Ctrl-C (:class:`ClusterInterrupted`). The
adapters: :mod:`.ipp_bridge` (ipyparallel) and :mod:`.dask_bridge` (Dask distributed).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..errors import MagicInputError

DEFAULT_TIMEOUT = 30.0
"""Seconds one engine may take to answer before its reply says 'timeout'."""

ASK_TIMEOUT = 5.0
"""Seconds the controller or scheduler may take to say which engines there are and which are busy: it
answers from memory, in milliseconds, so no answer in this time means it is gone."""

STOP_WAIT = 5.0
"""Seconds an interrupt waits for the engines to give up our call (their replies coming back)."""

PROBLEMS = {
    "dead": "the engine died or is gone",
    "timeout": "no answer in time",
    "busy": "the engine runs something else (a %px cell, a task): not asked (or our call withdrawn), so "
            "nothing of ours runs behind it",
    "stuck": "our previous request is still queued there: the engine is stopped, blocked or overloaded",
    "no_package": "torchgpu_magic is not importable there",
    "no_torch": "torch is not importable there",
    "error": "our function failed there",
}
"""What each :attr:`Reply.problem` code means."""

FIX_PACKAGE = ("install it on every engine (pip install torchgpu-magic), or start the engines with this "
               "package on their PYTHONPATH")
FIX_TORCH = "install torch in the engine's environment (the one its python runs from)"
FIX_DASK_PACKAGE = ("; or, from the notebook, on every worker at once: client.register_plugin("
                    "distributed.diagnostics.plugin.PipInstall(['torchgpu-magic']))")

MAGICS = {"gpuinfo": "%gpuinfo", "whereis": "%whereis", "cudatime": "%%cudatime",
          "memory_tick": "%gpumem", "local_device": "%ontorch local", "ping": "the cluster call"}
"""The magic behind each engine function, for the one line an interrupt prints."""


class ClusterGone(MagicInputError):
    """The cluster object no longer reaches a cluster (a stopped cluster, a closed client, a controller
    or scheduler that does not answer): one line saying so and how to connect again."""


class ClusterInterrupted(KeyboardInterrupt):
    """Ctrl-C during a ``--cluster`` call, after the engines were interrupted too. Still a
    KeyboardInterrupt (a loop around the magic stops), shown as its one line: IPython renders an
    exception through ``_render_traceback_`` when it has one."""

    def _render_traceback_(self) -> list:
        return [f"KeyboardInterrupt: {self}"]


def engine_list(labels: Sequence[str]) -> str:
    """'engine 0' / 'engines 0, 2, 3' / 'worker a, worker b'."""
    if len(labels) == 1:
        return labels[0]
    words = [label.split(" ", 1) for label in labels]
    if all(len(w) == 2 and w[0] == words[0][0] for w in words):
        return f"{words[0][0]}s {', '.join(w[1] for w in words)}"
    return ", ".join(labels)


def when(epoch: float, now: Optional[float] = None) -> str:
    """'19:40:12 (2 min 5 s ago)': a wall-clock moment for a person, with its age."""
    now = time.time() if now is None else now
    age = max(0.0, now - epoch)
    ago = f"{age:.0f} s" if age < 60 else f"{int(age // 60)} min {int(age % 60)} s"
    return f"{time.strftime('%H:%M:%S', time.localtime(epoch))} ({ago} ago)"


@dataclass(repr=False)
class Reply:
    """One engine's answer: ``value`` (plain data from the engine) when ``ok``, else ``problem`` (a key
    of :data:`PROBLEMS`) and ``message``. ``host`` and ``pid`` come from the engine when it answered;
    ``since`` is when a busy or stuck engine became so (epoch seconds)."""

    engine: str
    key: Any
    ok: bool
    value: Any = None
    problem: str = ""
    message: str = ""
    host: str = ""
    pid: Optional[int] = None
    seconds: float = 0.0
    since: Optional[float] = None
    cpus: Optional[int] = None  # the CPUs the engine's process may run on
    threads: Optional[int] = None  # torch's intra-op threads there
    fix: str = ""  # what to do about ``problem``, where the reply knows better than its code

    def error_text(self) -> str:
        """'timeout: no answer in 5 s' / 'busy since 19:40:12 (...)' / 'no_package: No module named
        ...: install it ...': one line for a table cell, with the fix where the reply has one."""
        if self.problem in ("busy", "stuck"):
            return self.message
        text = f"{self.problem}: {self.message}" if self.message else self.problem
        return f"{text}: {self.fix}" if self.fix else text

    def fail(self, problem: str, message: str, since: Optional[float] = None, fix: str = "") -> Reply:
        self.ok, self.problem, self.message, self.since, self.fix = False, problem, message, since, fix
        return self


def envelope(reply: Reply, data: Any) -> Reply:
    """Fill ``reply`` from what :func:`remote.call` returned on the engine."""
    if not isinstance(data, dict) or "ok" not in data:
        return reply.fail("error", f"unexpected answer {type(data).__name__}")
    reply.host, reply.pid = data.get("host", ""), data.get("pid")
    reply.cpus, reply.threads = data.get("cpus"), data.get("threads")
    if data["ok"]:
        reply.ok, reply.value = True, data.get("value")
    else:
        problem = data.get("problem", "error")
        reply.fail(problem, data.get("message", ""), fix=FIX_TORCH if problem == "no_torch" else "")
    return reply


def from_exception(reply: Reply, name: str, text: str, where: str = "") -> Reply:
    """Classify an exception raised on the way to or on the engine (by its class name and text, since
    Dask and ipyparallel wrap the original: Dask may send back ``Exception('ModuleNotFoundError ...')``).
    An import failure names its top-level package ("No module named 'torchgpu_magic.cluster'" ->
    torchgpu_magic). ``where`` says where the engine's Python lives, for the install hint."""
    found = re.search(r"No module named '([^']+)'", text) or re.search(r"import name '[^']+' from '([^']+)'",
                                                                       text)
    module = found.group(1).split(".")[0] if found else ""
    place = f" (on {where})" if where else ""
    if module:
        problem, fix = {"torchgpu_magic": ("no_package", FIX_PACKAGE), "torch": ("no_torch", FIX_TORCH)}.get(
            module, ("error", "pip install it in the engine's environment (our function needs it there)"))
        return reply.fail(problem, f"No module named {module!r}{place}", fix=fix)
    if name in ("EngineError", "CommClosedError", "KilledWorker") or "died" in text or "not found" in text:
        return reply.fail("dead", f"{name}: {text}")
    return reply.fail("error", f"{name}: {text}")


@dataclass
class Bridge:
    """A user's cluster object, as one interface: :meth:`engines` and :meth:`run`."""

    name: str
    obj: Any
    kind: str = ""
    magic: str = ""  # the magic as the user typed it ('%cudatime' or '%%cudatime'), for its one-liners

    def engines(self) -> list:
        """The keys of the engines (ipyparallel ids) or workers (addresses) this object reaches now."""
        raise NotImplementedError

    def label(self, key: Any) -> str:
        """A person's name for one engine: 'engine 0' / 'worker 1'."""
        return str(key)

    def run(self, target: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
            keys: Optional[Sequence[Any]] = None, only: Optional[Sequence[Any]] = None,
            **kwargs: Any) -> list:
        """Run ``torchgpu_magic.cluster.remote.<target>(*args, **kwargs)`` on every engine (or those in
        ``keys``) at once; one :class:`Reply` per engine, in engine order, within ``timeout`` seconds.
        Busy engines are not asked, or our call there is withdrawn (their reply says since when they are
        busy); Ctrl-C interrupts the engines too and raises :class:`ClusterInterrupted`; a cluster that is
        gone raises :class:`ClusterGone`. With ``only``, just those engines are asked: the others' replies say
        whether they are free (``ok``, value None) or why not (busy, silent, gone)."""
        raise NotImplementedError

    def interrupted(self, target: str, labels: Sequence[str], left: Sequence[str],
                    dead: Sequence[str] = (), fix: str = "") -> ClusterInterrupted:
        """The one line for Ctrl-C, naming the magic as the user typed it: which engines were
        interrupted, any still running our call, and any that died meanwhile (with ``fix``)."""
        said = f"{self.magic or MAGICS.get(target, target)} --cluster interrupted"
        if labels:
            said += f"; interrupted it on {engine_list(list(labels))} too, as %px does"
        if left:
            said += f"; {engine_list(list(left))} did not stop within {STOP_WAIT:g} s"
        if dead:
            said += (f"; {engine_list(list(dead))} died (no longer listed by the cluster)"
                     + (f": {fix}" if fix else ""))
        return ClusterInterrupted(said)
