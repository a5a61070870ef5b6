"""Export a store's decisions to a versioned JSON bundle, and import one (validating every entry)."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path

from prescreen.errors import ConfigError
from prescreen.key import SCHEMA_VERSION
from prescreen.store.base import Store, log
from prescreen.store.entry import Entry, InvalidEntry

BUNDLE_FORMAT = "prescreen-bundle"
BUNDLE_VERSION = 1


def export_bundle(store: Store, path: str | os.PathLike[str]) -> int:
    """Write every valid entry of ``store`` to ``path`` (atomically); returns how many."""
    entries = sorted(store.entries(), key=lambda e: e.key)
    bundle = {
        "format": BUNDLE_FORMAT,
        "bundle_version": BUNDLE_VERSION,
        "schema_version": SCHEMA_VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "entries": [e.to_payload() for e in entries],
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


def _check_header(bundle: object, where: str) -> list[object]:
    if not isinstance(bundle, dict):
        raise ConfigError(f"{where} is not a prescreen bundle: expected a JSON object, found {type(bundle).__name__}")
    found = bundle.get("format")
    if found != BUNDLE_FORMAT:
        raise ConfigError(f"{where} is not a prescreen bundle: format is {found!r}, expected {BUNDLE_FORMAT!r}")
    version = bundle.get("bundle_version")
    if version != BUNDLE_VERSION:
        raise ConfigError(
            f"{where} has bundle_version {version!r}; this prescreen reads bundle_version {BUNDLE_VERSION}"
        )
    schema = bundle.get("schema_version")
    if schema != SCHEMA_VERSION:
        raise ConfigError(
            f"{where} holds decisions of schema {schema!r}; this prescreen uses schema {SCHEMA_VERSION} "
            "(export them again with a matching prescreen, or re-run prescreen warm)"
        )
    entries = bundle.get("entries")
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: 'entries' must be a list, found {type(entries).__name__}")
    return entries


def import_bundle(store: Store, path: str | os.PathLike[str]) -> tuple[int, int]:
    """Validate and store the entries of a bundle; returns (imported, skipped).

    Skipped: invalid entries and entries the store already holds (or could not
    store). A file that is not a bundle of this format and schema is refused
    whole with a ``ConfigError``.
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read bundle {where}: {exc}") from None
    try:
        bundle = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not a prescreen bundle: not valid JSON ({exc})") from None
    imported = skipped = 0
    for index, payload in enumerate(_check_header(bundle, where)):
        try:
            entry = Entry.from_payload(payload)
        except (InvalidEntry, ValueError) as exc:  # ValueError: a NotBounded from the stored plan
            log.warning("prescreen import %s: entry #%d skipped: %s", where, index, exc)
            skipped += 1
            continue
        if store.put(entry.with_hits(0)):
            imported += 1
        else:
            skipped += 1
    return imported, skipped
