"""diskcache plumbing that never unpickles: a text-only ``Disk``, a ``Cache`` that opens fast and reads bounded, a
reader for a directory nobody may write, and the faults the disk store reacts to (``classify``). A row in pickle
or binary mode reads as ``Refused``; a row's file name is used only if diskcache makes such names; a ``.val`` file
is 0600 and read only as a regular file within ``MAX_ENTRY_BYTES``; an inline value is bounded before it loads.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import errno
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import diskcache
from diskcache.core import DBNAME, MODE_BINARY, MODE_PICKLE, MODE_RAW, MODE_TEXT, UNKNOWN

from prescreen.store.base import Refused
from prescreen.store.entry import MAX_ENTRY_BYTES
from prescreen.store.trust import NotRegularFile, create_private_file, open_regular, value_file

HITS_PREFIX = "hits:"  # a hit counter, an integer, lives under this prefix + the entry's key
MAX_HITS = 2**62  # counters saturate here, far inside SQLite's 64-bit integers
KEY_ROWS = "SELECT key, filename FROM Cache WHERE raw = 1 ORDER BY rowid"  # (key, value file) of text-keyed rows
#: Marks an observed OOM's row (the fact the store most needs) for the size limit to evict after every other:
#: ``least-recently-stored`` eviction goes by ``store_time``, here set past any time (9e999 is SQLite's infinity).
EVICT_LAST = "UPDATE Cache SET store_time = 9e999 WHERE key = ? AND raw = 1"


@dataclasses.dataclass(frozen=True, slots=True)
class Missing:
    """A row whose ``.val`` file is gone: a miss, to be cleaned."""

    filename: str


def read_value_file(path: str, limit: int = MAX_ENTRY_BYTES) -> str | Refused:
    """The text of a regular ``.val`` file (``open_regular``: a symlink is ``ELOOP``, a FIFO never blocks) of at
    most ``limit`` bytes, its size checked before reading; ``OSError`` as ``os.open``."""
    try:
        fd, st = open_regular(path)
    except NotRegularFile as exc:
        return Refused(f"its value file is not a regular file ({exc.strerror})")
    with os.fdopen(fd, "rb") as reader:
        if st.st_size > limit:
            return Refused(f"its value file is over {limit} bytes ({st.st_size})")
        data = reader.read(limit + 1)  # the file may have grown since fstat
    if len(data) > limit:
        return Refused(f"its value file is over {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return Refused("its value file is not UTF-8 text")


def bounded(con: sqlite3.Connection, read: Callable[[], object]) -> object:
    """``read()`` on ``con`` with no column over ``MAX_ENTRY_BYTES``: a longer value is ``Refused`` before SQLite
    loads it (its length limit, set for this read only; checking ``length()`` in SQL would load it)."""
    old = con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_ENTRY_BYTES)
    try:
        return read()
    except sqlite3.DataError as exc:
        if getattr(exc, "sqlite_errorname", "") != "SQLITE_TOOBIG":
            raise
        return Refused(f"its value in cache.db is over {MAX_ENTRY_BYTES} bytes")
    finally:
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, old)


class TextDisk(diskcache.Disk):
    """Keys and values as text or integers only; pickle is refused both ways."""

    def put(self, key: object) -> tuple[object, bool]:
        if type(key) is not str:
            raise TypeError(f"prescreen store keys are strings, got {type(key).__name__}")
        return key, True

    def get(self, key: object, raw: bool) -> object:
        if not raw:
            return Refused("key is stored as pickle; it is never unpickled")
        return bytes(key) if isinstance(key, (bytes, memoryview)) else key

    def store(self, value: object, read: bool, key: object = UNKNOWN) -> tuple[int, int, str | None, object]:
        if type(value) is str or (type(value) is int and not read):
            stored: tuple[int, int, str | None, object] = super().store(value, False, key=key)
            return stored
        raise TypeError(f"prescreen stores JSON text or integers, got {type(value).__name__}")

    def filename(self, key: object = UNKNOWN, value: object = UNKNOWN) -> tuple[str, str]:
        """diskcache's random name, with the two sub-directories made 0700 and the file made 0600 up front."""
        name, full_path = super().filename(key, value)
        sub = os.path.join(self._directory, name[:2])
        for path in (sub, os.path.join(sub, name[3:5])):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        create_private_file(full_path)
        return name, full_path

    def _write(self, full_path: str, iterator: object, mode: str, encoding: str | None = None) -> int:
        # The file exists already (made 0600 by ``filename``): open it for writing, not exclusively.
        return int(super()._write(full_path, iterator, mode.replace("x", "w"), encoding))

    def fetch(self, mode: int, filename: str | None, value: object, read: bool) -> object:
        if mode == MODE_RAW:
            return bytes(value) if isinstance(value, (bytes, memoryview)) else value
        if mode == MODE_TEXT:
            path = value_file(self._directory, filename)
            if path is None:
                return Refused(f"its row names the file {str(filename)[:80]!r}, outside the cache's own names")
            try:
                return read_value_file(path)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return Missing(str(filename))
                if exc.errno == errno.ELOOP:
                    return Refused("its value file is a symlink")
                return Refused(f"its value file cannot be read ({exc.strerror})")
        name = {MODE_BINARY: "binary", MODE_PICKLE: "pickle"}.get(mode, f"mode {mode}")
        return Refused(f"value is stored as {name}, not JSON text; it is never unpickled")

    def remove(self, file_path: str) -> None:
        """Delete a ``.val`` file the cache made, and its emptied sub-directories; any other name is left alone."""
        if value_file(self._directory, file_path) is not None:
            super().remove(file_path)


