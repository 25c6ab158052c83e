"""The adapter over a Dask ``distributed.Client``.

One ``Client.run`` per call reaches every worker at once (the scheduler fans it out), with a deadline
(``callback_timeout``): no thread per worker, nothing left behind when a worker hangs. On each worker
the call runs in a thread (:func:`~torchgpu_magic.cluster.dask_worker.dask_call`), so its event loop keeps
answering the scheduler while a cell is timed there, and the worker answers by its own deadline, a little
shorter than ours, so that one slow worker costs the others nothing.

A worker whose event loop is blocked cannot answer at all and would hold the ``Client.run`` of all: the
scheduler's record of its heartbeats shows it (``last_seen``), so such a worker is left out and its row
says since when it is silent, filled from its last heartbeat (process memory, and GPU memory where
distributed's NVML monitoring runs). A client whose cluster was closed, or whose scheduler does not
answer, is one line.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional, Sequence

from .bridge import (
    ASK_TIMEOUT,
    DEFAULT_TIMEOUT,
    FIX_DASK_PACKAGE,
    STOP_WAIT,
    Bridge,
    ClusterGone,
    Reply,
    envelope,
    from_exception,
    when,
)

FIX_CLOSED = ("connect again: client = distributed.Client(cluster) for a cluster object of yours, or "
              "Client('tcp://scheduler:8786')")
REFRESH = 10.0
"""Seconds the scheduler's list of workers is reused between calls (a live panel's ticks, one magic after
another: :class:`Workers` keeps it across bridges), unless the client's own count of workers or its
cluster object's says it changed: new workers appear within this time, and a gone one's row says so at
once (a call that finds a worker gone asks the scheduler again)."""
FRESH = ("cudatime",)
"""The engine functions that leave out busy workers, from the task counts of their last heartbeat: the
scheduler is asked for them on every call."""
SILENT = 5.0
"""After a call ran past its deadline, a worker whose last heartbeat is this many heartbeat intervals
older than the newest is the one that held it: left out until its heartbeats resume."""
LONG_SILENT = 10.0
"""Without a call past its deadline, only a worker silent this many seconds (or 10 heartbeat intervals)
is left out before asking: a worker whose event loop was busy a few seconds (importing torch in a
``Client.run``) is asked as usual."""
TIMEOUTS = (TimeoutError, asyncio.TimeoutError)


GONE = "gone:"
"""The key of a worker of the client's own cluster object that died: this prefix and its name."""
GONE_MESSAGE = ("its worker process exited, and a LocalCluster does not start it again (an interrupt of "
                "the kernel that started the cluster, Ctrl-C or the stop button, also reaches its worker "
                "processes)")


class Workers:
    """The scheduler's view of one client's workers, as its bridges keep it between calls: every bridge
    of the same client given the same :class:`Workers` (by :class:`torchgpu_magic.cluster.Kept`) asks
    the scheduler at most once per :data:`REFRESH` seconds. It holds no reference to the client."""

    def __init__(self) -> None:
        self.records: dict = {}  # address -> the scheduler's record of the worker (identity)
        self.labels: dict = {}  # address -> 'worker NAME'
        self.fetched = -REFRESH  # when the records were fetched (monotonic)
        self.held: dict = {}  # address -> last heartbeat of a worker left out for holding a call


