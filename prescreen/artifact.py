"""One file to deploy: torch's compile caches and prescreen's decisions, checked as a whole before either is used.

``prescreen warm ... --artifact FILE`` writes it (``save``); ``prescreen load FILE`` or
``prescreen.load(path)`` puts both parts in place on a replica (``load``). The file is a zip
holding exactly these members (docs/artifact.md describes them):

- ``manifest.json``: the format name and version, when it was made, the torch and prescreen
  versions, and each other member's byte count and sha256;
- ``decisions.json``: a prescreen bundle (``prescreen.store.bundle``) of the decisions the warm saw;
- ``torch-caches.bin`` (absent when torch recorded nothing): the bytes of
  ``torch.compiler.save_cache_artifacts()[0]``, torch's "mega-cache" (FX graph, AOTAutograd,
  autotune artifacts).

Trust: torch's part is compiled code (pickled graphs and generated kernels, like any model
file): loading it means running code its author made. Load only artifacts you built or trust.
prescreen's part is JSON, and every entry is validated as an import of a bundle is.

``load`` checks everything before it changes anything: the zip's member names (these and no
others, no paths), each member's size from the zip header against its cap before it is
decompressed, the manifest's format and version, each member's sha256, the bundle's header,
the torch version (equal to the running torch's), and that torch can parse its part. A file
that fails a check is one ``ConfigError`` naming the file and the fault, and no store entry
or torch cache file is added, changed or removed. Then the decisions are imported (the
store's put rules keep a stricter entry already there: an observed OOM is never replaced),
and torch's caches are populated last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from prescreen.errors import ConfigError
from prescreen.store.base import Store
from prescreen.store.bundle import check_bundle, export_bundle, import_bundle

log = logging.getLogger("prescreen.artifact")

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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    """Write one artifact at ``path`` (atomically): the decisions under ``keys`` and torch's mega-cache bytes.

    ``torch_artifacts``: ``torch.compiler.save_cache_artifacts()[0]``, or None where torch recorded
    nothing (the artifact then holds decisions only). A key the store does not hold is left out.
    """
    check_writable(path)
    target = Path(path)
    if torch_artifacts is not None and len(torch_artifacts) > MAX_TORCH_BYTES:
        raise ConfigError(f"cannot write artifact {str(target)!r}: torch's caches are {len(torch_artifacts)} bytes, "
                          f"over the {MAX_TORCH_BYTES} bytes a replica loads")
    with tempfile.TemporaryDirectory(prefix="prescreen-artifact-") as scratch:
        bundle = Path(scratch) / DECISIONS
        count = export_bundle(store, bundle, keys=keys)
        decisions = bundle.read_bytes()
    parts = {DECISIONS: decisions}
    if torch_artifacts is not None:
        parts[TORCH] = bytes(torch_artifacts)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": _torch_version() if torch_artifacts is not None else None,
        "prescreen_version": _prescreen_version(),
        "decisions": count,
        "members": {name: {"bytes": len(data), "sha256": _sha256(data)} for name, data in parts.items()},
    }
    text = json.dumps(manifest, sort_keys=True, indent=1).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.absolute().parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as zf:
            _write(zf, MANIFEST, text, zipfile.ZIP_DEFLATED)
            _write(zf, DECISIONS, decisions, zipfile.ZIP_DEFLATED)
            if TORCH in parts:
                _write(zf, TORCH, parts[TORCH], zipfile.ZIP_STORED)  # large, read back whole: no inflate
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Saved(str(target), count, len(parts.get(TORCH, b"")), target.stat().st_size)


def _prescreen_version() -> str:
    from prescreen import __version__

    return __version__


def _write(zf: zipfile.ZipFile, name: str, data: bytes, compression: int) -> None:
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.compress_type = compression
    zf.writestr(info, data)


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


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo, sink: IO[bytes] | None = None) -> tuple[bytes, str, int]:
    """A member's bytes (empty when written to ``sink``), its sha256 and size; never more than its cap.

    Held in memory, torch's part costs up to twice its size while its chunks are joined.
    """
    cap = _caps()[info.filename]
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
    return b"".join(chunks), digest.hexdigest(), size


def _manifest(zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo]) -> dict[str, Any]:
    raw, _, _ = _read(zf, infos[MANIFEST])

    def refuse_constant(name: str) -> None:
        raise ValueError(f"the number {name}")

    try:
        manifest = json.loads(raw.decode("utf-8"), parse_constant=refuse_constant)
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


def _check_member(name: str, manifest: dict[str, Any], digest: str, size: int) -> None:
    meta = manifest["members"][name]
    if size != meta["bytes"] or digest != meta["sha256"]:
        raise _Refused(f"{name} does not match {MANIFEST} (sha256 {digest[:16]}..., expected {meta['sha256'][:16]}...)")


def _check_torch_version(manifest: dict[str, Any]) -> None:
    built, running = manifest.get("torch_version"), _torch_version()
    if built != running:
        raise _Refused(f"torch's caches in it were built with torch {built!r}; this is torch {running!r} (torch "
                       "reuses compiled code only under the version that made it: build the artifact again with "
                       f"torch {running})")


@contextlib.contextmanager
def _quiet_torch_cache_log() -> Iterator[None]:
    """torch logs a traceback when it cannot parse a mega-cache; ``load`` says it in one error instead."""
    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _parse_torch(data: bytes) -> Any:
    """torch's own parse of its part, writing nothing (None where this torch has no separate parse step)."""
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:
        return None
    deserialize = getattr(CacheArtifactManager, "deserialize", None)
    if deserialize is None or not hasattr(CacheArtifactManager, "populate_caches"):
        log.info("prescreen: this torch has no CacheArtifactManager.deserialize/populate_caches; its part of the "
                 "artifact is checked by load_cache_artifacts itself")
        return None
    with _quiet_torch_cache_log():
        parsed = deserialize(data)
    if parsed is None:
        raise _Refused(f"torch cannot parse {TORCH} (torch.compiler.load_cache_artifacts would refuse it)")
    return parsed


