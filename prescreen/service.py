"""Look a decision up by key, or compute, store and return it."""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import itertools
import logging
import math
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from prescreen.budget import Budget
from prescreen.decision import Decision, decide_with, is_observed_oom, try_representatives
from prescreen.errors import NotBounded, Reason
from prescreen.key import KeyParts, build_key
from prescreen.plan import KernelPlan
from prescreen.representatives import Representatives
from prescreen.store.base import BEFORE_HITS_READ, Store
from prescreen.store.entry import Entry, outranks

log = logging.getLogger("prescreen")

#: How long ``record_observed_oom`` keeps trying to write a fact through a locked or failing store (the disk
#: store's own put also waits through a lock, ``DiskStore.write_wait``).
FACT_WAIT_SECONDS = 5.0
#: How often a fact this process could not write is tried again, at a lookup (and once more at exit).
FACT_RETRY_SECONDS = 30.0
#: How long a ``tune`` is answered from this process's memory before the store is read again for it: another
#: process's (or replica's) observed OOM under that key is served within this.
TUNE_RECHECK_SECONDS = 5.0


@dataclasses.dataclass
class Counters:
    """Per-process counts the hooks and ``warm`` report."""

    lookups: int = 0
    hits: int = 0  # store hits, including those answered from the in-process memo
    memo_hits: int = 0  # of ``hits``: answered from memory without reading the store
    estimator_calls: int = 0
    stored: int = 0
    tuned: int = 0
    fell_back: int = 0
    not_bounded: int = 0
    largest_estimate: int = 0
    observed_oom: int = 0  # guarded benchmarks that ran out of memory and were redone with the fallback
    seconds: float = 0.0  # wall time spent inside lookup_or_decide


class _LiveCounters(Counters):
    """``COUNTERS``: a lookup answered from a plan object's memory only ticks its ``_Hit``'s counter
    (``itertools.count``: atomic, no lock); those ticks are added in here whenever a count is read or
    written, so every read sees every lookup made before it."""

    def __getattribute__(self, name: str) -> Any:
        if _unfolded and name in _FOLDED:
            _fold()
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if _unfolded and name in _FOLDED:
            _fold()
        object.__setattr__(self, name, value)


_FOLDED = frozenset({"lookups", "hits", "memo_hits", "tuned", "fell_back", "not_bounded", "largest_estimate"})
_lock = threading.RLock()  # reentrant: a fold can run inside a counting block
_unfolded = False  # set after a tick, cleared by the fold that adds it in
COUNTERS: Counters = _LiveCounters()
#: ``COUNTERS``' own fields, written past its fold hooks (under ``_lock``) on the lookup paths: the ticks a
#: fold adds are sums, so it may come after.
_RAW_COUNTS: dict[str, Any] = object.__getattribute__(COUNTERS, "__dict__")


def _book(decision: Decision, counts: dict[str, Any]) -> None:
    """Count ``decision``'s verdict and estimate into ``counts`` (``_RAW_COUNTS``; hold ``_lock``)."""
    counts["tuned" if decision.action == "tune" else "fell_back"] += 1
    if not decision.bounded:
        counts["not_bounded"] += 1
    estimate = decision.estimated_bytes
    if estimate is not None and estimate > counts["largest_estimate"]:
        counts["largest_estimate"] = estimate


#: Callbacks told of every lookup (``prescreen warm`` collects its report this way).
OBSERVERS: list[Callable[["Outcome", KernelPlan], None]] = []


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    key: str
    decision: Decision
    hit: bool
    entry: Entry | None


#: How many decisions the in-process memo keeps per store (the oldest dropped first).
MEMO_SIZE = 4096


