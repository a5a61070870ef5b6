"""A local store in front of a remote one: read-through on get, write to both on put."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prescreen.store import writer
from prescreen.store.base import Store, StoreStats
from prescreen.store.entry import Entry


class TieredStore(Store):
    """``local`` (a ``DiskStore``) first, then ``remote`` (a ``RedisStore``), filling ``local`` on a remote hit.

    Each tier handles its own faults, so a dead remote leaves a working local
    cache and a broken local one still reaches the fleet.
    """

    backend = "tiered"

    def __init__(self, local: Store, remote: Store) -> None:
        super().__init__()
        self.local, self.remote = local, remote
        self.location = f"{local.location} + {remote.location}"

    @property
    def tiers(self) -> tuple[Store, Store]:
        return self.local, self.remote

    def get(self, key: str) -> Entry | None:
        return self._get(lambda store: store.get(key), later=False)

    def lookup(self, key: str) -> Entry | None:
        """``get`` for a decision: a remote hit is copied to the local tier on the background writer."""
        return self._get(lambda store: store.lookup(key), later=True)

    def _get(self, read: Callable[[Store], Entry | None], later: bool) -> Entry | None:
        entry = read(self.local)
        if entry is None:
            entry = read(self.remote)
            if entry is not None:
                if later:
                    writer.submit(self.local, entry)
                else:
                    self.local.put(entry)
        if entry is None:
            self.misses += 1
        else:
            self.add_hits(1)
        return entry

    def put(self, entry: Entry) -> bool:
        stored_locally = self.local.put(entry)
        stored_remotely = self.remote.put(entry)
        return stored_locally or stored_remotely

    def entries(self) -> Iterator[Entry]:
        seen: set[str] = set()
        for store in self.tiers:
            for entry in store.entries():
                if entry.key not in seen:
                    seen.add(entry.key)
                    yield entry

    def delete(self, keys: list[str]) -> int:
        """Removes from both tiers; returns the larger of the two counts."""
        return max(self.local.delete(keys), self.remote.delete(keys))

    def clear_all(self) -> int:
        return max(self.local.clear_all(), self.remote.clear_all())

    def stats(self) -> StoreStats:
        local, remote = self.local.stats(), self.remote.stats()
        detail = (
            f"local {local.backend}: {local.entries} entries ({local.detail}); "
            f"remote {remote.backend}: {remote.entries} entries ({remote.detail})"
        )
        return StoreStats(
            self.backend,
            self.location,
            max(local.entries, remote.entries),
            local.size_bytes,
            self.hits,
            self.misses,
            local.healthy and remote.healthy,
            detail,
        )

    def close(self) -> None:
        writer.flush(self, writer.EXIT_FLUSH_SECONDS)  # the puts queued through this store, then each tier's own
        self.local.close()
        self.remote.close()
