"""A store hit as a compile meets it: with the CPU caches cold, not in a tight loop.

Inside a compile, prescreen's lookups are a few calls between long stretches of
Inductor's own work, so their code and data are no longer in the CPU caches.
On the H200 host a hit took 0.26 to 0.48 ms there, against about 50 us for the
same kind of plan in ``bench_store``'s loop. This bench reproduces that on any
machine: before each timed call it evicts the caches (it touches 64 MiB, runs a
matmul and some unrelated Python), then times one call. Every row is timed both
ways in the same run, interleaved, and the ratio is printed.

Plans: a runtime-autotuning step's (one cloned argument, the L2-flush buffer and
the slack, all concrete) and ``bench_store``'s mid plan (16 args x 81 groups).
Rows: the whole first lookup of the plan in the process (``lookup_or_decide``,
memos emptied, the store warm), and its pieces: the key, the store read and the
entry's decode; then diskcache's own ``Cache.get`` against the read prescreen
makes (``FastOpenCache.get_text``), the head line a hit parses now against
the whole entry's fields, and one row's read right after another connection
committed (as the background writer does between a compile's lookups), of a
row that connection has not read before (as a compile's new keys are), with
SQLite's memory map on (diskcache's 64 MiB) and off (prescreen's store).

Run: ``python bench/bench_cold_lookup.py [--samples 300]``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diskcache.core import DBNAME, DEFAULT_SETTINGS

from prescreen.budget import Budget
from prescreen.expr import Const
from prescreen.key import build_key, forget_plan_hashes
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.service import forget, lookup_or_decide
from prescreen.store import DiskStore
from prescreen.store.disk import SQLITE_MMAP_SIZE
from prescreen.store.entry import Entry, parse_json
from prescreen.store.textdisk import SELECT_VALUE

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_store  # noqa: E402 - the mid plan, as bench_store builds it

CUDA = Budget("cuda", 140 * 2**30, 0.9)
DISKCACHE_MMAP = int(DEFAULT_SETTINGS["sqlite_mmap_size"])
_SCRATCH = np.ones(64 * 2**20 // 8)


def evict() -> None:
    """Push prescreen's code and data out of the CPU caches, as a compile's own work does between two lookups."""
    _SCRATCH[::512] += 1.0
    float(_SCRATCH.sum())
    x = torch.randn(384, 384)
    float((x @ x).sum())
    sum(len(repr(i)) for i in range(4000))


def runtime_plan(i: int) -> KernelPlan:
    """A runtime-autotuning step's plan (``plan_for_autotuner``): one clone, the flush buffer, the slack."""
    clone = TensorArg(name="clone:in_out_ptr0", source="buffer", size=(Const(2**28 + i),), stride=(Const(1),),
                      dtype="torch.float32", device="cuda:0")
    return KernelPlan(group_features=(), axis_names=(), axis_static_values=(), args=(
        clone, WorkspaceArg("benchmark.cache_flush", Const(60 * 2**20), "torch.uint8", "cuda:0", "NONE"),
        WorkspaceArg("benchmark.slack", Const(2**21), "torch.uint8", "cuda:0", "NONE"),
    ), kernel_name="autotune:triton_poi_fused_add_copy__mul_0")


def timed(call: Callable[[int], Any], prepare: Callable[[int], Any], samples: int) -> dict[str, float]:
    """Median microseconds of ``call(prepare(i))``: hot (right after the last) and cold (after ``evict``),
    interleaved sample by sample."""
    out: dict[str, list[float]] = {"hot": [], "cold": []}
    for i in range(samples):
        for mode in ("hot", "cold"):
            arg = prepare(i)
            if mode == "cold":
                evict()
            start = time.perf_counter()
            call(arg)
            out[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(values) * 1e6 for mode, values in out.items()}


