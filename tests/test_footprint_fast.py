"""The numpy path of ``estimate_footprint`` against the plain loop it must equal (``reference_footprint``).

Plans are drawn directly as ``KernelPlan`` objects, wider than the payload
strategies: expressions that fail only in some groups (a floordiv by
``axis - c``, a size ``axis - c``), constants large enough that bytes leave
int64, several features, axes missing from ``axis_names``, repeated arg names,
unknown dtypes and rank mismatches. Every result, or the exact error (reason
and message), must be the plain loop's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from prescreen import footprint
from prescreen.errors import NotBounded, Reason
from prescreen.expr import Add, Axis, Const, Expr, FloorDiv, Mul, RuntimeArg
from prescreen.footprint import Footprint, estimate_footprint, reference_footprint
from prescreen.plan import GroupFeature, KernelPlan, SizeArg, TensorArg, WorkspaceArg
from prescreen.representatives import Representatives, build_representatives

AXES = ("x0", "x1", "r0", "s0", "s1")
DTYPES = ("torch.float16", "torch.float32", "torch.int64", "torch.bool", "complex64", "torch.float17")
HUGE = 2**61


def consts(big: bool) -> st.SearchStrategy[int]:
    small = st.integers(-3, 9)
    return st.one_of(small, st.sampled_from([HUGE, 3 * 2**40])) if big else small


def exprs(axes: tuple[str, ...], big: bool, runtime: bool) -> st.SearchStrategy[Expr]:
    leaves: list[st.SearchStrategy[Expr]] = [consts(big).map(Const), st.sampled_from(axes).map(Axis)]
    if runtime:
        leaves.append(st.integers(0, 3).map(RuntimeArg))
    leaf = st.one_of(*leaves)
    shifted = st.tuples(st.sampled_from(axes).map(Axis), st.integers(-12, 2).map(Const)).map(lambda p: Add(p))
    squared = shifted.map(lambda e: Mul((e, e)))  # >= 0, zero in the groups where the shift hits the axis
    return st.recursive(
        st.one_of(leaf, shifted),
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=3).map(lambda xs: Mul(tuple(xs))),
            st.lists(inner, min_size=1, max_size=3).map(lambda xs: Add(tuple(xs))),
            st.tuples(inner, st.one_of(inner, shifted, squared)).map(lambda p: FloorDiv(*p)),
        ),
        max_leaves=6,
    )


@st.composite
def plans(draw: st.DrawFn) -> KernelPlan:
    big = draw(st.integers(0, 5)) == 0
    faulty = draw(st.booleans())
    features: list[GroupFeature] = []
    statics: dict[str, int] = {"s0": draw(st.integers(1, 9)), "s1": draw(st.integers(1, 9))}
    symbolic = ["x0", "x1", "r0"]
    for i in range(draw(st.integers(0, 3))):
        source = draw(st.sampled_from(["primary_axis", "axis", "outer_product", "reduction_product"]))
        if source in ("primary_axis", "axis"):
            axes: tuple[str, ...] = (symbolic.pop(),) if symbolic and draw(st.integers(0, 5)) > 0 else ()
        else:
            axes = tuple(a for a in ("s0", "s1") if draw(st.booleans()))
            if symbolic and draw(st.booleans()) is True:
                axes = (symbolic.pop(), *axes)
        steps = draw(st.lists(st.integers(1, 8), min_size=1, max_size=4))
        buckets = tuple(sum(steps[: j + 1]) for j in range(len(steps)))
        if big and draw(st.booleans()):
            buckets = (*buckets, HUGE)
        features.append(GroupFeature(f"f{i}", source, axes, buckets))  # type: ignore[arg-type]
    used = {a for f in features for a in f.axis_names}
    # An axis may belong to one feature only: drop repeats.
    seen: set[str] = set()
    for i, f in enumerate(features):
        axes = tuple(a for a in f.axis_names if a not in seen)
        seen.update(axes)
        features[i] = GroupFeature(f.name, f.source, axes, f.buckets)
    axis_names = tuple(a for a in AXES if a in used or draw(st.booleans()))
    if faulty and axis_names and draw(st.integers(0, 3)) == 0:
        axis_names = axis_names[1:]  # an axis the args may name but no group sets
    pool = axis_names or ("x0",)
    args: list[TensorArg | WorkspaceArg | SizeArg] = []
    for i in range(draw(st.integers(0, 5))):
        e = exprs(pool + (("q9",) if faulty else ()), big, runtime=faulty and draw(st.integers(0, 4)) == 0)
        name = draw(st.sampled_from(["a", "b", "c", f"t{i}"]))
        dtype = draw(st.sampled_from(DTYPES if faulty else DTYPES[:-1]))
        kind = draw(st.sampled_from(["tensor", "tensor", "workspace", "size"]))
        if kind == "size":
            args.append(SizeArg(name, "axis_expr", expr=draw(e)))
        elif kind == "workspace":
            args.append(WorkspaceArg(name, draw(e), dtype, "npu:0", "NONE"))
        else:
            rank = draw(st.integers(0, 3))
            size = tuple(draw(e) for _ in range(rank))
            stride_rank = rank + (draw(st.sampled_from([-1, 1])) if faulty and draw(st.integers(0, 5)) == 0 else 0)
            stride = tuple(draw(e) for _ in range(max(0, stride_rank)))
            args.append(TensorArg(name, "buffer", size, stride, dtype, "npu:0"))
    names = sorted({a.name for a in args}) + ["zz"]
    mutated = tuple(draw(st.lists(st.sampled_from(names), max_size=3)))
    return KernelPlan(tuple(features), axis_names, tuple(statics.items()), tuple(args), mutated)


def outcome(fn: object, plan: KernelPlan, reps: Representatives) -> Footprint | tuple[str, str]:
    try:
        return fn(plan, reps)  # type: ignore[operator, no-any-return]
    except NotBounded as exc:
        return (exc.reason.value, str(exc))


@contextlib.contextmanager
def numpy_path() -> Iterator[None]:
    """``estimate_footprint`` with the loop's limit at 0: every plan with an argument takes numpy."""
    with mock.patch.object(footprint, "LOOP_MAX", 0):
        yield


