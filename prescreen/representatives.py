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
import math
from collections.abc import Mapping

from prescreen.errors import NotBounded, Reason
from prescreen.plan import GroupFeature, KernelPlan


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """One reachable shape family and the axis values its benchmark uses."""

    group_id: int
    bucket_indices: tuple[int, ...]
    feature_values: tuple[int, ...]
    axis_values: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class FeatureChoices:
    """The reachable buckets of one group feature, ascending, and what each one sets."""

    radix: int
    bucket_indices: tuple[int, ...]
    feature_values: tuple[int, ...]
    axis_values: tuple[tuple[tuple[str, int], ...], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class GroupGrid:
    """The reachable groups of a plan as the product of each feature's reachable buckets: group ``i`` in
    ascending-id order is the mixed-radix number of its features' choices (feature 0 fastest), numpy's C order
    over ``shape``. Groups are built when asked for."""

    features: tuple[FeatureChoices, ...]
    axis_names: tuple[str, ...]
    base_values: Mapping[str, int]

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape of the grid: the last feature first (its choice varies slowest)."""
        return tuple(len(f.bucket_indices) for f in reversed(self.features))

    def __len__(self) -> int:
        return math.prod(self.shape)

    def axis_value_table(self) -> dict[str, tuple[int | None, tuple[int, ...]]]:
        """Per axis of the plan: the feature that sets it (or None) and its value per choice (or its one value)."""
        table: dict[str, tuple[int | None, tuple[int, ...]]] = {}
        for name in self.axis_names:
            table[name] = (None, (self.base_values[name],))
        for f, feature in enumerate(self.features):
            named = {a for choice in feature.axis_values for a, _ in choice}
            for name in named:
                if name in table:
                    base = self.base_values[name]
                    table[name] = (f, tuple(int(dict(c).get(name, base)) for c in feature.axis_values))
        return table

    def group_at(self, index: int) -> Group:
        """The ``index``-th reachable group."""
        group_id, radix, indices, values = 0, 1, [], []
        axes: dict[str, int] = {}
        for feature in self.features:
            index, c = divmod(index, len(feature.bucket_indices))
            indices.append(feature.bucket_indices[c])
            values.append(feature.feature_values[c])
            axes.update(feature.axis_values[c])
            group_id += feature.bucket_indices[c] * radix
            radix *= feature.radix
        axis_values = tuple((a, int(axes.get(a, self.base_values[a]))) for a in self.axis_names)
        return Group(group_id, tuple(indices), tuple(values), axis_values)

    def group_ids(self) -> tuple[int, ...]:
        """Ids of the reachable groups, ascending."""
        if all(len(f.bucket_indices) == f.radix for f in self.features):
            return tuple(range(len(self)))  # every group reachable (most plans)
        ids = [0]
        radix = 1
        for feature in self.features:
            ids = [i + b * radix for b in feature.bucket_indices for i in ids]
            radix *= feature.radix
        return tuple(ids)


@dataclasses.dataclass(frozen=True, slots=True)
class Representatives:
    """All groups of a plan: the reachable ones (a grid) with representatives, the rest by id."""

    group_count: int
    grid: GroupGrid
    unreachable_group_ids: tuple[int, ...]

    @property
    def groups(self) -> tuple[Group, ...]:
        """Every reachable group with its representative, ascending by id (built at each call)."""
        return tuple(map(self.grid.group_at, range(len(self.grid))))


def decode_bucket_indices(group_id: int, features: tuple[GroupFeature, ...]) -> tuple[int, ...]:
    """Inverse of the mixed radix: the bucket index of each feature."""
    out = []
    for feature in features:
        radix = len(feature.buckets) + 1
        out.append(group_id % radix)
        group_id //= radix
    return tuple(out)


def _feature_representative(
    feature: GroupFeature, idx: int, statics: dict[str, int]
) -> tuple[int, tuple[tuple[str, int], ...]] | None:
    if not feature.buckets:
        raise NotBounded(Reason.UNSUPPORTED_GROUPING, f"group feature {feature.name!r} has an empty bucket list")
    lower = feature.buckets[idx - 1] if idx > 0 else 0
    upper = feature.buckets[idx] if idx < len(feature.buckets) else None
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
    """Enumerate every group of ``plan`` and pick each reachable one's representative (once per feature bucket).
    The error raised is the one a per-group loop meets first: the first feature that cannot be represented."""
    features = plan.group_features
    seen: set[str] = set()
    for feature in features:
        for axis in feature.axis_names:
            if axis in seen:
                raise NotBounded(Reason.UNSUPPORTED_GROUPING, f"axis {axis!r} appears in several group features")
            seen.add(axis)
    statics = dict(plan.axis_static_values)
    choices: list[FeatureChoices] = []
    count = 1
    for feature in features:
        radix = len(feature.buckets) + 1
        count *= radix
        indices: list[int] = []
        values: list[int] = []
        axes: list[tuple[tuple[str, int], ...]] = []
        for idx in range(radix):
            rep = _feature_representative(feature, idx, statics)
            if rep is not None:
                indices.append(idx)
                values.append(rep[0])
                axes.append(rep[1])
        if not indices:  # never for a valid feature; an empty grid must not read as 0 bytes
            raise NotBounded(Reason.UNSUPPORTED_GROUPING, "grouped plan has no reachable groups")
        choices.append(FeatureChoices(radix, tuple(indices), tuple(values), tuple(axes)))
    grid = GroupGrid(tuple(choices), plan.axis_names, {a: int(statics.get(a, 1)) for a in plan.axis_names})
    unreachable: tuple[int, ...] = ()
    if len(grid) != count:
        reachable = set(grid.group_ids())
        unreachable = tuple(i for i in range(count) if i not in reachable)
    return Representatives(count, grid, unreachable)
