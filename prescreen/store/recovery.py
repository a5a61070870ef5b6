"""Recover from a corrupt ``cache.db``: move it aside, start afresh, keep every valid entry that can be read.

Under an exclusive ``flock`` on ``recovery.lock`` (so that several processes
finding the same corrupt file do not move each other's fresh database aside,
and none is opening the files being moved: openers hold the lock shared),
the file is checked again; if it is still corrupt, ``cache.db`` and its
``-wal``/``-shm`` companions are renamed to ``cache.db.corrupt-<time>-<pid>``.
The caller then opens a fresh cache and calls ``salvage``: rows still readable
from the moved-aside database, and the ``.val`` text files in the directory
(large entries; each names its own key), are validated as entries and added
back. Nothing is deleted except ``.val`` files whose entry was re-added.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import diskcache
from diskcache.core import DBNAME

from prescreen.store.entry import Entry, InvalidEntry
from prescreen.store.secure import value_file
from prescreen.store.signing import Signer
from prescreen.store.textdisk import TextDisk, read_value_file

LOCK_NAME = "recovery.lock"
LOCK_WAIT = 30.0
_COMPANIONS = ("", "-wal", "-shm")


def _flock_within(handle: IO[str], mode: int, wait: float) -> bool:
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
def recovery_lock(directory: Path, *, shared: bool = False, wait: float = LOCK_WAIT) -> Iterator[None]:
    """Hold ``recovery.lock``: exclusive while recovering, shared while opening.

    Opening under the shared lock means no process is half-way through
    opening ``cache.db`` (database file opened, ``-wal``/``-shm`` not yet)
    while another renames those files aside, which SQLite reports as a disk
    I/O error. An opener that cannot create the lock file (a read-only
    directory) or waits longer than ``wait`` goes on without it; recovery
    raises instead.
    """
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        handle = os.fdopen(fd, "r+")
    except OSError:
        if not shared:
            raise
        yield
        return
    with handle:
        if not _flock_within(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, wait):
            if not shared:
                raise TimeoutError(f"{directory / LOCK_NAME} held for over {wait:g} s")
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
        return result != "ok"
    except sqlite3.OperationalError as exc:
        return "malformed" in str(exc) or "not a database" in str(exc)
    except sqlite3.DatabaseError:
        return True
    finally:
        con.close()


def quarantine(directory: Path, timeout: float) -> Path | None:
    """Move a still-corrupt ``cache.db`` aside; returns its new path, or None if it was healthy (again)."""
    db = directory / DBNAME
    if not is_corrupt(db, timeout):
        return None
    suffix = f".corrupt-{int(time.time())}-{os.getpid()}"
    for companion in _COMPANIONS:
        path = directory / (DBNAME + companion)
        if path.exists():
            os.replace(path, directory / (DBNAME + companion + suffix))
    return directory / (DBNAME + suffix)


def _rows(moved: Path, disk: TextDisk) -> Iterator[tuple[str, str | None]]:
    """(text, value file) of each row still readable from the moved-aside database, until it breaks."""
    try:
        con = sqlite3.connect(moved.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error:
        return
    try:
        last = 0
        while True:
            row = con.execute(
                "SELECT rowid, mode, filename, value FROM Cache WHERE raw = 1 AND rowid > ? ORDER BY rowid LIMIT 1",
                (last,),
            ).fetchone()
            if row is None:
                return
            last, mode, filename, value = row
            try:
                text = disk.fetch(mode, filename, value, False)
            except OSError:
                continue
            if isinstance(text, str):
                yield text, filename
    except sqlite3.Error:
        return
    finally:
        con.close()


def _value_files(directory: Path) -> Iterator[Path]:
    for sub in sorted(directory.iterdir()):
        if sub.is_dir() and len(sub.name) == 2:
            yield from sorted(sub.rglob("*.val"))


def _restore(cache: diskcache.Cache, text: str, signer: Signer | None) -> bool | None:
    """True: re-added (the stored text as it was, signature and all); False: one already there; None: invalid."""
    try:
        entry = Entry.from_json(text, signer=signer)
    except InvalidEntry:
        return None
    return bool(cache.add(entry.key, text))


def salvage(cache: diskcache.Cache, directory: Path, moved: Path | None, signer: Signer | None = None) -> int:
    """Re-add the valid entries of a moved-aside database and of orphaned ``.val`` files; returns how many."""
    disk = TextDisk(str(directory))
    restored = 0
    for text, filename in _rows(moved, disk) if moved is not None else ():
        outcome = _restore(cache, text, signer)
        restored += outcome is True
        full = value_file(str(directory), filename)
        if outcome is not None and full is not None:  # only the moved-aside database referred to this file
            with contextlib.suppress(OSError):
                os.unlink(full)
    for path in _value_files(directory):
        try:
            found = read_value_file(str(path))
        except OSError:
            continue
        if isinstance(found, str) and _restore(cache, found, signer):
            restored += 1
            with contextlib.suppress(OSError):
                path.unlink()
    return restored
