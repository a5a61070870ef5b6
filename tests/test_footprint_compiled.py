"""The compiled paths of ``build_representatives`` and ``estimate_footprint`` against the general ones.

The compiled form of a plan is kept on the plan object (``KernelPlan.cache``);
these tests check that it changes no result and no error, that it is used only
for representatives built from the same plan object, and that it is never part
of the plan's value.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import pickle
from collections.abc import Iterator
from typing import Any
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


@contextlib.contextmanager
def compiled_spies() -> Iterator[tuple[list[object], mock.MagicMock]]:
    """What the line path (``_run_line``) gave, call by call, and a spy on the compiled path (``_run_compiled``)."""
    results: list[object] = []
    real = footprint._run_line

    def record(*args: Any) -> object:
        out = real(*args)
        results.append(out)
        return out

    with mock.patch.object(footprint, "_run_line", record), \
            mock.patch.object(footprint, "_run_compiled", wraps=footprint._run_compiled) as spy:
        yield results, spy


def first_estimate(plan: KernelPlan, reps: Representatives) -> object:
    """The plan object's first estimate: the compiled path, which leaves the line form to compile on the second."""
    with compiled_spies() as (line, _):
        got = outcome(estimate_footprint, plan, reps)
    assert not line
    return got


def took_line(results: list[object]) -> bool:
    """True when the line path gave the result (it gives None to leave a call to ``_run_compiled``)."""
    return any(r is not None for r in results)


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
    with compiled_spies() as (line, spy):
        assert outcome(estimate_footprint, plan, reps) == expected
    event("line" if took_line(line) else "compiled" if spy.called else "general")
    program = plan.cache.representatives
    if program is not None and footprint.footprint_program(program, plan) is not None:
        assert spy.called or took_line(line) or len(reps.groups) > footprint._SMALL_GRID
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
        with compiled_spies() as (line, spy):
            got = outcome(estimate_footprint, plan, reps)
        assert spy.called or took_line(line)
        assert got == outcome(reference_footprint, plan, reps)


# --- The line path: one feature, sizes, strides and counts affine in its axis ----------------------

LINE_DTYPES = ("torch.int8", "torch.float16", "torch.float32", "torch.int64", "torch.bool")


@st.composite
def affine_exprs(draw: st.DrawFn, axis: str) -> object:
    """``a * x + b`` in the shapes plans spell it, and a few that are not affine (the line path then declines)."""
    x = Axis(axis)
    a, b = draw(st.integers(-2, 3)), draw(st.integers(-4, 6))
    shape = draw(st.integers(0, 11))
    if shape == 0:
        return Const(b)
    if shape == 1:
        return x
    if shape == 2:
        return Add((x, Const(b if draw(st.booleans()) else -draw(st.sampled_from([3, 5, 8])))))
    if shape == 3:
        return Mul((Const(a), x))
    if shape == 4:
        return Add((Mul((x, Const(a))), Const(b), Axis("s0")))  # s0: a static axis, a constant here
    if shape == 5:
        return FloorDiv(Const(abs(b) * 7), Const(a or 3))
    if shape == 6:
        return Mul((Add((x, Const(1))), Const(a)))
    if shape == 7:
        return Mul((x, x)) if draw(st.integers(0, 3)) == 0 else Add((x, Const(abs(b))))  # x * x: not affine
    if shape == 8:
        return FloorDiv(x, Const(2)) if draw(st.integers(0, 3)) == 0 else x  # not affine
    if shape == 9:  # falls as x grows: with a rising size, a count largest inside the column, or negative
        return Add((Const(draw(st.sampled_from([20, 60, 200, 400]))), Mul((Const(-1), x))))
    if shape == 10:
        return Add((Mul((x, x)), Const(1)))  # not affine
    return Mul((Const(0), x))


