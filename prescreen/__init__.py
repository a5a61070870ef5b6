"""prescreen: ahead-of-time pre-screening of Inductor autotune benchmark footprints."""

from __future__ import annotations

from prescreen.budget import Budget, device_memory, parse_memory, resolve_ratio
from prescreen.decision import ESTIMATOR_VERSION, Decision, decide
from prescreen.errors import ConfigError, NotBounded, Reason
from prescreen.footprint import Footprint, estimate_footprint, required_storage_numel
from prescreen.plan import KernelPlan
from prescreen.representatives import Representatives, build_representatives

__version__ = "0.1.0"

__all__ = [
    "Budget", "ConfigError", "Decision", "ESTIMATOR_VERSION", "Footprint", "KernelPlan", "NotBounded",
    "Reason", "Representatives", "build_representatives", "decide", "device_memory", "estimate_footprint",
    "install", "uninstall", "installed", "parse_memory", "required_storage_numel", "resolve_ratio",
]


def install(**kwargs: object) -> None:
    """Activate the torch.compile hooks (see ``hooks.activation.install``)."""
    from hooks.activation import install as _install

    _install(**kwargs)  # type: ignore[arg-type]


def uninstall() -> None:
    """Remove the torch.compile hooks, restoring upstream behaviour."""
    from hooks.activation import uninstall as _uninstall

    _uninstall()


def installed(**kwargs: object) -> object:
    """Context manager: hooks active inside the ``with`` block (same options as ``install``)."""
    from hooks.activation import installed as _installed

    return _installed(**kwargs)
