"""``torch.compile(model, backend="prescreen", mode=..., options=...)``: Inductor with the guards installed, ``mode``
and ``options`` applied exactly as ``torch.compile`` applies them (through ``torch._TorchCompileInductorWrapper``)."""

from __future__ import annotations

import logging
from typing import Any

import torch

#: Inductor config keys under which it benchmarks choices that prescreen guards.
AUTOTUNE_KEYS = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise")


def autotuning_on(patches: dict[str, Any]) -> bool:
    """Whether Inductor will benchmark choices under ``patches`` on top of the global config."""
    from torch._inductor import config

    return any(bool(patches.get(k, getattr(config, k, False))) for k in AUTOTUNE_KEYS)


def prescreen_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None,
                      options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Install the hooks, then compile with Inductor exactly as ``backend="inductor"`` with the same arguments."""
    from prescreen.hooks import state
    from prescreen.hooks.activation import install

    # Inductor's own compiler object for mode and options (it validates them as torch.compile does)
    compiler = torch._TorchCompileInductorWrapper(mode, options, None)  # type: ignore[no-untyped-call]
    install()
    if not autotuning_on(compiler.config):
        state.log_once("backend-no-autotune", logging.INFO,
                       "prescreen: max-autotune is off (mode=%r), so Inductor benchmarks no choices and prescreen "
                       "guards nothing in this compile; use mode='max-autotune' or options={'max_autotune': True}",
                       mode)
    return compiler(gm, example_inputs, **kwargs)
