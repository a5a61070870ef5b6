"""OOM prevention on CUDA: a max-autotune compile with a wide dynamic shape under a memory cap.

Runs the same child twice, in fresh processes: without prescreen and with it.
The cap (``torch.cuda.set_per_process_memory_fraction``) leaves room for the
model itself but not for autotune's synthesized copies of its inputs and output.

    python bench/gpu_oom_guard.py [--m 131072 --k 8192 --n 8192 --cap-gib 5.5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(args: argparse.Namespace) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, 0)
    if args.prescreen:
        import prescreen

        prescreen.install()
    torch.manual_seed(0)
    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.float16)
    w = torch.randn(args.k, args.n, device="cuda", dtype=torch.float16) / args.k**0.5
    ref = (x @ w).cpu().float()  # eager result kept on the host
    torch.cuda.empty_cache()

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    out: dict[str, object] = {"prescreen": args.prescreen, "m": args.m, "k": args.k, "n": args.n,
                              "cap_gib": args.cap_gib}
    start = time.perf_counter()
    try:
        compiled = torch.compile(f, dynamic=True, mode="max-autotune-no-cudagraphs")
        y = compiled(x, w).cpu().float()
        out["ok"] = True
        out["max_abs_err_vs_eager"] = float((y - ref).abs().max())
        out["matches_eager"] = bool(torch.allclose(y, ref, atol=2e-2, rtol=2e-2))
    except Exception as exc:  # the failure without prescreen is the point of this script
        out["ok"] = False
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        out["oom"] = "out of memory" in str(exc).lower()
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    if args.prescreen:
        from prescreen.hooks import state

        c = state.counters()
        out["lookups"], out["fell_back"], out["estimator_calls"] = c.lookups, c.fell_back, c.estimator_calls
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=131072)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--cap-gib", type=float, default=5.5)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--prescreen", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results = []
    for use in (False, True):
        env = dict(os.environ, PRESCREEN_CACHE_DIR=tempfile.mkdtemp(prefix="prescreen-oom-"),
                   TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-oom-"))
        cmd = [sys.executable, __file__, "--child", "--m", str(args.m), "--k", str(args.k), "--n", str(args.n),
               "--cap-gib", str(args.cap_gib)] + (["--prescreen"] if use else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        res = json.loads(line[7:]) if line else {"prescreen": use, "ok": False,
                                                  "error": f"child died rc={proc.returncode}: {proc.stderr[-400:]}"}
        res["returncode"] = proc.returncode
        prescreen_lines = [ln for ln in proc.stderr.splitlines() if "prescreen:" in ln]
        res["log"] = prescreen_lines[:3]
        results.append(res)
    print("| prescreen | completed | matches eager | error | peak GiB | seconds |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {'on' if r['prescreen'] else 'off'} | {r.get('ok')} | {r.get('matches_eager', '-')} | "
              f"{r.get('error', '-')} | {r.get('peak_gib', '-')} | {r.get('seconds', '-')} |")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
