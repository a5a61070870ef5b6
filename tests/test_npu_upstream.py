"""Differential tests against the real torch-npu 2.14.0 wheel (fetched by ``npu_wheel``)."""

from __future__ import annotations

import ast
import math
from types import ModuleType
from unittest import mock

import numpy
import pytest
import sympy
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from npu_wheel import (
    CODEGEN_TRITON,
    NPU_CONFIG,
    TRITON_HEURISTICS,
    WheelUnavailable,
    load_upstream_symbolic_grouping,
    upstream_source,
)
from strategies import PlanCase, plan_cases, upstream_meta

from prescreen import footprint
from prescreen.budget import Budget
from prescreen.decision import decide
from prescreen.errors import NotBounded
from prescreen.expr import evaluate, expr_from_payload
from prescreen.footprint import Footprint, estimate_footprint
from prescreen.plan import KernelPlan
from prescreen.representatives import Representatives, build_representatives

#: What upstream's guard catches as "footprint is not bounded".
UPSTREAM_NOT_BOUNDED = (AttributeError, KeyError, RuntimeError, TypeError, ValueError)


@pytest.fixture(scope="session")
def upstream() -> ModuleType:
    try:
        return load_upstream_symbolic_grouping()
    except WheelUnavailable as exc:
        print(f"skipping torch-npu differential tests: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def triton_ast() -> ast.Module:
    try:
        return ast.parse(upstream_source(CODEGEN_TRITON))
    except WheelUnavailable as exc:
        print(f"skipping torch-npu source tests: {exc}")
        pytest.skip(str(exc))


def ours(payload: dict[str, object]) -> tuple[KernelPlan, Representatives, Footprint] | NotBounded:
    """Our pipeline; only ``NotBounded`` counts as failing closed (anything else fails the test)."""
    try:
        plan = KernelPlan.from_payload(payload)
        reps = build_representatives(plan)
        return plan, reps, estimate_footprint(plan, reps)
    except NotBounded as exc:
        return exc


def theirs(upstream: ModuleType, payload: dict[str, object]) -> tuple[dict[str, object], object] | Exception:
    """torch_npu's two steps with the arguments its guard passes."""
    try:
        reps = upstream.build_group_representatives(
            payload.get("group_features", ()), payload.get("axis_names", ()), payload.get("axis_static_values", ())
        )
        fp = upstream.estimate_grouped_benchmark_footprint(
            reps, payload.get("ordered_arg_specs", ()), payload.get("mutated_arg_names", ())
        )
        return reps, fp
    except UPSTREAM_NOT_BOUNDED as exc:
        return exc


def test_loaded_module_is_upstream(upstream: ModuleType) -> None:
    assert upstream.__name__.startswith("_prescreen_")
    assert issubclass(upstream.UnsupportedGroupedPlan, RuntimeError)
    assert upstream.required_storage_numel((8, 10), (10, 1)) == 80
    assert upstream.required_storage_numel((3, 4), (8, 1)) == 20


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=plan_cases(fail_closed=True),
    ratio=st.one_of(st.sampled_from([0.25, 0.5, 1.0]), st.floats(0.001, 1.0)),
    slack=st.sampled_from([-1, 0, -2, 1, -3, 2]),
)
def test_matches_upstream(upstream: ModuleType, case: PlanCase, ratio: float, slack: int) -> None:
    mine, other = ours(case.payload), theirs(upstream, case.payload)
    event(f"fault={case.fault}")
    if isinstance(mine, NotBounded) or isinstance(other, Exception):
        assert isinstance(mine, NotBounded) and isinstance(other, Exception), (mine, other)
        assert mine.reason == case.reason, (case.fault, mine)
        try:
            plan = KernelPlan.from_payload(case.payload)
        except NotBounded:
            return  # rejected while parsing: there is no plan to decide for
        decision = decide(plan, Budget("npu", 1 << 40, ratio))
        assert (decision.action, decision.bounded, decision.estimated_bytes) == ("fallback", False, None)
        return
    assert case.fault is None
    plan, reps, fp = mine
    up_reps, up_fp = other

    # Representatives: same groups, same axis and feature values.
    assert reps.group_count == up_reps["group_id_count"]
    assert reps.grid.group_ids() == tuple(up_reps["reachable_group_ids"])
    assert reps.unreachable_group_ids == tuple(up_reps["unreachable_group_ids"])
    event(f"unreachable={bool(reps.unreachable_group_ids)}")
    features = tuple(case.payload["group_features"])  # type: ignore[arg-type]
    for group in reps.groups:
        assert group.feature_values == tuple(up_reps["benchmark_feature_inputs_by_group"][group.group_id])
        assert group.axis_values == tuple(up_reps["benchmark_axis_values_by_group"][group.group_id])
        assert group.bucket_indices == upstream.decode_group_bucket_indices(features, group.group_id)
    for group_id in reps.unreachable_group_ids:
        assert tuple(up_reps["benchmark_axis_values_by_group"][group_id]) == ()

    # Footprint: every number and the dominant arg.
    assert (fp.synthetic_bytes, fp.mutated_clone_bytes, fp.total_bytes) == (
        up_fp.synthetic_bytes, up_fp.mutated_clone_bytes, up_fp.total_bytes
    )
    assert fp.group_bytes == tuple(up_fp.group_bytes)
    assert fp.largest_group_id == up_fp.largest_group_id
    if up_fp.dominant_arg is None:
        assert fp.dominant_arg is None
    else:
        d, u = fp.dominant_arg, up_fp.dominant_arg
        assert d is not None
        assert (d.group_id, d.name, d.kind, d.dtype, tuple(d.size), tuple(d.stride), d.num_bytes) == (
            u.group_id, u.name, u.kind, u.dtype, tuple(u.size), tuple(u.stride), u.num_bytes
        )

    # Decision at a budget right around the footprint: upstream tunes iff total <= int(total_memory * ratio).
    total_memory = max(1, math.ceil(max(1, up_fp.total_bytes + slack) / ratio))
    upstream_tunes = up_fp.total_bytes <= int(total_memory * ratio)
    decision = decide(plan, Budget("npu", total_memory, ratio))
    event(f"tune={upstream_tunes}, zero_bytes={up_fp.total_bytes == 0}")
    assert decision.bounded
    assert decision.tune == upstream_tunes
    assert decision.estimated_bytes == up_fp.total_bytes
    assert decision.enable_auto_blockify == ((not upstream_tunes) and plan.is_dynamic)


