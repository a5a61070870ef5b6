"""Where the guard's own time goes in a CUDA compile: the pieces of prescreen's wrappers, timed.

Runs ``gpu_coverage.py``'s cases (same settings) with timers around the functions
the wrappers call (building selection, fusion and runtime-autotune plans, the
budget, the lookups, the store's SQLite read) and prints each one's total time
and call count at the end. The timers' own cost falls inside the guard time the
coverage rows print, so those rows read a little high here; use
``gpu_coverage.py`` for the guard share itself.

    python bench/gpu_guard_pieces.py --cases mm_epilogue,conv1d [--json out.json]
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
from types import ModuleType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_coverage  # noqa: E402

from prescreen import (
    key,  # noqa: E402
    service,  # noqa: E402
)
from prescreen.hooks import select_algorithm, state, triton_autotune  # noqa: E402
from prescreen.store import disk, entry, writer  # noqa: E402

totals: collections.Counter[str] = collections.Counter()
cpu: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()

PIECES: dict[ModuleType, tuple[str, ...]] = {
    select_algorithm: ("_is_benchmarked_fusion", "plans_for_fusion", "_kernel_args", "_graph_tensor",
                       "_benchmark_plan", "_fusion_kernels", "plan_for_selection", "flush_buffer_bytes",
                       "concrete_tensor_arg", "lookup_or_decide"),
    triton_autotune: ("plan_for_autotuner", "_device_of", "_named_args", "_peak_headroom", "_allocated_bytes_stats",
                      "_device_clones", "lookup_or_decide", "clone_bound", "screens_without_store"),
    state: ("budget_for", "get_store", "log_once"),
    service: ("build_key", "try_representatives", "decide_with", "_remember"),
    key: ("canonical_texts", "plan_hashes", "_new_key"),
}


def install_timers() -> None:
    """Wrap every piece (module globals, so the wrappers' calls go through the timers)."""
    for module, names in PIECES.items():
        short = module.__name__.rsplit(".", 1)[-1]
        for name in names:
            setattr(module, name, gpu_coverage.timed(getattr(module, name), totals, f"{short}.{name}", calls, cpu))
    disk.DiskStore._read = gpu_coverage.timed(  # type: ignore[method-assign]
        disk.DiskStore._read, totals, "DiskStore._read (SQLite)", calls, cpu)
    disk.DiskStore.lookup = gpu_coverage.timed(  # type: ignore[method-assign]
        disk.DiskStore.lookup, totals, "DiskStore.lookup (read + decode)", calls, cpu)
    entry.Entry.from_json = staticmethod(gpu_coverage.timed(  # type: ignore[method-assign]
        entry.Entry.from_json, totals, "Entry.from_json (decode)", calls, cpu))
    writer.submit = gpu_coverage.timed(writer.submit, totals, "writer.submit", calls, cpu)


def report() -> None:
    print("== pieces: total ms (wall), the calling thread's CPU ms, calls")
    for label, seconds in totals.most_common():
        print(f"  {1e3 * seconds:9.3f} ms {1e3 * cpu[label]:9.3f} ms {calls[label]:5d}  {label}")


if __name__ == "__main__":
    install_timers()
    atexit.register(report)
    gpu_coverage.main()
