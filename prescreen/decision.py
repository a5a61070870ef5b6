"""Tune-or-fall-back decision for one plan against one budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from prescreen.budget import Budget
from prescreen.errors import NotBounded
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
        ratio = d["ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"bad ratio {ratio!r}")
        groups = d["group_bytes"]
        if not isinstance(groups, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p) for p in groups
        ):
            raise ValueError("group_bytes must be a list of [group_id, bytes]")
        dom = d["dominant_arg"]
        return Decision(
            action=d["action"],  # type: ignore[arg-type]
            bounded=bool(d["bounded"]),
            enable_auto_blockify=bool(d["enable_auto_blockify"]),
            estimated_bytes=opt_int("estimated_bytes"),
            synthetic_bytes=opt_int("synthetic_bytes"),
            mutated_clone_bytes=opt_int("mutated_clone_bytes"),
            budget_bytes=req_int("budget_bytes"),
            total_memory=req_int("total_memory"),
            ratio=float(ratio),
            device_kind=str(d["device_kind"]),
            reason=str(d["reason"]),
            largest_group_id=opt_int("largest_group_id"),
            dominant_arg=ArgFootprint.from_payload(dom) if isinstance(dom, dict) else None,  # type: ignore[arg-type]
            group_bytes=tuple((int(g), int(b)) for g, b in groups),
            estimator_version=req_int("estimator_version"),
        )


def describe_dominant(arg: ArgFootprint | None) -> str:
    """The dominant-arg text of upstream's diagnostic."""
    if arg is None:
        return "none"
    return (
        f"group_id={arg.group_id} arg={arg.name} kind={arg.kind} size={arg.size} "
        f"stride={arg.stride} dtype={arg.dtype} bytes={arg.num_bytes}"
    )


def _from_footprint(plan: KernelPlan, budget: Budget, fp: Footprint) -> Decision:
    fits = budget.admits(fp.total_bytes)
    if fits:
        reason = f"estimated_bytes={fp.total_bytes} <= budget_bytes={budget.budget_bytes}"
    else:
        reason = (
            "grouped benchmark footprint exceeds budget: "
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
        reason=f"grouped benchmark footprint is not bounded: {exc}",
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
