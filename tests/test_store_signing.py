"""Signed entries: with a shared secret, unsigned or forged entries are misses and import refuses them."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from test_store_redis import client, redis_url  # noqa: F401  (fixtures: a redis-server on loopback)
from test_store_support import (
    BUDGET,
    entry_fields,
    entry_text,
    fact_child,
    fact_result,
    make_entry,
    make_plan,
    warnings_of,
)

from prescreen.cli import cli
from prescreen.decision import decide
from prescreen.errors import ConfigError
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore, RedisStore, Store, export_bundle, import_bundle, verify_entry
from prescreen.store.entry import Entry
from prescreen.store.trust import SIGNING_KEY_ENV, SIGNING_KEY_FILE_ENV, Signer, signer_from_env

SECRET = "correct horse battery staple 42"
SEED = 17


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIGNING_KEY_FILE_ENV, raising=False)
    monkeypatch.setenv(SIGNING_KEY_ENV, SECRET)


def forged_text(entry: Entry, signer: Signer | None = None) -> str:
    """A structurally valid, self-consistent entry with a decision reason nobody computed (verify_entry: False)."""
    d = entry.to_payload()
    d["decision"]["reason"] = "forged"  # type: ignore[index]
    if signer is not None:
        d["signature"] = signer.sign(d)
    return entry_text(d)


def forgeries(entry: Entry) -> dict[str, str]:
    genuine = entry_fields(entry.to_json(Signer(SECRET.encode())))
    tampered = dict(genuine, created_at=genuine["created_at"] + 1)  # a signed entry, edited after signing
    return {
        "unsigned": forged_text(entry),
        "other-key": forged_text(entry, Signer(b"another secret, 16+ bytes")),
        "tampered": entry_text(tampered),
        "signature-not-a-string": entry_text(dict(genuine, signature=7)),
    }


def assert_forgeries_are_misses(store: Store, plant, caplog: pytest.LogCaptureFixture) -> None:
    entry = make_entry(SEED)
    plan = make_plan(SEED)
    for name, text in forgeries(entry).items():
        plant(entry.key, text)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="prescreen.store"):
            assert store.get(entry.key) is None, name
            assert entry.key not in [e.key for e in store.entries()], name
        assert any("unsigned or forged" in m for m in warnings_of(caplog)) or name != "unsigned", name
    outcome = lookup_or_decide(plan, BUDGET, store)  # computes and replaces the forgery with a signed entry
    assert not outcome.hit and outcome.decision == decide(plan, BUDGET)
    got = store.get(entry.key)
    assert got is not None and verify_entry(got)


def test_disk_store_signs_and_checks(tmp_path: Path, keyed: None, caplog) -> None:
    with DiskStore(tmp_path / "cache") as store:
        assert store._cache is not None
        entry = make_entry(1)
        assert store.put(entry)
        stored = entry_fields(store._cache.get(entry.key))
        assert stored["signature"].startswith("hmac-sha256:")
        assert store.get(entry.key) is not None
        assert_forgeries_are_misses(store, store._cache.set, caplog)


def test_redis_store_signs_and_checks(redis_url: str, client: redis.Redis, keyed: None, caplog) -> None:  # noqa: F811
    with RedisStore(redis_url) as store:
        assert store.put(make_entry(1)) and store.get(make_entry(1).key) is not None
        assert_forgeries_are_misses(store, lambda key, text: client.set(store.entry_key(key), text), caplog)


def test_without_a_secret_signed_entries_still_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = make_entry(1)
    monkeypatch.setenv(SIGNING_KEY_ENV, SECRET)
    with DiskStore(tmp_path / "cache") as store:
        assert store.put(entry)
    monkeypatch.delenv(SIGNING_KEY_ENV)
    with DiskStore(tmp_path / "cache") as store:
        assert store.get(entry.key) is not None


def test_a_forgery_is_accepted_without_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the README says: without a secret the store is trusted input."""
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    entry = make_entry(SEED)
    with DiskStore(tmp_path / "cache") as store:
        assert store._cache is not None
        store._cache.set(entry.key, forged_text(entry))
        got = store.get(entry.key)
        assert got is not None and not verify_entry(got)


# -- bundles ----------------------------------------------------------------------


def test_import_refuses_unsigned_and_forged_entries_naming_the_count(tmp_path: Path, keyed: None, caplog) -> None:
    genuine = [make_entry(seed) for seed in range(3)]
    with DiskStore(tmp_path / "src") as src:
        for entry in genuine:
            assert src.put(entry)
        assert export_bundle(src, tmp_path / "b.json") == 3
    data = json.loads((tmp_path / "b.json").read_text())
    assert all(e["signature"].startswith("hmac-sha256:") for e in data["entries"])
    target = make_entry(SEED)
    bad = [entry_fields(text) for text in forgeries(target).values()]
    # Two entries for one key: a forgery first, then the genuine one. The genuine one must win.
    data["entries"] = [*bad, *data["entries"], entry_fields(target.to_json(Signer(SECRET.encode())))]
    (tmp_path / "b.json").write_text(json.dumps(data))
    with DiskStore(tmp_path / "dst") as dst, caplog.at_level(logging.WARNING, logger="prescreen.store"):
        assert import_bundle(dst, tmp_path / "b.json") == (4, len(bad))
        got = dst.get(target.key)
        assert got is not None and verify_entry(got)
    messages = warnings_of(caplog)
    assert len(messages) == 1 and f"refused {len(bad)} unsigned or forged entries" in messages[0], messages


