"""Tune-or-fall-back decision for one plan against one budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from prescreen.budget import Budget
from prescreen.errors import NotBounded, Reason
from prescreen.footprint import ArgFootprint, Footprint, estimate_footprint
from prescreen.plan import KernelPlan
from prescreen.representatives import Representatives, build_representatives

#: Bumped whenever the estimator or the decision's fields change meaning.
ESTIMATOR_VERSION = 1

Action = Literal["tune", "fallback"]


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a kernel's benchmark, and the numbers behind it."""

    action: Action
    bounded: bool
    enable_auto_blockify: bool
    estimated_bytes: int | None
    synthetic_bytes: int | None
    mutated_clone_bytes: int | None
    budget_bytes: int
    total_memory: int
    ratio: float  # an int ratio stays an int: ``budget_bytes`` is exact for it (``Budget``)
    device_kind: str
    reason: str
    largest_group_id: int | None
    dominant_arg: ArgFootprint | None
    group_bytes: tuple[tuple[int, int], ...]
    estimator_version: int = ESTIMATOR_VERSION

    @property
    def tune(self) -> bool:
        return self.action == "tune"

    def to_payload(self) -> dict[str, object]:
        d = {name: getattr(self, name) for name in _PAYLOAD_FIELDS}
        d["dominant_arg"] = self.dominant_arg.to_payload() if self.dominant_arg else None
        d["group_bytes"] = [[g, b] for g, b in self.group_bytes]
        return d

    @staticmethod
    def from_payload(d: Mapping[str, object]) -> "Decision":
        """Strictly validate a stored decision (exact types, numbers that give its action); raises ``ValueError``."""
        if not isinstance(d, Mapping):
            raise ValueError(f"decision must be a mapping, got {type(d).__name__}")
        if d.keys() != _FIELDS:
            raise ValueError(f"decision fields differ: missing {sorted(_FIELDS - set(d))}, "
                             f"extra {sorted(set(d) - _FIELDS)}")
        raw: dict[str, Any] = dict(d)  # each value is checked below before it is used
        if raw["action"] not in ("tune", "fallback"):
            raise ValueError(f"bad action {raw['action']!r}")
        for key in _INT_FIELDS:
            v = raw[key]
            if v.__class__ is not int and (v is not None or key in _REQUIRED_INTS):  # bools too
                raise ValueError(f"{key} must be an int, got {v!r}")
        for key in ("bounded", "enable_auto_blockify"):
            if raw[key].__class__ is not bool:
                raise ValueError(f"{key} must be a bool")
        for key in ("device_kind", "reason"):
            if not isinstance(raw[key], str):
                raise ValueError(f"{key} must be a string, got {raw[key]!r}")
        if raw["ratio"].__class__ not in (int, float) or not 0 < raw["ratio"] <= 1:
            raise ValueError(f"bad ratio {raw['ratio']!r}")
        groups = raw["group_bytes"]  # one pair per group: checked in C-level passes (map, set, zip)
        if groups.__class__ is not list or (groups and (
                set(map(type, groups)) != {list} or set(map(len, groups)) != {2}
                or set(map(type, (x for pair in groups for x in pair))) != {int})):
            raise ValueError("group_bytes must be a list of [group_id, bytes]")
        raw["group_bytes"] = tuple(map(tuple, groups))
        if raw["dominant_arg"] is not None:
            raw["dominant_arg"] = ArgFootprint.from_payload(raw["dominant_arg"])
        decision = Decision(**raw)
        _check_consistent(decision)
        return decision


_PAYLOAD_FIELDS = tuple(f.name for f in dataclasses.fields(Decision))
_FIELDS = frozenset(_PAYLOAD_FIELDS)
#: The fields an entry stores on a line of their own, after the head (``prescreen.store.trust``).
DETAIL_FIELDS = ("dominant_arg", "group_bytes")
_INT_FIELDS = ("estimated_bytes", "synthetic_bytes", "mutated_clone_bytes", "budget_bytes", "total_memory",
               "largest_group_id", "estimator_version")
_REQUIRED_INTS = ("budget_bytes", "total_memory", "estimator_version")


