"""Shape families: mixed-radix group ids and one representative size per group."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prescreen import representatives
from prescreen.errors import NotBounded, Reason
from prescreen.plan import GroupFeature, KernelPlan
from prescreen.representatives import (
    Group,
    _feature_representative,
    build_representatives,
    decode_bucket_indices,
)


def feature(name: str, source: str, axes: tuple[str, ...], buckets: tuple[int, ...]) -> GroupFeature:
    return GroupFeature(name, source, axes, buckets)  # type: ignore[arg-type]


def plan(
    features: list[GroupFeature], axes: tuple[str, ...], statics: tuple[tuple[str, int], ...] = ()
) -> KernelPlan:
    return KernelPlan(tuple(features), axes, statics, ())


def axis_values(p: KernelPlan) -> dict[int, dict[str, int]]:
    return {g.group_id: dict(g.axis_values) for g in build_representatives(p).groups}


def test_upstream_one_feature_outer_product() -> None:
    reps = build_representatives(plan([feature("outer", "outer_product", ("x0",), (8,))], ("x0",)))
    assert reps.group_count == 2
    assert reps.grid.group_ids() == (0, 1)
    assert reps.unreachable_group_ids == ()
    assert [g.axis_values for g in reps.groups] == [(("x0", 8),), (("x0", 16),)]


def test_mixed_radix_ids_and_decode() -> None:
    features = (feature("a", "axis", ("x0",), (4, 8)), feature("b", "axis", ("x1",), (16,)))
    # radix 3 for "a", then 2 for "b": id = idx_a + 3 * idx_b
    assert decode_bucket_indices(4, features) == (1, 1)
    assert [decode_bucket_indices(i, features) for i in range(6)] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    reps = build_representatives(plan(list(features), ("x0", "x1")))
    assert reps.group_count == 6
    assert [g.bucket_indices for g in reps.groups] == [decode_bucket_indices(i, features) for i in range(6)]


@pytest.mark.parametrize("source", ["primary_axis", "axis", "outer_product", "reduction_product"])
def test_closed_buckets_take_upper_bound_open_bucket_twice_lower(source: str) -> None:
    reps = build_representatives(plan([feature("f", source, ("x0",), (4, 32, 100))], ("x0",)))
    assert [g.feature_values for g in reps.groups] == [(4,), (32,), (100,), (200,)]
    assert [dict(g.axis_values)["x0"] for g in reps.groups] == [4, 32, 100, 200]


def test_product_solves_symbolic_axis_with_ceil_division() -> None:
    p = plan([feature("f", "outer_product", ("x0", "x1"), (10, 64))], ("x0", "x1"), (("x1", 3),))
    reps = build_representatives(p)
    # x0 = ceil(target / 3): 10 -> 4, 64 -> 22, open: max(65, 128) = 128 -> 43
    assert [dict(g.axis_values) for g in reps.groups] == [{"x0": 4, "x1": 3}, {"x0": 22, "x1": 3}, {"x0": 43, "x1": 3}]
    assert [g.feature_values for g in reps.groups] == [(12,), (66,), (129,)]


def test_reduction_product_with_two_static_axes() -> None:
    p = plan([feature("f", "reduction_product", ("r0", "r1", "r2"), (7,))], ("r0", "r1", "r2"), (("r0", 2), ("r2", 5)))
    assert axis_values(p) == {0: {"r0": 2, "r1": 1, "r2": 5}, 1: {"r0": 2, "r1": 2, "r2": 5}}


def test_product_open_bucket_over_small_lower_bound() -> None:
    """An open bucket's target is max(lower + 1, 2 * lower): never the closed bucket's own bound."""
    p = plan([feature("f", "outer_product", ("x0",), (1,))], ("x0",))
    assert [g.feature_values for g in build_representatives(p).groups] == [(1,), (2,)]


def test_all_static_product_reaches_one_group() -> None:
    p = plan([feature("f", "outer_product", ("x0", "x1"), (8, 32, 64))], ("x0", "x1"), (("x0", 4), ("x1", 5)))
    reps = build_representatives(p)
    assert reps.grid.group_ids() == (1,)  # 8 < 20 <= 32
    assert reps.unreachable_group_ids == (0, 2, 3)
    assert reps.groups[0].feature_values == (20,)
    assert dict(reps.groups[0].axis_values) == {"x0": 4, "x1": 5}


@pytest.mark.parametrize(("product", "reachable"), [(8, 0), (9, 1), (32, 1), (33, 2), (1000, 2)])
def test_all_static_product_boundaries(product: int, reachable: int) -> None:
    p = plan([feature("f", "reduction_product", ("r0",), (8, 32))], ("r0",), (("r0", product),))
    assert build_representatives(p).grid.group_ids() == (reachable,)


def test_static_feature_with_a_second_feature() -> None:
    p = plan(
        [feature("s", "outer_product", ("x1",), (8, 32)), feature("d", "primary_axis", ("x0",), (4,))],
        ("x0", "x1"),
        (("x1", 20),),
    )
    reps = build_representatives(p)
    # radix 3 then 2: only bucket index 1 of "s" is reachable
    assert reps.grid.group_ids() == (1, 4)
    assert reps.unreachable_group_ids == (0, 2, 3, 5)


def test_axes_in_no_feature_default_to_static_value_or_one() -> None:
    p = plan([feature("f", "primary_axis", ("x0",), (8,))], ("x0", "r0", "y0"), (("r0", 12),))
    assert axis_values(p) == {0: {"x0": 8, "r0": 12, "y0": 1}, 1: {"x0": 16, "r0": 12, "y0": 1}}


def test_no_features_is_one_group() -> None:
    reps = build_representatives(plan([], ("x0", "x1"), (("x1", 3),)))
    assert reps.group_count == 1
    assert reps.groups[0].axis_values == (("x0", 1), ("x1", 3))
    assert reps.groups[0].feature_values == ()


def test_feature_without_axes_only_contributes_its_value() -> None:
    reps = build_representatives(plan([feature("f", "outer_product", (), (8,))], ("x0",)))
    assert [g.feature_values for g in reps.groups] == [(8,), (16,)]
    assert [g.axis_values for g in reps.groups] == [(("x0", 1),), (("x0", 1),)]


def test_primary_axis_ignores_its_static_value() -> None:
    p = plan([feature("f", "primary_axis", ("x0",), (8,))], ("x0",), (("x0", 3),))
    assert axis_values(p) == {0: {"x0": 8}, 1: {"x0": 16}}


@pytest.mark.parametrize(
    ("features", "axes", "statics"),
    [
        ([feature("a", "axis", ("x0",), (4,)), feature("b", "outer_product", ("x1", "x0"), (8,))], ("x0", "x1"), ()),
        ([feature("a", "outer_product", ("x0", "x0"), (4,))], ("x0",), ()),
        ([feature("a", "axis", ("x0",), ())], ("x0",), ()),
        ([feature("a", "outer_product", ("x0", "x1"), (8,))], ("x0", "x1"), ()),
        ([feature("a", "reduction_product", ("r0", "r1", "r2"), (8,))], ("r0", "r1", "r2"), (("r1", 2),)),
        ([feature("a", "primary_axis", ("x0", "x1"), (8,))], ("x0", "x1"), ()),
        ([feature("a", "outer_product", ("x0", "x1"), (8,))], ("x0", "x1"), (("x1", 0),)),
        ([feature("a", "outer_product", ("x0", "x1"), (8,))], ("x0", "x1"), (("x1", -2),)),
    ],
    ids=[
        "axis-in-two-features", "axis-twice-in-one-feature", "empty-buckets", "two-symbolic-axes",
        "two-symbolic-of-three", "primary-axis-over-two-axes", "zero-static", "negative-static",
    ],
)
def test_unsupported_grouping_fails_closed(
    features: list[GroupFeature], axes: tuple[str, ...], statics: tuple[tuple[str, int], ...]
) -> None:
    with pytest.raises(NotBounded) as info:
        build_representatives(plan(features, axes, statics))
    assert info.value.reason is Reason.UNSUPPORTED_GROUPING


def per_group(p: KernelPlan) -> object:
    """The plain loop: every group in id order, each feature's representative in feature order."""
    statics = dict(p.axis_static_values)
    count = 1
    for f in p.group_features:
        count *= len(f.buckets) + 1
    groups, unreachable = [], []
    seen: set[str] = set()
    try:
        for a in (a for f in p.group_features for a in f.axis_names):
            if a in seen:
                raise NotBounded(Reason.UNSUPPORTED_GROUPING, f"axis {a!r} appears in several group features")
            seen.add(a)
        for group_id in range(count):
            indices = decode_bucket_indices(group_id, p.group_features)
            values, axes = [], {}
            for f, idx in zip(p.group_features, indices):
                found = _feature_representative(f, idx, statics)
                if found is None:
                    unreachable.append(group_id)
                    break
                values.append(found[0])
                axes.update(found[1])
            else:
                axis_values = tuple((a, int(axes.get(a, statics.get(a, 1)))) for a in p.axis_names)
                groups.append(Group(group_id, indices, tuple(values), axis_values))
        if not groups:
            raise NotBounded(Reason.UNSUPPORTED_GROUPING, "grouped plan has no reachable groups")
    except NotBounded as exc:
        return exc.reason, str(exc)
    return count, tuple(groups), tuple(unreachable)


