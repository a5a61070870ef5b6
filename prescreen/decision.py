"""Tune-or-fall-back decision for one plan against one budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

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
    ratio: float
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
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["dominant_arg"] = self.dominant_arg.to_payload() if self.dominant_arg else None
        d["group_bytes"] = [[g, b] for g, b in self.group_bytes]
        return d

    @staticmethod
    def from_payload(d: Mapping[str, object]) -> "Decision":
        """Strictly validate a stored decision; raises ``ValueError`` on anything off."""
        if not isinstance(d, Mapping):
            raise ValueError(f"decision must be a mapping, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(Decision)}
        if set(d) != names:
            raise ValueError(f"decision fields differ: missing {sorted(names - set(d))}, extra {sorted(set(d) - names)}")
        if d["action"] not in ("tune", "fallback"):
            raise ValueError(f"bad action {d['action']!r}")

        def opt_int(key: str) -> int | None:
            v = d[key]
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{key} must be an int, got {v!r}")
            return v

        def req_int(key: str) -> int:
            v = opt_int(key)
            if v is None:
                raise ValueError(f"{key} must be an int, got None")
            return v

        for key in ("bounded", "enable_auto_blockify"):
            if not isinstance(d[key], bool):
                raise ValueError(f"{key} must be a bool")
        for key in ("device_kind", "reason"):
            if not isinstance(d[key], str):
                raise ValueError(f"{key} must be a string, got {d[key]!r}")
        ratio = d["ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"bad ratio {ratio!r}")
        groups = d["group_bytes"]
        if not isinstance(groups, list) or not all(
            type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is int for p in groups  # no bools
        ):
            raise ValueError("group_bytes must be a list of [group_id, bytes]")
        dom = d["dominant_arg"]
        decision = Decision(
            action=d["action"],
            bounded=bool(d["bounded"]),
            enable_auto_blockify=bool(d["enable_auto_blockify"]),
            estimated_bytes=opt_int("estimated_bytes"),
            synthetic_bytes=opt_int("synthetic_bytes"),
            mutated_clone_bytes=opt_int("mutated_clone_bytes"),
            budget_bytes=req_int("budget_bytes"),
            total_memory=req_int("total_memory"),
            ratio=float(ratio),
            device_kind=d["device_kind"],  # type: ignore[arg-type]
            reason=d["reason"],  # type: ignore[arg-type]
            largest_group_id=opt_int("largest_group_id"),
            dominant_arg=None if dom is None else ArgFootprint.from_payload(dom),
            group_bytes=tuple((g, b) for g, b in groups),
            estimator_version=req_int("estimator_version"),
        )
        _check_consistent(decision)
        return decision


def _check_consistent(d: Decision) -> None:
    """Reject a decision whose numbers do not give its action (a tampered or corrupt value)."""
    if d.total_memory <= 0 or d.budget_bytes != int(d.total_memory * d.ratio):
        raise ValueError(f"budget_bytes={d.budget_bytes} is not int(total_memory={d.total_memory} * ratio={d.ratio})")
    if d.enable_auto_blockify and d.action != "fallback":
        raise ValueError("enable_auto_blockify is only set on a fallback")
    numbers = (d.estimated_bytes, d.synthetic_bytes, d.mutated_clone_bytes)
    if not d.bounded:
        if d.action != "fallback" or any(n is not None for n in numbers) or d.group_bytes or (
            d.largest_group_id is not None or d.dominant_arg is not None
        ):
            raise ValueError("a not-bounded decision must be a fallback without footprint numbers")
        return
    est, syn, mut = numbers
    if est is None or syn is None or mut is None or min(est, syn, mut) < 0 or est != syn + mut:
        raise ValueError(f"estimated_bytes={est} must equal synthetic_bytes={syn} + mutated_clone_bytes={mut}")
    if (d.action == "tune") != (est <= d.budget_bytes) and not is_observed_oom(d):
        raise ValueError(f"action={d.action} contradicts estimated_bytes={est} vs budget_bytes={d.budget_bytes}")
    if any(b < 0 for _, b in d.group_bytes) or sum(b for _, b in d.group_bytes) != syn:
        raise ValueError("group_bytes do not add up to synthetic_bytes")
    largest = max(d.group_bytes, key=lambda item: item[1])[0] if d.group_bytes else None
    if d.largest_group_id != largest:
        raise ValueError(f"largest_group_id={d.largest_group_id} is not the largest group ({largest})")


def is_observed_oom(d: Decision) -> bool:
    """A fallback stored because the guarded benchmark really ran out of memory (reason ``observed_oom``)."""
    return d.action == "fallback" and d.reason.startswith(Reason.OBSERVED_OOM.value)


def describe_dominant(arg: ArgFootprint | None) -> str:
    """The dominant-arg text of upstream's diagnostic."""
    if arg is None:
        return "none"
    return (
        f"group_id={arg.group_id} arg={arg.name} kind={arg.kind} size={arg.size} "
        f"stride={arg.stride} dtype={arg.dtype} bytes={arg.num_bytes}"
    )