def _check_consistent(d: Decision) -> None:
    """Reject a decision whose numbers do not give its action (a tampered or corrupt value)."""
    if d.total_memory <= 0 or d.budget_bytes != int(d.total_memory * d.ratio):
        raise ValueError(f"budget_bytes={d.budget_bytes} is not int(total_memory={d.total_memory} * ratio={d.ratio})")
    if d.enable_auto_blockify and d.action != "fallback":
        raise ValueError("enable_auto_blockify is only set on a fallback")
    numbers = (d.estimated_bytes, d.synthetic_bytes, d.mutated_clone_bytes)
    if not d.bounded:
        if (d.action != "fallback" or any(n is not None for n in numbers) or d.largest_group_id is not None
                or d.group_bytes or d.dominant_arg is not None):
            raise ValueError("a not-bounded decision must be a fallback without footprint numbers")
        return
    est, syn, mut = numbers
    if est is None or syn is None or mut is None or min(est, syn, mut) < 0 or est != syn + mut:
        raise ValueError(f"estimated_bytes={est} must equal synthetic_bytes={syn} + mutated_clone_bytes={mut}")
    if (d.action == "tune") != (est <= d.budget_bytes) and not is_observed_oom(d):
        raise ValueError(f"action={d.action} contradicts estimated_bytes={est} vs budget_bytes={d.budget_bytes}")
    largest = None
    if d.group_bytes:
        _, sizes = zip(*d.group_bytes)
        if min(sizes) < 0 or sum(sizes) != syn:
            raise ValueError("group_bytes do not add up to synthetic_bytes")
        largest = d.group_bytes[sizes.index(max(sizes))][0]
    elif syn != 0:
        raise ValueError("group_bytes do not add up to synthetic_bytes")
    if d.largest_group_id != largest:
        raise ValueError(f"largest_group_id={d.largest_group_id} is not the largest group ({largest})")


def is_observed_oom(d: Decision) -> bool:
    """A fallback stored because the guarded benchmark really ran out of memory (reason ``observed_oom``)."""
    return d.action == "fallback" and d.reason.startswith(Reason.OBSERVED_OOM.value)


def _subject(plan: KernelPlan) -> str:
    """Upstream's wording for grouped plans; plain for single-group selections."""
    return "grouped benchmark footprint" if plan.group_features else "benchmark footprint"


def _from_footprint(plan: KernelPlan, budget: Budget, fp: Footprint) -> Decision:
    fits = budget.admits(fp.total_bytes)
    if fits:
        reason = f"estimated_bytes={fp.total_bytes} <= budget_bytes={budget.budget_bytes}"
    else:
        arg = fp.dominant_arg  # upstream's diagnostic names it
        dominant = "none" if arg is None else (f"group_id={arg.group_id} arg={arg.name} kind={arg.kind} "
                                               f"size={arg.size} stride={arg.stride} dtype={arg.dtype} "
                                               f"bytes={arg.num_bytes}")
        reason = (
            f"{_subject(plan)} exceeds budget: "
            f"estimated_bytes={fp.total_bytes} budget_bytes={budget.budget_bytes} ratio={budget.ratio} "
            f"largest_group_id={fp.largest_group_id} dominant=({dominant})"
        )
    return Decision(action="tune" if fits else "fallback", bounded=True,
                    enable_auto_blockify=(not fits) and plan.is_dynamic, estimated_bytes=fp.total_bytes,
                    synthetic_bytes=fp.synthetic_bytes, mutated_clone_bytes=fp.mutated_clone_bytes, reason=reason,
                    largest_group_id=fp.largest_group_id, dominant_arg=fp.dominant_arg, group_bytes=fp.group_bytes,
                    **_budget_fields(budget))


def _budget_fields(budget: Budget) -> dict[str, Any]:
    return {"budget_bytes": budget.budget_bytes, "total_memory": budget.total_memory, "ratio": budget.ratio,
            "device_kind": budget.device_kind}


def not_bounded_decision(plan: KernelPlan, budget: Budget, exc: NotBounded) -> Decision:
    """The fail-closed fallback for a plan whose footprint cannot be bounded."""
    return Decision(action="fallback", bounded=False, enable_auto_blockify=plan.is_dynamic, estimated_bytes=None,
                    synthetic_bytes=None, mutated_clone_bytes=None, reason=f"{_subject(plan)} is not bounded: {exc}",
                    largest_group_id=None, dominant_arg=None, group_bytes=(), **_budget_fields(budget))


def decide_with_representatives(plan: KernelPlan, budget: Budget) -> tuple[Decision, Representatives | None]:
    """The decision, and the representatives it was estimated over (None where they cannot be built)."""
    try:
        reps = build_representatives(plan)
    except NotBounded as exc:
        return not_bounded_decision(plan, budget, exc), None
    try:
        fp = estimate_footprint(plan, reps)
    except NotBounded as exc:
        return not_bounded_decision(plan, budget, exc), reps
    return _from_footprint(plan, budget, fp), reps


def decide(plan: KernelPlan, budget: Budget) -> Decision:
    """Representatives -> footprint -> decision; never raises for a bad plan."""
    return decide_with_representatives(plan, budget)[0]
