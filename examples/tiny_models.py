"""Small real models for ``prescreen warm`` and the end-to-end tests.

Each target takes its dynamic sizes (and ``device``) as keyword arguments and
returns ``(model, example_inputs)``.
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 64, d_hidden: int = 256, d_out: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Block(nn.Module):
    """A pre-norm transformer block: attention + MLP."""

    def __init__(self, d_model: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def _seeded() -> None:
    torch.manual_seed(0)


def mlp(batch: int = 8, device: str = "cpu") -> tuple[nn.Module, tuple[torch.Tensor]]:
    """An MLP over ``batch`` rows of 64 features."""
    _seeded()
    model = MLP().to(device).eval()
    return model, (torch.randn(batch, 64, device=device),)


def block(batch: int = 2, seq: int = 16, device: str = "cpu") -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A transformer block over ``batch`` sequences of ``seq`` tokens."""
    _seeded()
    model = Block().to(device).eval()
    return model, (torch.randn(batch, seq, 64, device=device),)


class PairBmm(nn.Module):
    """A batched matmul of two inputs viewed as (batch, 64, 48) @ (batch, 48, 32).

    The views keep the inner sizes static under ``dynamic=True``, so on CPU Inductor
    offers its C++ bmm template beside ATen and autotunes them without ``freezing``:
    the compile is one torch's FX graph and AOTAutograd caches keep.
    """

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a.view(-1, 64, 48), b.view(-1, 48, 32)).relu()


def pair_bmm(batch: int = 8, device: str = "cpu") -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``PairBmm`` over ``batch`` pairs."""
    _seeded()
    return PairBmm().to(device).eval(), (torch.randn(batch, 64 * 48, device=device),
                                         torch.randn(batch, 48 * 32, device=device))
