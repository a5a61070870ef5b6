"""Hypothesis strategies for ``inductor_meta``-shaped grouped plan payloads.

``plan_payloads()`` draws valid plans (every one is boundable, by us and by
torch_npu); ``plan_cases(fail_closed=True)`` may also inject exactly one
fail-closed fault and says which (``PlanCase.fault``) and the ``Reason`` our
estimator must give. Payloads mix lists and tuples and bare-int constants the
way Inductor's own metadata may. Group counts are capped (``max_groups``) so
estimating a drawn plan stays cheap.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from prescreen.errors import Reason

AXIS_POOL: tuple[str, ...] = ("x0", "x1", "y0", "z0", "r0", "r1")
FEATURE_SOURCES: tuple[str, ...] = ("primary_axis", "axis", "outer_product", "reduction_product")
DTYPES: tuple[str, ...] = (
    "torch.bool", "torch.uint8", "torch.int8", "torch.int16", "torch.int32", "torch.int64",
    "torch.float16", "torch.bfloat16", "torch.float32", "torch.float64", "torch.complex64",
    "float16", "int32",
)
ZERO_MODES: tuple[str, ...] = ("NONE", "ZERO_ON_CALL", "ZERO_PER_GRAPH")

#: Each injected fault and the reason our estimator must fail closed with.
FAULTS: dict[str, Reason] = {
    "runtime_dependent_size": Reason.RUNTIME_DEPENDENT,
    "runtime_dependent_workspace": Reason.RUNTIME_DEPENDENT,
    "negative_size": Reason.NEGATIVE_SIZE,
    "negative_stride": Reason.NEGATIVE_STRIDE,
    "negative_workspace": Reason.NEGATIVE_SIZE,
    "division_by_zero": Reason.DIVISION_BY_ZERO,
    "unknown_dtype": Reason.UNKNOWN_DTYPE,
    "unknown_expr": Reason.UNKNOWN_EXPR,
    "missing_axis": Reason.MISSING_AXIS,
    "rank_mismatch": Reason.RANK_MISMATCH,
    "axis_in_two_features": Reason.UNSUPPORTED_GROUPING,
    "several_symbolic_axes": Reason.UNSUPPORTED_GROUPING,
    "empty_buckets": Reason.UNSUPPORTED_GROUPING,
    "nonpositive_static_product": Reason.UNSUPPORTED_GROUPING,
}


@dataclasses.dataclass(frozen=True)
class PlanCase:
    """A drawn plan payload; ``fault`` names the injected fault (None: a valid plan)."""

    payload: dict[str, object]
    fault: str | None = None

    @property
    def reason(self) -> Reason | None:
        return FAULTS[self.fault] if self.fault else None


def upstream_meta() -> dict[str, object]:
    """The plan of torch_npu's own footprint test (a fresh copy each call).

    Footprint: group_bytes ((0, 176), (1, 352)), synthetic 528, mutated clone 32,
    total 560, largest group 1, dominant in_ptr0 with 320 bytes.
    """
    return {
        "kernel_name": "triton_poi_fused_0",
        "group_features": [{"name": "outer", "source": "outer_product", "axis_names": ["x0"], "buckets": [8]}],
        "axis_names": ["x0"],
        "axis_static_values": [],
        "ordered_arg_specs": [
            {"kind": "tensor", "source": "buffer", "name": "out_ptr0", "dtype": "torch.float16", "device": "npu:0",
             "size_exprs": [{"axis_name": "x0"}], "stride_exprs": [{"const": 1}]},
            {"kind": "tensor", "source": "buffer", "name": "in_ptr0", "dtype": "torch.float16", "device": "npu:0",
             "size_exprs": [{"axis_name": "x0"}, {"const": 10}], "stride_exprs": [{"const": 10}, {"const": 1}]},
            {"kind": "size", "source": "axis_expr", "name": "xnumel", "expr": {"axis_name": "x0"}},
        ],
        "mutated_arg_names": ["out_ptr0"],
    }


def _seq(draw: st.DrawFn, items: list[object]) -> list[object] | tuple[object, ...]:
    """The same items as a list or a tuple (Inductor writes both)."""
    return tuple(items) if draw(st.booleans()) else list(items)


def const_exprs(min_value: int = 0, max_value: int = 8) -> st.SearchStrategy[object]:
    """``{"const": n}`` or a bare int."""
    return st.integers(min_value, max_value).flatmap(lambda n: st.sampled_from([n, {"const": n}]))


def expr_payloads(axes: tuple[str, ...], runtime: bool = False, depth: int = 2) -> st.SearchStrategy[object]:
    """Expressions over ``axes`` that evaluate to >= 0 whenever every axis is >= 1.

    Trees are at most ``depth`` operators deep. Floordiv denominators are >= 1
    (a positive constant, an axis, or axis + c). With ``runtime`` a leaf may be
    a ``runtime_arg_index`` (never boundable).
    """
    leaves: list[st.SearchStrategy[object]] = [const_exprs()]
    if axes:
        leaves.append(st.sampled_from(axes).map(lambda a: {"axis_name": a}))
    if runtime:
        leaves.append(st.integers(0, 8).map(lambda i: {"runtime_arg_index": i}))
    leaf = st.one_of(leaves)
    denominators: list[st.SearchStrategy[object]] = [const_exprs(1, 8)]
    if axes:
        axis = st.sampled_from(axes).map(lambda a: {"axis_name": a})
        denominators += [axis, st.tuples(axis, const_exprs()).map(lambda p: {"add": list(p)})]
    tree: st.SearchStrategy[object] = leaf
    for _ in range(depth):
        children = tree
        tree = st.one_of(
            leaf,
            st.lists(children, min_size=1, max_size=3).map(lambda xs: {"mul": xs}),
            st.lists(children, min_size=1, max_size=3).map(lambda xs: {"add": xs}),
            st.tuples(children, st.one_of(denominators)).map(lambda p: {"floordiv": list(p)}),
        )
    return tree


def _contiguous_strides(sizes: list[object]) -> list[object]:
    strides: list[object] = []
    for i in range(len(sizes)):
        rest = sizes[i + 1:]
        strides.append({"const": 1} if not rest else {"mul": list(rest)})
    return strides


@st.composite
def _features(
    draw: st.DrawFn, axes: list[str], max_groups: int
) -> tuple[list[dict[str, object]], dict[str, int], set[str]]:
    """Disjoint features over ``axes``; the static values they need; their symbolic axes."""
    free = list(draw(st.permutations(axes)))
    features: list[dict[str, object]] = []
    statics: dict[str, int] = {}
    symbolic: set[str] = set()
    groups = 1
    for i in range(draw(st.integers(0, 3))):
        if max_groups // groups < 2:
            break
        source = draw(st.sampled_from(FEATURE_SOURCES))
        if source in ("primary_axis", "axis"):
            feature_axes = [free.pop()] if free and draw(st.integers(0, 9)) else []
        else:
            k = draw(st.integers(1, min(3, len(free)))) if free else 0
            feature_axes = [free.pop() for _ in range(k)]
            n_symbolic = draw(st.integers(0, 1)) if feature_axes else 0
            for j, axis in enumerate(feature_axes):
                if j < n_symbolic:
                    symbolic.add(axis)
                else:
                    statics[axis] = draw(st.integers(1, 64))
        n_buckets = draw(st.integers(1, min(16, max_groups // groups - 1)))
        steps = draw(st.lists(st.integers(1, 512), min_size=n_buckets, max_size=n_buckets))
        buckets = [sum(steps[: j + 1]) for j in range(n_buckets)]  # strictly ascending, >= 1
        groups *= n_buckets + 1
        features.append(
            {
                "name": f"f{i}",
                "source": source,
                "axis_names": _seq(draw, list(feature_axes)),
                "buckets": _seq(draw, list(buckets)),
            }
        )
    return features, statics, symbolic


@st.composite
def _args(draw: st.DrawFn, axes: tuple[str, ...], runtime_in_sizes: bool) -> list[dict[str, object]]:
    """1..6 ordered arg specs: tensors (buffer/constant), workspaces, size args."""
    out: list[dict[str, object]] = []
    exprs = expr_payloads(axes)
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(("tensor", "tensor", "tensor", "workspace", "size")))
        if kind == "tensor":
            rank = draw(st.integers(0, 3))
            sizes = [draw(exprs) for _ in range(rank)]
            if draw(st.booleans()):
                strides = _contiguous_strides(sizes)
            else:
                strides = [draw(exprs) for _ in range(rank)]
            out.append(
                {
                    "kind": "tensor",
                    "source": draw(st.sampled_from(("buffer", "constant"))),
                    "name": f"{draw(st.sampled_from(('in_ptr', 'out_ptr')))}{i}",
                    "dtype": draw(st.sampled_from(DTYPES)),
                    "device": "npu:0",
                    "size_exprs": _seq(draw, sizes),
                    "stride_exprs": _seq(draw, strides),
                }
            )
        elif kind == "workspace":
            out.append(
                {
                    "kind": "workspace",
                    "source": "workspace",
                    "name": f"ws_ptr{i}",
                    "count_expr": draw(exprs),
                    "dtype": draw(st.sampled_from(DTYPES)),
                    "device": "npu:0",
                    "zero_mode": draw(st.sampled_from(ZERO_MODES)),
                }
            )
        elif draw(st.booleans()):
            out.append({"kind": "size", "source": "runtime_arg", "name": f"ks{i}", "index": i})
        else:
            # A size arg is never synthesized, so even unboundable expressions are harmless here.
            size_expr = expr_payloads(axes, runtime=True) if runtime_in_sizes else exprs
            out.append({"kind": "size", "source": "axis_expr", "name": f"ks{i}", "expr": draw(size_expr)})
    return out


def _fault_tensor(name: str, sizes: list[object], strides: list[object], dtype: str = "torch.float32") -> dict[str, object]:
    return {
        "kind": "tensor", "source": "buffer", "name": name, "dtype": dtype, "device": "npu:0",
        "size_exprs": sizes, "stride_exprs": strides,
    }


@st.composite
def _inject(draw: st.DrawFn, payload: dict[str, object], fault: str) -> None:
    """Add one fault to ``payload`` (in place); each one fails every group it reaches."""
    axis_names = list(payload["axis_names"])  # type: ignore[call-overload]
    axis = {"axis_name": draw(st.sampled_from(axis_names))}
    features = list(payload["group_features"])  # type: ignore[call-overload]
    args = list(payload["ordered_arg_specs"])  # type: ignore[call-overload]
    statics = list(payload["axis_static_values"])  # type: ignore[call-overload]
    new_arg: dict[str, object] | None = None
    k = draw(st.integers(1, 5))
    if fault == "runtime_dependent_size":
        dim = draw(st.sampled_from([{"runtime_arg_index": k}, {"mul": [axis, {"runtime_arg_index": k}]}]))
        new_arg = _fault_tensor("fault_ptr", [axis, dim], [dim, 1])
    elif fault == "runtime_dependent_workspace":
        new_arg = {
            "kind": "workspace", "source": "workspace", "name": "fault_ws", "dtype": "torch.int32",
            "device": "npu:0", "zero_mode": "NONE", "count_expr": {"add": [axis, {"runtime_arg_index": k}]},
        }
    elif fault == "negative_size":
        dim = draw(st.sampled_from([{"const": -k}, -k, {"mul": [{"const": -k}, axis]}]))
        new_arg = _fault_tensor("fault_ptr", [axis, dim], [1, 1])
    elif fault == "negative_stride":
        new_arg = _fault_tensor("fault_ptr", [axis, axis], [{"mul": [{"const": -k}, axis]}, 1])
    elif fault == "negative_workspace":
        new_arg = {
            "kind": "workspace", "source": "workspace", "name": "fault_ws", "dtype": "torch.uint8",
            "device": "npu:0", "zero_mode": "NONE", "count_expr": {"mul": [{"const": -k}, axis]},
        }
    elif fault == "division_by_zero":
        zero = draw(st.sampled_from([{"const": 0}, 0, {"mul": [axis, {"const": 0}]}]))
        new_arg = _fault_tensor("fault_ptr", [{"floordiv": [axis, zero]}], [1])
    elif fault == "unknown_dtype":
        dtype = draw(st.sampled_from(["torch.float17", "float128x", "torch.Size", "torch.cuda", "", "tensor"]))
        new_arg = _fault_tensor("fault_ptr", [axis], [1], dtype)
    elif fault == "unknown_expr":
        node = draw(st.sampled_from([{"mod": [axis, 3]}, {"max": [axis, 1]}, {"pow": [axis, 2]}, 2.5, "x0", [1, 2]]))
        new_arg = _fault_tensor("fault_ptr", [axis, node], [1, 1])
    elif fault == "missing_axis":
        new_arg = _fault_tensor("fault_ptr", [{"add": [axis, {"axis_name": "q_missing"}]}], [1])
    elif fault == "rank_mismatch":
        new_arg = _fault_tensor("fault_ptr", [axis, axis], draw(st.sampled_from([[1], [axis, 1, 1], []])))
    elif fault == "axis_in_two_features":
        reused = [a for f in features for a in f["axis_names"]]  # type: ignore[index]
        name = draw(st.sampled_from(reused)) if reused else axis_names[0]
        if not reused:
            features.append({"name": "fault_a", "source": "primary_axis", "axis_names": [name], "buckets": [8]})
        features.insert(
            draw(st.integers(0, len(features))),
            {"name": "fault_b", "source": draw(st.sampled_from(FEATURE_SOURCES)), "axis_names": [name], "buckets": [4]},
        )
    elif fault == "several_symbolic_axes":
        axis_names += ["m0", "m1"]
        features.append(
            {"name": "fault", "source": draw(st.sampled_from(FEATURE_SOURCES[2:])), "axis_names": ["m0", "m1"], "buckets": [64]}
        )
    elif fault == "empty_buckets":
        axis_names.append("e0")
        features.append({"name": "fault", "source": draw(st.sampled_from(FEATURE_SOURCES)), "axis_names": ["e0"], "buckets": []})
    elif fault == "nonpositive_static_product":
        axis_names += ["p0", "p1"]
        statics.append(["p1", draw(st.integers(-4, 0))])
        features.append(
            {"name": "fault", "source": draw(st.sampled_from(FEATURE_SOURCES[2:])), "axis_names": ["p0", "p1"], "buckets": [64]}
        )
    else:  # pragma: no cover - FAULTS lists every branch
        raise AssertionError(fault)
    if new_arg is not None:
        args.insert(draw(st.integers(0, len(args))), new_arg)
    payload.update(group_features=features, axis_names=axis_names, ordered_arg_specs=args, axis_static_values=statics)


@st.composite
def plan_cases(
    draw: st.DrawFn, *, fail_closed: bool = False, max_groups: int = 256, extra_keys: bool = False
) -> PlanCase:
    """A grouped plan payload; with ``fail_closed``, half of them carry one fault from ``FAULTS``.

    ``extra_keys`` adds unrelated ``inductor_meta`` keys (``group_enabled`` and
    friends) the plan model must ignore.
    """
    axes = list(draw(st.permutations(AXIS_POOL)))[: draw(st.integers(1, len(AXIS_POOL)))]
    features, statics, symbolic = draw(_features(axes, max_groups))
    for axis in axes:
        if axis not in statics and axis not in symbolic and draw(st.integers(0, 2)) == 0:
            statics[axis] = draw(st.integers(1, 64))
    static_items = list(statics.items())
    static_items = list(draw(st.permutations(static_items)))
    args = draw(_args(tuple(axes), runtime_in_sizes=fail_closed))
    buffer_names = [a["name"] for a in args if a["kind"] != "size"]
    mutated = draw(st.lists(st.sampled_from(buffer_names), unique=True)) if buffer_names else []
    if draw(st.integers(0, 9)) == 0:
        mutated.append("buf_not_an_arg")
    payload: dict[str, object] = {
        "kernel_name": draw(st.sampled_from(("triton_poi_fused_add_0", "triton_red_fused_sum_1", "KERNEL_NAME"))),
        "group_features": _seq(draw, features),
        "axis_names": _seq(draw, list(axes)),
        "axis_static_values": _seq(draw, [_seq(draw, [n, v]) for n, v in static_items]),
        "ordered_arg_specs": _seq(draw, args),
        "mutated_arg_names": _seq(draw, mutated),
    }
    fault = None
    if fail_closed and draw(st.booleans()):
        fault = draw(st.sampled_from(sorted(FAULTS)))
        draw(_inject(payload, fault))
    if extra_keys:
        payload.update(
            group_enabled=True,
            group_template="symbolic_grouped",
            primary_group_axis=axes[0],
            static_split_axes=(),
            extra_launcher_arg_specs=(),
        )
    return PlanCase(payload, fault)


def plan_payloads(
    *, fail_closed: bool = False, max_groups: int = 256, extra_keys: bool = False
) -> st.SearchStrategy[dict[str, object]]:
    """Just the payloads of ``plan_cases``."""
    return plan_cases(fail_closed=fail_closed, max_groups=max_groups, extra_keys=extra_keys).map(lambda c: c.payload)


def free_axes(expr: object) -> frozenset[str]:
    """Axis names a ``prescreen.expr`` tree refers to."""
    from prescreen.expr import Add, Axis, FloorDiv, Mul

    if isinstance(expr, Axis):
        return frozenset((expr.name,))
    if isinstance(expr, (Mul, Add)):
        return frozenset().union(*(free_axes(e) for e in expr.operands))
    if isinstance(expr, FloorDiv):
        return free_axes(expr.numerator) | free_axes(expr.denominator)
    return frozenset()