def _edit(path: tuple[object, ...], value: object) -> dict[str, object]:
    meta = upstream_meta()
    target: object = meta
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    if value is _DROP:
        del target[path[-1]]  # type: ignore[attr-defined]
    else:
        target[path[-1]] = value  # type: ignore[index]
    return meta


_DROP = object()
IN_PTR0_DIM1 = ("ordered_arg_specs", 1, "size_exprs", 1)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("group_features", 0, "buckets"), [8, 4]),
        (("group_features", 0, "buckets"), [8, 8]),
        (("group_features", 0, "buckets"), [True, 8]),
        (("group_features", 0, "name"), _DROP),
        (("group_features", 0), {"name": "f", "source": "weird", "axis_names": [], "buckets": [8]}),
        (IN_PTR0_DIM1, {"const": True}),
        (IN_PTR0_DIM1, {"const": 10.0}),
        (IN_PTR0_DIM1, {"const": "10"}),
        (IN_PTR0_DIM1, {"mul": []}),
        (IN_PTR0_DIM1, {"add": []}),
        (IN_PTR0_DIM1, {"const": 10, "axis_name": "x0"}),
        (("ordered_arg_specs", 2, "expr"), {"mod": [1, 2]}),
        (("ordered_arg_specs", 2, "source"), "buffer"),
        (("ordered_arg_specs", 1, "source"), "runtime_arg"),
        (("ordered_arg_specs", 1, "name"), _DROP),
        (("axis_static_values",), [["y9", "3"]]),
        (("mutated_arg_names",), [3]),
    ],
)
def test_known_cases_where_we_are_stricter(upstream: ModuleType, path: tuple[object, ...], value: object) -> None:
    """Malformed plans upstream still sizes (Inductor never writes them); we fail closed instead."""
    meta = _edit(path, value)
    other = theirs(upstream, meta)
    assert not isinstance(other, Exception), other
    assert isinstance(ours(meta), NotBounded)


