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
from collections.abc import Iterator, Mapping, Sequence
from typing import overload

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
class FeatureChoices:
    """The reachable buckets of one group feature, ascending, and what each one sets."""

    radix: int
    bucket_indices: tuple[int, ...]
    feature_values: tuple[int, ...]
    axis_values: tuple[tuple[tuple[str, int], ...], ...]


class GroupGrid(Sequence[Group]):
    """The reachable groups of a plan as the product of each feature's reachable buckets.

    A group is reachable exactly when each of its features' buckets is, so the
    reachable groups are a grid: group ``i`` in ascending-id order picks choice
    ``c_f`` of feature ``f`` where ``i`` is the mixed-radix number of the
    ``c_f`` (feature 0 varying fastest), i.e. numpy's C order over
    ``shape = (k_{F-1}, ..., k_0)``. It behaves as the tuple of those groups
    (indexing, iteration, equality, hashing) but builds ``Group`` objects only
    when they are asked for; the footprint estimator reads the grid itself.
    """

    __slots__ = ("features", "axis_names", "base_values", "shape", "_len", "_groups", "_ids")

    def __init__(
        self, features: tuple[FeatureChoices, ...], axis_names: tuple[str, ...], base_values: Mapping[str, int]
    ) -> None:
        #: Each feature's reachable buckets (ascending) and what each one sets.
        self.features = features
        self.axis_names = axis_names
        self.base_values = base_values if isinstance(base_values, dict) else dict(base_values)
        #: numpy shape of the grid: the last feature first (its choice varies slowest).
        self.shape = tuple(len(f.bucket_indices) for f in reversed(features))
        self._len = math.prod(self.shape)
        self._groups: tuple[Group, ...] | None = None
        self._ids: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return self._len

    def choices_at(self, index: int) -> tuple[int, ...]:
        """The choice of each feature (feature order) of the ``index``-th reachable group."""
        out = []
        for feature in self.features:
            k = len(feature.bucket_indices)
            out.append(index % k)
            index //= k
        return tuple(out)

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
        """The ``index``-th reachable group, built on its own."""
        if self._groups is not None:
            return self._groups[index]
        choices = self.choices_at(index)
        group_id, indices, values = 0, [], []
        axes: dict[str, int] = {}
        radix = 1
        for feature, c in zip(self.features, choices):
            indices.append(feature.bucket_indices[c])
            values.append(feature.feature_values[c])
            axes.update(feature.axis_values[c])
            group_id += feature.bucket_indices[c] * radix
            radix *= feature.radix
        axis_values = tuple((a, int(axes.get(a, self.base_values[a]))) for a in self.axis_names)
        return Group(group_id, tuple(indices), tuple(values), axis_values)

    def group_ids(self) -> tuple[int, ...]:
        """Ids of the reachable groups, ascending."""
        if self._ids is None:
            if all(len(f.bucket_indices) == f.radix for f in self.features):
                self._ids = tuple(range(self._len))  # every group reachable (most plans): ids 0..count-1
                return self._ids
            ids = [0]
            radix = 1
            for feature in self.features:
                ids = [i + b * radix for b in feature.bucket_indices for i in ids]
                radix *= feature.radix
            self._ids = tuple(ids)
        return self._ids

    def _all(self) -> tuple[Group, ...]:
        if self._groups is None:
            self._groups = tuple(self.group_at(i) for i in range(len(self)))
        return self._groups

    @overload
    def __getitem__(self, index: int) -> Group: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Group, ...]: ...

    def __getitem__(self, index: int | slice) -> Group | tuple[Group, ...]:
        if isinstance(index, slice):
            return self._all()[index]
        n = len(self)
        if not -n <= index < n:
            raise IndexError("group index out of range")
        return self.group_at(index % n)

    def __iter__(self) -> Iterator[Group]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (GroupGrid, tuple)):
            return self._all() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


@dataclasses.dataclass(frozen=True, slots=True)
class Representatives:
    """All groups of a plan: the reachable ones with representatives, the rest by id.

    ``groups`` is a ``GroupGrid`` when built by ``build_representatives`` (it
    acts as a tuple of ``Group``), or any sequence of ``Group``.
    """

    group_count: int
    groups: Sequence[Group]
    unreachable_group_ids: tuple[int, ...]

    @property
    def reachable_group_ids(self) -> tuple[int, ...]:
        if isinstance(self.groups, GroupGrid):
            return self.groups.group_ids()
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
    """Enumerate every group of ``plan`` and pick each reachable one's representative.

    Each feature's representative depends only on its own bucket, so it is
    computed once per bucket and the reachable groups are the product of the
    features' reachable buckets (a ``GroupGrid``). The error raised is the one
    a plain loop over groups in id order (features in order) meets first: a
    feature that cannot be represented fails in every bucket alike, and every
    feature reaches some bucket (together they cover every positive size), so
    that loop first meets the first such feature.
    """
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