def numpy_outcome(plan: KernelPlan, reps: Representatives) -> Footprint | tuple[str, str]:
    with numpy_path():
        return outcome(estimate_footprint, plan, reps)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_numpy_equals_the_reference_loop(plan: KernelPlan) -> None:
    """Every result: the first error, the dominant argument and every tie included."""
    try:
        reps = build_representatives(plan)
    except NotBounded:
        event("representatives fail")
        return
    expected = outcome(reference_footprint, plan, reps)
    event("fails closed" if isinstance(expected, tuple) else "bounded")
    if not isinstance(expected, tuple) and expected.total_bytes >= 2**63:
        event("beyond int64")
    assert numpy_outcome(plan, reps) == expected


def one_axis_plan(
    *args: TensorArg | WorkspaceArg, buckets: tuple[int, ...] = (1, 2, 3, 4, 5, 6), mutated: tuple[str, ...] = ()
) -> tuple[KernelPlan, Representatives]:
    plan = KernelPlan((GroupFeature("a", "axis", ("x0",), buckets),), ("x0",), (), args, mutated)
    return plan, build_representatives(plan)


X0 = Axis("x0")


def int8(name: str, size: tuple[Expr, ...], stride: tuple[Expr, ...], dtype: str = "torch.int8") -> TensorArg:
    return TensorArg(name, "buffer", size, stride, dtype, "npu:0")


