"""RedisStore and TieredStore against a real redis-server on loopback (skipped without one)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import multiprocessing
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis_server import free_port, redis_server
from test_store_support import BUDGET, entry_fields, make_entry, make_plan, warnings_of

from prescreen.decision import decide
from prescreen.service import COUNTERS, lookup_or_decide
from prescreen.store import DiskStore, RedisStore, TieredStore
from prescreen.store.redis_store import redact_url

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    c = redis.Redis.from_url(redis_url)
    c.flushdb()
    return c


@pytest.fixture
def store(redis_url: str, client: redis.Redis) -> Iterator[RedisStore]:
    with RedisStore(redis_url) as s:
        yield s


def test_round_trip_layout_and_hits(store: RedisStore, client: redis.Redis) -> None:
    entry = make_entry(1)
    assert store.get(entry.key) is None
    assert store.put(entry)
    assert [store.get(entry.key).hits for _ in range(3)] == [1, 2, 3]
    text = client.get(f"prescreen:v1:{{{entry.key}}}")
    assert entry_fields(text)["key"] == entry.key and entry_fields(text)["hits"] == 0  # never rewritten
    assert int(client.get(f"prescreen:v1:{{{entry.key}}}:hits")) == 3
    assert store.get(entry.key).decision == decide(make_plan(1), BUDGET)
    store._use_script = False  # where scripting is refused: GET + INCR
    assert store.get(entry.key).hits == 5
    assert (store.hits, store.misses) == (5, 1)


def test_first_writer_wins_under_threads(store: RedisStore) -> None:
    entry = make_entry(2)
    rivals = [dataclasses.replace(entry, pid=entry.pid + i) for i in range(16)]
    barrier = threading.Barrier(len(rivals))

    def put(e: object) -> bool:
        barrier.wait()
        return store.put(e)

    with concurrent.futures.ThreadPoolExecutor(len(rivals)) as pool:
        outcomes = list(pool.map(put, rivals))
    assert outcomes.count(True) == 1
    assert store.get(entry.key).pid == rivals[outcomes.index(True)].pid


@pytest.mark.parametrize("raw", [b"\x80\x04\x95pickle", b"{not json", b"7"])
def test_invalid_value_is_a_miss_and_replaced(store: RedisStore, client: redis.Redis, raw: bytes, caplog) -> None:
    plan, entry = make_plan(3), make_entry(3)
    client.set(store.entry_key(entry.key), raw)
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        assert store.get(entry.key) is None
        outcome = lookup_or_decide(plan, BUDGET, store)
    assert not outcome.hit and outcome.decision == decide(plan, BUDGET)
    assert len(warnings_of(caplog)) == 1
    assert store.get(entry.key).decision == decide(plan, BUDGET)


def test_entries_delete_clear_and_stats(store: RedisStore, client: redis.Redis) -> None:
    entries = [make_entry(seed) for seed in range(10, 15)]
    for entry in entries:
        store.put(entry)
    client.set(store.entry_key("e" * 64), b"garbage")
    client.set("someone-else:key", b"keep me")
    assert sorted(e.key for e in store.entries()) == sorted(e.key for e in entries)
    stats = store.stats()
    assert (stats.backend, stats.entries, stats.healthy) == ("redis", 6, True)
    assert store.delete([entries[0].key, "f" * 64]) == 1
    assert store.clear_all() == 5
    assert store.keys() == [] and client.get("someone-else:key") == b"keep me"


def _decide_in_a_fresh_process(url: str, local_dir: str) -> dict[str, object]:
    with TieredStore(DiskStore(local_dir), RedisStore(url)) as store:
        outcome = lookup_or_decide(make_plan(77), BUDGET, store)
    return {
        "hit": outcome.hit,
        "estimator_calls": COUNTERS.estimator_calls,
        "stored": COUNTERS.stored,
        "decision": outcome.decision,
    }


def test_two_processes_share_a_decision(redis_url: str, client: redis.Redis, tmp_path: Path) -> None:
    spawn = multiprocessing.get_context("spawn")
    results = []
    for name in ("a", "b"):  # one fresh interpreter each, each with its own empty local cache
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            results.append(pool.submit(_decide_in_a_fresh_process, redis_url, str(tmp_path / name)).result(300))
    a, b = results
    assert (a["hit"], a["estimator_calls"], a["stored"]) == (False, 1, 1)
    assert (b["hit"], b["estimator_calls"], b["stored"]) == (True, 0, 0)
    assert a["decision"] == b["decision"] == decide(make_plan(77), BUDGET)
    with DiskStore(tmp_path / "b") as local_b:  # B's local tier was filled from Redis
        assert local_b.get(make_entry(77).key) is not None


def test_tiered_read_through_and_write_both(redis_url: str, client: redis.Redis, tmp_path: Path) -> None:
    remote = RedisStore(redis_url)
    entry, other = make_entry(20), make_entry(21)
    remote.put(entry)
    with TieredStore(DiskStore(tmp_path / "local"), remote) as tiered:
        assert tiered.get(entry.key) is not None
        assert tiered.local.get(entry.key) is not None
        assert tiered.put(other)
        assert tiered.local.get(other.key) is not None and remote.get(other.key) is not None
        step = [make_entry(22), other, make_entry(23)]  # a step's new entries: one write a tier, each stored once
        assert tiered.put_all(step) == [True, False, True]
        assert all(tier.get(e.key) is not None for tier in (tiered.local, remote) for e in step)
        assert tiered.stats().entries == 4 and tiered.stats().healthy
        assert tiered.delete([entry.key]) == 1
        assert tiered.get(entry.key) is None


class _NoNetwork:
    """Stands in for the redis client during the cooldown: any use fails the test."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"Redis was contacted during the cooldown ({name})")

    def close(self) -> None:
        """Closing the pool sends nothing."""


