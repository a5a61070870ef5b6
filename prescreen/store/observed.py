"""Whether a disk store may hold an observed-OOM entry, answered without reading an entry.

A runtime-autotuning step's plan is concrete: its decision is a sum against the
budget, and an entry under its key can only differ from that computation by being
an ``observed_oom`` fallback (a fact a guarded benchmark recorded). Where the store
holds no such entry, a step that fits can skip its key, read and decode
(``prescreen.service.screens_without_store``). Two signals say so:

* the **marker**, a file ``observed-oom`` in the cache directory (mode 0600). Every
  write of an observed-OOM entry by this prescreen (``DiskStore.put``, a recovery's
  restore: ``before_write``) makes it first, so a process that sees no marker after a clean scan has
  seen every such write made since. It is never removed (``prescreen clear`` keeps it);
* a **scan** of the database (``scan``), once per opened database file (in the background
  once the hooks open the store: about 10 ms per 1,000 entries): entries written by an older
  prescreen, copied in with ``cache.db``, or restored by another process. It looks for
  the bytes ``observed_oom`` in the first ``HEAD_BYTES`` of every value (one query, in
  SQLite, and a read of each value file's start), so it finds every entry a lookup could
  serve as one. A hostile value that hides its reason (JSON escapes, padding before it)
  is not found: the step then benchmarks as upstream would, and the guard catches an
  out-of-memory error.

An older prescreen that writes an observed-OOM entry after this process scanned makes
no marker; this process's runtime steps do not see that entry (every other lookup does).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from diskcache.core import MODE_TEXT

from prescreen.decision import Decision, is_observed_oom
from prescreen.store.base import log
from prescreen.store.secure import create_private_file, value_file
from prescreen.store.textdisk import FastOpenCache, read_value_head

MARKER = "observed-oom"
#: The bytes every observed-OOM entry's reason starts with, as canonical JSON stores them.
NEEDLE = "observed_oom"
#: How far into a value the scan looks. A servable observed-OOM entry's reason starts within its first few
#: hundred bytes: the head line leads, and before ``reason`` its decision holds numbers, flags and a device
#: kind that must be the looking-up budget's.
HEAD_BYTES = 4096
_NEEDLE_BYTES = NEEDLE.encode()
_INLINE = ("SELECT 1 FROM Cache WHERE raw = 1 AND typeof(value) IN ('text', 'blob') "
           "AND instr(substr(CAST(value AS BLOB), 1, ?), CAST(? AS BLOB)) > 0 LIMIT 1")
_FILES = "SELECT filename FROM Cache WHERE raw = 1 AND mode = ? AND filename IS NOT NULL"


def marker_path(directory: str | os.PathLike[str]) -> str:
    return os.path.join(directory, MARKER)


def mark(directory: str | os.PathLike[str]) -> None:
    """Make the marker, before an observed-OOM entry is written. Where it cannot be made the entry is
    written all the same (every lookup reads it; only the runtime steps of a process that scanned the
    store before miss it), with a warning."""
    try:
        create_private_file(marker_path(directory))
    except OSError as exc:
        log.warning("prescreen disk store at %s: cannot make the %s marker (%s); processes that opened the store "
                    "already skip the store for runtime steps that fit", directory, MARKER, exc)


def before_write(directory: str | os.PathLike[str], decision: Decision) -> None:
    """What every write of an entry into ``directory``'s database does first: ``mark`` it where ``decision``
    is an observed-OOM fact."""
    if is_observed_oom(decision):
        mark(directory)


def scan(cache: FastOpenCache, directory: Path) -> bool:
    """True when no value in ``cache`` could be served as an observed-OOM entry (see the module docstring).

    A value file that cannot be read counts as holding one (a later lookup might read it);
    one that is gone or refused does not (a lookup serves neither).
    """
    if cache._sql(_INLINE, (HEAD_BYTES, NEEDLE)).fetchone() is not None:
        return False
    for (filename,) in cache._sql(_FILES, (MODE_TEXT,)).fetchall():
        path = value_file(str(directory), filename)
        if path is None:
            continue  # refused by every read
        try:
            head = read_value_head(path, HEAD_BYTES)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP):
                continue  # gone: a miss for every read; a symlink: refused by every read
            return False
        if _NEEDLE_BYTES in head:
            return False
    return True
