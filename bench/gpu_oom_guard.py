"""OOM prevention on CUDA: max-autotune compiles of mm, bmm and conv2d under a memory cap.

For each op family, runs the same child twice, in fresh processes: without
prescreen and with it. The cap (``torch.cuda.set_per_process_memory_fraction``)
leaves room for the model itself but not for autotune's synthesized copies of
its inputs and output.

    python bench/gpu_oom_guard.py [--families mm,bmm,conv]
    python bench/gpu_oom_guard.py --families mm --m 131072 --k 8192 --n 8192 --cap-gib 5.5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _family(args: argparse.Namespace) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import torch

    dt = torch.float16
    if args.family == "mm":
        x = torch.randn(args.m, args.k, device="cuda", dtype=dt)
        w = torch.randn(args.k, args.n, device="cuda", dtype=dt) / args.k**0.5
        return (lambda a, b: a @ b), (x, w)
    if args.family == "bmm":  # --m batch rows, --k, --n per matrix; 64 matrices
        x = torch.randn(64, args.m, args.k, device="cuda", dtype=dt)
        w = torch.randn(64, args.k, args.n, device="cuda", dtype=dt) / args.k**0.5
        return (lambda a, b: torch.bmm(a, b)), (x, w)
    if args.family == "conv":  # channels-last fp16 conv2d, batch --m, --k channels in and out, 128x128 images
        conv = torch.nn.Conv2d(args.k, args.k, 3, padding=1, bias=False).to("cuda", dt)
        conv = conv.to(memory_format=torch.channels_last).eval()  # type: ignore[call-overload]
        x = torch.randn(args.m, args.k, 128, 128, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
        weight = conv.weight.detach()
        return (lambda a, wt: torch.nn.functional.conv2d(a, wt, padding=1)), (x, weight)
    raise SystemExit(f"unknown family {args.family!r}")


#: Per family: sizes and a cap that the compile without prescreen cannot survive.
DEFAULTS = {
    "mm": {"m": 131072, "k": 8192, "n": 8192, "cap_gib": 5.5},
    "bmm": {"m": 4096, "k": 4096, "n": 4096, "cap_gib": 9.0},
    "conv": {"m": 128, "k": 256, "n": 0, "cap_gib": 2.75},
}


def child(args: argparse.Namespace) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, 0)
    if args.prescreen:
        import prescreen

        prescreen.install()
    torch.manual_seed(0)
    f, inputs = _family(args)
    with torch.no_grad():
        ref = f(*inputs).cpu().float()  # eager result kept on the host
    torch.cuda.empty_cache()

    out: dict[str, object] = {"family": args.family, "prescreen": args.prescreen, "m": args.m, "k": args.k,
                              "n": args.n, "cap_gib": args.cap_gib,
                              "inputs_gib": round(sum(t.untyped_storage().nbytes() for t in inputs) / 2**30, 3)}
    start = time.perf_counter()
    try:
        compiled = torch.compile(f, dynamic=True, mode="max-autotune-no-cudagraphs")
        with torch.no_grad():
            y = compiled(*inputs).cpu().float()
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
        out["observed_oom"] = c.observed_oom
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="mm,bmm,conv")
    ap.add_argument("--family", default="mm")
    ap.add_argument("--m", type=int, default=None)
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--cap-gib", type=float, default=None)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--prescreen", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results = []
    for family in args.families.split(","):
        sizes = dict(DEFAULTS[family])
        for name in ("m", "k", "n", "cap_gib"):
            if getattr(args, name) is not None:
                sizes[name] = getattr(args, name)
        for use in (False, True):
            results.append(_run_child(family, sizes, use))
    print("| family | prescreen | cap GiB | inputs GiB | completed | matches eager | error | peak GiB | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.get('family')} | {'on' if r['prescreen'] else 'off'} | {r.get('cap_gib')} | "
              f"{r.get('inputs_gib', '-')} | {r.get('ok')} | {r.get('matches_eager', '-')} | "
              f"{r.get('error', '-')} | {r.get('peak_gib', '-')} | {r.get('seconds', '-')} |")
    print(json.dumps(results, indent=1))


def _run_child(family: str, sizes: dict[str, Any], use: bool) -> dict[str, Any]:
    if True:
        env = dict(os.environ, PRESCREEN_CACHE_DIR=tempfile.mkdtemp(prefix="prescreen-oom-"),
                   TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-oom-"),
                   TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOTUNE_LOCAL_CACHE="0")
        cmd = [sys.executable, __file__, "--child", "--family", family, "--m", str(sizes["m"]), "--k",
               str(sizes["k"]), "--n", str(sizes["n"]), "--cap-gib", str(sizes["cap_gib"])] + (
            ["--prescreen"] if use else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        res: dict[str, Any] = json.loads(line[7:]) if line else {
            "family": family, "prescreen": use, "ok": False, "cap_gib": sizes["cap_gib"],
            "error": f"child died rc={proc.returncode}: {proc.stderr[-400:]}"}
        res["returncode"] = proc.returncode
        prescreen_lines = [ln for ln in proc.stderr.splitlines() if "prescreen:" in ln]
        res["log"] = prescreen_lines[:4]
        print(f"{family} prescreen={'on' if use else 'off'}: ok={res.get('ok')} {res.get('error', '')[:160]}",
              flush=True)
        return res


if __name__ == "__main__":
    main()
