"""Recover from a corrupt ``cache.db``: move it aside, start afresh, keep every valid entry that can be read.

Under an exclusive ``flock`` on ``recovery.lock`` (so that several processes
finding the same corrupt file do not move each other's fresh database aside,
none is opening the files being moved, and none is half-way through a write:
openers and writers hold the lock shared), the file is checked again; if it
is still corrupt, its ``-wal``/``-shm`` companions and then ``cache.db`` are
renamed to ``cache.db.corrupt-<time>-<pid>`` (``-wal``/``-shm``), the name
first written to ``recovery.pending``. The caller opens a fresh cache and
calls ``salvage``: every row still readable from each moved-aside database,
read one rowid at a time, and every ``.val`` text file no row refers to
(large entries; each names its own key), are validated and added back; the
database is renamed ``cache.db.salvaged-...`` and orphaned ``.val`` files are
deleted; ``recovery.pending`` goes last. A recovery killed at any point leaves
``recovery.pending``, and the next open finishes it (salvage is idempotent).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import diskcache
from diskcache.core import DBNAME

from prescreen.store.entry import MAX_ENTRY_BYTES, InvalidEntry, read_stored
from prescreen.store.textdisk import BoundedOpenCache, TextDisk, read_value_file
from prescreen.store.trust import Signer, create_private_file, open_regular, value_file

log = logging.getLogger("prescreen.store")
LOCK_NAME = "recovery.lock"
PENDING_NAME = "recovery.pending"
MOVED_PREFIX: str = DBNAME + ".corrupt-"
LOCK_WAIT = 30.0
RECOVERY_WAIT = 10.0  # how long a recovering process waits for another one's recovery (openers: their timeout)
_SUFFIX = re.compile(r"[0-9]+-[0-9]+")
_ROWID_GAP = 10_000  # without max(rowid), keep trying this many rowids past the last one found


def flock_within(handle: IO[str], mode: int, wait: float) -> bool:
    """Take ``flock(mode)`` on ``handle``, polling for at most ``wait`` seconds; True when taken."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)