class _PrintsLikeADtype:
    """Not a torch.dtype, though it prints like one."""

    def __str__(self) -> str:
        return "torch.float16"


#: Every leaf a payload expression may hold, Inductor's forms and others.
LEAF_FORMS: list[object] = [
    0, 3, -2, True, False, 2.0, "3", None, [3], (3,), numpy.int64(3),
    sympy.Integer(8), sympy.S.One, sympy.S.Zero, sympy.S.NegativeOne,
    {"const": 3}, {"const": -1}, {"const": True}, {"const": 2.7}, {"const": "3"}, {"const": None},
    {"const": sympy.Integer(8)}, {"const": sympy.S.One}, {"const": numpy.int64(3)},
    {"axis_name": "x0"}, {"axis_name": "nope"}, {"axis_name": 3}, {"axis_name": ""},
    {"runtime_arg_index": 0}, {"runtime_arg_index": sympy.Integer(1)},
    {"const": 3, "axis_name": "x0"}, {"pow": [2, 3]}, {},
]


def _payload_forms() -> list[object]:
    """Each leaf alone and as every operand position of every operator, and the operators' malformed shapes."""
    forms = list(LEAF_FORMS)
    for leaf in LEAF_FORMS:
        for op in ("mul", "add"):
            forms += [{op: [leaf]}, {op: [leaf, {"axis_name": "x0"}]}, {op: ({"const": 2}, leaf)}, {op: leaf}]
        forms += [{"floordiv": [leaf, 2]}, {"floordiv": [7, leaf]}, {"floordiv": [leaf]},
                  {"mul": [{"add": [leaf, 1]}, 2]}]
    for op in ("mul", "add", "floordiv"):
        forms += [{op: []}, {op: "12"}, {op: [1, 2, 3]}]
    return forms


PAYLOAD_FORMS = _payload_forms()


def _upstream_value(upstream: ModuleType, form: object, env: dict[str, int]) -> int | Exception:
    try:
        return upstream.evaluate_grouped_benchmark_expr(form, env)  # type: ignore[no-any-return]
    except Exception as exc:  # whatever it raises, torch_npu's guard cannot size the plan
        return exc


def test_every_payload_form_we_read_is_read_alike_by_torch_npu(upstream: ModuleType) -> None:
    """prescreen's parser accepts a subset of the wheel's, each to the same value; a bare sympy Integer is not in it.

    Checked expression by expression (the reference evaluator) and as a tensor's size and stride in a
    whole plan (the compiled estimator): wherever prescreen sizes a plan, torch_npu sizes it the same.
    """
    env = {"x0": 5}
    both = stricter = 0
    for form in PAYLOAD_FORMS:
        theirs_value = _upstream_value(upstream, form, env)
        try:
            mine_value: int | NotBounded = evaluate(expr_from_payload(form), env)
        except NotBounded as exc:
            mine_value = exc
        if isinstance(mine_value, NotBounded):
            stricter += not isinstance(theirs_value, Exception)
            continue
        assert theirs_value == mine_value, (form, theirs_value, mine_value)
        both += 1
        for dim in (IN_PTR0_DIM1, ("ordered_arg_specs", 1, "stride_exprs", 0)):
            meta = _edit(dim, form)
            mine, other = ours(meta), theirs(upstream, meta)
            if isinstance(mine, NotBounded):
                continue  # a negative size or stride: both fail closed below
            assert not isinstance(other, Exception), (form, other)
            assert mine[2].total_bytes == other[1].total_bytes, form  # type: ignore[attr-defined]
    for bare in (sympy.Integer(8), sympy.S.One, sympy.S.Zero):
        assert isinstance(_upstream_value(upstream, bare, env), upstream.UnsupportedGroupedPlan)
        assert isinstance(ours(_edit(IN_PTR0_DIM1, bare)), NotBounded)
    print(f"\n{len(PAYLOAD_FORMS)} payload forms: {both} read alike, {stricter} only torch_npu reads, "
          f"{len(PAYLOAD_FORMS) - both - stricter} neither")
    assert both > 50 and stricter > 0


