"""Keys: the directly written canonical text is byte for byte ``canonical_json`` of the payload."""

from __future__ import annotations

import dataclasses
import hashlib
from importlib import metadata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import plan_payloads, upstream_meta
from test_footprint_fast import plans

from prescreen import key
from prescreen.expr import Axis, Const
from prescreen.key import KeyParts, _version, canonical_texts, family_payload, library_versions, payload_text
from prescreen.plan import KernelPlan, TensorArg, canonical_json


def slow_texts(plan: KernelPlan) -> tuple[str, str]:
    return canonical_json(family_payload(plan)), canonical_json(plan.canonical_payload())


@settings(max_examples=300, deadline=None)
@given(plan_payloads(extra_keys=True))
def test_canonical_texts_equal_canonical_json_of_parsed_payloads(payload: dict[str, object]) -> None:
    plan = KernelPlan.from_payload(payload)
    assert canonical_texts(plan) == slow_texts(plan)
    assert hashlib.sha256(canonical_texts(plan)[1].encode()).hexdigest() == plan.plan_hash()


@settings(max_examples=300, deadline=None)
@given(plans())
def test_canonical_texts_equal_canonical_json_of_hand_built_plans(plan: KernelPlan) -> None:
    """Runtime args, workspaces, size args, repeated names, unsorted statics and mutated names."""
    assert canonical_texts(plan) == slow_texts(plan)


def test_non_ascii_names_and_odd_values_give_the_same_text() -> None:
    plan = KernelPlan.from_payload(upstream_meta())
    odd = dataclasses.replace(
        plan,
        kernel_name="ignored",
        axis_static_values=(("x0", 3), ("é\"\\ \n", 2), ("x0", 5)),
        mutated_arg_names=("out_ptr0", "out_ptr0", "\u2603"),
        args=(*plan.args, TensorArg("t\u00e9", "constant", (Axis("x0"),), (Const(-1),), "torch.float16", "")),
    )
    assert canonical_texts(odd) == slow_texts(odd)
    # A value the direct writer does not cover (a bool where an int belongs) takes json's own path.
    boolish = dataclasses.replace(plan, axis_static_values=(("x0", True),))
    assert canonical_texts(boolish) == slow_texts(boolish)
    # Strings go through json's own encoder: a str subclass is a string, anything else (an int name, a None
    # device) is left to json's general path, which writes it as it is.

    class Name(str):
        pass

    for value in (Name("in_ptr0"), 7, None):
        arg = dataclasses.replace(plan.args[0], name=value, device=value)  # type: ignore[arg-type]
        odd_arg = dataclasses.replace(plan, args=(arg, *plan.args[1:]), mutated_arg_names=(value,))  # type: ignore[arg-type]
        assert canonical_texts(odd_arg) == slow_texts(odd_arg)


@settings(max_examples=300, deadline=None)
@given(plan_payloads(extra_keys=True))
def test_payload_text_equals_canonical_json_of_the_payload(payload: dict[str, object]) -> None:
    plan = KernelPlan.from_payload(payload)
    assert payload_text(plan) == canonical_json(plan.to_payload())
    labelled = dataclasses.replace(plan, axis_labels=tuple((a, f"{a} in (8, 16]\u00e9") for a in plan.axis_names))
    assert payload_text(labelled) == canonical_json(labelled.to_payload())


@settings(max_examples=200, deadline=None)
@given(plans())
def test_payload_text_of_hand_built_plans(plan: KernelPlan) -> None:
    assert payload_text(plan) == canonical_json(plan.to_payload())
    odd = dataclasses.replace(plan, kernel_name="\u2603 k", axis_static_values=(("s0", True), ("x", 2)))
    assert payload_text(odd) == canonical_json(odd.to_payload())


@pytest.mark.parametrize("dist", ["torch", "numpy", "click", "diskcache", "sympy", "prescreen", "no-such-dist-xyz"])
def test_versions_are_read_from_the_metadata_headers_as_importlib_reads_them(dist: str) -> None:
    try:
        expected = metadata.version(dist)
    except metadata.PackageNotFoundError:
        expected = "absent"
    assert _version(dist) == expected
    assert dict(library_versions())["torch"] == metadata.version("torch")


