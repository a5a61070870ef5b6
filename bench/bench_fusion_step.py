"""What one guarded epilogue-fusion step costs inside a compile: its plans, then their lookups.

On CPU Inductor benchmarks no fusion, but with ``benchmark_fusion`` on it asks ``speedup_by_fusion`` about every
candidate pair, and prescreen's guard builds the step's plans (each kernel alone and fused) as it does on a GPU.
This compiles the example block (``dynamic=True``) a few times over one store and times, at each such call, the
plans once and each plan's lookup once (hits after the first compile), between the compile's own work, as the
guard meets them: a microbenchmark repeating one call sees warm CPU caches and a fraction of the time. At each
step it also decides the step's plans as new (a budget no key has seen: every plan computed and written) two
ways, in turn first: one ``lookup_or_decide`` a plan, and one ``lookup_or_decide_all`` for the step (what the
guard does: one write). Medians, microseconds; the ratio is of the two medians in this run.

    python -P bench/bench_fusion_step.py [--compiles 5]
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

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiles", type=int, default=5)
    args = ap.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-fusion-ind-")
    import torch
    import torch._inductor.config as ic
    from torch._inductor import scheduler

    import prescreen
    from prescreen.budget import Budget
    from prescreen.hooks import inductor_fusion as fus
    from prescreen.hooks import state
    from prescreen.service import lookup_or_decide, lookup_or_decide_all
    from prescreen.store import DiskStore

    sys.path.insert(0, str(ROOT / "examples"))  # the examples folder only: the root would shadow the installed prescreen
    from tiny_models import block

    prescreen.install(store=DiskStore(tempfile.mkdtemp(prefix="bench-fusion-")), device_memory="64GiB")
    times: dict[str, list[float]] = {"plans, a step": [], "lookup, a plan": [], "new step, a lookup a plan": [],
                                     "new step, one lookup_or_decide_all": []}
    steps, warm = [0], [False]
    upstream = scheduler.Scheduler.speedup_by_fusion

    def timed_step(self: Any, node1: Any, node2: Any) -> Any:
        if fus._is_benchmarked_fusion(node1, node2):
            start = time.perf_counter()
            plans = fus.plans_for_fusion(self, node1, node2)
            times["plans, a step"].append(time.perf_counter() - start)
            budget, store = state.budget_for(fus._fusion_device(node1)), state.get_store()
            for plan in plans:
                start = time.perf_counter()
                lookup_or_decide(plan, budget, store)  # the first compile stores them: later ones hit
                if warm[0]:
                    times["lookup, a plan"].append(time.perf_counter() - start)
            ways = [("new step, a lookup a plan", lambda b: [lookup_or_decide(p, b, store) for p in plans]),
                    ("new step, one lookup_or_decide_all", lambda b: lookup_or_decide_all(plans, b, store))]
            for name, way in ways[::-1] if steps[0] % 2 else ways:
                fresh = Budget(budget.device_kind, budget.total_memory, 0.5 + len(times[name]) * 1e-9 + 0.1 * (
                    name == ways[1][0]))  # keys no lookup has seen
                start = time.perf_counter()
                way(fresh)
                times[name].append(time.perf_counter() - start)
            steps[0] += 1
        return upstream(self, node1, node2)

    scheduler.Scheduler.speedup_by_fusion = timed_step  # type: ignore[method-assign]
    ic.benchmark_fusion = True
    model, inputs = block(batch=4, seq=64)
    for _ in range(args.compiles):
        torch._dynamo.reset()
        with torch.no_grad(), ic.patch(force_disable_caches=True):
            torch.compile(model, dynamic=True)(*inputs)
        warm[0] = True
    print(f"torch {torch.__version__}, example block, {steps[0]} fusion steps in {args.compiles} compiles, "
          "medians (us):")
    print("| piece | calls | us |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {len(values)} | {1e6 * statistics.median(values):.0f} |")
    one, each = (statistics.median(times[k]) for k in ("new step, one lookup_or_decide_all", "new step, a lookup a plan"))
    print(f"a new step in one lookup_or_decide_all: {one / each:.2f}x the time of a lookup a plan")


if __name__ == "__main__":
    main()
