"""CUDA end-to-end: OOM retry, runtime-autotune guard and observed_oom entries in real compiles (skip without CUDA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)"),
]

OOM_TEXT = "CUDA out of memory. Tried to allocate 1.00 GiB"


@pytest.fixture()
def fresh(tmp_path: Path) -> Any:
    import torch._inductor.config as ic

    from prescreen.hooks import state
    from prescreen.store import DiskStore

    state.reset()
    torch._dynamo.reset()
    store = DiskStore(tmp_path / "store")
    with ic.patch(fx_graph_cache=False, autotune_local_cache=False):
        yield store
    state.reset()


def test_selection_oom_is_retried_with_aten_and_stored(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import select_algorithm as sa

    import prescreen
    from prescreen.decision import is_observed_oom

    def oom_allocation(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise torch.OutOfMemoryError(OOM_TEXT)

    monkeypatch.setattr(sa, "rand_strided", oom_allocation)
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    with prescreen.installed(store=fresh, ratio=1.0):
        y = torch.compile(lambda a, b: a @ b, dynamic=True, mode="max-autotune-no-cudagraphs")(x, w)
    torch.testing.assert_close(y, x @ w, atol=1e-2, rtol=1e-2)
    observed = [e for e in fresh.entries() if is_observed_oom(e.decision)]
    assert observed and observed[0].kernel == "select:mm"


def _pointwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(0.5).add_(y)
    return x


def test_runtime_autotune_over_budget_takes_first_config(fresh: Any) -> None:
    import prescreen

    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    ref = x.clone().mul_(0.5).add_(y)
    with prescreen.installed(store=fresh, ratio=1e-9):
        out = torch.compile(_pointwise, dynamic=True, mode="max-autotune-no-cudagraphs")(x, y)
    torch.testing.assert_close(out, ref)
    kernels = {e.kernel: e.decision.action for e in fresh.entries()}
    runtime = {k: a for k, a in kernels.items() if k.startswith("autotune:")}
    assert runtime and set(runtime.values()) == {"fallback"}, kernels


def test_runtime_autotune_oom_is_retried_and_stored(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import compile_fx

    import prescreen
    from prescreen.decision import is_observed_oom

    def oom_clone(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise torch.OutOfMemoryError(OOM_TEXT)

    monkeypatch.setattr(compile_fx, "clone_preserve_strides", oom_clone)
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    ref = x.clone().mul_(0.5).add_(y)
    with prescreen.installed(store=fresh, ratio=1.0):
        out = torch.compile(_pointwise, dynamic=True, mode="max-autotune-no-cudagraphs")(x, y)
    torch.testing.assert_close(out, ref)
    observed = [e for e in fresh.entries() if is_observed_oom(e.decision)]
    assert observed and all(e.kernel.startswith("autotune:") for e in observed)


def test_runtime_autotune_that_fits_is_looked_up_and_benchmarked(fresh: Any) -> None:
    """The pointwise kernel's runtime autotuning fits: it is looked up (a tune stored under its key) and
    benchmarked as upstream would."""
    import prescreen
    from prescreen.service import COUNTERS

    before = COUNTERS.lookups
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    ref = x.clone().mul_(0.5).add_(y)
    with prescreen.installed(store=fresh, ratio=1.0):
        out = torch.compile(_pointwise, dynamic=True, mode="max-autotune-no-cudagraphs")(x, y)
    torch.testing.assert_close(out, ref)
    assert COUNTERS.lookups > before
    tuned = [e for e in fresh.entries() if e.kernel.startswith("autotune:")]
    assert tuned and all(e.decision.tune for e in tuned)


def _epilogue(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b) * c


def _fused_benchmark_runs_out(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every fused-kernel benchmark of the scheduler raises an OOM; returns, per call, whether it came inside
    ``speedup_by_fusion`` (False: in the benchmark upstream defers until the kernels compile)."""
    import inspect

    from torch._inductor import scheduler

    where: list[bool] = []

    def oom(*args: Any, **kwargs: Any) -> Any:
        where.append(any(f.function == "speedup_by_fusion" for f in inspect.stack(0)))
        raise torch.OutOfMemoryError(OOM_TEXT)

    monkeypatch.setattr(scheduler.Scheduler, "benchmark_codegened_module", oom)
    return where


def test_deferred_fusion_benchmark_oom_is_retried_and_stored(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream benchmarks the fused template after ``speedup_by_fusion`` returns, once the kernels compile: an
    OOM there kills upstream's compile; with prescreen the kernels stay unfused and the fact is stored."""
    import torch._inductor.config as ic

    import prescreen
    from prescreen.decision import is_observed_oom
    from prescreen.hooks.oom import is_oom

    a, b, c = (torch.randn(2048, 2048, device="cuda", dtype=torch.float16) for _ in range(3))
    ref = torch.relu(a @ b) * c
    where = _fused_benchmark_runs_out(monkeypatch)
    with ic.patch(benchmark_epilogue_fusion=True):
        with pytest.raises(Exception) as upstream:  # upstream, as a differential
            torch.compile(_epilogue, mode="max-autotune-no-cudagraphs")(a, b, c)
        assert is_oom(upstream.value) and where and not any(where), where  # in the deferred benchmark
        torch._dynamo.reset()
        with prescreen.installed(store=fresh, ratio=1.0):
            out = torch.compile(_epilogue, mode="max-autotune-no-cudagraphs")(a, b, c)
    torch.testing.assert_close(out, ref, atol=1e-1, rtol=1e-2)
    observed = [e for e in fresh.entries() if is_observed_oom(e.decision)]
    assert observed and all(e.kernel.startswith("fusion:") for e in observed), [e.kernel for e in fresh.entries()]