class _Hit:
    """What a memo hit returns and adds to ``COUNTERS`` (worked out once, when the entry is remembered).

    ``ticks`` counts the lookups answered from a plan object's memory (``lookup_or_decide``): each
    one calls ``next`` on it, and ``_fold`` calls it once more to read how many came since it last did.
    """

    __slots__ = ("outcome", "tuned", "fell_back", "not_bounded", "estimate", "ticks", "seen", "until")

    def __init__(self, outcome: Outcome) -> None:
        d = outcome.decision
        self.outcome = outcome
        # A tune is answered from memory until then; a fallback for good (nothing loosens a decision).
        self.until = time.monotonic() + TUNE_RECHECK_SECONDS if d.tune else math.inf
        self.tuned = 1 if d.tune else 0
        self.fell_back = 0 if d.tune else 1
        self.not_bounded = 0 if d.bounded else 1
        self.estimate = d.estimated_bytes or 0
        self.ticks = itertools.count()
        self.seen = 0  # values of ``ticks`` already added in (the fold's own calls included)

    def count(self, c: Counters, n: int) -> None:
        """Add ``n`` lookups answered by this hit to ``c`` (hold ``_lock``)."""
        c.lookups += n
        c.hits += n
        c.memo_hits += n
        c.tuned += n * self.tuned
        c.fell_back += n * self.fell_back
        c.not_bounded += n * self.not_bounded
        if self.estimate > c.largest_estimate:
            c.largest_estimate = self.estimate


# The hits plan objects remember (their ticks are folded into COUNTERS and their store's hits) -> (memo, token) they
# were remembered under. A hit whose memo moved on is dropped by the second fold that sees it so (a lookup
# that checked the token just before the change may still tick it in between).
_ticking: dict[_Hit, tuple["_Memo", object]] = {}
_stale: set[_Hit] = set()


def _fold() -> None:
    """Add the ticks of every remembered hit into ``COUNTERS``."""
    global _unfolded
    with _lock:
        _unfolded = False  # before reading the ticks: a tick after this sets it again
        stale = []
        for hit, (memo, token) in _ticking.items():
            value = next(hit.ticks)
            n, hit.seen = value - hit.seen, value + 1
            if n:
                hit.count(COUNTERS, n)
                store = memo.store()
                if store is not None:
                    store.add_hits(n)  # the stores count memo hits as reads too (``_count_hit``)
            if memo.token is not token:
                stale.append(hit)
        for hit in stale:
            if hit in _stale:
                del _ticking[hit]
                _stale.discard(hit)
            else:
                _stale.add(hit)


def _fold_if_unfolded() -> None:
    if _unfolded:
        _fold()


BEFORE_HITS_READ.append(_fold_if_unfolded)


class _Memo:
    """One store's memo: key -> the hit for what the store holds under that key, as far as this process
    knows (see ``lookup_or_decide``). ``token`` is replaced by a new object on every change, and the store
    carries it too (``Store.memo_token``); a plan object remembers its last hit in its own
    ``KernelPlan.cache`` as ``(token, budget, hit)``, valid while the store carries that token."""

    __slots__ = ("store", "outcomes", "token")

    def __init__(self, store: Store) -> None:
        self.store = weakref.ref(store)
        self.outcomes: dict[str, _Hit] = {}
        self.token = object()
        store.memo_token = self.token

    def changed(self) -> None:
        self.token = object()
        store = self.store()
        if store is not None:
            store.memo_token = self.token


# id(store) -> its memo; the entry goes when the store object does (weakref.finalize).
_memos: dict[int, _Memo] = {}


def forget(store: Store | None = None) -> None:
    """Drop the in-process memo of ``store``'s decisions (of every store when None): what is read next is
    what the store holds (and the facts this process could not write, ``record_observed_oom``)."""
    with _lock:
        if store is None:
            for memo in _memos.values():
                memo.outcomes.clear()
                memo.changed()
        else:
            found = _memos.get(id(store))
            if found is not None:
                found.outcomes.clear()
                found.changed()


def _drop_memo(store_id: int, memo: _Memo) -> None:
    with _lock:
        if _memos.get(store_id) is memo:
            del _memos[store_id]


def _remember(store: Store, key: str, entry: Entry | None) -> None:
    """Record what ``store`` now holds under ``key`` (``None``: not known, read it next time)."""
    with _lock:
        memo = _memos.get(id(store))
        if memo is None or memo.store() is not store:
            if entry is None:
                return
            memo = _memos[id(store)] = _Memo(store)
            weakref.finalize(store, _drop_memo, id(store), memo)
        memo.changed()
        if entry is None:
            memo.outcomes.pop(key, None)
            return
        memo.outcomes.pop(key, None)  # re-inserted last: the oldest entry is the first dropped
        memo.outcomes[key] = _Hit(Outcome(key, entry.decision, True, entry))
        if len(memo.outcomes) > MEMO_SIZE:
            del memo.outcomes[next(iter(memo.outcomes))]


