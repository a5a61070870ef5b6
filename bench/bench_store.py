"""Lookup cost versus recomputing the decision, store latencies and throughput.

Run: ``python bench/bench_store.py``. Prints machine info, then for each plan
size (one-feature plans of 1 and 16 args, a mid plan of 16 args x 81 groups and
a large one of 64 args x 289 groups) p50/p99 latencies of: recomputing the
decision (for the same plan object and for an equal plan object built anew);
a lookup (build the key, read and validate the entry: every lookup reads the
store); and the raw disk/Redis get and put. Ratios recompute/lookup are taken
within the run. Then store reads/s with 1, 2, 4 and 8 processes on one
DiskStore: each process warms up, all start together after a barrier and count
in the same windows of one clock; the median window is reported, per round,
with the load average, and the median over interleaved rounds. Redis is started
on loopback if ``redis-server`` is on PATH (its rows are skipped otherwise).
"""

from __future__ import annotations

import dataclasses
import functools
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
from typing import Any

import redis
import torch

from prescreen.budget import Budget
from prescreen.decision import decide
from prescreen.key import build_key
from prescreen.plan import KernelPlan
from prescreen.service import Outcome, lookup_or_decide
from prescreen.store import DiskStore, RedisStore, Store
from prescreen.store.entry import Entry

BUDGET = Budget("npu", 64 * 2**30, 0.25)
SIZES = {  # (tensor args, buckets per feature, features)
    "1f-1": (1, 4, 1),
    "1f-16": (16, 8, 1),
    "mid": (16, 8, 2),
    "large": (64, 16, 2),
}
ITERATIONS = {
    "1f-1": {"put": 60, "get": 400},
    "1f-16": {"put": 60, "get": 400},
    "mid": {"put": 60, "get": 400},
    "large": {"put": 12, "get": 80},
}
WARM_UP_SECONDS = 0.5
WINDOW_SECONDS = 0.5
WINDOWS = 6
THROUGHPUT_ROUNDS = 3  # each process count measured this many times, interleaved (1, 2, 4, 8, 1, 2, ...)


