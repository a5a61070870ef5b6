"""Learning from a real OOM on CUDA: retry with the fallback, store the fact, never try again.

A live filler tensor takes the device so that the free memory is below the
autotune benchmark's footprint, while the budget on total memory (0.25 of an
H200) says tune. Each variant is a fresh process with a fresh Inductor cache:

1. no prescreen: the compile dies of OOM;
2. prescreen, process 1 (empty store): tune, the benchmark runs out of memory,
   the guard redoes the step with the ATen extern choice, the compile
   completes, and an ``observed_oom`` fallback is stored;
3. prescreen, process 2 (same store): a store hit, fallback, no benchmark;
4. prescreen with ``PRESCREEN_BUDGET_BASIS=free`` (new empty store): the budget
   is a quarter of the free memory, so it falls back before benchmarking.

With ``--subproc`` every process sets ``TORCHINDUCTOR_AUTOTUNE_IN_SUBPROC=1`` and only the first three run: ATen
is benchmarked here, each template in upstream's tuning subprocess. With a headroom that fits ATen's inputs but
not the subprocess's own copies beside what this process's allocator keeps cached, the OOM happens there and
upstream times those choices inf: without prescreen the compile completes, with it the fact is stored as well.

    python bench/gpu_learn_oom.py [--m 65536 --k 8192 --n 8192 --headroom-gib 1.5] [--subproc --headroom-gib 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any


def child(args: argparse.Namespace) -> None:
    import torch

    torch.manual_seed(0)
    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.float16)
    w = torch.randn(args.k, args.n, device="cuda", dtype=torch.float16) / args.k**0.5
    ref = (x @ w).cpu().float()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    fill = free - int(args.headroom_gib * 2**30)
    filler = torch.empty(fill, dtype=torch.uint8, device="cuda")  # the "model" that holds the device
    free_after = torch.cuda.mem_get_info()[0]
    out: dict[str, Any] = {"variant": args.variant, "total_gib": round(total / 2**30, 2),
                           "filler_gib": round(fill / 2**30, 2), "free_gib_at_compile": round(free_after / 2**30, 3)}
    if args.variant != "off":
        import prescreen

        prescreen.install()
    torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated()  # filler + x + w
    start = time.perf_counter()
    try:
        compiled = torch.compile(lambda a, b: a @ b, dynamic=True, mode="max-autotune-no-cudagraphs")
        y = compiled(x, w).cpu().float()
        out["ok"] = True
        out["matches_eager"] = bool(torch.allclose(y, ref, atol=2e-2, rtol=2e-2))
        out["max_abs_err_vs_eager"] = float((y - ref).abs().max())
    except Exception as exc:  # the failure without prescreen is the point
        out["ok"] = False
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:240]}"
    out["compile_seconds"] = round(time.perf_counter() - start, 2)
    out["peak_gib"] = round((torch.cuda.max_memory_allocated() - held) / 2**30, 3)  # what the compile added
    del filler
    if args.variant != "off":
        from prescreen.decision import is_observed_oom
        from prescreen.hooks import state

        c = state.counters()
        out.update(lookups=c.lookups, hits=c.hits, estimator_calls=c.estimator_calls, fell_back=c.fell_back,
                   observed_oom=c.observed_oom)
        store = state.get_store()
        entries = list(store.entries()) if store is not None else []
        out["stored"] = [{"kernel": e.kernel, "action": e.decision.action, "observed_oom": is_observed_oom(e.decision),
                          "reason": e.decision.reason[:300]} for e in entries]
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=65536)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--headroom-gib", type=float, default=1.5)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--variant", default="off")
    ap.add_argument("--subproc", action="store_true", help="benchmark templates in upstream's tuning subprocess")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    store = tempfile.mkdtemp(prefix="prescreen-learn-")
    free_store = tempfile.mkdtemp(prefix="prescreen-learn-free-")
    variants = [("off", store, {}), ("process 1", store, {}), ("process 2", store, {}),
                ("basis=free", free_store, {"PRESCREEN_BUDGET_BASIS": "free"})][:3 if args.subproc else 4]
    results = []
    for name, cache, extra in variants:
        env = dict(os.environ, PRESCREEN_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="ind-"),
                   TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOTUNE_LOCAL_CACHE="0",
                   TORCHINDUCTOR_AUTOTUNE_IN_SUBPROC="1" if args.subproc else "0", **extra)
        env.pop("PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO", None)
        cmd = [sys.executable, __file__, "--child", "--variant", name, "--m", str(args.m), "--k", str(args.k),
               "--n", str(args.n), "--headroom-gib", str(args.headroom_gib)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        res: dict[str, Any] = json.loads(line[7:]) if line else {
            "variant": name, "ok": False, "error": f"child died rc={proc.returncode}: {proc.stderr[-300:]}"}
        res["log"] = [ln[:400] for ln in proc.stderr.splitlines() if "prescreen:" in ln][:4]
        res["choices_upstream_failed"] = proc.stderr.count("Failed to benchmark choice")
        print(f"{name}: ok={res.get('ok')} {res.get('error', '')[:200]}", flush=True)
        results.append(res)
    print("| process | completed | matches eager | free GiB at compile | peak GiB over held | compile s | lookups | hits | "
          "estimator calls | observed OOM | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['variant']} | {r.get('ok')} | {r.get('matches_eager', '-')} | {r.get('free_gib_at_compile', '-')} | "
              f"{r.get('peak_gib', '-')} | {r.get('compile_seconds', '-')} | {r.get('lookups', '-')} | "
              f"{r.get('hits', '-')} | {r.get('estimator_calls', '-')} | {r.get('observed_oom', '-')} | "
              f"{r.get('error', '-')} |")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