def tie_cases() -> list[tuple[TensorArg | WorkspaceArg, ...]]:
    """Buffers of one shape with different item sizes, ties across shapes, and every argument at 0 bytes."""
    out = []
    for size in (Const(0), X0):
        one = int8("a", (size, Const(2)), (Const(2), Const(1)))
        other = int8("b", (Mul((size, Const(2))),), (Const(1),), "torch.int16")
        same_as_one = int8("c", one.size, one.stride, "torch.int16")
        ws = WorkspaceArg("w", Mul((size, Const(4))), "torch.int8", "npu:0", "NONE")
        out += [(one, other, same_as_one), (other, one, same_as_one, ws), (ws, same_as_one, one, other)]
    return out


CASES = {
    **{f"ties {i}": (args, (2, 4)) for i, args in enumerate(tie_cases())},
    **{f"size negative in some groups {s}": ((int8("t", (Add((X0, Const(s))), X0), (X0, Const(1))),), (2, 4, 8))
       for s in (-1, -4, -9)},
    **{f"buckets below 0 {b} {a.name}": ((a,), b) for b in ((-3, 2, 5), (0, 4), (-1,)) for a in (
        int8("t", (X0,), (Const(1),)), int8("u", (Const(2),), (X0,)), int8("v", (X0, Const(3)), (X0, Const(1))),
        WorkspaceArg("w", Mul((X0, Const(2))), "torch.int8", "npu:0", "NONE"))},
}


@pytest.mark.parametrize("case", CASES)
def test_numpy_equals_the_reference_loop_on_chosen_plans(case: str) -> None:
    args, buckets = CASES[case]
    plan, reps = one_axis_plan(*args, buckets=buckets, mutated=("a",))
    assert numpy_outcome(plan, reps) == outcome(reference_footprint, plan, reps)


def test_an_axis_a_feature_sets_but_the_plan_does_not_name_is_missing_in_every_group() -> None:
    plan = KernelPlan((GroupFeature("f", "axis", ("x9",), (1, 4)),), ("x0",), (),
                      (int8("t", (Axis("x9"),), (Const(1),), "torch.float16"),))
    reps = build_representatives(plan)
    assert numpy_outcome(plan, reps) == outcome(estimate_footprint, plan, reps) == (
        "missing_axis", "missing_axis: axis 'x9' has no value in this group")


def test_the_earliest_failing_group_wins_not_the_first_failing_arg() -> None:
    late = Add((X0, Const(-3)))  # zero at x0 == 3: a division by zero in group 2
    early = int8("early", (Add((X0, Const(-2))),), (Const(1),))  # negative at x0 == 1
    plan, reps = one_axis_plan(int8("late", (FloorDiv(Const(1), Mul((late, late))),), (Const(1),)), early)
    for path in (contextlib.nullcontext(), numpy_path()):
        with path, pytest.raises(NotBounded) as info:
            estimate_footprint(plan, reps)
        assert info.value.reason is Reason.NEGATIVE_SIZE


def test_a_division_by_zero_in_one_bucket_of_the_second_feature() -> None:
    buckets = tuple(range(1, 41))
    x0, x1 = Axis("x0"), Axis("x1")
    shift = Add((x1, Const(-2)))
    args = (
        TensorArg("t", "buffer", (x0, x1), (x1, Const(1)), "torch.float32", "npu:0"),
        WorkspaceArg("w", Mul((x1, Const(3))), "torch.int8", "npu:0", "NONE"),
        TensorArg("u", "buffer", (FloorDiv(x0, Mul((shift, shift))),), (Const(1),), "torch.int64", "npu:0"),
    )
    features = (GroupFeature("a", "axis", ("x0",), buckets), GroupFeature("b", "axis", ("x1",), buckets))
    plan = KernelPlan(features, ("x0", "x1"), (), args, ("w",))
    reps = build_representatives(plan)
    assert len(reps.grid) * 3 > footprint.LOOP_MAX  # numpy's
    got = outcome(estimate_footprint, plan, reps)
    assert got == outcome(reference_footprint, plan, reps)  # x1 == 2 only in feature b's bucket 1
    assert got[0] == Reason.DIVISION_BY_ZERO.value
    ok = KernelPlan(features, ("x0", "x1"), (), args[:2], ("w",))
    assert estimate_footprint(ok, reps) == reference_footprint(ok, reps)


