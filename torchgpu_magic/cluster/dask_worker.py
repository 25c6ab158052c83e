"""What runs on a Dask worker around the engine functions of :mod:`.remote`.

The bridge ships :func:`dask_call`: a coroutine ``Client.run`` awaits on the worker's event loop while
:func:`~.remote.call` runs in a thread of ours, so the worker keeps answering its scheduler (heartbeats,
other ``Client.run`` calls) while a cell is timed there; it answers by its own deadline, and
:func:`interrupt` stops a call there on Ctrl-C, which the worker itself does not get meanwhile when the
notebook's kernel started it (:func:`sigint_held`).
"""
from __future__ import annotations

import _signal  # signal.signal's C function: see sigint_held
import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import pickle
import queue
import socket
import threading
import uuid
from typing import Any, Iterator, Optional

from ..caches import cache
from . import remote

_ACTIVE: dict = {}  # call id -> {ident: may be interrupted now} of the threads running that call here
_LOCK = threading.Lock()
QUICK = 0.01
"""Seconds a worker's event loop waits for our call's thread as a plain wait before awaiting it: a report
or a panel's tick is done by then, and taking its answer straight from the thread spares the worker the
event loop's wake-up and its futures (measured: a tenth of a bare ``Client.run`` on 2 cores).
Heartbeats come a second or more apart, so the pause goes unnoticed; a longer call (a timing) is awaited
as before."""
IDLE = 1.0
"""Seconds a thread of :class:`_Threads` waits for another call before it ends."""
WAITED = (concurrent.futures.TimeoutError, asyncio.TimeoutError)  # one class from Python 3.11


class _Threads:
    """The threads our calls run in on a worker: as many as run at once, each ending after :data:`IDLE`
    seconds without a call. A ``ThreadPoolExecutor`` (the event loop's too) keeps its threads for the
    process's life, in the notebook's own process when its workers are in-process ones, and joins them at
    exit, where a thread held in a hung driver call would hold the exit too: these are daemon threads."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a call and not yet claimed by one
        self._lock = threading.Lock()

    def submit(self, func: Any, *args: Any) -> concurrent.futures.Future:
        """``func(*args)`` in an idle thread, else a new one; its future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._jobs.put((future, func, args))
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # the call that thread takes
        if spawn:
            threading.Thread(target=self._serve, name="torchgpu_magic call", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                future, func, args = self._jobs.get(timeout=IDLE)
            except queue.Empty:
                with self._lock:  # a call queued meanwhile counted on this thread: take it
                    if self._jobs.empty():
                        self._idle -= 1
                        return
                continue
            try:
                future.set_result(func(*args))
            except BaseException as exc:  # noqa: BLE001 - the caller's, as its call would raise it
                future.set_exception(exc)
            with self._lock:
                self._idle += 1


_THREADS = _Threads()


async def dask_call(request: tuple, dask_worker: Any = None) -> bytes:
    """``Client.run``'s entry on a Dask worker (it passes ``dask_worker``): :func:`.remote.call` in a
    thread, the event loop free meanwhile (after :data:`QUICK`); past ``deadline`` seconds the call is
    interrupted and the answer says 'timeout', so one slow worker cannot hold the ``Client.run`` of all.
    ``request``: ``(target, args, kwargs, deadline, call_id, caller)``, ``caller`` being the notebook's
    (host, process group), for :func:`sigint_held`. One argument: for every call, Dask reads this
    function's signature twice (whether it takes ``dask_worker``, ``dask_scheduler``), and the reading
    grows with the parameters (measured: 52 us with the request's six, 17 us with one, 11 us for a bare
    lambda). The answer travels pickled (:func:`answer_of` reads it): one bytes frame costs Dask less to
    carry than the nested dict inside it, which it walks element by element (measured: a 1.3 KB report
    cost a fifth of a bare ``Client.run`` as a dict, nothing as bytes)."""
    target, args, kwargs, deadline, call_id, caller = request
    with sigint_held(caller):
        future = _THREADS.submit(_tracked, call_id, dask_worker, target, args, kwargs)
        try:
            try:
                answer = future.result(min(QUICK, deadline))
            except WAITED:
                answer = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)),
                                                max(0.0, deadline - QUICK))
        except WAITED:
            interrupt(call_id)
            answer = _stopped(f"no answer in {deadline:g} s; our call there was stopped", "timeout")
        except KeyboardInterrupt:  # never into the worker's event loop, which it would stop
            answer = _stopped("interrupted")
    return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)


def answer_of(sent: Any) -> Any:
    """What :func:`dask_call` answered: its pickled answer read back (anything else as it came)."""
    return pickle.loads(sent) if isinstance(sent, bytes) else sent


@cache
def process_group() -> Optional[tuple]:
    """(host, process group) of this process, for :func:`sigint_held` on the workers; None where the
    OS has no process groups. Asked on both sides of every call, so read once per process (a forked
    child reads its own): neither changes under a notebook's kernel or a worker."""
    getpgrp = getattr(os, "getpgrp", None)
    return (socket.gethostname(), getpgrp()) if getpgrp is not None else None


def call_id() -> str:
    """A new id for a call, unique among the notebooks sharing the workers: a random prefix drawn once
    per process (a forked child draws its own), then a count. A random draw per call is a system call
    (``os.urandom``: 9 us here, a twentieth of the notebook's part of a call)."""
    prefix, count = _ids()
    return f"{prefix}{next(count):012x}"


