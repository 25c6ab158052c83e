"""The adapter over the cluster engines users already run: ipyparallel and Dask distributed.

A :class:`Bridge` runs one of our engine-side functions (named by its dotted path in
:mod:`torchgpu_magic.cluster.remote`) on every engine or worker at once and gathers plain data, one
:class:`Reply` per engine, each under a time limit. An engine that is dead, too slow, lacks torch or lacks
this package gets a reply that says so (``problem`` and ``message``) while the others still report.

ipyparallel (``Client`` / ``DirectView`` / ``LoadBalancedView``: one ``apply_async`` to all engines) and
distributed (``Client.run`` per worker, each in a daemon thread) are imported only when a user's object of
theirs is found in the namespace, so this module costs nothing to import.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..errors import MagicInputError

DEFAULT_TIMEOUT = 30.0
"""Seconds one engine may take to answer before its reply says 'timeout'."""

_ENTRY = "torchgpu_magic.cluster.remote.call"

PROBLEMS = {
    "dead": "the engine died or is gone",
    "timeout": "no answer in time",
    "no_package": "torchgpu_magic is not importable there",
    "no_torch": "torch is not importable there",
    "error": "our function failed there",
}
"""What each :attr:`Reply.problem` code means."""

FIX_PACKAGE = ("install it on every engine (pip install torchgpu-magic), or start the engines with this "
               "package on their PYTHONPATH")
FIX_TORCH = "install torch in the engine's environment (the one its python runs from)"


@dataclass(repr=False)
class Reply:
    """One engine's answer: ``value`` (plain data from the engine) when ``ok``, else ``problem`` (a key
    of :data:`PROBLEMS`) and ``message``. ``host`` and ``pid`` come from the engine when it answered."""

    engine: str
    key: Any
    ok: bool
    value: Any = None
    problem: str = ""
    message: str = ""
    host: str = ""
    pid: Optional[int] = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"engine": self.engine, "key": self.key, "ok": self.ok, "value": self.value,
                "problem": self.problem, "message": self.message, "host": self.host, "pid": self.pid,
                "seconds": self.seconds}

    def error_text(self) -> str:
        """'timeout: no answer in 5 s' / 'no_package: ... fix: ...': one line for a table cell."""
        return f"{self.problem}: {self.message}" if self.message else self.problem


def _envelope(reply: Reply, data: Any) -> Reply:
    """Fill ``reply`` from what :func:`remote.call` returned on the engine."""
    if not isinstance(data, dict) or "ok" not in data:
        reply.problem, reply.message = "error", f"unexpected answer {type(data).__name__}"
        return reply
    reply.host, reply.pid = data.get("host", ""), data.get("pid")
    if data["ok"]:
        reply.ok, reply.value = True, data.get("value")
    else:
        reply.problem, reply.message = data.get("problem", "error"), data.get("message", "")
    return reply


def _from_exception(reply: Reply, name: str, text: str) -> Reply:
    """Classify an exception raised on the way to or on the engine (by its class name and text)."""
    if name in ("ModuleNotFoundError", "ImportError") and "torchgpu_magic" in text:
        reply.problem, reply.message = "no_package", f"{text}; {FIX_PACKAGE}"
    elif name in ("ModuleNotFoundError", "ImportError") and "torch" in text:
        reply.problem, reply.message = "no_torch", f"{text}; {FIX_TORCH}"
    elif name in ("EngineError", "CommClosedError", "KilledWorker") or "died" in text or "not found" in text:
        reply.problem, reply.message = "dead", f"{name}: {text}"
    else:
        reply.problem, reply.message = "error", f"{name}: {text}"
    return reply


@dataclass
class Bridge:
    """A user's cluster object, as one interface: :meth:`engines` and :meth:`run`."""

    name: str
    obj: Any
    kind: str = ""
    labels: dict = field(default_factory=dict)

    def engines(self) -> list:
        """The keys of the engines (ipyparallel ids) or workers (addresses) this object reaches now."""
        raise NotImplementedError

    def label(self, key: Any) -> str:
        """A person's name for one engine: 'engine 0' / 'worker 1'."""
        return self.labels.get(key, str(key))

    def run(self, target: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
            keys: Optional[Sequence[Any]] = None, **kwargs: Any) -> list:
        """Run ``torchgpu_magic.cluster.remote.<target>(*args, **kwargs)`` on every engine (or those in
        ``keys``) at once; one :class:`Reply` per engine, in engine order, within ``timeout`` seconds."""
        raise NotImplementedError


