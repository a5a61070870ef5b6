"""torch.compile wall time: no hook vs hook with a cold store vs hook with a warm store.

Every compile runs in a fresh process with fresh Inductor caches (so no FX-graph
or autotune cache hides work), variants interleaved, medians reported, and the
ratios computed within this one run. Uses max-autotune on the example MLP
(freezing on, so the CPU GEMM template competes with ATen and is benchmarked);
pass --device cuda on a GPU machine.

    python bench/bench_hooks.py [--reps 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(variant: str, device: str) -> None:
    import torch
    import torch._inductor.config as ic

    # The examples folder only: the repository root would shadow the installed prescreen (it lacks prescreen.hooks).
    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_models import block

    ic.freezing = True
    if variant != "off":
        import prescreen

        prescreen.install(device_memory="64GiB")
    model, inputs = block(batch=4, seq=64, device=device)
    start = time.perf_counter()
    compiled = torch.compile(model, dynamic=True, mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        compiled(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    out = {"variant": variant, "seconds": seconds}
    if variant != "off":
        from prescreen.hooks import state

        c = state.counters()
        out.update(lookups=c.lookups, hits=c.hits, estimator_calls=c.estimator_calls,
                   prescreen_seconds=c.seconds)
    print("RESULT " + json.dumps(out), flush=True)


def run(variant: str, device: str, store_dir: str) -> dict[str, float]:
    env = dict(os.environ, PRESCREEN_CACHE_DIR=store_dir, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="ind-"),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    proc = subprocess.run([sys.executable, __file__, "--child", variant, "--device", device], env=env,
                          capture_output=True, text=True, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{variant} failed: {proc.stderr[-2000:]}")
    return json.loads(line[7:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.device)
        return
    import torch

    times: dict[str, list[float]] = {"off": [], "cold": [], "warm": []}
    extra: dict[str, dict[str, float]] = {}
    orders = (("off", "cold", "warm"), ("cold", "warm", "off"))  # alternate, so no variant always runs first
    for rep in range(args.reps):
        cold_dir = tempfile.mkdtemp(prefix="prescreen-cold-")
        for variant in orders[rep % 2]:
            res = run(variant, args.device, cold_dir)  # "warm" reuses the store "cold" just filled
            print(f"  {variant}: {res['seconds']:.2f}s {json.dumps(res)}", flush=True)  # partial results survive a kill
            times[variant].append(res["seconds"])
            extra[variant] = res
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"machine: {platform.platform()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"torch {torch.__version__}, device {args.device}, reps {args.reps}")
    print("| variant | median compile s | ratio to no hook | lookups | store hits | estimator calls | "
          "time in prescreen | share of compile |")
    print("|---|---|---|---|---|---|---|---|")
    for k, label in (("off", "no hook"), ("cold", "hook, cold store"), ("warm", "hook, warm store")):
        e = extra[k]
        inside = e.get("prescreen_seconds")
        share = f"{100 * inside / e['seconds']:.4f}%" if inside is not None else "-"
        print(f"| {label} | {med[k]:.2f} | {med[k] / med['off']:.3f} | {e.get('lookups', '-')} | "
              f"{e.get('hits', '-')} | {e.get('estimator_calls', '-')} | "
              f"{f'{1e3 * inside:.2f} ms' if inside is not None else '-'} | {share} |")
    print(f"wall-clock difference to no hook: cold store {100 * (med['cold'] / med['off'] - 1):+.1f}%, warm store "
          f"{100 * (med['warm'] / med['off'] - 1):+.1f}%; that is run-to-run noise here. The hook's own cost is the "
          "'time in prescreen' column (wall time inside every lookup, measured in the compiling process).")


if __name__ == "__main__":
    main()
