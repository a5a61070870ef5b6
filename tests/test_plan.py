"""KernelPlan: payload validation, lossless round trip, canonical hash."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import plan_payloads, upstream_meta

from prescreen.errors import NotBounded, Reason
from prescreen.expr import Axis, Const, Mul
from prescreen.key import plan_hashes
from prescreen.plan import GroupFeature, KernelPlan, SizeArg, TensorArg, WorkspaceArg

PLAN_KEYS = ("kernel_name", "group_features", "axis_names", "axis_static_values", "ordered_arg_specs", "mutated_arg_names")


def normalise_expr(expr: object) -> object:
    """A bare int is ``{"const": n}``; operand tuples are lists."""
    if isinstance(expr, int) and not isinstance(expr, bool):
        return {"const": expr}
    ((key, value),) = expr.items()  # type: ignore[union-attr]
    if key in ("mul", "add", "floordiv"):
        return {key: [normalise_expr(v) for v in value]}
    return {key: value}


def normalise(value: object, key: str = "") -> object:
    """Tuples -> lists, bare-int expression constants -> ``{"const": n}``."""
    if key in ("count_expr", "expr"):
        return normalise_expr(value)
    if key in ("size_exprs", "stride_exprs"):
        return [normalise_expr(v) for v in value]  # type: ignore[attr-defined]
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: normalise(v, k) for k, v in value.items()}
    return value


def shuffled(value: object, rng: random.Random) -> object:
    """The same JSON value with every dict's key order shuffled."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    if isinstance(value, (list, tuple)):
        return type(value)(shuffled(v, rng) for v in value)
    return value


def test_upstream_meta_parses() -> None:
    plan = KernelPlan.from_payload(upstream_meta())
    assert plan.group_features == (GroupFeature("outer", "outer_product", ("x0",), (8,)),)
    assert plan.args[1] == TensorArg("in_ptr0", "buffer", (Axis("x0"), Const(10)), (Const(10), Const(1)), "torch.float16", "npu:0")
    assert plan.args[2] == SizeArg("xnumel", "axis_expr", expr=Axis("x0"))
    assert plan.mutated_arg_names == ("out_ptr0",)
    assert plan.is_dynamic
    assert plan.display_name == "triton_poi_fused_0"


def test_workspace_and_runtime_size_args() -> None:
    meta = upstream_meta()
    meta["ordered_arg_specs"] = [
        {"kind": "workspace", "source": "workspace", "name": "ws", "count_expr": {"mul": [{"axis_name": "x0"}, 4]},
         "dtype": torch.int32, "device": "npu:0", "zero_mode": "ZERO_ON_CALL"},
        {"kind": "size", "source": "runtime_arg", "name": "ks0", "index": 1},
    ]
    plan = KernelPlan.from_payload(meta)
    assert plan.args == (
        WorkspaceArg("ws", Mul((Axis("x0"), Const(4))), "torch.int32", "npu:0", "ZERO_ON_CALL"),
        SizeArg("ks0", "runtime_arg", index=1),
    )


def test_is_dynamic_and_placeholder_names() -> None:
    meta = upstream_meta()
    meta["axis_static_values"] = [["x0", 16]]
    meta["kernel_name"] = "KERNEL_NAME"
    plan = KernelPlan.from_payload(meta)
    assert not plan.is_dynamic
    assert plan.display_name == "<unnamed>"


def test_static_values_as_a_mapping_are_rejected() -> None:
    # torch_npu iterates whatever it gets as (name, value) pairs: a mapping's keys,
    # not its items. prescreen cannot mirror that, so it refuses (the hook defers).
    meta = upstream_meta()
    meta["axis_static_values"] = {"x0": 4}
    with pytest.raises(NotBounded, match="axis_static_values must be a list of .* got a mapping"):
        KernelPlan.from_payload(meta)


@pytest.mark.parametrize("missing", ["group_features", "axis_names", "axis_static_values", "ordered_arg_specs",
                                     "mutated_arg_names"])
def test_a_plan_missing_a_key_torch_npu_always_writes_is_invalid(missing: str) -> None:
    meta = upstream_meta()
    del meta[missing]
    with pytest.raises(NotBounded, match=f"plan is missing '{missing}'"):
        KernelPlan.from_payload(meta)
    with pytest.raises(NotBounded, match=f"plan is missing '{missing}'"):
        KernelPlan.from_payload(meta, unknown_keys="ignore")


def test_a_kernel_name_alone_is_not_a_plan() -> None:
    with pytest.raises(NotBounded, match="plan is missing 'group_features', 'axis_names'"):
        KernelPlan.from_payload({"kernel_name": "k"})


