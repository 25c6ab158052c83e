"""The adapter over the cluster engines users already run: ipyparallel and Dask distributed.

A :class:`Bridge` runs one of our engine-side functions (named by its dotted path in
:mod:`torchgpu_magic.cluster.remote`) on every engine or worker at once and gathers plain data, one
:class:`Reply` per engine, each under a time limit. An engine that is dead, too slow, lacks torch or lacks
this package gets a reply that says so (``problem`` and ``message``) while the others still report.

ipyparallel (``Client`` / ``DirectView`` / ``LoadBalancedView``: one ``apply_async`` per engine) and
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
    """An ipyparallel ``Client`` or view: one ``apply_async`` per engine, so one slow or dead engine
    costs the others nothing."""

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
        from ipyparallel import error

        from . import remote

        keys = self.engines() if keys is None else list(keys)
        alive = set(self.client.ids)
        start = time.monotonic()
        pending = {}
        replies = {}
        for key in keys:
            reply = Reply(self.label(key), key, False)
            replies[key] = reply
            if key not in alive:
                reply.problem, reply.message = "dead", "the controller no longer lists this engine"
                continue
            try:
                pending[key] = self.client[key].apply_async(remote.call, target, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - one engine's failure is its reply, not ours
                _from_exception(reply, type(exc).__name__, str(exc))
        deadline = start + timeout
        for key, result in pending.items():
            reply = replies[key]
            try:
                data = result.get(timeout=max(0.0, deadline - time.monotonic()))
            except error.TimeoutError:
                reply.problem, reply.message = "timeout", f"no answer in {timeout:g} s"
            except error.RemoteError as exc:
                _from_exception(reply, exc.ename, str(exc.evalue))
            except Exception as exc:  # noqa: BLE001 - EngineError (died), unreachable controller, ...
                _from_exception(reply, type(exc).__name__, str(exc))
            else:
                _envelope(reply, data)
            reply.seconds = time.monotonic() - start
        return [replies[key] for key in keys]


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