@st.composite
def feature_plans(draw: st.DrawFn) -> KernelPlan:
    """Features of every source over symbolic and static axes, odd buckets and statics included."""
    statics = {"s0": draw(st.integers(-1, 6)), "s1": draw(st.integers(1, 6))}
    features = []
    for i in range(draw(st.integers(0, 3))):
        source = draw(st.sampled_from(["primary_axis", "axis", "outer_product", "reduction_product"]))
        axes = tuple(draw(st.lists(st.sampled_from(["x0", "x1", "s0", "s1"]), max_size=3, unique=True)))
        buckets = tuple(draw(st.lists(st.integers(-2, 40), max_size=4)))
        if draw(st.integers(0, 3)) > 0:
            buckets = tuple(sorted(set(buckets)))
        features.append(feature(f"f{i}", source, axes, buckets))
    axis_names = tuple(a for a in ("x0", "x1", "s0", "s1") if draw(st.booleans()))
    return plan(features, axis_names, tuple(statics.items()))


@settings(max_examples=1000, deadline=None)
@given(feature_plans())
def test_the_grid_equals_the_plain_per_group_loop(p: KernelPlan) -> None:
    """Groups, unreachable ids, and the first error the per-group loop meets (reason and message)."""
    expected = per_group(p)
    try:
        reps = build_representatives(p)
    except NotBounded as exc:
        got: object = (exc.reason, str(exc))
    else:
        got = (reps.group_count, tuple(reps.groups), reps.unreachable_group_ids)
        assert reps.grid.group_ids() == tuple(g.group_id for g in reps.groups)
    assert got == expected


def test_a_feature_that_reaches_no_bucket_fails_closed() -> None:
    """Valid buckets always reach one; were none reached, the plan must not read as 0 groups and 0 bytes."""
    p = plan([feature("a", "axis", ("x0",), (4,)), feature("b", "outer_product", ("s0",), (8,))], ("x0", "s0"))
    with mock.patch.object(representatives, "_feature_representative", return_value=None), \
            pytest.raises(NotBounded, match="no reachable groups"):
        build_representatives(p)
