"""Process-wide hook state: the store, the budget per device, warn-once logging."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from prescreen.budget import Budget
from prescreen.service import COUNTERS, Counters
from prescreen.store.base import Store

log = logging.getLogger("prescreen.hooks")

_lock = threading.RLock()
_store: Store | None = None
_store_opened = False
_store_owned = False  # True only for a store get_store opened itself; a caller's store is the caller's to close
_overrides: dict[str, object] = {}
_logged: set[str] = set()


def configure(*, store: Store | None = None, device_memory: str | int | None = None, ratio: float | None = None) -> None:
    """Set an explicit store / memory / ratio for the hooks (``prescreen warm`` does)."""
    global _store, _store_opened, _store_owned
    with _lock:
        if store is not None:
            _store, _store_opened, _store_owned = store, True, False
        if device_memory is not None:
            _overrides["device_memory"] = device_memory
        if ratio is not None:
            _overrides["ratio"] = ratio


Snapshot = tuple[Store | None, bool, bool, dict[str, object]]


def snapshot() -> Snapshot:
    """The store and overrides as they are now (for ``installed()`` to restore)."""
    with _lock:
        return _store, _store_opened, _store_owned, dict(_overrides)


def restore(saved: Snapshot) -> None:
    """Put back a :func:`snapshot`; closes a store opened since that the snapshot does not hold."""
    global _store, _store_opened, _store_owned
    with _lock:
        if _store is not None and _store_owned and _store is not saved[0]:
            _store.close()
        _store, _store_opened, _store_owned = saved[0], saved[1], saved[2]
        _overrides.clear()
        _overrides.update(saved[3])


def reset() -> None:
    """Forget the store and overrides (the next lookup reopens from the environment)."""
    global _store, _store_opened, _store_owned
    with _lock:
        if _store is not None and _store_owned:
            _store.close()
        _store, _store_opened, _store_owned = None, False, False
        _overrides.clear()
        _logged.clear()


def get_store() -> Store | None:
    """The store the hooks use; opened once from the environment. None if it cannot be opened."""
    global _store, _store_opened, _store_owned
    with _lock:
        if not _store_opened:
            _store_opened = True
            try:
                from prescreen.store import open_store

                _store, _store_owned = open_store(), True
            except Exception as exc:  # a broken store never breaks a compile
                log.warning("prescreen: decision store unavailable (%s); deciding without a store", exc)
                _store = None
        return _store


def budget_for(device: object) -> Budget:
    """The budget for ``device`` with the configured overrides, read at every guarded step (the environment, a
    per-process memory fraction or free memory may change between steps); may raise ConfigError."""
    return Budget.for_device(device, _overrides.get("device_memory"), _overrides.get("ratio"))  # type: ignore[arg-type]


def overrides() -> tuple[float | None, int | None]:
    """prescreen's own (ratio, device memory) from ``configure`` or the environment, None where unset; may raise
    ConfigError."""
    from prescreen.budget import memory_override, ratio_override

    return (
        ratio_override(_overrides.get("ratio")),  # type: ignore[arg-type]
        memory_override(_overrides.get("device_memory")),  # type: ignore[arg-type]
    )


_planning = False


@contextlib.contextmanager
def planning(on: bool = True) -> Iterator[None]:
    """Inside the block (``warm --plan-only``), every guard decides and records as usual but benchmarks
    nothing: it hands upstream its fallback whatever the decision."""
    global _planning
    was, _planning = _planning, _planning or on
    try:
        yield
    finally:
        _planning = was


def plan_only() -> bool:
    """True inside :func:`planning`."""
    return _planning


def log_once(key: str, level: int, msg: str, *args: object) -> None:
    """Log a decision diagnostic once per key per process."""
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, msg, *args)


def counters() -> Counters:
    """Lookups, hits and estimator calls in this process."""
    return COUNTERS
