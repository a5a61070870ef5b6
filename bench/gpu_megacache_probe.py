"""Does a replica that loads torch's mega-cache still benchmark, with and without prescreen? (diagnostic)

    python -P bench/gpu_megacache_probe.py          # prints one line per variant

Each variant: process A compiles ``gpu_deploy.gpt2`` at batch 4 in a fresh Inductor dir and saves
``torch.compiler.save_cache_artifacts()``; process B loads them into another fresh dir and compiles the
same model and batch, counting the benchmarks that really run by the Inductor step that ran them.
Variant ``copy`` also copies every ``.best_config`` file A's Inductor dir holds into B's, to tell "torch
saved the best config but the mega-cache did not carry it" from "no best config was saved". For each
kernel B coordinate-descends, it prints the local best-config file B looks for, and what A had there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()


def child(role: str, path: str) -> None:
    import gpu_deploy
    import torch

    ran = gpu_deploy._count_benchmarks()
    descended = _watch_coordinate_descent()
    recorded = _watch_recorded_artifacts()
    if role == "load":
        torch.compiler.load_cache_artifacts(Path(path).read_bytes())
        if os.environ.get("PROBE_COPY") == "1":
            _copy_best_configs(Path(path).parent / "save", Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
    if os.environ.get("PROBE_PRESCREEN") == "1":
        import prescreen

        prescreen.install()
    model, inputs = gpu_deploy.gpt2(4)
    with torch.no_grad():
        torch.compile(model, dynamic=True, mode=gpu_deploy.MODE)(*inputs)
    if role == "save":
        saved = torch.compiler.save_cache_artifacts()
        Path(path).write_bytes(saved[0] if saved else b"")
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    best = {str(f.relative_to(cache)): json.loads(f.read_text()) for f in sorted(cache.rglob("*.best_config"))}
    print("RESULT " + json.dumps({"benchmarks": ran[0], "by_caller": gpu_deploy.BY_CALLER, "descended": descended,
                                  "best_configs": len(best), "recorded_autotune": recorded}), flush=True)
    if role == "save":
        Path(path).with_suffix(".best.json").write_text(json.dumps(best, indent=1))


def _watch_coordinate_descent() -> list[dict[str, object]]:
    """Each kernel that coordinate-descends: its name, configs hash, and the best-config file it would read."""
    from torch._inductor.runtime import triton_heuristics
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    seen: list[dict[str, object]] = []
    inner = triton_heuristics.CachingAutotuner.coordinate_descent_tuning

    def watched(self, launcher, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(getattr(self, "heuristic_type", "")).split(".")[-1] in ("TEMPLATE", "USER_AUTOTUNE", "FIXED"):
            return inner(self, launcher, *args, **kwargs)  # upstream returns these inline
        try:
            filename = getattr(self, "filename", None) or ""
            local = AutotuneCache._make_local_cache_key(os.path.dirname(filename), AutotuneCache._prepare_key(filename))
            seen.append({"kernel": self.fn.__name__, "filename": filename, "heuristic": str(self.heuristic_type),
                         "configs": len(self.configs), "configs_hash": triton_heuristics.hash_configs(self.configs),
                         "start": str(launcher.config), "found_by_coordesc": getattr(launcher.config, "found_by_coordesc", None),
                         "local_key": local, "local_exists": os.path.exists(local),
                         "save_hook": self.save_cache_hook is not None})
        except Exception as exc:  # the probe must not change what it probes
            seen.append({"kernel": getattr(getattr(self, "fn", None), "__name__", "?"), "error": repr(exc)})
        return inner(self, launcher, *args, **kwargs)

    triton_heuristics.CachingAutotuner.coordinate_descent_tuning = watched
    return seen


def _watch_recorded_artifacts() -> dict[str, int]:
    """How many autotune artifacts the mega-cache recorded, by key (several records of one key: last wins)."""
    from torch.compiler._cache import CacheArtifactManager

    counts: dict[str, int] = {}
    inner = CacheArtifactManager.record_artifact.__func__  # type: ignore[attr-defined]

    def record(cls, artifact_type, key, content):  # type: ignore[no-untyped-def]
        if "autotune" in str(artifact_type):
            counts[key] = counts.get(key, 0) + 1
        return inner(cls, artifact_type, key, content)

    CacheArtifactManager.record_artifact = classmethod(record)  # type: ignore[method-assign]
    return counts


def _copy_best_configs(src: Path, dst: Path) -> None:
    for f in src.rglob("*.best_config"):
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.read_bytes())


def main() -> None:
    for with_prescreen, copy in (("0", "0"), ("0", "1"), ("1", "0")):
        root = Path(tempfile.mkdtemp(prefix="probe-"))
        out = {}
        for role in ("save", "load"):
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(root / role), PRESCREEN_CACHE_DIR=str(root / "s" / role),
                       PROBE_PRESCREEN=with_prescreen, PROBE_COPY=copy,
                       PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
            proc = subprocess.run([sys.executable, "-P", str(HERE), role, str(root / "mega.bin")], env=env,
                                  capture_output=True, text=True, timeout=600)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            out[role] = json.loads(line[7:]) if line else proc.stderr[-800:]
        print(f"prescreen={with_prescreen} copy={copy}: " + json.dumps(out), flush=True)
        best = root / "mega.best.json"
        if best.exists() and isinstance(out.get("load"), dict):
            saved = json.loads(best.read_text())
            for d in out["load"]["descended"]:
                rel = os.path.join(*str(d["local_key"]).split(os.sep)[-2:])
                print(f"  descended {d['kernel']}: A saved {saved.get(rel)!r}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        child(sys.argv[1], sys.argv[2])
    else:
        main()
