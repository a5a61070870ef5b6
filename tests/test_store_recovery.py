"""Recovery without loss: a moved database is followed, every readable row is salvaged, a killed recovery is
finished by the next open, and rows whose value file is gone are misses that get cleaned."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest
from test_store_support import BUDGET, make_entry, make_plan

from prescreen.decision import decide
from prescreen.service import lookup_or_decide, record_observed_oom
from prescreen.store import DiskStore
from prescreen.store.entry import Entry

PENDING_NAME = "recovery.pending"  # prescreen.store.recovery.PENDING_NAME


def val_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("[0-9a-f][0-9a-f]/*/*.val"))


def referenced(directory: Path) -> set[str]:
    con = sqlite3.connect(directory / "cache.db")
    try:
        return {f for (f,) in con.execute("SELECT filename FROM Cache WHERE filename IS NOT NULL")}
    finally:
        con.close()


# -- (a) a database moved aside under an open store ------------------------------------------


def test_writes_follow_a_database_moved_aside(tmp_path: Path) -> None:
    # Before: 200 of 200 puts returned True into the moved-aside file and none were in the live database.
    directory = tmp_path / "cache"
    entries = [make_entry(seed) for seed in range(200)]
    with DiskStore(directory) as writer:
        assert writer.put(entries[0])
        for suffix in ("-wal", "-shm", ""):  # what another process's recovery does
            if (directory / f"cache.db{suffix}").exists():
                os.replace(directory / f"cache.db{suffix}", directory / f"cache.db.corrupt-1-1{suffix}")
        with DiskStore(directory) as other:  # the other process starts afresh
            assert other.put(entries[1])
        acknowledged = [e for e in entries[2:] if writer.put(e)]
    assert len(acknowledged) == 198
    with DiskStore(directory) as after:
        present = {e.key for e in acknowledged} & set(after.keys())
    assert len(present) == len(acknowledged)


# -- (b) salvage every readable row ---------------------------------------------------------


def _damage_page_holding(db: Path, marker: bytes) -> None:
    data = bytearray(db.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    at = data.index(marker)
    page = at // page_size
    assert page > 0
    data[page * page_size : (page + 1) * page_size] = os.urandom(page_size)
    db.write_bytes(bytes(data))


def _readable_by_rowid(db: Path) -> int:
    """How many valid-looking rows SQLite still reads one rowid at a time (what a salvage can get)."""
    con = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True)
    count = 0
    try:
        for rowid in range(1, 400):
            try:
                row = con.execute("SELECT value FROM Cache WHERE rowid = ? AND raw = 1", (rowid,)).fetchone()
            except sqlite3.DatabaseError:
                continue
            count += row is not None and isinstance(row[0], str) and row[0].startswith("{")
    finally:
        con.close()
    return count


def test_salvage_reads_past_a_bad_page(tmp_path: Path) -> None:
    # Before: salvage stopped at the first unreadable page (30 of 299 readable rows restored).
    directory = tmp_path / "cache"
    entries = [make_entry(seed) for seed in range(120)]
    with DiskStore(directory) as store:
        for entry in entries:
            assert store.put(entry)
    _damage_page_holding(directory / "cache.db", entries[30].kernel.encode() + b'"')
    readable = _readable_by_rowid(directory / "cache.db")
    assert 100 <= readable < 120
    with DiskStore(directory) as store:
        for entry in entries:  # the damage is found by the read that meets it, and recovered from then
            store.get(entry.key)
        assert store.recovered is not None
        assert store.recovered[1] == readable
        assert sum(store.get(e.key) is not None for e in entries) == readable


def _garble_rowid(db: Path, marker: bytes) -> None:
    """Rewrite the rowid of the table row holding ``marker`` to the largest its varint's length holds (as a
    flipped bit can): no lookup by rowid finds that row, and "the next rowid after" the one before it is
    the garbled one, past every later row."""
    data = bytearray(db.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    at = -1
    while True:
        at = data.index(marker, at + 1)
        base = at // page_size * page_size
        if base > 0 and data[base] == 0x0D:  # a table leaf page
            break
    cells = int.from_bytes(data[base + 3 : base + 5], "big")
    starts = [base + int.from_bytes(data[base + 8 + 2 * i : base + 10 + 2 * i], "big") for i in range(cells)]
    pos = max(start for start in starts if start <= at)  # the cell the marker is in
    while data[pos] & 0x80:  # its payload size
        pos += 1
    first = pos = pos + 1
    while data[pos] & 0x80:  # its rowid
        pos += 1
    data[first : pos + 1] = b"\xff" * (pos - first) + b"\x7f"
    db.write_bytes(bytes(data))


def _marker(entry: Entry) -> bytes:
    return entry.kernel.encode() + b'"'


@pytest.mark.parametrize("garbled", [150, 243])
def test_salvage_restores_every_row_readable_by_rowid(tmp_path: Path, garbled: int) -> None:
    # Before: 150 and 243 of 300 restored though 298 rows read by rowid: the walk took the garbled rowid as
    # the next one and ended past it.
    directory = tmp_path / "cache"
    entries = [make_entry(seed) for seed in range(300)]
    with DiskStore(directory) as store:
        for entry in entries:
            assert store.put(entry)
    _garble_rowid(directory / "cache.db", _marker(entries[garbled]))
    _damage_page_holding(directory / "cache.db", _marker(entries[60]))  # what a read finds: a recovery
    readable = _readable_by_rowid(directory / "cache.db")
    assert readable == 298
    with DiskStore(directory) as store:
        for entry in entries:
            store.get(entry.key)
        assert store.recovered is not None and store.recovered[1] == readable
        assert sum(store.get(e.key) is not None for e in entries) == readable


def test_salvage_never_loads_a_huge_value(tmp_path: Path) -> None:
    # Before: salvage read each row's value whole: a 128 MiB row came into Python before the cap refused it.
    directory = tmp_path / "cache"
    entries = [make_entry(seed) for seed in range(40)]
    with DiskStore(directory) as store:
        for entry in entries:
            assert store.put(entry)
    con = sqlite3.connect(directory / "cache.db")
    with con:
        con.execute("UPDATE Cache SET value = CAST(zeroblob(?) AS TEXT) WHERE key = ?", (128 * 2**20, entries[5].key))
    con.close()
    _damage_page_holding(directory / "cache.db", _marker(entries[30]))
    tracemalloc.start()
    try:
        with DiskStore(directory) as store:
            store.get(entries[30].key)  # meets the destroyed page: a recovery
            assert store.recovered is not None and store.recovered[1] == 38  # all but the huge and the destroyed
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak


def test_a_restored_observed_oom_is_still_evicted_last(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    entries = [make_entry(seed) for seed in range(40)]
    with DiskStore(directory) as store:
        fact = record_observed_oom(make_plan(99), BUDGET, store, requested_bytes=2**30, free_bytes=0)
        for entry in entries:
            assert store.put(entry)
    _damage_page_holding(directory / "cache.db", _marker(entries[30]))
    with DiskStore(directory, size_limit=96 * 1024) as store:
        store.get(entries[30].key)  # meets the destroyed page: the fact is restored first, the oldest row
        assert store.recovered is not None
        for seed in range(100, 180):
            assert store.put(make_entry(seed))
        keys = set(store.keys())
    assert entries[0].key not in keys and fact.key in keys


_LIVE_WRITER = """
import sys
sys.path.insert(0, sys.argv[2])
from test_store_support import make_entry
from prescreen.store import DiskStore
store = DiskStore(sys.argv[1])
for phase in (0, 1):
    acknowledged = sum(store.put(make_entry(1000 + 100 * phase + i)) for i in range(100))
    print(acknowledged, flush=True)
    sys.stdin.readline()
