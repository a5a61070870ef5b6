"""Shape families ("groups") of a grouped plan and one representative size each.

Group ids are mixed-radix numbers: feature ``i`` contributes its bucket index
times the product of ``len(buckets) + 1`` over the features before it. A closed
bucket is represented by its upper bound, the open last bucket by twice its
lower bound. A feature over several axes (``outer_product`` /
``reduction_product``) is a product of at most one symbolic axis with static
ones; the symbolic axis is solved for (rounded up). A product of static axes
only reaches the one bucket holding it; the other groups are unreachable.
"""

from __future__ import annotations

import dataclasses

from prescreen.errors import NotBounded, Reason
from prescreen.plan import GroupFeature, KernelPlan, canonical_json


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """One reachable shape family and the axis values its benchmark uses."""

    group_id: int
    bucket_indices: tuple[int, ...]
    feature_values: tuple[int, ...]
    axis_values: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Representatives:
    """All groups of a plan: the reachable ones with representatives, the rest by id."""

    group_count: int
    groups: tuple[Group, ...]
    unreachable_group_ids: tuple[int, ...]

    @property
    def reachable_group_ids(self) -> tuple[int, ...]:
        return tuple(g.group_id for g in self.groups)

    def to_payload(self) -> dict[str, object]:
        return {
            "group_count": self.group_count,
            "groups": [
                {
                    "group_id": g.group_id,
                    "bucket_indices": list(g.bucket_indices),
                    "feature_values": list(g.feature_values),
                    "axis_values": [[n, v] for n, v in g.axis_values],
                }
                for g in self.groups
            ],
            "unreachable_group_ids": list(self.unreachable_group_ids),
        }

    def family_json(self) -> str:
        """Canonical text of the shape family, part of the store key."""
        return canonical_json(self.to_payload())


def bucketize(value: int, buckets: tuple[int, ...]) -> int:
    """Index of the first bucket whose upper bound holds ``value`` (len = open bucket)."""
    for idx, upper in enumerate(buckets):
        if value <= upper:
            return idx
    return len(buckets)


def group_id_of(feature_values: tuple[int, ...], features: tuple[GroupFeature, ...]) -> int:
    """The mixed-radix group id of concrete feature values."""
    if len(feature_values) != len(features):
        raise ValueError(f"{len(feature_values)} feature values for {len(features)} features")
    group_id, radix = 0, 1
    for value, feature in zip(feature_values, features):
        group_id += bucketize(value, feature.buckets) * radix
        radix *= len(feature.buckets) + 1
    return group_id


def decode_bucket_indices(group_id: int, features: tuple[GroupFeature, ...]) -> tuple[int, ...]:
    """Inverse of the mixed radix: the bucket index of each feature."""
    out = []
    for feature in features:
        radix = len(feature.buckets) + 1
        out.append(group_id % radix)
        group_id //= radix
    return tuple(out)


def _bounds(feature: GroupFeature, idx: int) -> tuple[int, int | None]:
    if not feature.buckets:
        raise NotBounded(Reason.UNSUPPORTED_GROUPING, f"group feature {feature.name!r} has an empty bucket list")
    lower = feature.buckets[idx - 1] if idx > 0 else 0
    upper = feature.buckets[idx] if idx < len(feature.buckets) else None
    return lower, upper


def _feature_representative(
    feature: GroupFeature, idx: int, statics: dict[str, int]
) -> tuple[int, tuple[tuple[str, int], ...]] | None:
    lower, upper = _bounds(feature, idx)
    if not feature.axis_names or feature.source in ("primary_axis", "axis"):
        value = 2 * lower if upper is None else upper
        if not feature.axis_names:
            return value, ()
        if len(feature.axis_names) != 1:
            raise NotBounded(
                Reason.UNSUPPORTED_GROUPING,
                f"group feature {feature.name!r} of source {feature.source} needs exactly one axis, "
                f"got {list(feature.axis_names)}",
            )
        return value, ((feature.axis_names[0], value),)

    static_factor = 1
    symbolic: list[str] = []
    for axis in feature.axis_names:
        if axis in statics:
            if statics[axis] <= 0:
                raise NotBounded(
                    Reason.UNSUPPORTED_GROUPING, f"axis {axis!r} has non-positive static value {statics[axis]}"
                )
            static_factor *= statics[axis]
        else:
            symbolic.append(axis)
    if len(symbolic) > 1:
        raise NotBounded(
            Reason.UNSUPPORTED_GROUPING,
            f"group feature {feature.name!r} multiplies several symbolic axes {symbolic}",
        )
    if not symbolic:
        if static_factor <= lower or (upper is not None and static_factor > upper):
            return None
        return static_factor, tuple((a, statics[a]) for a in feature.axis_names)
    target = upper if upper is not None else max(lower + 1, 2 * lower)
    solved = max(1, -(-target // static_factor))
    values = tuple((a, solved if a == symbolic[0] else statics[a]) for a in feature.axis_names)
    return solved * static_factor, values


def build_representatives(plan: KernelPlan) -> Representatives:
    """Enumerate every group of ``plan`` and pick each reachable one's representative."""
    features = plan.group_features
    seen: set[str] = set()
    for feature in features:
        for axis in feature.axis_names:
            if axis in seen:
                raise NotBounded(Reason.UNSUPPORTED_GROUPING, f"axis {axis!r} appears in several group features")
            seen.add(axis)
    statics = dict(plan.axis_static_values)
    count = 1
    for feature in features:
        count *= len(feature.buckets) + 1

    groups: list[Group] = []
    unreachable: list[int] = []
    for group_id in range(count):
        indices = decode_bucket_indices(group_id, features)
        values: list[int] = []
        axes: dict[str, int] = {}
        reachable = True
        for feature, idx in zip(features, indices):
            rep = _feature_representative(feature, idx, statics)
            if rep is None:
                reachable = False
                break
            values.append(rep[0])
            axes.update(rep[1])
        if not reachable:
            unreachable.append(group_id)
            continue
        axis_values = tuple((a, int(axes.get(a, statics.get(a, 1)))) for a in plan.axis_names)
        groups.append(Group(group_id, indices, tuple(values), axis_values))
    if not groups:
        raise NotBounded(Reason.UNSUPPORTED_GROUPING, "grouped plan has no reachable groups")
    return Representatives(count, tuple(groups), tuple(unreachable))
