"""Look a decision up by key, or compute, store and return it."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prescreen.budget import Budget
from prescreen.decision import Decision, decide_with_representatives, is_observed_oom
from prescreen.errors import Reason
from prescreen.key import build_key
from prescreen.plan import KernelPlan
from prescreen.representatives import Representatives
from prescreen.store.base import Store
from prescreen.store.entry import Entry, outranks

log = logging.getLogger("prescreen")

#: How long ``record_observed_oom`` keeps trying to write a fact through a locked or failing store.
FACT_WAIT_SECONDS = 5.0
#: How often a fact this process could not write is tried again, at a lookup (and once more at exit).
FACT_RETRY_SECONDS = 30.0


@dataclasses.dataclass
class Counters:
    """Per-process counts the hooks and ``warm`` report (``COUNTERS``, written under ``_lock``)."""

    lookups: int = 0
    hits: int = 0  # answered by an entry the store holds
    estimator_calls: int = 0
    stored: int = 0
    tuned: int = 0
    fell_back: int = 0
    not_bounded: int = 0
    largest_estimate: int = 0
    observed_oom: int = 0  # guarded benchmarks that ran out of memory and were redone with the fallback
    seconds: float = 0.0  # wall time spent inside lookup_or_decide


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


def lookup_or_decide(plan: KernelPlan, budget: Budget, store: Store | None, *, write: bool = True) -> Outcome:
    """The decision for ``plan`` under ``budget``: a fact this process holds, else ``store``'s entry, else computed
    and added (a put that loses to a stricter entry answers with it). Every lookup reads the store."""
    return lookup_or_decide_all([plan], budget, store, write=write)[0]


def lookup_or_decide_all(plans: Sequence[KernelPlan], budget: Budget, store: Store | None, *,
                         write: bool = True) -> list[Outcome]:
    """``lookup_or_decide`` for each of one guarded step's plans, their new entries written in one ``put_all``
    (one transaction on disk: a fusion step's three kernels pay for one)."""
    start = time.perf_counter()
    try:
        with _gil_handed_back_promptly():
            outcomes = _lookup_or_decide(plans, budget, store, write)
    finally:
        elapsed = time.perf_counter() - start
        with _lock:
            COUNTERS.seconds += elapsed
    return [_observed(o, plan) for o, plan in zip(outcomes, plans)] if OBSERVERS else outcomes


#: The interpreter's switch interval while a lookup runs (None: left alone): a lookup's I/O releases the GIL,
#: and taking it back from compile threads running Python waits 5 ms each time. Threads in native calls hold it
#: whatever the interval, and a short one then costs this thread CPU in wake-ups (``bench/bench_runtime_step.py``).
LOOKUP_SWITCH_INTERVAL: float | None = 1e-4
_switching: list[float] = [0, 0.0]  # lookups running, the interval they found


@contextlib.contextmanager
def _gil_handed_back_promptly() -> Iterator[None]:
    """``LOOKUP_SWITCH_INTERVAL`` while any lookup runs, then whatever interval the first one found."""
    wanted = LOOKUP_SWITCH_INTERVAL
    if wanted is None:
        yield
        return
    with _lock:
        if not _switching[0]:
            _switching[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(wanted, _switching[1]))
        _switching[0] += 1
    try:
        yield
    finally:
        with _lock:
            _switching[0] -= 1
            if not _switching[0]:
                sys.setswitchinterval(_switching[1])


def _lookup_or_decide(plans: Sequence[KernelPlan], budget: Budget, store: Store | None,
                      write: bool) -> list[Outcome]:
    keyed = [(plan, *build_key(plan, budget)) for plan in plans]
    answers: dict[str, Outcome] = {}  # by key: a kernel met twice in a step has one answer
    hits: dict[str, bool] = {}
    new: list[Entry] = []  # computed here, to be stored
    for plan, key, parts in keyed:
        if key in answers:
            continue
        found, hits[key] = _held_fact(key) if _held else None, False
        if found is None and store is not None:
            found = store.lookup(key)
            if found is not None and found.dynamic != plan.is_dynamic:
                # The key matches this plan, so the stored flag was tampered with: a miss.
                store.warn_once("invalid entry", f"key {key[:12]}: dynamic flag does not match the plan")
                found = None
            hits[key] = found is not None
        if found is None:
            with _lock:
                COUNTERS.estimator_calls += 1
            decision, reps = decide_with_representatives(plan, budget)
            found = Entry.new(key, parts, plan, family_summary(reps), decision)
            new.append(found)
        answers[key] = Outcome(key, found.decision, hits[key], found)
    if store is not None and write and new:
        for entry, stored in zip(new, _put_all(store, new)):
            if stored:
                with _lock:
                    COUNTERS.stored += 1
                continue
            # another process's stricter entry (a fact) may have got there since the read: it stands
            there = store.lookup(entry.key)
            if there is not None and there.dynamic == entry.dynamic and outranks(there.decision, entry.decision):
                answers[entry.key] = Outcome(entry.key, there.decision, True, there)
    for _, key, _ in keyed:
        _count(answers[key].decision, hit=hits[key])
    return [answers[key] for _, key, _ in keyed]


def _count(decision: Decision, *, hit: bool) -> None:
    """Count one lookup answered with ``decision``."""
    with _lock:
        c = COUNTERS
        c.lookups += 1
        c.hits += hit
        if decision.action == "tune":
            c.tuned += 1
        else:
            c.fell_back += 1
        c.not_bounded += not decision.bounded
        if decision.estimated_bytes is not None and decision.estimated_bytes > c.largest_estimate:
            c.largest_estimate = decision.estimated_bytes


def _put_all(store: Store, entries: list[Entry]) -> list[bool]:
    """``store.put_all(entries)``; a backend that raises (a bug: stores never raise on a fault) stored none of them,
    with one warning."""
    try:
        return store.put_all(entries)
    except Exception as exc:
        store.warn_once("write failed", exc)
        return [False] * len(entries)


def family_summary(reps: Representatives | None) -> dict[str, object] | None:
    """What an entry keeps of the shape family; the full representatives follow from its plan."""
    return None if reps is None else {
        "group_count": reps.group_count,
        "reachable": len(reps.grid),
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
    """``computed`` as the fallback a real OOM proved right: the numbers stay; the reason starts ``observed_oom``
    with the bytes requested and free, the estimate, host and time."""
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


def record_observed_oom(
    plan: KernelPlan,
    budget: Budget,
    store: Store | None,
    *,
    requested_bytes: int | None,
    free_bytes: int | None,
    error: str = "",
) -> Outcome:
    """Store the fact that ``plan``'s benchmark ran out of memory under ``budget``, under its lookup key (it
    outranks a computed ``tune``), retried for ``FACT_WAIT_SECONDS``; one still unwritten is held in this process
    (its lookups fall back) and retried every ``FACT_RETRY_SECONDS`` and at exit, with one warning."""
    key, parts = build_key(plan, budget)
    computed, reps = decide_with_representatives(plan, budget)
    decision = observed_oom_decision(plan, computed, requested_bytes=requested_bytes, free_bytes=free_bytes,
                                     error=error)
    entry = Entry.new(key, parts, plan, family_summary(reps), decision)
    stored = store is not None and _put_fact(store, entry, FACT_WAIT_SECONDS)
    if store is not None and not stored:
        _hold(store, entry)  # this process falls back for it from now on
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
        if _put_all(store, [entry])[0]:
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
