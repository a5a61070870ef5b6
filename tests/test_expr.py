"""Expression trees: payload parsing, evaluation, sympy conversion, failing closed."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import AXIS_POOL, expr_payloads, free_axes
from torch.utils._sympy.functions import CleanDiv
from torch.utils._sympy.functions import FloorDiv as TorchFloorDiv

from prescreen.errors import NotBounded, Reason
from prescreen.expr import (
    Add,
    Axis,
    Const,
    Expr,
    FloorDiv,
    Mul,
    RuntimeArg,
    evaluate,
    expr_from_payload,
    expr_from_sympy,
    expr_to_payload,
    grows,
)

S0, S1, S2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)


def ev(payload: object, **env: int) -> int:
    return evaluate(expr_from_payload(payload), env)


def test_upstream_example() -> None:
    assert ev({"add": [{"mul": [{"axis_name": "x0"}, {"const": 10}]}, {"const": 3}]}, x0=8) == 83


def test_nodes_parse_to_trees() -> None:
    payload = {"floordiv": [{"add": [{"axis_name": "x0"}, 3]}, {"mul": [2, {"runtime_arg_index": 1}]}]}
    assert expr_from_payload(payload) == FloorDiv(
        Add((Axis("x0"), Const(3))), Mul((Const(2), RuntimeArg(1)))
    )
    assert expr_from_payload({"const": sympy.Integer(7)}) == Const(7)  # int(Integer(7)) upstream: 7
    assert expr_from_payload({"runtime_arg_index": sympy.Integer(1)}) == RuntimeArg(1)


@pytest.mark.parametrize(
    ("payload", "env", "expected"),
    [
        ({"const": 5}, {}, 5),
        (5, {}, 5),
        ({"axis_name": "x0"}, {"x0": 9}, 9),
        ({"mul": [{"axis_name": "x0"}, {"axis_name": "x1"}, 2]}, {"x0": 3, "x1": 4}, 24),
        ({"add": [{"axis_name": "x0"}, {"const": -1}]}, {"x0": 3}, 2),
        ({"floordiv": [{"axis_name": "x0"}, 4]}, {"x0": 9}, 2),
        ({"floordiv": [{"const": -7}, 2]}, {}, -4),  # floor, not truncation (matches upstream's //)
        ({"mul": [{"add": [{"axis_name": "x0"}, 1]}, {"floordiv": [{"axis_name": "x1"}, 3]}]}, {"x0": 1, "x1": 7}, 4),
    ],
)
def test_evaluate(payload: object, env: dict[str, int], expected: int) -> None:
    assert evaluate(expr_from_payload(payload), env) == expected


@pytest.mark.parametrize(
    ("payload", "env", "reason"),
    [
        ({"floordiv": [{"axis_name": "x0"}, 0]}, {"x0": 4}, Reason.DIVISION_BY_ZERO),
        ({"floordiv": [8, {"add": [{"axis_name": "x0"}, -4]}]}, {"x0": 4}, Reason.DIVISION_BY_ZERO),
        ({"runtime_arg_index": 2}, {}, Reason.RUNTIME_DEPENDENT),
        ({"mul": [{"axis_name": "x0"}, {"runtime_arg_index": 0}]}, {"x0": 4}, Reason.RUNTIME_DEPENDENT),
        ({"axis_name": "x1"}, {"x0": 4}, Reason.MISSING_AXIS),
        ({"add": [1, {"axis_name": "r0"}]}, {}, Reason.MISSING_AXIS),
    ],
)
def test_evaluate_fails_closed(payload: object, env: dict[str, int], reason: Reason) -> None:
    with pytest.raises(NotBounded) as info:
        ev(payload, **env)
    assert info.value.reason is reason
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "payload",
    [
        {"mod": [{"axis_name": "x0"}, 2]},
        {"max": [1, 2]},
        {},
        {"const": 1, "axis_name": "x0"},
        {"const": 1.5},
        {"const": "3"},
        {"const": True},
        True,
        2.5,
        "x0",
        None,
        [1, 2],
        {"mul": []},
        {"add": "12"},
        {"mul": 3},
        {"floordiv": [1]},
        {"floordiv": [1, 2, 3]},
        {"axis_name": ""},
        {"axis_name": 3},
        {"runtime_arg_index": "1"},
        {"add": [1, {"pow": [2, 3]}]},
        sympy.Integer(8),  # not an int to torch_npu's parser: "unsupported grouped benchmark expression"
        sympy.S.One,
        sympy.S.Zero,
        {"mul": [sympy.Integer(2), {"axis_name": "x0"}]},
        {"floordiv": [{"const": 8}, sympy.Integer(2)]},
    ],
)
def test_unknown_nodes_fail_closed(payload: object) -> None:
    with pytest.raises(NotBounded) as info:
        expr_from_payload(payload)
    assert info.value.reason is Reason.UNKNOWN_EXPR


def test_bare_int_normalises_to_const() -> None:
    assert expr_to_payload(expr_from_payload(3)) == {"const": 3}
    assert expr_to_payload(expr_from_payload({"mul": [2, {"axis_name": "x0"}]})) == {
        "mul": [{"const": 2}, {"axis_name": "x0"}]
    }


def _normalise(payload: object) -> object:
    if isinstance(payload, int):
        return {"const": payload}
    ((key, value),) = payload.items()  # type: ignore[union-attr]
    if key in ("mul", "add", "floordiv"):
        return {key: [_normalise(v) for v in value]}
    return {key: value}


@settings(max_examples=200, deadline=None)
@given(expr_payloads(AXIS_POOL, runtime=True, depth=3))
def test_payload_round_trip(payload: object) -> None:
    tree = expr_from_payload(payload)
    assert expr_from_payload(expr_to_payload(tree)) == tree
    assert expr_to_payload(tree) == _normalise(payload)


@settings(max_examples=200, deadline=None)
@given(expr_payloads(AXIS_POOL), st.lists(st.integers(1, 50), min_size=len(AXIS_POOL), max_size=len(AXIS_POOL)))
def test_generated_exprs_are_nonnegative_and_use_free_axes(payload: object, values: list[int]) -> None:
    tree = expr_from_payload(payload)
    env = dict(zip(AXIS_POOL, values))
    assert evaluate(tree, env) >= 0
    assert evaluate(tree, {a: env[a] for a in free_axes(tree)}) == evaluate(tree, env)


def test_free_axes() -> None:
    tree = expr_from_payload({"add": [{"axis_name": "x0"}, {"floordiv": [{"axis_name": "r0"}, {"runtime_arg_index": 1}]}]})
    assert free_axes(tree) == {"x0", "r0"}
    assert free_axes(Const(3)) == frozenset()


@pytest.mark.parametrize(
    ("expr", "env", "expected"),
    [
        (S0 * S1 + 3, {"s0": 4, "s1": 5}, 23),
        (TorchFloorDiv(S0, 4), {"s0": 9}, 2),
        (TorchFloorDiv(S0 * S1 + 3, S1 + 1), {"s0": 3, "s1": 4}, 3),
        (CleanDiv(S0 * 4, 3), {"s0": 5}, 6),  # stays a CleanDiv (a FloorDiv subclass)
        (sympy.floor(S0 / 4), {"s0": 11}, 2),
        (S0**2, {"s0": 7}, 49),
        (S0**3 * S1 + S2, {"s0": 2, "s1": 3, "s2": 1}, 25),
        (8 - S0, {"s0": 3}, 5),
        (sympy.Integer(12), {}, 12),
        (12, {}, 12),
    ],
)
def test_from_sympy(expr: sympy.Expr, env: dict[str, int], expected: int) -> None:
    assert evaluate(expr_from_sympy(expr), env) == expected
    if isinstance(expr, sympy.Basic) and expr.free_symbols:
        assert int(expr.subs({sympy.Symbol(k, integer=True, positive=True): v for k, v in env.items()})) == expected


def test_clean_div_is_kept() -> None:
    assert type(CleanDiv(S0 * 4, 3)).__name__ == "CleanDiv"


@pytest.mark.parametrize(
    "expr",
    [
        sympy.Mod(S0, 3),
        sympy.Max(S0, S1),
        sympy.Min(S0, 4),
        sympy.Rational(1, 2),
        sympy.Rational(3, 2) * S0,
        S0 / S1,
        S0**-1,
        S0**S1,
        sympy.Float(1.5),
        sympy.sqrt(S0),
        sympy.true,
        True,
    ],
)
def test_from_sympy_rejects_unsupported(expr: object) -> None:
    with pytest.raises(NotBounded) as info:
        expr_from_sympy(expr)  # type: ignore[arg-type]
    assert info.value.reason is Reason.UNKNOWN_EXPR


_sym_leaves = st.one_of(st.integers(0, 6).map(sympy.Integer), st.sampled_from([S0, S1, S2]))
_sym_exprs = st.recursive(
    _sym_leaves,
    lambda kids: st.one_of(
        st.tuples(kids, kids).map(lambda p: p[0] + p[1]),
        st.tuples(kids, kids).map(lambda p: p[0] * p[1]),
        st.tuples(kids, st.integers(1, 3)).map(lambda p: p[0] ** p[1]),
        st.tuples(kids, st.sampled_from([sympy.Integer(3), S1 + 1])).map(lambda p: TorchFloorDiv(p[0], p[1])),
    ),
    max_leaves=6,
)


@settings(max_examples=100, deadline=None)
@given(_sym_exprs, st.integers(1, 9), st.integers(1, 9), st.integers(1, 9))
def test_from_sympy_agrees_with_sympy(expr: sympy.Expr, a: int, b: int, c: int) -> None:
    expected = expr.subs({S0: a, S1: b, S2: c})
    assert evaluate(expr_from_sympy(expr), {"s0": a, "s1": b, "s2": c}) == int(expected)


def _signed_trees() -> st.SearchStrategy[Expr]:
    """Trees over s0, s1 with constants of either sign: what ``grows`` must not misjudge."""
    leaf = st.one_of(st.integers(-4, 8).map(Const), st.sampled_from(("s0", "s1")).map(Axis))
    return st.recursive(leaf, lambda kids: st.one_of(
        st.lists(kids, min_size=1, max_size=3).map(lambda xs: Add(tuple(xs))),
        st.lists(kids, min_size=1, max_size=3).map(lambda xs: Mul(tuple(xs))),
        st.tuples(kids, kids).map(lambda p: FloorDiv(*p))), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(_signed_trees(), st.tuples(st.integers(1, 50), st.integers(1, 50)), st.tuples(st.integers(0, 50),
                                                                                      st.integers(0, 50)))
def test_an_expression_that_grows_never_shrinks_as_its_axes_grow(expr: Expr, low: tuple[int, int],
                                                                  step: tuple[int, int]) -> None:
    """``grows`` is what lets a size be read at a bucket's upper bound: a shrinking one read there undercounts."""
    high = (low[0] + step[0], low[1] + step[1])
    if not grows(expr):
        return
    try:
        assert evaluate(expr, dict(zip(("s0", "s1"), low))) <= evaluate(expr, dict(zip(("s0", "s1"), high)))
    except NotBounded as exc:  # a division by zero: never read at a bound either
        assert exc.reason is Reason.DIVISION_BY_ZERO


def test_growth_of_each_node() -> None:
    s0 = Axis("s0")
    assert grows(Add((s0, Const(-1)))) and grows(Mul((Const(2), s0, s0))) and grows(FloorDiv(s0, Const(16)))
    assert grows(Mul((Add((Const(2), Const(-1))), s0)))  # a constant factor is judged by its value
    assert not grows(Mul((Const(-1), s0))) and not grows(FloorDiv(Const(4096), s0))
    assert not grows(FloorDiv(s0, Add((Const(1), Const(-2))))) and not grows(Add((s0, RuntimeArg(0))))