def _populate_torch(data: bytes, parsed: Any) -> dict[str, int]:
    """Put torch's caches in place; returns what its ``CacheInfo`` lists, by artifact kind."""
    import torch

    info: object
    if parsed is not None:
        from torch.compiler._cache import CacheArtifactManager

        info = CacheArtifactManager.populate_caches(parsed)  # what load_cache_artifacts does after its parse
    else:
        info = torch.compiler.load_cache_artifacts(data)
        if info is None:
            raise _Refused(f"torch cannot parse {TORCH} (load_cache_artifacts read nothing from it)")
    artifacts = getattr(info, "artifacts", None) or {}
    return {str(kind): len(keys) for kind, keys in artifacts.items() if keys}


def load(path: str | os.PathLike[str], store: Store | None = None) -> Loaded:
    """Put an artifact's decisions and torch caches in place (into ``store``, default: the configured store).

    Every check runs before anything is changed (see the module docstring); a file that fails
    one is a ``ConfigError`` naming the file and the fault. torch's part holds compiled code
    (pickled graphs, like any model file): load only artifacts you built or trust.
    """
    where = str(path)
    try:
        with open(path, "rb") as raw, tempfile.TemporaryDirectory(prefix="prescreen-artifact-") as scratch:
            bundle = Path(scratch) / DECISIONS
            manifest, torch_data = _checked(raw, bundle)
            _bundle_checked(bundle)
            parsed = _parse_torch(torch_data) if torch_data is not None else None
            return _put_in_place(where, bundle, torch_data, parsed, store)
    except _Refused as exc:
        raise ConfigError(f"{where} is not a usable prescreen artifact: {exc}") from None
    except zipfile.BadZipFile as exc:
        raise ConfigError(f"{where} is not a usable prescreen artifact: not a zip file, or a damaged one ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read artifact {where}: {exc.strerror or exc}") from None


def _checked(raw: IO[bytes], bundle: Path) -> tuple[dict[str, Any], bytes | None]:
    """Every check of the zip and its members; the decisions written to ``bundle``, torch's bytes returned."""
    with zipfile.ZipFile(raw) as zf:
        infos = _infos(zf)
        manifest = _manifest(zf, infos)
        if TORCH in infos:
            _check_torch_version(manifest)  # before the large part is read
        with open(bundle, "wb") as sink:
            _, digest, size = _read(zf, infos[DECISIONS], sink)
        _check_member(DECISIONS, manifest, digest, size)
        torch_data = None
        if TORCH in infos:
            torch_data, digest, size = _read(zf, infos[TORCH])
            _check_member(TORCH, manifest, digest, size)
    return manifest, torch_data


def _bundle_checked(bundle: Path) -> None:
    """prescreen's part is a bundle of this format and schema, every entry well-formed JSON (nothing stored)."""
    try:
        check_bundle(bundle)
    except ConfigError as exc:
        raise _Refused(f"{DECISIONS}: {str(exc).replace(str(bundle), DECISIONS)}") from None


def _put_in_place(where: str, bundle: Path, torch_data: bytes | None, parsed: Any, store: Store | None) -> Loaded:
    opened = None
    if store is None:
        from prescreen.store import open_store

        store = opened = open_store()
    try:
        imported, skipped = import_bundle(store, bundle)  # each entry validated; a stricter one in place is kept
        try:
            loaded = _populate_torch(torch_data, parsed) if torch_data is not None else {}
        except Exception as exc:  # e.g. a full disk: the decisions stay (they are valid on their own)
            raise ConfigError(f"{where}: torch could not put its caches in place ({type(exc).__name__}: {exc}); "
                              f"{imported} decisions were imported") from None
    finally:
        if opened is not None:
            opened.close()
    return Loaded(where, imported, skipped, len(torch_data or b""), loaded)
