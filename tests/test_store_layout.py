"""Schema 2: the plan kept apart from the decision (a JSON string field); lookups read the store every time,
and keys follow from the plan (issue 15)."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_store_support import BUDGET, entry_fields, entry_text, make_entry, make_plan, plan_payload

from prescreen.cli import cli
from prescreen.decision import decide, is_observed_oom
from prescreen.key import SCHEMA_VERSION, build_key, plan_hashes
from prescreen.plan import KernelPlan, canonical_json
from prescreen.service import COUNTERS, lookup_or_decide, record_observed_oom
from prescreen.store import DiskStore, export_bundle, import_bundle, verify_entry
from prescreen.store.entry import Entry, InvalidEntry

SEED = 3


def _edit(text: str, **fields: object) -> str:
    d = entry_fields(text)
    d.update(fields)
    return entry_text(d)


def test_the_details_and_the_plan_are_lines_of_their_own_and_round_trip() -> None:
    entry = make_entry(SEED)
    head, details, record, plan_line = entry.to_json().split("\n")  # exactly four lines
    assert json.loads(head).keys() == {"decision", "dynamic", "key", "schema_version"}  # what a hit reads
    assert plan_line == entry.plan_text == canonical_json(make_plan(SEED).to_payload())
    assert json.loads(details) == {"dominant_arg": entry.decision.to_payload()["dominant_arg"],
                                   "group_bytes": [list(pair) for pair in entry.decision.group_bytes]}
    assert not {"dominant_arg", "group_bytes"} & json.loads(head)["decision"].keys()
    assert json.loads(record) == {k: v for k, v in entry.to_payload().items()
                                  if k in ("created_at", "family", "hits", "host", "kernel", "parts", "pid")}
    stored = entry_fields(entry.to_json())
    assert stored["schema_version"] == SCHEMA_VERSION == 5
    assert isinstance(stored["plan"], str) and entry.to_payload()["plan"] == plan_line
    assert stored["dynamic"] is make_plan(SEED).is_dynamic is True  # x0 and r0 have no static value
    assert KernelPlan.from_payload(entry.plan) == make_plan(SEED)
    assert Entry.from_json(entry.to_json()) == entry  # a listing decodes and re-hashes the plan


def test_dynamic_flag_is_the_plans() -> None:
    payload = plan_payload(SEED)
    payload["axis_static_values"] = [["x0", 64], ["r0", 64], ["s0", 4]]
    plan = KernelPlan.from_payload(payload)
    entry = lookup_or_decide(plan, BUDGET, None).entry
    assert entry is not None and entry.dynamic is plan.is_dynamic is False


def test_a_hit_does_not_decode_the_plan(tmp_path: Path) -> None:
    """Garbage plan text still serves a lookup (the key came from the caller's plan), not a verify or an import."""
    entry = make_entry(SEED)
    with DiskStore(tmp_path) as store:
        assert store._cache is not None
        store._cache.set(entry.key, _edit(entry.to_json(), plan="[" * 5000))
        got = store.get(entry.key)
        assert got is not None and got.decision == decide(make_plan(SEED), BUDGET)
        assert got.plan == {} and not verify_entry(got)
        assert export_bundle(store, tmp_path / "b.json") == 1
    with DiskStore(tmp_path / "other") as other:
        assert import_bundle(other, tmp_path / "b.json") == (0, 1)  # the import decodes and re-hashes the plan
    for command in (["inspect"], ["inspect", entry.key], ["inspect", "--verify"], ["report"]):
        result = CliRunner().invoke(cli, ["--cache-dir", str(tmp_path), *command])
        assert result.exception is None or isinstance(result.exception, SystemExit), (command, result.output)


def test_a_dynamic_flag_that_disagrees_with_the_plan_is_invalid_wherever_the_plan_is_read(tmp_path: Path) -> None:
    entry = make_entry(SEED)
    forged = _edit(entry.to_json(), dynamic=not entry.dynamic)
    with pytest.raises(InvalidEntry, match="dynamic flag"):
        Entry.from_json(forged)
    with DiskStore(tmp_path) as store:
        assert store._cache is not None
        store._cache.set(entry.key, forged)
        outcome = lookup_or_decide(make_plan(SEED), BUDGET, store)  # the service checks it against its plan
        assert not outcome.hit and outcome.decision == decide(make_plan(SEED), BUDGET)


@pytest.mark.parametrize("schema", [1, 2, 3, 4])
def test_old_schema_entries_are_misses(tmp_path: Path, schema: int, caplog: pytest.LogCaptureFixture) -> None:
    entry = make_entry(SEED)
    # Schemas 1 and 2 were one JSON line: 1 embedded the plan object, 2 held its text as a string field.
    # Schema 3 was two lines: the head (the whole decision in it), then the plan. Schema 4 was three: the head
    # (key parts and provenance in it too), the decision's details, then the plan.
    fields = dict(entry.to_payload(), schema_version=schema, plan=entry.plan if schema == 1 else entry.plan_text)
    if schema == 3:
        del fields["plan"]
        old = json.dumps(fields, sort_keys=True, separators=(",", ":")) + "\n" + entry.plan_text
    elif schema == 4:
        del fields["plan"]
        details = {k: fields["decision"].pop(k) for k in ("dominant_arg", "group_bytes")}  # type: ignore[union-attr]
        old = "\n".join(json.dumps(x, sort_keys=True, separators=(",", ":")) for x in (fields, details))
        old += "\n" + entry.plan_text
    else:
        old = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    with DiskStore(tmp_path) as store, caplog.at_level(logging.WARNING, logger="prescreen.store"):
        assert store._cache is not None
        store._cache.set(entry.key, old)
        assert store.get(entry.key) is None
        assert any(f"entry has schema {schema}" in r.getMessage() for r in caplog.records)
        outcome = lookup_or_decide(make_plan(SEED), BUDGET, store)
        assert not outcome.hit
        assert store.get(entry.key) is not None  # the invalid value was replaced


def test_plan_stored_apart_still_verifies_exports_and_imports(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "a") as a:
        for seed in range(4):
            lookup_or_decide(make_plan(seed), BUDGET, a)
        stored = sorted(a.entries(), key=lambda e: e.key)
        assert len(stored) == 4 and all(verify_entry(e) for e in stored)
        assert export_bundle(a, tmp_path / "b.json") == 4
    with DiskStore(tmp_path / "c") as c:
        assert import_bundle(c, tmp_path / "b.json") == (4, 0)
        again = sorted(c.entries(), key=lambda e: e.key)
        assert [(e.key, e.decision, e.plan) for e in again] == [(e.key, e.decision, e.plan) for e in stored]
        assert all(verify_entry(e) for e in again)


def test_verify_detects_a_decision_that_differs_from_a_fresh_one() -> None:
    entry = make_entry(SEED)
    other = dataclasses.replace(entry.decision, reason=entry.decision.reason + " (edited)")
    assert verify_entry(entry) and not verify_entry(dataclasses.replace(entry, decision=other))


def test_every_lookup_reads_the_store_and_counts_a_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(SEED)
    with DiskStore(tmp_path) as store:
        first = lookup_or_decide(plan, BUDGET, store)
        reads: list[str] = []
        real_lookup = store.lookup
        monkeypatch.setattr(store, "lookup", lambda key: reads.append(key) or real_lookup(key))
        before, store_hits = dataclasses.replace(COUNTERS), store.hits
        second = lookup_or_decide(plan, BUDGET, store)
        third = lookup_or_decide(make_plan(SEED), BUDGET, store)  # an equal plan, another object
        assert reads == [first.key, first.key] and store.hits == store_hits + 2
        assert (first.hit, second.hit, third.hit) == (False, True, True)
        assert second.decision == third.decision == first.decision == decide(plan, BUDGET)
        assert (COUNTERS.lookups, COUNTERS.hits, COUNTERS.estimator_calls) == (
            before.lookups + 2, before.hits + 2, before.estimator_calls)
        assert COUNTERS.tuned + COUNTERS.fell_back == before.tuned + before.fell_back + 2
        assert COUNTERS.largest_estimate >= (second.decision.estimated_bytes or 0)


def test_an_observed_oom_recorded_here_is_served_at_the_next_lookup(tmp_path: Path) -> None:
    plan = make_plan(SEED)
    with DiskStore(tmp_path) as store:
        tuned = lookup_or_decide(plan, BUDGET, store)
        assert tuned.decision.tune and lookup_or_decide(plan, BUDGET, store).hit
        record_observed_oom(plan, BUDGET, store, requested_bytes=1, free_bytes=2)
        after = lookup_or_decide(plan, BUDGET, store)
        assert after.hit and is_observed_oom(after.decision) and not after.decision.tune
        stored = store.get(after.key)
        assert stored is not None and stored.decision == after.decision


def test_a_delete_made_beside_the_service_is_seen_at_the_next_lookup(tmp_path: Path) -> None:
    plan = make_plan(SEED)
    with DiskStore(tmp_path) as store:
        lookup_or_decide(plan, BUDGET, store)
        assert lookup_or_decide(plan, BUDGET, store).hit
        store.delete([build_key(plan, BUDGET)[0]])
        assert not lookup_or_decide(plan, BUDGET, store).hit


def test_plan_hashes_equal_the_plan_s_own_hash_and_ignore_the_kernel_name() -> None:
    plan = make_plan(SEED, n_args=5)
    assert plan_hashes(plan)[0] == plan_hashes(plan)[0] and plan_hashes(plan) == plan_hashes(make_plan(SEED, n_args=5))
    renamed = dataclasses.replace(plan, kernel_name="other")  # not hashed: same key
    assert build_key(renamed, BUDGET) == build_key(plan, BUDGET)
    assert build_key(make_plan(SEED + 1), BUDGET)[0] != build_key(plan, BUDGET)[0]


def test_a_key_tells_a_float_ratio_from_an_int_one() -> None:
    one_float = dataclasses.replace(BUDGET, ratio=1.0)
    one_int = dataclasses.replace(BUDGET, ratio=1)
    plan = make_plan(SEED)
    assert build_key(plan, one_float)[1].ratio == 1.0 and type(build_key(plan, one_int)[1].ratio) is int
    assert build_key(plan, one_float)[0] != build_key(plan, one_int)[0]


def test_an_unhashable_hand_built_plan_is_keyed_as_its_tuple_form() -> None:
    plan = make_plan(SEED)
    odd = dataclasses.replace(plan, mutated_arg_names=["in_ptr0"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hash(odd)
    assert build_key(odd, BUDGET)[0] == build_key(plan, BUDGET)[0]


def test_importing_the_store_does_not_import_redis() -> None:
    code = "import sys, prescreen.store; print('redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "False"


def test_redis_url_env_names_agree() -> None:
    import prescreen.store
    from prescreen.store import redis_store

    assert prescreen.store.REDIS_URL_ENV == redis_store.REDIS_URL_ENV
    assert prescreen.store.RedisStore is redis_store.RedisStore


def _with_line(text: str, index: int, line: str) -> str:
    """A stored entry's text with line ``index`` (1: the details, 2: the record) replaced by ``line``."""
    lines = text.split("\n")
    lines[index] = line
    return "\n".join(lines)


def _refused_everywhere(tmp_path: Path, entry: Entry, hostile: str) -> None:
    """Every decode refuses ``hostile``; stored under the entry's key it is a miss, and a lookup computes the
    decision afresh and replaces it (a put replaces an invalid value)."""
    for key in (None, entry.key):
        with pytest.raises(InvalidEntry):
            Entry.from_json(hostile, key)
    with DiskStore(tmp_path) as store:
        assert store._cache is not None
        store._cache.set(entry.key, hostile)
        assert store.lookup(entry.key) is None and list(store.entries()) == []
        outcome = lookup_or_decide(make_plan(SEED), BUDGET, store)
        assert not outcome.hit and outcome.decision == entry.decision
        assert store._cache.get(entry.key) != hostile
        assert [e.decision for e in store.entries()] == [entry.decision]


BAD_DETAILS = {
    "not-json": "{",
    "deep": "[" * 5000 + "]" * 5000,
    "empty-object": "{}",
    "extra-field": None,  # built from the genuine line below
    "sum-off": None,
    "bool-group": None,
    "dominant-not-an-object": None,
}


def _bad_details(name: str, genuine: str) -> str:
    found = json.loads(genuine)
    if name == "extra-field":
        found["extra"] = 1
    elif name == "sum-off":
        found["group_bytes"][-1][1] += 8
    elif name == "bool-group":
        found["group_bytes"][0][0] = True
    elif name == "dominant-not-an-object":
        found["dominant_arg"] = [1]
    else:
        return BAD_DETAILS[name]  # type: ignore[return-value]
    return json.dumps(found)


@pytest.mark.parametrize("name", sorted(BAD_DETAILS))
def test_bad_details_are_invalid_everywhere(tmp_path: Path, name: str) -> None:
    entry = make_entry(SEED)
    text = entry.to_json()
    _refused_everywhere(tmp_path, entry, _with_line(text, 1, _bad_details(name, text.split("\n")[1])))


BAD_RECORDS = {
    "not-json": "{",
    "deep": "[" * 5000 + "]" * 5000,
    "not-an-object": "[]",
    "host-missing": "drop:host",
    "pid-a-bool": "set:pid:true",
    "created_at-a-string": 'set:created_at:"now"',
    "family-a-list": "set:family:[1]",
    "parts-of-another-plan": 'set:parts:{"plan_hash":"00"}',
    "a-head-field-again": 'set:key:"00"',
}


def _bad_record(name: str, genuine: str) -> str:
    how = BAD_RECORDS[name]
    if ":" not in how:
        return how
    found = json.loads(genuine)
    op, field, *value = how.split(":", 2)
    if op == "drop":
        del found[field]
    else:
        found[field] = json.loads(value[0])
    return json.dumps(found, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
def test_a_bad_record_is_invalid_everywhere(tmp_path: Path, name: str) -> None:
    entry = make_entry(SEED)
    text = entry.to_json()
    _refused_everywhere(tmp_path, entry, _with_line(text, 2, _bad_record(name, text.split("\n")[2])))


@pytest.mark.parametrize("schema", ["5.0", "true"])
def test_a_schema_that_only_equals_the_current_one_is_refused_by_every_decode(schema: str) -> None:
    """``5.0 == 5`` in Python, but the schema is an exact int: a lookup and a full decode agree on refusing it."""
    entry = make_entry(SEED)
    text = entry.to_json().replace(f'"schema_version":{SCHEMA_VERSION}', f'"schema_version":{schema}', 1)
    for decode in (lambda: Entry.from_json(text), lambda: Entry.from_json(text, entry.key)):
        with pytest.raises(InvalidEntry, match="schema"):
            decode()
