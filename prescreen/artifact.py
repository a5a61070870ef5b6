"""One file to deploy: torch's compile caches and prescreen's decisions, checked as a whole before either is used.

``prescreen warm ... --artifact FILE`` writes it (``save``); ``prescreen load FILE`` or ``prescreen.load(path)``
puts both parts in place (``load``); docs/artifact.md has the format and checks. A file that fails a check is one
``ConfigError`` and changes nothing. torch's part is compiled code: load only artifacts you built or trust.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from prescreen.errors import ConfigError
from prescreen.store.base import Store
from prescreen.store.bundle import check_bundle, export_bundle, import_bundle

FORMAT = "prescreen-artifact"
VERSION = 1
MANIFEST = "manifest.json"
DECISIONS = "decisions.json"
TORCH = "torch-caches.bin"
MEMBERS = (MANIFEST, DECISIONS, TORCH)

MAX_MANIFEST_BYTES = 64 * 2**10  # a manifest is a few hundred bytes
#: prescreen's part: the default store's size limit (a warm's decisions are a few KiB each).
MAX_DECISIONS_BYTES = 2**30
#: torch's part is read into memory whole (``load_cache_artifacts`` takes bytes): at most this much.
MAX_TORCH_BYTES = 8 * 2**30
_CHUNK = 1 << 20
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # member timestamps: the manifest holds when it was made


def _caps() -> dict[str, int]:
    """Each member's cap, read at call time (the tests lower them)."""
    return {MANIFEST: MAX_MANIFEST_BYTES, DECISIONS: MAX_DECISIONS_BYTES, TORCH: MAX_TORCH_BYTES}


@dataclasses.dataclass(frozen=True)
class Saved:
    """What ``save`` wrote."""

    path: str
    decisions: int
    torch_bytes: int
    file_bytes: int


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What ``load`` put in place: its one summary line is ``summary()``."""

    path: str
    imported: int
    skipped: int  # already present (or a stricter entry there), invalid, or unsigned
    torch_bytes: int
    #: What torch's ``CacheInfo`` said it loaded: artifact kind -> count (e.g. ``{"inductor": 2}``).
    torch_loaded: dict[str, int]

    def summary(self) -> str:
        if self.torch_bytes:
            kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.torch_loaded.items())) or "nothing"
            torch_part = f"torch caches {self.torch_bytes} bytes ({kinds})"
        else:
            torch_part = "no torch caches in it"
        return (f"loaded {self.path}: {self.imported} decisions imported ({self.skipped} already present or "
                f"skipped), {torch_part}")


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def check_writable(path: str | os.PathLike[str]) -> None:
    """A ``ConfigError`` now, before a long warm, where ``path`` cannot be written as an artifact."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"cannot write artifact {str(target)!r}: it is a directory")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise ConfigError(f"cannot write artifact {str(target)!r}: no directory {str(parent)!r}")


def save(
    path: str | os.PathLike[str], store: Store, keys: Iterable[str], torch_artifacts: bytes | None
) -> Saved:
    """Write one artifact at ``path`` (atomically): the decisions under ``keys`` (those the store holds) and
    ``torch.compiler.save_cache_artifacts()[0]`` (None where torch recorded nothing)."""
    from prescreen import __version__

    check_writable(path)
    target = Path(path)
    if torch_artifacts is not None and len(torch_artifacts) > MAX_TORCH_BYTES:
        raise ConfigError(f"cannot write artifact {str(target)!r}: torch's caches are {len(torch_artifacts)} bytes, "
                          f"over the {MAX_TORCH_BYTES} bytes a replica loads")
    with tempfile.TemporaryDirectory(prefix="prescreen-artifact-") as scratch:
        bundle = Path(scratch) / DECISIONS
        count = export_bundle(store, bundle, keys=keys)
        parts = {DECISIONS: bundle.read_bytes()}
    if torch_artifacts is not None:
        parts[TORCH] = bytes(torch_artifacts)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": _torch_version() if torch_artifacts is not None else None,
        "prescreen_version": __version__,
        "decisions": count,
        "members": {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                    for name, data in parts.items()},
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.absolute().parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as zf:
            for name, data in [(MANIFEST, json.dumps(manifest, sort_keys=True, indent=1).encode()), *parts.items()]:
                info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
                # torch's part is large and read back whole: stored, so loading it inflates nothing
                info.compress_type = zipfile.ZIP_STORED if name == TORCH else zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Saved(str(target), count, len(parts.get(TORCH, b"")), target.stat().st_size)


# --- load ------------------------------------------------------------------------------------------------------------


class _Refused(Exception):
    """A check failed: the message says what (``load`` adds the file's name)."""


