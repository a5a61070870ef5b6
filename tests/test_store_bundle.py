"""Export/import bundles: round trip, validation of every entry, refusal of other formats and schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_store_support import make_entry

from prescreen.errors import ConfigError
from prescreen.key import SCHEMA_VERSION
from prescreen.store import DiskStore, NullStore, export_bundle, import_bundle


def filled(directory: Path, seeds: range) -> DiskStore:
    store = DiskStore(directory)
    for seed in seeds:
        assert store.put(make_entry(seed))
    return store


def test_round_trip(tmp_path: Path) -> None:
    bundle = tmp_path / "decisions.json"
    with filled(tmp_path / "src", range(6)) as src:
        src.get(make_entry(0).key)  # a hit count travels in the bundle but is not imported
        assert export_bundle(src, bundle) == 6
        originals = {e.key: e.with_hits(0).to_payload() for e in src.entries()}
    data = json.loads(bundle.read_text())
    assert (data["format"], data["bundle_version"], data["schema_version"]) == ("prescreen-bundle", 1, SCHEMA_VERSION)
    assert isinstance(data["created_at"], str) and len(data["entries"]) == 6
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left behind
    with DiskStore(tmp_path / "dst") as dst:
        assert import_bundle(dst, bundle) == (6, 0)
        assert {e.key: e.to_payload() for e in dst.entries()} == originals
        assert import_bundle(dst, bundle) == (0, 6)  # already there
    assert import_bundle(NullStore(), bundle) == (0, 6)


def test_invalid_entries_are_skipped(tmp_path: Path) -> None:
    bundle = tmp_path / "b.json"
    with filled(tmp_path / "src", range(4)) as src:
        export_bundle(src, bundle)
    data = json.loads(bundle.read_text())
    data["entries"][0]["decision"]["budget_bytes"] += 1  # tampered
    data["entries"][1]["key"] = "0" * 64  # wrong key
    data["entries"].append("not an entry")
    bundle.write_text(json.dumps(data))
    with DiskStore(tmp_path / "dst") as dst:
        assert import_bundle(dst, bundle) == (2, 3)
        assert len(dst.keys()) == 2


@pytest.mark.parametrize(
    ("change", "found", "expected"),
    [
        ({"format": "something-else"}, "'something-else'", "'prescreen-bundle'"),
        ({"schema_version": SCHEMA_VERSION + 1}, f"schema {SCHEMA_VERSION + 1}", f"schema {SCHEMA_VERSION}"),
        ({"bundle_version": 2}, "bundle_version 2", "bundle_version 1"),
        ({"entries": {}}, "dict", "list"),
    ],
)
def test_other_bundles_are_refused(tmp_path: Path, change: dict[str, object], found: str, expected: str) -> None:
    bundle = tmp_path / "b.json"
    export_bundle(NullStore(), bundle)
    data = {**json.loads(bundle.read_text()), **change}
    bundle.write_text(json.dumps(data))
    with DiskStore(tmp_path / "dst") as dst, pytest.raises(ConfigError) as info:
        import_bundle(dst, bundle)
    message = str(info.value)
    assert found in message and expected in message and str(bundle) in message
    assert "Traceback" not in message and info.value.__cause__ is None


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", ""])
def test_not_a_bundle(tmp_path: Path, content: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="is not a prescreen bundle"):
        import_bundle(NullStore(), path)
    with pytest.raises(ConfigError, match="cannot read bundle"):
        import_bundle(NullStore(), tmp_path / "missing.json")
