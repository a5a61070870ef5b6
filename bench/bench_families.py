"""Shape families: one ``prescreen warm`` over a range serves every size in it.

1. ``prescreen warm examples/tiny_models.py:mlp --shape batch=1..4096`` (freezing on,
   so Inductor's CPU GEMM template competes with ATen and selection really happens),
   in its own process, one compile per shape family.
2. ``--procs`` fresh processes (default 30), each compiling the MLP once with a
   random first batch in 1..4096 against that store. Each one reports its lookups,
   store hits and estimator calls and, for every selection, the decision it used (at
   the bucket's bound) next to the one the exact hint would give (computed aside,
   not stored).

Prints the hit rate (goal: 100%, 0 estimator calls), the hit rate exact-hint keys
would have had (a hint among the warm's compiled sizes), and the fraction of
decisions that differ from the exact-hint ones (tune at the hint, fallback at the
bound). A small device memory (default 6 MiB, ratio 0.25: a 1.5 MiB budget) puts the
tune/fallback boundary inside the range, so some decisions are interesting.

    python bench/bench_families.py [--procs 30] [--jobs 2] [--device-memory 6MiB] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = "examples/tiny_models.py:mlp"
LOW, HIGH = 1, 4096


def child(batch: int, device_memory: str, ratio: float) -> None:
    """One replica: compile the MLP at ``batch``; print lookups, hits and both decisions per selection."""
    import torch
    import torch._inductor.config as ic

    # The examples folder only: the repository root would shadow the installed prescreen (it lacks prescreen.hooks).
    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_models import mlp

    import prescreen
    from prescreen.decision import decide
    from prescreen.families import BUCKETS_ENV
    from prescreen.hooks import inductor_select, state
    from prescreen.key import build_key
    from prescreen.service import OBSERVERS

    ic.freezing = True
    ic.fx_graph_cache = False
    exact_action: dict[str, str] = {}  # bucketed key -> the decision the exact hint would give
    outcomes: list[dict[str, Any]] = []
    original = inductor_select.plan_for_selection

    def both_plans(name: str, input_nodes: Any, layout: Any) -> Any:
        plan = original(name, input_nodes, layout)
        before = os.environ.get(BUCKETS_ENV)
        os.environ[BUCKETS_ENV] = "exact"
        try:
            exact = original(name, input_nodes, layout)
        finally:
            if before is None:
                del os.environ[BUCKETS_ENV]
            else:
                os.environ[BUCKETS_ENV] = before
        budget = state.budget_for(layout.device)
        exact_action[build_key(plan, budget)[0]] = decide(exact, budget).action
        return plan

    inductor_select.plan_for_selection = both_plans  # what _guard calls
    OBSERVERS.append(lambda o, plan: outcomes.append({
        "key": o.key, "hit": o.hit, "action": o.decision.action, "kernel": plan.display_name,
        "family": ", ".join(t for _, t in plan.axis_labels)}))
    prescreen.install(device_memory=device_memory, ratio=ratio)
    model, (x,) = mlp(batch=batch)
    start = time.perf_counter()
    with torch.no_grad():
        y = torch.compile(model, dynamic=True, mode="max-autotune")(x)
        err = float((y - model(x)).abs().max())
    seconds = time.perf_counter() - start
    for o in outcomes:
        o["exact_action"] = exact_action.get(o["key"])
    c = state.counters()
    print("RESULT " + json.dumps({"batch": batch, "lookups": c.lookups, "hits": c.hits,
                                  "estimator_calls": c.estimator_calls, "seconds": seconds, "max_err": err,
                                  "decisions": outcomes}), flush=True)


def _env(store: str, inductor: str) -> dict[str, str]:
    env = dict(os.environ, PRESCREEN_CACHE_DIR=store, TORCHINDUCTOR_CACHE_DIR=inductor,
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    env.pop("PRESCREEN_SHAPE_BUCKETS", None)
    return env


def warm(store: str, inductor: str, device_memory: str, ratio: float) -> dict[str, Any]:
    argv = [sys.executable, "-c", "from prescreen.cli import main; main()", "warm", TARGET,
            "--shape", f"batch={LOW}..{HIGH}", "--device-memory", device_memory, "--ratio", str(ratio),
            "--inductor-config", "freezing=True", "--inductor-config", "fx_graph_cache=False", "--json"]
    start = time.perf_counter()
    proc = subprocess.run(argv, env=_env(store, inductor), capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"warm failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    report["wall_seconds"] = time.perf_counter() - start
    return report


def replica(batch: int, store: str, inductor: str, device_memory: str, ratio: float) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", str(batch), "--device-memory", device_memory, "--ratio", str(ratio)]
    start = time.perf_counter()
    proc = subprocess.run(argv, env=_env(store, inductor), capture_output=True, text=True, cwd=ROOT, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"replica at batch={batch} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(line[len("RESULT "):])
    out["wall_seconds"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=30, help="fresh replica processes (default 30)")
    parser.add_argument("--jobs", type=int, default=2, help="replicas run at once (default 2)")
    parser.add_argument("--device-memory", default="6MiB", help="device memory to plan for (default 6MiB)")
    parser.add_argument("--ratio", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.device_memory, args.ratio)
        return

    import torch

    print(f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"device memory {args.device_memory}, ratio {args.ratio}, {args.procs} replicas, seed {args.seed}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-families-"))
    store, inductor = str(tmp / "store"), str(tmp / "inductor")
    report = warm(store, inductor, args.device_memory, args.ratio)
    compiled_at = sorted({int(v) for d in report["decisions"] for v in d["sizes"].values()})
    print(f"warm batch={LOW}..{HIGH}: {report['compiles']} compiles, {report['families']} families, "
          f"{report['decisions_made']} decisions ({report['tuned']} tune, {report['fell_back']} fallback), "
          f"{report['wall_seconds']:.1f}s; compiled at batch {compiled_at}")

    rng = random.Random(args.seed)
    batches = [rng.randint(LOW, HIGH) for _ in range(args.procs)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        results = list(pool.map(lambda b: replica(b, store, inductor, args.device_memory, args.ratio), batches))
    replicas_seconds = time.perf_counter() - start

    print(f"\n{'batch':>6} {'lookups':>7} {'hits':>4} {'est.':>4} {'differs':>7} {'s':>5}  family")
    lookups = hits = calls = decisions = differ = tune_hint_fallback_bound = 0
    for r in results:
        ds = r["decisions"]
        n_diff = sum(d["exact_action"] is not None and d["action"] != d["exact_action"] for d in ds)
        lookups, hits, calls = lookups + r["lookups"], hits + r["hits"], calls + r["estimator_calls"]
        decisions += len(ds)
        differ += n_diff
        tune_hint_fallback_bound += sum(d["exact_action"] == "tune" and d["action"] == "fallback" for d in ds)
        family = sorted({d["family"] for d in ds if d["family"]}) or ["static"]
        print(f"{r['batch']:>6} {r['lookups']:>7} {r['hits']:>4} {r['estimator_calls']:>4} {n_diff:>7} "
              f"{r['seconds']:>5.1f}  {'; '.join(family)}")
    exact_hits = sum(b in compiled_at for b in batches)
    print(f"\nreplicas: {len(results)} processes, {replicas_seconds:.1f}s with {args.jobs} at once")
    print(f"hit rate with shape families: {hits}/{lookups} = {hits / max(lookups, 1):.1%}; "
          f"estimator calls: {calls}")
    print(f"hit rate exact-hint keys would have had (first batch among the warm's {len(compiled_at)} sizes): "
          f"{exact_hits}/{len(batches)} processes = {exact_hits / max(len(batches), 1):.1%}")
    print(f"decisions that differ from the exact-hint decision: {differ}/{decisions} = "
          f"{differ / max(decisions, 1):.1%} (tune at the hint, fallback at the bound: "
          f"{tune_hint_fallback_bound}); processes with one: "
          f"{sum(any(d['action'] != d['exact_action'] for d in r['decisions']) for r in results)}/{len(results)}")
    print(f"max |compiled - eager|: {max(r['max_err'] for r in results):.2e}")


if __name__ == "__main__":
    main()