def _count_hit(hit: _Hit, store: Store, plan: KernelPlan) -> Outcome:
    with _lock:
        hit.count(COUNTERS, 1)
        store.add_hits(1)  # the store's persisted per-entry hit counts (``inspect``) see reads only
    return _observed(hit.outcome, plan) if OBSERVERS else hit.outcome


def lookup_or_decide(plan: KernelPlan, budget: Budget, store: Store | None, *, write: bool = True) -> Outcome:
    """The decision for ``plan`` under ``budget``: from ``store`` on a hit, else computed (and stored).

    A plan this process already looked up (or stored) in this ``store`` object is
    answered from memory, without reading the store: the same plan object (and
    budget object) again from what the plan object remembers of its last lookup
    (``KernelPlan.cache``; no hashing at all), an equal plan object by its key
    (see ``prescreen.key.build_key``). The memo is replaced on every put made here
    (so an observed_oom recorded in this process is seen at once); a ``tune``
    is answered from memory for ``TUNE_RECHECK_SECONDS``, then read from the store
    again, so another process's observed OOM (written there, or through a tiered
    store's remote) is served within that; a fallback is kept. Other changes made
    by other processes, or directly on the store object, are seen after ``forget``
    (or with a new store object). Answers from memory are counted in ``COUNTERS``
    but not timed (``seconds``): each takes well under a microsecond.

    A computed decision is written before this returns (a put, about 0.1 ms).
    """
    cache = plan._cache
    if cache is not None:
        last = cache.lookup
        if (last is not None and last[1] is budget and store is not None and last[0] is store.memo_token
                and last[2].until > time.monotonic()):
            hit: _Hit = last[2]
            next(hit.ticks)  # counted in COUNTERS and in the store's hits when they are next read (``_fold``)
            global _unfolded
            _unfolded = True
            return _observed(hit.outcome, plan) if OBSERVERS else hit.outcome
    start = time.perf_counter()
    key, parts = build_key(plan, budget)
    memo = None if store is None else _memos.get(id(store))
    if store is not None and memo is not None and memo.store() is store:
        token = memo.token
        found = memo.outcomes.get(key)
        if found is not None and found.until > time.monotonic():
            with _lock:
                if memo.token is token:
                    plan.cache.lookup = (token, budget, found)
                    if len(_ticking) >= 4 * MEMO_SIZE:
                        _fold()  # drops the hits whose memo moved on
                    _ticking[found] = (memo, token)
                    _stale.discard(found)
            outcome = _count_hit(found, store, plan)
            with _lock:
                _RAW_COUNTS["seconds"] += time.perf_counter() - start
            return outcome
    try:
        return _lookup_or_decide(plan, budget, store, write, key, parts)
    finally:
        elapsed = time.perf_counter() - start
        with _lock:
            _RAW_COUNTS["seconds"] += elapsed


def _lookup_or_decide(
    plan: KernelPlan, budget: Budget, store: Store | None, write: bool, key: str, parts: KeyParts
) -> Outcome:
    # A computed decision is only ever *added* (``Store.put`` keeps a valid entry at least as strict
    # already there), so a stored observed_oom fallback is never overwritten by a computed tune.
    if _held:
        fact = _held_fact(key)
        if fact is not None:
            outcome = Outcome(key, fact.decision, False, fact)
            with _lock:
                _RAW_COUNTS["lookups"] += 1
                _book(fact.decision, _RAW_COUNTS)
            return _observed(outcome, plan) if OBSERVERS else outcome
    if store is not None:
        entry = store.lookup(key)
        if entry is not None and entry.dynamic != plan.is_dynamic:
            # The key matches this plan, so the stored flag was tampered with: a miss.
            store.warn_once("invalid entry", f"key {key[:12]}: dynamic flag does not match the plan")
            entry = None
        if entry is not None:
            outcome = Outcome(key, entry.decision, True, entry)
            with _lock:
                _remember(store, key, entry)
                _RAW_COUNTS["lookups"] += 1
                _RAW_COUNTS["hits"] += 1
                _book(outcome.decision, _RAW_COUNTS)
            return _observed(outcome, plan) if OBSERVERS else outcome
    with _lock:
        _RAW_COUNTS["lookups"] += 1
        _RAW_COUNTS["estimator_calls"] += 1
    reps = try_representatives(plan)
    decision = decide_with(plan, reps, budget)
    family = None if isinstance(reps, NotBounded) else family_summary(reps)
    entry = Entry.new(key, parts, plan, family, decision)
    outcome = Outcome(key, decision, False, entry)
    if store is not None and write:
        _remember(store, key, entry)  # taken back by ``_written`` if the put does not store it
        stored = _put(store, entry)
        _written(store, key, stored)
        if not stored:  # another process's stricter entry (a fact) may have got there since the read: it stands
            there = store.lookup(key)
            if there is not None and there.dynamic == plan.is_dynamic and outranks(there.decision, decision):
                _remember(store, key, there)
                outcome = Outcome(key, there.decision, True, there)
    with _lock:
        _book(outcome.decision, _RAW_COUNTS)
    return _observed(outcome, plan)