class DaskBridge(Bridge):
    """A distributed ``Client`` (see the module's docstring). ``cluster_ref``: how the user reaches the
    client's cluster object (its name when ``--cluster`` named it), for the fix when its workers died.
    ``kept``: the :class:`Workers` the client's earlier bridges fetched (a new one by default)."""

    def __init__(self, name: str, obj: Any, cluster_ref: str = "", kept: Optional[Workers] = None) -> None:
        super().__init__(name, obj, "dask")
        self.kept = Workers() if kept is None else kept
        self.cluster_ref = cluster_ref or f"{name}.cluster"

    # ---- the scheduler's view ---------------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`ClusterGone` (one line) unless the client is connected."""
        status = getattr(self.obj, "status", "running")
        if status == "running":
            return
        address = scheduler_address(self.obj)
        at = f" at {address}" if address else ""
        closed = "is closed (its cluster was closed, or client.close() was called)"
        why = {"closing": closed, "closed": closed,
               "connecting": f"lost its scheduler{at} and is trying to reconnect (the cluster stopped?)"}
        said = why.get(status, f"is {status}, not running")
        raise ClusterGone(f"--cluster {self.name}: this Dask Client {said}; {FIX_CLOSED}")

    def identity(self) -> dict:
        """Every worker's record from the scheduler (``{address: identity}``), under a time limit."""
        client = self.obj
        kwargs = {"n_workers": -1} if _takes_n_workers(client) else {}
        try:
            info = client.sync(client.scheduler.identity, callback_timeout=ASK_TIMEOUT, **kwargs)
        except TIMEOUTS:
            raise ClusterGone(f"--cluster {self.name}: the Dask scheduler at {client.scheduler.address} did "
                              f"not answer in {ASK_TIMEOUT:g} s (stopped, or unreachable); "
                              f"{FIX_CLOSED}") from None
        except OSError as exc:
            raise ClusterGone(f"--cluster {self.name}: the Dask scheduler cannot be reached ({exc}); "
                              f"{FIX_CLOSED}") from None
        records = dict(info.get("workers") or {})
        self.kept.labels = {addr: f"worker {w.get('name', addr)}" for addr, w in records.items()}
        self.kept.records, self.kept.fetched = records, time.monotonic()
        return records

    def current(self) -> bool:
        """Whether the workers in hand may stand for the scheduler's list now: some (none is a cluster
        the user is about to start workers for), fetched less than :data:`REFRESH` seconds ago, as many
        as the client's own count of the scheduler's workers (which distributed refreshes every 2 s by
        itself), and none of them a worker of the client's own cluster object that has closed since."""
        if not self.kept.records or time.monotonic() - self.kept.fetched >= REFRESH:
            return False
        counted = (getattr(self.obj, "_scheduler_identity", None) or {}).get("n_workers")
        if isinstance(counted, int) and counted != len(self.kept.records):
            return False
        listed = {record.get("name") for record in self.kept.records.values()}
        return not any(name in listed for name in self._closed())

    def engines(self, fresh: bool = False) -> list:
        """The workers the scheduler lists, and those of the client's own cluster object that died (keys
        :data:`GONE` + name: their replies say so, with what to do), by name. None at all is one line.
        ``fresh``: the list in hand was just fetched or judged current (by :meth:`run`): not asked again."""
        self.check()
        workers = self.kept.records if fresh or self.current() else self.identity()
        names = {key: record.get("name", key) for key, record in workers.items()}
        names.update((GONE + str(name), _as_name(str(name))) for name in self.gone())
        if not names:
            address = scheduler_address(self.obj) or "its address"
            raise ClusterGone(f"--cluster {self.name}: the Dask scheduler at {address} lists no workers "
                              f"(none started yet, or all stopped); start some (dask worker {address}), or "
                              "scale your cluster up")
        return sorted(names, key=lambda key: _order(names[key]))

    def label(self, key: Any) -> str:
        if isinstance(key, str) and key.startswith(GONE):
            return f"worker {key[len(GONE):]}"
        return self.kept.labels.get(key, str(key))  # the client's bridges share one list

    def gone(self) -> list:
        """The names of the :meth:`_closed` workers that the scheduler no longer lists: they will not
        come back."""
        listed = {record.get("name") for record in self.kept.records.values()}
        return [name for name in self._closed() if name not in listed]

    def _closed(self) -> list:
        """The names of the workers of the client's own cluster object (a LocalCluster, whose spec names
        them) whose nanny (or in-process worker) is closed; [] for a client of a cluster started
        elsewhere, which this cannot see."""
        cluster = getattr(self.obj, "cluster", None)
        spec, servers = getattr(cluster, "worker_spec", None), getattr(cluster, "workers", None)
        if not isinstance(spec, dict) or not isinstance(servers, dict):
            return []
        return [name for name in spec if getattr(getattr(servers.get(name), "status", None), "name", "closed")
                in ("closed", "closing", "failed", "closing_gracefully")]

    def dead_fix(self) -> str:
        """What to do about workers that died: start the cluster's workers afresh, or the worker."""
        spec = getattr(getattr(self.obj, "cluster", None), "worker_spec", None)
        if isinstance(spec, dict):
            ref = self.cluster_ref
            # scale(0) must have closed them before scale(N): in one cell the two race, and none start
            return (f"start its workers afresh: {ref}.scale(0), then {ref}.scale({len(spec)}) in a cell of "
                    "its own (what they held is lost), or start a new cluster")
        return "restart the worker (its dask worker command, or your launcher); the other rows are current"

    def silent(self, strict: bool = False) -> dict:
        """``{address: last heartbeat (epoch)}`` of the workers left out for silence: those whose
        heartbeats stopped (for :data:`LONG_SILENT`; with ``strict``, after a call ran past its deadline,
        for :data:`SILENT` intervals), kept out until a newer heartbeat shows. The newest heartbeat the
        scheduler got stands for its clock (the notebook's may differ)."""
        seen = {addr: w.get("last_seen") for addr, w in self.kept.records.items() if w.get("last_seen")}
        if not seen:
            return {}
        newest = max(seen.values())
        beat = _heartbeat(len(seen))
        limit = SILENT * beat if strict else max(LONG_SILENT, 2 * SILENT * beat)
        late = {addr: last for addr, last in seen.items() if newest - last > limit}
        held = {**self.kept.held, **late}  # replaced whole: a panel's thread may use the same Workers
        self.kept.held = {addr: last for addr, last in held.items() if addr in seen and seen[addr] <= last}
        return dict(self.kept.held)

    # ---- running our function ---------------------------------------------------------------------------
    def run(self, target: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
            keys: Optional[Sequence[Any]] = None, only: Optional[Sequence[Any]] = None,
            **kwargs: Any) -> list:
        """As :meth:`Bridge.run`. A worker list kept from an earlier call (:meth:`current`) is not used to
        name the workers to ask when all are asked: asking an address the scheduler no longer lists
        holds the call for distributed's connect timeout (30 s). The call then goes to every worker the
        scheduler has now, and if those that answered are not the ones in hand (a worker came or went
        since), the list is fetched afresh and the rows made from it with the answers already in,
        nobody asked twice. (A live panel's calls to some workers, ``keys`` or ``only``, name them
        from the list in hand, as they did before the list was kept across bridges.)"""
        self.check()
        reused = self.current() and target not in FRESH
        if not reused:
            self.identity()
        known: dict = {}
        replies, lost = self._run(target, args, kwargs, timeout, keys, only, known, reused)
        if lost:
            self.identity()
            replies, _ = self._run(target, args, kwargs, timeout, keys, only, known, False)
        return replies

    def _run(self, target: str, args: tuple, kwargs: dict, timeout: float, keys: Optional[Sequence[Any]],
             only: Optional[Sequence[Any]], known: dict, everyone: bool) -> tuple:
        """One pass of :meth:`run`: (replies, whether the list in hand turned out stale). ``known``
        holds the answers already in (not asked again; this pass adds its own); ``everyone``: ask every
        worker the scheduler lists now rather than those in hand (when all of those are to be asked)."""
        every = self.engines(fresh=True)
        silent = self.silent()
        if self.kept.held or silent:
            self.identity()  # a worker looks silent: see whether its heartbeats came back
            every, everyone, silent = self.engines(fresh=True), False, None
        keys = every if keys is None else list(keys)
        replies = {key: Reply(self.label(key), key, False) for key in keys}
        strict = only is not None
        live = self._triage(target, keys, replies, strict, None if strict else silent)  # unasked: no cost
        if only is not None:
            for key in live:
                replies[key].ok = key not in only
            live = [key for key in live if key in set(only)]
        everyone = everyone and only is None and live == [key for key in every if key in self.kept.records]
        ask = [key for key in live if key not in known]
        answers = self._ask(target, ask, args, kwargs, timeout, everyone) if ask else {}
        if answers is None:  # past the deadline: find the workers that stopped heartbeating, ask the rest
            self.identity()
            fresh = self._triage(target, ask, replies, strict=True)
            answers = (self._ask(target, fresh, args, kwargs, min(timeout, ASK_TIMEOUT))
                       if fresh and len(fresh) < len(ask) else None) or {}
            for key in fresh:
                if key not in answers:
                    replies[key].fail("timeout", f"no answer in {timeout:g} s")
            self._fill(answers, replies)
            return [replies[key] for key in keys], False
        known.update(answers)
        failed = self._fill({key: known[key] for key in live if key in known}, replies)
        stale = everyone and (set(answers) != set(ask) or bool(failed))
        return [replies[key] for key in keys], stale
    def _triage(self, target: str, keys: list, replies: dict, strict: bool = False,
                silent: Optional[dict] = None) -> list:
        """The workers to ask; the others' replies say why not (gone, silent, or busy for a timing).
        ``silent``: :meth:`silent` as just read, where the caller has it."""
        silent = self.silent(strict) if silent is None else silent
        live = []
        for key in keys:
            record = self.kept.records.get(key)
            if isinstance(key, str) and key.startswith(GONE):
                replies[key].fail("dead", GONE_MESSAGE, fix=self.dead_fix())
            elif record is None:
                replies[key].fail("dead", "the scheduler no longer lists this worker", fix=self.dead_fix())
            elif key in silent:
                replies[key].fail("stuck", f"silent since {when(silent[key])}: no heartbeat since then (its "
                                           "event loop is blocked by a call holding it, or the process is "
                                           "stopped)", silent[key])
                replies[key].value = heartbeat_figures(record)
            elif target == "cudatime" and _executing(record):
                replies[key].fail("busy", f"busy: {_executing(record)} task(s) running there (its last "
                                          "heartbeat); timing beside them would measure both, so not timed")
            else:
                live.append(key)
        return live

    def _ask(self, target: str, keys: list, args: tuple, kwargs: dict, timeout: float,
             everyone: bool = False) -> Optional[dict]:
        """One ``Client.run`` to ``keys`` (with ``everyone``, to every worker the scheduler lists now,
        ``keys`` being those expected): ``{address: envelope or exception}``; None past ``timeout``.
        Ctrl-C interrupts the call on the workers and raises :class:`ClusterInterrupted`."""
        from . import dask_worker

        call_id = dask_worker.call_id()
        deadline = timeout * 0.8 if timeout < 5 else timeout - 1.0  # the workers answer before we give up
        try:
            request = (target, args, kwargs, deadline, call_id, dask_worker.process_group())
            return self.obj.run(dask_worker.dask_call, request, workers=None if everyone else keys,
                                on_error="return", callback_timeout=timeout)
        except TIMEOUTS:
            return None
        except KeyboardInterrupt:
            told, left = self._interrupt(call_id, keys)
            dead = self._died(left)
            raise self.interrupted(target, [self.label(k) for k in told],
                                   [self.label(k) for k in left if k not in dead],
                                   [self.label(k) for k in dead], self.dead_fix()) from None

    def _died(self, keys: list) -> list:
        """Those of ``keys`` the scheduler no longer lists (asked afresh; none when it cannot say)."""
        if not keys:
            return []
        try:
            listed = self.identity()
        except (ClusterGone, Exception):  # noqa: BLE001 - then nothing is known to have died
            return []
        return [key for key in keys if key not in listed]

    def _interrupt(self, call_id: str, keys: list) -> tuple:
        """Stop ``call_id`` on the workers ``keys`` and wait (bounded) until none runs it, telling again
        those that still do (a worker that did not answer at first)."""
        from . import dask_worker

        deadline = time.monotonic() + STOP_WAIT
        told: set = set()
        left = list(keys)
        while left and time.monotonic() < deadline:
            limit = max(0.5, min(ASK_TIMEOUT, deadline - time.monotonic()))
            try:
                answers = self.obj.run(dask_worker.interrupt, call_id, workers=left, on_error="return",
                                       callback_timeout=limit)
                told |= {key for key, n in answers.items() if isinstance(n, int) and n}
                still = self.obj.run(dask_worker.running, workers=left, on_error="return",
                                     callback_timeout=limit)
            except (Exception, KeyboardInterrupt):  # noqa: BLE001 - nothing more can be done from here
                break
            left = [key for key in left if not isinstance(still.get(key), list) or call_id in still[key]]
            if left:
                time.sleep(0.1)
        return [key for key in keys if key in told], left

    def _fill(self, answers: dict, replies: dict) -> list:
        """Each worker's answer into its reply; returns the workers whose answer was a failure on the way
        (not of our function there, nor a missing package)."""
        from .dask_worker import answer_of

        missing, failed = [], []
        for key, answer in answers.items():
            reply = replies.get(key)
            if reply is None:
                continue
            answer = answer_of(answer)
            if isinstance(answer, BaseException):
                from_exception(reply, type(answer).__name__, str(answer))
                (missing if reply.message.startswith("No module named") else failed).append(key)
            else:
                envelope(reply, answer)
        if missing:
            self._where(missing, replies)
        return failed

    def _where(self, keys: list, replies: dict) -> None:
        """Add each worker's host and Python (standard-library calls, which need nothing of ours there)
        and the way to install on every worker from the notebook, to an import failure's message."""
        import socket
        from multiprocessing.spawn import get_executable

        try:
            hosts = self.obj.run(socket.gethostname, workers=keys, on_error="return",
                                 callback_timeout=ASK_TIMEOUT)
            pythons = self.obj.run(get_executable, workers=keys, on_error="return",
                                   callback_timeout=ASK_TIMEOUT)
        except Exception:  # noqa: BLE001 - the hint is a courtesy; the reply says what failed anyway
            hosts, pythons = {}, {}
        import os

        for key in keys:
            reply = replies[key]
            host, python = hosts.get(key), pythons.get(key)
            where = (f"{host}, Python {os.fsdecode(python)}" if isinstance(host, str)
                     and isinstance(python, (str, bytes)) else "")
            reply.host = host if isinstance(host, str) else reply.host
            reply.message += f" (on {where})" if where else ""
            reply.fix += FIX_DASK_PACKAGE if reply.problem == "no_package" else ""


