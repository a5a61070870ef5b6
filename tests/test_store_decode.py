"""Decoding a stored entry: hostile decisions and entries are refused cleanly or round-trip, and entries
written in schema 5's four-line format by an earlier prescreen read back identically (facts included).

A hostile decision is a ValueError (which the entry decoder turns into a miss) or a decision that
round-trips; a hostile entry is an ``InvalidEntry`` or an entry that writes the same payload back.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_support import BUDGET, entry_fields, make_entry, make_plan

from prescreen.budget import Budget
from prescreen.decision import Decision, decide, is_observed_oom
from prescreen.footprint import ArgFootprint
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore, verify_entry
from prescreen.store.entry import Entry, InvalidEntry, outranks
from prescreen.store.trust import Signer, canonical

_FIELDS = frozenset(f.name for f in dataclasses.fields(Decision) if f.init)
_ARG_FIELDS = frozenset(ArgFootprint.__dataclass_fields__)


def outcome(fn: Any, *args: object) -> tuple[str, object]:
    """What ``fn(*args)`` gives: ("ok", the value) or ("error", its type and message)."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the point is to compare whatever comes out
        return "error", (type(exc), str(exc))


# --- Hostile edits ---------------------------------------------------------------------------------


class Name(str):
    pass


class Count(int):
    pass


HOSTILE_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(-(2**70), 2**70), st.sampled_from([2**63 - 1, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.25, 0.5, 1.0, 1, 0, -0.0]),
    st.text(max_size=3), st.sampled_from(["tune", "fallback", Name("tune"), Name("npu"), Name("x"), "npu"]),
    st.builds(Count, st.integers(0, 3)),
    st.lists(st.integers(0, 3), max_size=3), st.lists(st.lists(st.integers(0, 3), max_size=3), max_size=3),
    st.tuples(st.integers(0, 3), st.integers(0, 3)), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def _payloads() -> list[dict[str, Any]]:
    plan = make_plan(1, n_args=3, n_buckets=3)
    out = [decide(plan, b).to_payload() for b in (BUDGET, Budget("npu", 100, 0.5), Budget("cuda", 3 * 2**30, 1))]
    not_bounded = make_plan(2)
    arg = not_bounded.args[0]
    bad = type(not_bounded)(not_bounded.group_features, not_bounded.axis_names, not_bounded.axis_static_values,
                            (type(arg)(arg.name, arg.source, arg.size, arg.stride, "torch.float17", arg.device),  # type: ignore[call-arg, union-attr]
                             *not_bounded.args[1:]))
    out.append(decide(bad, BUDGET).to_payload())
    oom = dict(out[0], action="fallback", reason="observed_oom: out of memory")
    out.append(oom)
    return json.loads(json.dumps(out))  # as a store gives them back


PAYLOADS = _payloads()
DECISION_PATHS = [(k,) for k in sorted(_FIELDS)] + [("dominant_arg", k) for k in sorted(_ARG_FIELDS)] + [
    ("group_bytes", 0), ("group_bytes", 0, 0), ("group_bytes", 0, 1), ("group_bytes", -1, 1),
    ("dominant_arg", "size", 0)]


@st.composite
def edited(draw: st.DrawFn, base: list[dict[str, Any]], paths: list[tuple[Any, ...]]) -> Any:
    payload = copy.deepcopy(draw(st.sampled_from(base)))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(paths))
        target: Any = payload
        try:
            for step in path[:-1]:
                target = target[step]
            action = draw(st.sampled_from(["set", "set", "set", "delete", "extra"]))
            if action == "set":
                target[path[-1]] = draw(HOSTILE_VALUES)
            elif action == "delete" and isinstance(target, dict):
                target.pop(path[-1], None)
            elif isinstance(target, dict):
                target["extra"] = 1
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit replaced what this path goes through
    return payload


@settings(max_examples=1500, deadline=None)
@given(edited(PAYLOADS, DECISION_PATHS))
def test_a_hostile_decision_is_a_value_error_or_a_decision_that_round_trips(payload: Any) -> None:
    result = outcome(Decision.from_payload, payload)
    if result[0] == "error":
        assert result[1][0] is ValueError  # type: ignore[index]
    else:
        assert Decision.from_payload(result[1].to_payload()) == result[1]  # type: ignore[union-attr]


# --- A hostile entry: refused, or it round-trips ---------------------------------------------------

ENTRY = make_entry(1)
ENTRY_PAYLOAD: dict[str, Any] = json.loads(json.dumps(ENTRY.to_payload()))
RECORD_FIELDS = ("created_at", "family", "hits", "host", "kernel", "pid")
ENTRY_PATHS = [("key",), ("dynamic",), ("schema_version",)] + [(k,) for k in RECORD_FIELDS + ("parts",)] + [
    ("parts", k) for k in sorted(ENTRY_PAYLOAD["parts"])] + [("parts", "versions", "torch"), ("family", "group_count")]


