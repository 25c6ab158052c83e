"""The adapter over an ipyparallel ``Client`` or view.

An engine where this client has a request pending (a ``%px`` cell, a task) is busy and is not asked: a
request sent there would wait behind that cell and answer after it. Its reply says since when, from the
client's own record. Where the only requests pending there are ours (labelled :data:`LABEL`: an earlier
call that never answered), the controller is asked its queue counts (it answers from memory, in
milliseconds, even while every engine computes): ours stuck, or another client's work ahead of it. The
other engines get our call at once, one ``apply_async`` to a DirectView (the function serialised once, one
result set), with no question first: an engine that answers within :data:`GRACE` had nothing long before
ours. Where one has not answered by then, the controller is asked exactly what it counts there besides
ours (work this client did not send: another notebook's client, a task not yet placed); an engine busy so
gets our request withdrawn (aborted, so it never runs behind that work) and the same 'busy' reply. Each
engine's answer is read on its own under the deadline. A controller that does not answer means the
cluster is gone: one line.

A request of ours that ran past its limit, or that Ctrl-C cut short, is aborted where it still waits and
interrupted (SIGINT, as ``%px`` does on Ctrl-C) where it runs, so no engine keeps running our call; an
engine is interrupted only where the controller's count showed that what runs there is ours.
"""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Optional, Sequence

from .bridge import (
    ASK_TIMEOUT,
    DEFAULT_TIMEOUT,
    STOP_WAIT,
    Bridge,
    ClusterGone,
    Reply,
    envelope,
    from_exception,
    when,
)

LONG = ("cudatime",)
"""The engine functions that run long enough to be worth interrupting when past their time limit."""
QUEUE_PAUSES = (0.002, 0.004, 0.008, 0.016, 0.02)
"""Seconds between the questions to the controller while it still counts a request just answered (50 ms
in all, after which a count above this client's own is another client's work: busy)."""
LABEL = "torchgpu_magic"
"""The label our requests carry in the client's metadata: how any call, of any magic, tells ours among the
requests the client still waits for."""
LOOKS = (0.0, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128)
"""Seconds before each exact look at the controller's count for a call past :data:`GRACE` (a quarter
second in all): it may still count a request just answered, longer on a loaded machine, and a count above
ours must outlast them all before our call is withdrawn as behind another client's work."""
GRACE = 0.05
"""Seconds our call, sent to an engine with nothing of this client's pending there, may take before the
controller is asked what it counts there: an answer within it means nothing long ran before ours; past it,
work counted there that is not ours (another client's) makes the engine busy."""
FIX_STALE = ("connect again: rc = ipp.Client() for engines started by ipcluster or your job script, or start "
             "the cluster again (rc = ipp.Cluster(n=4).start_and_connect_sync())")