@st.composite
def line_plans(draw: st.DrawFn) -> KernelPlan:
    source = draw(st.sampled_from(["primary_axis", "axis", "outer_product", "reduction_product"]))
    axes = ("x0", "s1") if "product" in source and draw(st.booleans()) else ("x0",)
    steps = draw(st.lists(st.integers(1, 9), min_size=1, max_size=8))
    start = draw(st.sampled_from([1, 1, 1, 0, 3, 5, -2, -6]))
    buckets = tuple(start + sum(steps[: j + 1]) - steps[0] for j in range(len(steps)))
    feature = GroupFeature("f", source, axes, buckets)  # type: ignore[arg-type]
    e = affine_exprs("x0")
    args: list[TensorArg | WorkspaceArg] = []
    for i in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(["a", "b", f"t{i}"]))
        dtype = draw(st.sampled_from(LINE_DTYPES))
        if args and draw(st.integers(0, 3)) == 0:  # a buffer of an earlier one's shape
            earlier = draw(st.sampled_from(args))
            if isinstance(earlier, TensorArg):
                args.append(TensorArg(name, "buffer", earlier.size, earlier.stride, dtype, "npu:0"))
                continue
        if draw(st.integers(0, 4)) == 0:
            args.append(WorkspaceArg(name, draw(e), dtype, "npu:0", "NONE"))
        else:
            rank = draw(st.integers(0, 3))
            args.append(TensorArg(name, "buffer", tuple(draw(e) for _ in range(rank)),
                                  tuple(draw(e) for _ in range(rank)), dtype, "npu:0"))
    mutated = tuple(draw(st.lists(st.sampled_from(["a", "b", "t0", "t3", "zz"]), max_size=3)))
    return KernelPlan((feature,), ("x0", "s0", "s1"), (("s0", draw(st.integers(1, 5))), ("s1", 2)), tuple(args),
                      mutated)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line_plans())
def test_the_line_path_gives_the_plain_loops_result(plan: KernelPlan) -> None:
    """Random one-feature plans: ties across and within shapes, zero-byte arguments, sizes that are zero or
    negative in some groups, columns below zero, expressions that are not affine; the result or error is the
    plain loop's, and the line path gives it wherever its checks pass."""
    reps = build_representatives(plan)
    expected = outcome(reference_footprint, plan, reps)
    assert first_estimate(plan, reps) == expected
    with compiled_spies() as (line, spy):
        got = outcome(estimate_footprint, plan, reps)
    assert got == expected
    program = plan.cache.representatives.footprint
    compiled = program if isinstance(program, footprint.FootprintProgram) else None
    if took_line(line):
        event("line")
        assert not spy.called and isinstance(got, footprint.Footprint)
        if got.dominant_arg is not None and got.dominant_arg.num_bytes == 0:
            event("line: every argument 0 bytes")
        elif sum(1 for _, b in got.group_bytes if b == max(b for _, b in got.group_bytes)) > 1:
            event("line: tied groups")
    elif compiled is not None and compiled.line is not None:
        event("line declined the call: " + ("error" if isinstance(expected, tuple) else "zero size or range"))
        assert spy.called
    else:
        event("not on the line path")