def measure(store: DiskStore, plans: list[KernelPlan], budget: Budget, n: int) -> list[tuple[str, dict[str, float]]]:
    """The rows for one kind of plan (64 of them, their decisions stored first)."""
    for p in plans:
        lookup_or_decide(p, budget, store)
    keys = [build_key(p, budget)[0] for p in plans]
    texts = [str(store._read(k)) for k in keys]
    heads = [t.partition("\n")[0] for t in texts]
    every = [json.dumps(Entry.from_json(t, k).to_payload(), sort_keys=True, separators=(",", ":"))
             for t, k in zip(texts, keys)]
    assert store._cache is not None
    cache = store._cache

    def fresh(i: int) -> KernelPlan:
        """Plan i % 64 with nothing remembered of it: a first lookup."""
        forget_plan_hashes()
        forget(store)
        return plans[i % 64]

    def known(i: int) -> int:
        """Index i % 64, the key's parts known to the process (a read and a decode follow the key step)."""
        forget_plan_hashes()
        build_key(plans[i % 64], budget)
        return i % 64

    # Rows no connection has read yet (as a compile's new keys are), one per sample and reader: the rows a
    # read after a commit takes are each read once.
    names = {size: [f"bench.fresh.{size}.{i}" for i in range(2 * n)] for size in (DISKCACHE_MMAP, SQLITE_MMAP_SIZE)}
    with cache.transact():
        for name in (name for listed in names.values() for name in listed):
            cache.set(name, texts[0])
    fresh_keys = {size: iter(listed) for size, listed in names.items()}
    writer_con = sqlite3.connect(str(store.directory / DBNAME), isolation_level=None)
    readers = {size: sqlite3.connect(str(store.directory / DBNAME), isolation_level=None) for size in fresh_keys}
    for size, con in readers.items():
        con.execute(f"PRAGMA mmap_size={size}")

    def committed(i: int) -> None:
        """Another connection commits (as the background writer does between two lookups)."""
        writer_con.execute("INSERT OR REPLACE INTO Settings VALUES ('bench.commit', ?)", (i,))

    def read_with(size: int) -> Callable[[None], object]:
        return lambda _: readers[size].execute(SELECT_VALUE, (next(fresh_keys[size]), time.time())).fetchone()

    return [
        ("first lookup (key + read + decode + service)", timed(lambda p: lookup_or_decide(p, budget, store), fresh, n)),
        ("  key (canonical text, 3 sha256)", timed(lambda p: build_key(p, budget), fresh, n)),
        ("  store read (get_text)", timed(lambda i: cache.get_text(keys[i]), known, n)),
        ("  decode (head line, lazy)", timed(lambda i: Entry.from_json(texts[i], keys[i], lazy=True), known, n)),
        ("diskcache Cache.get (same row)", timed(lambda i: cache.get(keys[i]), known, n)),
        ("parse the head line (what a hit parses)", timed(lambda i: parse_json(heads[i]), lambda i: i % 64, n)),
        ("parse every field but the plan", timed(lambda i: parse_json(every[i]), lambda i: i % 64, n)),
        ("new row after a commit, SQLite mmap 64 MiB", timed(read_with(DISKCACHE_MMAP), committed, n)),
        ("new row after a commit, mmap off (prescreen)", timed(read_with(SQLITE_MMAP_SIZE), committed, n)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}; median of {args.samples} samples per row, "
          "hot and cold interleaved; cold = after evicting the CPU caches (64 MiB touched, a matmul, unrelated Python)")
    cases = {
        "runtime step": ([runtime_plan(i) for i in range(64)], CUDA),
        "mid": ([bench_store.plan(i, *bench_store.SIZES["mid"]) for i in range(64)], bench_store.BUDGET),
    }
    rows: dict[str, list[tuple[str, dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as directory, DiskStore(directory) as store:
        for case, (plans, budget) in cases.items():
            rows[case] = measure(store, plans, budget, args.samples)
    print(f"\n{'plan':13} {'what':48} {'hot us':>8} {'cold us':>8} {'cold/hot':>9}")
    for case, found in rows.items():
        for what, t in found:
            print(f"{case:13} {what:48} {t['hot']:8.1f} {t['cold']:8.1f} {t['cold'] / t['hot']:8.1f}x")
    for case, found in rows.items():
        by = {what.strip(): t for what, t in found}
        get, mine = by["diskcache Cache.get (same row)"], by["store read (get_text)"]
        head, every = by["parse the head line (what a hit parses)"], by["parse every field but the plan"]
        mapped = by["new row after a commit, SQLite mmap 64 MiB"]
        unmapped = by["new row after a commit, mmap off (prescreen)"]
        print(f"{case}: diskcache get / get_text = {get['hot'] / mine['hot']:.2f}x hot, "
              f"{get['cold'] / mine['cold']:.2f}x cold; every field / the head line = "
              f"{every['hot'] / head['hot']:.2f}x hot, {every['cold'] / head['cold']:.2f}x cold; "
              f"after a commit, mmap on / off = {mapped['hot'] / unmapped['hot']:.2f}x hot, "
              f"{mapped['cold'] / unmapped['cold']:.2f}x cold")


if __name__ == "__main__":
    main()
