"""Turn the hooks on and off: ``install()``, ``uninstall()``, ``installed()``, ``PRESCREEN=1``."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from prescreen.hooks import import_hook

if TYPE_CHECKING:  # the guards and the store load when first needed: PRESCREEN=1 keeps ``import torch`` light
    from prescreen.store.base import Store

log = logging.getLogger("prescreen.hooks")

ENABLE_ENV = "PRESCREEN"
VERBOSE_ENV = "PRESCREEN_VERBOSE"
SELECT_MODULE = "torch._inductor.select_algorithm"
COMPILE_FX_MODULE = "torch._inductor.compile_fx"  # == prescreen.hooks.cache_tag.MODULE
NPU_MODULE = "torch_npu._inductor.codegen.triton"  # == prescreen.hooks.npu.NPU_MODULE
NPU_RUNTIME_MODULE = "torch_npu._inductor.runtime.triton_heuristics"  # == prescreen.hooks.npu.RUNTIME_MODULE
#: The modules whose import applies a guard (``_patch``).
WATCHED = (SELECT_MODULE, COMPILE_FX_MODULE, NPU_MODULE, NPU_RUNTIME_MODULE)

_lock = threading.RLock()
_active = False
_summary_registered = False


def verbose() -> bool:
    """True when ``$PRESCREEN_VERBOSE`` asks for the exit summary."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def summary_line() -> str:
    """One line: what the guards did in this process."""
    from prescreen.hooks import state

    c = state.counters()
    return (f"prescreen: {c.lookups} lookups, {c.hits} store hits, {c.estimator_calls} computed, "
            f"{c.fell_back} fallbacks, {c.seconds * 1000:.1f} ms in prescreen")


def _handled(logger: logging.Logger, level: int) -> bool:
    """Whether a record at ``level`` on ``logger`` reaches a handler (logging is configured for it)."""
    if not logger.isEnabledFor(level):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        if any(level >= handler.level for handler in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


def _log_summary() -> None:
    """The exit summary ``PRESCREEN_VERBOSE`` asks for: logged where logging would show it, else on stderr."""
    try:
        if verbose():
            if _handled(log, logging.INFO):
                log.info("%s", summary_line())
            else:
                sys.stderr.write(summary_line() + "\n")
                sys.stderr.flush()
    except Exception:  # pragma: no cover - logging at exit must never raise
        pass


def _patch(module: ModuleType) -> None:
    """Patch what prescreen guards in ``module``, right after its import (the guards load only now)."""
    from prescreen.hooks import aoti, cache_tag, inductor_select, npu

    if module.__name__ == SELECT_MODULE:
        inductor_select.patch()
    elif module.__name__ == COMPILE_FX_MODULE:
        cache_tag.patch(module)
        aoti.patch()
    elif module.__name__ == NPU_MODULE:
        npu.patch()
    else:
        npu.patch_runtime()


def install(
    *,
    store: Store | None = None,
    device_memory: str | int | None = None,
    ratio: float | None = None,
    lazy: bool = False,
) -> None:
    """Activate the guards (idempotent, thread-safe); ``store``, ``device_memory``, ``ratio`` override the environment.
    Each guard is applied when its module is imported (Inductor's now, unless ``lazy``); the store and library
    versions are read now too, not in the first compile (``lazy``, the ``import torch`` autoload: at first use)."""
    global _active, _summary_registered
    with _lock:
        if store is not None or device_memory is not None or ratio is not None:
            from prescreen.hooks import state

            state.configure(store=store, device_memory=device_memory, ratio=ratio)
        if _active:
            return
        if not lazy:
            import torch._inductor.select_algorithm  # noqa: F401
        for name in WATCHED:
            import_hook.when_imported(name, _patch)
        _active = True
        log.info("prescreen: guards installed (Inductor algorithm selection and torch_npu grouped autotune%s)%s",
                 ", patched when first imported" if lazy else "",
                 "" if verbose() else f"; {VERBOSE_ENV}=1 logs a summary at exit")
        if not _summary_registered:
            atexit.register(_log_summary)
            _summary_registered = True
        if not lazy:
            from prescreen.hooks import state
            from prescreen.key import library_versions

            state.get_store()
            library_versions()


def uninstall() -> None:
    """Restore upstream behaviour everywhere (idempotent)."""
    global _active
    from prescreen.hooks import aoti, cache_tag, inductor_select, npu

    with _lock:
        for name in WATCHED:
            import_hook.forget(name)
        cache_tag.unpatch()
        aoti.unpatch()
        inductor_select.unpatch()
        npu.unpatch()
        _active = False


def is_installed() -> bool:
    return _active


@contextlib.contextmanager
def installed(
    *,
    store: Store | None = None,
    device_memory: str | int | None = None,
    ratio: float | None = None,
    lazy: bool = False,
) -> Iterator[None]:
    """Hooks active inside the block (call the compiled model inside it: ``torch.compile`` compiles at the first
    call); afterwards everything is exactly as it was, overrides and store included."""
    from prescreen.hooks import state

    with _lock:
        was_active = is_installed()
        saved = state.snapshot()
        install(store=store, device_memory=device_memory, ratio=ratio, lazy=lazy)
    try:
        yield
    finally:
        with _lock:
            if not was_active:
                uninstall()
            state.restore(saved)
