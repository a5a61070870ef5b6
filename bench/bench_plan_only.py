"""``prescreen warm --plan-only`` against a full max-autotune warm of the same families, in one run.

    python -P bench/bench_plan_only.py                                  # CPU: the example MLP, 13 families
    python -P bench/bench_plan_only.py --target gpu_deploy:gpt2 --device cuda --shape batch=1..4096

Each warm runs in its own process with fresh ``TORCHINDUCTOR_CACHE_DIR`` and ``PRESCREEN_CACHE_DIR``,
the plan-only one first. Prints both wall times, their ratio (the issue's goal: <= 0.10), and whether
both found the same fallbacks (the audit must name the kernels a full warm falls back on). With
``--full-timeout S`` a full warm still running after S seconds is stopped: its time is then at least S,
so the ratio printed is an upper bound, and the fallbacks are not compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"


def warm(args: argparse.Namespace, root: Path, name: str, *extra: str, timeout: float = 3600) -> dict[str, Any] | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESCREEN", "TORCHINDUCTOR"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(root / name / "inductor"), PRESCREEN_CACHE_DIR=str(root / name / "store"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), str(EXAMPLES), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-P", "-c", "from prescreen.cli import main; main()", "warm", args.target,
           "--device", args.device, "--shape", args.shape, "--device-memory", args.device_memory, "--json", *extra]
    cmd += [x for item in args.inductor_config for x in ("--inductor-config", item)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        raise SystemExit(f"warm {name} failed: {proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("{"):])
    report["wall"] = time.perf_counter() - start
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="tiny_models:mlp")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="batch=1..4096")
    parser.add_argument("--device-memory", default="19MiB", help="small enough that some kernels fall back")
    parser.add_argument("--inductor-config", action="append", default=None)
    parser.add_argument("--full-timeout", type=float, default=3600.0)
    args = parser.parse_args()
    if args.inductor_config is None:
        args.inductor_config = ["freezing=True"] if args.device == "cpu" else []
    root = Path(tempfile.mkdtemp(prefix="bench-plan-only-"))
    plan = warm(args, root, "plan", "--plan-only")
    assert plan is not None
    full = warm(args, root, "full", timeout=args.full_timeout)

    def fallbacks(report: dict[str, Any]) -> set[tuple[str, str]]:
        # compile-time steps only: runtime autotuning is decided at a kernel's first call, not by an audit
        return {(d["kernel"], d["family"]) for d in report["decisions"]
                if d["action"] == "fallback" and not d["kernel"].startswith("autotune:")}

    print(f"{args.target} on {args.device}, {args.shape} ({plan['families']} families), device memory "
          f"{args.device_memory}")
    print(f"plan only:  {plan['wall']:7.1f} s wall, {plan['decisions_made']} decisions, {plan['fell_back']} fallbacks, "
          f"{plan['compiles']} lowerings for {plan['decided_families']} families decided")
    if full is None:
        print(f"full warm:  stopped after {args.full_timeout:.0f} s wall (not finished)")
        print(f"ratio plan-only / full: <= {plan['wall'] / args.full_timeout:.3f}  (goal <= 0.10)")
        return
    print(f"full warm:  {full['wall']:7.1f} s wall, {full['decisions_made']} decisions, {full['fell_back']} fallbacks")
    print(f"ratio plan-only / full: {plan['wall'] / full['wall']:.3f}  (goal <= 0.10); "
          f"same fallbacks: {fallbacks(plan) == fallbacks(full)}")


if __name__ == "__main__":
    main()