def _subject(plan: KernelPlan) -> str:
    """Upstream's wording for grouped plans; plain for single-group selections."""
    return "grouped benchmark footprint" if plan.group_features else "benchmark footprint"


def _from_footprint(plan: KernelPlan, budget: Budget, fp: Footprint) -> Decision:
    fits = budget.admits(fp.total_bytes)
    if fits:
        reason = f"estimated_bytes={fp.total_bytes} <= budget_bytes={budget.budget_bytes}"
    else:
        reason = (
            f"{_subject(plan)} exceeds budget: "
            f"estimated_bytes={fp.total_bytes} budget_bytes={budget.budget_bytes} ratio={budget.ratio} "
            f"largest_group_id={fp.largest_group_id} dominant=({describe_dominant(fp.dominant_arg)})"
        )
    return Decision(
        action="tune" if fits else "fallback",
        bounded=True,
        enable_auto_blockify=(not fits) and plan.is_dynamic,
        estimated_bytes=fp.total_bytes,
        synthetic_bytes=fp.synthetic_bytes,
        mutated_clone_bytes=fp.mutated_clone_bytes,
        budget_bytes=budget.budget_bytes,
        total_memory=budget.total_memory,
        ratio=budget.ratio,
        device_kind=budget.device_kind,
        reason=reason,
        largest_group_id=fp.largest_group_id,
        dominant_arg=fp.dominant_arg,
        group_bytes=fp.group_bytes,
    )


def not_bounded_decision(plan: KernelPlan, budget: Budget, exc: NotBounded) -> Decision:
    """The fail-closed fallback for a plan whose footprint cannot be bounded."""
    return Decision(
        action="fallback",
        bounded=False,
        enable_auto_blockify=plan.is_dynamic,
        estimated_bytes=None,
        synthetic_bytes=None,
        mutated_clone_bytes=None,
        budget_bytes=budget.budget_bytes,
        total_memory=budget.total_memory,
        ratio=budget.ratio,
        device_kind=budget.device_kind,
        reason=f"{_subject(plan)} is not bounded: {exc}",
        largest_group_id=None,
        dominant_arg=None,
        group_bytes=(),
    )


def decide_with(plan: KernelPlan, reps: Representatives | NotBounded, budget: Budget) -> Decision:
    """Decide from already-built representatives (or the error building them)."""
    if isinstance(reps, NotBounded):
        return not_bounded_decision(plan, budget, reps)
    try:
        fp = estimate_footprint(plan, reps)
    except NotBounded as exc:
        return not_bounded_decision(plan, budget, exc)
    return _from_footprint(plan, budget, fp)


def try_representatives(plan: KernelPlan) -> Representatives | NotBounded:
    """Representatives, or the ``NotBounded`` that stopped them (returned, not raised)."""
    try:
        return build_representatives(plan)
    except NotBounded as exc:
        return exc


def decide(plan: KernelPlan, budget: Budget) -> Decision:
    """Representatives -> footprint -> decision; never raises for a bad plan."""
    return decide_with(plan, try_representatives(plan), budget)
