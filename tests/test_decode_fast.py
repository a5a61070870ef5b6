"""A lookup's decoding: hostile decisions are refused cleanly, and ``parse_json`` is json's decoder.

``parse_json`` calls json's scanner directly: it is compared here with the plain decoder, the same
result or the same error. A hostile decision is a ValueError (which the entry decoder turns into a
miss) or a decision that round-trips.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_support import BUDGET, make_entry, make_plan

from prescreen.budget import Budget
from prescreen.decision import DETAIL_FIELDS, Decision, decide, is_observed_oom
from prescreen.footprint import ArgFootprint
from prescreen.key import build_key
from prescreen.store import entry as entry_module
from prescreen.store.entry import RECORD_FIELDS, Entry, InvalidEntry, parse_json
from prescreen.store.signing import canonical

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


def lazy_decode(payload: Any) -> Decision:
    """What a lookup decodes: the decision's head now, its details (kept as JSON text) on first access."""
    if not isinstance(payload, dict):
        return Decision.from_payload(payload, details="{}")
    head = {k: v for k, v in payload.items() if k not in DETAIL_FIELDS}
    details = json.dumps({k: payload[k] for k in DETAIL_FIELDS if k in payload})
    decision = Decision.from_payload(head, details=details)
    decision.group_bytes, decision.dominant_arg  # noqa: B018 - first access decodes them; it must never raise
    return decision


@settings(max_examples=1500, deadline=None)
@given(edited(PAYLOADS, DECISION_PATHS))
def test_a_lookup_decodes_as_the_full_check_except_that_bad_details_read_as_empty(payload: Any) -> None:
    """Differential: a lookup's decision (details decoded on first access) against the full decode of the same
    value. What the full check accepts, a lookup accepts equal; what a lookup refuses, the full check refuses;
    what a lookup accepts and the full check refuses has details that read as empty (only they are bad)."""
    if isinstance(payload, dict):  # the details as a lookup gets them: through JSON text (a tuple is a list, ...)
        payload = {k: json.loads(json.dumps(v)) if k in DETAIL_FIELDS else v for k, v in payload.items()}
    full, lazy = outcome(Decision.from_payload, payload), outcome(lazy_decode, payload)
    if lazy[0] == "error":
        assert lazy[1][0] is ValueError and full[0] == "error"  # type: ignore[index]
    elif full[0] == "ok":
        assert lazy[1] == full[1]
    else:
        decision: Decision = lazy[1]  # type: ignore[assignment]
        assert (decision.group_bytes, decision.dominant_arg) == ((), None)
        bare = dict(payload, group_bytes=[], dominant_arg=None)  # the head alone is valid ...
        if decision.synthetic_bytes:  # ... save the checks that need the details
            bare["group_bytes"] = [[decision.largest_group_id, decision.synthetic_bytes]]
        assert outcome(Decision.from_payload, bare)[0] == "ok", bare


# --- A lookup's entry: the head line now, the key's parts the caller's, the record line on first access ---

ENTRY = make_entry(1)
ENTRY_PAYLOAD: dict[str, Any] = json.loads(json.dumps(ENTRY.to_payload()))
_HEAD_EDITS = [("key",), ("dynamic",), ("schema_version",)]
ENTRY_PATHS = _HEAD_EDITS + [(k,) for k in RECORD_FIELDS + ("parts",)] + [
    ("parts", k) for k in sorted(ENTRY_PAYLOAD["parts"])] + [("parts", "versions", "torch"), ("family", "group_count")]


def lazy_entry(text: str) -> Entry:
    """What a lookup decodes, every field read (the record's first access must never raise)."""
    entry = Entry.from_json(text, ENTRY.key, lazy=True)
    for name in RECORD_FIELDS:
        getattr(entry, name)
    return entry


@settings(max_examples=1000, deadline=None)
@given(edited([ENTRY_PAYLOAD], ENTRY_PATHS))
def test_a_lookup_decodes_an_entry_as_the_full_check_except_that_a_bad_record_is_not_read(payload: Any) -> None:
    """Differential: a lookup's entry against the full decode of the same text (both under the key the caller
    digested). What the full check accepts, a lookup accepts equal; what a lookup refuses, the full check
    refuses; what only the full check refuses is a record line (key parts, provenance) a hit does not read:
    with the genuine record, the same head decodes in full."""
    build_key(make_plan(1), BUDGET)  # the caller's own key: its parts are known to this process
    try:
        text = canonical(payload)
    except ValueError:  # NaN: no JSON text to store
        return
    full, lazy = outcome(Entry.from_json, text, ENTRY.key), outcome(lazy_entry, text)
    if lazy[0] == "error":
        assert issubclass(lazy[1][0], InvalidEntry) and full[0] == "error"  # type: ignore[index, arg-type]
    elif full[0] == "ok":
        assert lazy[1] == full[1]
    else:
        assert lazy[1].decision == ENTRY.decision and lazy[1].parts == ENTRY.parts  # type: ignore[union-attr]
        head = {k[0]: payload[k[0]] for k in _HEAD_EDITS if k[0] in payload}
        genuine = canonical({**{k: v for k, v in ENTRY_PAYLOAD.items() if k not in head}, **head})
        assert outcome(Entry.from_json, genuine, ENTRY.key)[0] == "ok", payload


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


# --- parse_json ------------------------------------------------------------------------------------


def reference_parse(text: str | bytes) -> object:
    try:
        return entry_module._DECODER.decode(text.decode("utf-8") if isinstance(text, bytes) else text)
    except RecursionError:
        raise InvalidEntry("entry is JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidEntry(f"entry is not JSON: {exc}") from None


@pytest.mark.parametrize("text", [
    '{"a":1}', ' {"a":1}', '{"a":1} ', '{"a":1}\n', '{"a":1}x', "", " ", "[1,2", "NaN", "[Infinity]", "[1e400]",
    "[-1e400]", '{"a":1.5}', '"s"', "1", "[" * 100_000 + "]" * 100_000, b'{"a":1}', b"\xff", '{"a":1}{"b":2}',
    '{"a":[1,{"b":null}]}', "\u00e9", '"\\ud800"',
])
def test_parse_json_is_decode(text: str | bytes) -> None:
    assert outcome(parse_json, text) == outcome(reference_parse, text)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tfnaluIN \n', max_size=30))
def test_parse_json_is_decode_on_random_text(text: str) -> None:
    assert outcome(parse_json, text) == outcome(reference_parse, text)
