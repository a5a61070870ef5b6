"""``torch.compile(model, backend="prescreen")``: Inductor with the guards installed."""

from __future__ import annotations

from typing import Any

import torch


def prescreen_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """Install the hooks, then compile with Inductor exactly as ``backend="inductor"``."""
    from torch._inductor.compile_fx import compile_fx

    from prescreen.hooks.activation import install

    install()
    return compile_fx(gm, example_inputs, **kwargs)
