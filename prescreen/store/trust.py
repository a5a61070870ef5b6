"""Trust: where the cache directory is, who may write it, which paths a row may name, and signed entries.

As OpenSSH does for ``~/.ssh``: missing directories are made 0700 and files 0600; a directory (or one above it)
owned by another user than you or root, or that group or others can write (a root-owned sticky ``/tmp`` is fine),
is refused, as is a symlink on the way owned by another user; a row may name only a ``.val`` file diskcache makes;
a file prescreen reads must be a regular file (a planted FIFO is refused, never waited on).

With ``PRESCREEN_SIGNING_KEY`` (or ``_FILE``) every entry written is signed over its stored text with ``hits`` 0.
A signature is what it takes to *loosen*: an unsigned or forged ``tune`` is a miss, a stricter entry is served
whatever its signature (``entry.read_stored``); ``import`` refuses every unsigned entry.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from diskcache.core import DBNAME

from prescreen.budget import parse_memory
from prescreen.decision import DETAIL_FIELDS
from prescreen.errors import ConfigError
from prescreen.plan import canonical_json

CACHE_DIR_ENV = "PRESCREEN_CACHE_DIR"
SIZE_LIMIT_ENV = "PRESCREEN_CACHE_SIZE_LIMIT"
DEFAULT_SIZE_LIMIT = 2**30
NAME_MAX, PATH_MAX = 255, 4096  # bytes in a path component, in a whole path (Linux)
_VALUE_NAME = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")
MAX_SYMLINKS = 40  # as Linux's ELOOP limit: more links on one path is a loop
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFLNK: "a symlink"}


def default_cache_dir() -> Path:
    """``$PRESCREEN_CACHE_DIR``, else ``$TORCHINDUCTOR_CACHE_DIR/prescreen``, else the user cache dir."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    for parent in (os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME")):
        if parent:
            return Path(parent).expanduser() / "prescreen"
    try:
        return Path.home() / ".cache" / "prescreen"
    except (RuntimeError, KeyError):  # no HOME and no passwd entry
        return Path(tempfile.gettempdir()) / f"prescreen-{os.getuid()}"


def fixed_location(directory: Path) -> Path:
    """``directory`` made absolute once, when the store opens (a later ``os.chdir`` moves nothing); a
    ``ConfigError`` for a path no file system takes (a NUL byte, over ``NAME_MAX`` or ``PATH_MAX`` bytes)."""
    text = os.fspath(directory)
    if "\0" in text:
        raise ConfigError(f"cache directory {text!r} holds a NUL byte")
    try:
        absolute = directory.absolute()
    except OSError as exc:  # relative, and the working directory was removed
        raise ConfigError(f"cache directory {text!r} is relative and the working directory is gone "
                          f"({exc.strerror})") from None
    for part in absolute.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            raise ConfigError(f"cache directory {text[:60]!r}...: the component {part[:24]!r}... is {size} bytes, "
                              f"over the {NAME_MAX}-byte limit of a file name")
    if len(os.fsencode(absolute / DBNAME)) >= PATH_MAX:
        raise ConfigError(f"cache directory {text[:60]!r}... is over the {PATH_MAX}-byte limit of a path")
    return absolute


def resolve_size_limit(size_limit: int | str | None = None) -> int:
    """Bytes from the argument, else ``$PRESCREEN_CACHE_SIZE_LIMIT`` (e.g. ``512MiB``), else 1 GiB."""
    raw = size_limit if size_limit is not None else os.environ.get(SIZE_LIMIT_ENV, "").strip() or DEFAULT_SIZE_LIMIT
    try:
        return parse_memory(raw)
    except ConfigError:
        source = "size_limit" if size_limit is not None else SIZE_LIMIT_ENV
        raise ConfigError(f"{source}={raw!r} is not a size (expected e.g. 1GiB, 512MiB or a byte count)") from None


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
    """Raise ``InsecureDirectory`` unless ``directory`` and every directory above it are safe (module doc)."""
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
    """``directory`` resolved one component at a time from ``/``, as the kernel does; ``InsecureDirectory`` at a
    symlink (on the path or in a link's target) owned by another user than you or root."""
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
    """A read-only descriptor of ``path`` (the caller closes it) and its ``fstat``, opened without following a
    symlink or waiting for a FIFO's writer; ``NotRegularFile`` unless it is a regular file."""
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


