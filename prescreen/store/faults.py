"""Classify the exceptions a store backend raises into the faults the store reacts to."""

from __future__ import annotations

import enum
import errno
import sqlite3

import diskcache


class Fault(str, enum.Enum):
    """What went wrong, as the warning names it; each kind is warned about once per store."""

    LOCKED = "database is locked by another process"
    READ_ONLY = "cache is read-only"
    FULL = "disk is full"
    CORRUPT = "database file is corrupt"
    UNAVAILABLE = "cache cannot be opened"
    INSECURE = "cache directory is not safe to use"
    ERROR = "store error"


_READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


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
        if exc.errno in _FULL_ERRNOS:
            return Fault.FULL
        if exc.errno in _READ_ONLY_ERRNOS:
            return Fault.READ_ONLY
        return Fault.UNAVAILABLE
    return Fault.ERROR
