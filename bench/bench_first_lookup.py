"""What a process pays once: its first lookup, in fresh processes, against a warm store.

Each sample is a new process that imports torch and prescreen, opens the store
(``PRESCREEN_CACHE_DIR``, filled beforehand) and looks up two plans whose
decisions are stored: the first lookup holds the once-per-process work (the
library versions that go into every key, the store's first read), the second
is a plain first lookup of a plan. Two variants alternate, process by process:

* ``prescreen``: as shipped (versions read from the metadata files' header lines);
* ``importlib``: the key's library versions read with ``importlib.metadata.version``,
  which parses each whole METADATA file (what prescreen did before).

Usage: ``python bench/bench_first_lookup.py [--reps 10]``; prints medians in
milliseconds and the ratio of the first lookups, measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
variant = sys.argv[1]
import torch  # noqa: F401
from importlib import metadata
from prescreen import key
from prescreen.budget import Budget
from prescreen.plan import KernelPlan
from prescreen.service import lookup_or_decide
from prescreen.store import open_store

if variant == "importlib":
    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "absent"
    key._version = version
plans = [KernelPlan.from_payload(p) for p in json.loads(sys.argv[2])]
budget = Budget("cuda", 80 * 2**30, 0.9)
t0 = time.perf_counter()
store = open_store()
t1 = time.perf_counter()
first = lookup_or_decide(plans[0], budget, store)
t2 = time.perf_counter()
second = lookup_or_decide(plans[1], budget, store)
t3 = time.perf_counter()
assert first.hit and second.hit, "the store was not warm"
print(json.dumps({"open": t1 - t0, "first": t2 - t1, "second": t3 - t2}))
"""


def plan_payload(rows: int) -> dict[str, object]:
    """A one-argument selection plan (``rows`` x 1024 fp16)."""
    return {"kernel_name": f"mm_{rows}", "group_features": [], "axis_names": [], "axis_static_values": [],
            "ordered_arg_specs": [{"kind": "tensor", "source": "buffer", "name": "a", "dtype": "torch.float16",
                                   "device": "cuda:0", "size_exprs": [rows, 1024], "stride_exprs": [1024, 1]}],
            "mutated_arg_names": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    payloads = json.dumps([plan_payload(1024), plan_payload(2048)])
    samples: dict[str, dict[str, list[float]]] = {v: {"open": [], "first": [], "second": []}
                                                  for v in ("prescreen", "importlib")}
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as cwd:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRESCREEN")}
        env["PRESCREEN_CACHE_DIR"] = cache
        warm = CHILD.replace('assert first.hit and second.hit, "the store was not warm"', "")
        subprocess.run([sys.executable, "-c", warm, "prescreen", payloads], env=env, cwd=cwd, check=True,
                       capture_output=True)  # fills the store (and the page cache)
        for _ in range(args.reps):
            for variant, table in samples.items():
                out = subprocess.run([sys.executable, "-c", CHILD, variant, payloads], env=env, cwd=cwd,
                                     check=True, capture_output=True, text=True)
                for name, seconds in json.loads(out.stdout).items():
                    table[name].append(seconds)
    print(f"a process's first lookups on a warm disk store, median of {args.reps} fresh processes each "
          "(alternated), ms:")
    print(f"  {'variant':<10} {'open store':>10} {'1st lookup':>11} {'2nd lookup':>11}")
    med = {v: {k: statistics.median(s) * 1000 for k, s in t.items()} for v, t in samples.items()}
    for variant, m in med.items():
        print(f"  {variant:<10} {m['open']:10.2f} {m['first']:11.2f} {m['second']:11.2f}")
    ratio = med["importlib"]["first"] / med["prescreen"]["first"]
    print(f"first lookup: importlib.metadata / prescreen = {ratio:.1f}x")


if __name__ == "__main__":
    main()
