"""The store used when caching is switched off (``PRESCREEN_CACHE=0``)."""

from __future__ import annotations

from collections.abc import Iterator

from prescreen.store.base import Store, StoreStats
from prescreen.store.entry import Entry


class NullStore(Store):
    """Every get misses, every put is refused; nothing is ever kept."""

    backend = "off"

    def __init__(self, location: str = "disabled", detail: str = "caching is switched off") -> None:
        super().__init__()
        self.location = location
        self.detail = detail

    def get(self, key: str) -> Entry | None:
        self.misses += 1
        return None

    @property
    def writable(self) -> bool:
        return False

    def put(self, entry: Entry) -> bool:
        return False

    def entries(self) -> Iterator[Entry]:
        return iter(())

    def delete(self, keys: list[str]) -> int:
        return 0

    def stats(self) -> StoreStats:
        return StoreStats(self.backend, self.location, 0, None, self.hits, self.misses, True, self.detail)