@settings(max_examples=1000, deadline=None)
@given(edited([ENTRY_PAYLOAD], ENTRY_PATHS))
def test_a_hostile_entry_is_invalid_or_round_trips(payload: Any) -> None:
    """Every decode (a lookup's, under the caller's key, and a listing's) refuses a hostile edit with
    ``InvalidEntry`` or gives an entry that writes the same payload back; the two agree."""
    try:
        text = canonical(payload)
    except ValueError:  # NaN: no JSON text to store
        return
    looked, listed = outcome(Entry.from_json, text, ENTRY.key), outcome(Entry.from_json, text)
    for result, key in ((looked, ENTRY.key), (listed, None)):
        if result[0] == "error":
            assert issubclass(result[1][0], InvalidEntry)  # type: ignore[index, arg-type]
        else:
            assert Entry.from_json(result[1].to_json(), key) == result[1]  # type: ignore[union-attr]
    if listed[0] == "ok":
        assert looked == listed


# --- Schema 5 as an earlier prescreen wrote it ------------------------------------------------------

#: Texts written by the prescreen before the one decode (lazy head/record reads): a ``tune``, an observed OOM,
#: and that fact signed with ``b"k" * 32``. A store keeps them across the upgrade.
WRITTEN = json.loads((Path(__file__).parent / "scripts" / "schema5_entries.json").read_text())


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_an_entry_written_by_the_earlier_prescreen_reads_back_identically(name: str) -> None:
    text = WRITTEN[name]
    signer = Signer(b"k" * 32) if name.endswith("_signed_k32") else None
    entry = Entry.from_json(text)
    key = entry_fields(text)["key"]
    assert Entry.from_json(text, key) == entry == Entry.from_json(text, key, signer)
    assert entry.to_json(signer) == text  # the same four lines, byte for byte
    assert entry.signed_payload(signer) == entry_fields(text)
    assert verify_entry(entry) is (name == "tune")  # a fact is not what a fresh estimate gives
    assert is_observed_oom(entry.decision) is (name != "tune")


def test_an_earlier_fact_survives_the_upgrade_in_a_store(tmp_path: Path) -> None:
    """The earlier prescreen's observed OOM, stored beside its key: a lookup serves it, a computed ``tune`` does
    not replace it, and a listing and an export keep it."""
    fact = Entry.from_json(WRITTEN["observed_oom"])
    with DiskStore(tmp_path) as store:
        assert store._cache is not None
        store._cache.set(fact.key, WRITTEN["tune"])  # the earlier tune first
        assert store.put(fact)  # the fact outranks it
        tune = Entry.from_json(WRITTEN["tune"])
        assert outranks(fact.decision, tune.decision) and not store.put(tune)
        assert store.lookup(fact.key) == fact
        assert [e.with_hits(0) for e in store.entries()] == [fact]
        assert store._cache.get(fact.key) == WRITTEN["observed_oom"]


def test_a_signed_fact_is_served_under_another_key_and_a_tune_is_not(tmp_path: Path) -> None:
    """Trust: the earlier signed fact, read with another signing key, is still served (stricter); the same
    text turned into a ``tune`` is refused."""
    other = Signer(b"o" * 32)
    with DiskStore(tmp_path) as store:
        store.signer = other
        assert store._cache is not None
        fact = Entry.from_json(WRITTEN["observed_oom_signed_k32"])
        store._cache.set(fact.key, WRITTEN["observed_oom_signed_k32"])
        assert store.lookup(fact.key) == fact
    with DiskStore(tmp_path / "unsigned") as store:
        store.signer = other
        assert store._cache is not None
        store._cache.set(fact.key, WRITTEN["tune"])  # an unsigned tune under the same key
        assert store.lookup(fact.key) is None


def test_a_lookup_decodes_the_whole_entry(tmp_path: Path) -> None:
    """One decode: a lookup's entry is the full entry (details and record read), equal to ``get``'s."""
    plan = make_plan(1)
    with DiskStore(tmp_path) as store:
        key = lookup_or_decide(plan, BUDGET, store).key
        looked, full = store.lookup(key), store.get(key)
        assert looked is not None and full is not None and looked.with_hits(0) == full.with_hits(0)
        assert looked.decision == decide(plan, BUDGET) and looked.kernel == full.kernel != ""


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: p["reason"][:20])
def test_valid_decisions_decode_as_before(payload: dict[str, Any]) -> None:
    decision = Decision.from_payload(payload)
    assert decision.to_payload() == payload
    assert is_observed_oom(decision) == payload["reason"].startswith("observed_oom")


def test_str_subclasses_are_accepted() -> None:
    payload = copy.deepcopy(PAYLOADS[0])
    payload["device_kind"], payload["reason"] = Name("npu"), Name(payload["reason"])
    payload["dominant_arg"]["name"] = Name(payload["dominant_arg"]["name"])
    assert Decision.from_payload(payload) == Decision.from_payload(PAYLOADS[0])
