"""The deployment flow on a real GPU: warm with --artifact, load it on a fresh replica, compile, compare.

Run on a CUDA machine with transformers installed (random weights, nothing downloaded):

    python -P bench/gpu_deploy.py --out results.md

Every step is its own process with its own ``TORCHINDUCTOR_CACHE_DIR`` and ``PRESCREEN_CACHE_DIR``, as
machines of a fleet would be. It prints one table:

1. ``warm``: ``prescreen warm`` over the batch families with ``--artifact`` (caches at their defaults);
2. ``plan-only``: the same warm with ``--plan-only`` in fresh dirs (the fast audit);
3. ``cold``: a replica with empty dirs and no artifact compiles each family with the hooks on;
4. ``replica``: empty dirs, ``prescreen load`` the artifact, then the same compiles;
5. ``small``: like ``replica`` but with a device memory of 256 MiB: its budget differs, so torch's cache keys
   differ and it decides for itself (no fallback or tuning of the big budget reused).

For each: wall time, autotune benchmarks run (Inductor's ``benchmarking.*`` and coordinate-descent
counters), prescreen lookups / computed decisions / fallbacks, FX graph cache hits, and whether the
outputs equal the cold replica's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
BY_CALLER: dict[str, int] = {}  # a replica's benchmarks by the Inductor step that ran them
STACKS: dict[str, int] = {}  # the call chains of a replica's compile-time ("autotune") benchmarks
PRESCREEN_S: dict[str, float] = {}  # seconds inside prescreen's plan building and lookups, by hook
CALLS: dict[str, int] = {}
DESCENTS: list[dict[str, Any]] = []  # each kernel a replica tunes by coordinate descent, and why it did
RECHECKS: dict[str, int] = {}  # kernels the FX cache handed back, by their autotune-cache state after recheck
DECIDE_CALLS: dict[str, int] = {}  # the runtime guard's decisions: by call chain, kernel, autotuner, result
MODE = "max-autotune-no-cudagraphs"
#: One per family of batch=4..16 under the default power-of-two buckets ($DEPLOY_BATCHES: fewer, on a short lease).
BATCHES = tuple(int(b) for b in os.environ.get("DEPLOY_BATCHES", "4,8,16").split(","))
DEVICE = os.environ.get("DEPLOY_DEVICE", "cuda")  # cpu: a dry run of the flow (nothing autotunes)
SEQ = 128


def gpt2(batch: int = 4, device: str = DEVICE) -> tuple[Any, tuple[Any, ...]]:
    """A 2-layer GPT-2 (HF transformers config, random weights) over ``batch`` sequences of 128 tokens."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=512, n_head=8, vocab_size=8192, n_positions=SEQ, use_cache=False)
    model = GPT2LMHeadModel(config).to(device).eval()
    model = model.half() if device != "cpu" else model
    ids = torch.randint(0, config.vocab_size, (batch, SEQ), device=device)
    return _Logits(model), (ids,)


