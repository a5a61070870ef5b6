"""Real processes sharing one DiskStore: overlapping writers/readers, and a stampede on one key."""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from pathlib import Path

import pytest
from test_store_support import BUDGET, make_plan

from prescreen.decision import decide
from prescreen.key import build_key
from prescreen.service import COUNTERS, lookup_or_decide
from prescreen.store import DiskStore

pytestmark = pytest.mark.slow

PROCESSES = 8
KEYS_PER_PROCESS = 1000
KEY_SPACE = 2000  # each process draws 1000 of these: heavy overlap between processes

CTX = multiprocessing.get_context("fork")


def seeds_of(worker: int) -> list[int]:
    return random.Random(worker).sample(range(KEY_SPACE), KEYS_PER_PROCESS)


def _overlapping_worker(directory: str, worker: int, barrier: object, results: object) -> None:
    stored_before = COUNTERS.stored
    wrong = hits = 0
    barrier.wait()
    with DiskStore(directory) as store:
        for seed in seeds_of(worker):
            plan = make_plan(seed)
            outcome = lookup_or_decide(plan, BUDGET, store)
            if outcome.hit:
                hits += 1
                wrong += outcome.decision != decide(plan, BUDGET)
    results.put({"warned": sorted(store._warned), "worker": worker, "hits": hits, "stored": COUNTERS.stored - stored_before, "wrong": wrong})


def run_processes(target: object, args_of: object, count: int) -> list[dict[str, object]]:
    barrier, results = CTX.Barrier(count), CTX.Queue()
    procs = [CTX.Process(target=target, args=(*args_of(i), barrier, results)) for i in range(count)]
    for p in procs:
        p.start()
    out = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * count
    return out


def test_overlapping_processes_store_every_decision_once(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    results = run_processes(_overlapping_worker, lambda i: (directory, i), PROCESSES)
    assert sum(r["wrong"] for r in results) == 0
    all_seeds = sorted({s for w in range(PROCESSES) for s in seeds_of(w)})
    # first writer wins: every distinct key was stored by exactly one process
    assert sum(r["stored"] for r in results) == len(all_seeds), [r["warned"] for r in results]
    # at most one miss per key, unless two processes missed the same key at the same moment
    assert 0 < sum(r["hits"] for r in results) <= PROCESSES * KEYS_PER_PROCESS - len(all_seeds)
    with DiskStore(directory) as store:
        assert len(store.keys()) == len(all_seeds)
        for seed in all_seeds:
            plan = make_plan(seed)
            entry = store.get(build_key(plan, BUDGET)[0])
            assert entry is not None, f"seed {seed} missing"
            assert entry.decision == decide(plan, BUDGET)


def _stampede_worker(directory: str, worker: int, barrier: object, results: object) -> None:
    plan = make_plan(4242)
    stored_before = COUNTERS.stored
    barrier.wait()
    with DiskStore(directory) as store:
        outcome = lookup_or_decide(plan, BUDGET, store)
    results.put(
        {
            "pid": os.getpid(),
            "stored": COUNTERS.stored - stored_before,
            "decision": outcome.decision,
            "hit": outcome.hit,
        }
    )


def test_stampede_on_one_key_stores_one_value(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    results = run_processes(_stampede_worker, lambda i: (directory, i), 12)
    fresh = decide(make_plan(4242), BUDGET)
    assert all(r["decision"] == fresh for r in results)
    winners = [r["pid"] for r in results if r["stored"]]
    assert len(winners) == 1
    with DiskStore(directory) as store:
        assert len(store.keys()) == 1
        entry = store.get(build_key(make_plan(4242), BUDGET)[0])
    assert entry is not None and entry.pid == winners[0] and entry.decision == fresh


# -- acknowledged means written; another process's fact reaches a running one ------------------------------

def test_a_lookups_hit_counts_are_written_at_close(tmp_path: Path) -> None:
    """Hit counts are statistics: a lookup never writes them (no commit on a decision's read); close does."""
    with DiskStore(tmp_path) as store:
        outcome = lookup_or_decide(make_plan(12), BUDGET, store)
        writes: list[int] = []
        real = store.flush_hits
        store.flush_hits = lambda: (writes.append(1), real())[-1]  # type: ignore[method-assign]
        for _ in range(3):
            assert store.lookup(outcome.key) is not None
        assert writes == []
    with DiskStore(tmp_path) as again:
        entry = again.get(outcome.key)
        assert entry is not None and entry.hits == 4  # three lookups and this get


def test_a_running_process_serves_another_process_s_fact_within_the_recheck(tmp_path: Path) -> None:
    """Process B decided ``tune`` and keeps looking the plan up; process A records an observed OOM for it:
    B's next lookups fall back (every lookup reads the store)."""
    from test_store_support import fact_child, fact_result

    ready = tmp_path / "ready"
    store = {"disk": str(tmp_path / "s")}
    watcher = fact_child({"store": store, "seed": 41, "do": "watch", "ready": str(ready),
                          "timeout": 20})
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert watcher.poll() is None and time.monotonic() < deadline, "the watching process did not start"
        time.sleep(0.05)
    time.sleep(1.0)
    assert not fact_result(fact_child({"store": store, "seed": 41, "do": "record"}))["held"]
    written_at = time.time()
    seen = fact_result(watcher)
    assert seen["observed"] and seen["seen_at"] is not None and seen["seen_at"] - written_at < 5.0, seen


def test_a_lookup_hands_the_gil_back_promptly_and_restores_the_interval(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """While any lookup runs, the switch interval is short (its store reads release the GIL, and busy compile
    threads would otherwise keep it for 5 ms each time); overlapping lookups on two threads give back the
    interval the first one found; with the setting off, nothing changes."""
    import sys
    import threading

    from prescreen import service

    seen: list[float] = []
    both_inside = threading.Barrier(2)

    class Store(DiskStore):
        def lookup(self, key: str) -> object:
            seen.append(sys.getswitchinterval())
            if threading.current_thread().name.startswith("overlap"):
                both_inside.wait(timeout=10)
            return super().lookup(key)

    original = sys.getswitchinterval()
    with Store(tmp_path) as store:
        lookup_or_decide(make_plan(seed=1), BUDGET, store)
        threads = [threading.Thread(target=lookup_or_decide, args=(make_plan(seed=s), BUDGET, store), name=f"overlap{s}")
                   for s in (2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [pytest.approx(service.LOOKUP_SWITCH_INTERVAL)] * 3 and sys.getswitchinterval() == original
        monkeypatch.setattr(service, "LOOKUP_SWITCH_INTERVAL", None)
        lookup_or_decide(make_plan(seed=4), BUDGET, store)
    assert seen[-1] == original and sys.getswitchinterval() == original
