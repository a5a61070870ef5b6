"""A local store in front of a remote one: read-through on get, write to both on put. A remote is where other
replicas' observed OOMs arrive: a local ``tune`` is rechecked against it every ``recheck_seconds`` (``get``:
always), and a stricter remote entry replaces it; a local fallback is served without asking."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from prescreen.store.base import Store, StoreStats
from prescreen.store.entry import Entry, outranks

RECHECK_SECONDS = 5.0
_MAX_CHECKED = 65536  # keys whose last check is remembered (all forgotten past this: each is checked again)


class TieredStore(Store):
    """``local`` first, then ``remote``, filling ``local`` on a remote hit. Each tier handles its own faults, so
    a dead remote leaves a working local cache and a broken local one still reaches the fleet."""

    backend = "tiered"

    def __init__(self, local: Store, remote: Store, *, recheck_seconds: float = RECHECK_SECONDS) -> None:
        super().__init__()
        self.local, self.remote = local, remote
        self.location = f"{local.location} + {remote.location}"
        self.recheck_seconds = recheck_seconds
        self._checked: dict[str, float] = {}  # key -> when the remote was last read for it

    @property
    def writable(self) -> bool:
        return self.local.writable or self.remote.writable

    def get(self, key: str) -> Entry | None:
        return self._get(key, lambda store: store.get(key), 0.0)

    def lookup(self, key: str) -> Entry | None:
        """``get`` for a decision: a local ``tune`` is checked against the remote every ``recheck_seconds``."""
        return self._get(key, lambda store: store.lookup(key), self.recheck_seconds)

    def _get(self, key: str, read: Callable[[Store], Entry | None], recheck: float) -> Entry | None:
        entry = read(self.local)
        if entry is None:
            entry = read(self.remote)
            self._mark(key)
            if entry is not None:
                self.local.put(entry)  # a put, once per key (about 0.1 ms)
        elif entry.decision.tune and self._due(key, recheck):
            remote = read(self.remote)
            if remote is not None and outranks(remote.decision, entry.decision):
                self.local.put(remote)  # replaces the local tune
                entry = remote
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def _due(self, key: str, interval: float) -> bool:
        """Whether the remote was last read for ``key`` ``interval`` seconds ago or more (then noted as read now)."""
        last = self._checked.get(key)
        if last is not None and time.monotonic() - last < interval:
            return False
        self._mark(key)
        return True

    def _mark(self, key: str) -> None:
        if len(self._checked) >= _MAX_CHECKED:
            self._checked.clear()
        self._checked[key] = time.monotonic()

    def put(self, entry: Entry) -> bool:
        return self.put_all([entry])[0]

    def put_all(self, entries: Sequence[Entry]) -> list[bool]:
        """Each tier's ``put_all`` (the local one's in one transaction); stored where either tier stored it."""
        local = self.local.put_all(entries)
        return [remote or mine for remote, mine in zip(self.remote.put_all(entries), local)]

    def entries(self) -> Iterator[Entry]:
        seen: set[str] = set()
        for store in (self.local, self.remote):
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
        detail = "; ".join(f"{tier} {s.backend}: {s.entries} entries ({s.detail})"
                           for tier, s in (("local", local), ("remote", remote)))
        return StoreStats(self.backend, self.location, max(local.entries, remote.entries), local.size_bytes,
                          self.hits, self.misses, local.healthy and remote.healthy, detail)

    def close(self) -> None:
        self.local.close()
        self.remote.close()
