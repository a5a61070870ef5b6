"""prescreen: ahead-of-time pre-screening of Inductor autotune benchmark footprints.

Public names load on first use (PEP 562): ``import prescreen`` and its entry points cost only the stdlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {name: f"prescreen.{module}" for module, names in {
    "budget": ("Budget", "device_memory", "parse_memory", "resolve_ratio"),
    "decision": ("ESTIMATOR_VERSION", "Decision", "decide"),
    "errors": ("ConfigError", "NotBounded", "Reason"),
    "footprint": ("Footprint", "estimate_footprint", "required_storage_numel"),
    "plan": ("KernelPlan",),
    "representatives": ("Representatives", "build_representatives"),
    "hooks.activation": ("install", "uninstall", "installed"),
    "artifact": ("load",),
}.items() for name in names}

__all__ = [
    "Budget", "ConfigError", "Decision", "ESTIMATOR_VERSION", "Footprint", "KernelPlan", "NotBounded",
    "Reason", "Representatives", "build_representatives", "decide", "device_memory", "estimate_footprint",
    "install", "installed", "load", "parse_memory", "required_storage_numel", "resolve_ratio", "uninstall",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from prescreen.artifact import load
    from prescreen.budget import Budget, device_memory, parse_memory, resolve_ratio
    from prescreen.decision import ESTIMATOR_VERSION, Decision, decide
    from prescreen.errors import ConfigError, NotBounded, Reason
    from prescreen.footprint import Footprint, estimate_footprint, required_storage_numel
    from prescreen.hooks.activation import install, installed, uninstall
    from prescreen.plan import KernelPlan
    from prescreen.representatives import Representatives, build_representatives


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prescreen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