@pytest.mark.parametrize("dtype", ["torch.float16", "float16", "half", "float", "torch.bool", "torch.nope", "Size",
                                   "torch.torch.float16", "", torch.float16, torch.int8, _PrintsLikeADtype(), 3,
                                   None, ["torch.float16"]])
def test_every_dtype_form_we_read_is_read_alike_by_torch_npu(upstream: ModuleType, dtype: object) -> None:
    meta = _edit(("ordered_arg_specs", 1, "dtype"), dtype)
    mine, other = ours(meta), theirs(upstream, meta)
    if isinstance(mine, NotBounded):
        assert isinstance(other, Exception), (dtype, other)  # no dtype torch_npu reads is refused here
    else:
        assert not isinstance(other, Exception), (dtype, other)
        assert mine[2].total_bytes == other[1].total_bytes  # type: ignore[attr-defined]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found in the wheel's source")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{cls.name}.{name} not found")


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("_disable_grouped_autotune_if_benchmark_too_large", ["self", "inductor_meta", "device"]),
        ("_disable_grouped_autotune", ["self", "inductor_meta", "reason"]),
        ("build_grouped_benchmark_arg_specs", ["self", "argdefs", "signature"]),
    ],
)
def test_guard_method_signatures(triton_ast: ast.Module, method: str, params: list[str]) -> None:
    fn = _method(_class(triton_ast, "NPUIndexTritonKernel"), method)
    args = fn.args
    assert [a.arg for a in args.posonlyargs + args.args] == params
    assert not (args.vararg or args.kwarg or args.kwonlyargs)
    if method == "_disable_grouped_autotune" and args.args[2].annotation is not None:
        assert ast.unparse(args.args[2].annotation) == "str"


def test_guard_budget_semantics(triton_ast: ast.Module) -> None:
    """The guard we mirror: build, estimate, ``budget = int(total_memory * ratio)``, ``total <= budget``."""
    fn = _method(_class(triton_ast, "NPUIndexTritonKernel"), "_disable_grouped_autotune_if_benchmark_too_large")
    calls = {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    assert {"build_group_representatives", "estimate_grouped_benchmark_footprint"} <= calls
    assert "self._disable_grouped_autotune" in calls
    texts = {ast.unparse(n) for n in ast.walk(fn) if isinstance(n, (ast.Compare, ast.Call, ast.Attribute))}
    assert "int(total_memory * ratio)" in texts
    assert "footprint.total_bytes <= budget_bytes" in texts
    assert "npu_config.symbolic_group_max_benchmark_memory_ratio" in texts


def test_config_ratio_default() -> None:
    try:
        tree = ast.parse(upstream_source(NPU_CONFIG))
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "INDUCTOR_ASCEND_SYMBOLIC_GROUP_MAX_BENCHMARK_MEMORY_RATIO"
        ):
            found.append([ast.literal_eval(a) for a in node.args[1:]])
    assert found, "INDUCTOR_ASCEND_SYMBOLIC_GROUP_MAX_BENCHMARK_MEMORY_RATIO is not read in config.py"
    default, *bounds = found[0]
    assert default == 0.25
    assert bounds in ([], [0.0, 1.0])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=plan_cases(fail_closed=True))
