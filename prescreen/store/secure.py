"""Who may write the cache directory, and which paths a row may name.

The store's files decide what a compile does, so a directory another user can
write is a way to plant a decision (a ``tune`` where the truth is an OOM) or,
through diskcache's ``filename`` column, to make prescreen delete files
outside the cache. As OpenSSH does for ``~/.ssh``:

- ``private_directory`` creates the cache directory and every missing parent
  with mode 0700 (whatever the umask), then ``check_directory`` refuses a
  directory, or any directory above it, that is owned by another user than
  the current one or root, or that group or others can write (a root-owned
  sticky directory such as ``/tmp`` is fine: nobody can rename what is in it).
  A symlink counts as the directory it points to, and must itself be owned by
  the current user or root.
- ``create_private_file`` makes a file 0600 (``cache.db`` is created this way
  before SQLite opens it, and SQLite gives its ``-wal``/``-shm`` files the
  database's mode); ``TextDisk`` makes its ``.val`` files 0600 too.
- ``value_file`` accepts only the names diskcache itself generates
  (``ab/cd/<28 hex>.val``), so no row can make prescreen read, write or
  delete a path outside the directory.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

_VALUE_NAME = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")


class InsecureDirectory(Exception):
    """A cache directory prescreen refuses to use; the message says why."""


def current_uid() -> int:
    """The user the store runs as (a function so tests can stand in for another user)."""
    return os.geteuid()


def _trusted_owner(uid: int) -> bool:
    return uid in (current_uid(), 0)


def _describe(path: Path, st: os.stat_result) -> str:
    return f"{path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"


def private_directory(directory: Path) -> None:
    """Create ``directory`` and its missing parents with mode 0700; raises OSError if it cannot."""
    missing: list[Path] = []
    path = directory
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # created meanwhile by someone else: check_directory judges it
            continue
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask


def check_directory(directory: Path) -> None:
    """Raise ``InsecureDirectory`` unless ``directory`` and every directory above it are safe (see module doc)."""
    try:
        link = os.lstat(directory)
        if stat.S_ISLNK(link.st_mode) and not _trusted_owner(link.st_uid):
            raise InsecureDirectory(f"{directory} is a symlink owned by uid {link.st_uid}, not by you")
        real = directory.resolve(strict=True)
    except OSError as exc:
        raise InsecureDirectory(f"cannot check {directory}: {exc}") from None
    path = real
    while True:
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise InsecureDirectory(f"{path} is not a directory")
        if not _trusted_owner(st.st_uid):
            raise InsecureDirectory(f"{_describe(path, st)} is owned by another user (you are uid {current_uid()})")
        writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable_by_others and not (path != real and st.st_mode & stat.S_ISVTX and st.st_uid == 0):
            raise InsecureDirectory(f"{_describe(path, st)} can be written by group or others")
        if path == path.parent:
            return
        path = path.parent


def check_owned_file(path: Path) -> None:
    """Raise ``InsecureDirectory`` if ``path`` exists and is owned by another user than you or root."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not _trusted_owner(st.st_uid):
        raise InsecureDirectory(f"{_describe(path, st)} is owned by another user (you are uid {current_uid()})")


def create_private_file(path: str | os.PathLike[str]) -> None:
    """Create ``path`` empty with mode 0600 unless it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def value_file(directory: str, filename: object) -> str | None:
    """The full path of a ``.val`` file named by a row, or None when the name is not one diskcache makes."""
    if not isinstance(filename, str) or not _VALUE_NAME.fullmatch(filename.replace(os.sep, "/")):
        return None
    return os.path.join(directory, filename)
