"""Look a decision up by key, or compute, store and return it."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import socket
import threading
import time
import weakref
from collections.abc import Callable

from prescreen.budget import Budget
from prescreen.decision import Decision, decide_with, is_observed_oom, try_representatives
from prescreen.errors import NotBounded, Reason
from prescreen.key import build_key
from prescreen.plan import KernelPlan
from prescreen.representatives import Representatives
from prescreen.store.base import Store
from prescreen.store.entry import Entry


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

    def count(self, decision: Decision) -> None:
        if decision.tune:
            self.tuned += 1
        else:
            self.fell_back += 1
        if not decision.bounded:
            self.not_bounded += 1
        if decision.estimated_bytes is not None:
            self.largest_estimate = max(self.largest_estimate, decision.estimated_bytes)


COUNTERS = Counters()
_lock = threading.Lock()

#: Callbacks told of every lookup (``prescreen warm`` collects its report this way).
OBSERVERS: list[Callable[["Outcome", KernelPlan], None]] = []


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    key: str
    decision: Decision
    hit: bool
    entry: Entry | None


#: How many decisions the in-process memo keeps per store (least recently used dropped first).
MEMO_SIZE = 4096
# Per store object (dropped with it): key -> the entry that store holds under that key, as far
# as this process knows: filled by a valid hit and by a put that stored, replaced or removed by
# every put made through this module (so an observed_oom recorded here is seen at once). Changes
# made by other processes (or directly on the store object) are not seen until the process restarts
# or ``forget`` is called; an observed_oom recorded elsewhere is re-recorded here if it happens here.
_memo: weakref.WeakKeyDictionary[Store, collections.OrderedDict[str, Entry]] = weakref.WeakKeyDictionary()


def forget(store: Store | None = None) -> None:
    """Drop the in-process memo of ``store``'s decisions (of every store when None)."""
    with _lock:
        if store is None:
            _memo.clear()
        else:
            _memo.pop(store, None)


def _remember(store: Store, key: str, entry: Entry | None) -> None:
    """Record what ``store`` now holds under ``key`` (``None``: not known, read it next time)."""
    with _lock:
        memo = _memo.get(store)
        if memo is None:
            if entry is None:
                return
            memo = _memo[store] = collections.OrderedDict()
        if entry is None:
            memo.pop(key, None)
            return
        memo[key] = entry
        memo.move_to_end(key)
        if len(memo) > MEMO_SIZE:
            memo.popitem(last=False)


def _recall(store: Store, key: str) -> Entry | None:
    with _lock:
        memo = _memo.get(store)
        if memo is None:
            return None
        entry = memo.get(key)
        if entry is not None:
            memo.move_to_end(key)
        return entry


def lookup_or_decide(plan: KernelPlan, budget: Budget, store: Store | None, *, write: bool = True) -> Outcome:
    """The decision for ``plan`` under ``budget``: from ``store`` on a hit, else computed (and stored)."""
    start = time.perf_counter()
    try:
        return _lookup_or_decide(plan, budget, store, write)
    finally:
        elapsed = time.perf_counter() - start
        with _lock:
            COUNTERS.seconds += elapsed


def _lookup_or_decide(plan: KernelPlan, budget: Budget, store: Store | None, write: bool) -> Outcome:
    # A computed decision is only ever *added* (``Store.put`` keeps a valid entry already
    # there), so a stored observed_oom fallback is never overwritten by a computed tune.
    key, parts = build_key(plan, budget)
    if store is not None:
        entry = _recall(store, key)
        if entry is not None:
            store.hits += 1  # the store's own per-entry hit counts (``inspect``) see store reads only
            with _lock:
                COUNTERS.lookups += 1
                COUNTERS.hits += 1
                COUNTERS.memo_hits += 1
                COUNTERS.count(entry.decision)
            return _observed(Outcome(key, entry.decision, True, entry), plan)
    with _lock:
        COUNTERS.lookups += 1
    if store is not None:
        entry = store.get(key)
        if entry is not None and entry.dynamic != plan.is_dynamic:
            # The key matches this plan, so the stored flag was tampered with: a miss.
            store.warn_once("invalid entry", f"key {key[:12]}: dynamic flag does not match the plan")
            entry = None
        if entry is not None:
            _remember(store, key, entry)
            with _lock:
                COUNTERS.hits += 1
                COUNTERS.count(entry.decision)
            return _observed(Outcome(key, entry.decision, True, entry), plan)
    with _lock:
        COUNTERS.estimator_calls += 1
    reps = try_representatives(plan)
    decision = decide_with(plan, reps, budget)
    family = None if isinstance(reps, NotBounded) else family_summary(reps)
    entry = Entry.new(key, parts, plan, family, decision)
    if store is not None and write:
        stored = store.put(entry)
        # False: a valid entry got there first (maybe another process's observed_oom); read it next time.
        _remember(store, key, entry if stored else None)
        if stored:
            with _lock:
                COUNTERS.stored += 1
    with _lock:
        COUNTERS.count(decision)
    return _observed(Outcome(key, decision, False, entry), plan)


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
    """Store the fact that ``plan``'s benchmark ran out of memory under ``budget``.

    The entry goes under the same key a lookup uses, replacing a computed
    ``tune`` there (that is the one overwrite allowed: a fact beats an
    estimate). Every later lookup hits it and falls back without benchmarking.
    """
    key, parts = build_key(plan, budget)
    reps = try_representatives(plan)
    computed = decide_with(plan, reps, budget)
    decision = observed_oom_decision(plan, computed, requested_bytes=requested_bytes, free_bytes=free_bytes,
                                     error=error)
    family = None if isinstance(reps, NotBounded) else family_summary(reps)
    entry = Entry.new(key, parts, plan, family, decision)
    stored = store is not None and _put_observed(store, entry)
    if store is not None:
        _remember(store, key, entry if stored else None)
    with _lock:
        COUNTERS.observed_oom += 1
        if stored:
            COUNTERS.stored += 1
    return _observed(Outcome(key, decision, False, entry), plan)


def _put_observed(store: Store, entry: Entry, attempts: int = 3) -> bool:
    """Put ``entry``, first removing a computed decision under its key; True once it is there."""
    for _ in range(attempts):
        current = store.get(entry.key)
        if current is not None and is_observed_oom(current.decision):
            return True  # another process recorded the same fact first
        if current is not None:
            store.delete([entry.key])
        if store.put(entry):
            return True
    return False
