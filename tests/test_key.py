"""Keys: the directly written canonical text is byte for byte ``canonical_json`` of the payload."""

from __future__ import annotations

import dataclasses
import hashlib
from importlib import metadata

import pytest
from hypothesis import given, settings
from strategies import plan_payloads, upstream_meta
from test_footprint_fast import plans

from prescreen.expr import Axis, Const
from prescreen.key import _version, canonical_texts, family_payload, library_versions, payload_text
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