store.close()
"""


def test_a_live_writers_entries_survive_a_recovery(tmp_path: Path) -> None:
    # Before: 0 of the 100 entries a live process wrote before another one recovered were kept (its rows came
    # after the garbled rowid); the 100 it wrote after the recovery went to the fresh database.
    directory = tmp_path / "cache"
    old = [make_entry(seed) for seed in range(200)]
    with DiskStore(directory) as store:  # closed: these rows are in cache.db itself, not in a -wal
        for entry in old:
            assert store.put(entry)
    writer = subprocess.Popen(
        [sys.executable, "-c", _LIVE_WRITER, str(directory), str(Path(__file__).parent)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        assert writer.stdout.readline().strip() == "100"  # acknowledged, and the writer's store still open
        con = sqlite3.connect(directory / "cache.db")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # into cache.db, as SQLite's auto-checkpoint does
        con.close()
        _garble_rowid(directory / "cache.db", _marker(old[150]))  # rowid 151: a two-byte varint, now 16383
        _damage_page_holding(directory / "cache.db", _marker(old[60]))
        with DiskStore(directory) as recovering:  # this process finds the damage and recovers
            for entry in old:
                recovering.get(entry.key)
            assert recovering.recovered is not None
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "100"  # written after the recovery
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.wait(60) == 0
    finally:
        writer.kill()
    with DiskStore(directory) as store:
        survived = [sum(store.get(make_entry(1000 + 100 * phase + i).key) is not None for i in range(100))
                    for phase in (0, 1)]
    assert survived == [100, 100]


# -- (c) a recovery killed half-way is finished by the next open -------------------------------

_KILL_AFTER = """
import os, sys
from prescreen.store import DiskStore, recovery
point, after = sys.argv[2], int(sys.argv[3])
calls = [0]
def dying(original):
    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            os._exit(9)  # as SIGKILL: no cleanup of any kind
        return original(*args, **kwargs)
    return wrapped
if point == "restore":
    recovery._restore = dying(recovery._restore)
else:
    recovery.os.replace = dying(os.replace)
