"""Recognise an out-of-memory error inside a guarded benchmark step, and clean up after it.

An OOM is any class named ``*OutOfMemoryError`` or a ``RuntimeError`` saying "out of memory", anywhere in the
cause/context chain; Triton's ``OutOfResources`` is not one (upstream treats it as an invalid config).
"""

from __future__ import annotations

import gc
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from prescreen.plan import KernelPlan

#: What a guard knows of an OOM: bytes requested, bytes free on the device, the error in one line.
Info = tuple[int | None, int | None, str]

T = TypeVar("T")

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_TRIED = re.compile(r"[Tt]ried to allocate\s+([0-9.]+)\s*(B|KiB|MiB|GiB|TiB)")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 16:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a device out-of-memory error."""
    return any(any(cls.__name__.endswith("OutOfMemoryError") for cls in type(e).__mro__)  # torch's, torch_npu's
               or (isinstance(e, RuntimeError) and "out of memory" in str(e).lower()) for e in _chain(exc))


def requested_bytes(exc: BaseException) -> int | None:
    """The allocation that failed, read off the allocator's message ("Tried to allocate 2.00 GiB"), or None."""
    for e in _chain(exc):
        match = _TRIED.search(str(e))
        if match:
            return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None


def _backend(device: Any) -> Any:
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind in ("cpu", "meta", ""):
        return None
    import torch

    return getattr(torch, kind, None)


def free_bytes(device: Any) -> int | None:
    """Free device memory now (``mem_get_info``), or None where it cannot be read."""
    try:
        backend = _backend(device)
        if backend is None or not backend.is_available():
            return None
        free, _total = backend.mem_get_info(device)
        return int(free)
    except Exception:
        return None


def release(device: Any) -> None:
    """Drop what the failed step allocated: collect its frames' tensors and return cached blocks."""
    gc.collect()
    try:
        backend = _backend(device)
        if backend is not None and backend.is_available():
            backend.synchronize(device)
            backend.empty_cache()
    except Exception:  # a failing cleanup must not hide the retry
        pass


def info(exc: BaseException, device: Any) -> Info:
    """The facts an ``observed_oom`` entry keeps: bytes requested, bytes free now, the error in one line."""
    first = (str(exc).splitlines() or [""])[0]
    return requested_bytes(exc), free_bytes(device), f"{type(exc).__name__}: {first}"[:240]


def record(plans_of: Callable[[], Sequence["KernelPlan"]], device: Any, facts: Info, what: str, then: str) -> None:
    """Store the observed OOM under each of the step's keys (never raises) and log it, with what ``then`` happens."""
    from prescreen.hooks import state
    from prescreen.service import record_observed_oom

    log = logging.getLogger("prescreen.hooks")
    requested, free, error = facts
    keys = []
    try:
        for plan in plans_of():
            outcome = record_observed_oom(plan, state.budget_for(device), state.get_store(),
                                          requested_bytes=requested, free_bytes=free, error=error)
            keys.append(outcome.key[:12])
    except Exception as exc:  # storing the fact must never break the retry
        log.warning("prescreen: could not record the observed OOM of %s (%r)", what, exc)
    log.warning("prescreen: %s ran out of memory (%s; requested %s bytes, %s free); %s; stored as "
                "observed_oom [key %s]", what, error, requested, free, then, ", ".join(keys) or "?")


def retry(run: Callable[[], T], fallback: Callable[[], T], device: Any, plans_of: Callable[[], Sequence[KernelPlan]],
          what: str, fallback_name: str) -> T:
    """``run()``; on an out-of-memory error, the step's memory released, the fact stored under ``plans_of()``,
    ``fallback()``. Any other error propagates."""
    try:
        return run()
    except Exception as exc:
        if not is_oom(exc):
            raise
        facts = info(exc, device)
    release(device)  # the failed step's frames are gone once the except block ends
    record(plans_of, device, facts, what, f"redone with {fallback_name}")
    return fallback()
