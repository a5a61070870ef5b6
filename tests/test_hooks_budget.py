"""The hooks' budget: read once per compiled graph and device, live outside a graph and on a free-memory basis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch._inductor.virtualized import V

from prescreen.budget import BASIS_ENV, MEMORY_ENV, RATIO_ENV
from prescreen.hooks import state


class _Graph:
    """Stands in for Inductor's graph (``V.graph``): any weakly referenceable object."""


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(MEMORY_ENV, "64GiB")
    monkeypatch.setenv(RATIO_ENV, "0.5")
    monkeypatch.delenv(BASIS_ENV, raising=False)
    saved = state.snapshot()
    yield
    state.restore(saved)


def test_one_graph_reads_its_budget_once_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, meta = torch.device("cpu"), torch.device("meta")
    graph = _Graph()
    with V.set_graph_handler(graph):  # type: ignore[arg-type]
        first = state.budget_for(cpu)
        monkeypatch.setenv(RATIO_ENV, "0.25")  # within one compile: the budget it started with
        assert state.budget_for(cpu) is first and first.ratio == 0.5
        assert state.budget_for(meta) is not first  # another device: its own
    with V.set_graph_handler(_Graph()):  # type: ignore[arg-type]
        assert state.budget_for(cpu).ratio == 0.25  # the next compile reads it again
    with V.set_graph_handler(graph):  # type: ignore[arg-type]
        state.configure(ratio=0.125)  # a change of the overrides empties what graphs kept
        assert state.budget_for(cpu).ratio == 0.125


def test_outside_a_graph_and_on_free_memory_the_budget_is_read_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    first = state.budget_for(cpu)
    monkeypatch.setenv(RATIO_ENV, "0.25")
    assert state.budget_for(cpu).ratio == 0.25 and first.ratio == 0.5
    reads: list[object] = []
    real = state._read_budget
    monkeypatch.setattr(state, "_read_budget", lambda device: reads.append(device) or real(device))
    monkeypatch.setenv(BASIS_ENV, "free")
    with V.set_graph_handler(_Graph()):  # type: ignore[arg-type]
        state.budget_for(cpu)
        state.budget_for(cpu)
    assert reads == [cpu, cpu]
