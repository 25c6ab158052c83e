"""The adapter over an ipyparallel ``Client`` or view.

Every call first asks the controller which engines have work queued (its queue status: it answers from
memory, in milliseconds, even while every engine computes). A busy engine is not asked: a request sent
there would wait behind the running ``%px`` cell and answer after it, so its reply says since when it is
busy instead, and nothing of ours queues behind the user's work. The other engines get one
``apply_async`` to a DirectView (the function serialised once, one result set), each engine's answer read
on its own under the deadline. A controller that does not answer means the cluster is gone: one line.

A request of ours that ran past its limit, or that Ctrl-C cut short, is aborted where it still waits and
interrupted (SIGINT, as ``%px`` does on Ctrl-C) where it runs, so no engine keeps running our call.
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
FIX_STALE = ("connect again: rc = ipp.Client() for engines started by ipcluster or your job script, or start "
             "the cluster again (rc = ipp.Cluster(n=4).start_and_connect_sync())")


class IPyParallelBridge(Bridge):
    """An ipyparallel ``Client`` or view (see the module's docstring)."""

    def __init__(self, name: str, obj: Any) -> None:
        client = getattr(obj, "client", None) or obj
        super().__init__(name, obj, "ipyparallel")
        self.client = client
        self._ours: dict = {}  # msg_id -> (engine, sent at, epoch) of our requests not answered yet
        self._seen_busy: dict = {}  # engine -> when this bridge first saw it busy (epoch)

    def engines(self) -> list:
        targets = getattr(self.obj, "targets", None)
        if targets is None or targets == "all" or self.obj is self.client:
            return list(self.client.ids)
        return [targets] if isinstance(targets, int) else list(targets)

    def label(self, key: Any) -> str:
        return f"engine {key}"

    # ---- the controller's view of the queues ----------------------------------------------------------
    def queues(self, keys: Sequence[Any]) -> dict:
        """``{engine: requests queued or running there}`` from the controller (counts: its lists of
        message ids would bring every request an engine ever completed). ``Client.queue_status`` has no
        time limit (a stopped controller would hold the notebook for ever), so the request goes through
        the client's own sender with one. The controller drops a request a moment after its reply
        reaches us: where it counts more than this client knows to be pending, it is asked again after
        growing pauses (:data:`QUEUE_PAUSES`), so that a call right after the last waits no longer than
        the controller takes to forget it."""
        counts = self._ask_queues(keys)
        for pause in QUEUE_PAUSES:
            if not any(counts[key] > len(self._waiting(key)) for key in keys):
                break
            time.sleep(pause)
            counts = self._ask_queues(keys)
        return counts

    def _ask_queues(self, keys: Sequence[Any]) -> dict:
        client = self.client
        if getattr(client, "_closed", False):
            raise ClusterGone(f"--cluster {self.name}: this ipyparallel Client was closed; {FIX_STALE}")
        future = client._send(client._query_stream, "queue_request",
                              content={"targets": list(keys), "verbose": False})
        if not future.wait(ASK_TIMEOUT):
            where = (getattr(client, "_config", None) or {}).get("registration", "")
            at = f" at {where}" if where else ""
            raise ClusterGone(f"--cluster {self.name}: the ipyparallel controller{at}"
                              f" did not answer in {ASK_TIMEOUT:g} s: the cluster was stopped or its "
                              f"controller died; {FIX_STALE}")
        content = future.result()["content"]
        if content.get("status") != "ok":
            raise ClusterGone(f"--cluster {self.name}: the controller refused the queue request "
                              f"({content.get('ename', '')}: {content.get('evalue', '')}); {FIX_STALE}")
        return {key: int((content.get(str(key)) or {}).get("queue", 0))
                + int((content.get(str(key)) or {}).get("tasks", 0)) for key in keys}

    def _waiting(self, key: Any) -> list:
        """This client's requests to engine ``key`` not answered yet (the user's ``%px`` cells and ours),
        from the client's own record."""
        uuid = self.client._engines.get(key)
        return list(self.client._outstanding_dict.get(uuid, ())) if uuid is not None else []

    def _busy(self, reply: Reply, count: int, now: float) -> None:
        """Fill the reply of an engine with ``count`` requests queued: 'stuck' when they are all ours
        (an earlier request of ours never answered), else 'busy' since the oldest request's submission
        this client knows of (else since this bridge first saw it busy: 'at least')."""
        waiting = self._waiting(reply.key)
        ours = [self._ours[m] for m in waiting if m in self._ours]
        if ours and len(ours) >= count:
            since = min(epoch for _, _, epoch in ours)
            reply.fail("stuck", f"not answering since {when(since, now)}: our request from then is still "
                                "queued there (the engine is stopped, blocked in C code, or overloaded)",
                       since)
            return
        submitted = [self.client.metadata[m].get("submitted") for m in waiting
                     if m not in self._ours and m in self.client.metadata]
        stamps = [stamp.timestamp() for stamp in submitted if stamp is not None]
        since = min(stamps) if stamps else self._seen_busy.setdefault(reply.key, now)
        known = "" if stamps else "at least "
        more = f"; {count - 1} more queued" if count > 1 else ""
        reply.fail("busy", f"busy since {known}{when(since, now)}: a %px cell or task runs there{more}; not "
                           "asked, so nothing queues behind it", since)

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
        outstanding = self.client.outstanding
        for msg_id in [m for m in self._ours if m not in outstanding]:
            del self._ours[msg_id]  # answered late, aborted or interrupted: no longer ours to wait on
        queued = self.queues([key for key in keys if key in alive]) if alive & set(keys) else {}
        live = []
        for key, count in queued.items():
            if count:
                self._busy(replies[key], count, now)
            else:
                self._seen_busy.pop(key, None)
                live.append(key)
        if only is not None:
            for key in live:
                replies[key].ok = key not in only
            live = [key for key in live if key in set(only)]
        sent: list = []
        try:
            if live:
                sent = self._send(live, replies, target, args, kwargs)
                for part, result in sent:
                    self._gather(part, result, replies, timeout, start)
        except KeyboardInterrupt:
            stopped, left = self._stop(sent, wait=True, signal=True)
            raise self.interrupted(target, [self.label(k) for k in stopped],
                                   [self.label(k) for k in left]) from None
        late = [(part, result) for part, result in sent if not result.ready()]
        if late:
            self._stop(late, wait=False, signal=target in LONG)
        return [replies[key] for key in keys]

    def _send(self, live: list, replies: dict, target: str, args: tuple, kwargs: dict) -> list:
        """Send the call to every engine in ``live``: ``[(keys, AsyncResult)]``. One DirectView apply;
        should it fail (an engine gone between the check and the send), one apply per engine, so that
        only the engine at fault gets the error."""
        from . import remote

        call = remote.Entry()  # by reference: ipyparallel would ship remote.call's code every time
        try:
            sent = [(live, self.client[live].apply_async(call, target, args, kwargs))]
        except Exception:  # noqa: BLE001 - retried per engine below, where each failure is that engine's
            sent = []
            for key in live:
                try:
                    sent.append(([key], self.client[[key]].apply_async(call, target, args, kwargs)))
                except Exception as exc:  # noqa: BLE001 - one engine's failure is its reply, not ours
                    from_exception(replies[key], type(exc).__name__, str(exc))
        epoch, mono = time.time(), time.monotonic()
        for part, result in sent:
            for key, msg_id in zip(part, result.msg_ids):
                self._ours[msg_id] = (key, mono, epoch)
        return sent

    def _gather(self, keys: list, result: Any, replies: dict, timeout: float, start: float) -> None:
        """Wait for ``result`` (the engines ``keys``) until ``start + timeout``, then fill each engine's
        reply: all at once when every engine answered (the usual tick), else engine by engine from
        ``result.split()``, an engine without an answer getting 'timeout'."""
        result.wait(max(0.0, start + timeout - time.monotonic()))
        elapsed = time.monotonic() - start
        if result.ready():
            answers = result.get(0, return_exceptions=True)
            took = _seconds(result, elapsed)
            for key, answer, seconds, msg_id in zip(keys, answers, took, result.msg_ids):
                self._ours.pop(msg_id, None)
                self._fill(replies[key], answer, seconds)
            return
        for key, part in zip(keys, result.split()):
            reply = replies[key]
            if part.ready():
                self._ours.pop(part.msg_ids[0], None)
                took = _seconds(part, elapsed)[0]
                self._fill(reply, part.get(0, return_exceptions=True), took)
            else:
                reply.fail("timeout", f"no answer in {timeout:g} s; our call there was stopped")
                reply.seconds = elapsed

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
    def _stop(self, sent: list, wait: bool, signal: bool) -> tuple:
        """Abort our requests still queued and, with ``signal``, SIGINT the engines running one; with
        ``wait`` (Ctrl-C), wait a little for them to give up. Returns (engines interrupted, engines still
        running our call). Past a time limit nothing waits: a stopped engine keeps our request queued,
        and the next call finds it 'stuck' from the controller's queue. A quick call past its limit is
        not signalled: it ends by itself, and a signal arriving just after would hit the next request."""
        waiting = {}
        for part, result in sent:
            for key, part_result in zip(part, result.split() if len(part) > 1 else [result]):
                if not part_result.ready():
                    waiting[key] = part_result
        if not waiting:
            return [], []
        client = self.client
        ours = {result.msg_ids[0] for result in waiting.values()}
        try:
            client.abort(jobs=sorted(ours), targets=sorted(waiting), block=False)
        except Exception:  # noqa: BLE001 - a controller gone now: nothing more to stop
            return [], sorted(waiting)
        # ours was sent to an idle engine, and this kernel was busy in the magic since: what runs there
        # is ours (aborting it does nothing once it runs; the signal stops it)
        running = sorted(waiting) if signal else []
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
            if part_result.ready():
                self._ours.pop(part_result.msg_ids[0], None)
            elif key in running:
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
