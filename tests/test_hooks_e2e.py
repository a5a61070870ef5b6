"""Real torch.compile(dynamic=True) with the hooks on CPU: reuse across processes and a forced fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _compile_in_new_process(cache: Path, memory: str, ratio: float) -> dict:
    env = dict(os.environ, PRESCREEN_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT / "examples"),
               TORCHINDUCTOR_CACHE_DIR=str(cache.parent / "inductor"))
    proc = subprocess.run([sys.executable, str(ROOT / "tests/scripts/compile_once.py"), memory, str(ratio)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[7:])


def test_second_process_reuses_first_process_decisions(tmp_path: Path) -> None:
    cache = tmp_path / "store"
    a = _compile_in_new_process(cache, "64GiB", 0.25)
    b = _compile_in_new_process(cache, "64GiB", 0.25)
    assert a["lookups"] > 0 and a["estimator_calls"] == a["lookups"] and a["hits"] == 0
    assert b["hits"] == b["lookups"] > 0
    assert b["estimator_calls"] == 0
    assert b["decisions"] == a["decisions"] and set(a["decisions"].values()) == {"tune"}
    assert b["output"] == a["output"]
    assert a["max_err"] < 1e-4 and b["max_err"] < 1e-4


def test_tiny_ratio_forces_fallback_and_output_equals_eager(tmp_path: Path) -> None:
    import torch._inductor.config as ic
    from tiny_models import block

    import prescreen
    from prescreen.hooks import state
    from prescreen.store import DiskStore

    state.reset()
    store = DiskStore(tmp_path / "store")
    before = state.counters().fell_back
    model, (x,) = block(batch=2, seq=8)
    torch._dynamo.reset()
    with ic.patch(freezing=True, fx_graph_cache=False), prescreen.installed(store=store, ratio=1e-9,
                                                                              device_memory="64GiB"):
        with torch.no_grad():
            y = torch.compile(model, dynamic=True, mode="max-autotune")(x)
            ref = model(x)
    stored = list(store.entries())
    state.reset()
    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)
    assert state.counters().fell_back > before
    assert stored and all(e.decision.action == "fallback" for e in stored)
    assert all(e.kernel.startswith("select:") for e in stored)
