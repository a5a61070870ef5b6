"""diskcache plumbing that never unpickles: a text-only ``Disk`` and a ``Cache`` that opens fast.

``TextDisk`` accepts string keys and string (JSON text) or integer (hit
counter) values. Small values live in the SQLite row, large ones in a ``.val``
text file (diskcache's text mode). A row written by some other program in
pickle or binary mode comes back as a ``Refused`` marker, which the store
treats as an invalid entry: nothing read from the cache is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from collections.abc import Callable

import diskcache
from diskcache.core import DBNAME, MODE_BINARY, MODE_PICKLE, MODE_RAW, MODE_TEXT, UNKNOWN

_MODE_NAMES = {MODE_RAW: "raw", MODE_BINARY: "binary", MODE_TEXT: "text", MODE_PICKLE: "pickle"}


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A stored value this store will not decode (pickled or binary)."""

    mode: str


class TextDisk(diskcache.Disk):
    """Keys and values as text or integers only; pickle is refused both ways."""

    def put(self, key: object) -> tuple[object, bool]:
        if type(key) is not str:
            raise TypeError(f"prescreen store keys are strings, got {type(key).__name__}")
        return key, True

    def get(self, key: object, raw: bool) -> object:
        if not raw:
            return Refused("pickle")
        return bytes(key) if isinstance(key, (bytes, memoryview)) else key

    def store(self, value: object, read: bool, key: object = UNKNOWN) -> tuple[int, int, str | None, object]:
        if type(value) is str or (type(value) is int and not read):
            return super().store(value, False, key=key)
        raise TypeError(f"prescreen stores JSON text or integers, got {type(value).__name__}")

    def fetch(self, mode: int, filename: str | None, value: object, read: bool) -> object:
        if mode == MODE_RAW:
            return bytes(value) if isinstance(value, (bytes, memoryview)) else value
        if mode == MODE_TEXT:
            return super().fetch(mode, filename, value, False)
        return Refused(_MODE_NAMES.get(mode, f"mode {mode}"))


class FastOpenCache(diskcache.Cache):
    """A ``diskcache.Cache`` whose initialisation gives up on a locked database after ``open_timeout``.

    diskcache retries the statements of ``__init__`` for 60 s while another
    connection holds a lock; a compile must not wait that long. So an existing
    database is first probed with one read under a short SQLite timeout (which
    fails fast on an exclusive lock, a corrupt file or an unreadable one), and
    the statement retry loop (diskcache's ``_sql_retry``) is bounded too.
    """

    open_timeout: float = 1.0

    def __init__(self, directory: str, *, open_timeout: float, **kwargs: object) -> None:
        self.open_timeout = open_timeout
        db = os.path.join(directory, DBNAME)
        if os.path.isfile(db):
            probe = sqlite3.connect(db, timeout=open_timeout)
            try:
                probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                probe.close()
        super().__init__(directory, **kwargs)

    @property
    def _sql_retry(self) -> Callable[..., sqlite3.Cursor]:
        sql = self._sql
        limit = self.open_timeout

        def execute(statement: str, *args: object, **kwargs: object) -> sqlite3.Cursor:
            start = time.monotonic()
            while True:
                try:
                    return sql(statement, *args, **kwargs)
                except sqlite3.OperationalError as exc:
                    if str(exc) != "database is locked" or time.monotonic() - start > limit:
                        raise
                    time.sleep(0.005)

        return execute
