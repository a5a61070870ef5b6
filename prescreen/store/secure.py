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
  A symlink counts as the directory it points to, and every symlink met on
  the way from ``/`` down (a component of the path, or of a link's target)
  must itself be owned by the current user or root, as OpenSSH's StrictModes
  requires: whoever owns a link can re-point it at their own database.
- ``create_private_file`` makes a file 0600 (``cache.db`` is created this way
  before SQLite opens it, and SQLite gives its ``-wal``/``-shm`` files the
  database's mode); ``TextDisk`` makes its ``.val`` files 0600 too.
- ``value_file`` accepts only the names diskcache itself generates
  (``ab/cd/<28 hex>.val``), so no row can make prescreen read, write or
  delete a path outside the directory.
- ``open_regular`` opens a file prescreen reads (a ``.val`` file, the signing
  key file) with ``O_NOFOLLOW | O_NONBLOCK`` and checks that it is a regular
  file before reading: a FIFO planted in its place is refused at once instead
  of blocking the compile, a directory or device is refused too.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

_VALUE_NAME = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")
MAX_SYMLINKS = 40  # as Linux's ELOOP limit: more links on one path is a loop
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFLNK: "a symlink"}


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
        real = _resolve_checking_links(directory)
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


def _resolve_checking_links(directory: Path) -> Path:
    """``directory`` resolved one component at a time from ``/``, as the kernel does; raises
    ``InsecureDirectory`` at a symlink, on the path or in a link's target, owned by another user than you or
    root (``OSError`` where a component cannot be read)."""
    todo = list(reversed(os.path.join(os.getcwd(), directory).split("/")))
    current, links = "/", 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        path = os.path.join(current, name)
        st = os.lstat(path)
        if not stat.S_ISLNK(st.st_mode):
            current = path
            continue
        if not _trusted_owner(st.st_uid):
            raise InsecureDirectory(
                f"{path} (on the path to {directory}) is a symlink owned by uid {st.st_uid}, not by you "
                f"(uid {current_uid()}) or root: its owner can point it elsewhere"
            )
        links += 1
        if links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(directory))
        target = os.readlink(path)
        if target.startswith("/"):
            current = "/"
        todo.extend(reversed(target.split("/")))
    return Path(current)


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


class NotRegularFile(OSError):
    """A path prescreen reads that is not a regular file (a FIFO, a directory, a device); the message says which."""


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its ``fstat``, opened without following a symlink (``ELOOP``) or
    waiting for a FIFO's writer (``O_NONBLOCK``); raises ``NotRegularFile`` unless it is a regular file, else
    ``OSError`` as ``os.open``. The caller closes the descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "another kind of file")
            raise NotRegularFile(errno.EINVAL, f"it is {kind}, not a regular file", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, st
