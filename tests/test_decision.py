"""Tune-or-fall-back decisions, their fields, and their strict payload form."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import PlanCase, plan_cases, upstream_meta

from prescreen.budget import Budget
from prescreen.decision import ESTIMATOR_VERSION, Decision, decide, decide_with_representatives
from prescreen.errors import NotBounded, Reason
from prescreen.footprint import ArgFootprint
from prescreen.plan import KernelPlan

UPSTREAM_TOTAL = 560


def upstream_plan() -> KernelPlan:
    return KernelPlan.from_payload(upstream_meta())


def budget_of(nbytes: int, ratio: float = 0.25) -> Budget:
    """A budget of exactly ``nbytes`` (total memory = nbytes / ratio)."""
    budget = Budget("npu", round(nbytes / ratio), ratio)
    assert budget.budget_bytes == nbytes
    return budget


def test_inclusive_boundary() -> None:
    plan = upstream_plan()
    assert decide(plan, budget_of(UPSTREAM_TOTAL)).action == "tune"
    assert decide(plan, budget_of(UPSTREAM_TOTAL - 1)).action == "fallback"
    assert decide(plan, Budget("npu", 2240, 0.25)).tune  # int(2240 * 0.25) == 560
    assert not decide(plan, Budget("npu", 2239, 0.25)).tune  # int(559.75) == 559


def test_tune_fields() -> None:
    d = decide(upstream_plan(), Budget("npu", 64 * 2**30, 0.25))
    assert (d.action, d.bounded, d.enable_auto_blockify) == ("tune", True, False)
    assert (d.estimated_bytes, d.synthetic_bytes, d.mutated_clone_bytes) == (560, 528, 32)
    assert d.group_bytes == ((0, 176), (1, 352))
    assert d.largest_group_id == 1
    assert d.dominant_arg is not None and d.dominant_arg.name == "in_ptr0"
    assert (d.budget_bytes, d.total_memory, d.ratio, d.device_kind) == (16 * 2**30, 64 * 2**30, 0.25, "npu")
    assert d.estimator_version == ESTIMATOR_VERSION
    assert "560" in d.reason


def test_fallback_of_a_dynamic_plan_enables_auto_blockify() -> None:
    d = decide(upstream_plan(), budget_of(100))
    assert (d.action, d.bounded, d.enable_auto_blockify) == ("fallback", True, True)
    assert d.estimated_bytes == 560
    for text in ("exceeds budget", "estimated_bytes=560", "budget_bytes=100", "ratio=0.25", "largest_group_id=1",
                 "arg=in_ptr0", "bytes=320"):
        assert text in d.reason


def test_fallback_of_a_static_plan_does_not_blockify() -> None:
    meta = upstream_meta()
    meta["axis_static_values"] = [["x0", 64]]
    plan = KernelPlan.from_payload(meta)
    assert not plan.is_dynamic
    d = decide(plan, budget_of(10))
    assert (d.action, d.bounded, d.enable_auto_blockify) == ("fallback", True, False)


@pytest.mark.parametrize("static", [False, True])
def test_not_bounded_falls_back(static: bool) -> None:
    meta = upstream_meta()
    meta["ordered_arg_specs"][1]["size_exprs"][0] = {"runtime_arg_index": 2}  # type: ignore[index]
    if static:
        meta["axis_static_values"] = [["x0", 4]]
    plan = KernelPlan.from_payload(meta)
    d = decide(plan, Budget("npu", 64 * 2**30, 1.0))
    assert (d.action, d.bounded, d.enable_auto_blockify) == ("fallback", False, not static)
    assert (d.estimated_bytes, d.synthetic_bytes, d.mutated_clone_bytes) == (None, None, None)
    assert (d.largest_group_id, d.dominant_arg, d.group_bytes) == (None, None, ())
    assert "not bounded" in d.reason and Reason.RUNTIME_DEPENDENT.value in d.reason


def test_unsupported_grouping_falls_back() -> None:
    meta = upstream_meta()
    meta["group_features"][0]["buckets"] = []  # type: ignore[index]
    plan = KernelPlan.from_payload(meta)
    d, reps = decide_with_representatives(plan, budget_of(10**9))
    assert reps is None and (d.action, d.bounded) == ("fallback", False)
    assert Reason.UNSUPPORTED_GROUPING.value in d.reason
    assert d == decide(plan, budget_of(10**9))


@settings(max_examples=150, deadline=None)
@given(plan_cases(fail_closed=True), st.integers(1, 2**40), st.sampled_from([0.25, 0.5, 1.0, 0.3]))
def test_decide_never_raises_and_round_trips(case: PlanCase, total_memory: int, ratio: float) -> None:
    try:
        plan = KernelPlan.from_payload(case.payload)
    except NotBounded as exc:
        assert exc.reason is case.reason
        return
    d = decide(plan, Budget("npu", total_memory, ratio))
    assert d.bounded == (case.fault is None)
    if d.bounded:
        assert d.tune == (d.estimated_bytes <= int(total_memory * ratio))  # type: ignore[operator]
        assert d.enable_auto_blockify == (not d.tune and plan.is_dynamic)
    else:
        assert case.reason is not None and case.reason.value in d.reason
    wire = json.loads(json.dumps(d.to_payload()))
    assert Decision.from_payload(wire) == d


def _tune_payload() -> dict[str, object]:
    return decide(upstream_plan(), Budget("npu", 64 * 2**30, 0.25)).to_payload()


def _fallback_payload() -> dict[str, object]:
    return decide(upstream_plan(), budget_of(100)).to_payload()


def _not_bounded_payload() -> dict[str, object]:
    meta = upstream_meta()
    meta["ordered_arg_specs"][0]["dtype"] = "torch.float17"  # type: ignore[index]
    return decide(KernelPlan.from_payload(meta), budget_of(100)).to_payload()


@pytest.mark.parametrize("make", [_tune_payload, _fallback_payload, _not_bounded_payload])
def test_payload_round_trip(make: object) -> None:
    payload = make()  # type: ignore[operator]
    assert Decision.from_payload(json.loads(json.dumps(payload))).to_payload() == payload


def _set(key: str, value: object):  # noqa: ANN202
    return lambda d: d.__setitem__(key, value)


TAMPERING = {
    "action-flipped": (_tune_payload, _set("action", "fallback")),
    "action-unknown": (_tune_payload, _set("action", "skip")),
    "estimate-lowered": (_fallback_payload, lambda d: d.update(estimated_bytes=50, synthetic_bytes=18)),
    "estimate-sum-off": (_tune_payload, _set("estimated_bytes", 561)),
    "estimate-float": (_tune_payload, _set("estimated_bytes", 560.0)),
    "estimate-missing-on-bounded": (_tune_payload, _set("estimated_bytes", None)),
    "budget-raised": (_fallback_payload, _set("budget_bytes", 10**9)),
    "total-memory-zero": (_tune_payload, lambda d: d.update(total_memory=0, budget_bytes=0)),
    "ratio-zero": (_tune_payload, _set("ratio", 0)),
    "ratio-too-big": (_tune_payload, _set("ratio", 1.5)),
    "ratio-bool": (_tune_payload, _set("ratio", True)),
    "ratio-string": (_tune_payload, _set("ratio", "0.25")),
    "bounded-string": (_tune_payload, _set("bounded", "yes")),
    "blockify-int": (_fallback_payload, _set("enable_auto_blockify", 1)),
    "blockify-on-tune": (_tune_payload, _set("enable_auto_blockify", True)),
    "device-kind-int": (_tune_payload, _set("device_kind", 7)),
    "reason-none": (_tune_payload, _set("reason", None)),
    "version-string": (_tune_payload, _set("estimator_version", "1")),
    "missing-field": (_tune_payload, lambda d: d.pop("reason")),
    "extra-field": (_tune_payload, _set("pickle", "cos\nsystem\n")),
    "group-bytes-bool": (_tune_payload, _set("group_bytes", [[0, 176], [True, 352]])),
    "group-bytes-float": (_tune_payload, _set("group_bytes", [[0, 176.0], [1, 352]])),
    "group-bytes-shape": (_tune_payload, _set("group_bytes", [[0, 176, 1], [1, 352]])),
    "group-bytes-sum-off": (_tune_payload, _set("group_bytes", [[0, 175], [1, 352]])),
    "largest-group-wrong": (_tune_payload, _set("largest_group_id", 0)),
    "dominant-string": (_tune_payload, _set("dominant_arg", "in_ptr0")),
    "dominant-missing-key": (_tune_payload, lambda d: d["dominant_arg"].pop("num_bytes")),
    "dominant-float-bytes": (_tune_payload, lambda d: d["dominant_arg"].__setitem__("num_bytes", 320.5)),
    "dominant-size-string": (_tune_payload, lambda d: d["dominant_arg"].__setitem__("size", "16x10")),
    "not-bounded-with-numbers": (_not_bounded_payload, lambda d: d.update(
        estimated_bytes=0, synthetic_bytes=0, mutated_clone_bytes=0)),
    "not-bounded-tunes": (_not_bounded_payload, lambda d: d.update(action="tune", enable_auto_blockify=False)),
    "not-a-mapping": (_tune_payload, None),
}


@pytest.mark.parametrize("name", sorted(TAMPERING))
def test_from_payload_rejects_tampering(name: str) -> None:
    make, edit = TAMPERING[name]
    payload = copy.deepcopy(make())
    if edit is not None:
        edit(payload)
    value = payload if edit is not None else list(payload.items())
    with pytest.raises(ValueError):
        Decision.from_payload(value)  # type: ignore[arg-type]


def test_budget_bytes_recomputed_from_float_ratio() -> None:
    d = decide(upstream_plan(), Budget("npu", 10**12 + 7, 0.3))
    payload = json.loads(json.dumps(d.to_payload()))
    assert payload["budget_bytes"] == math.floor((10**12 + 7) * 0.3)
    assert Decision.from_payload(payload) == d


def test_arg_footprint_payload_is_asdict_with_lists_and_round_trips() -> None:
    arg = ArgFootprint(3, "in_ptr0", "tensor", "torch.float16", (4, 5), (5, 1), 40)
    payload = arg.to_payload()
    assert payload == {**dataclasses.asdict(arg), "size": [4, 5], "stride": [5, 1]}
    assert list(payload) == [f.name for f in dataclasses.fields(ArgFootprint)]
    assert ArgFootprint.from_payload(payload) == arg
