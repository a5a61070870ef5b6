"""The deploy artifact (``prescreen warm --artifact``, ``prescreen load``): one file holding torch's mega-cache and
prescreen's decisions, checked whole before anything is put in place.

The round trip runs real processes on CPU, each its own "machine" (its own Inductor and prescreen
directories), with ``examples/tiny_models.py:pair_bmm``, whose max-autotune compile torch's FX graph
cache keeps. The refusals use artifacts built here, and the real one where torch's part matters.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_cli import assert_cli_error, assert_one_error_line, invoke
from test_store_support import BUDGET, make_entry, make_plan

from prescreen import artifact
from prescreen.decision import is_observed_oom
from prescreen.errors import ConfigError
from prescreen.service import record_observed_oom
from prescreen.store import DiskStore, export_bundle

ROOT = Path(__file__).resolve().parent.parent
REPLICA = ROOT / "tests/scripts/artifact_replica.py"
MEMORY, RATIO = "64GiB", "0.25"

# --- helpers ---------------------------------------------------------------------------------------------------------


def machine(root: Path, name: str) -> dict[str, str]:
    """The environment of one "machine": its own prescreen store and Inductor cache directories."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESCREEN", "TORCHINDUCTOR", "TORCH_COMPILE"))}
    env.update(PRESCREEN_CACHE_DIR=str(root / name / "store"), TORCHINDUCTOR_CACHE_DIR=str(root / name / "inductor"),
               PYTHONPATH=str(ROOT / "examples"), COLUMNS="250")
    return env