def plan(seed: int, n_args: int, n_buckets: int, n_features: int = 2) -> KernelPlan:
    """A grouped plan over x0 (primary axis) and r0 (axis; with 2 features), static s0 varying with ``seed``."""
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
    features = [
        {"name": "x", "source": "primary_axis", "axis_names": ["x0"], "buckets": buckets},
        {"name": "r", "source": "axis", "axis_names": ["r0"], "buckets": buckets},
    ][:n_features]
    return KernelPlan.from_payload(
        {
            "kernel_name": f"triton_red_fused_{seed}",
            "group_features": features,
            "axis_names": ["x0", "r0", "s0"],
            "axis_static_values": [["s0", 1 + seed]] + ([["r0", 512]] if n_features == 1 else []),
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


def us(x: float) -> str:
    return f"{x * 1e6:9.1f}"


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


def store_latency(store: Store, entries: list[Entry], gets: int) -> dict[str, list[float]]:
    """Put fresh entries, then hit them, interleaved: ``get`` (with the stored hit count, as ``inspect`` reads),
    ``lookup`` (what a decision reads) and, on disk, the raw SQLite read of the same row
    (``diskcache.Cache.get``: SQLite's own cost, no decoding)."""
    puts = []
    for e in entries:
        start = time.perf_counter()
        assert store.put(e)
        puts.append(time.perf_counter() - start)
    keys = [e.key for e in entries]
    raw = getattr(store, "_cache", None)
    out: dict[str, list[float]] = {"put": puts, "get (hit)": [], "lookup (hit)": []}
    if raw is not None:
        out["raw SQLite read"] = []
    for i in range(gets):
        key = keys[i % len(keys)]
        start = time.perf_counter()
        got = store.get(key)
        mid = time.perf_counter()
        looked = store.lookup(key)
        end = time.perf_counter()
        out["get (hit)"].append(mid - start)
        out["lookup (hit)"].append(end - mid)
        assert got is not None and looked is not None
        if raw is not None:
            start = time.perf_counter()
            text = raw.get(key)
            out["raw SQLite read"].append(time.perf_counter() - start)
            assert text is not None
    return out


def lookups(store: Store, plans: list[KernelPlan], n: int) -> list[float]:
    """Lookups on a warm store: key + read + validate."""
    out = []
    for i in range(n):
        start = time.perf_counter()
        got = lookup_or_decide(plans[i % len(plans)], BUDGET, store)
        out.append(time.perf_counter() - start)
        assert got.hit
    return out


def recomputes(plans: list[KernelPlan], n: int) -> tuple[list[float], list[float]]:
    """``decide`` of the same plan object, and of an equal plan object built anew (outside the timing)."""
    same: list[float] = []
    new: list[float] = []
    for i in range(n):
        q = plans[i % len(plans)]
        same += timed(functools.partial(decide, q, BUDGET), 1)
        new += timed(functools.partial(decide, dataclasses.replace(q), BUDGET), 1)
    return same, new


def _throughput_worker(
    directory: str, seeds: list[int], barrier: Any, start_at: Any, results: Any, control: bool = False
) -> None:
    """Warm up, wait for every worker, then count lookups in each of ``WINDOWS`` windows of one shared clock.

    With ``control``, each "lookup" is a fixed piece of pure-Python work instead (no store, no I/O): how far
    this machine lets CPU-bound processes scale at this moment, to read the store's scaling against.
    """
    plans = [plan(s, *SIZES["mid"]) for s in seeds]
    with DiskStore(directory) as store:
        look = _control_lookup if control else lookup_or_decide
        done = 0
        warm_until = time.monotonic() + WARM_UP_SECONDS  # not counted: imports, first reads, page cache
        while time.monotonic() < warm_until:
            look(plans[done % len(plans)], BUDGET, store)
            done += 1
        barrier.wait()  # the last worker to arrive sets ``start_at`` (the barrier's action)
        edges = [start_at.value + WINDOW_SECONDS * (i + 1) for i in range(WINDOWS)]
        while time.monotonic() < start_at.value:
            pass
        counts = [0] * WINDOWS
        window = 0
        while window < WINDOWS:
            assert look(plans[done % len(plans)], BUDGET, store).hit
            done += 1
            now = time.monotonic()
            while window < WINDOWS and now >= edges[window]:
                window += 1
            if window < WINDOWS:
                counts[window] += 1
    results.put(counts)


_CONTROL = Outcome("", None, True, None)  # type: ignore[arg-type]


def _control_lookup(*_args: object) -> Outcome:
    """The CPU control's stand-in for a lookup: pure-Python work, no store."""
    sum(range(2000))
    return _CONTROL


def _set_start(start_at: Any) -> None:
    start_at.value = time.monotonic() + 0.05  # CLOCK_MONOTONIC: one clock for every process on the machine


def throughput(directory: str, seeds: list[int], procs: int, control: bool = False) -> list[float]:
    """Lookups/s summed over ``procs`` processes, per window (all processes count in the same windows)."""
    ctx = multiprocessing.get_context("fork")
    start_at = ctx.Value("d", 0.0)
    barrier, results = ctx.Barrier(procs, action=lambda: _set_start(start_at)), ctx.Queue()
    workers = [ctx.Process(target=_throughput_worker, args=(directory, seeds, barrier, start_at, results, control))
               for _ in range(procs)]
    for w in workers:
        w.start()
    per_worker = [results.get(timeout=120) for _ in workers]
    for w in workers:
        w.join()
    return [sum(counts[i] for counts in per_worker) / WINDOW_SECONDS for i in range(WINDOWS)]


def redis_version(url: str | None) -> str:
    if url is None:
        return "absent"
    return str(redis.Redis.from_url(url).info("server")["redis_version"])


PROCS = (1, 2, 4, 8)


def main() -> None:
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    with redis_server() as url:
        print("machine:", platform.platform(), f"| cpus {os.cpu_count()}", f"| python {platform.python_version()}")
        print(
            f"versions: torch {torch.__version__} | diskcache {metadata.version('diskcache')}"
            f" | redis-py {metadata.version('redis')} | redis-server {redis_version(url)}"
        )
        with DiskStore(tmp / "warm-up") as scratch:  # the interpreter's first thousands of calls run slower
            lookup_or_decide(plan(0, 2, 2, 1), BUDGET, scratch)
            lookups(scratch, [plan(0, 2, 2, 1)], 200)
        rows = []
        for size, shape in SIZES.items():
            it = ITERATIONS[size]
            n_args, n_buckets, n_features = shape
            p = plan(0, *shape)
            groups = (n_buckets + 1) ** n_features
            keying = timed(functools.partial(build_key, p, BUDGET), it["get"])
            entries = [entry(seed, size) for seed in range(1, it["put"] + 1)]
            plans = [plan(seed, *shape) for seed in range(1, it["put"] + 1)]
            recompute, recompute_new = recomputes(plans, it["get"])
            results: dict[str, list[float]] = {"recompute, same obj": recompute, "recompute, new obj": recompute_new,
                                               "build_key": keying}
            with DiskStore(tmp / f"disk-{size}") as disk:
                results.update({f"disk {op}": v for op, v in store_latency(disk, entries, it["get"]).items()})
                results["lookup, disk"] = lookups(disk, plans, it["get"])
            if url is not None:
                with RedisStore(url, prefix=f"bench:{size}:") as remote:
                    results.update({f"redis {op}": v for op, v in store_latency(remote, entries, it["get"]).items()})
                    results["lookup, redis"] = lookups(remote, plans, it["get"])
            rows.append((size, n_args, groups, len(entries[0].to_json()), results))

        print()
        print(f"{'plan':6} {'args':>4} {'groups':>6} {'json B':>7} {'op':26} {'p50 us':>9} {'p99 us':>9} {'n':>5}")
        for size, n_args, groups, nbytes, results in rows:
            for op, samples in results.items():
                print(
                    f"{size:6} {n_args:4} {groups:6} {nbytes:7} {op:26} {us(pct(samples, 0.5))} "
                    f"{us(pct(samples, 0.99))} {len(samples):5}"
                )
        print()
        ops = ["lookup, disk", "lookup, redis"]
        print("recompute / lookup, p50 (a lookup reads the store; a miss would recompute):")
        print(f"{'plan':6} {'baseline':20} " + " ".join(f"{op:>14}" for op in ops))
        for size, _n_args, _groups, _nbytes, results in rows:
            for baseline in ("recompute, same obj", "recompute, new obj"):
                recompute_p50 = statistics.median(results[baseline])
                cells = [f"{recompute_p50 / statistics.median(results[op]):13.1f}x" if op in results else f"{'-':>14}"
                         for op in ops]
                print(f"{size:6} {baseline:20} " + " ".join(cells))
        print("a lookup against SQLite's own read of the same row (p50; the rest is the key, parsing and validating):")
        for size, _n_args, _groups, _nbytes, results in rows:
            look, raw = statistics.median(results["lookup, disk"]), statistics.median(results["disk raw SQLite read"])
            print(f"  {size:6} lookup {look * 1e6:7.1f} us = {look / raw:5.1f}x the raw read ({raw * 1e6:5.1f} us)")
        if url is None:
            print("redis: redis-server not on PATH; Redis rows skipped")

        print()
        seeds = list(range(1000, 1032))
        directory = str(tmp / "throughput")
        with DiskStore(directory) as disk:
            for s in seeds:
                lookup_or_decide(plan(s, *SIZES["mid"]), BUDGET, disk)
        print(f"throughput: store reads (lookup_or_decide) on one DiskStore,"
              f" mid plans; every process warms up {WARM_UP_SECONDS:g} s, then all count in the same"
              f" {WINDOWS} windows of {WINDOW_SECONDS:g} s (started together after a barrier); rounds interleave the"
              f" process counts; lookups/s is the median window; load average printed before each run")
        rates: dict[tuple[bool, int], list[float]] = {(c, n): [] for c in (False, True) for n in PROCS}
        for round_ in range(THROUGHPUT_ROUNDS):
            for procs in PROCS:
                for control in (False, True):
                    load = os.getloadavg()
                    windows = throughput(directory, seeds, procs, control)
                    rates[control, procs].append(statistics.median(windows))
                    what = "CPU control" if control else "store reads"
                    print(f"  round {round_ + 1}, {procs} process{'es' if procs > 1 else '  '}, {what}: "
                          f"{statistics.median(windows):8.0f}/s (windows {min(windows):.0f} to {max(windows):.0f});"
                          f" load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
        print("  median over rounds (CPU control: the same harness running pure-Python work, no store):")
        base = statistics.median(rates[False, 1])
        control_base = statistics.median(rates[True, 1])
        for procs in PROCS:
            rate = statistics.median(rates[False, procs])
            control_rate = statistics.median(rates[True, procs])
            print(f"  {procs} process{'es' if procs > 1 else '  '}: {rate:9.0f} lookups/s  ({rate / base:4.2f}x of 1);"
                  f"  CPU control {control_rate / control_base:4.2f}x of 1")
        two, eight = statistics.median(rates[False, 2]), statistics.median(rates[False, 8])
        print(f"  goal: 2 processes above 1 ({'met' if two > base else 'NOT met'}),"
              f" 8 not below 1 ({'met' if eight >= base else 'NOT met'})")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nbench took {time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
