"""AOTInductor's compile-time autotuning: one kernel's example arguments alive at a time.

``aoti_compile_and_package`` (and a GPU compile with ``cpp_wrapper``) autotunes its Triton kernels at
compile time, in a generated block that synthesizes every kernel's example arguments and, by default,
keeps each alive until its last consumer: in a star-shaped graph many kernels' arguments are alive at
once, and their sum is what ran out of memory (upstream issue 181176, >96 GB). prescreen's runtime guard
sees one kernel's benchmark at a time (its clones, the flush buffer), so it cannot count arguments that
other kernels keep alive. Where this torch has upstream's own switch for it,
``torch._inductor.config.aot_inductor.autotune_per_kernel_alloc`` (each kernel allocates its arguments,
runs, and frees them), the guards turn it on while installed, unless the user set it themselves; then
the guarded benchmark is the whole peak. Where it is missing (torch 2.11), this is logged once.
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
