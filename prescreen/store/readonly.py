"""Read a diskcache directory that cannot be written (a read-only image or mount).

diskcache cannot open such a directory at all: opening writes settings and,
in WAL mode, needs to create ``-wal``/``-shm`` files. Decisions baked into a
deployment image must still be readable, so this opens ``cache.db`` with
SQLite's read-only URI modes (``mode=ro``, then ``immutable=1``) and decodes
rows with the same text-only ``TextDisk``. With ``immutable=1`` the contents
of a leftover ``-wal`` file are not seen (those entries read as misses).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from diskcache.core import DBNAME

from prescreen.store.textdisk import TextDisk, fetch_row, select_value


class ReadOnlyCache:
    """The read half of ``diskcache.Cache`` over a directory nobody may write."""

    def __init__(self, directory: Path, timeout: float) -> None:
        self.directory = directory
        self.disk = TextDisk(str(directory))
        db = directory / DBNAME
        if not db.is_file():
            raise FileNotFoundError(f"no {DBNAME} in {directory}")
        uri = db.resolve().as_uri()
        last: sqlite3.Error | None = None
        for query in ("?mode=ro", "?immutable=1"):
            try:
                con = sqlite3.connect(uri + query, uri=True, timeout=timeout, check_same_thread=False)
                con.execute("SELECT count(*) FROM Cache").fetchone()
            except sqlite3.Error as exc:
                last = exc
                continue
            self.con = con
            self.mode = query.lstrip("?")
            self._lock = threading.Lock()
            return
        assert last is not None
        raise last

    def get(self, key: str) -> object:
        """The decoded value under ``key`` (text, int or ``Refused``), or None."""
        with self._lock:
            row = select_value(self.con, key)
        return fetch_row(self.disk, row)

    get_text = get  # what ``FastOpenCache`` reads a lookup's value with

    def iterkeys(self) -> Iterator[object]:
        with self._lock:
            rows = self.con.execute("SELECT key FROM Cache WHERE raw = 1 ORDER BY rowid").fetchall()
        for (key,) in rows:
            yield key

    def key_rows(self) -> list[tuple[object, object]]:
        """(key, value file name) of every text-keyed row."""
        with self._lock:
            return list(self.con.execute("SELECT key, filename FROM Cache WHERE raw = 1 ORDER BY rowid").fetchall())

    def volume(self) -> int:
        return sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())

    def close(self) -> None:
        self.con.close()