def test_unsigned_bundle_into_a_keyed_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    with DiskStore(tmp_path / "src") as src:
        assert src.put(make_entry(1))
        export_bundle(src, tmp_path / "b.json")
    monkeypatch.setenv(SIGNING_KEY_ENV, SECRET)
    with DiskStore(tmp_path / "dst") as dst:
        assert import_bundle(dst, tmp_path / "b.json") == (0, 1)
        assert dst.keys() == []


# -- configuration ------------------------------------------------------------------


def test_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    path = tmp_path / "key"
    path.write_text(SECRET + "\n")
    os.chmod(path, 0o600)
    monkeypatch.setenv(SIGNING_KEY_FILE_ENV, str(path))
    signer = signer_from_env()
    assert signer is not None and signer.sign({"key": "k"}) == Signer(SECRET.encode()).sign({"key": "k"})
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by its owner only"):
        signer_from_env()
    monkeypatch.setenv(SIGNING_KEY_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="cannot read it"):
        signer_from_env()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({SIGNING_KEY_ENV: "short"}, "at least 16"),
        ({SIGNING_KEY_ENV: SECRET, SIGNING_KEY_FILE_ENV: "/nonexistent"}, "not both"),
    ],
)
def test_bad_settings_are_one_error_line(tmp_path: Path, env: dict[str, str], message: str) -> None:
    result = CliRunner().invoke(cli, ["--cache-dir", str(tmp_path / "c"), "stats"],
                                env={"PRESCREEN_REDIS_URL": "", SIGNING_KEY_FILE_ENV: "", **env})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines
    assert env[SIGNING_KEY_ENV] not in result.output  # the secret itself is never printed


# -- two keys at once: a rollout, a rotation (real processes) -----------------------------------------------

OTHER = "a rotated secret, also 16+ bytes"


@pytest.mark.parametrize(("first", "second"), [(None, SECRET), (SECRET, OTHER)], ids=["rollout none->key", "rotation A->B"])
def test_an_observed_oom_holds_across_signing_keys(tmp_path: Path, first: str | None, second: str | None) -> None:
    """A process with one key (or none) records an observed OOM; a process with another key looks the plan up:
    it is served the fact (a stricter entry needs no signature), computes no ``tune`` and overwrites nothing."""
    store = {"disk": str(tmp_path / "s")}
    recorded = fact_result(fact_child({"store": store, "seed": SEED, "do": "record"},
                                      {SIGNING_KEY_ENV: first, SIGNING_KEY_FILE_ENV: None}))
    assert not recorded["held"]
    looked = fact_result(fact_child({"store": store, "seed": SEED, "do": "lookup"},
                                    {SIGNING_KEY_ENV: second, SIGNING_KEY_FILE_ENV: None}))
    assert looked["hit"] and looked["observed"], looked
    assert "served as its fallback all the same" in looked["stderr"]
    again = fact_result(fact_child({"store": store, "seed": SEED, "do": "lookup"},
                                   {SIGNING_KEY_ENV: first, SIGNING_KEY_FILE_ENV: None}))
    assert again["hit"] and again["observed"]  # the first key's process still finds its fact


def test_a_tune_signed_with_another_key_is_refused_but_a_fallback_is_served(tmp_path: Path, keyed: None) -> None:
    """The trust rule within one store: an unverified ``tune`` is a miss (recomputed and replaced), an
    unverified fallback is the decision (and is not replaced by a computed ``tune``)."""
    from prescreen.service import record_observed_oom

    other = Signer(OTHER.encode())
    with DiskStore(tmp_path / "s") as store:
        assert store._cache is not None
        tune = make_entry(SEED)
        assert tune.decision.tune
        store._cache.set(tune.key, tune.to_json(other))
        assert store.get(tune.key) is None
        fact = record_observed_oom(make_plan(SEED + 2), BUDGET, None, requested_bytes=1, free_bytes=2).entry
        assert fact is not None
        store._cache.set(fact.key, fact.to_json(other))
        got = store.get(fact.key)
        assert got is not None and got.decision == fact.decision
        outcome = lookup_or_decide(make_plan(SEED + 2), BUDGET, store)
        assert outcome.hit and outcome.decision == fact.decision
        computed = lookup_or_decide(make_plan(SEED + 2), BUDGET, None)
        assert computed.decision.tune and computed.entry is not None
        assert not store.put(computed.entry)  # a computed tune never replaces the fact, whatever it was signed with
        got = store.get(fact.key)
        assert got is not None and got.decision == fact.decision


def test_the_key_is_normalized_alike_from_the_variable_and_the_file(tmp_path: Path) -> None:
    """``PRESCREEN_SIGNING_KEY="secret\\n"`` in one process and a key file holding ``secret`` in another sign
    alike: the second process hits the first one's ``tune`` instead of taking it for a forgery."""
    key_file = tmp_path / "key"
    key_file.write_text(SECRET)
    os.chmod(key_file, 0o600)
    store = {"disk": str(tmp_path / "s")}
    first = fact_result(fact_child({"store": store, "seed": SEED, "do": "lookup"},
                                   {SIGNING_KEY_ENV: SECRET + "\n", SIGNING_KEY_FILE_ENV: None}))
    assert not first["hit"] and first["action"] == "tune"
    second = fact_result(fact_child({"store": store, "seed": SEED, "do": "lookup"},
                                    {SIGNING_KEY_ENV: None, SIGNING_KEY_FILE_ENV: str(key_file)}))
    assert second["hit"] and "unsigned or forged" not in second["stderr"], second