class BoundedOpenCache(diskcache.Cache):
    """A ``diskcache.Cache`` that gives up opening a locked database after its ``timeout`` (diskcache retries
    for 60 s: a probe read under that timeout, and a bounded ``_sql_retry``), and whose ``get`` refuses a
    value over ``MAX_ENTRY_BYTES`` unread (``bounded``)."""

    def __init__(self, directory: str, *, timeout: float, **kwargs: object) -> None:
        self.open_timeout = max(timeout, 0.05)
        db = os.path.join(directory, DBNAME)
        if os.path.isfile(db):
            probe = sqlite3.connect(db, timeout=self.open_timeout)
            try:
                probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                probe.close()
        super().__init__(directory, timeout=timeout, **kwargs)

    def get(self, key: object, default: object = None, *args: object, **kwargs: object) -> object:
        return bounded(self._con, lambda: super(BoundedOpenCache, self).get(key, default, *args, **kwargs))

    def key_rows(self) -> list[tuple[object, object]]:
        return list(self._sql(KEY_ROWS).fetchall())

    @property
    def _sql_retry(self) -> Callable[..., sqlite3.Cursor]:
        sql = self._sql

        def execute(statement: str, *args: object, **kwargs: object) -> sqlite3.Cursor:
            start = time.monotonic()
            while True:
                try:
                    cursor: sqlite3.Cursor = sql(statement, *args, **kwargs)
                    return cursor
                except sqlite3.OperationalError as exc:
                    if str(exc) != "database is locked" or time.monotonic() - start > self.open_timeout:
                        raise
                    time.sleep(0.005)

        return execute


class ReadOnlyCache:
    """The read half of ``diskcache.Cache`` over a directory nobody may write (diskcache cannot open one):
    SQLite's ``mode=ro``, else ``immutable=1`` (a leftover ``-wal``'s entries are then misses)."""

    _SELECT = "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1 AND (expire_time IS NULL OR expire_time > ?)"

    def __init__(self, directory: Path, timeout: float) -> None:
        self.directory = directory
        self.disk = TextDisk(str(directory))
        self._lock = threading.Lock()
        uri = (directory / DBNAME).resolve().as_uri()
        for mode in ("mode=ro", "immutable=1"):
            try:
                con = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=timeout, check_same_thread=False)
                con.execute("SELECT count(*) FROM Cache").fetchone()
            except sqlite3.Error:
                if mode == "immutable=1":
                    raise
                continue
            self.con, self.mode = con, mode
            break

    def get(self, key: str) -> object:
        """The decoded value under ``key`` (text, int or ``Refused``), or None."""

        def read() -> object:
            row = self.con.execute(self._SELECT, (key, time.time())).fetchone()
            return None if row is None else self.disk.fetch(row[0], row[1], row[2], False)

        with self._lock:
            return bounded(self.con, read)

    def key_rows(self) -> list[tuple[object, object]]:
        with self._lock:
            return list(self.con.execute(KEY_ROWS).fetchall())

    def volume(self) -> int:
        return sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())

    def close(self) -> None:
        self.con.close()


def hit_count(value: object) -> int | None:
    """A stored hit counter, or None when the value is not a sane non-negative integer."""
    return value if type(value) is int and 0 <= value < MAX_HITS else None


class HitBuffer:
    """Hit counts not yet written (statistics: written on ``close``, ``stats``, ``entries`` and exit, not a
    commit per read) and the open cache they go to; apart from the store, so that its ``weakref.finalize``
    (collection or exit, whichever comes first) holds no reference to the store."""

    def __init__(self) -> None:
        self.pending: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.cache: BoundedOpenCache | None = None

    def take(self) -> collections.Counter[str]:
        with self.lock:
            pending, self.pending = self.pending, collections.Counter()
        return pending

    def final_flush(self) -> None:
        """The finalizer: write what is pending, never raising (a hit count is statistics)."""
        pending, cache = self.take(), self.cache
        if pending and cache is not None:
            with contextlib.suppress(Exception):
                write_hits(cache, pending)


def write_hits(cache: BoundedOpenCache, pending: collections.Counter[str]) -> None:
    """Add ``pending`` to the stored counters in one transaction; a counter that is not an integer restarts."""
    with cache.transact():
        for key, count in pending.items():
            if key in cache:
                name = HITS_PREFIX + key
                cache.set(name, min((hit_count(cache.get(name)) or 0) + count, MAX_HITS))


class Fault(str, enum.Enum):
    """What went wrong, as the warning names it; each kind is warned about once per store."""

    LOCKED = "database is locked by another process"
    READ_ONLY = "cache is read-only"
    FULL = "disk is full"
    CORRUPT = "database file is corrupt"
    UNAVAILABLE = "cache cannot be opened"
    INSECURE = "cache directory is not safe to use"
    ERROR = "store error"


def classify(exc: BaseException) -> Fault:
    """The fault an exception from diskcache/sqlite/the filesystem stands for."""
    if isinstance(exc, diskcache.Timeout):
        return Fault.LOCKED
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc).lower()
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
            return Fault.LOCKED
        if name.startswith("SQLITE_READONLY") or "readonly" in text or "read-only" in text:
            return Fault.READ_ONLY
        if name.startswith("SQLITE_FULL") or "disk is full" in text:
            return Fault.FULL
        if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or "not a database" in text or "malformed" in text:
            return Fault.CORRUPT
        if name.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
            return Fault.UNAVAILABLE
        return Fault.ERROR
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return Fault.FULL
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return Fault.READ_ONLY
        return Fault.UNAVAILABLE
    return Fault.ERROR
