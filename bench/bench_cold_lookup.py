"""A store hit as a compile meets it: with the CPU caches cold, not in a tight loop, and SQLite's memory map.

Inside a compile, prescreen's lookups are a few calls between long stretches of
Inductor's own work, so their code and data are no longer in the CPU caches.
This bench evicts the caches before each timed call (it touches 64 MiB, runs a
matmul and some unrelated Python), then times one call; every row is timed hot
and cold, interleaved. Plans: a runtime-autotuning step's (one cloned argument,
the L2-flush buffer and the slack, all concrete) and ``bench_store``'s mid plan
(16 args x 81 groups). Rows: a lookup (``lookup_or_decide``, the store warm)
and its pieces (the key, the store's read, the entry's decode); then one row's
read right after another connection committed, of a row that connection has
not read before (as a compile's new keys are), with SQLite's memory map on
(diskcache's 64 MiB) and off (prescreen's ``SQLITE_MMAP_SIZE``).

Run: ``python bench/bench_cold_lookup.py [--samples 300]``.
"""

from __future__ import annotations

import argparse
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
from prescreen.key import build_key
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore
from prescreen.store.disk import SQLITE_MMAP_SIZE
from prescreen.store.entry import Entry

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
    assert store._cache is not None
    cache = store._cache

    def index(i: int) -> int:
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
        """Another connection commits (another process's put, between two lookups)."""
        writer_con.execute("INSERT OR REPLACE INTO Settings VALUES ('bench.commit', ?)", (i,))

    def read_with(size: int) -> Callable[[None], object]:
        return lambda _: readers[size].execute("SELECT value FROM Cache WHERE key = ?", (next(fresh_keys[size]),)).fetchone()

    return [
        ("lookup (key + read + decode + service)", timed(lambda i: lookup_or_decide(plans[i], budget, store), index, n)),
        ("  key", timed(lambda i: build_key(plans[i], budget), index, n)),
        ("  store read (diskcache get, bounded)", timed(lambda i: cache.get(keys[i]), index, n)),
        ("  decode", timed(lambda i: Entry.from_json(texts[i], keys[i]), index, n)),
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
        mapped = by["new row after a commit, SQLite mmap 64 MiB"]
        unmapped = by["new row after a commit, mmap off (prescreen)"]
        print(f"{case}: after a commit, mmap on / off = {mapped['hot'] / unmapped['hot']:.2f}x hot, "
              f"{mapped['cold'] / unmapped['cold']:.2f}x cold")

if __name__ == "__main__":
    main()
