"""Size/stride expression trees: const, axis_name, runtime_arg_index, mul, add, floordiv.

The payload form is torch_npu's in ``inductor_meta`` (``{"const": 3}``, ``{"axis_name": "x0"}``,
``{"runtime_arg_index": 2}``, ``{"mul": [a, ...]}``, ``{"add": [a, ...]}``, ``{"floordiv": [a, b]}``, a bare int).
It accepts a subset of what torch-npu 2.14.0's ``evaluate_grouped_benchmark_expr`` accepts, read to the same
value; forms only torch_npu accepts (a bool, a multi-key dict, an empty ``mul``) fail closed.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Union

from prescreen.errors import NotBounded, Reason

if TYPE_CHECKING:  # pragma: no cover
    import sympy


@dataclasses.dataclass(frozen=True, slots=True)
class Const:
    value: int


@dataclasses.dataclass(frozen=True, slots=True)
class Axis:
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeArg:
    index: int


@dataclasses.dataclass(frozen=True, slots=True)
class Mul:
    operands: tuple["Expr", ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Add:
    operands: tuple["Expr", ...]


@dataclasses.dataclass(frozen=True, slots=True)
class FloorDiv:
    numerator: "Expr"
    denominator: "Expr"


Expr = Union[Const, Axis, RuntimeArg, Mul, Add, FloorDiv]

_NARY: dict[str, type[Mul] | type[Add]] = {"mul": Mul, "add": Add}


def int_of(value: object, what: str, reason: Reason = Reason.UNKNOWN_EXPR) -> int:
    """An int or a sympy Integer as an int; never imports sympy (if it is not loaded, nothing is one)."""
    loaded = sys.modules.get("sympy")
    if loaded is not None and isinstance(value, loaded.Integer):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotBounded(reason, f"{what} must be an int, got {value!r}")
    return int(value)


def expr_from_payload(payload: object) -> Expr:
    """Parse one payload expression; an unknown node (a bare sympy Integer too, as upstream) raises ``NotBounded``."""
    if isinstance(payload, int) and not isinstance(payload, bool):
        return Const(int(payload))
    if not isinstance(payload, Mapping) or len(payload) != 1:
        raise NotBounded(Reason.UNKNOWN_EXPR, f"unsupported grouped benchmark expression {payload!r}")
    ((key, value),) = payload.items()
    if key == "const":
        return Const(int_of(value, "const"))
    if key == "axis_name":
        if not isinstance(value, str) or not value:
            raise NotBounded(Reason.UNKNOWN_EXPR, f"axis_name must be a name, got {value!r}")
        return Axis(value)
    if key == "runtime_arg_index":
        return RuntimeArg(int_of(value, "runtime_arg_index"))
    if key in _NARY:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
            raise NotBounded(Reason.UNKNOWN_EXPR, f"{key} needs a non-empty operand list, got {value!r}")
        return _NARY[key](tuple(expr_from_payload(v) for v in value))
    if key == "floordiv":
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise NotBounded(Reason.UNKNOWN_EXPR, f"floordiv needs two operands, got {value!r}")
        return FloorDiv(expr_from_payload(value[0]), expr_from_payload(value[1]))
    raise NotBounded(Reason.UNKNOWN_EXPR, f"unsupported expression node {key!r}")


def expr_to_payload(expr: Expr) -> dict[str, object]:
    """The JSON payload form of ``expr`` (inverse of ``expr_from_payload``)."""
    kind = type(expr)
    if kind is Const:
        return {"const": expr.value}  # type: ignore[union-attr]
    if kind is Axis:
        return {"axis_name": expr.name}  # type: ignore[union-attr]
    if kind is Mul:
        return {"mul": [expr_to_payload(e) for e in expr.operands]}  # type: ignore[union-attr]
    if kind is Add:
        return {"add": [expr_to_payload(e) for e in expr.operands]}  # type: ignore[union-attr]
    if kind is RuntimeArg:
        return {"runtime_arg_index": expr.index}  # type: ignore[union-attr]
    if kind is FloorDiv:
        return {"floordiv": [expr_to_payload(expr.numerator), expr_to_payload(expr.denominator)]}  # type: ignore[union-attr]
    raise NotBounded(Reason.UNKNOWN_EXPR, f"unsupported expression node {expr!r}")


def evaluate(expr: Expr, env: Mapping[str, int]) -> int:
    """Evaluate ``expr`` with axis values from ``env``; fails closed."""
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Axis):
        if expr.name not in env:
            raise NotBounded(Reason.MISSING_AXIS, f"axis {expr.name!r} has no value in this group")
        return int(env[expr.name])
    if isinstance(expr, RuntimeArg):
        raise NotBounded(
            Reason.RUNTIME_DEPENDENT,
            f"expression depends on runtime argument #{expr.index} and cannot be bounded at codegen",
        )
    if isinstance(expr, Mul):
        product = 1
        for operand in expr.operands:
            product *= evaluate(operand, env)
        return product
    if isinstance(expr, Add):
        return sum(evaluate(operand, env) for operand in expr.operands)
    if isinstance(expr, FloorDiv):
        num = evaluate(expr.numerator, env)
        den = evaluate(expr.denominator, env)
        if den == 0:
            raise NotBounded(Reason.DIVISION_BY_ZERO, f"floordiv by zero ({num} // 0)")
        return num // den
    raise NotBounded(Reason.UNKNOWN_EXPR, f"unsupported expression node {expr!r}")


def grows(expr: Expr) -> bool:
    """True when ``expr`` cannot shrink as its (non-negative) axes grow, so it may be read at a bucket's upper
    bound: sums, products with non-negative constants and floor division by a positive constant of growing
    terms. Anything else (``64 - s0``, ``4096 // s0``, a runtime argument) is read at the hint."""
    return _growth(expr)[0]


def _growth(expr: Expr) -> tuple[bool, int | None]:
    """(``grows(expr)``, its value where it has no axes), in one pass over the tree."""
    if isinstance(expr, Const):
        return True, expr.value
    if isinstance(expr, Axis):
        return True, None
    if isinstance(expr, (Add, Mul)):
        parts = [_growth(e) for e in expr.operands]
        values = [v for _, v in parts if v is not None]
        if len(values) == len(parts):
            return True, sum(values) if isinstance(expr, Add) else math.prod(values)
        if isinstance(expr, Add):
            return all(g for g, _ in parts), None
        return all(g if v is None else v >= 0 for g, v in parts), None
    if isinstance(expr, FloorDiv):
        (up, num), (_, den) = _growth(expr.numerator), _growth(expr.denominator)
        if num is not None and den:
            return True, num // den
        return up and den is not None and den > 0, None
    return False, None


def expr_from_sympy(expr: sympy.Expr | int) -> Expr:
    """A sympy expression as a tree, each symbol an axis of its name (``Mod``, ``Max``, rationals... raise)."""
    import sympy

    if isinstance(expr, bool):
        raise NotBounded(Reason.UNKNOWN_EXPR, f"unsupported sympy node {expr!r}")
    if isinstance(expr, int):
        return Const(expr)
    if isinstance(expr, sympy.Integer):
        return Const(int(expr))
    if isinstance(expr, sympy.Symbol):
        return Axis(expr.name)
    if isinstance(expr, sympy.Add):
        return Add(tuple(expr_from_sympy(a) for a in expr.args))
    if isinstance(expr, sympy.Mul):
        return Mul(tuple(expr_from_sympy(a) for a in expr.args))
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        if isinstance(exp, sympy.Integer) and int(exp) >= 1:
            term = expr_from_sympy(base)
            return Mul(tuple(term for _ in range(int(exp))))
        raise NotBounded(Reason.UNKNOWN_EXPR, f"unsupported power {expr}")
    # torch.utils._sympy.functions.FloorDiv and its exact-division subclass CleanDiv.
    if any(cls.__name__ == "FloorDiv" for cls in type(expr).__mro__) and len(expr.args) == 2:
        num, den = expr.args
        return FloorDiv(expr_from_sympy(num), expr_from_sympy(den))
    if isinstance(expr, sympy.floor) and isinstance(expr.args[0], sympy.Mul):
        num, den = sympy.fraction(expr.args[0])
        if den != 1:
            return FloorDiv(expr_from_sympy(num), expr_from_sympy(den))
    raise NotBounded(Reason.UNKNOWN_EXPR, f"unsupported sympy node {type(expr).__name__}: {expr}")