def test_unknown_keys_are_rejected_by_name_unless_ignored() -> None:
    meta = upstream_meta()
    meta["ordered_arg_spec"] = meta["ordered_arg_specs"]
    with pytest.raises(NotBounded, match="unknown key\\(s\\) 'ordered_arg_spec'"):
        KernelPlan.from_payload(meta)
    assert KernelPlan.from_payload(meta, unknown_keys="ignore").args == KernelPlan.from_payload(upstream_meta()).args
    meta = upstream_meta()
    meta.update(group_enabled=True, group_template="pointwise")  # what torch_npu writes beside the plan
    KernelPlan.from_payload(meta)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("group_features", 0, "source"), "diagonal"),
        (("group_features", 0, "buckets"), [8, 8]),
        (("group_features", 0, "buckets"), [16, 8]),
        (("group_features", 0, "buckets"), [8.5]),
        (("group_features", 0, "buckets"), "8"),
        (("group_features", 0, "name"), None),
        (("group_features",), {"name": "f"}),
        (("axis_names",), "x0"),
        (("axis_static_values",), [["x0"]]),
        (("axis_static_values",), [["x0", "4"]]),
        (("axis_static_values",), [["x0", True]]),
        (("ordered_arg_specs", 0, "kind"), "scalar"),
        (("ordered_arg_specs", 0, "source"), "runtime_arg"),
        (("ordered_arg_specs", 0, "name"), 7),
        (("ordered_arg_specs", 0, "dtype"), 3),
        (("ordered_arg_specs", 0, "size_exprs"), {"axis_name": "x0"}),
        (("ordered_arg_specs", 2, "source"), "buffer"),
        (("mutated_arg_names",), [None]),
    ],
)
def test_invalid_payloads_fail_closed(path: tuple[object, ...], value: object) -> None:
    meta = copy.deepcopy(upstream_meta())
    target: object = meta
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    with pytest.raises(NotBounded) as info:
        KernelPlan.from_payload(meta)
    assert info.value.reason is Reason.INVALID_PLAN


def test_bad_expression_in_payload_is_unknown_expr() -> None:
    meta = upstream_meta()
    meta["ordered_arg_specs"][0]["size_exprs"] = [{"mod": [{"axis_name": "x0"}, 2]}]  # type: ignore[index]
    with pytest.raises(NotBounded) as info:
        KernelPlan.from_payload(meta)
    assert info.value.reason is Reason.UNKNOWN_EXPR


@settings(max_examples=200, deadline=None)
@given(plan_payloads(fail_closed=False, extra_keys=True))
def test_round_trip(meta: dict[str, object]) -> None:
    plan = KernelPlan.from_payload(meta)
    payload = plan.to_payload()
    assert KernelPlan.from_payload(payload) == plan
    assert payload == normalise({k: meta[k] for k in PLAN_KEYS})
    assert json.loads(json.dumps(payload)) == payload  # plain JSON, nothing else


@settings(max_examples=100, deadline=None)
@given(plan_payloads(), st.randoms(use_true_random=False))
def test_hash_ignores_key_order_name_and_static_order(meta: dict[str, object], rng: random.Random) -> None:
    base = plan_hashes(KernelPlan.from_payload(meta))[0]
    other = shuffled(copy.deepcopy(meta), rng)
    statics = list(other["axis_static_values"])  # type: ignore[index, call-overload]
    rng.shuffle(statics)
    other["axis_static_values"] = statics  # type: ignore[index]
    mutated = list(other["mutated_arg_names"])  # type: ignore[index, call-overload]
    rng.shuffle(mutated)
    other["mutated_arg_names"] = mutated + mutated[:1]  # type: ignore[index]
    other["kernel_name"] = "some_other_name"  # type: ignore[index]
    assert plan_hashes(KernelPlan.from_payload(other))[0] == base  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["group_features"][0].update(buckets=[9]),
        lambda m: m["group_features"][0].update(source="reduction_product"),
        lambda m: m["ordered_arg_specs"][1].update(dtype="torch.float32"),
        lambda m: m["ordered_arg_specs"][1]["size_exprs"].__setitem__(1, {"const": 11}),
        lambda m: m.update(mutated_arg_names=["in_ptr0"]),
        lambda m: m.update(axis_static_values=[["x0", 8]]),
        lambda m: m["ordered_arg_specs"].reverse(),
    ],
)
def test_hash_depends_on_content(edit: object) -> None:
    meta = upstream_meta()
    changed = copy.deepcopy(meta)
    edit(changed)  # type: ignore[operator]
    assert plan_hashes(KernelPlan.from_payload(changed))[0] != plan_hashes(KernelPlan.from_payload(meta))[0]


def test_hash_of_repeated_static_axis_follows_the_value_used() -> None:
    """A repeated static axis: the last value is the one used, so it is the one hashed."""
    meta = upstream_meta()
    meta["group_features"] = [{"name": "f", "source": "outer_product", "axis_names": ["x0", "r0"], "buckets": [64]}]
    meta["axis_names"] = ["x0", "r0"]

    def plan_hash(statics: list[list[object]]) -> str:
        return plan_hashes(KernelPlan.from_payload({**meta, "axis_static_values": statics}))[0]

    assert plan_hash([["r0", 5], ["r0", 3]]) == plan_hash([["r0", 3]])
    assert plan_hash([["r0", 5], ["r0", 3]]) != plan_hash([["r0", 3], ["r0", 5]])


def test_bare_int_and_dtype_object_normalise_in_hash() -> None:
    meta = upstream_meta()
    other = copy.deepcopy(meta)
    other["ordered_arg_specs"][1]["stride_exprs"] = (10, 1)  # type: ignore[index]
    other["ordered_arg_specs"][1]["dtype"] = torch.float16  # type: ignore[index]
    assert plan_hashes(KernelPlan.from_payload(other))[0] == plan_hashes(KernelPlan.from_payload(meta))[0]
    assert len(plan_hashes(KernelPlan.from_payload(meta))[0]) == 64