class IPyParallelBridge(Bridge):
    """An ipyparallel ``Client`` or view: one ``apply_async`` to a DirectView of all the engines asked
    (the function and its arguments serialised once, one result set to watch), then each engine's
    result read on its own under the deadline, so one slow or dead engine costs the others nothing."""

    def __init__(self, name: str, obj: Any) -> None:
        client = getattr(obj, "client", None) or obj
        super().__init__(name, obj, "ipyparallel")
        self.client = client

    def engines(self) -> list:
        targets = getattr(self.obj, "targets", None)
        if targets is None or targets == "all" or self.obj is self.client:
            return list(self.client.ids)
        return [targets] if isinstance(targets, int) else list(targets)

    def label(self, key: Any) -> str:
        return f"engine {key}"

    def run(self, target: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
            keys: Optional[Sequence[Any]] = None, **kwargs: Any) -> list:
        keys = self.engines() if keys is None else list(keys)
        alive = set(self.client.ids)
        start = time.monotonic()
        replies = {key: Reply(self.label(key), key, False) for key in keys}
        live = []
        for key in keys:
            if key in alive:
                live.append(key)
            else:
                replies[key].problem = "dead"
                replies[key].message = "the controller no longer lists this engine"
        if live:
            for part, result in self._send(live, replies, target, args, kwargs):
                self._gather(part, result, replies, timeout, start)
        return [replies[key] for key in keys]

    def _send(self, live: list, replies: dict, target: str, args: tuple, kwargs: dict) -> list:
        """Send the call to every engine in ``live``: ``[(keys, AsyncResult)]``. One DirectView apply;
        should it fail (an engine gone between the check and the send), one apply per engine, so that
        only the engine at fault gets the error."""
        from . import remote

        try:
            return [(live, self.client[live].apply_async(remote.call, target, args, kwargs))]
        except Exception:  # noqa: BLE001 - retried per engine below, where each failure is that engine's
            sent = []
            for key in live:
                try:
                    sent.append(([key], self.client[[key]].apply_async(remote.call, target, args, kwargs)))
                except Exception as exc:  # noqa: BLE001 - one engine's failure is its reply, not ours
                    _from_exception(replies[key], type(exc).__name__, str(exc))
            return sent

    def _gather(self, keys: list, result: Any, replies: dict, timeout: float, start: float) -> None:
        """Wait for ``result`` (the engines ``keys``) until ``start + timeout``, then fill each engine's
        reply: all at once when every engine answered (the usual tick), else engine by engine from
        ``result.split()``, an engine without an answer getting 'timeout'."""
        result.wait(max(0.0, start + timeout - time.monotonic()))
        elapsed = time.monotonic() - start
        if result.ready():
            answers = result.get(0, return_exceptions=True)
            for key, answer, seconds in zip(keys, answers, _seconds(result, elapsed)):
                _fill(replies[key], answer, seconds)
            return
        for key, part in zip(keys, result.split()):
            reply = replies[key]
            if part.ready():
                _fill(reply, part.get(0, return_exceptions=True), _seconds(part, elapsed)[0])
            else:
                reply.problem, reply.message = "timeout", f"no answer in {timeout:g} s"
                reply.seconds = elapsed


def _seconds(result: Any, elapsed: float) -> list:
    """Each engine's round trip in ``result`` from ipyparallel's metadata (sent to received);
    ``elapsed`` where the metadata lacks it."""
    submitted, received = result["submitted"], result["received"]
    if not isinstance(submitted, list):  # a single-engine result
        submitted, received = [submitted], [received]
    return [(r - s).total_seconds() if r is not None and s is not None else elapsed
            for s, r in zip(submitted, received)]


def _fill(reply: Reply, answer: Any, seconds: float) -> None:
    """One engine's answer (the envelope from :func:`remote.call`, or the exception ipyparallel stored:
    RemoteError, EngineError for an engine that died) into its reply."""
    from ipyparallel import error

    if isinstance(answer, error.RemoteError):
        _from_exception(reply, answer.ename, str(answer.evalue))
    elif isinstance(answer, BaseException):
        _from_exception(reply, type(answer).__name__, str(answer))
    else:
        _envelope(reply, answer)
    reply.seconds = seconds


