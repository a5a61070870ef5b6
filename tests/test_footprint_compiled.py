"""The compiled paths of ``build_representatives`` and ``estimate_footprint`` against the general ones.

The compiled form of a plan is kept on the plan object (``KernelPlan.cache``);
these tests check that it changes no result and no error, that it is used only
for representatives built from the same plan object, and that it is never part
of the plan's value.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_footprint_fast import outcome, plans

from prescreen import footprint, representatives
from prescreen.errors import NotBounded
from prescreen.expr import Add, Axis, Const, FloorDiv, Mul
from prescreen.footprint import estimate_footprint, reference_footprint
from prescreen.plan import GroupFeature, KernelPlan, TensorArg, WorkspaceArg
from prescreen.representatives import GroupGrid, Representatives, build_representatives


def reps_outcome(fn: object, plan: KernelPlan) -> object:
    try:
        reps: Representatives = fn(plan)  # type: ignore[operator]
    except NotBounded as exc:
        return (exc.reason.value, str(exc))
    return (reps.group_count, tuple(reps.groups), reps.unreachable_group_ids, reps.reachable_group_ids)


@st.composite
def feature_lists(draw: st.DrawFn) -> KernelPlan:
    """Features the compiled path covers and ones it leaves to the general path (repeated axes, bad buckets)."""
    statics = {"s0": draw(st.integers(-1, 6)), "s1": draw(st.integers(1, 6))}
    features = []
    for i in range(draw(st.integers(0, 3))):
        source = draw(st.sampled_from(["primary_axis", "axis", "outer_product", "reduction_product"]))
        axes = tuple(draw(st.lists(st.sampled_from(["x0", "x1", "s0", "s1"]), max_size=3, unique=True)))
        buckets = tuple(draw(st.lists(st.integers(-2, 40), max_size=4)))
        if draw(st.integers(0, 3)) > 0:
            buckets = tuple(sorted(set(buckets)))
        features.append(GroupFeature(f"f{i}", source, axes, buckets))  # type: ignore[arg-type]
    axis_names = tuple(a for a in ("x0", "x1", "s0", "s1") if draw(st.booleans()))
    return KernelPlan(tuple(features), axis_names, tuple(statics.items()), ())


@settings(max_examples=500, deadline=None)
@given(feature_lists())
def test_compiled_representatives_equal_the_general_path(plan: KernelPlan) -> None:
    expected = reps_outcome(representatives._general, plan)
    event("general path raises" if len(expected) == 2 else "built")  # type: ignore[arg-type]
    event("compiled" if representatives.reps_program(plan) is not None else "not compiled")
    assert reps_outcome(build_representatives, plan) == expected
    got = build_representatives(plan) if len(expected) != 2 else None  # type: ignore[arg-type]
    if got is not None:  # the lazily built features are the general path's
        assert isinstance(got.groups, GroupGrid)
        general = representatives._general(plan).groups
        assert isinstance(general, GroupGrid)
        assert got.groups.features == general.features
        assert got.groups.shape == general.shape


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_compiled_footprint_equals_the_plain_loop_and_runs_where_it_applies(plan: KernelPlan) -> None:
    try:
        reps = build_representatives(plan)
    except NotBounded:
        return
    expected = outcome(reference_footprint, plan, reps)
    with mock.patch.object(footprint, "_run_compiled", wraps=footprint._run_compiled) as spy:
        assert outcome(estimate_footprint, plan, reps) == expected
    event("compiled" if spy.called else "general")
    program = plan.cache.representatives
    if program is not None and footprint.footprint_program(program, plan) is not None:
        assert spy.called or len(reps.groups) > footprint._SMALL_GRID
    # Representatives of an equal plan object are not this object's: the general path, same result.
    twin = dataclasses.replace(plan)
    assert outcome(estimate_footprint, twin, reps) == expected
    assert outcome(estimate_footprint, twin, build_representatives(twin)) == expected


def test_a_typical_plan_takes_the_compiled_path_and_equal_plans_share_nothing() -> None:
    x0 = Axis("x0")
    plan = KernelPlan(
        (GroupFeature("f", "outer_product", ("x0", "s0"), (8, 64)),),
        ("x0", "s0"),
        (("s0", 3),),
        (
            TensorArg("out", "buffer", (x0, Axis("s0")), (Axis("s0"), Const(1)), "torch.float16", "npu:0"),
            WorkspaceArg("ws", FloorDiv(Mul((x0, Const(3))), Const(2)), "torch.int32", "npu:0", "NONE"),
        ),
        ("out",),
    )
    reps = build_representatives(plan)
    assert isinstance(reps.groups, GroupGrid) and reps.groups.program is plan.cache.representatives
    with mock.patch.object(footprint, "_run_compiled", wraps=footprint._run_compiled) as spy:
        fp = estimate_footprint(plan, reps)
    assert spy.call_count == 1
    assert fp == reference_footprint(plan, reps)
    # The cache is scratch space: not in equality, hash, repr or payload; copies and pickles start empty.
    twin = KernelPlan.from_payload(plan.to_payload())
    assert twin == plan and hash(twin) == hash(plan) and repr(twin) == repr(plan)
    assert "cache" not in repr(plan)
    for other in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan), dataclasses.replace(plan)):
        assert other == plan
        assert other.cache.representatives is None and other.cache.hashes is None


def test_an_axis_a_feature_sets_but_the_plan_does_not_name_is_missing_in_every_group() -> None:
    plan = KernelPlan(
        (GroupFeature("f", "axis", ("x9",), (1, 4)),),
        ("x0",),
        (),
        (TensorArg("t", "buffer", (Axis("x9"),), (Const(1),), "torch.float16", "npu:0"),),
    )
    reps = build_representatives(plan)
    assert outcome(estimate_footprint, plan, reps) == outcome(reference_footprint, plan, reps) == (
        "missing_axis", "missing_axis: axis 'x9' has no value in this group")


@pytest.mark.parametrize("shift", [-1, -4, -9])
def test_a_size_negative_in_some_groups_only_raises_the_plain_loops_error(shift: int) -> None:
    x0 = Axis("x0")
    plan = KernelPlan(
        (GroupFeature("f", "axis", ("x0",), (2, 4, 8)),),
        ("x0",),
        (),
        (TensorArg("t", "buffer", (Add((x0, Const(shift))), x0), (x0, Const(1)), "torch.int8", "npu:0"),),
    )
    reps = build_representatives(plan)
    assert outcome(estimate_footprint, plan, reps) == outcome(reference_footprint, plan, reps)


@pytest.mark.parametrize("buckets", [(-3, 2, 5), (0, 4), (-1,)])
def test_columns_that_may_be_negative_are_checked(buckets: tuple[int, ...]) -> None:
    """A feature's buckets below 0 make its axis column unsafe: sizes, strides and counts over it are checked."""
    x0 = Axis("x0")
    for arg in (
        TensorArg("t", "buffer", (x0,), (Const(1),), "torch.int8", "npu:0"),
        TensorArg("u", "buffer", (Const(2),), (x0,), "torch.int8", "npu:0"),
        TensorArg("v", "buffer", (x0, Const(3)), (x0, Const(1)), "torch.int8", "npu:0"),
        WorkspaceArg("w", Mul((x0, Const(2))), "torch.int8", "npu:0", "NONE"),
    ):
        plan = KernelPlan((GroupFeature("f", "axis", ("x0",), buckets),), ("x0",), (), (arg,))
        reps = build_representatives(plan)
        assert outcome(estimate_footprint, plan, reps) == outcome(reference_footprint, plan, reps)


