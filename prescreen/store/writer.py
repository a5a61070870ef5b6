"""Store writes on one background thread per process, so a compile never waits for a commit.

A hooked compile that decides a plan it has not met must store the decision,
and a store write is a transaction: on a busy or slow disk it costs several
milliseconds, on a fleet store a network round trip. ``submit`` queues the
write and returns at once; a daemon thread makes the puts, in order, and tells
each caller's ``done`` whether its entry was stored. ``flush`` waits until
everything submitted before it has been written; it runs at interpreter exit
(bounded by ``EXIT_FLUSH_SECONDS``), and before the hooks close or replace
their store. A process killed outright (SIGKILL) loses what was still queued:
those decisions are computed again by the next process. Nothing here writes
an ``observed_oom`` fact: ``service.record_observed_oom`` writes synchronously.

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

Done = Callable[[bool], None]


class _Queue:
    """The process's pending writes and the thread that makes them."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.items: collections.deque[tuple[Store, Entry, Done]] = collections.deque()
        self.submitted = 0
        self.written = 0  # submitted items whose put has returned (stored or not)
        self.thread: threading.Thread | None = None

    def submit(self, store: Store, entry: Entry, done: Done) -> None:
        with self.cond:
            self.items.append((store, entry, done))
            self.submitted += 1
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self.run, name="prescreen-store-writer", daemon=True)
                self.thread.start()
                _register_exit_flush()
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.items:
                    self.cond.wait()
                batch = list(self.items)
                self.items.clear()
            for store, entry, done in batch:
                stored = _put(store, entry)
                try:
                    done(stored)
                except Exception:  # a caller's bookkeeping never stops the writer
                    log.exception("prescreen: a store write's completion callback failed")
            with self.cond:
                self.written += len(batch)
                self.cond.notify_all()

    def flush(self, timeout: float | None) -> bool:
        with self.cond:
            target = self.submitted
            return self.cond.wait_for(lambda: self.written >= target, timeout)

    def pending(self) -> int:
        with self.cond:
            return self.submitted - self.written


def _put(store: Store, entry: Entry) -> bool:
    try:
        return store.put(entry)
    except Exception as exc:  # stores never raise on a fault; a bug in one must not kill the writer
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
        atexit.register(flush, EXIT_FLUSH_SECONDS)


def _after_fork_in_child() -> None:
    global _queue
    _queue = _Queue()


os.register_at_fork(after_in_child=_after_fork_in_child)


def submit(store: Store, entry: Entry, done: Done) -> None:
    """Queue ``store.put(entry)``; ``done(stored)`` is called on the writer thread once it returns."""
    _queue.submit(store, entry, done)


def flush(timeout: float | None = None) -> bool:
    """Wait until every write submitted so far has been made; False if ``timeout`` seconds passed first."""
    return _queue.flush(timeout)


def pending() -> int:
    """How many submitted writes have not been made yet."""
    return _queue.pending()
