"""Does a replica that loads torch's mega-cache still benchmark, with and without prescreen? (diagnostic)

    python -P bench/gpu_megacache_probe.py          # prints one line per variant

Each variant: process A compiles ``gpu_deploy.gpt2`` at batch 4 in a fresh Inductor dir and saves
``torch.compiler.save_cache_artifacts()``; process B loads them into another fresh dir and compiles the
same model and batch, counting the benchmarks that really run by the Inductor step that ran them.
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
    if role == "load":
        torch.compiler.load_cache_artifacts(Path(path).read_bytes())
    if os.environ.get("PROBE_PRESCREEN") == "1":
        import prescreen

        prescreen.install()
    model, inputs = gpu_deploy.gpt2(4)
    with torch.no_grad():
        torch.compile(model, dynamic=True, mode=gpu_deploy.MODE)(*inputs)
    if role == "save":
        saved = torch.compiler.save_cache_artifacts()
        Path(path).write_bytes(saved[0] if saved else b"")
    print("RESULT " + json.dumps({"benchmarks": ran[0], "by_caller": gpu_deploy.BY_CALLER}), flush=True)


def main() -> None:
    for with_prescreen in ("0", "1"):
        root = Path(tempfile.mkdtemp(prefix="probe-"))
        out = {}
        for role in ("save", "load"):
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(root / role), PRESCREEN_CACHE_DIR=str(root / "s" / role),
                       PROBE_PRESCREEN=with_prescreen,
                       PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
            proc = subprocess.run([sys.executable, "-P", str(HERE), role, str(root / "mega.bin")], env=env,
                                  capture_output=True, text=True, timeout=600)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            out[role] = json.loads(line[7:]) if line else proc.stderr[-800:]
        print(f"prescreen={with_prescreen}: " + json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        child(sys.argv[1], sys.argv[2])
    else:
        main()
