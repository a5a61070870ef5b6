"""Estimator accuracy on CUDA: estimated vs measured peak of Inductor's autotune benchmark.

For each case, compiles ``a @ b`` (and a Linear with bias) with ``mode=max-autotune``
and ``dynamic=True``, wraps the algorithm selector so that around the real
benchmark step it records ``torch.cuda.max_memory_allocated() - memory_allocated()``
(the bytes the benchmark added), and compares that with prescreen's estimate
for the same call. The estimate is a guard: it must never be below the peak.

    python bench/gpu_accuracy.py
"""

from __future__ import annotations

import json
import platform

import torch


def main() -> None:
    import torch._inductor.config as ic
    from torch._inductor import select_algorithm as sa

    import prescreen
    from prescreen.footprint import estimate_footprint
    from prescreen.hooks import inductor_select as guard
    from prescreen.representatives import build_representatives

    ic.fx_graph_cache = False  # every case must really autotune
    ic.autotune_local_cache = False
    ic.autotune_remote_cache = False
    prescreen.install(ratio=1.0)  # always tune, so the real benchmark runs
    records: list[dict[str, object]] = []
    # The benchmark may run inside __call__ or later (deferred multi-template
    # benchmarking); AlgorithmSelectorCache.autotune is where it happens in both.
    inner = sa.AlgorithmSelectorCache.autotune

    def measured(self, name, input_nodes, layout, *args, **kwargs):  # type: ignore[no-untyped-def]
        plan = guard.plan_for_selection(name, input_nodes, layout)
        est = estimate_footprint(plan, build_representatives(plan)).total_bytes
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = inner(self, name, input_nodes, layout, *args, **kwargs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        flush = guard.flush_buffer_bytes(layout.device)
        records.append({"op": name, "hints": dict(plan.axis_static_values),
                        "estimated": est, "estimated_without_flush": est - flush, "measured_peak": peak,
                        "ratio": round(est / peak, 3) if peak else None})
        return result

    sa.AlgorithmSelectorCache.autotune = measured  # type: ignore[method-assign]
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # cuBLAS workspace outside the window

    cases = [
        ("mm", 1024, 4096, 4096, torch.float16),
        ("mm", 8192, 4096, 4096, torch.float16),
        ("mm", 65536, 4096, 4096, torch.bfloat16),
        ("mm", 131072, 8192, 8192, torch.float16),
        ("linear", 16384, 4096, 4096, torch.bfloat16),
    ]
    for op, m, k, n, dtype in cases:
        torch._dynamo.reset()
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        if op == "mm":
            w = torch.randn(k, n, device="cuda", dtype=dtype)
            fn = torch.compile(lambda a, b: a @ b, dynamic=True, mode="max-autotune-no-cudagraphs")
            before = len(records)
            fn(x, w)
        else:
            lin = torch.nn.Linear(k, n, device="cuda", dtype=dtype)
            fn = torch.compile(lin, dynamic=True, mode="max-autotune-no-cudagraphs")
            before = len(records)
            with torch.no_grad():
                fn(x)
        for r in records[before:]:
            r["case"] = f"{op} M={m} K={k} N={n} {str(dtype).removeprefix('torch.')}"
        del x
        torch.cuda.empty_cache()

    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; python {platform.python_version()}")
    print("| case | op | estimated MiB | of which cache flush | measured peak MiB | estimate / peak |")
    print("|---|---|---|---|---|---|")
    for r in records:
        flush = (r["estimated"] - r["estimated_without_flush"]) / 2**20
        print(f"| {r.get('case')} | {r['op']} | {r['estimated'] / 2**20:.1f} | {flush:.0f} | "
              f"{r['measured_peak'] / 2**20:.1f} | {r['ratio']} |")
    below = [r for r in records if r["measured_peak"] and r["estimated"] < r["measured_peak"]]
    print(f"cases: {len(records)}; estimate below measured peak: {len(below)}")
    print("JSON " + json.dumps(records))


if __name__ == "__main__":
    main()
