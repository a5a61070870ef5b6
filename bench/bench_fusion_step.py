"""What one guarded epilogue-fusion step costs inside a compile: its plans, then their lookups.

On CPU Inductor benchmarks no fusion, but with ``benchmark_fusion`` on it asks ``speedup_by_fusion`` about every
candidate pair, and prescreen's guard builds the step's plans (each kernel alone and fused) as it does on a GPU.
This compiles the example block (``dynamic=True``) a few times over a warm store and, at each such call, times one
way of building the plans, alternating: as the guard builds them (each buffer converted once a step and relabeled
where it recurs) and kernel by kernel (a buffer converted again in every kernel and clone). Each is timed once, between the
compile's own work, as the guard meets it (a microbenchmark repeating it would see warm caches and a fraction of
the time). Then the plans' lookups, all hits. Medians, microseconds; the ratio is from this one run.

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


def kernel_by_kernel(scheduler: Any, node1: Any, node2: Any) -> list[Any]:
    """``plans_for_fusion`` without sharing: every buffer converted for each kernel and each clone."""
    from torch._inductor.virtualized import V

    from prescreen.hooks import inductor_fusion as fus
    from prescreen.hooks.inductor_select import _Converter, benchmark_plan

    class Unshared(_Converter):
        def tensor(self, name: str, node: Any, layout: Any) -> Any:
            return self._tensor(name, node, layout)

    conv = Unshared(V.graph.sizevars)
    plans = []
    for kernel_name, nodes in fus._fusion_kernels(node1, node2):
        names, mutated, inplace = fus._kernel_args(scheduler, nodes)
        args: list[Any] = []
        for i, name in enumerate(names):
            args.extend(fus._graph_tensor(conv, f"buf{i}", name))
            if name in mutated:
                args.extend(fus._graph_tensor(conv, f"buf{i}.clone", name))
            if name in mutated or name in inplace:
                args.extend(fus._graph_tensor(conv, f"buf{i}.autotune_clone", name))
        plans.append(benchmark_plan(conv, args, fus._fusion_device(node1), kernel_name))
    return plans


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiles", type=int, default=5)
    args = ap.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-fusion-ind-")
    import torch
    import torch._inductor.config as ic
    from torch._inductor import scheduler

    import prescreen
    from prescreen.hooks import inductor_fusion as fus
    from prescreen.hooks import state
    from prescreen.service import lookup_or_decide
    from prescreen.store import DiskStore

    sys.path.insert(0, str(ROOT / "examples"))  # the examples folder only: the root would shadow the installed prescreen
    from tiny_models import block

    prescreen.install(store=DiskStore(tempfile.mkdtemp(prefix="bench-fusion-")), device_memory="64GiB")
    times: dict[str, list[float]] = {"shared": [], "kernel by kernel": [], "lookup, each plan": []}
    calls, warm = [0], [False]
    upstream = scheduler.Scheduler.speedup_by_fusion

    def timed_step(self: Any, node1: Any, node2: Any) -> Any:
        if fus._is_benchmarked_fusion(node1, node2):
            build = fus.plans_for_fusion if calls[0] % 2 == 0 else kernel_by_kernel
            start = time.perf_counter()
            plans = build(self, node1, node2)
            times["shared" if build is fus.plans_for_fusion else "kernel by kernel"].append(time.perf_counter() - start)
            budget, store = state.budget_for(fus._fusion_device(node1)), state.get_store()
            for plan in plans:
                start = time.perf_counter()
                lookup_or_decide(plan, budget, store)  # the first compile stores them: later ones hit
                if warm[0]:
                    times["lookup, each plan"].append(time.perf_counter() - start)
            assert plans == fus.plans_for_fusion(self, node1, node2)
            calls[0] += 1
        return upstream(self, node1, node2)

    scheduler.Scheduler.speedup_by_fusion = timed_step  # type: ignore[method-assign]
    ic.benchmark_fusion = True
    model, inputs = block(batch=4, seq=64)
    for _ in range(args.compiles):
        torch._dynamo.reset()
        with torch.no_grad(), ic.patch(force_disable_caches=True):
            torch.compile(model, dynamic=True)(*inputs)
        warm[0] = True
    print(f"torch {torch.__version__}, example block, {calls[0]} fusion steps in {args.compiles} compiles, "
          "medians (us):")
    print("| piece | calls | us |\n|---|---|---|")
    for name, values in times.items():
        print(f"| plans, {name} |" if name != "lookup, each plan" else f"| {name} |",
              f"{len(values)} | {1e6 * statistics.median(values):.0f} |")
    ratio = statistics.median(times["shared"]) / statistics.median(times["kernel by kernel"])
    print(f"plans shared / kernel by kernel: {ratio:.2f}")


if __name__ == "__main__":
    main()
