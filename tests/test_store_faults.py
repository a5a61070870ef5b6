"""Store faults: corrupt, locked, read-only, unopenable and full caches mean warn, miss, compute; never raise."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_store_support import BUDGET, fact_child, make_entry, make_plan, warnings_of

from prescreen import service
from prescreen.decision import decide, is_observed_oom
from prescreen.plan import KernelPlan
from prescreen.service import Outcome, lookup_or_decide, record_observed_oom
from prescreen.store import DiskStore
from prescreen.store.entry import Entry
from prescreen.store.recovery import LOCK_NAME, recovery_lock

HANG_GUARD_S = 30.0  # not a latency check: only catches a store that blocks a compile indefinitely


def n_args_of(seed: int) -> int:
    """Odd seeds make large plans (about 8 KB of JSON), even ones small plans (about 4 KB)."""
    return 14 if seed % 2 else 2


def entry_of(seed: int) -> Entry:
    return make_entry(seed, n_args=n_args_of(seed))


def plan_of(seed: int) -> KernelPlan:
    return make_plan(seed, n_args=n_args_of(seed))


def correct_or_miss(store: DiskStore, seeds: range) -> int:
    """Every get is a miss or exactly the fresh decision; returns the number of hits."""
    hits = 0
    for seed in seeds:
        got = store.get(entry_of(seed).key)
        if got is not None:
            assert got.decision == decide(plan_of(seed), BUDGET)
            hits += 1
    return hits


def lookups_are_correct(store: DiskStore, seeds: range) -> None:
    for seed in seeds:
        plan = plan_of(seed)
        assert lookup_or_decide(plan, BUDGET, store).decision == decide(plan, BUDGET)


def moved_aside(directory: Path) -> list[Path]:
    """The corrupt databases recovery moved aside (and salvaged), without their -wal/-shm companions."""
    return [p for p in directory.glob("cache.db.salvaged-*") if not p.name.endswith(("-wal", "-shm"))]


def run_guarded(fn: Callable[[], object]) -> object:
    """Run ``fn`` in a thread; fail if it is still running after the hang guard."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "store call blocked (a compile would hang)"
    return result[0]


# -- corrupt ------------------------------------------------------------------


def fill(directory: Path, seeds: range, **kw: object) -> None:
    with DiskStore(directory, **kw) as store:
        for seed in seeds:
            assert store.put(entry_of(seed))


def test_corrupt_database_is_moved_aside_and_file_entries_restored(tmp_path: Path, caplog) -> None:
    directory, neighbour = tmp_path / "cache", tmp_path / "neighbour"
    fill(directory, range(6), min_file_size=4000)  # odd seeds are large: .val text files
    fill(neighbour, range(3))
    (directory / "notes.txt").write_text("not ours")
    with open(directory / "cache.db", "r+b") as db:
        db.write(os.urandom(8192))
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        store = DiskStore(directory, min_file_size=4000)
        for seed in range(6):
            got = store.get(entry_of(seed).key)
            if seed % 2:
                assert got is not None and got.decision == decide(plan_of(seed), BUDGET)
            else:
                assert got is None  # it lived in the destroyed file
        lookups_are_correct(store, range(6))
    messages = warnings_of(caplog)
    assert len(messages) == 1 and "corrupt" in messages[0] and "restored 3 valid entries" in messages[0]
    assert len(moved_aside(directory)) == 1
    assert store.stats().healthy and "recovered 3 entries" in store.stats().detail
    assert (directory / "notes.txt").read_text() == "not ours"
    with DiskStore(neighbour) as other:
        assert correct_or_miss(other, range(3)) == 3
    store.close()


@pytest.mark.parametrize("offset", [4096, 12288, 20480])
def test_garbage_inside_the_database(tmp_path: Path, offset: int, caplog) -> None:
    directory = tmp_path / "cache"
    fill(directory, range(12))
    with open(directory / "cache.db", "r+b") as db:
        db.seek(offset)
        db.write(os.urandom(4096))
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        with DiskStore(directory, cooldown=0) as store:
            correct_or_miss(store, range(12))
            lookups_are_correct(store, range(12, 16))
            entry = entry_of(99)
            store.put(entry)
            assert store.get(entry.key) is not None
            correct_or_miss(store, range(16))


