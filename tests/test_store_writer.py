"""Store writes off the compile's path: ``lookup_or_decide(..., wait=False)`` and the background writer."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_store_support import BUDGET, make_plan

from prescreen import service
from prescreen.decision import decide, is_observed_oom
from prescreen.hooks import state
from prescreen.key import build_key
from prescreen.service import COUNTERS, flush_writes, forget, lookup_or_decide, record_observed_oom
from prescreen.store import DiskStore, writer
from prescreen.store.entry import Entry


class HeldStore(DiskStore):
    """A DiskStore whose puts wait until ``release`` is set (a slow commit), and record the thread they ran on."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.release = threading.Event()
        self.put_threads: list[str] = []

    def put(self, entry: Entry) -> bool:
        self.put_threads.append(threading.current_thread().name)
        assert self.release.wait(10), "the test never released the put"
        return super().put(entry)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[HeldStore]:
    store = HeldStore(tmp_path / "store")
    try:
        yield store
    finally:
        store.release.set()
        flush_writes()
        store.close()


def test_a_queued_write_does_not_hold_the_caller_and_lands_on_flush(held: HeldStore) -> None:
    stored_before = COUNTERS.stored
    plan = make_plan(1)
    outcome = lookup_or_decide(plan, BUDGET, held, wait=False)  # returns although the put is blocked
    assert not outcome.hit and held.get(outcome.key) is None and writer.pending() == 1
    again = lookup_or_decide(make_plan(1), BUDGET, held, wait=False)  # an equal plan: from the memo
    assert again.hit and again.decision == outcome.decision and COUNTERS.stored == stored_before
    held.release.set()
    assert flush_writes(10)
    assert writer.pending() == 0 and COUNTERS.stored == stored_before + 1
    assert held.put_threads == ["prescreen-store-writer"]
    stored = held.get(outcome.key)
    assert stored is not None and stored.decision == outcome.decision


def test_a_synchronous_lookup_writes_before_it_returns(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        outcome = lookup_or_decide(make_plan(2), BUDGET, store)
        assert store.get(outcome.key) is not None and writer.pending() == 0


def test_an_observed_oom_written_meanwhile_wins_over_the_queued_computed_decision(held: HeldStore) -> None:
    plan = make_plan(3)
    computed = lookup_or_decide(plan, BUDGET, held, wait=False)
    assert computed.decision.tune
    held.release.set()  # the observed_oom's own put is synchronous; the queued put may run before or after it
    fact = record_observed_oom(plan, BUDGET, held, requested_bytes=2**30, free_bytes=2**20)
    assert flush_writes(10)
    stored = held.get(computed.key)
    assert stored is not None and is_observed_oom(stored.decision) and stored.decision == fact.decision
    forget(held)
    again = lookup_or_decide(make_plan(3), BUDGET, held, wait=False)
    assert again.hit and is_observed_oom(again.decision)


def test_a_write_that_does_not_store_is_read_back_next_time(held: HeldStore) -> None:
    plan = make_plan(4)
    first = lookup_or_decide(plan, BUDGET, held, wait=False)
    # Another process stores a different valid entry under the key first (simulated beside the service).
    theirs = record_observed_oom(plan, BUDGET, None, requested_bytes=1, free_bytes=1).entry
    assert theirs is not None and theirs.key == first.key
    assert DiskStore.put(held, theirs)
    held.release.set()
    assert flush_writes(10)  # the queued put finds a valid entry there: not stored, and the memo forgets it
    again = lookup_or_decide(make_plan(4), BUDGET, held, wait=False)
    assert again.hit and is_observed_oom(again.decision)


class RaisingStore(DiskStore):
    def put(self, entry: Entry) -> bool:
        raise RuntimeError("a broken backend")


def test_a_put_that_raises_is_warned_and_the_writer_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with RaisingStore(tmp_path / "bad") as bad, DiskStore(tmp_path / "good") as good:
        lookup_or_decide(make_plan(5), BUDGET, bad, wait=False)
        assert flush_writes(10)
        assert "a broken backend" in caplog.text
        outcome = lookup_or_decide(make_plan(5), BUDGET, bad, wait=False)
        assert not outcome.hit  # the failed write was taken back from the memo: decided again
        done = lookup_or_decide(make_plan(6), BUDGET, good, wait=False)
        assert flush_writes(10) and good.get(done.key) is not None


def test_resetting_the_hooks_state_makes_the_queued_writes_first(tmp_path: Path) -> None:
    store = HeldStore(tmp_path)
    state.configure(store=store)
    try:
        outcome = lookup_or_decide(make_plan(7), BUDGET, state.get_store(), wait=False)
        threading.Timer(0.2, store.release.set).start()
        state.reset()  # waits for the put (released 0.2 s later) before the hooks let go of the store
        assert writer.pending() == 0 and store.get(outcome.key) is not None
    finally:
        store.release.set()
        store.close()


EXIT_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[2])
from test_store_support import BUDGET, make_plan
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore
store = DiskStore(sys.argv[1])
for seed in range(40):
    lookup_or_decide(make_plan(seed), BUDGET, store, wait=False)
