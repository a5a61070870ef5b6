"""Guard torch_npu's symbolic grouped autotune with the shared decision store.

Wraps ``NPUIndexTritonKernel._disable_grouped_autotune_if_benchmark_too_large``
(``torch_npu._inductor.codegen.triton``, torch-npu 2.14). The wrapper builds a
plan from ``inductor_meta``, looks the decision up by key (computing and storing
it on a miss) and applies it as upstream does: a fallback calls the kernel's own
``_disable_grouped_autotune(inductor_meta, reason)``, after which upstream's
codegen records ``enable_auto_blockify`` for dynamic kernels. Anything our side
cannot handle calls the original method, so behaviour is never worse than upstream.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from prescreen.hooks import state
from prescreen.plan import KernelPlan
from prescreen.service import lookup_or_decide

log = logging.getLogger("prescreen.hooks")

NPU_MODULE = "torch_npu._inductor.codegen.triton"
NPU_CLASS = "NPUIndexTritonKernel"
GUARD_METHOD = "_disable_grouped_autotune_if_benchmark_too_large"
DISABLE_METHOD = "_disable_grouped_autotune"
_ORIGINAL_ATTR = "_prescreen_original_guard"


def guard(self: Any, inductor_meta: dict[str, Any], device: Any, original: Callable[..., Any]) -> None:
    """Decide from the store; apply like upstream; on any error defer to ``original``."""
    if not inductor_meta.get("group_enabled", False):
        return original(self, inductor_meta, device)
    try:
        plan = KernelPlan.from_payload(inductor_meta)
        budget = state.budget_for(device if device is not None else "npu")
        outcome = lookup_or_decide(plan, budget, state.get_store())
    except Exception as exc:  # never break a compile: upstream decides instead
        state.log_once(f"npu-error:{type(exc).__name__}", logging.WARNING,
                       "prescreen: grouped-autotune guard could not decide (%s); using torch_npu's own check", exc)
        return original(self, inductor_meta, device)
    decision = outcome.decision
    if decision.tune:
        return None
    state.log_once(outcome.key, logging.INFO, "prescreen: %s: %s [key %s, %s]", plan.display_name,
                   decision.reason, outcome.key[:12], "store hit" if outcome.hit else "computed")
    getattr(self, DISABLE_METHOD)(inductor_meta, decision.reason)
    return None


def patch_class(cls: type) -> None:
    """Wrap ``cls``'s guard method (idempotent)."""
    current = getattr(cls, GUARD_METHOD)
    if hasattr(current, _ORIGINAL_ATTR):
        return
    if not callable(getattr(cls, DISABLE_METHOD, None)):
        raise AttributeError(f"{cls.__name__} has no {DISABLE_METHOD}; torch_npu layout not recognised")

    @functools.wraps(current)
    def guarded(self: Any, inductor_meta: dict[str, Any], device: Any) -> None:
        return guard(self, inductor_meta, device, current)

    setattr(guarded, _ORIGINAL_ATTR, current)
    setattr(cls, GUARD_METHOD, guarded)


def unpatch_class(cls: type) -> None:
    """Restore ``cls``'s original guard method."""
    original = getattr(getattr(cls, GUARD_METHOD, None), _ORIGINAL_ATTR, None)
    if original is not None:
        setattr(cls, GUARD_METHOD, original)


def patch() -> bool:
    """Patch torch_npu if its Inductor codegen is already imported; True if patched."""
    module = sys.modules.get(NPU_MODULE)
    cls = getattr(module, NPU_CLASS, None) if module is not None else None
    if cls is None:
        return False
    if not hasattr(cls, GUARD_METHOD):
        log.warning("prescreen: %s.%s has no %s (torch_npu version without the grouped guard); not patched",
                    NPU_MODULE, NPU_CLASS, GUARD_METHOD)
        return False
    patch_class(cls)
    return True


def unpatch() -> None:
    module = sys.modules.get(NPU_MODULE)
    cls = getattr(module, NPU_CLASS, None) if module is not None else None
    if cls is not None:
        unpatch_class(cls)
