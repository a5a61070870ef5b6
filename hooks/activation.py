"""Turn the hooks on and off: ``install()``, ``uninstall()``, ``installed()``, ``PRESCREEN=1``."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from types import ModuleType

from prescreen.hooks import import_hook, npu, select_algorithm, state
from prescreen.store.base import Store

log = logging.getLogger("prescreen.hooks")

ENABLE_ENV = "PRESCREEN"
SELECT_MODULE = "torch._inductor.select_algorithm"

_lock = threading.RLock()
_active = False


def _patch_select(_module: ModuleType) -> None:
    select_algorithm.patch()


def _patch_npu(_module: ModuleType) -> None:
    npu.patch()


def install(
    *,
    store: Store | None = None,
    device_memory: str | int | None = None,
    ratio: float | None = None,
    lazy: bool = False,
) -> None:
    """Activate the guards (idempotent, thread-safe).

    The Inductor guard is applied now (or, with ``lazy``, when Inductor's
    ``select_algorithm`` is first imported); the torch_npu guard whenever
    ``torch_npu._inductor.codegen.triton`` is imported. Explicit ``store``,
    ``device_memory`` and ``ratio`` override the environment.
    """
    global _active
    with _lock:
        state.configure(store=store, device_memory=device_memory, ratio=ratio)
        if _active:
            return
        if not lazy:
            import torch._inductor.select_algorithm  # noqa: F401
        import_hook.when_imported(SELECT_MODULE, _patch_select)
        import_hook.when_imported(npu.NPU_MODULE, _patch_npu)
        _active = True


def uninstall() -> None:
    """Restore upstream behaviour everywhere (idempotent)."""
    global _active
    with _lock:
        import_hook.forget(SELECT_MODULE)
        import_hook.forget(npu.NPU_MODULE)
        select_algorithm.unpatch()
        npu.unpatch()
        _active = False


def is_installed() -> bool:
    return _active


@contextlib.contextmanager
def installed(**kwargs: object) -> Iterator[None]:
    """Hooks active inside the block; left as they were found afterwards."""
    was_active = is_installed()
    install(**kwargs)  # type: ignore[arg-type]
    try:
        yield
    finally:
        if not was_active:
            uninstall()