@pytest.mark.parametrize("n_buckets", [2, 300])
def test_bytes_beyond_int64_stay_exact(n_buckets: int) -> None:
    plan, reps = one_axis_plan(int8("t", (X0, X0), (X0, Const(1)), "torch.complex128"),
                               buckets=(*range(1, n_buckets), 2**62))
    with numpy_path():
        fp = estimate_footprint(plan, reps)
    assert fp == reference_footprint(plan, reps)
    assert fp.dominant_arg is not None and fp.dominant_arg.num_bytes == (1 + (2**63 - 1) * 2**63 + 2**63 - 1) * 16


def test_a_size_that_is_zero_in_some_groups_gives_zero_bytes_there() -> None:
    shift = Add((X0, Const(-2)))
    plan, reps = one_axis_plan(int8("t", (Mul((shift, shift)), X0), (Const(5), Const(3))), buckets=(1, 2, 3, 4))
    with numpy_path():
        fp = estimate_footprint(plan, reps)
    assert fp == reference_footprint(plan, reps)
    assert fp.group_bytes[1] == (1, 0)  # x0 == 2


@pytest.mark.parametrize("top", [64, 2**62], ids=["int64", "exact"])
def test_every_number_is_a_python_int(top: int) -> None:
    """Stored decisions are JSON and their validation wants ``int``: no numpy scalar may leak out."""
    plan, reps = one_axis_plan(
        TensorArg("t", "buffer", (X0, FloorDiv(X0, Const(2))), (Const(3), Const(1)), "torch.float16", "npu:0"),
        WorkspaceArg("w", X0, "torch.int32", "npu:0", "NONE"),
        buckets=(1, 2, top), mutated=("w",),
    )
    with numpy_path():
        fp = estimate_footprint(plan, reps)
    assert fp == reference_footprint(plan, reps)
    numbers = [fp.synthetic_bytes, fp.mutated_clone_bytes, fp.total_bytes, fp.largest_group_id]
    numbers += [n for pair in fp.group_bytes for n in pair]
    assert fp.dominant_arg is not None
    numbers += [fp.dominant_arg.group_id, fp.dominant_arg.num_bytes, *fp.dominant_arg.size, *fp.dominant_arg.stride]
    assert all(type(n) is int for n in numbers), [type(n) for n in numbers]


def test_arguments_sharing_expressions_keep_their_own_dtype_name_and_mutation() -> None:
    """Buffers of one shape are evaluated once; each still counts with its own item size, name and mutation."""
    x1 = Axis("x1")

    def buf(name: str, dtype: str) -> TensorArg:
        return TensorArg(name, "buffer", (X0, x1), (x1, Const(1)), dtype, "npu:0")

    args = (buf("a", "torch.int8"), buf("b", "torch.float64"), buf("c", "torch.int8"), buf("d", "torch.float64"),
            WorkspaceArg("w", X0, "torch.int16", "npu:0", "NONE"), WorkspaceArg("v", X0, "torch.int32", "npu:0", "NONE"))
    features = (GroupFeature("a", "axis", ("x0",), (2, 4, 8)), GroupFeature("b", "axis", ("x1",), tuple(range(1, 80))))
    plan = KernelPlan(features, ("x0", "x1"), (), args, ("a", "c", "w"))
    reps = build_representatives(plan)
    fp = estimate_footprint(plan, reps)  # 320 groups x 6 arguments: numpy's
    assert fp == reference_footprint(plan, reps)
    assert fp.dominant_arg is not None and fp.dominant_arg.name == "b"
    x0_top, x1_top = 16, 158
    assert fp.mutated_clone_bytes == x0_top * x1_top * (1 + 1) + x0_top * 2
