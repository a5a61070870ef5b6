"""Repeated lookups answered from a plan object's memory: which store, which budget, when it is stale, counts."""

from __future__ import annotations

import dataclasses
import gc
import threading
from pathlib import Path

from test_store_support import BUDGET, make_plan

from prescreen import service
from prescreen.key import forget_plan_hashes
from prescreen.service import COUNTERS, forget, lookup_or_decide
from prescreen.store import DiskStore

SEED = 5


def reads_of(store: DiskStore) -> list[str]:
    reads: list[str] = []
    real_lookup = store.lookup

    def counting_lookup(key: str) -> object:
        reads.append(key)
        return real_lookup(key)

    store.lookup = counting_lookup  # type: ignore[method-assign, assignment]
    return reads


def test_a_plan_object_remembers_its_lookup_per_store_object(tmp_path: Path) -> None:
    plan = make_plan(SEED)
    with DiskStore(tmp_path / "a") as a, DiskStore(tmp_path / "b") as b:
        assert not lookup_or_decide(plan, BUDGET, a).hit
        a_reads, b_reads = reads_of(a), reads_of(b)
        assert lookup_or_decide(plan, BUDGET, a).hit and a_reads == []
        assert not lookup_or_decide(plan, BUDGET, b).hit and len(b_reads) == 1  # another store: it reads
        assert lookup_or_decide(plan, BUDGET, b).hit and len(b_reads) == 1
        assert lookup_or_decide(plan, BUDGET, a).hit and a_reads == []  # back to a: still from memory
        assert lookup_or_decide(plan, BUDGET, None).hit is False  # no store: computed


def test_forget_and_a_new_budget_object_are_seen(tmp_path: Path) -> None:
    plan = make_plan(SEED)
    with DiskStore(tmp_path) as store:
        lookup_or_decide(plan, BUDGET, store)
        store.delete([lookup_or_decide(plan, BUDGET, store).key])
        assert lookup_or_decide(plan, BUDGET, store).hit  # a delete beside the service is not seen
        forget(store)
        assert not lookup_or_decide(plan, BUDGET, store).hit
        other = dataclasses.replace(BUDGET, ratio=0.5)
        assert not lookup_or_decide(plan, other, store).hit  # another budget: another key
        assert lookup_or_decide(plan, other, store).decision.ratio == 0.5
        assert lookup_or_decide(plan, BUDGET, store).decision.ratio == BUDGET.ratio
        forget_plan_hashes()
        assert lookup_or_decide(plan, BUDGET, store).hit


def test_a_plan_does_not_keep_its_store_alive_or_answer_for_its_successor(tmp_path: Path) -> None:
    plan = make_plan(SEED)
    store = DiskStore(tmp_path / "old")
    lookup_or_decide(plan, BUDGET, store)
    assert lookup_or_decide(plan, BUDGET, store).hit
    store.close()
    del store
    gc.collect()
    assert not service._memos or all(m.store() is not None for m in service._memos.values())
    with DiskStore(tmp_path / "new") as fresh:  # maybe the same id(): the memo's weak reference tells them apart
        assert not lookup_or_decide(plan, BUDGET, fresh).hit


def test_counts_from_memory_are_exact_across_threads(tmp_path: Path) -> None:
    plans = [make_plan(SEED + i) for i in range(3)]
    with DiskStore(tmp_path) as store:
        for p in plans:
            lookup_or_decide(p, BUDGET, store)
            lookup_or_decide(p, BUDGET, store)
        before = dataclasses.replace(COUNTERS)
        store_hits = store.hits
        per_thread = 2000

        def work(i: int) -> None:
            for _ in range(per_thread):
                assert lookup_or_decide(plans[i % 3], BUDGET, store).hit

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = 4 * per_thread
        assert COUNTERS.memo_hits == before.memo_hits + total
        assert (COUNTERS.lookups, COUNTERS.hits) == (before.lookups + total, before.hits + total)
        assert COUNTERS.tuned + COUNTERS.fell_back == before.tuned + before.fell_back + total
        assert COUNTERS.estimator_calls == before.estimator_calls
        assert store.hits == store_hits + total  # answers from memory are added to it under the lock


def test_counters_written_by_a_caller_see_earlier_hits_first(tmp_path: Path) -> None:
    plan = make_plan(SEED)
    with DiskStore(tmp_path) as store:
        lookup_or_decide(plan, BUDGET, store)
        lookup_or_decide(plan, BUDGET, store)
        lookup_or_decide(plan, BUDGET, store)  # from memory: folded in when COUNTERS is next touched
        COUNTERS.largest_estimate = 0  # as bench/gpu_coverage.py does
        assert COUNTERS.largest_estimate == 0
        lookup_or_decide(plan, BUDGET, store)
        assert COUNTERS.largest_estimate == (lookup_or_decide(plan, BUDGET, store).decision.estimated_bytes or 0)


def test_answers_from_memory_count_as_the_stores_hits(tmp_path: Path) -> None:
    plan = make_plan(SEED)
    with DiskStore(tmp_path) as store:
        lookup_or_decide(plan, BUDGET, store)  # computed: a miss
        lookup_or_decide(plan, BUDGET, store)  # from the memo by key
        for _ in range(5):
            lookup_or_decide(plan, BUDGET, store)  # from the plan object's memory
        assert (store.hits, store.misses) == (6, 1)
        assert store.stats().hits == 6
        forget(store)
        assert lookup_or_decide(plan, BUDGET, store).hit  # a real read
        assert store.hits == 7


def test_a_plan_remembered_in_one_store_is_not_answered_for_another_of_the_same_memo_state(tmp_path: Path) -> None:
    plan, other = make_plan(SEED), make_plan(SEED + 1)
    with DiskStore(tmp_path / "a") as a, DiskStore(tmp_path / "b") as b:
        lookup_or_decide(plan, BUDGET, a)
        assert lookup_or_decide(plan, BUDGET, a).hit
        lookup_or_decide(other, BUDGET, a)  # a's memo changed: what the plan remembered is stale
        reads = reads_of(a)
        assert lookup_or_decide(plan, BUDGET, a).hit and reads == []  # found again by key, not read
        assert a.memo_token is not b.memo_token
        assert not lookup_or_decide(plan, BUDGET, b).hit
