"""The embedded store: one diskcache directory, JSON text values, faults degrade to misses.

Layout: the entry under its 64-hex key (its text from ``Entry.to_json``: head, details, record and plan lines;
inline in ``cache.db`` or, above ``min_file_size``, in a ``.val`` text file),
and its hit counter, an integer, under ``hits:<key>``, so a hit never rewrites
the entry. ``put`` is ``Cache.add``: the first writer wins and concurrent
writers of one key store one value; an invalid value under the key is
replaced, and so is a valid one by a stricter entry (an observed OOM over a
computed decision, ``entry.outranks``). Evictions are least-recently-stored once ``size_limit`` is reached.

Faults: a put waits through a locked database (SQLite timeout ``timeout``,
default 0.5 s, retried with backoff for up to ``write_wait`` seconds, default 5),
so contention between processes loses no write; a write still locked after that,
or a full disk, pauses writes (other faults: reads too) for ``cooldown`` seconds,
except an observed-OOM fact's, which is never paused (``put``); a read-only
directory serves reads through ``textdisk.ReadOnlyCache``; a corrupt ``cache.db`` is
moved aside and its valid entries salvaged (``recovery``); a directory that
cannot be opened at all makes a no-op store that retries after ``cooldown``.
Each kind of fault is warned about once; none raises.

Trust: the directory is created 0700 and ``cache.db`` 0600 whatever the
umask; a directory (or one above it) owned by another user or writable by
group or others is refused for the store's lifetime (``trust``): one
warning, every lookup a miss, ``stats`` unhealthy, so the CLI exits 2. So is
one reached through a symlink another user owns. The location is fixed when
the store opens (``fixed_location``: a relative directory is made absolute
once, so an ``os.chdir`` later changes nothing); a path no file system takes
is a ``ConfigError``.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

from diskcache.core import DBNAME

from prescreen.decision import is_observed_oom
from prescreen.store.base import Store, StoreStats, log
from prescreen.store.entry import Entry, outranks
from prescreen.store.recovery import (
    LOCK_NAME,
    file_id,
    flock_within,
    needs_salvage,
    open_lock_file,
    recover,
    recovery_lock,
    remove_orphans,
    resume,
)
from prescreen.store.textdisk import (
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
DEFAULT_WRITE_WAIT = 5.0  # how long a put retries through a locked database before it gives up
#: SQLite memory-maps no part of the database (diskcache maps 64 MiB): right after another connection
#: committed (another process), reading a row not read before through
#: the map cost 1.3x to 4.9x a read into SQLite's own page cache with the CPU caches cold, 2x to 4x hot
#: (``bench/bench_cold_lookup.py``). A per-connection pragma, kept in the cache's Settings table, so every
#: connection that opens the directory uses it.
SQLITE_MMAP_SIZE = 0


T = TypeVar("T")


def _is_entry_key(key: object) -> bool:
    return isinstance(key, str) and not key.startswith(HITS_PREFIX)


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
        count_hits: bool = True,
        min_file_size: int = 2**15,
        write_wait: float = DEFAULT_WRITE_WAIT,
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
        self.count_hits = count_hits
        self.min_file_size = min_file_size
        self.recovered: tuple[str, int] | None = None  # (moved-aside file, entries restored)
        self.refused: str | None = None  # why the directory is not safe to use, once refused
        self._reader: ReadOnlyCache | None = None
        self._open_again_at = 0.0
        self._reads_paused_until = 0.0
        self._writes_paused_until = 0.0
        self._healthy = False
        self._lock = threading.RLock()
        self._lock_file: IO[str] | None = None
        self._db_id: tuple[int, int] | None = None
        weakref.finalize(self, self._hits.final_flush)  # on collection, or at exit if still alive
        self._open()

    # -- opening and faults -------------------------------------------------

    def _new_cache(self) -> BoundedOpenCache:
        return BoundedOpenCache(
            str(self.directory),
            open_timeout=max(self.timeout, 0.05),
            timeout=self.timeout,
            disk=TextDisk,
            size_limit=self.size_limit,
            eviction_policy="least-recently-stored",
            disk_min_file_size=self.min_file_size,
            statistics=0,
            sqlite_mmap_size=SQLITE_MMAP_SIZE,
        )

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
                    self.warn_once(
                        "recovery.lock is held by another process",
                        f"waited {self.timeout:g} s for its recovery to finish; opening without it",
                    )
                create_private_file(self._db_path)  # SQLite gives -wal/-shm the database's mode
                cache = self._new_cache()
                identity = file_id(self._db_path)
            self._cache, self._db_id, self._healthy = cache, identity, True
            if needs_salvage(self.directory):
                resume(cache, self.directory, self.signer)
            return
        except Exception as exc:  # every open failure degrades the same way
            fault, error = classify(exc), exc
        if fault is Fault.CORRUPT and self._recover(error):
            return
        if fault in (Fault.READ_ONLY, Fault.UNAVAILABLE) and self._db_path.is_file():
            try:
                self._reader = ReadOnlyCache(self.directory, self.timeout)
            except Exception:
                pass
            else:
                self.warn_once(Fault.READ_ONLY.value, f"{error}; serving reads only ({self._reader.mode})")
                self._writes_paused_until = math.inf
                return
        self.warn_once(fault.value, f"{error}; the store is off for {self.cooldown:g} s")
        self._open_again_at = time.monotonic() + self.cooldown

    def _recover(self, error: BaseException) -> bool:
        """Move a corrupt ``cache.db`` aside, open a fresh one and restore what is valid (``recovery.recover``)."""
        try:
            cache, identity, moved, restored = recover(self.directory, self.timeout, self.signer, self._new_cache)
        except Exception as exc:
            self.warn_once(Fault.CORRUPT.value, f"{error}; recovery failed: {exc}")
            return False
        self._cache, self._db_id, self._healthy = cache, identity, True
        if moved is not None:
            self.recovered = (moved.name, restored)
            self.warn_once(
                Fault.CORRUPT.value,
                f"{error}; moved it aside to {moved.name}, started afresh and restored {restored} valid entries",
            )
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
        """What an operation goes to; None while paused (``force``: a fact's write, never paused, and opening
        the store again where a failed open left it off for ``cooldown``, or ``close`` closed it: a fact this
        process kept is written at exit, after the hooks closed their store)."""
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

    def _follow_moves(self, write: bool) -> None:
        """Reopen when ``cache.db`` is no longer the file this store opened (another process moved it aside).

        Checked (a stat) before every read, so a database renamed into place (a recovery, a copy) is what the
        next lookup reads, and before every write (under the shared lock, so no recovery can move it between
        the check and the write: an acknowledged put is in the live database).
        """
        if self._cache is None:
            return
        if file_id(self._db_path) != self._db_id:
            with self._lock:
                self._close_handles()
                self._open()

    def _run(self, write: bool, op: Callable[[BoundedOpenCache | ReadOnlyCache], T], default: T, *,
             force: bool = False, wait: float = 0.0) -> T:
        """``op`` on the open cache, ``default`` on a fault. A write locked by another connection is tried again
        with backoff until ``wait`` seconds have passed (``op`` is one transaction: a locked one changed
        nothing); ``force``: even while writes are paused."""
        if not write:
            self._follow_moves(False)
            handle = self._handle(False)
            if handle is None:
                return default
            try:
                return op(handle)
            except Exception as exc:  # a store fault is never the compile's problem
                self._fault(exc, False)
                return default
        deadline, delay = time.monotonic() + wait, 0.01
        while True:
            failure: Exception | None = None
            recovering = False  # another process holds recovery.lock: try again, like a locked database
            with self._lock:  # one writer per store at a time: the flock below belongs to the store's lock file
                if self._handle(True, force) is not None and not self._hold_shared():
                    recovering = True
                else:
                    try:
                        self._follow_moves(True)
                        handle = self._handle(True, force)
                        if handle is None:
                            return default
                        result = op(handle)
                    except Exception as exc:  # a store fault is never the compile's problem
                        failure = exc
                    finally:
                        self._release_shared()
            if failure is None and not recovering:
                break
            retry = recovering or (failure is not None and classify(failure) is Fault.LOCKED)
            if retry and time.monotonic() + delay < deadline:
                time.sleep(delay)
                delay = min(2 * delay, 0.2)
                continue
            if recovering:
                self.warn_once(
                    "recovery.lock is held by another process", f"a write waited {max(wait, self.timeout):g} s and was "
                    "skipped")
                return default
            assert failure is not None
            self._fault(failure, True)
            return default
        self._healthy = True
        return result

    def _hold_shared(self) -> bool:
        """Take ``recovery.lock`` shared on the store's own handle, waiting at most ``timeout``."""
        try:
            if self._lock_file is None:
                self._lock_file = open_lock_file(self.directory)
            return flock_within(self._lock_file, fcntl.LOCK_SH, self.timeout)
        except OSError:  # no lock file can be made (read-only directory): writes fail on their own
            return True

    def _release_shared(self) -> None:
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    # -- decoding -----------------------------------------------------------

    def _stored_hits(self, key: str) -> int:
        value = self._run(False, lambda c: c.get(HITS_PREFIX + key), None)
        count = hit_count(value)
        if count is None and value is not None:
            self.warn_once("invalid hit counter", f"key {key[:12]}: {str(value)[:40]!r} counts as 0 and is reset")
        return count or 0

    # -- the Store interface ----------------------------------------------------

    def _read(self, key: str) -> object:
        """The stored value under ``key``; a row whose value file is gone (a delete or eviction killed half-way)
        is deleted and reads as None."""
        raw = self._run(False, lambda c: c.get(key), None)
        if isinstance(raw, Missing):
            self._drop_missing(key, raw.filename)
            return None
        return raw

    def _drop_missing(self, key: str, filename: str) -> None:
        """Delete ``key``'s row if it still names ``filename`` and that file is still gone (a killed delete)."""
        path = value_file(str(self.directory), filename)

        def drop(cache: BoundedOpenCache | ReadOnlyCache) -> None:
            assert isinstance(cache, BoundedOpenCache)
            with cache.transact():
                row = cache._sql("SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
                if row is not None and row[0] == filename and path is not None and not os.path.exists(path):
                    cache.delete(key)
                    cache.delete(HITS_PREFIX + key)

        if self._cache is not None:
            self._run(True, drop, None)

    def get(self, key: str) -> Entry | None:
        entry, pending = self._hit(key)
        return None if entry is None else entry.with_hits(self._stored_hits(key) + pending)

    def lookup(self, key: str) -> Entry | None:
        return self._hit(key)[0]

    @property
    def writable(self) -> bool:
        return self.refused is None and self._writes_paused_until != math.inf  # not refused, not read-only

    def _hit(self, key: str) -> tuple[Entry | None, int]:
        """The valid entry under ``key`` (its hit counted in ``HitBuffer``) and its hits not yet written."""
        entry = self.decode(key, self._read(key))
        if entry is None:
            self.misses += 1
            return None, 0
        self.add_hits(1)
        if not (self.count_hits and self._cache is not None):
            return entry, 0
        with self._hits.lock:
            self._hits.pending[key] += 1
            return entry, self._hits.pending[key]

    def flush_hits(self) -> None:
        """Write the hit counts gathered since the last flush (one transaction; see ``HitBuffer``)."""
        pending = self._hits.take()
        if not pending or self._cache is None:
            return

        def write(cache: BoundedOpenCache | ReadOnlyCache) -> None:
            assert isinstance(cache, BoundedOpenCache)
            write_hits(cache, pending)

        self._run(True, write, None)

    def put(self, entry: Entry) -> bool:
        """``Store.put``: written (and committed) before it returns, through a locked database for up to
        ``write_wait`` seconds. An observed-OOM fact is written even while writes are paused."""
        text = entry.with_hits(0).to_json(self.signer)

        def add(cache: BoundedOpenCache | ReadOnlyCache) -> bool:
            assert isinstance(cache, BoundedOpenCache)
            if cache.add(entry.key, text):
                return True
            with cache.transact():
                there = self.decode(entry.key, cache.get(entry.key), warn=False)
                if there is not None and not outranks(entry.decision, there.decision):
                    return False
                cache.set(entry.key, text)
                cache.delete(HITS_PREFIX + entry.key)
                log.info("prescreen disk store: replaced %s under %s", "an invalid value" if there is None
                         else f"a {there.decision.action} by a stricter entry", entry.key[:12])
                return True

        return self._run(True, add, False, force=is_observed_oom(entry.decision), wait=self.write_wait)

    def _entry_rows(self) -> list[tuple[str, object]]:
        """(key, value file name) of every stored entry, valid or not."""
        none: list[tuple[object, object]] = []
        rows = self._run(False, lambda c: c.key_rows(), none)
        return [(key, name) for key, name in rows if isinstance(key, str) and _is_entry_key(key)]

    def keys(self) -> list[str]:
        """Every entry key stored (valid or not), except rows whose value file is gone."""
        directory = str(self.directory)

        def present(name: object) -> bool:
            path = None if name is None else value_file(directory, name)
            return path is None or os.path.exists(path)  # a bad name is an invalid entry, still stored

        return [key for key, name in self._entry_rows() if present(name)]

    def entries(self) -> Iterator[Entry]:
        self.flush_hits()
        for key, _ in self._entry_rows():
            entry = self.decode(key, self._read(key))  # a row whose file is gone is cleaned by the read
            if entry is not None:
                yield entry.with_hits(self._stored_hits(key))

    def delete(self, keys: list[str]) -> int:
        def remove(cache: BoundedOpenCache | ReadOnlyCache) -> int:
            assert isinstance(cache, BoundedOpenCache)
            removed = 0
            for key in keys:  # one transaction each: diskcache removes a value file only after its commit
                removed += bool(cache.delete(key))
                cache.delete(HITS_PREFIX + key)
            return removed

        return self._run(True, remove, 0)

    def clear_all(self) -> int:
        def clear(cache: BoundedOpenCache | ReadOnlyCache) -> int:
            assert isinstance(cache, BoundedOpenCache)
            count = sum(1 for k in cache.iterkeys() if _is_entry_key(k))
            cache.clear()
            return count

        removed = self._run(True, clear, 0)
        try:  # and the value files of puts and deletes killed half-way, once no write is in progress
            with recovery_lock(self.directory, wait=self.timeout):
                if self._cache is not None:
                    remove_orphans(self._cache, self.directory)
        except Exception:  # held by a recovery, or unwritable: the files stay until the next clear or recovery
            pass
        return removed

    def stats(self) -> StoreStats:
        self.flush_hits()
        count = len(self.keys())
        size = self._run(False, lambda c: c.volume(), None)
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
                try:
                    handle.close()
                except Exception:
                    pass
        self._cache = self._reader = None

    def close(self) -> None:
        self.flush_hits()
        with self._lock:
            self._close_handles()
            if self._lock_file is not None:
                self._lock_file.close()
                self._lock_file = None
            self._open_again_at = math.inf