class _Logits:
    """The logits alone (a tensor, so outputs compare and compile without HF's output classes)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, ids: Any) -> Any:
        return self.model(input_ids=ids).logits


def _count_benchmarks() -> list[int]:
    """Count the benchmarks Inductor's benchmarkers really run (its ``benchmarking.*`` counters are no
    measure: an FX graph cache hit adds back the counters of the compile that made the entry)."""
    from torch._inductor.runtime import benchmarking

    ran = [0]
    callers = ("benchmark_all_configs", "_coordinate_descent_tuning", "autotune", "speedup_by_fusion")

    def counted(method: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            ran[0] += 1
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_name not in callers:
                frame = frame.f_back  # type: ignore[assignment]
            caller = frame.f_code.co_name if frame is not None else "other"
            BY_CALLER[caller] = BY_CALLER.get(caller, 0) + 1
            if caller == "autotune":
                chain, f = [], sys._getframe(1)
                while f is not None and len(chain) < 14:
                    chain.append(f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}")
                    f = f.f_back  # type: ignore[assignment]
                STACKS[" < ".join(chain)] = STACKS.get(" < ".join(chain), 0) + 1
            return method(*args, **kwargs)
        return run

    for cls in (benchmarking.Benchmarker, benchmarking.TritonBenchmarker, benchmarking.InductorBenchmarker):
        for name in ("benchmark_cpu", "benchmark_gpu"):
            if name in vars(cls):
                setattr(cls, name, counted(vars(cls)[name]))
    return ran


def _time_prescreen() -> None:
    """Sum the time the hooks spend building plans and looking them up (prescreen's own work in a step;
    the upstream method a guard calls afterwards is not counted)."""
    from prescreen.hooks import inductor_fusion, inductor_select, triton_autotune

    def timed(module: Any, name: str, label: str) -> None:
        inner = getattr(module, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                PRESCREEN_S[label] = PRESCREEN_S.get(label, 0.0) + time.perf_counter() - start
                CALLS[label] = CALLS.get(label, 0) + 1
        setattr(module, name, run)

    timed(inductor_fusion, "plans_for_fusion", "fusion plans")
    timed(inductor_fusion, "lookup_or_decide", "fusion lookups")
    timed(inductor_select, "plan_for_selection", "selection plans")
    timed(inductor_select, "lookup_or_decide", "selection lookups")
    timed(triton_autotune, "_decide", "runtime plans + lookups")
    inner_decide = triton_autotune._decide
    tuners: set[int] = set()

    def traced_decide(autotuner: Any, *args: Any, **kwargs: Any) -> Any:
        """Count the runtime guard's decisions by call chain (who asks, how often) and by result."""
        chain, f = [], sys._getframe(1)
        while f is not None and len(chain) < 9:
            chain.append(f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}")
            f = f.f_back  # type: ignore[assignment]
        tuners.add(id(autotuner))
        out = inner_decide(autotuner, *args, **kwargs)
        for what in (" < ".join(chain), "result " + ("none" if out is None else
                                                     "tune" if out[2].decision.tune else "fallback")):
            DECIDE_CALLS[what] = DECIDE_CALLS.get(what, 0) + 1
        DECIDE_CALLS["distinct autotuners"] = len(tuners)
        return out

    triton_autotune._decide = traced_decide


