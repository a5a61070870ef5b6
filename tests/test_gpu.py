"""CUDA end-to-end: the select-algorithm guard inside a real max-autotune compile (skips without CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)"),
]


def test_tiny_ratio_falls_back_to_aten_and_matches_eager(tmp_path) -> None:
    import prescreen
    from prescreen.hooks import state
    from prescreen.store import DiskStore

    state.reset()
    store = DiskStore(tmp_path / "store")
    before = state.counters().fell_back
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    torch._dynamo.reset()
    with prescreen.installed(store=store, ratio=1e-6):
        y = torch.compile(lambda a, b: a @ b, dynamic=True, mode="max-autotune-no-cudagraphs")(x, w)
    torch.testing.assert_close(y, x @ w, atol=1e-2, rtol=1e-2)
    assert state.counters().fell_back > before
    assert any(e.decision.action == "fallback" for e in store.entries())


def test_budget_honours_per_process_memory_fraction() -> None:
    from prescreen.budget import device_memory

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    try:
        assert device_memory(torch.device("cuda", 0)).total_bytes == int(total * 0.5)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