@pytest.mark.parametrize("zero", [True, False])
def test_the_dominant_argument_among_shared_shapes_and_ties_is_the_plain_loops(zero: bool) -> None:
    """Buffers of one shape with different item sizes, ties across shapes, and every argument at 0 bytes."""
    x0 = Axis("x0")
    size = Const(0) if zero else x0
    one = TensorArg("a", "buffer", (size, Const(2)), (Const(2), Const(1)), "torch.int8", "npu:0")
    other = TensorArg("b", "buffer", (Mul((size, Const(2))),), (Const(1),), "torch.int16", "npu:0")
    same_as_one = TensorArg("c", "buffer", one.size, one.stride, "torch.int16", "npu:0")
    ws = WorkspaceArg("w", Mul((size, Const(4))), "torch.int8", "npu:0", "NONE")
    for args in ((one, other, same_as_one), (other, one, same_as_one, ws), (ws, same_as_one, one, other)):
        plan = KernelPlan((GroupFeature("f", "axis", ("x0",), (2, 4)),), ("x0",), (), args, ("a",))
        reps = build_representatives(plan)
        with mock.patch.object(footprint, "_run_compiled", wraps=footprint._run_compiled) as spy:
            got = outcome(estimate_footprint, plan, reps)
        assert spy.called
        assert got == outcome(reference_footprint, plan, reps)
