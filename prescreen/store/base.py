"""The store interface every backend implements; no method ever raises on a store fault."""

from __future__ import annotations

import abc
import dataclasses
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import TypeVar

from prescreen.store.entry import Entry, InvalidEntry, UnsignedEntry, read_stored
from prescreen.store.trust import Signer, signer_from_env

log = logging.getLogger("prescreen.store")

S = TypeVar("S", bound="Store")


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A stored value a backend left unread (pickled, over the size cap, a bad file name...): an invalid entry."""

    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class StoreStats:
    """What ``prescreen stats`` prints."""

    backend: str
    location: str
    entries: int
    size_bytes: int | None
    hits: int
    misses: int
    healthy: bool
    detail: str = ""


class Store(abc.ABC):
    """A decision store. Faults mean miss + one warning, never an exception."""

    backend: str = "abstract"
    location: str = ""

    def __init__(self, signer: Signer | None = None) -> None:
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        self.hits = 0  # reads of this object that found a valid entry
        self.misses = 0
        # With a secret (argument, PRESCREEN_SIGNING_KEY or _FILE), entries are signed on put and checked on read.
        self.signer = signer if signer is not None else signer_from_env()

    def _first(self, what: str) -> bool:
        """True the first time this kind of fault is seen by this store."""
        with self._warn_lock:
            first = what not in self._warned
            self._warned.add(what)
        return first

    def warn_once(self, what: str, exc: BaseException | str) -> None:
        """Log a store fault once per kind of fault per store."""
        if self._first(what):
            log.warning("prescreen %s store at %s: %s (%s); treating as a miss", self.backend, self.location, what, exc)

    def decode(self, key: str, raw: object, *, warn: bool = True) -> Entry | None:
        """The valid entry in a stored value (JSON text), or None with one warning per kind of fault. With a
        signing key, a stricter entry whose signature is refused is served, with one warning (``read_stored``)."""
        if raw is None:
            return None
        try:
            if isinstance(raw, Refused):
                raise InvalidEntry(raw.why)
            if not isinstance(raw, (bytes, str)):
                raise InvalidEntry(f"value is a {type(raw).__name__}, not JSON text")
            entry, unverified = read_stored(raw, key, self.signer)
        except InvalidEntry as exc:
            if warn:
                what = "entry from another schema" if "schema" in str(exc) else "invalid entry"
                self.warn_once("unsigned or forged entry" if isinstance(exc, UnsignedEntry) else what,
                               f"key {key[:12]}: {exc}")
            return None
        if unverified is not None and warn and self._first("unverified stricter entry"):
            log.warning("prescreen %s store at %s: key %s: %s; served as its %s all the same (a signature is what "
                        "it takes to loosen a decision, not to make it stricter)", self.backend, self.location,
                        key[:12], unverified, entry.decision.action)
        return entry

    @abc.abstractmethod
    def get(self, key: str) -> Entry | None:
        """The valid entry under ``key``, or None (missing, invalid or unreadable)."""

    def lookup(self, key: str) -> Entry | None:
        """``get`` for a decision: the hit is counted, the stored hit count not read (``hits`` is 0)."""
        return self.get(key)

    @property
    def writable(self) -> bool:
        """False where a put can never succeed (read-only, refused or off): a fact is then kept in the process."""
        return True

    @abc.abstractmethod
    def put(self, entry: Entry) -> bool:
        """Store ``entry`` unless a valid entry at least as strict is there already (``entry.outranks``: an
        observed OOM replaces a computed decision, nothing replaces a fact); False when not stored. A
        backend writes before it returns: a True is durable."""

    def put_all(self, entries: Sequence[Entry]) -> list[bool]:
        """``put`` of each entry, in order; a backend may write them in one transaction."""
        return [self.put(entry) for entry in entries]

    @abc.abstractmethod
    def entries(self) -> Iterator[Entry]:
        """Every valid entry (invalid ones are skipped)."""

    @abc.abstractmethod
    def delete(self, keys: list[str]) -> int:
        """Remove these keys; returns how many were removed."""

    @abc.abstractmethod
    def stats(self) -> StoreStats:
        """Counts, size and health."""

    def clear_all(self) -> int:
        """Delete everything the store holds, including invalid values; returns how many keys went."""
        keys = [e.key for e in self.entries()]
        self.delete(keys)
        return len(keys)

    def close(self) -> None:
        """Release connections and file handles."""

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NullStore(Store):
    """The store when caching is switched off (``PRESCREEN_CACHE=0``): every get misses, every put is refused."""

    backend = "off"
    location = "disabled"

    def __init__(self, detail: str = "caching is switched off") -> None:
        super().__init__()
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
