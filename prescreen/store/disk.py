"""The embedded store: one diskcache directory, JSON text values, faults degrade to misses.

The entry lives under its key, its hit counter under ``hits:<key>``; ``put`` keeps the first writer's unless invalid
or less strict (``entry.outranks``). Faults (``textdisk.classify``) are warned about once, never raised: a locked
put is retried for ``write_wait`` seconds, then writes pause for ``cooldown`` (other faults: reads too), except a
fact's; a read-only directory serves reads; a corrupt ``cache.db`` is recovered (``recovery``); one that cannot
be opened is a no-op until ``cooldown``; an unsafe directory (``trust``) is refused. See docs/store-and-trust.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from diskcache.core import DBNAME

from prescreen.decision import is_observed_oom
from prescreen.store.base import Store, StoreStats, log
from prescreen.store.entry import Entry, outranks
from prescreen.store.recovery import LOCK_NAME, file_id, recover, recovery_lock, remove_orphans, resume
from prescreen.store.textdisk import (
    EVICT_LAST,
    HITS_PREFIX,
    BoundedOpenCache,
    Fault,
    HitBuffer,
    Missing,
    ReadOnlyCache,
    TextDisk,
    classify,
    hit_count,
    write_hits,
)
from prescreen.store.trust import (
    InsecureDirectory,
    check_directory,
    check_owned_file,
    create_private_file,
    default_cache_dir,
    fixed_location,
    private_directory,
    resolve_size_limit,
    value_file,
)

DEFAULT_TIMEOUT = 0.5
DEFAULT_COOLDOWN = 30.0
#: No memory map (diskcache maps 64 MiB): a first read after another process's commit costs 1.3x to 4.9x more
#: through it (``bench/bench_cold_lookup.py``). Kept in the Settings table, so every connection uses it.
SQLITE_MMAP_SIZE = 0


T = TypeVar("T")


class DiskStore(Store):
    """Decisions in a local diskcache directory (see the module docstring for layout and faults)."""

    backend = "disk"

    @property
    def _cache(self) -> BoundedOpenCache | None:
        return self._hits.cache

    @_cache.setter
    def _cache(self, cache: BoundedOpenCache | None) -> None:
        self._hits.cache = cache  # the finalizer writes pending hits to whatever is open

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        size_limit: int | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        cooldown: float = DEFAULT_COOLDOWN,
        min_file_size: int = 2**15,
        write_wait: float = 5.0,  # how long a put retries through a locked database before it gives up
    ) -> None:
        super().__init__()
        self._hits = HitBuffer()  # holds the open cache (``_cache``) too
        self.directory = fixed_location(Path(directory).expanduser() if directory is not None else default_cache_dir())
        self.location = str(self.directory)
        self._db_path = self.directory / DBNAME
        self.size_limit = resolve_size_limit(size_limit)
        self.timeout = timeout
        self.cooldown = cooldown
        self.write_wait = write_wait
        self.min_file_size = min_file_size
        self.recovered: tuple[str, int] | None = None  # (moved-aside file, entries restored)
        self.refused: str | None = None  # why the directory is not safe to use, once refused
        self._reader: ReadOnlyCache | None = None
        self._open_again_at = 0.0
        self._reads_paused_until = 0.0
        self._writes_paused_until = 0.0
        self._healthy = False
        self._lock = threading.RLock()
        self._db_id: tuple[int, int] | None = None
        weakref.finalize(self, self._hits.final_flush)  # on collection, or at exit if still alive
        self._open()

    def _new_cache(self) -> BoundedOpenCache:
        return BoundedOpenCache(str(self.directory), timeout=self.timeout, disk=TextDisk, size_limit=self.size_limit,
                                eviction_policy="least-recently-stored", disk_min_file_size=self.min_file_size,
                                statistics=0, sqlite_mmap_size=SQLITE_MMAP_SIZE)

    def _open(self) -> None:
        """Open read-write; else recover a corrupt file, serve a read-only one, or stay closed for a while."""
        try:
            private_directory(self.directory)
            check_directory(self.directory)
            for name in (DBNAME, LOCK_NAME):
                check_owned_file(self.directory / name)
        except InsecureDirectory as exc:
            self.refused = str(exc)
            self._open_again_at = math.inf
            self.warn_once(Fault.INSECURE.value, f"{exc}; running without the store")
            return
        except OSError as exc:
            if not self.directory.is_dir():  # it could not be made: say why (a read-only file system, say),
                self.warn_once(classify(exc).value,  # not the "no such file" opening it would report
                               f"cannot create {self.directory}: {exc.strerror or exc}; the store is off for "
                               f"{self.cooldown:g} s")
                self._open_again_at = time.monotonic() + self.cooldown
                return
            # it exists but cannot be checked: opening fails below and says why
        try:
            with recovery_lock(self.directory, shared=True, wait=self.timeout) as held:
                if held is False:
                    self.warn_once("recovery.lock is held by another process",
                                   f"waited {self.timeout:g} s for its recovery to finish; opening without it")
                create_private_file(self._db_path)  # SQLite gives -wal/-shm the database's mode
                cache = self._new_cache()
                identity = file_id(self._db_path)
            self._cache, self._db_id, self._healthy = cache, identity, True
            resume(cache, self.directory, self.signer)
            return
        except Exception as exc:  # every open failure degrades the same way
            fault, error = classify(exc), exc
        if fault is Fault.CORRUPT and self._recover(error):
            return
        if fault in (Fault.READ_ONLY, Fault.UNAVAILABLE) and self._db_path.is_file():
            with contextlib.suppress(Exception):
                self._reader = ReadOnlyCache(self.directory, self.timeout)
            if self._reader is not None:
                self.warn_once(Fault.READ_ONLY.value, f"{error}; serving reads only ({self._reader.mode})")
                self._writes_paused_until = math.inf
                return
        self.warn_once(fault.value, f"{error}; the store is off for {self.cooldown:g} s")
        self._open_again_at = time.monotonic() + self.cooldown

    def _recover(self, error: BaseException) -> bool:
        """``recovery.recover``: True when a fresh database is open."""
        try:
            cache, identity, moved, restored = recover(self.directory, self.timeout, self.signer, self._new_cache)
        except Exception as exc:
            self.warn_once(Fault.CORRUPT.value, f"{error}; recovery failed: {exc}")
            return False
        self._cache, self._db_id, self._healthy = cache, identity, True
        if moved is not None:
            self.recovered = (moved.name, restored)
            self.warn_once(Fault.CORRUPT.value,
                           f"{error}; moved it aside to {moved.name}, started afresh and restored {restored} valid entries")
        return True

    def _fault(self, exc: BaseException, write: bool) -> None:
        fault = classify(exc)
        self._healthy = False
        now = time.monotonic()
        if fault is Fault.CORRUPT:
            with self._lock:
                self._close_handles()
                if not self._recover(exc):
                    self._open_again_at = now + self.cooldown
            return
        if fault is Fault.READ_ONLY:
            self._writes_paused_until = math.inf
        elif write and fault in (Fault.LOCKED, Fault.FULL):
            self._writes_paused_until = now + self.cooldown
        else:
            self._reads_paused_until = self._writes_paused_until = now + self.cooldown
        detail = str(exc) or f"{type(exc).__name__} after {self.timeout:g} s"
        self.warn_once(fault.value, f"{detail}; pausing {'writes' if write else 'the store'} for {self.cooldown:g} s")

    def _handle(self, write: bool, force: bool = False) -> BoundedOpenCache | ReadOnlyCache | None:
        """What an operation goes to; None while paused. ``force`` (a fact's write) is never paused, and opens
        again a store a failed open or ``close`` left shut: a fact kept in the process is written at exit."""
        now = time.monotonic()
        if not force and now < (self._writes_paused_until if write else self._reads_paused_until):
            return None
        if self._cache is None and self._reader is None and (
                now >= self._open_again_at or (force and self.refused is None)):
            with self._lock:
                if self._cache is None and self._reader is None:
                    self._open()
        if write or self._cache is not None:  # not `or`: an empty Cache is falsy (it has __len__)
            return self._cache
        return self._reader

    def _follow_moves(self) -> None:
        """Reopen when ``cache.db`` is no longer the file this store opened (another process recovered it or
        renamed a copy into place). Writes check under the shared lock: an acknowledged put is in the live file."""
        if self._cache is not None and file_id(self._db_path) != self._db_id:
            with self._lock:
                self._close_handles()
                self._open()

    def _read_with(self, op: Callable[[BoundedOpenCache | ReadOnlyCache], T], default: T) -> T:
        """``op`` on the open (or read-only) cache; ``default`` while paused or on a fault."""
        self._follow_moves()
        handle = self._handle(False)
        if handle is None:
            return default
        try:
            return op(handle)
        except Exception as exc:  # a store fault is never the compile's problem
            self._fault(exc, False)
            return default

    def _write_with(self, op: Callable[[BoundedOpenCache], T], default: T, *, force: bool = False,
                    wait: float = 0.0) -> T:
        """``op`` (one transaction: a locked one changed nothing) on the open cache, ``default`` on a fault. A
        locked database, or another process's recovery, is waited for with backoff up to ``wait`` seconds;
        ``force``: even while writes are paused."""
        deadline, delay = time.monotonic() + wait, 0.01
        while True:
            failure: Exception | None = None  # stays None where another process holds recovery.lock
            with self._lock:  # opened first: a recovery it starts takes recovery.lock, held shared below
                if self._handle(True, force) is None:
                    return default
                try:  # None: no lock file can be made (read-only), the write fails on its own
                    with recovery_lock(self.directory, shared=True, wait=self.timeout) as held:
                        if held is not False:
                            self._follow_moves()
                            if self._handle(True, force) is None or self._cache is None:
                                return default
                            result = op(self._cache)
                            self._healthy = True
                            return result
                except Exception as exc:  # a store fault is never the compile's problem
                    failure = exc
            if (failure is None or classify(failure) is Fault.LOCKED) and time.monotonic() + delay < deadline:
                time.sleep(delay)
                delay = min(2 * delay, 0.2)
            elif failure is None:
                self.warn_once("recovery.lock is held by another process",
                               f"a write waited {max(wait, self.timeout):g} s and was skipped")
                return default
            else:
                self._fault(failure, True)
                return default

    def _stored_hits(self, key: str) -> int:
        value = self._read_with(lambda c: c.get(HITS_PREFIX + key), None)
        count = hit_count(value)
        if count is None and value is not None:
            self.warn_once("invalid hit counter", f"key {key[:12]}: {str(value)[:40]!r} counts as 0 and is reset")
        return count or 0

    def _read(self, key: str) -> object:
        """The stored value under ``key``; a row whose value file is gone (a delete killed half-way) is deleted
        and reads as None."""
        raw = self._read_with(lambda c: c.get(key), None)
        if not isinstance(raw, Missing):
            return raw
        filename = raw.filename
        path = value_file(str(self.directory), filename)

        def drop(cache: BoundedOpenCache) -> None:
            with cache.transact():  # if the row still names that file, and it is still gone
                row = cache._sql("SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
                if row is not None and row[0] == filename and path is not None and not os.path.exists(path):
                    cache.delete(key)
                    cache.delete(HITS_PREFIX + key)

        if self._cache is not None:
            self._write_with(drop, None)
        return None

    def get(self, key: str) -> Entry | None:
        entry, pending = self._hit(key)
        return None if entry is None else entry.with_hits(self._stored_hits(key) + pending)

    def lookup(self, key: str) -> Entry | None:
        return self._hit(key)[0]

    @property
    def writable(self) -> bool:
        return self.refused is None and self._writes_paused_until != math.inf  # not refused, not read-only

    def _hit(self, key: str) -> tuple[Entry | None, int]:
        """The valid entry under ``key`` (its hit counted) and its hits not yet written."""
        entry = self.decode(key, self._read(key))
        if entry is None:
            self.misses += 1
            return None, 0
        self.hits += 1
        if self._cache is None:
            return entry, 0
        with self._hits.lock:
            self._hits.pending[key] += 1
            return entry, self._hits.pending[key]

    def flush_hits(self) -> None:
        """Write the hit counts gathered since the last flush, in one transaction."""
        pending = self._hits.take()
        if pending and self._cache is not None:
            self._write_with(lambda cache: write_hits(cache, pending), None)

    def put(self, entry: Entry) -> bool:
        """``Store.put``, retried through a locked database for ``write_wait`` seconds; a fact even while paused."""
        return self.put_all([entry])[0]

    def put_all(self, entries: Sequence[Entry]) -> list[bool]:
        """``put`` of each entry in one transaction (all or none are written)."""
        texts = [(entry, entry.with_hits(0).to_json(self.signer)) for entry in entries]

        def add(cache: BoundedOpenCache, entry: Entry, text: str) -> bool:
            if not cache.add(entry.key, text):
                there = self.decode(entry.key, cache.get(entry.key), warn=False)
                if there is not None and not outranks(entry.decision, there.decision):
                    return False
                cache.set(entry.key, text)
                cache.delete(HITS_PREFIX + entry.key)
                log.info("prescreen disk store: replaced %s under %s", "an invalid value" if there is None
                         else f"a {there.decision.action} by a stricter entry", entry.key[:12])
            if is_observed_oom(entry.decision):
                cache._sql(EVICT_LAST, (entry.key,))
            return True

        def add_all(cache: BoundedOpenCache) -> list[bool]:
            with cache.transact():
                return [add(cache, entry, text) for entry, text in texts]

        return self._write_with(add_all, [False] * len(texts), force=any(is_observed_oom(e.decision) for e in entries),
                                wait=self.write_wait)

    def _entry_rows(self) -> list[tuple[str, object]]:
        """(key, value file name) of every stored entry, valid or not."""
        rows: list[tuple[object, object]] = self._read_with(lambda c: c.key_rows(), [])
        return [(key, name) for key, name in rows if isinstance(key, str) and not key.startswith(HITS_PREFIX)]

    def keys(self) -> list[str]:
        """Every entry key stored (valid or not), except rows whose value file is gone (a bad name is an invalid
        entry, still stored)."""
        directory = str(self.directory)
        files = [(key, None if name is None else value_file(directory, name)) for key, name in self._entry_rows()]
        return [key for key, path in files if path is None or os.path.exists(path)]

    def entries(self) -> Iterator[Entry]:
        self.flush_hits()
        for key, _ in self._entry_rows():
            entry = self.decode(key, self._read(key))  # a row whose file is gone is cleaned by the read
            if entry is not None:
                yield entry.with_hits(self._stored_hits(key))

    def delete(self, keys: list[str]) -> int:
        def remove(cache: BoundedOpenCache) -> int:
            removed = 0
            for key in keys:  # one transaction each: diskcache removes a value file only after its commit
                removed += bool(cache.delete(key))
                cache.delete(HITS_PREFIX + key)
            return removed

        return self._write_with(remove, 0)

    def clear_all(self) -> int:
        def clear(cache: BoundedOpenCache) -> int:
            count = sum(1 for k in cache.iterkeys() if isinstance(k, str) and not k.startswith(HITS_PREFIX))
            cache.clear()
            return count

        removed = self._write_with(clear, 0)
        # and the value files of puts and deletes killed half-way, once no write is in progress (where the lock is
        # held by a recovery, or unwritable, they stay until the next clear or recovery)
        with contextlib.suppress(Exception), recovery_lock(self.directory, wait=self.timeout):
            if self._cache is not None:
                remove_orphans(self._cache, self.directory)
        return removed

    def stats(self) -> StoreStats:
        self.flush_hits()
        count = len(self.keys())
        size = self._read_with(lambda c: c.volume(), None)
        if self.refused is not None:
            detail = f"refused: {self.refused}"
        elif self._reader is not None:
            detail = f"read-only ({self._reader.mode})"
        elif self._cache is None:
            detail = "unavailable (no-op until it can be opened)"
        else:
            detail = f"size_limit={self.size_limit} timeout={self.timeout:g}s"
        if self.recovered is not None:
            detail += f"; recovered {self.recovered[1]} entries, corrupt file moved to {self.recovered[0]}"
        healthy = self._cache is not None and self._healthy and time.monotonic() >= self._writes_paused_until
        return StoreStats(self.backend, self.location, count, size, self.hits, self.misses, healthy, detail)

    def _close_handles(self) -> None:
        for handle in (self._cache, self._reader):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        self._cache = self._reader = None

    def close(self) -> None:
        self.flush_hits()
        with self._lock:
            self._close_handles()
            self._open_again_at = math.inf