class DaskBridge(Bridge):
    """A distributed ``Client``: ``Client.run`` on each worker from its own daemon thread, joined with a
    deadline (``Client.run`` itself has no timeout), so a hung worker cannot hold the notebook."""

    def __init__(self, name: str, obj: Any) -> None:
        super().__init__(name, obj, "dask")

    def engines(self) -> list:
        workers = self.obj.scheduler_info(n_workers=-1)["workers"] if _takes_n_workers(self.obj) \
            else self.obj.scheduler_info()["workers"]
        keys = sorted(workers, key=lambda addr: str(workers[addr].get("name", addr)))
        self.labels = {addr: f"worker {workers[addr].get('name', addr)}" for addr in keys}
        return keys

    def run(self, target: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
            keys: Optional[Sequence[Any]] = None, **kwargs: Any) -> list:
        from . import remote

        keys = self.engines() if keys is None else list(keys)
        start = time.monotonic()
        replies = {key: Reply(self.label(key), key, False) for key in keys}
        done: dict = {}

        def ask(key: Any) -> None:
            try:
                answer = self.obj.run(remote.call, target, args, kwargs, workers=[key], on_error="return")
                done[key] = answer.get(key, KeyError(f"worker {key} not found"))
            except BaseException as exc:  # noqa: BLE001 - the reply reports it
                done[key] = exc
            finally:
                done.setdefault("_times", {})[key] = time.monotonic() - start

        threads = [threading.Thread(target=ask, args=(key,), daemon=True, name=f"torchgpu-cluster-{key}")
                   for key in keys]
        for thread in threads:
            thread.start()
        deadline = start + timeout
        for key, thread in zip(keys, threads):
            thread.join(max(0.0, deadline - time.monotonic()))
            reply = replies[key]
            if key not in done:
                reply.problem, reply.message = "timeout", f"no answer in {timeout:g} s"
                reply.seconds = time.monotonic() - start
                continue
            answer = done[key]
            reply.seconds = done.get("_times", {}).get(key, 0.0)
            if isinstance(answer, BaseException):
                _from_exception(reply, type(answer).__name__, str(answer))
            else:
                _envelope(reply, answer)
        return [replies[key] for key in keys]


def _takes_n_workers(client: Any) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):
        return False


# ---- finding the user's cluster object ----------------------------------------------------------------

def _kinds() -> list:
    """(kind, classes) for the cluster libraries already imported: an object of theirs cannot exist
    otherwise, so nothing is imported here."""
    out = []
    if "ipyparallel" in sys.modules:
        import ipyparallel

        views = (ipyparallel.Client, ipyparallel.DirectView, ipyparallel.LoadBalancedView)
        out.append(("ipyparallel", views))
    if "distributed" in sys.modules:
        import distributed

        out.append(("dask", (distributed.Client,)))
    return out


def candidates(ns: dict) -> dict:
    """The user's cluster objects in ``ns``, by name: ipyparallel clients and views, Dask clients
    (names starting with '_' are IPython's output history, left out)."""
    kinds = _kinds()
    found = {}
    for name, obj in ns.items():
        if name.startswith("_"):
            continue
        for kind, classes in kinds:
            if isinstance(obj, classes):
                found[name] = kind
    return found


_BRIDGES: dict = {"ipyparallel": IPyParallelBridge, "dask": DaskBridge}


def connect(ns: dict, name: Optional[str]) -> Bridge:
    """The :class:`Bridge` for ``ns[name]``, or for the one cluster object in ``ns`` when ``name`` is
    empty. Raises :class:`MagicInputError` naming the candidates when there are none, several, or
    ``name`` is not one of them."""
    found = candidates(ns)
    listed = ", ".join(f"{n} ({k})" for n, k in sorted(found.items())) or "none"
    how = ("start one first, e.g. rc = ipyparallel.Cluster(n=4).start_and_connect_sync(), or "
           "client = distributed.Client(LocalCluster())")
    if name:
        if name not in found:
            what = "is not defined" if name not in ns else f"is a {type(ns[name]).__name__}"
            raise MagicInputError(f"--cluster {name}: {name} {what}, not an ipyparallel Client/view or a "
                                  f"Dask Client; cluster objects here: {listed}")
        return _BRIDGES[found[name]](name, ns[name])
    if not found:
        raise MagicInputError(f"--cluster: no ipyparallel Client/view or Dask Client in the namespace; {how}")
    if len(found) > 1:
        raise MagicInputError(f"--cluster: several cluster objects here ({listed}); name one: --cluster NAME")
    (only, kind), = found.items()
    return _BRIDGES[kind](only, ns[only])

