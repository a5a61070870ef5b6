"""Targets whose graph does not serve every family: ``warm --plan-only`` must lower some sizes again."""

from __future__ import annotations

import torch
from tiny_models import PairBmm, pair_bmm
from torch import nn


class Branchy(nn.Module):
    """``PairBmm`` that takes another path above 8 pairs: Dynamo guards on the batch."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = PairBmm()(a, b)
        return out * 2 if a.shape[0] > 8 else out


def branchy_bmm(batch: int = 8, device: str = "cpu") -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    _, inputs = pair_bmm(batch, device)
    return Branchy(), inputs


def tied_bmm(batch: int = 8, device: str = "cpu") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A third input of ``batch + 1`` rows: a size that follows the batch without being it."""
    model, inputs = pair_bmm(batch, device)
    extra = torch.zeros(batch + 1, device=device)
    return (lambda a, b, c: model(a, b) + c.sum()), (*inputs, extra)


class Normed(nn.Module):
    """``PairBmm`` then a layer norm: its ``eps`` becomes a float symbol under ``dynamic=True``, with guards."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.norm(PairBmm()(a, b))


def normed_bmm(batch: int = 8, device: str = "cpu") -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    _, inputs = pair_bmm(batch, device)
    return Normed().to(device).eval(), inputs
