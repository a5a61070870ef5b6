"""DiskStore: round trip, hit counts, first-writer-wins, invalid values, no pickle, eviction, configuration."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import sqlite3
import threading
from pathlib import Path

import diskcache
import pytest
from test_store_support import BUDGET, entry_fields, entry_text, make_entry, make_plan, warnings_of

from prescreen.decision import decide
from prescreen.errors import ConfigError
from prescreen.service import lookup_or_decide, lookup_or_decide_all, record_observed_oom
from prescreen.store import (
    DiskStore,
    NullStore,
    RedisStore,
    TieredStore,
    default_cache_dir,
    open_store,
    verify_entry,
)
from prescreen.store.disk import HITS_PREFIX


@pytest.fixture
def store(tmp_path: Path):
    with DiskStore(tmp_path / "cache", cooldown=0) as s:
        yield s


def raw_cache(directory: Path) -> diskcache.Cache:
    """The directory opened with plain diskcache (default pickling Disk), as a foreign writer would."""
    return diskcache.Cache(str(directory))


def test_round_trip(store: DiskStore) -> None:
    entry = make_entry(1)
    assert store.put(entry)
    got = store.get(entry.key)
    assert got is not None
    assert got.with_hits(0).to_payload() == entry.to_payload()
    assert got.decision == decide(make_plan(1), BUDGET)
    assert verify_entry(got)


def test_miss_then_hit_through_the_service(store: DiskStore) -> None:
    plan = make_plan(2)
    first = lookup_or_decide(plan, BUDGET, store)
    second = lookup_or_decide(plan, BUDGET, store)
    assert (first.hit, second.hit) == (False, True)
    assert second.decision == first.decision == decide(plan, BUDGET)
    assert (store.hits, store.misses) == (1, 1)


def test_hits_are_counted_beside_the_entry(store: DiskStore) -> None:
    entry = make_entry(3)
    store.put(entry)
    text_before = raw_cache(store.directory).get(entry.key)
    assert [store.get(entry.key).hits for _ in range(3)] == [1, 2, 3]
    store.flush_hits()  # counts are batched; close, stats, entries and exit flush them too
    raw = raw_cache(store.directory)
    assert raw.get(entry.key) == text_before  # the entry text is never rewritten on a hit
    assert entry_fields(text_before)["hits"] == 0
    assert raw.get(HITS_PREFIX + entry.key) == 3
    assert [e.hits for e in store.entries()] == [3]
    assert store.get(entry.key).hits == 4


def test_hit_counts_survive_the_process(tmp_path) -> None:
    import subprocess
    import sys

    first = DiskStore(tmp_path / "c")
    entry = make_entry(5)
    first.put(entry)
    first.close()
    code = ("import sys; from prescreen.store import DiskStore; s = DiskStore(sys.argv[1]); "
            "[s.get(sys.argv[2]) for _ in range(5)]")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c"), entry.key], check=True, timeout=120)
    assert [e.hits for e in DiskStore(tmp_path / "c").entries()] == [5]


@pytest.mark.parametrize("ending", ["collected", "dropped-in-a-function", "alive-at-exit"])
def test_hit_counts_survive_a_store_collected_before_exit(tmp_path: Path, ending: str) -> None:
    # Before the counts lived in a finalizer's buffer, a store collected before exit lost them
    # (the at-exit flush held only a weak reference): ``make demo`` showed hits 1, 1, 1, 0.
    import subprocess
    import sys

    entry = make_entry(5)
    with DiskStore(tmp_path / "c") as first:
        first.put(entry)
    body = {
        "collected": "s = DiskStore(d); [s.get(k) for _ in range(3)]; del s; gc.collect(); gc.collect()",
        "dropped-in-a-function": "def f():\n    s = DiskStore(d); [s.get(k) for _ in range(3)]\nf(); gc.collect()",
        "alive-at-exit": "s = DiskStore(d); [s.get(k) for _ in range(3)]",
    }[ending]
    code = f"import gc, sys\nfrom prescreen.store import DiskStore\nd, k = sys.argv[1], sys.argv[2]\n{body}\n"
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c"), entry.key], check=True, timeout=120)
    with DiskStore(tmp_path / "c") as after:
        assert [e.hits for e in after.entries()] == [3]


def test_hit_counts_survive_collection_in_process(tmp_path: Path) -> None:
    import gc

    entry = make_entry(5)
    store = DiskStore(tmp_path / "c")
    store.put(entry)
    store.get(entry.key)
    del store
    gc.collect()
    with DiskStore(tmp_path / "c") as after:
        assert [e.hits for e in after.entries()] == [1]


def test_a_steps_plans_are_answered_one_by_one_and_written_in_one_put(store: DiskStore,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A guarded step's plans (a fusion step's kernels) get the answers they would get one at a time, and the new
    entries go to the store in one ``put_all``, in order; the plan already stored is a hit, not written again, and
    a kernel met twice in the step (a fused kernel that is one of its parts) is decided and written once."""
    plans = [make_plan(i) for i in (1, 2, 3, 1)]
    lookup_or_decide(plans[1], BUDGET, store)
    written: list[list[str]] = []
    put_all = store.put_all
    monkeypatch.setattr(store, "put_all", lambda entries: written.append([e.key for e in entries]) or put_all(entries))
    outcomes = lookup_or_decide_all(plans, BUDGET, store)
    assert [o.hit for o in outcomes] == [False, True, False, False]
    assert [o.decision for o in outcomes] == [decide(p, BUDGET) for p in plans]
    assert outcomes[3] is outcomes[0]
    assert written == [[outcomes[0].key, outcomes[2].key]]
    assert [lookup_or_decide(p, BUDGET, store).hit for p in plans] == [True, True, True, True]