def test_numpy_path_matches_upstream(upstream: ModuleType, case: PlanCase) -> None:
    """Drawn plans are small, so they take the plain loop above; here the numpy path is forced on them."""
    with mock.patch.object(footprint, "LOOP_MAX", 0):
        mine = ours(case.payload)
    other = theirs(upstream, case.payload)
    if isinstance(mine, NotBounded) or isinstance(other, Exception):
        assert isinstance(mine, NotBounded) and isinstance(other, Exception), (mine, other)
        assert mine.reason == case.reason, (case.fault, mine)
        return
    fp, (_, up_fp) = mine[2], other
    assert (fp.synthetic_bytes, fp.mutated_clone_bytes, fp.total_bytes, fp.group_bytes, fp.largest_group_id) == (
        up_fp.synthetic_bytes, up_fp.mutated_clone_bytes, up_fp.total_bytes, tuple(up_fp.group_bytes),
        up_fp.largest_group_id,
    )
    d, u = fp.dominant_arg, up_fp.dominant_arg
    assert (d is None) == (u is None)
    if d is not None:
        assert (d.group_id, d.name, d.kind, d.dtype, d.size, d.stride, d.num_bytes) == (
            u.group_id, u.name, u.kind, u.dtype, tuple(u.size), tuple(u.stride), u.num_bytes
        )


# --- the runtime fallback after an out-of-memory error reads these structures of the 2.14 wheel ------------

@pytest.fixture(scope="session")
def heuristics_ast() -> ast.Module:
    try:
        return ast.parse(upstream_source(TRITON_HEURISTICS))
    except WheelUnavailable as exc:
        pytest.skip(str(exc))


def _texts(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(n) for n in ast.walk(fn) if isinstance(n, (ast.Call, ast.Attribute, ast.Subscript, ast.If))}


def test_grouped_winner_setter_and_tables(heuristics_ast: ast.Module) -> None:
    """``hooks.npu.first_config_choices`` sets winners through the wheel's setter, into the tables its ``run`` reads."""
    cls = _class(heuristics_ast, "NPUSymbolicGroupedAutotuner")
    setter = _method(cls, "_set_group_best_candidate")
    assert [a.arg for a in setter.args.args] == ["self", "group_id", "candidate", "launcher"]
    assert {"self.best_candidate_map[group_id] = candidate", "self.best_launcher_map[group_id] = launcher"} == {
        ast.unparse(n) for n in setter.body}
    init = _texts(_method(cls, "__init__"))
    assert {"self.candidate_plan", "self.reachable_selection_keys", "self.best_launcher_map"} <= init
    run = _texts(_method(cls, "run"))
    assert {"self.best_candidate_map.get(group_id)", "self.best_launcher_map.get(group_id)"} <= run
    autotune = _texts(_method(cls, "_autotune_all_groups"))
    assert "self._benchmark_grouped_entries(entries, **kwargs)" in autotune
    assert any(t.startswith("self._set_group_best_candidate(") for t in autotune)


def test_grouped_candidates_are_filtered_as_the_fallback_filters_them(heuristics_ast: ast.Module) -> None:
    """Candidates per group in plan order, launchers by candidate_id from compiled_candidate_entries, runnable only."""
    cls = _class(heuristics_ast, "NPUSymbolicGroupedAutotuner")
    texts = _texts(_method(cls, "_build_grouped_benchmark_entries"))
    assert "enumerate(self.candidate_plan['group_to_candidates'])" in texts
    assert "compiled_launcher_by_candidate_id.get(candidate['candidate_id'])" in texts
    assert "launcher is None or not launcher.runnable" in {
        ast.unparse(n.test) for n in ast.walk(_method(cls, "_build_grouped_benchmark_entries"))
        if isinstance(n, ast.If)}
    ready = _method(cls, "ensure_grouped_autotune_ready")
    assert "self._all_reachable_groups_tuned()" in _texts(ready)  # a group with a winner is never benchmarked again


def test_unbenchmarked_choice_is_the_first_compiled_candidate(heuristics_ast: ast.Module) -> None:
    """Where torch_npu skips benchmarking (one candidate; deterministic reductions) it takes the first compiled one."""
    cls = _class(heuristics_ast, "NPUCachingAutotuner")
    first = _method(cls, "_first_compiled_candidate_entry")
    assert "self.compiled_candidate_entries[0]" in _texts(first)
    assert ast.unparse(_method(cls, "autotuner")).count("self._first_compiled_candidate_entry()") == 2