@cache
def _ids() -> tuple:
    """This process's prefix of call ids, and its count."""
    return uuid.uuid4().hex[:20], itertools.count()


def _forked() -> None:
    """In a forked child: none of the threads the pool's counts name, and its own ids and group."""
    _THREADS.__init__()
    _ids.cache_clear()
    process_group.cache_clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


_SIGINT_HELD: list = [0, None]  # [our calls holding SIGINT off here, the handler before them]


@contextlib.contextmanager
def sigint_held(caller: Optional[tuple]) -> Iterator[None]:
    """Ignore SIGINT while the block runs, when this worker is in the notebook's process group
    (``caller``: its :func:`process_group`): a LocalCluster's worker processes, which the notebook's
    kernel started. An interrupt of the kernel (Ctrl-C, the stop button) is sent to its whole process
    group, and a Dask worker dies of it (its event loop stops), so interrupting a ``--cluster`` magic
    killed the workers; held off, only the notebook sees it, and stops our call on the workers itself
    (:func:`interrupt`). Only on the thread that may set signal handlers (the worker's event loop, where
    Dask runs our coroutine); concurrent calls share one hold, and the handler from before comes back
    with the last. The handlers are swapped through ``_signal``, the C module under ``signal``:
    ``signal.signal`` (Python 3.11 and 3.12 alike) turns the handler it returns into an enum member by
    trying and failing, and the failure's message is the handler's repr, on a worker asyncio's runner
    with its task and stack (measured there: 23 us a pair of swaps, against 0.9)."""
    held = (caller is not None and tuple(caller) == process_group()
            and threading.current_thread() is threading.main_thread())
    if held:
        if _SIGINT_HELD[0] == 0:
            _SIGINT_HELD[1] = _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
        _SIGINT_HELD[0] += 1
    try:
        yield
    finally:
        if held:
            _SIGINT_HELD[0] -= 1
            if _SIGINT_HELD[0] == 0:
                _signal.signal(_signal.SIGINT, _SIGINT_HELD[1])


def _stopped(message: str, problem: str = "error") -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "ok": False, "problem": problem,
            "message": message}


def _tracked(call_id: str, worker: Any, target: str, args: tuple, kwargs: dict) -> dict:
    """:func:`call` in a worker thread, listed as running ``call_id`` meanwhile. An interrupt ends it
    with an 'interrupted' answer; none escapes (into the executor, then the event loop). torch is
    imported first, while the thread cannot be interrupted yet: an interrupt landing inside an import
    leaves the module half made, and torch's C registrations then fail for good in this worker
    ('duplicate registrations'); an interrupt meanwhile stops the call right after."""
    ident = threading.get_ident()
    result = _stopped("interrupted")
    try:
        try:
            with _LOCK:
                _ACTIVE.setdefault(call_id, {})[ident] = False  # listed; not to be interrupted yet
            _import_torch()
            with _LOCK:
                cancelled = call_id in _CANCELLED
                _ACTIVE[call_id][ident] = not cancelled
            if not cancelled:
                remote.CONTEXT.worker = worker
                result = remote.call(target, args, kwargs)
        except KeyboardInterrupt:
            pass
        finally:
            remote.CONTEXT.worker = None
            _forget(call_id, ident)
    except KeyboardInterrupt:  # one landing in the clauses above, before the thread left the list
        _forget(call_id, ident)
    return result


def _import_torch() -> None:
    """Import torch (what :func:`call` does first), leaving any failure for :func:`call` to report."""
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - call() says what failed, in this engine's row
        pass


def _forget(call_id: str, ident: int) -> None:
    """Take this thread off the calls running here. An interrupt aimed at it just before may land in
    the middle: then it is done again, so that no finished call is ever listed as running."""
    while True:
        try:
            with _LOCK:
                idents = _ACTIVE.get(call_id)
                if idents is not None:
                    idents.pop(ident, None)
                    if not idents:
                        del _ACTIVE[call_id]
                        _CANCELLED.pop(call_id, None)
            return
        except KeyboardInterrupt:
            continue


_CANCELLED: dict = {}  # call ids interrupted here (an ordered set, the newest 64): a thread yet to start
# the call, or still importing torch, sees it and stops


def interrupt(call_id: str) -> int:
    """Raise KeyboardInterrupt in the threads running ``call_id`` here (at their next Python
    instruction: a running GPU kernel finishes first), and have one that has not begun the call yet
    (importing torch) end without it; the number of threads told."""
    import ctypes

    told = 0
    with _LOCK:  # a thread off the list is never told
        _CANCELLED[call_id] = None
        while len(_CANCELLED) > 64:
            del _CANCELLED[next(iter(_CANCELLED))]
        for ident, ready in _ACTIVE.get(call_id, {}).items():
            told += ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(
                KeyboardInterrupt)) if ready else 1
    return told


def running() -> list:
    """The ids of the calls of ours running here now (a test asks: nothing of ours left running); not
    one interrupted while it still imports torch, which ends without running anything."""
    with _LOCK:
        return sorted(call_id for call_id, idents in _ACTIVE.items()
                      if call_id not in _CANCELLED or any(idents.values()))