def prescreen_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prescreen.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def replica(env: dict[str, str], sizes: str) -> dict[str, Any]:
    """One process compiling ``pair_bmm`` at ``sizes`` with prescreen installed; its RESULT line."""
    proc = subprocess.run([sys.executable, str(REPLICA), MEMORY, RATIO, sizes], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(line[7:])
    return result


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def payloads(store: DiskStore) -> dict[str, Any]:
    return {e.key: e.to_payload() for e in store.entries()}


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def rezip(path: Path, parts: dict[str, bytes], manifest: dict[str, Any] | bytes | None = None,
          compression: int = zipfile.ZIP_DEFLATED, extra: list[tuple[str, bytes]] | None = None) -> Path:
    """A zip of ``parts`` (and ``extra`` members, duplicates allowed) under a manifest: ``manifest`` as given, or one
    with the right sizes and hashes (the format's own fields taken from the artifact's)."""
    if manifest is None or isinstance(manifest, dict):
        fields = dict(manifest or {})
        fields.setdefault("members", {n: {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in parts.items()
                                      if n != artifact.MANIFEST})
        manifest = json.dumps(fields).encode()
    with zipfile.ZipFile(path, "w", compression) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name
        zf.writestr(artifact.MANIFEST, manifest)
        for name, data in [*((n, d) for n, d in parts.items() if n != artifact.MANIFEST), *(extra or [])]:
            zf.writestr(name, data)
    return path


def manifest_of(parts: dict[str, bytes]) -> dict[str, Any]:
    fields: dict[str, Any] = json.loads(parts[artifact.MANIFEST])
    del fields["members"]
    return fields


@pytest.fixture
def replica_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DiskStore, Path]:
    """A replica that already holds things: a store with two entries, and an Inductor cache dir with a file."""
    inductor = tmp_path / "replica-inductor"
    (inductor / "fxgraph").mkdir(parents=True)
    (inductor / "fxgraph" / "already-here").write_bytes(b"a cache entry")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    store = DiskStore(tmp_path / "replica-store")
    for seed in (40, 41):
        assert store.put(make_entry(seed))
    return store, inductor


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    """An artifact of two decisions and a torch part that is not torch's (every check but torch's parse passes)."""
    with DiskStore(tmp_path / "source") as source:
        keys = []
        for seed in (1, 2):
            entry = make_entry(seed)
            assert source.put(entry)
            keys.append(entry.key)
        artifact.save(tmp_path / "synthetic.prescreen", source, keys, b"not torch's bytes " * 64)
    return tmp_path / "synthetic.prescreen"


# --- save ------------------------------------------------------------------------------------------------------------


def test_save_writes_the_known_members_and_a_manifest(tmp_path: Path) -> None:
    import torch

    with DiskStore(tmp_path / "source") as source:
        entries = [make_entry(seed) for seed in (1, 2, 3)]
        for e in entries:
            assert source.put(e)
        wanted = [entries[0].key, entries[2].key, "f" * 64]  # a key the store does not hold is left out
        saved = artifact.save(tmp_path / "a.prescreen", source, wanted, b"torch bytes")
    assert (saved.decisions, saved.torch_bytes) == (2, 11)
    assert saved.file_bytes == (tmp_path / "a.prescreen").stat().st_size
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
    parts = members(tmp_path / "a.prescreen")
    assert sorted(parts) == sorted(artifact.MEMBERS)
    manifest = json.loads(parts[artifact.MANIFEST])
    assert (manifest["format"], manifest["version"], manifest["torch_version"]) == (
        "prescreen-artifact", 1, torch.__version__)
    assert manifest["decisions"] == 2 and isinstance(manifest["created_at"], str)
    for name in (artifact.DECISIONS, artifact.TORCH):
        assert manifest["members"][name] == {"bytes": len(parts[name]), "sha256": hashlib.sha256(parts[name]).hexdigest()}
    bundle = json.loads(parts[artifact.DECISIONS])
    assert [e["key"] for e in bundle["entries"]] == sorted([entries[0].key, entries[2].key])


def test_export_bundle_keys_filter(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "source") as source:
        entries = [make_entry(seed) for seed in (1, 2, 3)]
        for e in entries:
            source.put(e)
        assert export_bundle(source, tmp_path / "some.json", keys=[entries[1].key]) == 1
        assert export_bundle(source, tmp_path / "all.json") == 3
    assert [e["key"] for e in json.loads((tmp_path / "some.json").read_text())["entries"]] == [entries[1].key]


def test_a_failed_save_leaves_the_file_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a.prescreen"
    target.write_bytes(b"the artifact of yesterday")
    monkeypatch.setattr(artifact, "MAX_TORCH_BYTES", 10)
    with DiskStore(tmp_path / "source") as source, pytest.raises(ConfigError, match="over the 10 bytes"):
        artifact.save(target, source, [], b"x" * 11)
    with DiskStore(tmp_path / "source") as source, pytest.raises(ConfigError, match="no directory"):
        artifact.save(tmp_path / "missing" / "a.prescreen", source, [], None)
    assert target.read_bytes() == b"the artifact of yesterday"


# --- load: decisions -------------------------------------------------------------------------------------------------


def test_a_decisions_only_artifact_loads(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "source") as source:
        entry = make_entry(7)
        source.put(entry)
        artifact.save(tmp_path / "a.prescreen", source, [entry.key], None)
    assert artifact.TORCH not in members(tmp_path / "a.prescreen")
    with DiskStore(tmp_path / "replica") as replica_store:
        loaded = artifact.load(tmp_path / "a.prescreen", replica_store)
        assert (loaded.imported, loaded.skipped, loaded.torch_bytes) == (1, 0, 0)
        assert payloads(replica_store) == {entry.key: entry.with_hits(0).to_payload()}
    assert "1 decisions imported" in loaded.summary() and "no torch caches" in loaded.summary()


def test_an_observed_oom_in_place_is_never_replaced(tmp_path: Path) -> None:
    plan = make_plan(3)
    laxer = make_entry(3)
    assert laxer.decision.action == "tune"
    with DiskStore(tmp_path / "source") as source:
        source.put(laxer)
        artifact.save(tmp_path / "a.prescreen", source, [laxer.key], None)
    with DiskStore(tmp_path / "replica") as replica_store:
        fact = record_observed_oom(plan, BUDGET, replica_store, requested_bytes=2**30, free_bytes=1)
        assert fact.key == laxer.key
        loaded = artifact.load(tmp_path / "a.prescreen", replica_store)
        kept = replica_store.get(laxer.key)
        assert kept is not None and is_observed_oom(kept.decision)
    assert (loaded.imported, loaded.skipped) == (0, 1)


def test_load_uses_the_configured_store(tmp_path: Path, synthetic: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = members(synthetic)
    del parts[artifact.TORCH]
    fields = manifest_of(parts)
    rezip(tmp_path / "d.prescreen", parts, fields)
    monkeypatch.setenv("PRESCREEN_CACHE_DIR", str(tmp_path / "configured"))
    import prescreen

    assert prescreen.load(tmp_path / "d.prescreen").imported == 2
    with DiskStore(tmp_path / "configured") as store:
        assert len(payloads(store)) == 2


# --- load: refusals --------------------------------------------------------------------------------------------------

Mutation = Callable[[Path, dict[str, bytes], Path], Path]


def _truncated(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    out.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    return out


def _flipped(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    data = bytearray(src.read_bytes())
    at = data.index(b"not torch's bytes") + 3
    data[at] ^= 0x01  # inside the stored torch member: the zip's CRC no longer matches
    out.write_bytes(bytes(data))
    return out


def _foreign_zip(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("model.pt", b"weights")
    return out


def _bundle(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    out.write_bytes(parts[artifact.DECISIONS])  # a prescreen bundle, not an artifact
    return out


def _path_member(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    return rezip(out, parts, manifest_of(parts), extra=[("../decisions.json", b"{}")])


def _twice(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    return rezip(out, parts, manifest_of(parts), extra=[(artifact.DECISIONS, parts[artifact.DECISIONS])])


def _no_decisions(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    return rezip(out, {k: v for k, v in parts.items() if k != artifact.DECISIONS}, manifest_of(parts))


def _big_manifest(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    return rezip(out, parts, {**manifest_of(parts), "padding": "x" * (artifact.MAX_MANIFEST_BYTES + 1)})


def _other_hash(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    fields = json.loads(parts[artifact.MANIFEST])  # the manifest of the original decisions
    changed = parts[artifact.DECISIONS].replace(b'"hits":0', b'"hits":1', 1)
    assert len(changed) == len(parts[artifact.DECISIONS]) and changed != parts[artifact.DECISIONS]
    return rezip(out, {**parts, artifact.DECISIONS: changed}, fields)


def _other_size(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    fields = json.loads(parts[artifact.MANIFEST])
    return rezip(out, {**parts, artifact.DECISIONS: parts[artifact.DECISIONS] + b" "}, fields)


def _unlisted(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    fields = json.loads(parts[artifact.MANIFEST])
    del fields["members"][artifact.TORCH]
    return rezip(out, parts, fields)


def _manifest_change(**change: object) -> Mutation:
    def mutate(src: Path, parts: dict[str, bytes], out: Path) -> Path:
        return rezip(out, parts, {**manifest_of(parts), **change})

    return mutate


def _not_json(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    return rezip(out, parts, b"{not json")


def _bzip2(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    return rezip(out, parts, manifest_of(parts), compression=zipfile.ZIP_BZIP2)


def _other_schema(src: Path, parts: dict[str, bytes], out: Path) -> Path:
    bundle = json.loads(parts[artifact.DECISIONS])
    bundle["schema_version"] += 100
    return rezip(out, {**parts, artifact.DECISIONS: json.dumps(bundle).encode()}, manifest_of(parts))


REFUSALS: dict[str, tuple[Mutation, str]] = {
    "truncated": (_truncated, "not a zip file"),
    "corrupt": (_flipped, "Bad CRC-32"),
    "foreign zip": (_foreign_zip, "unexpected member 'model.pt'"),
    "a bundle": (_bundle, "not a zip file"),
    "path member": (_path_member, "unexpected member '../decisions.json'"),
    "member twice": (_twice, "member 'decisions.json' appears twice"),
    "no decisions": (_no_decisions, "no decisions.json member"),
    "oversize manifest": (_big_manifest, f"over its cap of {artifact.MAX_MANIFEST_BYTES}"),
    "wrong hash": (_other_hash, "decisions.json does not match manifest.json"),
    "wrong size": (_other_size, "but manifest.json says"),
    "unlisted member": (_unlisted, "manifest.json lists ['decisions.json'] but the zip holds"),
    "other format": (_manifest_change(format="wheel"), "says format 'wheel', expected 'prescreen-artifact'"),
    "other version": (_manifest_change(version=2), "artifact version 2; this prescreen reads version 1"),
    "manifest not json": (_not_json, "manifest.json is not JSON"),
    "other compression": (_bzip2, "compression method 12"),
    "wrong torch version": (_manifest_change(torch_version="1.0.0"), "built with torch '1.0.0'; this is torch '2."),
    "other schema": (_other_schema, "decisions.json holds decisions of schema"),
    "not torch's": (lambda src, parts, out: src, "torch cannot parse torch-caches.bin"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_bad_artifact_is_one_error_and_changes_nothing(
    case: str, synthetic: Path, replica_dirs: tuple[DiskStore, Path], tmp_path: Path
) -> None:
    mutate, expected = REFUSALS[case]
    store, inductor = replica_dirs
    path = mutate(synthetic, members(synthetic), tmp_path / "bad.prescreen")
    before, files = payloads(store), tree(inductor)
    with pytest.raises(ConfigError) as info:
        artifact.load(path, store)
    message = str(info.value)
    assert str(path) in message and expected in message, message
    assert "\n" not in message and info.value.__cause__ is None
    assert payloads(store) == before and tree(inductor) == files
    store.close()


def test_sizes_are_checked_from_the_zip_header_before_reading(
    synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = members(synthetic)
    bomb = {**parts, artifact.TORCH: bytes(4 * 2**20)}  # 4 MiB of zeros deflate to a few KiB
    path = rezip(tmp_path / "bomb.prescreen", bomb, manifest_of(parts))
    assert path.stat().st_size < 2**20
    monkeypatch.setattr(artifact, "MAX_TORCH_BYTES", 2**20)

    def no_read(*args: Any) -> Any:
        raise AssertionError("a member was read before its header size was checked")

    monkeypatch.setattr(artifact, "_read", no_read)
    with DiskStore(tmp_path / "replica") as store, pytest.raises(ConfigError, match="over its cap of 1048576"):
        artifact.load(path, store)


def test_a_member_longer_than_its_header_says_is_refused(synthetic: Path, tmp_path: Path) -> None:
    parts = members(synthetic)
    path = rezip(tmp_path / "long.prescreen", parts, manifest_of(parts))
    data = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo(artifact.DECISIONS)
    # Lower the decisions' size in both headers (local and central): zipfile stops reading there,
    # and the CRC of what it read does not match.
    size = info.file_size.to_bytes(4, "little")
    smaller = (info.file_size - 10).to_bytes(4, "little")
    assert data.count(size) >= 2
    path.write_bytes(data.replace(size, smaller))
    with DiskStore(tmp_path / "replica") as store, pytest.raises(ConfigError) as refused:
        artifact.load(path, store)
    assert str(path) in str(refused.value)
    with DiskStore(tmp_path / "replica") as store:
        assert payloads(store) == {}


def test_a_missing_file_is_one_error(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "replica") as store, pytest.raises(ConfigError, match="cannot read artifact"):
        artifact.load(tmp_path / "missing.prescreen", store)


# --- CLI -------------------------------------------------------------------------------------------------------------


def test_cli_load_errors_are_one_line(synthetic: Path, tmp_path: Path) -> None:
    bad = _truncated(synthetic, {}, tmp_path / "bad.prescreen")
    assert_cli_error(invoke(tmp_path / "cache", "load", str(bad)), f"{bad} is not a usable prescreen artifact")
    assert_cli_error(invoke(tmp_path / "cache", "load", str(tmp_path / "nope")), "cannot read artifact")
    assert_cli_error(invoke(tmp_path / "cache", "load"), "PATH")


def test_cli_warm_artifact_errors(tmp_path: Path) -> None:
    target = f"{ROOT / 'examples' / 'tiny_models.py'}:mlp"
    assert_cli_error(invoke(tmp_path / "c", "warm", target, "--artifact", str(tmp_path / "no" / "a.prescreen")),
                     "no directory")
    assert_cli_error(invoke(tmp_path / "c", "warm", target, "--dry-run", "--artifact", str(tmp_path / "a")),
                     "does not go with --dry-run")
    plans = tmp_path / "plans.json"
    plans.write_text("[]")
    assert_cli_error(invoke(tmp_path / "c", "warm", "--plans", str(plans), "--device-memory", "1GiB",
                            "--artifact", str(tmp_path / "a")), "not to --plans")
    assert not (tmp_path / "a").exists()


# --- the round trip, in processes ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    """Machine A: ``prescreen warm ... --artifact`` with Inductor's caches at their defaults."""
    root = tmp_path_factory.mktemp("machines")
    path = root / "deploy.prescreen"
    proc = prescreen_cli(machine(root, "a"), "warm", "tiny_models:pair_bmm", "--shape", "batch=5..8",
                         "--device-memory", MEMORY, "--ratio", RATIO, "--artifact", str(path), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    return path, report, root


@pytest.mark.slow
def test_a_replica_that_loads_the_artifact_runs_no_benchmark_and_decides_nothing(
    warmed: tuple[Path, dict[str, Any], Path],
) -> None:
    path, report, root = warmed
    assert report["decisions_made"] >= 1 and report["artifact"]["torch_bytes"] > 0
    assert report["artifact"]["decisions"] == report["decisions_made"]
    sizes = ",".join(sorted({str(d["sizes"]["batch"]) for d in report["decisions"]}))
    b = machine(root, "b")
    loaded = prescreen_cli(b, "load", str(path))
    assert loaded.returncode == 0, loaded.stderr
    lines = loaded.stdout.strip().splitlines()
    assert len(lines) == 1 and f"{report['decisions_made']} decisions imported" in lines[0], lines
    assert "inductor 1" in lines[0] and "aot_autograd 1" in lines[0], lines
    with DiskStore(b["PRESCREEN_CACHE_DIR"]) as store:
        assert set(payloads(store)) == {d["key"] for d in report["decisions"]}
    # The warm compiled at the sizes it reports; torch's FX cache serves a compile at those (on
    # torch 2.13 CPU, pair_bmm's entry compiled at one batch fails at another: a torch matter).
    on_b = replica(b, sizes)
    assert on_b["equal"] and on_b["fx_hit"] >= 1
    assert on_b["benchmarks"] == 0 and on_b["computed"] == 0 and on_b["lookups"] == 0
    # The same compile on a machine without the artifact benchmarks and decides: what B was spared.
    cold = replica(machine(root, "c"), sizes)
    assert cold["equal"] and cold["fx_hit"] == 0 and cold["benchmarks"] > 0 and cold["computed"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("case", ["wrong torch version", "other schema", "wrong hash"])
def test_a_bad_real_artifact_leaves_the_replica_as_it_was(
    case: str, warmed: tuple[Path, dict[str, Any], Path], replica_dirs: tuple[DiskStore, Path], tmp_path: Path,
) -> None:
    """torch's part is real here: a check skipped would let torch write its caches."""
    mutate, expected = REFUSALS[case]
    store, inductor = replica_dirs
    path = mutate(warmed[0], members(warmed[0]), tmp_path / "bad.prescreen")
    before, files = payloads(store), tree(inductor)
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        artifact.load(path, store)
    assert payloads(store) == before and tree(inductor) == files
    loaded = artifact.load(warmed[0], store)  # the untouched artifact does load, into the same dirs
    assert loaded.imported == warmed[1]["decisions_made"] and loaded.torch_loaded.get("inductor") == 1
    assert set(tree(inductor)) > set(files) and set(payloads(store)) > set(before)
    store.close()


@pytest.mark.slow
def test_cli_load_of_a_bad_real_artifact_is_one_error_line(warmed: tuple[Path, dict[str, Any], Path],
                                                           tmp_path: Path) -> None:
    bad = REFUSALS["wrong torch version"][0](warmed[0], members(warmed[0]), tmp_path / "bad.prescreen")
    env = machine(tmp_path, "d")
    proc = prescreen_cli(env, "load", str(bad))
    assert_one_error_line(proc.stderr, proc.stdout, proc.returncode, "built with torch '1.0.0'")
    assert not Path(env["TORCHINDUCTOR_CACHE_DIR"]).exists()
