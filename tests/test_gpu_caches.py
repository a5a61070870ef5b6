"""CUDA, Inductor's caches at their defaults: a runtime fallback is never saved as a best config, and
coordinate descent is guarded by the same decision (skip without CUDA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)"),
]


@pytest.fixture()
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from torch._dynamo.utils import counters

    from prescreen.hooks import state
    from prescreen.store import DiskStore

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    state.reset()
    torch._dynamo.reset()
    counters.clear()
    yield DiskStore(tmp_path / "store"), tmp_path / "inductor"
    state.reset()
    torch._dynamo.reset()


def _mutating(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(0.5).add_(y)
    return x.sum(dim=-1)


def _softmax_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1).sum(dim=0)


def _compile_run(fn: Any, *inputs: torch.Tensor, ratio: float, store: Any) -> Any:
    import prescreen

    with prescreen.installed(store=store, ratio=ratio):
        return torch.compile(fn, dynamic=True, mode="max-autotune-no-cudagraphs")(*inputs)


def test_a_runtime_fallback_is_never_saved_as_a_best_config(fresh: Any) -> None:
    store, inductor = fresh
    x, y = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    _compile_run(_mutating, x, y, ratio=1e-9, store=store)
    assert any(e.kernel.startswith("autotune:") and e.decision.action == "fallback" for e in store.entries())
    assert not list(inductor.rglob("*.best_config"))


def test_a_tuned_runtime_step_still_saves_its_best_config(fresh: Any) -> None:
    store, inductor = fresh
    x, y = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    _compile_run(_mutating, x, y, ratio=1.0, store=store)
    assert list(inductor.rglob("*.best_config"))


@pytest.mark.parametrize("ratio, benched", [(1e-9, False), (1.0, True)])
def test_coordinate_descent_follows_the_decision(fresh: Any, ratio: float, benched: bool) -> None:
    from torch._dynamo.utils import counters

    store, _inductor = fresh
    x = torch.randn(2048, 4096, device="cuda")
    out = _compile_run(_softmax_sum, x, ratio=ratio, store=store)
    torch.testing.assert_close(out, _softmax_sum(x), atol=1e-3, rtol=1e-3)
    assert (counters["inductor"]["coordesc_tuning_bench"] > 0) is benched
