"""The hooks' budget: read at every guarded step, from the environment unless ``configure`` overrides it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from prescreen.budget import BASIS_ENV, MEMORY_ENV, RATIO_ENV
from prescreen.hooks import state


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(MEMORY_ENV, "64GiB")
    monkeypatch.setenv(RATIO_ENV, "0.5")
    monkeypatch.delenv(BASIS_ENV, raising=False)
    saved = state.snapshot()
    yield
    state.restore(saved)


def test_the_budget_follows_the_environment_and_the_configured_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    first = state.budget_for(cpu)
    assert (first.total_memory, first.ratio) == (64 * 2**30, 0.5)
    monkeypatch.setenv(RATIO_ENV, "0.25")
    assert state.budget_for(cpu).ratio == 0.25  # the next step reads it again
    state.configure(ratio=0.125, device_memory="1GiB")
    assert (state.budget_for(cpu).total_memory, state.budget_for(cpu).ratio) == (2**30, 0.125)