def heartbeat_figures(record: dict) -> dict:
    """What a worker's last heartbeat says of its memory, in :func:`remote.memory_tick`'s shape: process
    memory, and its GPU's memory and utilisation where distributed's NVML monitoring runs."""
    metrics = record.get("metrics") or {}
    gpu = metrics.get("gpu") or {}
    out: dict = {"rss": metrics.get("memory"), "torch": [], "source": "heartbeat"}
    if gpu:
        spec = record.get("gpu") or {}
        out["gpus"] = [[0, None, spec.get("name"), gpu.get("memory-used"), spec.get("memory-total"),
                        gpu.get("utilization"), {}]]
    return out


def _executing(record: dict) -> int:
    counts = (record.get("metrics") or {}).get("task_counts") or {}
    return int(counts.get("executing", 0) or 0)


def _heartbeat(workers: int) -> float:
    """The interval distributed asks of each worker's heartbeats for a cluster this size."""
    try:
        from distributed.scheduler import heartbeat_interval
    except ImportError:
        return 1.0
    return float(heartbeat_interval(workers))


def scheduler_address(client: Any) -> str:
    """The address of the Dask ``client``'s scheduler ('' where it has none)."""
    return getattr(getattr(client, "scheduler", None), "address", "") or ""


def _as_name(text: str) -> Any:
    """A LocalCluster names its workers 0, 1, ...: the number back from a key's text."""
    return int(text) if text.isdigit() else text


def _order(name: Any) -> tuple:
    """Workers by name, numbers in numeric order (worker 2 before worker 10)."""
    return (0, name, "") if isinstance(name, int) else (1, 0, str(name))


def _takes_n_workers(client: Any) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):
        return False