@contextlib.contextmanager
def recovery_lock(directory: Path, *, shared: bool = False, wait: float = LOCK_WAIT) -> Iterator[bool | None]:
    """Hold ``recovery.lock``: exclusive while recovering, shared while opening.

    Yields True when held, False when another process held it for over
    ``wait`` seconds, None when there is no lock file to hold.

    Opening under the shared lock means no process is half-way through
    opening ``cache.db`` (database file opened, ``-wal``/``-shm`` not yet)
    while another renames those files aside, which SQLite reports as a disk
    I/O error. An opener that cannot create the lock file (a read-only
    directory) or waits longer than ``wait`` goes on without it; recovery
    raises instead.
    """
    try:
        handle = open_lock_file(directory)
    except OSError:
        if not shared:
            raise
        yield None
        return
    with handle:
        if not flock_within(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, wait):
            if not shared:
                raise TimeoutError(f"{directory / LOCK_NAME} held for over {wait:g} s")
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_lock_file(directory: Path) -> IO[str]:
    """``recovery.lock``, created 0600 (nobody else can open it to hold it), never through a symlink."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o600)  # one an older prescreen made 0644 (anyone could open it to hold it)
    return os.fdopen(fd, "r+")


def is_corrupt(db: Path, timeout: float) -> bool:
    """True when SQLite cannot read ``db`` as a database (a missing file is not corrupt)."""
    if not db.exists():
        return False
    try:
        con = sqlite3.connect(str(db), timeout=timeout)
    except sqlite3.Error:
        return False
    try:
        (result,) = con.execute("PRAGMA quick_check(1)").fetchone()
        return bool(result != "ok")
    except sqlite3.OperationalError as exc:
        return "malformed" in str(exc) or "not a database" in str(exc)
    except sqlite3.DatabaseError:
        return True
    finally:
        con.close()


def _pending_suffix(directory: Path) -> str | None:
    """The suffix ``recovery.pending`` names, if it is a regular file (``open_regular``: a FIFO planted in
    its place is not waited on) holding one."""
    try:
        fd, _ = open_regular(directory / PENDING_NAME)
        with os.fdopen(fd, "rb") as reader:
            text = reader.read(64).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _SUFFIX.fullmatch(text) else None


def _mark_pending(directory: Path, suffix: str) -> None:
    tmp = directory / f".{PENDING_NAME}.{os.getpid()}"
    create_private_file(tmp)
    tmp.write_text(suffix, encoding="ascii")
    os.replace(tmp, directory / PENDING_NAME)


def quarantine(directory: Path, timeout: float) -> Path | None:
    """Move a still-corrupt ``cache.db`` aside (companions first, then the database); None if it is healthy.

    The suffix is written to ``recovery.pending`` before anything moves, so a
    recovery killed half-way is finished, under the same name, by the next one.
    """
    db = directory / DBNAME
    if not is_corrupt(db, timeout):
        return None
    suffix = _pending_suffix(directory) or f"{int(time.time())}-{os.getpid()}"
    _mark_pending(directory, suffix)
    moved = directory / (MOVED_PREFIX + suffix)
    for companion in ("-wal", "-shm", ""):  # the database last: until it moves, the next open finds it corrupt
        path = directory / (DBNAME + companion)
        if path.exists():
            os.replace(path, directory / (moved.name + companion))
    return moved


def _next_rowid(con: sqlite3.Connection, last: int) -> int | None:
    """The rowid SQLite says follows ``last``, or None (at the end, or where a page cannot be read)."""
    try:
        row = con.execute("SELECT rowid FROM Cache WHERE rowid > ? ORDER BY rowid LIMIT 1", (last,)).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else int(row[0])


def _found(con: sqlite3.Connection, rowid: int) -> bool:
    """Whether a lookup by ``rowid`` finds a row (what restoring it takes)."""
    try:
        return con.execute("SELECT 1 FROM Cache WHERE rowid = ?", (rowid,)).fetchone() is not None
    except sqlite3.Error:
        return False


def _readable_rowids(con: sqlite3.Connection) -> Iterator[int]:
    """Every rowid a lookup finds, in order, without trusting a damaged page to say what comes next.

    The next rowid SQLite names is taken when a lookup by it finds it too. Otherwise (a page it cannot
    read; a garbled cell, whose rowid can be far past every row after it, so that taking it ended the
    walk there: 150 of 300 rows restored where 299 were readable; or what looks like the end) the
    integers after the last row found are tried one by one until a lookup finds a row again, and the
    walk goes on from there, or ``_ROWID_GAP`` in a row found nothing.
    """
    last, misses = 0, 0
    while misses <= _ROWID_GAP:
        following = _next_rowid(con, last)
        if following is not None and following > last and _found(con, following):
            last, misses = following, 0
            yield last
            continue
        while misses <= _ROWID_GAP:
            last, misses = last + 1, misses + 1
            if _found(con, last):
                misses = 0
                yield last
                break


def _rows(moved: Path, disk: TextDisk) -> Iterator[tuple[str, str | None]]:
    """(text, value file) of every row still readable from the moved-aside database, row by row.

    Each row is read on its own by rowid, so a damaged page loses only the rows on it. A value over
    ``MAX_ENTRY_BYTES`` is skipped before SQLite loads it (the connection's length limit).
    """
    try:
        con = sqlite3.connect(moved.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error:
        return
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_ENTRY_BYTES)
    try:
        for rowid in _readable_rowids(con):
            try:
                row = con.execute(
                    "SELECT mode, filename, value FROM Cache WHERE rowid = ? AND raw = 1", (rowid,)
                ).fetchone()
            except sqlite3.Error:
                continue
            if row is None:
                continue
            mode, filename, value = row
            text = disk.fetch(mode, filename, value, False)
            if isinstance(text, str):
                yield text, filename if isinstance(filename, str) else None
    finally:
        con.close()


def _value_files(directory: Path) -> Iterator[Path]:
    for sub in sorted(directory.iterdir()):
        if sub.is_dir() and not sub.is_symlink() and len(sub.name) == 2:
            yield from sorted(sub.glob("*/*.val"))


def _restore(cache: diskcache.Cache, directory: Path, text: str, signer: Signer | None) -> bool | None:
    """True: re-added (the stored text as it was, signature and all); False: one already there; None: invalid.

    Valid as a lookup reads it (``read_stored``): a stricter entry is restored whatever its signature."""
    try:
        entry, _unverified = read_stored(text, signer=signer)
    except InvalidEntry:
        return None
    return bool(cache.add(entry.key, text))


def _referenced(cache: diskcache.Cache) -> set[str]:
    return {name for (name,) in cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()}


def salvage(cache: diskcache.Cache, directory: Path, signer: Signer | None = None) -> int:
    """Finish every recovery in ``directory``: re-add the valid entries of each moved-aside database and of
    each ``.val`` file no row refers to, then mark the databases done and delete the orphans; returns how many.

    Idempotent (``add`` keeps an entry already there; a database is renamed ``.salvaged-`` only after all its
    rows were tried), so a run killed at any point is finished by the next. Call it under the exclusive lock:
    the orphan sweep relies on no writer being half-way through a put.
    """
    disk = TextDisk(str(directory))
    restored = 0
    for moved in sorted(directory.glob(MOVED_PREFIX + "*")):
        if not _SUFFIX.fullmatch(moved.name[len(MOVED_PREFIX) :]):
            continue  # a -wal/-shm companion
        for text, _filename in _rows(moved, disk):
            restored += _restore(cache, directory, text, signer) is True
        done = MOVED_PREFIX.replace(".corrupt-", ".salvaged-") + moved.name[len(MOVED_PREFIX) :]
        for companion in ("-wal", "-shm", ""):
            with contextlib.suppress(FileNotFoundError):
                os.replace(directory / (moved.name + companion), directory / (done + companion))
    referenced = _referenced(cache)
    for path in list(_value_files(directory)):  # listed first: a restore writes files of its own
        name = str(path.relative_to(directory))
        if name in referenced or value_file(str(directory), name) is None:
            continue
        try:
            found = read_value_file(str(path))
        except OSError:
            continue
        if isinstance(found, str):
            restored += _restore(cache, directory, found, signer) is True  # re-added under a file of its own
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(FileNotFoundError):
        (directory / PENDING_NAME).unlink()
    return restored


def remove_orphans(cache: diskcache.Cache, directory: Path) -> int:
    """Delete every ``.val`` file no row refers to (left by a process killed between a file and its commit).

    Call it under the exclusive lock, for the same reason as ``salvage``. Returns how many went.
    """
    referenced = _referenced(cache)
    removed = 0
    for path in list(_value_files(directory)):
        name = str(path.relative_to(directory))
        if name not in referenced and value_file(str(directory), name) is not None:
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


def needs_salvage(directory: Path) -> bool:
    """A recovery was started and not finished (killed, or another process is on it)."""
    return (directory / PENDING_NAME).exists()


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, None if it cannot be read: which file a store opened."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def recover(
    directory: Path, timeout: float, signer: Signer | None, open_fresh: Callable[[], BoundedOpenCache]
) -> tuple[BoundedOpenCache, tuple[int, int] | None, Path | None, int]:
    """Under the exclusive lock: move a still-corrupt ``cache.db`` aside, open a fresh one and restore what is
    valid. Returns the fresh cache, its ``file_id``, the moved-aside database (None where ``cache.db`` was
    healthy by then; named ``.salvaged-`` once salvaged) and how many entries were restored; raises on failure."""
    with recovery_lock(directory, wait=max(timeout, RECOVERY_WAIT)):
        moved = quarantine(directory, timeout)
        create_private_file(directory / DBNAME)
        cache = open_fresh()
        identity = file_id(directory / DBNAME)
        restored = salvage(cache, directory, signer)
    if moved is not None and not moved.exists():  # salvaged: renamed so that no later open salvages it again
        moved = moved.with_name(moved.name.replace(".corrupt-", ".salvaged-"))
    return cache, identity, moved, restored


def resume(cache: diskcache.Cache, directory: Path, signer: Signer | None) -> None:
    """Finish a recovery another process started and did not finish (it was killed), if nobody is on it."""
    try:
        with recovery_lock(directory, wait=0.0):
            restored = salvage(cache, directory, signer)
    except Exception:  # held: the recovering process finishes it; else the next open tries again
        return
    log.info("prescreen disk store at %s: finished an interrupted recovery (%d entries restored)", directory, restored)
