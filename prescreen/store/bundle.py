"""Export a store's decisions to a versioned JSON bundle, and import one (validating every entry)."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from prescreen.errors import ConfigError
from prescreen.key import SCHEMA_VERSION
from prescreen.store.base import Store, log
from prescreen.store.entry import MAX_ENTRY_BYTES, Entry, InvalidEntry, UnsignedEntry

BUNDLE_FORMAT = "prescreen-bundle"
BUNDLE_VERSION = 1


def export_bundle(store: Store, path: str | os.PathLike[str], keys: Iterable[str] | None = None) -> int:
    """Write every valid entry of ``store`` (only those under ``keys``, given them) to ``path`` atomically;
    returns how many."""
    wanted = None if keys is None else frozenset(keys)
    entries = sorted((e for e in store.entries() if wanted is None or e.key in wanted), key=lambda e: e.key)
    bundle = {
        "format": BUNDLE_FORMAT,
        "bundle_version": BUNDLE_VERSION,
        "schema_version": SCHEMA_VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "entries": [e.signed_payload(store.signer) for e in entries],
    }
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(bundle, out, sort_keys=True, separators=(",", ":"))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(entries)


_CHUNK = 1 << 20
_WS = " \t\n\r"
_HEADER_LIMIT = 4096  # a header value (format name, versions, a date) is a few bytes


class _Stream:
    """JSON values pulled one at a time from a file, holding one value (at most the entry cap) and a chunk."""

    def __init__(self, path: str | os.PathLike[str], where: str) -> None:
        self.where = where
        try:
            self.file = open(path, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read bundle {where}: {exc}") from None
        self.buf, self.pos, self.eof = "", 0, False
        self.decoder = json.JSONDecoder()  # NaN/Infinity parse; the entry check refuses them, one entry at a time

    def close(self) -> None:
        self.file.close()

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.file.read(_CHUNK)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read bundle {self.where}: {exc}") from None
        if not chunk:
            self.eof = True
            return False
        self.buf, self.pos = self.buf[self.pos :] + chunk, 0
        return True

    def bad(self, what: str) -> ConfigError:
        return ConfigError(f"{self.where} is not a prescreen bundle: {what}")

    def peek(self) -> str:
        """The next character after whitespace ('' at the end of the file)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def expect(self, chars: str) -> str:
        found = self.peek()
        if not found or found not in chars:
            raise self.bad(f"expected one of {chars!r}, found {found or 'the end of the file'!r}")
        self.pos += 1
        return found

    def value(self, limit: int, what: str) -> object:
        """The next JSON value; ``ConfigError`` if it is malformed or longer than ``limit`` characters."""
        self.peek()
        while True:
            try:
                found, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise self.bad(f"{what} is nested too deeply") from None
            except ValueError as exc:
                if len(self.buf) - self.pos > limit:
                    raise self.bad(f"{what} is longer than {limit} bytes") from None
                if self._fill():
                    continue
                raise self.bad(f"{what}: {exc}") from None
            if end == len(self.buf) and not self.eof and self._fill():
                continue  # the value touched the end of what was read: a number may go on
            if end - self.pos > limit:
                raise self.bad(f"{what} is longer than {limit} bytes")
            self.pos = end
            return found

    def members(self) -> Iterator[tuple[str, "_Stream"]]:
        """The top-level object's keys, each with the stream positioned at its value (which the caller reads)."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            name = self.value(_HEADER_LIMIT, "a top-level key")
            if not isinstance(name, str):
                raise self.bad("a top-level key is not a string")
            self.expect(":")
            yield name, self
            if self.expect(",}") == "}":
                break
        if self.peek():
            raise self.bad("text after the bundle object")

    def items(self, what: str) -> Iterator[object]:
        """The elements of an array, one at a time, each at most one entry's size."""
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        index = 0
        while True:
            yield self.value(MAX_ENTRY_BYTES, f"{what} #{index}")
            index += 1
            if self.expect(",]") == "]":
                return


def check_bundle(path: str | os.PathLike[str]) -> int:
    """The checks ``import_bundle`` makes before it stores anything, storing nothing: the header (wherever its
    keys are) and the shape of every entry; a ``ConfigError`` if ``path`` is not a bundle of this format and
    schema. Returns the number of entries."""
    where = str(path)
    stream = _Stream(path, where)
    header: dict[str, object] = {}
    count = None
    try:
        for name, member in stream.members():
            if name != "entries":
                header[name] = member.value(_HEADER_LIMIT, f"header {name!r}")
            elif member.peek() == "[":
                count = sum(1 for _ in member.items("entry"))
            else:
                found = type(member.value(_HEADER_LIMIT, "entries")).__name__
                raise ConfigError(f"{where}: 'entries' must be a list, found {found}")
    finally:
        stream.close()
    if header.get("format") != BUNDLE_FORMAT:
        raise stream.bad(f"format is {header.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    if header.get("bundle_version") != BUNDLE_VERSION:
        raise ConfigError(f"{where} has bundle_version {header.get('bundle_version')!r}; "
                          f"this prescreen reads bundle_version {BUNDLE_VERSION}")
    if header.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"{where} holds decisions of schema {header.get('schema_version')!r}; this prescreen "
                          f"uses schema {SCHEMA_VERSION} (export them again with a matching prescreen, or re-run "
                          "prescreen warm)")
    if count is None:
        raise stream.bad("it has no 'entries' list")
    return count


def import_bundle(store: Store, path: str | os.PathLike[str]) -> tuple[int, int]:
    """Validate and store the entries of a bundle, streaming it in memory bounded by one entry; returns
    (imported, skipped: invalid, unsigned, already held or not stored), in one warning line. A file
    ``check_bundle`` refuses is refused whole before anything is stored."""
    where = str(path)
    check_bundle(path)
    imported = present = unsigned = invalid = 0
    first_invalid = ""
    stream = _Stream(path, where)
    try:
        for name, member in stream.members():
            if name != "entries":
                member.value(_HEADER_LIMIT, f"header {name!r}")
                continue
            for index, payload in enumerate(member.items("entry")):
                try:
                    entry = Entry.from_payload(payload, signer=store.signer)
                except UnsignedEntry:
                    unsigned += 1
                    continue
                except InvalidEntry as exc:
                    invalid += 1
                    first_invalid = first_invalid or f"#{index}: {exc}"
                    continue
                if store.put(entry.with_hits(0)):
                    imported += 1
                else:
                    present += 1
    finally:
        stream.close()
    if invalid or unsigned:
        refused = f"refused {unsigned} unsigned or forged entries; " if unsigned else ""
        skipped = f"skipped {invalid} invalid entries (first {first_invalid}); " if invalid else ""
        log.warning("prescreen import %s: %s%s%d imported, %d already present", where, refused, skipped, imported,
                    present)
    return imported, present + invalid + unsigned