def _open_corrupt_and_put(directory: str, seed: int, barrier: object) -> None:
    barrier.wait()
    with DiskStore(directory) as store:
        assert store.put(entry_of(seed))


@pytest.mark.parametrize("round_", range(6))
def test_concurrent_recovery_keeps_every_process_entry(tmp_path: Path, round_: int) -> None:
    # Before openers held recovery.lock shared, about one round in 40 lost a process's put to a
    # "disk I/O error": it opened cache.db while another process renamed it and its -wal/-shm aside.
    directory = tmp_path / "cache"
    fill(directory, range(2))
    (directory / "cache.db").write_bytes(os.urandom(16384))
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open_corrupt_and_put, args=(str(directory), 100 + i, barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    with DiskStore(directory) as store:
        assert correct_or_miss(store, range(100, 104)) == 4  # no process moved a fresh database aside
    assert len(moved_aside(directory)) == 1


def test_open_waits_for_a_short_recovery(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    fill(directory, range(2))
    opened = threading.Event()

    def open_store() -> None:
        DiskStore(directory, timeout=HANG_GUARD_S).close()  # a timeout longer than the recovery below
        opened.set()

    with recovery_lock(directory):  # as a recovering process holds it
        thread = threading.Thread(target=open_store, daemon=True)
        thread.start()
        assert not opened.wait(0.3)
    assert opened.wait(HANG_GUARD_S)
    thread.join()


def test_a_held_recovery_lock_delays_opens_and_writes_by_the_timeout_only(tmp_path: Path, caplog) -> None:
    # Before: every open waited timeout + 10 s, silently, for a lock any user could hold (the file was 0644).
    directory = tmp_path / "cache"
    fill(directory, range(2))
    os.chmod(directory / LOCK_NAME, 0o644)  # as an older prescreen left it
    with recovery_lock(directory), caplog.at_level(logging.WARNING, logger="prescreen.store"):
        store = run_guarded(lambda: DiskStore(directory, timeout=0.1))
        assert isinstance(store, DiskStore)
        assert correct_or_miss(store, range(2)) == 2
        assert run_guarded(lambda: store.put(entry_of(7))) is False  # not acknowledged: it did not happen
        messages = warnings_of(caplog)
        store.close()
    assert len(messages) == 1 and "recovery.lock is held by another process" in messages[0], messages
    assert stat.S_IMODE((directory / LOCK_NAME).stat().st_mode) == 0o600


def test_exclusive_lock_times_out_with_a_clear_error(tmp_path: Path) -> None:
    with recovery_lock(tmp_path, shared=True):  # flock conflicts between open files, so within a process too
        assert (tmp_path / LOCK_NAME).exists()
        with pytest.raises(TimeoutError, match="recovery.lock held for over 0.05 s"):
            with recovery_lock(tmp_path, wait=0.05):
                pass


# -- locked -------------------------------------------------------------------


def test_writer_lock_held_by_another_process(tmp_path: Path, caplog) -> None:
    directory = tmp_path / "cache"
    fill(directory, range(3))
    store = DiskStore(directory, cooldown=0, write_wait=0.5)  # each skipped write waits this long
    holder = sqlite3.connect(directory / "cache.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with caplog.at_level(logging.WARNING, logger="prescreen.store"):
            assert run_guarded(lambda: correct_or_miss(store, range(3))) == 3  # WAL readers still read
            assert run_guarded(lambda: store.put(entry_of(50))) is False
            run_guarded(lambda: lookups_are_correct(store, range(50, 53)))
        messages = warnings_of(caplog)
        assert len(messages) == 1 and "locked" in messages[0]
        assert not store.stats().healthy
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.put(entry_of(51)) and store.get(entry_of(51).key) is not None
    store.close()


def test_database_locked_exclusively_before_open(tmp_path: Path, caplog) -> None:
    directory = tmp_path / "cache"
    fill(directory, range(2))
    holder = sqlite3.connect(directory / "cache.db", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE Settings SET value = value WHERE key = 'count'")
    try:
        with caplog.at_level(logging.WARNING, logger="prescreen.store"):
            store = run_guarded(lambda: DiskStore(directory, cooldown=0))
            assert run_guarded(lambda: store.get(entry_of(0).key)) is None
            assert run_guarded(lambda: store.put(entry_of(60))) is False
            run_guarded(lambda: lookups_are_correct(store, range(2)))
        messages = warnings_of(caplog)
        assert len(messages) == 1 and "locked" in messages[0]
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert store.get(entry_of(0).key) is not None  # reopened once the lock was gone
    assert store.put(entry_of(60))
    store.close()


# -- an observed OOM through a locked database ------------------------------------------------------------

HOLD_LOCK = ("import sqlite3, sys, time\n"
             "con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
             "con.execute('BEGIN EXCLUSIVE')\n"
             "print('locked', flush=True)\n"
             "time.sleep(float(sys.argv[2]))\n"
             "con.execute('ROLLBACK')\n")


def hold_write_lock(database: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process holding ``database``'s write lock for ``seconds`` (returns once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(database), str(seconds)], text=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


@pytest.fixture
def no_held_facts() -> Iterator[None]:
    """Whatever a test leaves in this process's table of facts not yet written is dropped after it."""
    yield
    service._held.clear()


FACT_SEED = 72  # a plan that tunes


def test_an_observed_oom_is_written_through_a_briefly_locked_database(tmp_path: Path, no_held_facts: None) -> None:
    """Another connection holds the write lock for 0.8 s: the fact is written once it is released, before
    ``record_observed_oom`` returns, and no write is paused for it."""
    directory = tmp_path / "cache"
    fill(directory, range(2))
    with DiskStore(directory) as store:
        plan = plan_of(FACT_SEED)
        assert lookup_or_decide(plan, BUDGET, store).decision.tune  # a computed tune under the key
        holder = hold_write_lock(directory / "cache.db", 0.8)
        try:
            fact = run_guarded(lambda: record_observed_oom(plan, BUDGET, store, requested_bytes=1, free_bytes=2))
        finally:
            holder.wait(30)
        assert isinstance(fact, Outcome)
        assert store.put(entry_of(FACT_SEED + 2))  # writes go on
    with DiskStore(directory) as again:  # another opener reads the fact
        got = again.get(fact.key)
        assert got is not None and is_observed_oom(got.decision)
    assert fact.key not in service._held


def test_a_fact_that_cannot_be_written_is_kept_in_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_held_facts: None
) -> None:
    """The lock is held longer than the fact's wait: the process keeps the fact (every lookup of its key falls
    back, its memory dropped or not), says so once, and writes it at a lookup once the lock is gone."""
    monkeypatch.setattr(service, "FACT_WAIT_SECONDS", 0.3, raising=False)
    directory = tmp_path / "cache"
    fill(directory, range(2))
    store = DiskStore(directory, write_wait=0.2)
    holder = hold_write_lock(directory / "cache.db", 60)
    try:
        with caplog.at_level(logging.WARNING, logger="prescreen"):
            facts = [record_observed_oom(plan_of(seed), BUDGET, store, requested_bytes=1, free_bytes=2)
                     for seed in (FACT_SEED, FACT_SEED + 2)]
        for _ in range(2):
            outcome = lookup_or_decide(plan_of(FACT_SEED), BUDGET, store)
            assert is_observed_oom(outcome.decision) and outcome.decision == facts[0].decision
        said = [r.getMessage() for r in caplog.records if "could not write an observed out-of-memory" in r.getMessage()]
        assert len(said) == 1, said
        assert [f.key in service._held for f in facts] == [True, True]
    finally:
        holder.kill()
        holder.wait(30)
    monkeypatch.setattr(service, "_retry_at", 0.0)  # the next try is due
    lookup_or_decide(plan_of(1), BUDGET, store)  # any lookup tries the held facts again
    assert not service._held
    for fact in facts:
        got = store.get(fact.key)
        assert got is not None and is_observed_oom(got.decision)
    store.close()


def test_a_fact_kept_in_the_process_is_written_at_exit(tmp_path: Path) -> None:
    """A process that could not write its fact (the lock held throughout) writes it when it exits normally,
    though it closed its store meanwhile."""
    directory = tmp_path / "cache"
    fill(directory, range(2))
    gate = tmp_path / "exit"
    holder = hold_write_lock(directory / "cache.db", 60)
    try:
        child = fact_child({"store": {"disk": str(directory), "write_wait": 0.2}, "seed": FACT_SEED, "do": "record",
                            "fact_wait": 0.3, "close": True, "exit_after": str(gate)})
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("RESULT ") and json.loads(line[len("RESULT "):])["held"], line
    finally:
        holder.kill()
        holder.wait(30)
    gate.touch()
    _out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    with DiskStore(directory) as store:
        got = store.get(entry_of(FACT_SEED).key)
        assert got is not None and is_observed_oom(got.decision), err


# -- read-only, unopenable, full -------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount tmpfs filesystems of a given size (root only); skip where mounting is not permitted."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"mnt{len(mounts)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip() or 'mount failed'})")
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        subprocess.run(["umount", "-l", str(point)], check=False)


def make_read_only(point: Path) -> None:
    """Remount ``point`` read-only (as a deployment image's filesystem is)."""
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
    with pytest.raises(OSError):
        (point / "probe").write_text("x")


def test_read_only_image_serves_reads(tmpfs: Callable[[str], Path], caplog) -> None:
    point = tmpfs("8m")
    fill(point / "cache", range(6), min_file_size=4000)
    make_read_only(point)
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        with DiskStore(point / "cache") as store:
            assert correct_or_miss(store, range(6)) == 6
            assert store.put(entry_of(70)) is False
            lookups_are_correct(store, range(4, 10))
            assert len(list(store.entries())) == 6
            stats = store.stats()
    assert not stats.healthy and "read-only" in stats.detail
    messages = warnings_of(caplog)
    assert len(messages) == 1 and "read-only" in messages[0]


def test_read_only_filesystem_without_a_cache(tmpfs: Callable[[str], Path], caplog) -> None:
    point = tmpfs("1m")
    make_read_only(point)
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        with DiskStore(point / "cache", cooldown=0) as store:
            lookups_are_correct(store, range(3))
            assert store.put(entry_of(0)) is False and not store.stats().healthy
    assert len(warnings_of(caplog)) == 1


def test_directory_that_cannot_be_created_is_a_noop(tmp_path: Path, caplog) -> None:
    (tmp_path / "a-file").write_text("x")
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        with DiskStore(tmp_path / "a-file" / "cache", cooldown=0) as store:
            for _ in range(3):
                lookups_are_correct(store, range(2))
                assert store.put(entry_of(0)) is False
            assert list(store.entries()) == [] and store.delete([entry_of(0).key]) == 0
            stats = store.stats()
    assert not stats.healthy and stats.entries == 0 and "unavailable" in stats.detail
    messages = warnings_of(caplog)
    assert len(messages) == 1 and "cannot be opened" in messages[0]


def test_full_filesystem(tmpfs: Callable[[str], Path], caplog) -> None:
    point = tmpfs("512k")
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        with DiskStore(point / "cache", cooldown=0) as store:
            results = [store.put(entry_of(seed)) for seed in range(120)]
            assert True in results and False in results  # it filled up
            hits = correct_or_miss(store, range(120))
            lookups_are_correct(store, range(120, 125))
    assert 0 < hits < 120
    assert any("full" in m for m in warnings_of(caplog))


def test_tiny_size_limit(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "cache", size_limit=1) as store:
        for seed in range(40):
            store.put(entry_of(seed))
        lookups_are_correct(store, range(40))
        correct_or_miss(store, range(40))
        assert len(store.keys()) <= 10
        assert store.stats().size_bytes < 256 * 1024