def _infos(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The members by name, after the checks that need no decompressing (names, flags, header sizes)."""
    infos = zf.infolist()
    names = [i.filename for i in infos]
    unknown = sorted({n for n in names if n not in MEMBERS})
    if unknown:
        raise _Refused(f"unexpected member {unknown[0]!r} (an artifact holds only {', '.join(MEMBERS)})")
    if len(set(names)) != len(names):
        raise _Refused(f"member {next(n for n in names if names.count(n) > 1)!r} appears twice")
    for name in (MANIFEST, DECISIONS):
        if name not in names:
            raise _Refused(f"no {name} member")
    caps = _caps()
    for info in infos:
        if info.flag_bits & 0x1:
            raise _Refused(f"{info.filename} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _Refused(f"{info.filename} uses compression method {info.compress_type} (stored or deflated only)")
        if info.file_size > caps[info.filename]:
            raise _Refused(f"{info.filename} is {info.file_size} bytes, over its cap of {caps[info.filename]}")
    return {i.filename: i for i in infos}


def _manifest(zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo]) -> dict[str, Any]:
    try:  # NaN or Infinity parse, and fail the checks below as any wrong value does
        manifest = json.loads(zf.read(infos[MANIFEST]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _Refused(f"{MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise _Refused(f"{MANIFEST} says format {found!r}, expected {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise _Refused(f"artifact version {manifest.get('version')!r}; this prescreen reads version {VERSION}")
    members = manifest.get("members")
    if not isinstance(members, dict):
        raise _Refused(f"{MANIFEST} has no 'members' object")
    present = set(infos) - {MANIFEST}
    if set(members) != present:
        raise _Refused(f"{MANIFEST} lists {sorted(members)} but the zip holds {sorted(present)}")
    for name in present:
        meta = members[name]
        ok = (isinstance(meta, dict) and type(meta.get("bytes")) is int and isinstance(meta.get("sha256"), str)
              and len(meta["sha256"]) == 64)
        if not ok:
            raise _Refused(f"{MANIFEST}: the entry of {name} is not {{'bytes': int, 'sha256': hex}}")
        if meta["bytes"] != infos[name].file_size:
            raise _Refused(f"{name} is {infos[name].file_size} bytes but {MANIFEST} says {meta['bytes']}")
    return manifest


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo, manifest: dict[str, Any], sink: IO[bytes] | None = None) -> bytes:
    """A member's bytes (empty when written to ``sink``), never more than its cap, matching the manifest."""
    cap, meta = _caps()[info.filename], manifest["members"][info.filename]
    digest, size, chunks = hashlib.sha256(), 0, []
    with zf.open(info) as member:
        while chunk := member.read(_CHUNK):
            size += len(chunk)
            if size > cap:  # the header said less (zipfile stops at it too): refuse all the same
                raise _Refused(f"{info.filename} is longer than its cap of {cap} bytes")
            digest.update(chunk)
            if sink is None:
                chunks.append(chunk)
            else:
                sink.write(chunk)
    if size != meta["bytes"] or digest.hexdigest() != meta["sha256"]:
        raise _Refused(f"{info.filename} does not match {MANIFEST} (sha256 {digest.hexdigest()[:16]}..., expected "
                       f"{meta['sha256'][:16]}...)")
    return b"".join(chunks)


def _parse_torch(data: bytes) -> Any:
    """torch's own parse of its part, writing nothing (``load_cache_artifacts`` without its populate step)."""
    from torch.compiler._cache import CacheArtifactManager

    logger = logging.getLogger("torch.compiler._cache")  # it logs a traceback where one error line says it
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        parsed = CacheArtifactManager.deserialize(data)
    finally:
        logger.setLevel(level)
    if parsed is None:
        raise _Refused(f"torch cannot parse {TORCH} (torch.compiler.load_cache_artifacts would refuse it)")
    return parsed


def load(path: str | os.PathLike[str], store: Store | None = None) -> Loaded:
    """Put an artifact's decisions and torch caches in place (into ``store``, default: the configured store).

    Every check runs before anything is changed; then the decisions are imported (a stricter entry in place
    stays: an observed OOM is never replaced), and torch's caches are populated last.
    """
    from prescreen.store import open_store

    where = str(path)
    try:
        with open(path, "rb") as raw, zipfile.ZipFile(raw) as zf, \
                tempfile.TemporaryDirectory(prefix="prescreen-artifact-") as scratch:
            infos = _infos(zf)
            manifest = _manifest(zf, infos)
            if TORCH in infos:  # before the large part is read
                built, running = manifest.get("torch_version"), _torch_version()
                if built != running:
                    raise _Refused(f"torch's caches in it were built with torch {built!r}; this is torch {running!r} "
                                   "(torch reuses compiled code only under the version that made it: build the "
                                   f"artifact again with torch {running})")
            bundle = Path(scratch) / DECISIONS
            with open(bundle, "wb") as sink:
                _read(zf, infos[DECISIONS], manifest, sink)
            torch_data = _read(zf, infos[TORCH], manifest) if TORCH in infos else None
            try:
                check_bundle(bundle)
            except ConfigError as exc:
                raise _Refused(f"{DECISIONS}: {str(exc).replace(str(bundle), DECISIONS)}") from None
            parsed = _parse_torch(torch_data) if torch_data is not None else None
            used = store if store is not None else open_store()
            try:
                imported, skipped = import_bundle(used, bundle)  # each entry validated; a stricter one in place stays
                loaded = _populate_torch(parsed, where, imported) if parsed is not None else {}
            finally:
                if store is None:
                    used.close()
            return Loaded(where, imported, skipped, len(torch_data or b""), loaded)
    except _Refused as exc:
        raise ConfigError(f"{where} is not a usable prescreen artifact: {exc}") from None
    except zipfile.BadZipFile as exc:
        raise ConfigError(f"{where} is not a usable prescreen artifact: not a zip file, or a damaged one ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read artifact {where}: {exc.strerror or exc}") from None


def _populate_torch(parsed: Any, where: str, imported: int) -> dict[str, int]:
    """Put torch's caches in place; what its ``CacheInfo`` lists, by artifact kind."""
    from torch.compiler._cache import CacheArtifactManager

    try:
        artifacts = CacheArtifactManager.populate_caches(parsed).artifacts
    except Exception as exc:  # e.g. a full disk: the decisions stay (they are valid on their own)
        raise ConfigError(f"{where}: torch could not put its caches in place ({type(exc).__name__}: {exc}); "
                          f"{imported} decisions were imported") from None
    return {str(kind): len(keys) for kind, keys in artifacts.items() if keys}