@pytest.mark.parametrize("shape", [(1, 4), (1, 8), (1, 16), (4, 4), (64, 16)])
def test_one_feature_bench_plans_take_the_line_path(shape: tuple[int, int]) -> None:
    """``bench_estimate``'s one-feature plans (up to 4 args: their workspaces are floordivs, not affine),
    torch_npu's own test plan and the dense plans take the line path and give the plain loop's result."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from bench_estimate import make_plan  # type: ignore[import-not-found]
    from strategies import upstream_meta  # type: ignore[import-not-found]

    n_args, n_buckets = shape
    x = Axis("a0")
    dense = KernelPlan(
        (GroupFeature("f0", "axis", ("a0",), (4, 8)),), ("a0",), (),
        tuple(TensorArg(f"buf{k}", "buffer", (x,), (Const(1),), ("torch.float16", "torch.float32")[k % 2], "npu:0")
              for k in range(4)),
        ("buf0",),
    )
    bench = make_plan(n_args, 1, n_buckets)
    for plan in (bench, KernelPlan.from_payload(upstream_meta()), dense):
        reps = build_representatives(plan)
        first_estimate(plan, reps)
        with compiled_spies() as (line, spy):
            got = estimate_footprint(plan, reps)
        assert got == reference_footprint(plan, reps)
        assert took_line(line) == (n_args <= 4 or plan is not bench)
        assert took_line(line) != spy.called


@pytest.mark.parametrize(("size", "buckets"), [
    (Add((Axis("x0"), Const(-1))), (1, 3)),  # zero elements in the first group: the line path declines
    (Axis("x0"), (0, 3)),  # the same, at x0 == 0
    (Add((Axis("x0"), Const(-2))), (1, 3)),  # negative in the first group: the plain loop's error
    (Mul((Const(-1), Axis("x0"))), (1, 3)),  # negative everywhere but at 0
    (Add((Const(5), Mul((Const(-1), Axis("x0"))))), (2, 4, 8)),  # negative from x0 > 5 on
])
def test_the_line_path_declines_zero_sizes_and_negative_ranges(size: object, buckets: tuple[int, ...]) -> None:
    plan = KernelPlan(
        (GroupFeature("f", "axis", ("x0",), buckets),), ("x0",), (),
        (TensorArg("t", "buffer", (size, Const(2)), (Const(2), Const(1)), "torch.int8", "npu:0"),  # type: ignore[arg-type]
         TensorArg("u", "buffer", (Axis("x0"),), (Const(1),), "torch.int16", "npu:0")),
    )
    reps = build_representatives(plan)
    first_estimate(plan, reps)
    program = footprint.footprint_program(plan.cache.representatives, plan)
    assert program is not None and program.line is not None
    with compiled_spies() as (line, spy):
        got = outcome(estimate_footprint, plan, reps)
    assert line == [None] and spy.called
    assert got == outcome(reference_footprint, plan, reps)


def test_the_line_path_over_a_feature_axis_the_plan_does_not_name() -> None:
    """The feature's axis is missing from ``axis_names``: no argument can use it, every group's bytes are equal."""
    plan = KernelPlan(
        (GroupFeature("f", "axis", ("x9",), (2, 4)),), ("x0",), (),
        (TensorArg("t", "buffer", (Axis("x0"), Const(3)), (Const(3), Const(1)), "torch.int16", "npu:0"),
         WorkspaceArg("w", Const(5), "torch.int8", "npu:0", "NONE")),
        ("t",),
    )
    reps = build_representatives(plan)
    first_estimate(plan, reps)
    with compiled_spies() as (line, spy):
        got = estimate_footprint(plan, reps)
    assert took_line(line) and not spy.called
    assert got == reference_footprint(plan, reps)


def test_result_objects_of_the_compiled_paths_are_the_frozen_classes() -> None:
    """Built as slotted twins and given the frozen class: the same type, frozen, hashable, picklable, equal."""
    x0, x1 = Axis("x0"), Axis("x1")
    one = KernelPlan((GroupFeature("f", "axis", ("x0",), (2, 4)),), ("x0",), (),
                     (TensorArg("t", "buffer", (x0,), (Const(1),), "torch.int16", "npu:0"),), ("t",))
    two = KernelPlan((GroupFeature("f", "axis", ("x0",), (2, 4)), GroupFeature("g", "axis", ("x1",), (3,))),
                     ("x0", "x1"), (), (TensorArg("t", "buffer", (x0, x1), (x1, Const(1)), "torch.int16", "npu:0"),))
    for plan in (one, two):
        reps = build_representatives(plan)
        assert type(reps) is Representatives
        with pytest.raises(dataclasses.FrozenInstanceError):
            reps.group_count = 0  # type: ignore[misc]
        first_estimate(plan, reps)
        with compiled_spies() as (line, spy):
            got = estimate_footprint(plan, reps)
        assert took_line(line) == (plan is one) and spy.called == (plan is two)
        expected = reference_footprint(plan, reps)
        assert type(got) is footprint.Footprint and type(got.dominant_arg) is footprint.ArgFootprint
        assert got == expected and hash(got) == hash(expected) and repr(got) == repr(expected)
        assert pickle.loads(pickle.dumps(got)) == expected
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.total_bytes = 0  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.dominant_arg.num_bytes = 0  # type: ignore[misc, union-attr]


def test_the_line_form_is_compiled_on_a_plan_objects_second_estimate() -> None:
    """A plan object estimated once does not pay for the line form: its first estimate takes the compiled
    path and keeps what compiling the line form needs; the second compiles it and takes the line path; an
    equal plan object starts over."""
    x0 = Axis("x0")
    plan = KernelPlan((GroupFeature("f", "axis", ("x0",), (2, 4, 8)),), ("x0",), (),
                      (TensorArg("t", "buffer", (x0, Add((x0, Const(1)))), (Add((x0, Const(1))), Const(1)),
                                 "torch.float16", "npu:0"),), ("t",))
    reps = build_representatives(plan)
    expected = reference_footprint(plan, reps)
    assert first_estimate(plan, reps) == expected
    program = footprint.footprint_program(plan.cache.representatives, plan)
    assert program is not None and isinstance(program.line, tuple)
    for _ in range(2):
        reps = build_representatives(plan)
        with compiled_spies() as (line, spy):
            assert estimate_footprint(plan, reps) == expected
        assert took_line(line) and not spy.called
        assert isinstance(program.line, footprint._Line)
    twin = dataclasses.replace(plan)
    assert first_estimate(twin, build_representatives(twin)) == expected
