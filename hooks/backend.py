"""``torch.compile(model, backend="prescreen", mode=..., options=...)``: Inductor with the guards installed.

Accepts what ``backend="inductor"`` accepts: ``mode`` and ``options`` are
applied exactly as ``torch.compile`` applies them for Inductor (through the
same ``torch._TorchCompileInductorWrapper``), then the compile runs with the
guards on.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("prescreen.hooks")

#: Inductor config keys under which it benchmarks choices that prescreen guards.
AUTOTUNE_KEYS = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise")


def _inductor(mode: str | None, options: dict[str, Any] | None) -> Any:
    """Inductor's own compiler object for ``mode`` and ``options`` (validates them as torch.compile does)."""
    wrapper_cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper_cls is None:  # pragma: no cover - present in torch 2.11 to 2.14
        raise RuntimeError(f"torch {torch.__version__} has no _TorchCompileInductorWrapper; "
                           "use backend='inductor' with PRESCREEN=1 or prescreen.install()")
    return wrapper_cls(mode, options, None)


def autotuning_on(patches: dict[str, Any]) -> bool:
    """Whether Inductor will benchmark choices under ``patches`` on top of the global config."""
    from torch._inductor import config

    return any(bool(patches.get(k, getattr(config, k, False))) for k in AUTOTUNE_KEYS)


def prescreen_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None,
                      options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Install the hooks, then compile with Inductor exactly as ``backend="inductor"`` with the same arguments."""
    from prescreen.hooks import state
    from prescreen.hooks.activation import install

    compiler = _inductor(mode, options)
    install()
    if not autotuning_on(compiler.config):
        state.log_once("backend-no-autotune", logging.INFO,
                       "prescreen: max-autotune is off (mode=%r), so Inductor benchmarks no choices and prescreen "
                       "guards nothing in this compile; use mode='max-autotune' or options={'max_autotune': True}",
                       mode)
    return compiler(gm, example_inputs, **kwargs)
