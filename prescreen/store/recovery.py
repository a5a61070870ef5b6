"""Recover from a corrupt ``cache.db``: move it aside, start afresh, keep every valid entry that can be read.

It runs under ``recovery.lock`` held exclusive (openers and writers hold it shared, so no file moves under
them); ``recovery.pending`` stays until salvage (idempotent) is done, so the next open finishes a recovery
killed at any point. docs/store-and-trust.md ("Recovery") describes the sequence.
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

import diskcache
from diskcache.core import DBNAME

from prescreen.decision import is_observed_oom
from prescreen.store.entry import MAX_ENTRY_BYTES, InvalidEntry, read_stored
from prescreen.store.textdisk import EVICT_LAST, BoundedOpenCache, Fault, TextDisk, classify, read_value_file
from prescreen.store.trust import Signer, create_private_file, open_regular, value_file

log = logging.getLogger("prescreen.store")
LOCK_NAME = "recovery.lock"
PENDING_NAME = "recovery.pending"
MOVED_PREFIX: str = DBNAME + ".corrupt-"
_SUFFIX = re.compile(r"[0-9]+-[0-9]+")
_ROWID_GAP = 10_000  # without max(rowid), keep trying this many rowids past the last one found


@contextlib.contextmanager
def recovery_lock(directory: Path, *, shared: bool = False, wait: float = 30.0) -> Iterator[bool | None]:
    """Hold ``recovery.lock``: exclusive while recovering, shared while opening or writing (an open racing a rename of
    ``-wal``/``-shm`` is a disk I/O error). Yields True when held; an opener goes on without it, getting False
    after ``wait`` seconds or None with no lock file to hold, where a recovery raises."""
    try:  # 0600, so nobody else can open it to hold it; never through a symlink
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        if not shared:
            raise
        yield None
        return
    try:  # the bare descriptor: a file object costs seven more system calls a write, each a GIL release
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o600)  # one an older prescreen made 0644
        held, deadline = False, time.monotonic() + wait
        while not held:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.002)
        if not held:
            if not shared:
                raise TimeoutError(f"{directory / LOCK_NAME} held for over {wait:g} s")
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def is_corrupt(db: Path, timeout: float) -> bool:
    """True when SQLite cannot read ``db`` as a database (a missing file is not corrupt)."""
    if not db.exists():
        return False
    try:
        con = sqlite3.connect(str(db), timeout=timeout)
        try:
            (result,) = con.execute("PRAGMA quick_check(1)").fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:  # locked or unreadable is not corrupt
        return classify(exc) is Fault.CORRUPT
    return bool(result != "ok")


def _pending_suffix(directory: Path) -> str | None:
    """The suffix ``recovery.pending`` names, read only from a regular file (a planted FIFO is not waited on)."""
    try:
        fd, _ = open_regular(directory / PENDING_NAME)
        with os.fdopen(fd, "rb") as reader:
            text = reader.read(64).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _SUFFIX.fullmatch(text) else None


def quarantine(directory: Path, timeout: float) -> Path | None:
    """Move a still-corrupt ``cache.db`` aside (companions first), its name written to ``recovery.pending``
    before anything moves; None if it is healthy."""
    if not is_corrupt(directory / DBNAME, timeout):
        return None
    suffix = _pending_suffix(directory) or f"{int(time.time())}-{os.getpid()}"
    tmp = directory / f".{PENDING_NAME}.{os.getpid()}"
    create_private_file(tmp)
    tmp.write_text(suffix, encoding="ascii")
    os.replace(tmp, directory / PENDING_NAME)
    moved = directory / (MOVED_PREFIX + suffix)
    for companion in ("-wal", "-shm", ""):  # the database last: until it moves, the next open finds it corrupt
        path = directory / (DBNAME + companion)
        if path.exists():
            os.replace(path, directory / (moved.name + companion))
    return moved


def _found(con: sqlite3.Connection, rowid: int) -> bool:
    try:
        return con.execute("SELECT 1 FROM Cache WHERE rowid = ?", (rowid,)).fetchone() is not None
    except sqlite3.Error:
        return False


def _readable_rowids(con: sqlite3.Connection) -> Iterator[int]:
    """Every rowid a lookup finds, in order, not trusting a damaged page: SQLite's next rowid is taken when a
    lookup finds it too; otherwise the integers after the last found are tried, up to ``_ROWID_GAP`` misses."""
    last, misses = 0, 0
    while misses <= _ROWID_GAP:
        following = None
        if misses == 0:
            with contextlib.suppress(sqlite3.Error):
                row = con.execute("SELECT rowid FROM Cache WHERE rowid > ? ORDER BY rowid LIMIT 1", (last,)).fetchone()
                following = None if row is None else int(row[0])
        if following is not None and following > last and _found(con, following):
            last = following
        else:
            last, misses = last + 1, misses + 1
            if not _found(con, last):
                continue
        misses = 0
        yield last


def _rows(moved: Path, disk: TextDisk) -> Iterator[str]:
    """The text of every row still readable from the moved-aside database, each read on its own by rowid (a
    damaged page loses only its rows); a value over ``MAX_ENTRY_BYTES`` is skipped unloaded."""
    try:
        con = sqlite3.connect(moved.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error:
        return
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_ENTRY_BYTES)
    try:
        for rowid in _readable_rowids(con):
            try:
                row = con.execute("SELECT mode, filename, value FROM Cache WHERE rowid = ? AND raw = 1",
                                  (rowid,)).fetchone()
            except sqlite3.Error:
                continue
            text = None if row is None else disk.fetch(row[0], row[1], row[2], False)
            if isinstance(text, str):
                yield text
    finally:
        con.close()


def _restore(cache: diskcache.Cache, text: str, signer: Signer | None) -> bool:
    """Re-add ``text`` as it was (signature and all) if valid as a lookup reads it (``read_stored``: a stricter
    entry whatever its signature); False when invalid or one is already there."""
    try:
        entry, _unverified = read_stored(text, signer=signer)
    except InvalidEntry:
        return False
    with cache.transact():  # a fact and its mark together: a salvage killed between them would not mark it
        added = bool(cache.add(entry.key, text))
        if added and is_observed_oom(entry.decision):
            cache._sql(EVICT_LAST, (entry.key,))
    return added


def remove_orphans(cache: diskcache.Cache, directory: Path, restore: Callable[[str], bool] | None = None) -> int:
    """Delete every ``.val`` file no row refers to (a process killed between a file and its commit), first
    passing its text to ``restore``; how many were deleted, or with ``restore`` how many it restored.

    Call it under the exclusive lock: no writer may be half-way through a put.
    """
    referenced = {name for (name,) in cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL")}
    paths = [path for sub in sorted(directory.iterdir()) if sub.is_dir() and not sub.is_symlink()
             and len(sub.name) == 2 for path in sorted(sub.glob("*/*.val"))]  # listed first: a restore adds files
    count = 0
    for path in paths:
        name = str(path.relative_to(directory))
        if name in referenced or value_file(str(directory), name) is None:
            continue
        if restore is not None:
            try:
                found = read_value_file(str(path))
            except OSError:
                continue
            count += isinstance(found, str) and restore(found)  # re-added under a file of its own
        with contextlib.suppress(OSError):
            path.unlink()
            count += restore is None
    return count


def salvage(cache: diskcache.Cache, directory: Path, signer: Signer | None = None) -> int:
    """Finish every recovery in ``directory`` (idempotent; call it under the exclusive lock): re-add the valid
    entries of each moved-aside database (renamed ``.salvaged-`` once all its rows were tried) and of each
    orphaned ``.val`` file, then delete the orphans; returns how many were restored."""
    disk = TextDisk(str(directory))
    restored = 0
    for moved in sorted(directory.glob(MOVED_PREFIX + "*")):
        suffix = moved.name[len(MOVED_PREFIX):]
        if not _SUFFIX.fullmatch(suffix):
            continue  # a -wal/-shm companion
        for text in _rows(moved, disk):
            restored += _restore(cache, text, signer)
        for companion in ("-wal", "-shm", ""):
            with contextlib.suppress(FileNotFoundError):
                os.replace(directory / (moved.name + companion), directory / f"{DBNAME}.salvaged-{suffix}{companion}")
    restored += remove_orphans(cache, directory, lambda text: _restore(cache, text, signer))
    with contextlib.suppress(FileNotFoundError):
        (directory / PENDING_NAME).unlink()
    return restored


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
    """Under the exclusive lock: move a still-corrupt ``cache.db`` aside, open a fresh one, restore what is valid.
    Returns the cache, its ``file_id``, the moved database (None where ``cache.db`` was healthy by then) and how
    many entries came back; raises on failure."""
    with recovery_lock(directory, wait=max(timeout, 10.0)):  # another process's recovery (openers: their timeout)
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
    if not (directory / PENDING_NAME).exists():
        return
    try:
        with recovery_lock(directory, wait=0.0):
            restored = salvage(cache, directory, signer)
    except Exception:  # held: the recovering process finishes it; else the next open tries again
        return
    log.info("prescreen disk store at %s: finished an interrupted recovery (%d entries restored)", directory, restored)