def test_leaf_tables_give_json_s_text_for_str_subclasses_bools_and_odd_names() -> None:
    """Axis names and constants come from process-wide tables keyed by value: a str subclass finds its own text,
    a bool constant (``True == 1``) and a name json cannot write as a string take the general path."""
    plan = KernelPlan.from_payload(upstream_meta())

    class Name(str):
        pass

    arg = plan.args[0]
    assert isinstance(arg, TensorArg)
    for size in [(Axis(Name("x0")),), (Axis("x0"), Axis(Name("x0"))), (Const(True),), (Const(1), Const(True)),
                 (Const(False), Const(0)), (Axis(7),), (Axis(None),), (Axis("\u00e9\n"),), (Const(2**80),)]:  # type: ignore[arg-type]
        odd = dataclasses.replace(plan, args=(dataclasses.replace(arg, size=size), *plan.args[1:]))
        assert canonical_texts(odd) == slow_texts(odd), size
        assert payload_text(odd) == canonical_json(odd.to_payload()), size


def test_odd_buckets_and_tensor_sources_take_the_general_path() -> None:
    plan = KernelPlan.from_payload(upstream_meta())
    arg = plan.args[0]
    assert isinstance(arg, TensorArg) and plan.group_features

    class Source(str):
        pass

    feature = plan.group_features[0]
    for buckets in [(1, True), (2.0,), (), (2**70, 3)]:
        odd = dataclasses.replace(plan, group_features=(dataclasses.replace(feature, buckets=buckets),
                                                        *plan.group_features[1:]))
        assert canonical_texts(odd) == slow_texts(odd), buckets
    for source in ["constant", Source("buffer"), "workspace", None]:
        odd = dataclasses.replace(plan, args=(dataclasses.replace(arg, source=source), *plan.args[1:]))  # type: ignore[arg-type]
        try:
            expected = slow_texts(odd)
        except Exception as exc:  # noqa: BLE001 - a source the payload writer does not know either
            with pytest.raises(type(exc)):
                canonical_texts(odd)
        else:
            assert canonical_texts(odd) == expected, source


def test_leaf_tables_start_over_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(key, "LEAF_MEMO_SIZE", 4)
    key._axis_texts.clear()
    key._const_texts.clear()
    key._string_texts.clear()
    plan = KernelPlan.from_payload(upstream_meta())
    arg = plan.args[0]
    assert isinstance(arg, TensorArg)
    for i in range(20):
        size = (Axis(f"a{i}"), Const(i), Axis(f"a{i % 3}"))
        odd_arg = dataclasses.replace(arg, size=size, name=f"t{i}", device=f"npu:{i % 5}")
        odd = dataclasses.replace(plan, args=(odd_arg, *plan.args[1:]))
        assert canonical_texts(odd) == slow_texts(odd)
        assert payload_text(odd) == canonical_json(odd.to_payload())
        assert len(key._axis_texts) <= 4 and len(key._const_texts) <= 4 and len(key._string_texts) <= 4


class Name_(str):
    pass


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["npu", "cuda", "\u00e9\"x", Name_("npu")]),
    st.one_of(st.integers(0, 2**70), st.floats(allow_nan=True), st.booleans()),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.booleans()),
    st.one_of(st.integers(-2, 2**64), st.booleans(), st.none()),
    st.sampled_from(["lib", "other", "dupes", "odd"]),
)
def test_key_parts_text_is_canonical_json_of_the_payload(
    device_kind: str, total_memory: int, ratio: float, version: int, versions_kind: str
) -> None:
    versions = {
        "lib": library_versions(),
        "other": (("torch", "0"),),
        "dupes": (("torch", "1"), ("a", "2"), ("torch", "3")),
        "odd": (("torch", 1),),
    }[versions_kind]
    parts = KeyParts("p" * 64, "f\u00e9", device_kind, total_memory, ratio, version, version, versions)  # type: ignore[arg-type]
    try:
        expected = canonical_json(parts.to_payload())
    except (TypeError, ValueError) as exc:  # an int too long for repr: both raise the same
        with pytest.raises(type(exc)):
            parts.text()
        return
    assert parts.text() == expected
    assert parts.digest() == hashlib.sha256(expected.encode()).hexdigest()
