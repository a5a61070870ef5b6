"""``import torch`` entry point (group ``torch.backends``): ``PRESCREEN=1`` installs the hooks.

Kept import-free until the variable is set, and never raises: torch turns an
autoload error into a failed ``import torch``.
"""

from __future__ import annotations

import os


def autoload() -> None:
    if os.environ.get("PRESCREEN", "").strip().lower() not in ("1", "true", "yes", "on"):
        return
    try:
        from hooks.activation import install

        install(lazy=True)
    except Exception as exc:  # pragma: no cover - defensive
        import logging

        logging.getLogger("prescreen.hooks").warning("prescreen: autoload failed (%r); hooks not installed", exc)