DiskStore(sys.argv[1])
"""


def _corrupt_with_files(directory: Path) -> list[Entry]:
    """40 entries stored, the database destroyed: the entries in .val files (over 4000 bytes) are restorable."""
    entries = [make_entry(seed, n_args=14) for seed in range(40)]
    with DiskStore(directory, min_file_size=4000) as store:
        for entry in entries:
            assert store.put(entry)
    (directory / "cache.db").write_bytes(os.urandom(16384))
    restorable = [e for e in entries if len(e.to_json()) >= 4000]
    assert len(restorable) >= 30
    return restorable


def _kill_during_recovery(directory: Path, point: str, after: int) -> None:
    done = subprocess.run([sys.executable, "-c", _KILL_AFTER, str(directory), point, str(after)], timeout=120)
    assert done.returncode == 9


def test_recovery_killed_while_restoring_is_finished_by_the_next_open(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    entries = _corrupt_with_files(directory)
    _kill_during_recovery(directory, "restore", 7)
    assert (directory / PENDING_NAME).exists()
    _kill_during_recovery(directory, "restore", 3)  # killed again, earlier: nothing is lost either
    with DiskStore(directory, min_file_size=4000) as store:
        assert sum(store.get(e.key) is not None for e in entries) == len(entries)
    assert not (directory / PENDING_NAME).exists()
    assert {str(p.relative_to(directory)) for p in val_files(directory)} == referenced(directory)  # no orphans


def test_recovery_killed_while_moving_files_is_finished_by_the_next_open(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    entries = _corrupt_with_files(directory)
    (directory / "cache.db-wal").write_bytes(b"")
    _kill_during_recovery(directory, "move", 1)  # -wal moved, cache.db not yet
    assert (directory / "cache.db").exists() and (directory / PENDING_NAME).exists()
    with DiskStore(directory, min_file_size=4000) as store:
        assert sum(store.get(e.key) is not None for e in entries) == len(entries)
    salvaged = [p.name for p in directory.glob("cache.db.salvaged-*")]
    assert len({name.removesuffix("-wal").removesuffix("-shm") for name in salvaged}) == 1  # one name, resumed


def test_a_fifo_planted_as_recovery_pending_does_not_hang_a_recovery(tmp_path: Path) -> None:
    # Before: reading the pending recovery's name opened the FIFO and waited for a writer forever.
    directory = tmp_path / "cache"
    entries = _corrupt_with_files(directory)
    os.mkfifo(directory / PENDING_NAME, 0o600)
    found: list[int] = []

    def recover() -> None:
        with DiskStore(directory, min_file_size=4000) as store:
            found.append(sum(store.get(e.key) is not None for e in entries))

    thread = threading.Thread(target=recover, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        os.close(os.open(directory / PENDING_NAME, os.O_WRONLY | os.O_NONBLOCK))  # release it, then fail
        thread.join(10)
        pytest.fail("a recovery blocked on a FIFO in place of recovery.pending")
    assert found == [len(entries)]
    assert not (directory / PENDING_NAME).exists()


def test_recovery_is_idempotent(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    entries = _corrupt_with_files(directory)
    for _ in range(2):
        with DiskStore(directory, min_file_size=4000) as store:
            assert sum(store.get(e.key) is not None for e in entries) == len(entries)
            assert len(store.keys()) == len(entries)
    assert {str(p.relative_to(directory)) for p in val_files(directory)} == referenced(directory)


# -- (e) rows whose value file is gone ----------------------------------------------------------


def test_rows_without_their_value_file_are_misses_and_cleaned(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    entries = [make_entry(seed, n_args=14) for seed in range(6)]
    with DiskStore(directory, min_file_size=4000) as store:
        for entry in entries:
            assert store.put(entry)
        gone = val_files(directory)[:3]  # as a delete killed between its file and its commit leaves them
        for path in gone:
            path.unlink()
        assert store.stats().entries == 3  # not counted
        assert len(list(store.entries())) == 3  # not listed, and cleaned
        con = sqlite3.connect(directory / "cache.db")
        (rows,) = con.execute("SELECT count(*) FROM Cache WHERE filename IS NOT NULL").fetchone()
        con.close()
        assert rows == 3
        for seed in range(len(entries)):  # each a hit or a fresh, correct decision
            plan = make_plan(seed, n_args=14)
            assert lookup_or_decide(plan, BUDGET, store).decision == decide(plan, BUDGET)
        assert store.stats().entries == 6


def test_clear_all_removes_orphaned_value_files(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    with DiskStore(directory, min_file_size=4000) as store:
        assert store.put(make_entry(1, n_args=14))
        orphan = directory / "ab" / "cd" / ("0" * 28 + ".val")  # as a put killed before its row commits leaves
        orphan.parent.mkdir(parents=True)
        orphan.write_text("{}")
        assert store.clear_all() == 1
    assert val_files(directory) == []
