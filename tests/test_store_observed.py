"""Whether a disk store may hold an observed-OOM entry (``prescreen.store.observed``): the marker, the scan."""

from __future__ import annotations

import os
from pathlib import Path

import diskcache
import pytest
from test_store_support import BUDGET, make_entry, make_plan

from prescreen.service import record_observed_oom
from prescreen.store import DiskStore, NullStore, observed
from prescreen.store.entry import Entry

PENDING_NAME = "recovery.pending"  # prescreen.store.recovery.PENDING_NAME


def observed_entry(seed: int) -> Entry:
    entry = record_observed_oom(make_plan(seed), BUDGET, None, requested_bytes=1, free_bytes=2).entry
    assert entry is not None
    return entry


def marked(directory: Path) -> bool:
    return (directory / observed.MARKER).exists()


def test_a_store_without_observed_ooms_says_so(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        assert store.observed_oom_free()
        assert store.put(make_entry(1))  # a computed decision: no marker
        assert store.observed_oom_free() and not marked(tmp_path)


def test_a_put_makes_the_marker_before_the_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with DiskStore(tmp_path) as store:
        assert store.observed_oom_free()
        assert store._cache is not None
        seen: list[bool] = []
        add = store._cache.add
        monkeypatch.setattr(store._cache, "add", lambda *a, **k: seen.append(marked(tmp_path)) or add(*a, **k))
        assert "marker" not in store.stats().detail
        assert store.put(observed_entry(1))
        assert seen == [True]
        assert not store.observed_oom_free()
        assert "observed-oom marker present" in store.stats().detail  # what ``prescreen stats`` shows
    assert (tmp_path / observed.MARKER).stat().st_mode & 0o777 == 0o600


def test_another_process_s_fact_is_seen_by_a_store_that_scanned_clean(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as mine, DiskStore(tmp_path) as theirs:
        assert mine.observed_oom_free()
        assert theirs.put(observed_entry(1))
        assert not mine.observed_oom_free()


@pytest.mark.parametrize("where", ["text row", "bytes row", "value file"])
def test_the_scan_finds_a_fact_written_without_the_marker(tmp_path: Path, where: str) -> None:
    """An older prescreen, or a ``cache.db`` copied in: no marker, so the scan at the first question."""
    entry = observed_entry(1)
    text = entry.to_json()
    with DiskStore(tmp_path, min_file_size=1 if where == "value file" else 2**15) as writer:
        assert writer._cache is not None
        if where == "bytes row":
            with diskcache.Cache(str(tmp_path)) as plain:  # as a plain diskcache writes bytes: a blob
                plain.set(entry.key, text.encode())
        else:
            writer._cache.set(entry.key, text)
    assert not marked(tmp_path)
    with DiskStore(tmp_path) as store:
        assert store.lookup(entry.key) is not None  # what the scan must not miss: a lookup serves it
        assert not store.observed_oom_free()


def test_the_scan_skips_what_no_lookup_serves(tmp_path: Path) -> None:
    """Hit counters, rows whose value file is gone: a lookup serves none of them as a fact."""
    entry = observed_entry(1)
    with DiskStore(tmp_path, min_file_size=1) as writer:
        assert writer._cache is not None
        writer._cache.set(entry.key, entry.to_json())
        writer._cache.set("hits:" + entry.key, 3)
    for path in tmp_path.glob("[0-9a-f][0-9a-f]/*/*.val"):
        path.unlink()  # a delete killed half-way
    with DiskStore(tmp_path) as store:
        assert store.observed_oom_free()


def test_a_new_database_file_is_scanned_again(tmp_path: Path) -> None:
    """The scan holds for the database it read: after a reopen onto another file, it is made again."""
    entry = observed_entry(1)
    with DiskStore(tmp_path) as store:
        assert store.observed_oom_free()
        assert store._cache is not None
        store._cache.set(entry.key, entry.to_json())  # no marker
        assert store.observed_oom_free()  # scanned already: this is what the marker is for
        store._db_id = (0, 0)  # what a reopen onto a recovered database gives
        assert not store.observed_oom_free()


def test_a_recovery_that_restores_a_fact_makes_the_marker(tmp_path: Path) -> None:
    entry = observed_entry(1)
    with DiskStore(tmp_path) as old:
        assert old._cache is not None
        old._cache.set(entry.key, entry.to_json())  # written without the marker
    for suffix in ("-wal", "-shm", ""):  # what a recovery started by another process left
        if (tmp_path / f"cache.db{suffix}").exists():
            os.replace(tmp_path / f"cache.db{suffix}", tmp_path / f"cache.db.corrupt-1-1{suffix}")
    (tmp_path / PENDING_NAME).write_text("")
    with DiskStore(tmp_path) as store:  # finishes the recovery
        assert store.get(entry.key) is not None
    assert marked(tmp_path)


def test_only_the_disk_store_can_say_it_holds_none() -> None:
    assert not NullStore().observed_oom_free()


def test_a_marker_that_cannot_be_made_does_not_stop_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    def refuse(path: object) -> None:
        raise PermissionError(13, "read-only", str(path))

    monkeypatch.setattr(observed, "create_private_file", refuse)
    entry = observed_entry(1)
    with DiskStore(tmp_path) as store:
        assert store.put(entry) and store.get(entry.key) is not None
    assert any("observed-oom marker" in r.getMessage() for r in caplog.records)
    with DiskStore(tmp_path) as later:
        assert not later.observed_oom_free()  # the next process's scan finds the entry


def test_a_plain_diskcache_directory_with_no_prescreen_entries_is_clean(tmp_path: Path) -> None:
    diskcache.Cache(str(tmp_path)).close()
    with DiskStore(tmp_path) as store:
        assert store.observed_oom_free()


def test_the_scan_can_run_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``install()`` queues it on the writer: until it is done every step is looked up; then it is not made again."""
    from prescreen.store import writer

    scans: list[object] = []
    real = observed.scan
    monkeypatch.setattr(observed, "scan", lambda cache, directory: scans.append(directory) or real(cache, directory))
    with DiskStore(tmp_path) as store:
        store._oom_scan_queued = True  # as right after ``start_observed_oom_scan``
        assert not store.observed_oom_free() and scans == []
        store._oom_scan_queued = False
        store.start_observed_oom_scan()
        assert writer.flush(store, 10)
        assert store.observed_oom_free() and store.observed_oom_free()
        assert scans == [tmp_path]


@pytest.mark.parametrize("min_file_size", [2**15, 1])  # in the row, in a value file
def test_only_a_values_start_is_scanned(tmp_path: Path, min_file_size: int) -> None:
    """A servable fact's reason is in its first few hundred bytes; the bytes past ``HEAD_BYTES`` are not read."""
    late = make_entry(1).to_json() + " " * observed.HEAD_BYTES + observed.NEEDLE  # not a reason: no lookup serves it
    with DiskStore(tmp_path, min_file_size=min_file_size) as store:
        assert store._cache is not None
        store._cache.set("a" * 64, late)
        assert store.observed_oom_free()
    with DiskStore(tmp_path, min_file_size=min_file_size) as store:
        assert store._cache is not None
        store._cache.set("b" * 64, observed.NEEDLE + late)
        assert not store.observed_oom_free()


def test_the_hooks_store_is_scanned_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store the hooks open from the environment starts its scan on the writer: not inside a compile."""
    from prescreen.hooks import state
    from prescreen.store import writer

    monkeypatch.setenv("PRESCREEN_CACHE_DIR", str(tmp_path))
    state.reset()
    try:
        store = state.get_store()
        assert isinstance(store, DiskStore)
        assert writer.flush(store, 10)
        assert store._oom_scanned is not None and store._oom_scanned[1]  # scanned there, clean
    finally:
        state.reset()
