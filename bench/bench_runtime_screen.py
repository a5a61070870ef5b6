"""A runtime-autotuning step's guard, screened without the store against looked up, hot and cold.

The whole guard of ``CachingAutotuner.benchmark_all_configs`` (``hooks/triton_autotune.py``)
around a benchmark that does nothing, on a fake autotuner whose tensors the guard takes for
CUDA ones (this runs on a CPU box). Its store holds the decisions of every step already.
Two stores are timed in one run, interleaved sample by sample:

* **screened**: the store holds no observed OOM, so a step that fits is benchmarked without
  a key, a read or a decision (``prescreen.service.screens_without_store``);
* **looked up**: the store carries the ``observed-oom`` marker, so every step builds its
  plan (the headroom rule included), its key, and reads and decodes its entry, a hit.

Hot: right after another step on the same store; cold: after evicting the CPU caches
(``bench_cold_lookup.evict``), as between two steps of a compile.

Run: ``python bench/bench_runtime_screen.py [--samples 400]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PRESCREEN_DEVICE_MEMORY", "141GiB")  # the budget of a device this box does not have

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cold_lookup import evict  # noqa: E402

from prescreen.hooks import select_algorithm, state, triton_autotune  # noqa: E402
from prescreen.key import forget_plan_hashes  # noqa: E402
from prescreen.service import COUNTERS, flush_writes, forget  # noqa: E402
from prescreen.store import DiskStore, observed  # noqa: E402

STEPS = 64


class _Fn:
    __name__ = "triton_poi_fused_add_copy__mul_0"
    arg_names = ["in_out_ptr0", "in_ptr0", "xnumel"]


class Tuner:
    """What the guard reads of a ``CachingAutotuner``: a mutated arg, three configs, ``optimize_mem``."""

    def __init__(self) -> None:
        self.fn = _Fn()
        self.mutated_arg_names = ["in_out_ptr0"]
        self.launchers = [0, 1, 2]
        self.optimize_mem = True
        self.inductor_meta: dict[str, Any] = {}

    def benchmark_all_configs(self, *args: Any, **kwargs: Any) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=400)
    args = parser.parse_args()
    triton_autotune._device_of = lambda _named: torch.device("cuda", 0)  # type: ignore[assignment]
    select_algorithm._flush_bytes[("cuda", 0)] = 60 * 2**20  # an H200's L2, as the guard reads it there
    guarded = triton_autotune._wrap(Tuner.benchmark_all_configs)
    xs = [torch.zeros(1000 + i) for i in range(STEPS)]
    y = torch.zeros(10)
    stores = {name: DiskStore(Path(tempfile.mkdtemp(prefix=f"bench-screen-{name}-"))) for name in ("screened", "looked up")}
    for store in stores.values():  # every step's decision stored first: the marker makes the guard look them up
        observed.mark(store.directory)
        state.configure(store=store)
        for i in range(STEPS):
            guarded(Tuner(), xs[i], y, 1000 + i)
        flush_writes()
    Path(observed.marker_path(stores["screened"].directory)).unlink()  # as if no OOM had ever been stored
    times: dict[tuple[str, str], list[float]] = {(s, m): [] for s in stores for m in ("hot", "cold")}
    screened_before = COUNTERS.screened
    for i in range(args.samples):
        for name, store in stores.items():
            state.configure(store=store)
            for mode in ("hot", "cold"):
                if mode == "hot":  # right after a step of its own, as a compile's second runtime step in a row
                    guarded(Tuner(), xs[(i + 1) % STEPS], y, 1000 + (i + 1) % STEPS)
                forget_plan_hashes()
                forget(store)
                tuner = Tuner()
                if mode == "cold":
                    evict()
                start = time.perf_counter()
                guarded(tuner, xs[i % STEPS], y, 1000 + i % STEPS)
                times[(name, mode)].append(time.perf_counter() - start)
    screened = COUNTERS.screened - screened_before
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}; median of {args.samples} samples, the two "
          f"stores and hot/cold interleaved; {screened} of the screened store's {2 * args.samples} steps screened")
    print(f"\n{'store':10} {'hot us':>8} {'cold us':>8}")
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    for name in stores:
        print(f"{name:10} {med[(name, 'hot')]:8.1f} {med[(name, 'cold')]:8.1f}")
    print(f"looked up / screened: {med[('looked up', 'hot')] / med[('screened', 'hot')]:.1f}x hot, "
          f"{med[('looked up', 'cold')] / med[('screened', 'cold')]:.1f}x cold")


if __name__ == "__main__":
    main()