SIGNING_KEY_ENV = "PRESCREEN_SIGNING_KEY"
SIGNING_KEY_FILE_ENV = "PRESCREEN_SIGNING_KEY_FILE"
MIN_KEY_BYTES = 16
SIGNATURE_FIELD = "signature"
_SCHEME = "hmac-sha256:"
# "signature" sorts after every other field of an entry's head, so it closes the head line.
_TAIL = re.compile(r',"signature":"(hmac-sha256:[0-9a-f]{64})"\}\Z')


class BadSignature(ValueError):
    """An entry without a valid signature where one is required; the message says which."""


class Signer:
    """Signs and verifies entry payloads with one shared secret."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"the signing key is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes")
        self._key = key

    def __repr__(self) -> str:
        return "Signer(<secret>)"

    def _mac(self, text: str) -> str:
        return _SCHEME + hmac.new(self._key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def sign(self, payload: Mapping[str, object]) -> str:
        """The signature of an entry payload: over its canonical text with hits 0 and no signature."""
        body = {k: v for k, v in payload.items() if k != SIGNATURE_FIELD}
        body["hits"] = 0
        return self._mac(canonical(body))

    def verify_text(self, text: str) -> None:
        """Raise ``BadSignature`` unless stored ``text`` is canonical with our signature as its last field."""
        head, newline, rest = text.partition("\n")  # rest: the details, record and plan lines
        match = _TAIL.search(head)
        if match is None:
            if f'"{SIGNATURE_FIELD}"' in head:
                raise BadSignature("entry's signature is malformed")
            raise BadSignature("entry is unsigned and a signing key is configured")
        if not hmac.compare_digest(match.group(1), self._mac(head[: match.start()] + "}" + newline + rest)):
            raise BadSignature("entry's signature does not verify with the configured signing key")


PLAN_FIELD = "plan"
DECISION_FIELD = "decision"
#: An entry's fields on its head line (with the signature): what a hit needs.
HEAD_FIELDS = frozenset({DECISION_FIELD, "dynamic", "key", "schema_version"})


def canonical(payload: Mapping[str, object]) -> str:
    """The one text of an entry payload that is signed and stored: four canonical JSON lines, the head
    (``HEAD_FIELDS`` and the signature, the decision without its ``DETAIL_FIELDS``), the details, the record
    (every other field but the plan) and the plan's own text (a plan that is not a string, from a hostile
    bundle, gets its JSON there: it signs, and is refused as an entry)."""
    head: dict[str, object] = {}
    record: dict[str, object] = {}
    for name, value in payload.items():
        if name in HEAD_FIELDS or name == SIGNATURE_FIELD:
            head[name] = value
        elif name != PLAN_FIELD:
            record[name] = value
    decision = head.get(DECISION_FIELD)
    details: dict[str, object] = {}
    if isinstance(decision, Mapping):
        head[DECISION_FIELD] = {k: v for k, v in decision.items() if k not in DETAIL_FIELDS}
        details = {k: decision[k] for k in DETAIL_FIELDS if k in decision}
    plan = payload.get(PLAN_FIELD)
    plan_line = plan if isinstance(plan, str) else canonical_json(plan)
    return "\n".join((canonical_json(head), canonical_json(details), canonical_json(record), plan_line))


def signer_from_env() -> Signer | None:
    """The configured signer, or None without a secret; raises ``ConfigError`` for a bad one. The secret is
    stripped of the ASCII whitespace around it, alike from the variable and the file."""
    secret = os.environ.get(SIGNING_KEY_ENV, "")
    path = os.environ.get(SIGNING_KEY_FILE_ENV, "").strip()
    if secret and path:
        raise ConfigError(f"set {SIGNING_KEY_ENV} or {SIGNING_KEY_FILE_ENV}, not both")
    if not path:
        return Signer(secret.encode().strip()) if secret else None
    where = f"{SIGNING_KEY_FILE_ENV}={path!r}"
    try:
        fd, st = open_regular(Path(path).expanduser())  # a FIFO, a directory or a symlink: refused, never waited on
    except OSError as exc:
        why = exc.strerror if isinstance(exc, NotRegularFile) else f"cannot read it ({exc.strerror})"
        raise ConfigError(f"{where}: {why}") from None
    with os.fdopen(fd, "rb") as handle:
        if st.st_mode & 0o077:
            raise ConfigError(f"{where} has mode {stat.S_IMODE(st.st_mode):04o}; "
                              "a key file must be readable by its owner only (chmod 600)")
        return Signer(handle.read(4096).strip())