def _put(store: Store, entry: Entry) -> bool:
    """``store.put(entry)``; a backend that raises (a bug: stores never raise on a fault) is a put that did not
    store, with one warning."""
    try:
        return store.put(entry)
    except Exception as exc:
        store.warn_once("write failed", exc)
        return False


def _written(store: Store, key: str, stored: bool) -> None:
    """Book the put of the entry remembered under ``key``: counted when stored; when not (a valid entry got
    there first, maybe another process's observed_oom, or the store is failing), what the store holds is
    read next time."""
    if stored:
        with _lock:
            COUNTERS.stored += 1
    else:
        _remember(store, key, None)


def family_summary(reps: Representatives) -> dict[str, object]:
    """What an entry keeps of the shape family; the full representatives follow from its plan."""
    return {
        "group_count": reps.group_count,
        "reachable": len(reps.groups),
        "unreachable_group_ids": list(reps.unreachable_group_ids),
    }


def _observed(outcome: Outcome, plan: KernelPlan) -> Outcome:
    for observer in list(OBSERVERS):
        observer(outcome, plan)
    return outcome


def observed_oom_decision(
    plan: KernelPlan,
    computed: Decision,
    *,
    requested_bytes: int | None,
    free_bytes: int | None,
    error: str = "",
    host: str | None = None,
    when: float | None = None,
) -> Decision:
    """``computed`` turned into the fallback a real out-of-memory error proved right.

    The numbers the estimator gave stay as they were (the entry still shows
    what was estimated); the reason starts with ``observed_oom`` and carries
    the bytes requested and free at that moment, the estimate, host and time.
    """
    stamp = datetime.datetime.fromtimestamp(time.time() if when is None else when, datetime.timezone.utc)
    fields = {
        "requested_bytes": "unknown" if requested_bytes is None else str(requested_bytes),
        "free_bytes": "unknown" if free_bytes is None else str(free_bytes),
        "estimated_bytes": "unknown" if computed.estimated_bytes is None else str(computed.estimated_bytes),
        "budget_bytes": str(computed.budget_bytes),
        "host": (host or socket.gethostname()).replace(" ", "_"),
        "at": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    detail = " ".join(error.split())[:240]
    reason = f"{Reason.OBSERVED_OOM.value}: {text}" + (f" error={detail}" if detail else "")
    return dataclasses.replace(computed, action="fallback", enable_auto_blockify=plan.is_dynamic, reason=reason)


def observation(decision: Decision) -> dict[str, str]:
    """The ``key=value`` fields of an observed_oom reason (empty for any other decision)."""
    if not is_observed_oom(decision):
        return {}
    head = decision.reason.split(" error=", 1)[0]
    out: dict[str, str] = {}
    for token in head.split(":", 1)[-1].split():
        name, sep, value = token.partition("=")
        if sep:
            out[name] = value
    return out


def record_observed_oom(
    plan: KernelPlan,
    budget: Budget,
    store: Store | None,
    *,
    requested_bytes: int | None,
    free_bytes: int | None,
    error: str = "",
) -> Outcome:
    """Store the fact that ``plan``'s benchmark ran out of memory under ``budget``, before returning.

    The entry goes under the same key a lookup uses, replacing a computed
    ``tune`` there (``Store.put``: a fact outranks an estimate). Every later
    lookup hits it and falls back without benchmarking. The write goes through
    contention: retried with backoff for ``FACT_WAIT_SECONDS`` (never skipped for
    a store's pause after a fault). A fact that still cannot be written is kept
    in this process (``_held``): every lookup of its key here falls back, the
    write is tried again at a lookup every ``FACT_RETRY_SECONDS`` and at exit,
    and one warning says so. Without a store nothing is kept.
    """
    key, parts = build_key(plan, budget)
    reps = try_representatives(plan)
    computed = decide_with(plan, reps, budget)
    decision = observed_oom_decision(plan, computed, requested_bytes=requested_bytes, free_bytes=free_bytes,
                                     error=error)
    family = None if isinstance(reps, NotBounded) else family_summary(reps)
    entry = Entry.new(key, parts, plan, family, decision)
    stored = store is not None and _put_fact(store, entry, FACT_WAIT_SECONDS)
    if store is not None:
        if not stored:
            _hold(store, entry)
        _remember(store, key, entry)  # written or held, this process falls back for it from now on
    with _lock:
        COUNTERS.observed_oom += 1
        if stored:
            COUNTERS.stored += 1
    return _observed(Outcome(key, decision, False, entry), plan)


def _put_fact(store: Store, entry: Entry, wait: float) -> bool:
    """Put the fact ``entry``, trying again with backoff for ``wait`` seconds; True once the store holds an
    observed OOM under its key (this one, or another process's)."""
    deadline, delay = time.monotonic() + wait, 0.05
    while True:
        if _put(store, entry):
            return True
        try:
            there = store.get(entry.key)
        except Exception:  # a broken backend: as a failed put
            there = None
        if there is not None and is_observed_oom(there.decision):
            return True
        if not store.writable or time.monotonic() + delay > deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 1.0)


