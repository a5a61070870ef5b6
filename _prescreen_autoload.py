"""prescreen's ``import torch`` entry point (group ``torch.backends``): ``PRESCREEN=1`` installs the hooks.

torch calls :func:`autoload` at the end of every ``import torch`` in an
environment where prescreen is installed, and turns any exception, including
one raised while importing the entry point's module, into a failed ``import
torch``. So this is a top-level module with a name no project uses: were it
``prescreen.hooks.autoload``, a ``prescreen`` package or module in the user's
working directory would shadow ours and break every ``import torch``. It
imports only the standard library, does nothing unless ``PRESCREEN`` is set to
a true value, and never raises.
"""

from __future__ import annotations

import os

ENABLE_ENV = "PRESCREEN"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def enabled() -> bool:
    """True when ``$PRESCREEN`` asks for the hooks."""
    return os.environ.get(ENABLE_ENV, "").strip().lower() in _TRUE


def autoload() -> None:
    """Install the hooks (lazily) when ``PRESCREEN`` is set; otherwise do nothing.

    A value that is neither on nor off (``PRESCREEN=banana``) leaves the guards off and says so in one
    line on stderr, written directly: logging is not configured this early in a process.
    """
    try:
        if not enabled():
            raw = os.environ.get(ENABLE_ENV, "")
            if raw.strip().lower() not in _FALSE:
                import sys

                sys.stderr.write(f"prescreen: {ENABLE_ENV}={raw!r} is not one of 1, true, yes, on (or 0, false, no, "
                                 "off); the guards stay off\n")
            return
        from prescreen.hooks.activation import install

        install(lazy=True)
    except Exception as exc:  # never fail ``import torch``
        try:
            import logging

            logging.getLogger("prescreen.hooks").warning("prescreen: autoload failed (%r); hooks not installed", exc)
        except Exception:  # pragma: no cover - logging itself broken
            pass
