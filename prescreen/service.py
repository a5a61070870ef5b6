"""Look a decision up by key, or compute, store and return it."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from prescreen.budget import Budget
from prescreen.decision import Decision, decide_with, try_representatives
from prescreen.errors import NotBounded
from prescreen.key import build_key
from prescreen.plan import KernelPlan
from prescreen.representatives import Representatives
from prescreen.store.base import Store
from prescreen.store.entry import Entry


@dataclasses.dataclass
class Counters:
    """Per-process counts the hooks and ``warm`` report."""

    lookups: int = 0
    hits: int = 0
    estimator_calls: int = 0
    stored: int = 0
    tuned: int = 0
    fell_back: int = 0
    not_bounded: int = 0
    largest_estimate: int = 0
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
    key, parts = build_key(plan, budget)
    with _lock:
        COUNTERS.lookups += 1
    if store is not None:
        entry = store.get(key)
        if entry is not None:
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
    if store is not None and write and store.put(entry):
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
