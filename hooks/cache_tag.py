"""prescreen's budget in torch's own cache keys (``torch.compiler.config.cache_key_tag``).

A guarded compile's output depends on prescreen's budget: a selection that fell
back to ATen, an epilogue left unfused, a runtime kernel left at its first
config. Torch's caches (FX graph, AOTAutograd, the mega-cache built from them,
the runtime autotune cache) key by the graph and the tag, never by device
memory, so without this a fallback decided under one budget would be served to
every later process sharing the cache dir, whatever its budget.

While the guards are installed, each Inductor compile starts by appending
``prescreen-<digest>`` to the tag (after the user's own tag, which is kept):
the digest covers what decides a fallback: the budget basis, the effective
device memory (after overrides and a per-process memory fraction), the ratio,
the estimator and key schema versions, the libraries a decision depends on, and
the bucketing scheme. A process with another budget gets other keys and
compiles (and decides) for itself; a process without prescreen gets the user's
tag alone. The runtime autotune cache's best configs are the exception (see
``patch``): they are only ever real winners, and keyed by the user's tag.

``PRESCREEN_BUDGET_BASIS=free``: the digest holds the basis, not the free bytes
(they change from one compile to the next, so no compile would ever hit). A
fallback decided under memory pressure may then be reused from torch's caches
by a later process of the same tag: that costs speed, never an OOM, since a
cache hit runs no benchmark at all.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("prescreen.hooks")

MODULE = "torch._inductor.compile_fx"
PREFIX = "prescreen-"
_SEPARATOR = "+"
_ORIGINAL_ATTR = "_prescreen_original_compile_fx"
_lock = threading.Lock()


def digest(parts: dict[str, object]) -> str:
    """``prescreen-`` and 12 hex digits of the canonical JSON of ``parts``."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()[:12]


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


def tagged(tag: str, ours: str) -> str:
    """The user's part of ``tag`` with ``ours`` appended (never replacing it)."""
    own = user_tag(tag)
    return f"{own}{_SEPARATOR}{ours}" if own else ours


def device_of(inputs: Iterable[Any]) -> Any:
    """The device of the first tensor among a graph's example inputs (CPU where there is none)."""
    import torch

    for value in inputs:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def apply(device: object) -> str:
    """Set the tag for a compile on ``device``; returns prescreen's part ("" where the budget cannot be read)."""
    from torch.compiler import config

    try:
        ours = digest(parts_for(device))
    except Exception as exc:  # a bad setting is reported by the guard that reads it; never break a compile
        log.debug("prescreen: no budget tag for %s (%r)", device, exc)
        ours = PREFIX + "unbudgeted"
    with _lock:
        config.cache_key_tag = tagged(config.cache_key_tag, ours)
    return ours


def clear() -> None:
    """Give the tag back as the user set it."""
    from torch.compiler import config

    with _lock:
        config.cache_key_tag = user_tag(config.cache_key_tag)


def current() -> str:
    """prescreen's part of the tag now ("" when there is none)."""
    from torch.compiler import config

    tail = config.cache_key_tag.rpartition(_SEPARATOR)[2]
    return tail if tail.startswith(PREFIX) else ""


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def tagged_compile_fx(model: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            apply(device_of(example_inputs))
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

    The runtime autotune cache's key (``AutotuneCache._prepare_key``) keeps the user's tag alone. Its key
    is made where a kernel is loaded, which is a compile worker for a fresh compile (its tag is the one
    the pool started with) and the compiling process for an FX-cache hit: with prescreen's part in one
    and not the other, a replica would never find a best config its warm saved. Leaving prescreen's part
    out is safe because a best config is only ever a benchmark's real winner (a runtime fallback is never
    saved: ``triton_autotune``), which any budget may run: reading it benchmarks nothing.
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
    """Restore ``compile_fx`` and the user's tag."""
    import sys

    module: Any = sys.modules.get(MODULE)
    if module is not None:
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
        clear()
