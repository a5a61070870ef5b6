"""Hostile numbers, shapes and sizes on every read path: an invalid entry (warn once, miss), never an exception."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from test_store_redis import client, redis_url  # noqa: F401  (fixtures: a redis-server on loopback)
from test_store_support import BUDGET, entry_fields, entry_text, make_entry, make_plan, warnings_of

from prescreen.cli import cli
from prescreen.decision import decide
from prescreen.key import SCHEMA_VERSION
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore, RedisStore, Store, TieredStore, export_bundle, import_bundle
from prescreen.store.bundle import BUNDLE_FORMAT, BUNDLE_VERSION, _Stream
from prescreen.store.disk import HITS_PREFIX
from prescreen.store.entry import MAX_ENTRY_BYTES, Entry

SEED = 3


def _set(path: list[str], number: str) -> Callable[[str], str]:
    """Put ``number`` (raw JSON text: Infinity, NaN, 1e400) at ``path`` in the entry's JSON."""

    def edit(text: str) -> str:
        d = entry_fields(text)
        target = d
        for name in path[:-1]:
            target = target[name]
        target[path[-1]] = "@@NUMBER@@"
        return entry_text(d).replace('"@@NUMBER@@"', number)

    return edit


HOSTILE: dict[str, Callable[[str], str]] = {
    **{
        f"{'.'.join(path)}={number}": _set(path, number)
        for path in (["pid"], ["hits"], ["created_at"], ["parts", "total_memory"])
        for number in ("Infinity", "-Infinity", "NaN", "1e400", "-1", "1e18", "99999999999999999999999")
        if not (path == ["created_at"] and number in ("-1", "1e18"))  # plain numbers there are valid times
    },
    "nested-100000": lambda text: "[" * 100_000 + "]" * 100_000,
    "nested-in-family": lambda text: text.replace('"family":{', '"family":{"x":' + "[" * 5000 + "]" * 5000 + ",", 1),
    "nan-in-family": lambda text: text.replace('"family":{', '"family":{"x":[NaN],', 1),
    "over-the-cap": lambda text: text.replace("}\n", ',"pad":"' + "x" * (MAX_ENTRY_BYTES + 1) + '"}\n', 1),
    "versions-not-strings": lambda text: _set(["parts", "versions"], '{"torch":[1,2]}')(text),
    "top-level-array": lambda text: "[1,2,3]",
}


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(key, hostile text stored under it): the entry of plan SEED, edited."""
    entry = make_entry(SEED)
    return entry.key, HOSTILE[request.param](entry.to_json())


def every_read_path(
    store: Store, key: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """get, lookup_or_decide, entries, stats, export, delete, import: misses, never exceptions; the
    fresh decision then replaces the hostile value."""
    plan = make_plan(SEED)
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        assert store.get(key) is None
        assert list(store.entries()) == []
        store.stats()
        assert export_bundle(store, tmp_path / "out.json") == 0
        assert store.delete([e.key for e in store.entries() if "fused" in e.kernel]) == 0
        outcome = lookup_or_decide(plan, BUDGET, store)
    assert outcome.decision == decide(plan, BUDGET) and not outcome.hit
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)
    got = store.get(key)
    assert got is not None and got.decision == decide(plan, BUDGET)  # the fresh decision replaced the hostile value


def test_disk_store(tmp_path: Path, hostile: tuple[str, str], caplog) -> None:
    key, text = hostile
    with DiskStore(tmp_path / "cache", min_file_size=2**22) as store:
        assert store._cache is not None
        store._cache.set(key, text)  # inline in cache.db, or a .val file when over the inline size
        every_read_path(store, key, caplog, tmp_path)


def test_disk_clear_all_empties_whatever_it_holds(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "cache") as store:
        assert store._cache is not None
        for i, make in enumerate(HOSTILE.values()):
            store._cache.set(f"{i:064x}", make(make_entry(SEED).to_json()))
        store._cache.set(HITS_PREFIX + "0" * 64, "not a number")
        assert store.put(make_entry(1))
        assert store.clear_all() == len(HOSTILE) + 1
        assert store.keys() == [] and len(store._cache) == 0


def test_cli_reads_and_clears_a_hostile_store(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    with DiskStore(directory) as store:
        assert store._cache is not None
        assert store.put(make_entry(1))
        for i, make in enumerate(HOSTILE.values()):
            store._cache.set(f"{i:064x}", make(make_entry(SEED).to_json()))
    env = {"PRESCREEN_REDIS_URL": ""}
    for command in (["inspect"], ["stats"], ["export", str(tmp_path / "b.json")], ["clear", "--kernel", "fused", "--yes"]):
        result = CliRunner().invoke(cli, ["--cache-dir", str(directory), *command], env=env)
        assert result.exit_code == 0, (command, result.output)
    result = CliRunner().invoke(cli, ["--cache-dir", str(directory), "clear", "--all", "--yes"], env=env)
    assert result.exit_code == 0 and f"{len(HOSTILE)} entries removed" in result.output, result.output
    with DiskStore(directory) as store:
        assert store.keys() == []


def test_disk_bad_hit_counter_does_not_turn_the_store_off(tmp_path: Path, caplog) -> None:
    entry, other = make_entry(1), make_entry(2)
    with DiskStore(tmp_path / "cache") as store:  # the default 30 s cooldown: a fault would pause the store
        assert store.put(entry) and store._cache is not None
        store._cache.set(HITS_PREFIX + entry.key, "not a number")
        with caplog.at_level(logging.WARNING, logger="prescreen.store"):
            got = store.get(entry.key)
            assert got is not None and got.hits == 1
            store.flush_hits()
            assert store.put(other)  # writes still work
            assert store.get(other.key) is not None
            assert store.stats().healthy
        assert [m for m in warnings_of(caplog) if "hit counter" in m]
    with DiskStore(tmp_path / "cache") as store:
        assert store._stored_hits(entry.key) == 1  # the bad counter restarted from this process's hit


HUGE = 128 * 2**20


def test_disk_huge_inline_value_is_refused_before_it_is_read(tmp_path: Path, caplog) -> None:
    # Before: the 128 MiB row (and its 128 MiB counter) came into Python whole, then the 4 MiB cap refused it.
    entry, plan, directory = make_entry(SEED), make_plan(SEED), tmp_path / "cache"
    with DiskStore(directory) as store:
        assert store.put(entry) and store._cache is not None
        store._cache.set(HITS_PREFIX + entry.key, 5)
    con = sqlite3.connect(directory / "cache.db")
    with con:  # what a hostile writer can do: inline rows far over the cap
        for key in (entry.key, HITS_PREFIX + entry.key):
            con.execute("UPDATE Cache SET value = CAST(zeroblob(?) AS TEXT) WHERE key = ?", (HUGE, key))
    con.close()
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger="prescreen.store"), DiskStore(directory) as store:
            assert store.get(entry.key) is None
            assert list(store.entries()) == []
            assert lookup_or_decide(plan, BUDGET, store).decision == decide(plan, BUDGET)  # and replaced it
            got = store.get(entry.key)
            assert got is not None and got.decision == decide(plan, BUDGET)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    assert any(f"over {MAX_ENTRY_BYTES} bytes" in m for m in warnings_of(caplog)), warnings_of(caplog)


def test_disk_value_file_that_is_a_fifo_is_a_miss(tmp_path: Path, caplog) -> None:
    # Before: the lookup's open() of the FIFO waited for a writer forever, on the compile's thread.
    entry, plan, directory = make_entry(SEED, n_args=14), make_plan(SEED, n_args=14), tmp_path / "cache"
    with DiskStore(directory, min_file_size=1000) as store:
        assert store.put(entry)
    (value,) = directory.glob("[0-9a-f][0-9a-f]/*/*.val")
    value.unlink()
    os.mkfifo(value, 0o600)
    seen: list[object] = []

    def lookups() -> None:
        with DiskStore(directory, min_file_size=1000) as store:
            seen.append(store.get(entry.key))
            seen.append(lookup_or_decide(plan, BUDGET, store).decision)
            seen.append(store.get(entry.key))

    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        thread = threading.Thread(target=lookups, daemon=True)
        thread.start()
        thread.join(30)
        if thread.is_alive():
            os.close(os.open(value, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked open, then fail
            thread.join(10)
            pytest.fail("a lookup blocked on a FIFO in place of a value file")
    first, decision, after = seen
    assert first is None and decision == decide(plan, BUDGET)
    assert isinstance(after, Entry) and after.decision == decision  # the FIFO's row was replaced
    assert any("not a regular file" in m and "FIFO" in m for m in warnings_of(caplog)), warnings_of(caplog)


# -- Redis ------------------------------------------------------------------------


def test_redis_store(redis_url: str, client: redis.Redis, hostile: tuple[str, str], caplog, tmp_path: Path) -> None:  # noqa: F811
    key, text = hostile
    with RedisStore(redis_url) as store:
        client.set(store.entry_key(key), text)
        every_read_path(store, key, caplog, tmp_path)


@pytest.mark.parametrize("counter", [b"abc", b"1e400", b"inf", b"-5", b"99999999999999999999999"])
def test_redis_bad_hit_counter_is_reset_not_fatal(redis_url: str, client: redis.Redis, counter: bytes, caplog) -> None:  # noqa: F811
    entry = make_entry(1)
    with RedisStore(redis_url) as store, caplog.at_level(logging.WARNING, logger="prescreen.store"):
        assert store.put(entry)
        client.set(store.hits_key(entry.key), counter)
        got = store.get(entry.key)
        assert got is not None and got.decision == entry.decision
        assert [e.key for e in store.entries()] == [entry.key]
        again = store.get(entry.key)
        assert again is not None and again.hits >= 1
        assert store.stats().healthy


def test_redis_value_of_another_type(redis_url: str, client: redis.Redis, caplog, tmp_path: Path) -> None:  # noqa: F811
    key = make_entry(SEED).key
    with RedisStore(redis_url) as store:
        client.hset(store.entry_key(key), "a", "b")
        client.hset(store.hits_key(key), "a", "b")
        with caplog.at_level(logging.WARNING, logger="prescreen.store"):
            assert store.get(key) is None
            assert list(store.entries()) == []
        assert store.clear_all() == 1 and client.dbsize() == 0


def test_tiered_store(redis_url: str, client: redis.Redis, hostile: tuple[str, str], tmp_path: Path) -> None:  # noqa: F811
    key, text = hostile
    with TieredStore(DiskStore(tmp_path / "cache"), RedisStore(redis_url)) as store:
        assert isinstance(store.remote, RedisStore) and isinstance(store.local, DiskStore)
        client.set(store.remote.entry_key(key), text)
        assert store.local._cache is not None
        store.local._cache.set(key, text)
        plan = make_plan(SEED)
        assert store.get(key) is None
        assert lookup_or_decide(plan, BUDGET, store).decision == decide(plan, BUDGET)
        assert store.clear_all() == 1


# -- bundles ----------------------------------------------------------------------


def bundle_item(text: str) -> str:
    """A stored entry text (maybe hostile) as a bundle's entry: one JSON object, the details line's fields in its
    decision, the plan line as its plan field.

    The head and record lines are kept as they are (raw numbers such as ``Infinity`` stay); a text without four
    lines is used whole.
    """
    lines = text.split("\n")
    if len(lines) != 4 or not lines[0].endswith("}"):
        return text
    head, details, record, plan = lines
    if details.startswith("{") and details.endswith("}") and details != "{}":
        head = head.replace('"decision":{', '"decision":{' + details[1:-1] + ",", 1)
    if record.startswith("{") and record.endswith("}") and record != "{}":
        head = head[:-1] + "," + record[1:]
    return head[:-1] + ',"plan":' + json.dumps(plan) + "}"


def bundle_text(entries: list[str]) -> str:
    header = {"format": BUNDLE_FORMAT, "bundle_version": BUNDLE_VERSION, "schema_version": SCHEMA_VERSION}
    head = json.dumps({**header, "created_at": "now"})[:-1]
    return head + ',"entries":[' + ",".join(bundle_item(e) for e in entries) + "]}"


UNREADABLE = ["nested-100000", "nested-in-family", "over-the-cap"]  # no entry boundary to skip to: refused whole


def test_import_skips_hostile_entries_in_one_summary_line(tmp_path: Path, caplog) -> None:
    good = [make_entry(seed).to_json() for seed in range(3)]
    bad = [make(make_entry(SEED).to_json()) for name, make in HOSTILE.items() if name not in UNREADABLE]
    path = tmp_path / "b.json"
    path.write_text(bundle_text([good[0], *bad, good[1], good[2]]))
    with DiskStore(tmp_path / "cache") as store, caplog.at_level(logging.WARNING, logger="prescreen.store"):
        assert import_bundle(store, path) == (3, len(bad))
    messages = warnings_of(caplog)
    assert len(messages) == 1 and f"skipped {len(bad)} invalid entries" in messages[0], messages


@pytest.mark.parametrize("name", UNREADABLE)
def test_import_refuses_a_bundle_with_an_unreadable_value(tmp_path: Path, name: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(bundle_text([make_entry(1).to_json(), HOSTILE[name](make_entry(SEED).to_json())]))
    with DiskStore(tmp_path / "cache") as store:
        with pytest.raises(ValueError, match="nested too deeply|longer than"):
            import_bundle(store, path)
        assert store.keys() == []  # refused before anything was stored


def test_bundle_streams_in_bounded_memory(tmp_path: Path) -> None:
    entry = make_entry(1).to_json()
    path = tmp_path / "big.json"
    count = 16 * 2**20 // len(entry)  # 16 MiB of entries
    with path.open("w") as out:
        out.write(bundle_text([])[:-2])
        out.write(",".join([bundle_item(entry)] * count))
        out.write("]}")
    stream = _Stream(path, str(path))
    tracemalloc.start()
    try:
        seen = 0
        for name, member in stream.members():
            if name == "entries":
                seen += sum(1 for _ in member.items("entry"))
            else:
                member.value(100, name)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stream.close()
    assert seen == count
    assert peak < 8 * 2**20, peak  # a read chunk and one entry (about 5 MiB), not the 16 MiB file
