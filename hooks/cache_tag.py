"""prescreen's budget in torch's own cache keys (``torch.compiler.config.cache_key_tag``).

A guarded compile's output depends on the budget, and torch's caches (FX graph, AOTAutograd, mega-cache) key by
graph and tag, never by device memory. So while the guards are installed each Inductor compile appends
``prescreen-<digest>`` of what decides a fallback (basis, memory, ratio, versions, bucketing) to the user's tag.
With ``PRESCREEN_BUDGET_BASIS=free`` it holds the basis, not the free bytes: a fallback decided under memory
pressure may be reused, which costs speed, never an OOM.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("prescreen.hooks")

MODULE = "torch._inductor.compile_fx"
PREFIX = "prescreen-"
_SEPARATOR = "+"
_ORIGINAL_ATTR = "_prescreen_original_compile_fx"
_lock = threading.Lock()


def parts_for(device: object) -> dict[str, object]:
    """What decides a fallback on ``device`` in this process (may raise ConfigError on a bad setting)."""
    from prescreen import families
    from prescreen.budget import budget_basis
    from prescreen.decision import ESTIMATOR_VERSION
    from prescreen.hooks import state
    from prescreen.key import SCHEMA_VERSION, library_versions

    basis = budget_basis()
    budget = state.budget_for(device)
    return {
        "basis": basis,
        "device": budget.device_kind,
        "memory": "free" if basis == "free" else budget.total_memory,
        "ratio": repr(float(budget.ratio)),
        "estimator": ESTIMATOR_VERSION,
        "schema": SCHEMA_VERSION,
        "libraries": [list(v) for v in library_versions()],
        "scheme": str(families.active_scheme()),
    }


def user_tag(tag: str) -> str:
    """``tag`` without prescreen's part: the user's own tag."""
    head, sep, tail = tag.rpartition(_SEPARATOR)
    if tail.startswith(PREFIX):
        return head if sep else ""
    return tag


def apply(device: object) -> str:
    """Set the tag for a compile on ``device``; returns prescreen's part (``prescreen-unbudgeted`` where the
    budget cannot be read: a bad setting is reported by the guard that reads it)."""
    from torch.compiler import config

    try:
        text = json.dumps(parts_for(device), sort_keys=True, separators=(",", ":"))
        ours = PREFIX + hashlib.sha256(text.encode()).hexdigest()[:12]
    except Exception as exc:  # never break a compile
        log.debug("prescreen: no budget tag for %s (%r)", device, exc)
        ours = PREFIX + "unbudgeted"
    with _lock:
        own = user_tag(config.cache_key_tag)
        config.cache_key_tag = f"{own}{_SEPARATOR}{ours}" if own else ours
    return ours


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def tagged_compile_fx(model: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        try:
            apply(next((v.device for v in example_inputs if isinstance(v, torch.Tensor)), torch.device("cpu")))
        except Exception as exc:  # never break a compile
            log.debug("prescreen: budget tag not set (%r)", exc)
        return original(model, example_inputs, *args, **kwargs)

    setattr(tagged_compile_fx, _ORIGINAL_ATTR, original)
    return tagged_compile_fx


def _wrap_best_config_key(original: Callable[[str], str]) -> Callable[[str], str]:
    def prepare_key(filename: str) -> str:
        from torch.compiler import config

        tag = config.cache_key_tag
        own = user_tag(tag)
        if own == tag:
            return original(filename)
        with _lock:
            config.cache_key_tag = own
            try:
                return original(filename)
            finally:
                config.cache_key_tag = tag

    setattr(prepare_key, _ORIGINAL_ATTR, original)
    return prepare_key


def patch(module: Any) -> None:
    """Wrap ``compile_fx`` (the Inductor backend and AOTInductor's entry, before any cache key is made).

    ``AutotuneCache._prepare_key`` keeps the user's tag alone: that key is made in a compile worker (the pool's
    tag) or, on an FX-cache hit, in this process, so a replica would otherwise miss the best configs its warm
    saved. A best config is only ever a real winner (a fallback is never saved), which any budget may run.
    """
    current_fn = getattr(module, "compile_fx", None)
    if current_fn is None:
        log.warning("prescreen: this torch has no torch._inductor.compile_fx.compile_fx; torch's cache keys "
                    "do not hold prescreen's budget")
        return
    if not hasattr(current_fn, _ORIGINAL_ATTR):
        module.compile_fx = _wrap(current_fn)
    try:
        from torch._inductor.runtime.autotune_cache import AutotuneCache
    except ImportError:
        return
    key_fn = AutotuneCache.__dict__.get("_prepare_key")
    if isinstance(key_fn, staticmethod) and not hasattr(key_fn.__func__, _ORIGINAL_ATTR):
        setattr(AutotuneCache, "_prepare_key", staticmethod(_wrap_best_config_key(key_fn.__func__)))  # noqa: B010


def unpatch() -> None:
    """Restore ``compile_fx``, the runtime autotune cache's key and the user's tag."""
    module: Any = sys.modules.get(MODULE)
    original = getattr(getattr(module, "compile_fx", None), _ORIGINAL_ATTR, None)
    if original is not None:
        module.compile_fx = original
    cache_module: Any = sys.modules.get("torch._inductor.runtime.autotune_cache")
    if cache_module is not None:
        key_fn = cache_module.AutotuneCache.__dict__.get("_prepare_key")
        original_key = getattr(getattr(key_fn, "__func__", None), _ORIGINAL_ATTR, None)
        if original_key is not None:
            cache_module.AutotuneCache._prepare_key = staticmethod(original_key)
    if "torch.compiler" in sys.modules:
        from torch.compiler import config

        with _lock:
            config.cache_key_tag = user_tag(config.cache_key_tag)