def test_put_all_writes_every_entry_or_none(store: DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """One transaction: the disk filling up at the third entry leaves the first two unwritten too."""
    entries = [make_entry(i) for i in (1, 2, 3)]
    add, calls = diskcache.Cache.add, []

    def add_until_full(cache: diskcache.Cache, key: str, value: object, *args: object, **kwargs: object) -> bool:
        calls.append(key)
        if len(calls) == 3:
            raise sqlite3.OperationalError("database or disk is full")
        return add(cache, key, value, *args, **kwargs)

    monkeypatch.setattr(diskcache.Cache, "add", add_until_full)
    assert store.put_all(entries) == [False, False, False]
    monkeypatch.undo()
    assert [store.get(e.key) for e in entries] == [None, None, None]
    assert store.put_all(entries) == [True, True, True]
    assert store.put_all(entries[:1]) == [False]  # first writer wins, as for ``put``


def test_first_writer_wins(store: DiskStore) -> None:
    entry = make_entry(4)
    rival = dataclasses.replace(entry, pid=entry.pid + 1)
    assert store.put(entry)
    assert not store.put(rival)
    assert store.get(entry.key).pid == entry.pid


def _tampered_action(entry_json: str) -> str:
    d = entry_fields(entry_json)
    d["decision"]["action"] = "fallback" if d["decision"]["action"] == "tune" else "tune"
    return entry_text(d)


def _other_memory(entry_json: str) -> str:
    """A self-consistent decision for twice the memory (plan 5 is not bounded: still a fallback)."""
    d = entry_fields(entry_json)
    decision = d["decision"]
    assert not decision["bounded"]
    decision["total_memory"] *= 2
    decision["budget_bytes"] = int(decision["total_memory"] * decision["ratio"])
    return entry_text(d)


def _old_schema(entry_json: str) -> str:
    d = entry_fields(entry_json)
    d["schema_version"] = 0
    return entry_text(d)


INVALID_VALUES = {
    "not-json": lambda text, other: "{not json",
    "wrong-key": lambda text, other: other,
    "flipped-action": lambda text, other: _tampered_action(text),
    "decision-for-other-memory": lambda text, other: _other_memory(text),
    "old-schema": lambda text, other: _old_schema(text),
    "pickled-blob": lambda text, other: {"decision": "tune"},  # stored by plain diskcache as a pickle
    "integer": lambda text, other: 7,
}


@pytest.mark.parametrize("kind", sorted(INVALID_VALUES))
def test_invalid_value_is_a_miss_then_replaced(store: DiskStore, kind: str, caplog) -> None:
    plan = make_plan(5)
    entry, other = make_entry(5), make_entry(6)
    raw_cache(store.directory).set(entry.key, INVALID_VALUES[kind](entry.to_json(), other.to_json()))
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        assert store.get(entry.key) is None
        outcome = lookup_or_decide(plan, BUDGET, store)
        assert store.get("0" * 64) is None
    assert not outcome.hit
    assert outcome.decision == decide(plan, BUDGET)
    assert len(warnings_of(caplog)) == 1  # warned once, although read twice
    stored = store.get(entry.key)  # put replaced the invalid value
    assert stored is not None and stored.decision == decide(plan, BUDGET)


class _Boom:
    """Unpickling this creates ``marker``: proof that something unpickled it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_nothing_is_ever_unpickled(store: DiskStore, tmp_path: Path) -> None:
    entry = make_entry(7)
    value_marker, key_marker = tmp_path / "value-unpickled", tmp_path / "key-unpickled"
    raw = raw_cache(store.directory)
    raw.set(entry.key, _Boom(str(value_marker)))
    raw.set(("not", "a", "string", _Boom(str(key_marker))), "x")
    assert pickle.loads(pickle.dumps(_Boom(str(tmp_path / "control")))) is None  # the trap works
    assert (tmp_path / "control").is_dir()
    assert store.get(entry.key) is None
    assert list(store.entries()) == []
    assert store.keys() == [entry.key]
    assert store.stats().entries == 1
    assert store.put(entry)
    assert store.get(entry.key) is not None
    assert not value_marker.exists() and not key_marker.exists()


def test_large_entries_are_text_files(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "c", min_file_size=1024) as store:
        entry = make_entry(8, n_args=6, n_buckets=4)
        assert store.put(entry)
        files = list((tmp_path / "c").rglob("*.val"))
        assert len(files) == 1
        assert entry_fields(files[0].read_text())["key"] == entry.key
        assert store.get(entry.key).decision == entry.decision


def test_eviction_under_a_small_size_limit_keeps_observed_ooms_last(tmp_path: Path) -> None:
    limit = 96 * 1024
    with DiskStore(tmp_path / "c", size_limit=limit) as store:
        fact = record_observed_oom(make_plan(80), BUDGET, store, requested_bytes=2**30, free_bytes=0)  # stored first
        entries = [make_entry(seed) for seed in range(80)]
        for entry in entries:
            assert store.put(entry)
        keys = set(store.keys())
        stats = store.stats()
    assert 0 < len(keys) < len(entries)
    assert entries[0].key not in keys and entries[-1].key in keys  # least recently stored went first
    assert fact.key in keys  # but an observed OOM goes last
    assert stats.size_bytes is not None and stats.size_bytes < 2 * limit


def test_delete_and_clear_all(store: DiskStore) -> None:
    entries = [make_entry(seed) for seed in range(10, 14)]
    for entry in entries:
        store.put(entry)
    store.get(entries[0].key)
    assert store.delete([entries[0].key, entries[1].key, "f" * 64]) == 2
    assert store.get(entries[0].key) is None
    assert HITS_PREFIX + entries[0].key not in raw_cache(store.directory)
    raw_cache(store.directory).set("e" * 64, "{garbage")
    assert store.clear_all() == 3  # two valid entries and the garbage
    assert store.keys() == []


def test_stats(store: DiskStore) -> None:
    entry = make_entry(15)
    store.get(entry.key)
    store.put(entry)
    store.get(entry.key)
    stats = store.stats()
    assert (stats.backend, stats.entries, stats.hits, stats.misses, stats.healthy) == ("disk", 1, 1, 1, True)
    assert stats.size_bytes and stats.size_bytes > 0
    assert stats.location == str(store.directory)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PRESCREEN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "prescreen"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "prescreen"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert default_cache_dir() == tmp_path / "inductor" / "prescreen"
    monkeypatch.setenv("PRESCREEN_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    with DiskStore() as store:
        assert store.directory == tmp_path / "explicit"


@pytest.mark.parametrize("source", ["argument", "PRESCREEN_CACHE_DIR"])
def test_a_relative_directory_is_fixed_at_open(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str) -> None:
    # Before: after os.chdir the next read or write (and any new thread's connection) opened a new, empty
    # store under the new working directory: an acknowledged entry became a miss.
    first, second, third = make_entry(1), make_entry(2), make_entry(3)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    if source == "PRESCREEN_CACHE_DIR":
        monkeypatch.setenv("PRESCREEN_CACHE_DIR", "rel/cache")
    with DiskStore("rel/cache" if source == "argument" else None) as store:
        assert store.put(first)
        monkeypatch.chdir(tmp_path / "elsewhere")
        assert store.get(first.key) is not None
        assert store.put(second)
        seen: list[object] = []
        thread = threading.Thread(target=lambda: seen.extend([store.get(first.key), store.put(third)]))
        thread.start()
        thread.join()
        assert seen[0] is not None and seen[1] is True
        assert store.location == str(tmp_path / "rel" / "cache")
    assert not (tmp_path / "elsewhere" / "rel").exists()
    with DiskStore(tmp_path / "rel" / "cache") as again:
        assert all(again.get(e.key) is not None for e in (first, second, third))


def test_size_limit_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PRESCREEN_CACHE_SIZE_LIMIT", "512MiB")
    with DiskStore(tmp_path / "c") as store:
        assert store.size_limit == 512 * 2**20
        assert store._cache is not None and store._cache.size_limit == 512 * 2**20
    with DiskStore(tmp_path / "c", size_limit="2GiB") as store:
        assert store.size_limit == 2 * 2**30
    monkeypatch.setenv("PRESCREEN_CACHE_SIZE_LIMIT", "lots")
    with pytest.raises(ConfigError, match="PRESCREEN_CACHE_SIZE_LIMIT='lots'"):
        DiskStore(tmp_path / "c")


def test_open_store_selects_the_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PRESCREEN_CACHE", "PRESCREEN_REDIS_URL", "PRESCREEN_REDIS_LOCAL_TIER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRESCREEN_CACHE_DIR", str(tmp_path / "env-dir"))
    store = open_store()
    assert isinstance(store, DiskStore) and store.directory == tmp_path / "env-dir"
    store.close()
    assert open_store(cache_dir=tmp_path / "arg").directory == tmp_path / "arg"

    monkeypatch.setenv("PRESCREEN_REDIS_URL", "redis://127.0.0.1:1/0")
    tiered = open_store(cache_dir=tmp_path / "t")
    assert isinstance(tiered, TieredStore) and isinstance(tiered.remote, RedisStore)
    monkeypatch.setenv("PRESCREEN_REDIS_LOCAL_TIER", "0")
    assert isinstance(open_store(), RedisStore)

    monkeypatch.setenv("PRESCREEN_CACHE", "off")
    off = open_store()
    assert isinstance(off, NullStore)
    entry = make_entry(16)
    assert not off.put(entry) and off.get(entry.key) is None and off.stats().entries == 0

    monkeypatch.setenv("PRESCREEN_CACHE", "sometimes")
    with pytest.raises(ConfigError, match="PRESCREEN_CACHE='sometimes'"):
        open_store()
    monkeypatch.setenv("PRESCREEN_CACHE", "1")
    monkeypatch.setenv("PRESCREEN_REDIS_URL", "http://not-redis")
    with pytest.raises(ConfigError, match="PRESCREEN_REDIS_URL"):
        open_store()


def test_verify_entry_catches_a_consistent_forgery(store: DiskStore) -> None:
    entry = make_entry(17)
    assert verify_entry(entry)
    d = entry.to_payload()
    d["decision"]["reason"] = "forged"
    raw_cache(store.directory).set(entry.key, entry_text(d))
    forged = store.get(entry.key)  # structurally valid: the store cannot tell
    assert forged is not None and not verify_entry(forged)


def test_sqlite_maps_no_part_of_the_database(tmp_path: Path) -> None:
    """Reads go through SQLite's page cache on every connection, a directory diskcache made with its default map too
    (a read through the map costs more right after another connection's commit: ``bench_cold_lookup``)."""
    diskcache.Cache(str(tmp_path)).close()  # made by diskcache itself: it maps 64 MiB
    with DiskStore(tmp_path) as store:
        assert store._cache is not None
        mapped: list[int] = []

        def read_pragma() -> None:  # a thread's own connection reads the directory's Settings
            assert store._cache is not None
            mapped.append(store._cache._con.execute("PRAGMA mmap_size").fetchone()[0])

        read_pragma()
        worker = threading.Thread(target=read_pragma)
        worker.start()
        worker.join()
        assert mapped == [0, 0]
    assert diskcache.Cache(str(tmp_path)).sqlite_mmap_size == 0  # kept in the directory for every later opener
