"""Decision stores: the local diskcache (default), Redis, both tiered, or none.

``open_store`` picks one from its arguments and the environment:
``PRESCREEN_CACHE=0``/``off`` switches caching off; ``PRESCREEN_REDIS_URL``
adds Redis behind the local cache (``PRESCREEN_REDIS_LOCAL_TIER=0``: Redis
only); the local directory is ``default_cache_dir()`` unless given.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prescreen.errors import ConfigError
from prescreen.store.base import NullStore, Store, StoreStats
from prescreen.store.bundle import export_bundle, import_bundle
from prescreen.store.clear import verify_entry  # the predicates to select entries are in prescreen.store.clear
from prescreen.store.disk import DiskStore
from prescreen.store.entry import Entry, InvalidEntry
from prescreen.store.tiered import TieredStore
from prescreen.store.trust import default_cache_dir, resolve_size_limit

if TYPE_CHECKING:
    from prescreen.store.redis_store import RedisStore

# redis-py costs ~80 ms to import: ``RedisStore`` loads on first use, never with ``import prescreen.store``.
REDIS_URL_ENV = "PRESCREEN_REDIS_URL"  # the same name as prescreen.store.redis_store.REDIS_URL_ENV


def __getattr__(name: str) -> object:
    if name == "RedisStore":
        from prescreen.store.redis_store import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

CACHE_ENV = "PRESCREEN_CACHE"
LOCAL_TIER_ENV = "PRESCREEN_REDIS_LOCAL_TIER"
_OFF = frozenset({"0", "off", "false", "no", "disabled"})
_ON = frozenset({"", "1", "on", "true", "yes"})

__all__ = [
    "CACHE_ENV", "LOCAL_TIER_ENV", "REDIS_URL_ENV", "DiskStore", "Entry", "InvalidEntry", "NullStore", "RedisStore",
    "Store", "StoreStats", "TieredStore", "default_cache_dir", "export_bundle", "import_bundle", "open_store",
    "resolve_size_limit", "verify_entry",
]


def _switch(env: str) -> bool:
    raw = os.environ.get(env, "").strip().lower()
    if raw in _OFF:
        return False
    if raw in _ON:
        return True
    raise ConfigError(f"{env}={raw!r} is not a switch (expected 1/on or 0/off)")


def open_store(
    cache_dir: str | os.PathLike[str] | None = None,
    redis_url: str | None = None,
    size_limit: int | str | None = None,
) -> Store:
    """The configured store. Raises ``ConfigError`` only for bad settings; store faults never raise."""
    if not _switch(CACHE_ENV):
        return NullStore(detail=f"{CACHE_ENV} is off")
    url = redis_url or os.environ.get(REDIS_URL_ENV, "").strip() or None
    if url is None:
        return DiskStore(cache_dir, size_limit=size_limit)
    from prescreen.store.redis_store import RedisStore

    if not _switch(LOCAL_TIER_ENV):
        return RedisStore(url)
    local = DiskStore(cache_dir, size_limit=size_limit)
    return TieredStore(local, RedisStore(url))
