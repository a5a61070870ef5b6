"""AOTInductor's compile-time autotuning: one kernel's example arguments alive at a time.

By default AOTInductor keeps every kernel's example arguments alive until their last consumer (upstream issue
181176, >96 GB), which the per-benchmark guard cannot count: while installed, the guards turn on upstream's
``aot_inductor.autotune_per_kernel_alloc`` unless the user set it (a torch without it is logged).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("prescreen.hooks")

SETTING = "autotune_per_kernel_alloc"
_NOT_SET = object()
_saved: Any = _NOT_SET  # the value before install, while prescreen holds the setting
#: The value ``unpatch`` gave back, where it was the default: giving it back marks it set in torch's config, so a
#: later install would otherwise take it for the user's own choice.
_given_back: Any = _NOT_SET


def patch() -> bool:
    """Turn on per-kernel allocation of AOTInductor's autotune arguments; True if this torch has the switch."""
    global _saved
    import torch
    from torch._inductor import config

    aoti = getattr(config, "aot_inductor", None)
    if aoti is None or not hasattr(aoti, SETTING):
        log.info("prescreen: torch %s has no aot_inductor.%s: AOTInductor's compile-time autotuning keeps the "
                 "example arguments of several kernels alive at once, which the runtime guard does not count",
                 torch.__version__, SETTING)
        return False
    is_default: Any = getattr(config, "_is_default", lambda _name: True)
    current = getattr(aoti, SETTING)
    if _saved is _NOT_SET and (is_default(f"aot_inductor.{SETTING}") or current is _given_back):
        _saved = current
        setattr(aoti, SETTING, True)
    return True


def unpatch() -> None:
    """Give the setting back as it was."""
    global _saved, _given_back
    if _saved is _NOT_SET:
        return
    from torch._inductor import config

    setattr(config.aot_inductor, SETTING, _saved)
    _saved, _given_back = _NOT_SET, _saved