def test_redis_down(tmp_path: Path, caplog) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        remote = RedisStore(url, cooldown=30)
        entry = make_entry(30)
        assert remote.get(entry.key) is None
        remote._client = _NoNetwork()  # within the cooldown nothing may touch the network
        remote._script = _NoNetwork()
        assert remote.put(entry) is False
        assert remote.get(entry.key) is None and list(remote.entries()) == []
        with TieredStore(DiskStore(tmp_path / "local"), remote) as tiered:
            plan = make_plan(31)
            first = lookup_or_decide(plan, BUDGET, tiered)
            second = lookup_or_decide(plan, BUDGET, tiered)
    assert (first.hit, second.hit) == (False, True)  # the local tier carried on
    assert first.decision == second.decision == decide(plan, BUDGET)
    messages = warnings_of(caplog)
    assert len(messages) == 1 and "unreachable" in messages[0]


def test_password_is_redacted() -> None:
    assert redact_url("redis://user:s3cret@cache.internal:6380/2") == "redis://user:***@cache.internal:6380/2"
    assert redact_url("rediss://:s3cret@h/0") == "rediss://:***@h/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
    assert "s3cret" not in RedisStore("redis://:s3cret@127.0.0.1:1/0").location


# -- bounded: sizes and time ----------------------------------------------------------------------

HUGE = 128 * 2**20


def test_a_huge_value_is_never_read(store: RedisStore, client: redis.Redis) -> None:
    # Before: a put over a 128 MiB value read it whole (1.7 s, 399 MiB) to see whether it was valid.
    entry = make_entry(41)
    client.setrange(store.entry_key(entry.key), HUGE - 1, b"x")  # made by the server: nothing crosses the link
    tracemalloc.start()
    try:
        started = time.monotonic()
        assert store.get(entry.key) is None
        assert store.put(entry)  # the huge value is invalid: replaced
        took = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    assert took < 1.0, took
    got = store.get(entry.key)
    assert got is not None and got.decision == entry.decision


@contextlib.contextmanager
def dripping_proxy(port: int, chunk: int = 64, every: float = 0.25) -> Iterator[int]:
    """A TCP proxy to the redis-server on ``port`` that passes requests on at once and drips each reply back,
    ``chunk`` bytes every ``every`` seconds (a slow, lossy link); yields its own port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def pump(source: socket.socket, sink: socket.socket, drip: bool) -> None:
        try:
            while not stop.is_set():
                data = source.recv(65536)
                if not data:
                    return
                step = chunk if drip else len(data)
                for start in range(0, len(data), step):
                    sink.sendall(data[start : start + step])
                    if drip and stop.wait(every):
                        return
        except OSError:
            return
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def serve() -> None:
        while not stop.is_set():
            try:
                down, _ = listener.accept()
            except TimeoutError:
                continue
            up = socket.create_connection(("127.0.0.1", port))
            threading.Thread(target=pump, args=(down, up, False), daemon=True).start()
            threading.Thread(target=pump, args=(up, down, True), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        server.join(5)
        listener.close()


def test_a_dripping_link_costs_at_most_the_timeout(redis_url: str, client: redis.Redis, tmp_path: Path) -> None:
    # Before: 64 B every 0.25 s never let one read wait the 0.5 s timeout: a lookup took the whole drip (~9 s
    # for a 2.3 KB entry), on the compile's thread.
    plan, entry = make_plan(42), make_entry(42)
    with RedisStore(redis_url) as direct:
        assert direct.put(entry)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with dripping_proxy(port) as slow:
        url = f"redis://127.0.0.1:{slow}/0"
        with RedisStore(url, timeout=0.5) as remote:
            started = time.monotonic()
            assert remote.get(entry.key) is None
            assert time.monotonic() - started < 1.5
        with TieredStore(DiskStore(tmp_path / "local"), RedisStore(url, timeout=0.5)) as tiered:
            started = time.monotonic()
            outcome = lookup_or_decide(plan, BUDGET, tiered)  # decided locally once the deadline passed
            took = time.monotonic() - started
    assert not outcome.hit and outcome.decision == decide(plan, BUDGET)
    assert took < 1.5, took


def test_a_running_replica_serves_a_remote_observed_oom_within_the_recheck(redis_url: str, client: redis.Redis,
                                                                          tmp_path: Path) -> None:
    """Replica B decided ``tune`` (in its local tier and in Redis) and keeps looking the plan up; replica A, with
    a local tier of its own, records an observed OOM for it: B falls back within its recheck (0.5 s here, for
    the tiered store and for the service's memory of a tune), not never."""
    import time

    from test_store_support import fact_child, fact_result

    def tiered(name: str) -> dict[str, object]:
        return {"tiered": [str(tmp_path / name), redis_url], "recheck": 0.5}

    ready = tmp_path / "ready"
    watcher = fact_child({"store": tiered("b"), "seed": 40, "do": "watch", "ready": str(ready),
                          "timeout": 20})
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert watcher.poll() is None and time.monotonic() < deadline, "the watching replica did not start"
        time.sleep(0.05)
    time.sleep(1.0)  # B serves its tune from memory and from its local tier meanwhile
    recorded = fact_result(fact_child({"store": tiered("a"), "seed": 40, "do": "record"}))
    written_at = time.time()
    assert not recorded["held"]
    seen = fact_result(watcher)
    assert seen["observed"] and seen["seen_at"] is not None, seen
    assert seen["seen_at"] - written_at < 5.0, seen  # 2 x 0.5 s, and a loaded machine's delays
    with DiskStore(tmp_path / "b") as local_b:  # the fact replaced B's local tune
        got = local_b.get(make_entry(40).key)
        assert got is not None and got.decision.action == "fallback"