#: The observed-OOM facts this process could not write: key -> (fact, the store it is for). Every lookup of
#: such a key falls back (``_lookup_or_decide``), whatever store it reads.
_held: dict[str, tuple[Entry, Store]] = {}
_held_lock = threading.Lock()
_retry_at = 0.0
_held_warned = False
_exit_registered = False


def _hold(store: Store, entry: Entry) -> None:
    """Keep ``entry`` in the process, to be written later; warn once per process."""
    global _held_warned, _exit_registered, _retry_at
    with _held_lock:
        _held[entry.key] = (entry, store)
        _retry_at = time.monotonic() + FACT_RETRY_SECONDS
        warn, _held_warned = not _held_warned, True
        if not _exit_registered:
            _exit_registered = True
            atexit.register(write_held_facts, FACT_WAIT_SECONDS)
    with _lock:  # every store's memory of the key: the next lookup reads ``_held``
        for memo in _memos.values():
            if memo.outcomes.pop(entry.key, None) is not None:
                memo.changed()
    if warn:
        log.warning("prescreen: could not write an observed out-of-memory fact (key %s) to the %s store at %s "
                    "within %g s; this process keeps it (its lookups fall back) and tries again every %g s "
                    "and at exit", entry.key[:12], store.backend, store.location, FACT_WAIT_SECONDS,
                    FACT_RETRY_SECONDS)


def _held_fact(key: str) -> Entry | None:
    """The fact held for ``key``, if any; first, when due, another try at writing every held fact."""
    global _retry_at
    if time.monotonic() >= _retry_at:
        with _held_lock:
            _retry_at = time.monotonic() + FACT_RETRY_SECONDS
        write_held_facts(0.0)
    found = _held.get(key)
    return None if found is None else found[0]


def write_held_facts(wait: float = FACT_WAIT_SECONDS) -> int:
    """Try again to write the facts this process holds (each for up to ``wait`` seconds); returns how many are
    still held. Runs at exit (a warning names what is left) and at a lookup every ``FACT_RETRY_SECONDS``."""
    with _held_lock:
        pending = list(_held.items())
    for key, (entry, store) in pending:
        if _put_fact(store, entry, wait):
            with _held_lock:
                if _held.get(key, (None,))[0] is entry:
                    del _held[key]
            with _lock:
                COUNTERS.stored += 1
    left = len(_held)
    if left and wait > 0:
        log.warning("prescreen: %d observed out-of-memory fact(s) could not be written; a later process may "
                    "benchmark those steps again (the guard catches the error)", left)
    return left