def _trace_descents(ran: list[int]) -> None:
    """Say which kernels a replica still tunes by coordinate descent, and what their autotune cache held."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    rechecked: set[int] = set()
    recheck, descend = CachingAutotuner.recheck_autotune_cache, CachingAutotuner._coordinate_descent_tuning

    def traced_recheck(self: Any, *args: Any, **kwargs: Any) -> Any:
        rechecked.add(id(self))
        before = self.filename
        out = recheck(self, *args, **kwargs)
        info = getattr(self, "autotune_cache_info", {})
        marked = all(getattr(r.config, "found_by_coordesc", False) for r in self.compile_results)
        what = f"{info.get('autotune_cache_state')}, {'marked' if marked else 'unmarked'}" + \
            (", relocated" if self.filename != before else "")
        RECHECKS[what] = RECHECKS.get(what, 0) + 1
        return out

    def traced_descend(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        before = ran[0]
        try:
            return descend(self, launcher, *args, **kwargs)
        finally:
            if ran[0] > before:  # the guard launched some without benchmarking: not descents
                DESCENTS.append(_descent(self, launcher, id(self) in rechecked, ran[0] - before))

    CachingAutotuner.recheck_autotune_cache = traced_recheck
    CachingAutotuner._coordinate_descent_tuning = traced_descend


def _descent(self: Any, launcher: Any, rechecked: bool, benchmarks: int) -> dict[str, Any]:
    return {"kernel": self.inductor_meta.get("kernel_name"), "heuristic": str(self.heuristic_type),
            "configs": len(self.configs or ()), "compile_results": len(self.compile_results or ()),
            "rechecked": rechecked, "info": getattr(self, "autotune_cache_info", None), "benchmarks": benchmarks,
            "filename": self.filename, "dir_exists": os.path.isdir(os.path.dirname(self.filename or "")),
            "config": str(launcher.config)}


def _saved_best_configs(root: Path, artifact: Path) -> dict[str, Any]:
    """Each best config the warm saved, as its directory and its artifact hold them: how many are marked found by
    coordinate descent, and the files whose last save in the artifact is not."""
    import zipfile

    from torch.compiler._cache import CacheArtifactManager

    from prescreen import artifact as prescreen_artifact

    files = {p.name: json.loads(p.read_text()) for p in root.rglob("*.best_config")}
    with zipfile.ZipFile(artifact) as zf:
        infos = prescreen_artifact._infos(zf)
        data = prescreen_artifact._read(zf, infos[prescreen_artifact.TORCH], prescreen_artifact._manifest(zf, infos))
    saves: dict[str, list[bool]] = {}
    for entry in (CacheArtifactManager.deserialize(data) or {}).get("autotune", []):
        saves.setdefault(os.path.basename(entry.key), []).append(bool(json.loads(entry.content).get("found_by_coordesc")))
    return {"files": len(files), "files_marked": sum(bool(v.get("found_by_coordesc")) for v in files.values()),
            "artifact_saves": {k: v for k, v in saves.items() if not v[-1]},
            "files_unmarked": sorted(k for k, v in files.items() if not v.get("found_by_coordesc"))}


def _compile_all() -> None:
    """A replica: compile each family once with the hooks on; print counters and outputs' digests."""
    import torch
    from torch._dynamo.utils import counters

    ran = _count_benchmarks()

    import prescreen
    from prescreen.hooks import state

    load = os.environ.get("DEPLOY_LOAD")
    if load:
        prescreen.load(load)
    prescreen.install()
    _time_prescreen()
    _trace_descents(ran)
    digests = []
    start = time.perf_counter()
    for batch in BATCHES:
        model, inputs = gpt2(batch)
        torch._dynamo.reset()
        with torch.no_grad():
            out = torch.compile(model, dynamic=True, mode=MODE)(*inputs)
            if DEVICE != "cpu":
                torch.cuda.synchronize()
        digests.append(out.float().abs().mean().item())
    seconds = time.perf_counter() - start
    c = state.counters()
    ind = counters["inductor"]
    print("RESULT " + json.dumps({
        "seconds": seconds, "lookups": c.lookups, "computed": c.estimator_calls, "fell_back": c.fell_back,
        "benchmarks": ran[0], "by_caller": BY_CALLER,
        "best_configs": len(list(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.best_config"))),
        "fx_hit": ind["fxgraph_cache_hit"], "digests": digests, "tag": torch.compiler.config.cache_key_tag,
        "prescreen_s": PRESCREEN_S, "calls": CALLS, "stacks": STACKS,
        "decide_calls": DECIDE_CALLS, "descents": DESCENTS, "rechecks": RECHECKS,
    }), flush=True)


def _env(root: Path, name: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESCREEN", "TORCHINDUCTOR"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(root / name / "inductor"), PRESCREEN_CACHE_DIR=str(root / name / "store"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])), **extra)
    return env


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{' '.join(cmd[:4])} failed with {proc.returncode}")
    return seconds, proc.stdout


def _warm(root: Path, name: str, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-P", "-c", "from prescreen.cli import main; main()", "warm", "gpu_deploy:gpt2", "--device", DEVICE,
           "--shape", f"batch={BATCHES[0]}..{BATCHES[-1]}", "--mode", MODE, "--json", *extra]
    seconds, out = _run(cmd, _env(root, name))
    report: dict[str, Any] = json.loads(out[out.index("{"):])
    report["wall"] = seconds
    return report


def _replica(root: Path, name: str, **extra: str) -> dict[str, Any]:
    seconds, out = _run([sys.executable, "-P", str(HERE), "--replica"], _env(root, name, **extra))
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[7:])
    result["wall"] = seconds
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="Also write the table (markdown) here.")
    parser.add_argument("--steps", default="warm,replica,cold,plan,small",
                        help="Comma-separated subset of the steps (replica and small need warm's artifact).")
    opts = parser.parse_args()
    if opts.replica:
        _compile_all()
        return
    root = Path(tempfile.mkdtemp(prefix="gpu-deploy-"))
    artifact = root / "deploy.prescreen"
    def step(name: str, result: dict[str, Any]) -> dict[str, Any]:
        print(f"STEP {name} " + json.dumps({k: v for k, v in result.items() if k != "decisions"}, default=str),
              flush=True)
        return result

    steps = set(opts.steps.split(","))
    results: dict[str, dict[str, Any]] = {}
    try:
        if "warm" in steps:
            warm = _warm(root, "warm", "--artifact", str(artifact))
            warm["best_configs"] = len(list((root / "warm" / "inductor").rglob("*.best_config")))
            warm["saved_best_configs"] = _saved_best_configs(root / "warm" / "inductor", artifact)
            results["warm"] = step("warm", warm)
            # a replica is another machine: the kernels the FX cache pickled name this directory
            (root / "warm" / "inductor").rename(root / "warm" / "inductor-on-the-warm-machine")
        if "replica" in steps:
            results["replica"] = step("replica", _replica(root, "replica", DEPLOY_LOAD=str(artifact)))
        if "cold" in steps:
            results["cold"] = step("cold", _replica(root, "cold"))
        if "plan" in steps:
            results["plan"] = step("plan", _warm(root, "plan", "--plan-only"))
        if "small" in steps:
            results["small"] = step("small", _replica(root, "small", DEPLOY_LOAD=str(artifact),
                                                      PRESCREEN_DEVICE_MEMORY="256MiB"))
        rows = [
            "| step | wall s | compile s | benchmarks | lookups | computed | fallbacks | FX hits | outputs = cold "
            "| prescreen s (share of compile) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        if "warm" in results:
            warm = results["warm"]
            rows.append(f"| warm --artifact ({warm['families']} families) | {warm['wall']:.1f} | {warm['seconds']:.1f} "
                        f"| | {warm['lookups']} | {warm['decisions_made']} | {warm['fell_back']} | "
                        f"{warm['cache_answered']} answered | | |")
        if "plan" in results:
            plan = results["plan"]
            rows.append(f"| warm --plan-only | {plan['wall']:.1f} | {plan['seconds']:.1f} | | {plan['lookups']} | "
                        f"{plan['decisions_made']} | {plan['fell_back']} | | | |")
        cold_digests = results.get("cold", {}).get("digests")
        for key, name in (("cold", "cold replica"), ("replica", "replica + load"), ("small", "replica + load, 256 MiB")):
            if key not in results:
                continue
            r = results[key]
            same = (all(abs(a - b) <= 1e-2 * max(1.0, abs(b)) for a, b in zip(r["digests"], cold_digests))
                    if cold_digests else "-")
            own = sum(r["prescreen_s"].values())
            rows.append(f"| {name} | {r['wall']:.1f} | {r['seconds']:.1f} | {r['benchmarks']} | {r['lookups']} | "
                        f"{r['computed']} | {r['fell_back']} | {r['fx_hit']} | {same} | "
                        f"{own:.2f} ({100 * own / r['seconds']:.3f}%) |")
        rows.append("")
        if "plan" in results and "warm" in results:
            rows.append(f"plan-only / full warm (compile seconds): "
                        f"{results['plan']['seconds'] / results['warm']['seconds']:.3f}")
        if "replica" in results and "cold" in results:
            rows.append(f"replica + load / cold compile: {results['replica']['seconds'] / results['cold']['seconds']:.3f}")
        for key in ("replica", "small"):
            if key in results:
                r = results[key]
                rows.append(f"{key}: FX-cache kernels rechecked {r['rechecks']}; coordinate descents "
                            f"{[(d['kernel'], d['rechecked'], (d['info'] or {}).get('autotune_cache_state')) for d in r['descents']]}")
        if "warm" in results:
            rows.append(f"warm: best configs saved {results['warm']['saved_best_configs']}")
        if artifact.exists():
            rows.append(f"artifact {artifact.stat().st_size / 2**20:.1f} MiB")
        text = "\n".join(rows)
        print(text)
        if opts.out:
            Path(opts.out).write_text(text + "\n\n" + json.dumps(results, default=str) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
