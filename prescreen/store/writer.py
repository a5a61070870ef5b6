"""Store writes on one background thread per process, so a compile never waits for a commit.

A hooked compile that decides a plan it has not met must store the decision,
and a store write is a transaction: on a busy or slow disk it costs several
milliseconds (more when SQLite checkpoints its log), on a fleet store a network
round trip. ``submit`` queues the write and returns at once; a daemon thread
makes the puts, in order, and tells each caller's ``done`` whether its entry
was stored. It lets a new write wait ``WRITE_DELAY_SECONDS`` first (none
while a ``flush`` waits): a hook queues its write just before the benchmark it
guards, which then waits on the device with the GIL released, so the write is
made then instead of taking the interpreter from the compile, and writes queued
meanwhile go in the same batch. ``call`` queues other write work the same way (a lookup's batched
hit counts, a tiered store's local copy of a remote hit). ``flush`` waits until
everything submitted before it has been written; it runs at interpreter exit
(bounded by ``EXIT_FLUSH_SECONDS``), when a store is closed (that store's
writes), and before the hooks replace their store. A process killed outright
(SIGKILL) loses what was still queued: those decisions are computed again by
the next process. Nothing here writes an ``observed_oom`` fact:
``service.record_observed_oom`` writes synchronously.

A forked child starts with an empty queue and no thread (the parent's queue is
the parent's to write); its first ``submit`` starts its own.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
from collections.abc import Callable

from prescreen.store.base import Store
from prescreen.store.entry import Entry

log = logging.getLogger("prescreen.store")

#: How long interpreter exit waits for queued writes (a locked store gives up on each within its own timeout).
EXIT_FLUSH_SECONDS = 60.0

#: How long a queued write waits before the writer makes it, unless a ``flush`` waits for it.
WRITE_DELAY_SECONDS = 0.05

Done = Callable[[bool], None]


class _Queue:
    """The process's pending writes and the thread that makes them."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.items: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self.submitted = 0
        self.written = 0  # submitted items that have run (stored or not)
        self.by_store: dict[int, int] = {}  # id(store) -> its items not yet run
        self.flushing = 0  # flushes waiting: the writer does not delay then
        self.thread: threading.Thread | None = None

    def submit(self, store: Store, work: Callable[[], None]) -> None:
        with self.cond:
            store_id = id(store)
            self.items.append((store_id, work))
            self.by_store[store_id] = self.by_store.get(store_id, 0) + 1
            self.submitted += 1
            self.start()
            if len(self.items) == 1:  # the writer waits for a first item; later ones wait out its delay with it
                self.cond.notify()

    def start(self) -> None:
        """Start the thread unless it was started (hold ``cond``); it never ends (``run`` catches every failure
        of a write), and a forked child starts with a new queue."""
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name="prescreen-store-writer", daemon=True)
            self.thread.start()
            _register_exit_flush()

    def take(self) -> list[tuple[int, Callable[[], None]]]:
        """The next batch: what is queued once the first item has waited out the delay (or a flush came)."""
        with self.cond:
            while not self.items:
                self.cond.wait()
            if not self.flushing:
                self.cond.wait_for(lambda: self.flushing > 0, WRITE_DELAY_SECONDS)
            batch = list(self.items)
            self.items.clear()
            return batch

    def run(self) -> None:
        while True:
            batch = self.take()
            for store_id, work in batch:
                try:
                    work()
                except BaseException:  # stores never raise on a fault; a bug in one, or a callback's exit, never stops it
                    log.exception("prescreen: a queued store write failed")
                with self.cond:
                    self.written += 1
                    self.by_store[store_id] -= 1
                    if not self.by_store[store_id]:
                        del self.by_store[store_id]
                    self.cond.notify_all()

    def flush(self, store: Store | None, timeout: float | None) -> bool:
        if threading.current_thread() is self.thread:
            return False  # queued work that flushes would wait for itself
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()  # a writer delaying a write makes it now
            try:
                if store is not None:
                    return self.cond.wait_for(lambda: id(store) not in self.by_store, timeout)
                target = self.submitted
                return self.cond.wait_for(lambda: self.written >= target, timeout)
            finally:
                self.flushing -= 1

    def pending(self) -> int:
        with self.cond:
            return self.submitted - self.written


def _put(store: Store, entry: Entry) -> bool:
    try:
        return store.put(entry)
    except Exception as exc:  # stores never raise on a fault; a bug in one is a write that did not store
        store.warn_once("write failed", exc)
        return False


_queue = _Queue()
_exit_flush_registered = False


def _register_exit_flush() -> None:
    """Flush at exit, registered when the first thread starts: after the stores' own exit handlers, so it runs
    before them (``atexit`` runs last-registered first) and every queued entry reaches an open store."""
    global _exit_flush_registered
    if not _exit_flush_registered:
        _exit_flush_registered = True
        atexit.register(flush, None, EXIT_FLUSH_SECONDS)


def _after_fork_in_child() -> None:
    global _queue
    _queue = _Queue()


os.register_at_fork(after_in_child=_after_fork_in_child)


def start() -> None:
    """Start the writer thread now (``install()`` does: a thread's start is not paid inside a compile); the
    first write starts it otherwise."""
    with _queue.cond:
        _queue.start()


def submit(store: Store, entry: Entry, done: Done | None = None) -> None:
    """Queue ``store.put(entry)``; ``done(stored)`` is called on the writer thread once it returns."""

    def work() -> None:
        stored = _put(store, entry)
        if done is not None:
            done(stored)

    _queue.submit(store, work)


def call(store: Store, work: Callable[[], None]) -> None:
    """Queue ``work``, a write of ``store``'s own that never raises on a store fault, behind what is queued."""
    _queue.submit(store, work)


def flush(store: Store | None = None, timeout: float | None = None) -> bool:
    """Wait until the writes queued so far (for ``store``; for every store when None) are made; False if
    ``timeout`` seconds passed first, or when called from the writer thread itself."""
    return _queue.flush(store, timeout)


def pending() -> int:
    """How many submitted writes have not been made yet."""
    return _queue.pending()