class IPyParallelBridge(Bridge):
    """An ipyparallel ``Client`` or view (see the module's docstring)."""

    def __init__(self, name: str, obj: Any) -> None:
        client = getattr(obj, "client", None) or obj
        super().__init__(name, obj, "ipyparallel")
        self.client = client
        self._seen_busy: dict = {}  # engine -> when this bridge first saw it busy (epoch)

    def engines(self) -> list:
        targets = getattr(self.obj, "targets", None)
        if targets is None or targets == "all" or self.obj is self.client:
            return list(self.client.ids)
        return [targets] if isinstance(targets, int) else list(targets)

    def label(self, key: Any) -> str:
        return f"engine {key}"

    # ---- the controller's view of the queues ----------------------------------------------------------
    def _ask(self, keys: Sequence[Any]) -> Any:
        """Send the question for the queue counts of engines ``keys`` (counts: its lists of message ids
        would bring every request an engine ever completed): the future of its answer. ``Client.queue_status``
        has no time limit (a stopped controller would hold the notebook for ever), so the question goes
        through the client's own sender and :meth:`_counts` waits with one."""
        client = self.client
        return client._send(client._query_stream, "queue_request",
                            content={"targets": list(keys), "verbose": False})

    def _counts(self, future: Any, keys: Sequence[Any]) -> dict:
        """``{engine: requests queued or running there}`` from the answer ``future`` of :meth:`_ask`."""
        content = self._answer(future, "queue")
        return {key: int((content.get(str(key)) or {}).get("queue", 0))
                + int((content.get(str(key)) or {}).get("tasks", 0)) for key in keys}

    def _answer(self, future: Any, what: str, strict: bool = True) -> Optional[dict]:
        """The content of the controller's answer ``future``, within :data:`ASK_TIMEOUT`; the cluster
        gone (one line) where it does not answer, and where it refuses (None then without ``strict``)."""
        if not future.wait(ASK_TIMEOUT):
            where = (getattr(self.client, "_config", None) or {}).get("registration", "")
            at = f" at {where}" if where else ""
            raise ClusterGone(f"--cluster {self.name}: the ipyparallel controller{at}"
                              f" did not answer in {ASK_TIMEOUT:g} s: the cluster was stopped or its "
                              f"controller died; {FIX_STALE}")
        content = future.result()["content"]
        if content.get("status") == "ok":
            return content
        if not strict:
            return None
        raise ClusterGone(f"--cluster {self.name}: the controller refused the {what} request "
                          f"({content.get('ename', '')}: {content.get('evalue', '')}); {FIX_STALE}")

    def _settled(self, counts: dict, keys: Sequence[Any]) -> dict:
        """``counts`` for the engines ``keys`` (none of ours sent this call), asked again while the
        controller counts more there than this client knows to be pending. The controller drops a request
        a moment after its reply reaches us: it is asked again after growing pauses
        (:data:`QUEUE_PAUSES`), so that a call right after the last waits no longer than the controller
        takes to forget it."""
        for pause in QUEUE_PAUSES:
            if not any(counts[key] > len(self._waiting(key)) for key in keys):
                break
            time.sleep(pause)
            counts.update(self._counts(self._ask(keys), keys))
        return counts

    def _others(self, sent: dict) -> dict:
        """``{engine: requests the controller counts there besides ours}`` for the engines of ``sent``
        (``{engine: our msg_id}``), exactly: the controller is asked which of ours it has recorded and, in
        the same round trip (it answers its questions in order), its counts. A controller that keeps no
        records (``--nodb``) has had :data:`GRACE` to count ours: it is taken to have."""
        client = self.client
        content = {"query": {"msg_id": {"$in": list(sent.values())}}, "keys": ["msg_id"]}
        records = client._send(client._query_stream, "db_request", content=content)
        counts = self._counts(self._ask(list(sent)), list(sent))
        content = self._answer(records, "records", strict=False)
        seen = {r.get("msg_id") for r in content.get("records", ())} if content else set(sent.values())
        return {key: counts[key] - (msg_id in seen) for key, msg_id in sent.items()}

    def _waiting(self, key: Any) -> list:
        """This client's requests to engine ``key`` not answered yet (the user's ``%px`` cells and ours),
        from the client's own record."""
        uuid = self.client._engines.get(key)
        return list(self.client._outstanding_dict.get(uuid, ())) if uuid is not None else []

    def _busy(self, reply: Reply, count: int, now: float, withdrawn: bool = False) -> None:
        """Fill the reply of an engine with ``count`` requests queued: 'stuck' when they are all ours
        (an earlier request of ours never answered), else 'busy' since the oldest request's submission
        this client knows of (else since this bridge first saw it busy: 'at least'); ``withdrawn``: ours
        of this call was sent there and aborted."""
        waiting = self._waiting(reply.key)
        meta = self.client.metadata
        ours = [m for m in waiting if _ours(meta, m)]
        others = count - len(ours)
        if ours and others <= 0:
            since = _earliest(meta, ours) or now
            reply.fail("stuck", f"not answering since {when(since, now)}: our request from then is still "
                                "queued there (the engine is stopped, blocked in C code, or overloaded)",
                       since)
            return
        since = _earliest(meta, [m for m in waiting if m not in ours])
        known = "" if since else "at least "
        since = since or self._seen_busy.setdefault(reply.key, now)
        more = f"; {others - 1} more queued" if others > 1 else ""
        what = ("our request was withdrawn, so nothing of ours runs behind it" if withdrawn
                else "not asked, so nothing queues behind it")
        reply.fail("busy", f"busy since {known}{when(since, now)}: a %px cell or task runs there{more}; "
                           f"{what}", since)

    # ---- running our function ---------------------------------------------------------------------------
    def run(self, target: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
            keys: Optional[Sequence[Any]] = None, only: Optional[Sequence[Any]] = None,
            **kwargs: Any) -> list:
        keys = self.engines() if keys is None else list(keys)
        alive = set(self.client.ids)
        start, now = time.monotonic(), time.time()
        replies = {key: Reply(self.label(key), key, False) for key in keys}
        for key in keys:
            if key not in alive:
                replies[key].fail("dead", "the controller no longer lists this engine")
        asked = [key for key in keys if key in alive]
        if getattr(self.client, "_closed", False):
            raise ClusterGone(f"--cluster {self.name}: this ipyparallel Client was closed; {FIX_STALE}")
        if not asked:
            return [replies[key] for key in keys]
        wanted = asked if only is None else [key for key in asked if key in set(only)]
        for key in set(asked) - set(wanted):
            replies[key].ok = True
        pending = {key: self._waiting(key) for key in asked}
        meta = self.client.metadata
        theirs = [key for key in asked if not all(_ours(meta, m) for m in pending[key])]
        for key in theirs:  # the user's own %px cell or task is pending there: busy, from the client's record
            self._busy(replies[key], len(pending[key]), now)
        known = [key for key in asked if key not in theirs and (key not in wanted or pending[key])]
        fresh = [key for key in wanted if not pending[key]]
        question = self._ask(known) if known else None
        sent: list = []
        cleared: set = set()  # engines where what runs our call is known to be ours (may be interrupted)
        withdrawn: set = set()  # engines busy with work not ours, where ours was aborted
        try:
            sent = self._send(fresh, replies, target, args, kwargs) if fresh else []
            counts = self._settled(self._counts(question, known), known) if known else {}
            for key in known:
                if counts[key]:
                    self._busy(replies[key], counts[key], now)
            late = [key for key in known if not counts[key] and key in wanted]
            self._confirm(sent, replies, cleared, withdrawn, now)
            if late:
                sent += self._send(late, replies, target, args, kwargs)
                cleared.update(late)
            for key in asked:
                if key not in withdrawn and key not in theirs and not counts.get(key):
                    self._seen_busy.pop(key, None)
            for part, result in sent:
                self._gather(part, result, replies, timeout, start, withdrawn)
        except KeyboardInterrupt:
            stopped, left = self._stop(sent, wait=True, signal=cleared, skip=withdrawn)
            raise self.interrupted(target, [self.label(k) for k in stopped],
                                   [self.label(k) for k in left]) from None
        late_sent = [(part, result) for part, result in sent if not result.ready()]
        if late_sent:
            self._stop(late_sent, wait=False, signal=cleared if target in LONG else set(), skip=withdrawn)
        return [replies[key] for key in keys]

    def _confirm(self, sent: list, replies: dict, cleared: set, withdrawn: set, now: float) -> None:
        """The engines ``sent`` our call with nothing of this client's pending there: those that answer
        within :data:`GRACE` had nothing long before ours (the usual case: the controller is never asked);
        for the rest the controller is asked exactly what it counts there besides ours. An engine with
        nothing else is ``cleared``. Where it counts more, it is asked again after growing pauses
        (:data:`LOOKS`) while ours has not answered, as it may still count a request just answered; an
        engine still busy with work not ours (another client's, a task) gets ours aborted (it never
        runs behind that work), its reply 'busy', and joins ``withdrawn``."""
        deadline = time.monotonic() + GRACE
        unanswered = {}
        for keys, result in sent:
            if not result.wait(max(0.0, deadline - time.monotonic())):
                unanswered.update((key, part) for key, part in _per_engine(keys, result) if not part.ready())
        others: dict = {}
        for pause in LOOKS:
            until = time.monotonic() + pause
            for part in unanswered.values():
                part.wait(max(0.0, until - time.monotonic()))
            unanswered = {key: part for key, part in unanswered.items() if not part.ready()}
            if not unanswered:
                return
            others = self._others({key: part.msg_ids[0] for key, part in unanswered.items()})
            cleared.update(key for key, count in others.items() if count <= 0)
            unanswered = {key: part for key, part in unanswered.items() if others[key] > 0}
            if not unanswered:
                return
        for key, part in unanswered.items():
            try:
                self.client.abort(jobs=part.msg_ids, targets=[key], block=False)
            except Exception:  # noqa: BLE001 - a controller gone now: the reply says busy all the same
                pass
            withdrawn.add(key)
            self._busy(replies[key], others[key] + 1, now, withdrawn=True)

    def _send(self, live: list, replies: dict, target: str, args: tuple, kwargs: dict) -> list:
        """Send the call to every engine in ``live``: ``[(keys, AsyncResult)]``. One DirectView apply;
        should it fail (an engine gone between the check and the send), one apply per engine, so that
        only the engine at fault gets the error."""
        from . import remote

        call = remote.Entry()  # by reference: ipyparallel would ship remote.call's code every time
        try:
            return [(live, self._view(live).apply_async(call, target, args, kwargs))]
        except Exception:  # noqa: BLE001 - retried per engine below, where each failure is that engine's
            sent = []
            for key in live:
                try:
                    sent.append(([key], self._view([key]).apply_async(call, target, args, kwargs)))
                except Exception as exc:  # noqa: BLE001 - one engine's failure is its reply, not ours
                    from_exception(replies[key], type(exc).__name__, str(exc))
            return sent

    def _view(self, keys: list) -> Any:
        """A DirectView on the engines ``keys`` whose requests carry :data:`LABEL`."""
        view = self.client[keys]
        view.label = LABEL
        return view

    def _gather(self, keys: list, result: Any, replies: dict, timeout: float, start: float,
                withdrawn: set) -> None:
        """Wait for ``result`` (the engines ``keys``) until ``start + timeout``, then fill each engine's
        reply: all at once when every engine answered (the usual tick), else engine by engine from
        ``result.split()``, an engine without an answer getting 'timeout'. An engine in ``withdrawn``
        (its reply says busy already) is not waited for."""
        if not withdrawn.intersection(keys):
            result.wait(max(0.0, start + timeout - time.monotonic()))
        elapsed = time.monotonic() - start
        if result.ready():
            answers = result.get(0, return_exceptions=True)
            took = _seconds(result, elapsed)
            for key, answer, seconds in zip(keys, answers, took):
                if key not in withdrawn:
                    self._fill(replies[key], answer, seconds)
            return
        for key, part in _per_engine(keys, result):
            if key in withdrawn:
                continue
            part.wait(max(0.0, start + timeout - time.monotonic()))
            reply = replies[key]
            if part.ready():
                took = _seconds(part, time.monotonic() - start)[0]
                self._fill(reply, part.get(0, return_exceptions=True), took)
            else:
                reply.fail("timeout", f"no answer in {timeout:g} s; our call there was stopped")
                reply.seconds = time.monotonic() - start

    def _fill(self, reply: Reply, answer: Any, seconds: float) -> None:
        """One engine's answer (the envelope from :func:`remote.call`, or the exception ipyparallel
        stored: RemoteError, EngineError for an engine that died) into its reply."""
        from ipyparallel import error

        if isinstance(answer, error.RemoteError):
            from_exception(reply, answer.ename, str(answer.evalue), self._where(reply.key, answer.ename))
        elif isinstance(answer, BaseException):
            from_exception(reply, type(answer).__name__, str(answer))
        else:
            envelope(reply, answer)
        reply.seconds = seconds

    def _where(self, key: Any, ename: str) -> str:
        """For an import failure on engine ``key``: its host and the Python it runs (asked with a
        standard-library function, which needs nothing of ours there), for the install hint."""
        if ename not in ("ModuleNotFoundError", "ImportError"):
            return ""
        import os
        import socket
        from multiprocessing.spawn import get_executable

        view = self.client[key]
        try:
            host = view.apply_async(socket.gethostname).get(ASK_TIMEOUT)
            python = os.fsdecode(view.apply_async(get_executable).get(ASK_TIMEOUT))
        except Exception:  # noqa: BLE001 - the hint is a courtesy; the reply says what failed anyway
            return ""
        return f"{host}, Python {python}"

    # ---- stopping our calls -----------------------------------------------------------------------------
    def _stop(self, sent: list, wait: bool, signal: set, skip: set) -> tuple:
        """Abort our requests still queued and SIGINT the engines of ``signal`` running one (those where
        the controller's count showed that what runs is ours); with ``wait`` (Ctrl-C), ask the controller
        about the others, and wait a little for them to give up. The engines of ``skip`` (ours withdrawn
        there already) are left alone. Returns (engines interrupted, engines still running our call).
        Past a time limit nothing waits: a stopped engine keeps our request queued, and the next call
        finds it 'stuck' from the controller's queue. A quick call past its limit is not signalled: it
        ends by itself, and a signal arriving just after would hit the next request."""
        waiting = {}
        for part, result in sent:
            for key, part_result in _per_engine(part, result):
                if not part_result.ready() and key not in skip:
                    waiting[key] = part_result
        if not waiting:
            return [], []
        client = self.client
        ours = {result.msg_ids[0] for result in waiting.values()}
        try:
            client.abort(jobs=sorted(ours), targets=sorted(waiting), block=False)
        except Exception:  # noqa: BLE001 - a controller gone now: nothing more to stop
            return [], sorted(waiting)
        unsure = {key: part.msg_ids[0] for key, part in waiting.items() if key not in signal}
        if wait and unsure:  # Ctrl-C before the controller was asked: ask now whether what runs is ours
            try:
                signal = signal | {key for key, others in self._others(unsure).items() if others <= 0}
            except (ClusterGone, KeyboardInterrupt):
                pass
        # aborting ours does nothing once it runs; the signal stops it
        running = sorted(key for key in waiting if key in signal)
        if running:
            client.send_signal("SIGINT", targets=running, block=False)
        if not wait:
            return running, []
        deadline = time.monotonic() + STOP_WAIT
        left = []
        for key, part_result in waiting.items():
            try:
                part_result.wait(max(0.0, deadline - time.monotonic()))
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
                pass
            if not part_result.ready() and key in running:
                left.append(key)
        return running, left


