"""Store latency and throughput: get (hit) and put on DiskStore and RedisStore versus recomputing the decision.

Run: ``python bench/bench_store.py``. Prints machine info, p50/p99 latencies
for a mid-size plan (16 args, 2 features x 8 buckets) and a large one
(64 args, 2 features x 16 buckets), the recompute/hit ratios, and lookups/s
with 1, 2, 4 and 8 processes on one DiskStore. Redis is started on loopback
if ``redis-server`` is on PATH (its column is skipped otherwise).
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import redis
import torch

from prescreen.budget import Budget
from prescreen.decision import decide
from prescreen.key import build_key
from prescreen.plan import KernelPlan
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore, RedisStore, Store
from prescreen.store.entry import Entry

BUDGET = Budget("npu", 64 * 2**30, 0.25)
SIZES = {"mid": (16, 8), "large": (64, 16)}  # (tensor args, buckets per feature)
ITERATIONS = {"mid": {"decide": 40, "put": 60, "get": 400}, "large": {"decide": 8, "put": 12, "get": 80}}
THROUGHPUT_SECONDS = 2.0


def plan(seed: int, n_args: int, n_buckets: int) -> KernelPlan:
    """A grouped plan over x0 (primary axis) and r0 (axis), static s0 varying with ``seed``."""
    x, r, s = {"axis_name": "x0"}, {"axis_name": "r0"}, {"axis_name": "s0"}
    buckets = [2 ** (4 + i) for i in range(n_buckets)]
    args = [
        {
            "kind": "tensor",
            "source": "buffer",
            "name": f"in_ptr{i}",
            "dtype": ("torch.float16", "torch.float32", "torch.bfloat16")[i % 3],
            "device": "npu:0",
            "size_exprs": [x, r, s],
            "stride_exprs": [{"mul": [r, s]}, s, 1],
        }
        for i in range(n_args)
    ]
    return KernelPlan.from_payload(
        {
            "kernel_name": f"triton_red_fused_{seed}",
            "group_features": [
                {"name": "x", "source": "primary_axis", "axis_names": ["x0"], "buckets": buckets},
                {"name": "r", "source": "axis", "axis_names": ["r0"], "buckets": buckets},
            ],
            "axis_names": ["x0", "r0", "s0"],
            "axis_static_values": [["s0", 1 + seed]],
            "ordered_arg_specs": args,
            "mutated_arg_names": ["in_ptr0"],
        }
    )


def entry(seed: int, size: str) -> Entry:
    out = lookup_or_decide(plan(seed, *SIZES[size]), BUDGET, None)
    assert out.entry is not None
    return out.entry


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1e3:9.3f}"


@contextmanager
def redis_server() -> Iterator[str | None]:
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def store_latency(store: Store, entries: list[Entry], gets: int) -> tuple[list[float], list[float]]:
    """(put samples, get-hit samples) for fresh entries, then repeated hits on them."""
    puts = []
    for e in entries:
        start = time.perf_counter()
        assert store.put(e)
        puts.append(time.perf_counter() - start)
    keys = [e.key for e in entries]
    hits = []
    for i in range(gets):
        key = keys[i % len(keys)]
        start = time.perf_counter()
        got = store.get(key)
        hits.append(time.perf_counter() - start)
        assert got is not None
    return puts, hits


def _throughput_worker(directory: str, seeds: list[int], barrier: object, results: object) -> None:
    plans = [plan(s, *SIZES["mid"]) for s in seeds]
    with DiskStore(directory) as store:
        barrier.wait()
        deadline = time.perf_counter() + THROUGHPUT_SECONDS
        done = 0
        while time.perf_counter() < deadline:
            assert lookup_or_decide(plans[done % len(plans)], BUDGET, store).hit
            done += 1
    results.put(done)


def throughput(directory: str, seeds: list[int], procs: int) -> float:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_throughput_worker, args=(directory, seeds, barrier, results)) for _ in range(procs)]
    for w in workers:
        w.start()
    total = sum(results.get(timeout=120) for _ in workers)
    for w in workers:
        w.join()
    return total / THROUGHPUT_SECONDS


def redis_version(url: str | None) -> str:
    if url is None:
        return "absent"
    return str(redis.Redis.from_url(url).info("server")["redis_version"])


def main() -> None:
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    with redis_server() as url:
        print("machine:", platform.platform(), f"| cpus {os.cpu_count()}", f"| python {platform.python_version()}")
        print(
            f"versions: torch {torch.__version__} | diskcache {metadata.version('diskcache')}"
            f" | redis-py {metadata.version('redis')} | redis-server {redis_version(url)}"
        )
        rows = []
        for size, (n_args, n_buckets) in SIZES.items():
            it = ITERATIONS[size]
            p = plan(0, n_args, n_buckets)
            groups = (n_buckets + 1) ** 2
            recompute = timed(lambda p=p: decide(p, BUDGET), it["decide"])
            keying = timed(lambda p=p: build_key(p, BUDGET), it["get"])
            entries = [entry(seed, size) for seed in range(1, it["put"] + 1)]
            results = {"recompute": (recompute, None), "key": (keying, None)}
            with DiskStore(tmp / f"disk-{size}") as disk:
                results["disk"] = store_latency(disk, entries, it["get"])
            if url is not None:
                with RedisStore(url, prefix=f"bench:{size}:") as remote:
                    results["redis"] = store_latency(remote, entries, it["get"])
            rows.append((size, n_args, groups, len(entries[0].to_json()), results))

        print()
        print(f"{'plan':6} {'args':>4} {'groups':>6} {'json B':>7} {'op':22} {'p50 ms':>9} {'p99 ms':>9} {'n':>4}")
        for size, n_args, groups, nbytes, results in rows:
            lines = [("recompute (decide)", results["recompute"][0]), ("build_key", results["key"][0])]
            for backend in ("disk", "redis"):
                if backend in results:
                    puts, hits = results[backend]
                    lines += [(f"{backend} put", puts), (f"{backend} get (hit)", hits)]
            for op, samples in lines:
                print(
                    f"{size:6} {n_args:4} {groups:6} {nbytes:7} {op:22} {ms(pct(samples, 0.5))} "
                    f"{ms(pct(samples, 0.99))} {len(samples):4}"
                )
            recompute_p50 = statistics.median(results["recompute"][0])
            for backend in ("disk", "redis"):
                if backend in results:
                    hit_p50 = statistics.median(results[backend][1])
                    print(f"{size:6} ratio recompute / {backend} hit (p50): {recompute_p50 / hit_p50:8.1f}x")
        if url is None:
            print("redis: redis-server not on PATH; Redis column skipped")

        print()
        seeds = list(range(1000, 1032))
        directory = str(tmp / "throughput")
        with DiskStore(directory) as disk:
            for s in seeds:
                lookup_or_decide(plan(s, *SIZES["mid"]), BUDGET, disk)
        print(f"throughput: lookup_or_decide hits on one DiskStore, mid plans, {THROUGHPUT_SECONDS:g} s each")
        base = None
        for procs in (1, 2, 4, 8):
            rate = throughput(directory, seeds, procs)
            base = base or rate
            print(f"  {procs} process{'es' if procs > 1 else '  '}: {rate:9.0f} lookups/s  ({rate / base:4.2f}x of 1)")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nbench took {time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