# no flush, no close: interpreter exit writes what is queued
"""


def test_interpreter_exit_writes_what_is_queued(tmp_path: Path) -> None:
    tests = str(Path(__file__).parent)
    subprocess.run([sys.executable, "-P", "-c", EXIT_CHILD, str(tmp_path), tests], check=True, timeout=120)
    with DiskStore(tmp_path) as store:
        assert len(store.keys()) == 40


def _forked_child(directory: str, seed: int) -> None:
    store = DiskStore(directory)
    lookup_or_decide(make_plan(seed), BUDGET, store, wait=False)
    assert flush_writes(10)
    store.close()


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_child_writes_with_its_own_thread(held: HeldStore, tmp_path: Path) -> None:
    lookup_or_decide(make_plan(8), BUDGET, held, wait=False)  # the parent's writer is busy (held)
    child = multiprocessing.get_context("fork").Process(target=_forked_child, args=(str(tmp_path / "child"), 9))
    child.start()
    child.join(60)
    assert child.exitcode == 0  # its flush did not wait on the parent's queue
    with DiskStore(tmp_path / "child") as store:
        assert len(store.keys()) == 1
    assert writer.pending() == 1  # the parent's write is still its own to make
    held.release.set()
    assert flush_writes(10) and len(held.keys()) == 1


def test_the_memo_and_counters_see_a_queued_decision_once(held: HeldStore) -> None:
    lookups, estimator = COUNTERS.lookups, COUNTERS.estimator_calls
    plan = make_plan(10)
    for _ in range(3):
        lookup_or_decide(plan, BUDGET, held, wait=False)
    assert COUNTERS.estimator_calls == estimator + 1 and COUNTERS.lookups == lookups + 3
    assert service.COUNTERS.memo_hits >= 2


def test_closing_a_store_waits_for_its_queued_writes_only(held: HeldStore, tmp_path: Path) -> None:
    gate = threading.Event()
    with DiskStore(tmp_path / "mine") as store:
        writer.call(store, lambda: None if gate.wait(10) else None)  # this store's writer work, gated
        outcome = lookup_or_decide(make_plan(11), BUDGET, store, wait=False)
        lookup_or_decide(make_plan(13), BUDGET, held, wait=False)  # another store's write behind them, held
        threading.Timer(0.2, gate.set).start()
    # the with block's close waited for the gate and the put behind it, not for the held store's write
    assert writer.pending() == 1
    with DiskStore(tmp_path / "mine") as again:
        assert again.get(outcome.key) is not None


def test_a_decisions_hit_count_is_written_off_the_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with DiskStore(tmp_path) as store:
        outcome = lookup_or_decide(make_plan(12), BUDGET, store)
        gate = threading.Event()
        writer.call(store, lambda: None if gate.wait(10) else None)
        monkeypatch.setattr(store._hits, "flushed_at", 0.0)  # the hit buffer is due
        flushes: list[str] = []
        real_flush = store.flush_hits
        monkeypatch.setattr(store, "flush_hits", lambda: (flushes.append(threading.current_thread().name),
                                                          real_flush())[-1])
        for _ in range(3):
            assert store.lookup(outcome.key) is not None  # returns although the writer is held
        assert flushes == [] and writer.pending() == 2  # one flush queued for the three lookups
        gate.set()
        assert flush_writes(10)
        assert flushes == ["prescreen-store-writer"]
        entry = store.get(outcome.key)
        assert entry is not None and entry.hits == 4  # three lookups and this get


def test_a_tiered_lookup_copies_a_remote_hit_to_the_local_tier_off_the_lookup(tmp_path: Path) -> None:
    from prescreen.store import TieredStore

    local = HeldStore(tmp_path / "local")
    remote = DiskStore(tmp_path / "remote")
    outcome = lookup_or_decide(make_plan(14), BUDGET, remote)
    tiered = TieredStore(local, remote)
    try:
        got = tiered.lookup(outcome.key)  # returns although the local put is held
        assert got is not None and got.decision == outcome.decision and writer.pending() == 1
        threading.Timer(0.2, local.release.set).start()
    finally:
        tiered.close()  # waits for the copy
    with DiskStore(tmp_path / "local") as again:
        assert again.get(outcome.key) is not None


def test_the_writer_delays_a_write_and_batches_what_comes_meanwhile_unless_a_flush_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued write waits ``WRITE_DELAY_SECONDS`` (the guarded benchmark runs meanwhile); a flush does not wait
    for the delay, and writes queued within it go in one batch."""
    import time

    batches: list[int] = []
    real_take = writer._Queue.take

    def counting_take(self: writer._Queue) -> list[tuple[int, Any]]:
        batch = real_take(self)
        batches.append(len(batch))
        return batch

    flush_writes()
    monkeypatch.setattr(writer, "_queue", writer._Queue())
    monkeypatch.setattr(writer._Queue, "take", counting_take)
    monkeypatch.setattr(writer, "WRITE_DELAY_SECONDS", 60.0)
    with DiskStore(tmp_path / "store") as store:
        start = time.monotonic()
        first = lookup_or_decide(make_plan(1), BUDGET, store, wait=False)
        second = lookup_or_decide(make_plan(2), BUDGET, store, wait=False)
        time.sleep(0.2)
        assert store.get(first.key) is None and writer.pending() == 2  # still waiting out the delay
        assert flush_writes(10) and time.monotonic() - start < 30  # the flush did not wait 60 s
        assert store.get(first.key) is not None and store.get(second.key) is not None
        assert batches == [2]
        monkeypatch.setattr(writer, "WRITE_DELAY_SECONDS", 0.05)
        third = lookup_or_decide(make_plan(3), BUDGET, store, wait=False)
        deadline = time.monotonic() + 10
        while store.get(third.key) is None and time.monotonic() < deadline:  # no flush: made after the delay
            time.sleep(0.02)
        assert store.get(third.key) is not None and batches == [2, 1]


def test_a_callback_that_exits_does_not_stop_the_writer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Even a ``SystemExit`` out of a write's callback is logged: the thread goes on and later writes are made."""

    def leave(_stored: bool) -> None:
        raise SystemExit(3)

    with DiskStore(tmp_path / "store") as store:
        first, second = make_plan(8), make_plan(9)
        first_entry = Entry.new(*build_key(first, BUDGET), first, None, decide(first, BUDGET))
        writer.submit(store, first_entry, leave)
        assert flush_writes(10) and "a queued store write failed" in caplog.text
        thread = writer._queue.thread
        later = lookup_or_decide(second, BUDGET, store, wait=False)
        assert flush_writes(10) and store.get(later.key) is not None and store.get(first_entry.key) is not None
        assert writer._queue.thread is thread and thread is not None and thread.is_alive()