def _seconds(result: Any, elapsed: float) -> list:
    """Each engine's round trip in ``result`` from ipyparallel's metadata (sent to received);
    ``elapsed`` where the metadata lacks it. Read from the result's records: ``result["submitted"]``
    would parse every date of the records with dateutil (the engine's 'started' and 'completed' too), a
    tenth of a bare round trip, where only these two are needed, one of them a datetime already and the
    other ISO 8601 text (parsed here by the standard library; ipyparallel's way where that fails)."""
    records = getattr(result, "_metadata", None)
    stamps = [(_stamp(record.get("submitted")), _stamp(record.get("received"))) for record in records or ()]
    if records is None or any(stamp is False for pair in stamps for stamp in pair):
        submitted, received = result["submitted"], result["received"]
        stamps = list(zip(submitted, received)) if isinstance(submitted, list) else [(submitted, received)]
    return [(r - s).total_seconds() if r is not None and s is not None else elapsed for s, r in stamps]


def _ours(meta: Any, msg_id: str) -> bool:
    """Whether the request ``msg_id`` is one of ours (:data:`LABEL`), from the client's metadata ``meta``."""
    return msg_id in meta and meta[msg_id].get("label") == LABEL


def _per_engine(keys: list, result: Any) -> Any:
    """``(engine, its AsyncResult)`` for each of ``keys``, the engines ``result`` was sent to."""
    return zip(keys, result.split() if len(keys) > 1 else [result])


def _earliest(meta: Any, msg_ids: list) -> Optional[float]:
    """The earliest submission (epoch) of the requests ``msg_ids`` in the client's metadata ``meta``; None
    where it records none."""
    stamps = [meta[m].get("submitted") for m in msg_ids if m in meta]
    return min((stamp.timestamp() for stamp in stamps if stamp is not None), default=None)


def _stamp(value: Any) -> Any:
    """A metadata date as a timezone-aware datetime, None where there is none, False where it cannot be
    read so (then ipyparallel reads them all)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return False
    if value is None:
        return None
    return value if isinstance(value, datetime) and value.tzinfo is not None else False
