"""Typed model of a kernel's grouped benchmark plan, and its payload conversion.

The payload is the dict torch_npu's Inductor writes into ``inductor_meta``:
``group_features``, ``axis_names``, ``axis_static_values``, ``ordered_arg_specs``
and ``mutated_arg_names`` (plus ``kernel_name``, which is kept but not hashed).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, TypeVar, Union, get_args

from prescreen.errors import NotBounded, Reason
from prescreen.expr import Expr, expr_from_payload, expr_to_payload, int_of

T = TypeVar("T")
_int = functools.partial(int_of, reason=Reason.INVALID_PLAN)
FeatureSource = Literal["primary_axis", "outer_product", "reduction_product", "axis"]
FEATURE_SOURCES: tuple[str, ...] = get_args(FeatureSource)

#: The keys torch_npu always writes for a grouped kernel; a plan without one is invalid.
PLAN_KEYS: tuple[str, ...] = (
    "group_features", "axis_names", "axis_static_values", "ordered_arg_specs", "mutated_arg_names",
)

#: Other ``inductor_meta`` keys torch_npu writes beside the plan (accepted and ignored in plan files).
NPU_META_KEYS: frozenset[str] = frozenset({
    "kernel_name", "group_enabled", "group_template", "group_workload", "primary_group_axis",
    "static_split_axes", "secondary_runtime_symbolic_axes", "runtime_block_arg_names",
    "tensor_arg_specs", "size_arg_specs", "workspace_arg_specs", "extra_launcher_arg_specs",
})

#: Display-only keys prescreen writes beside a plan (kept, not hashed): ``axis_labels`` names the shape
#: family each axis value stands for (``batch in (2048, 4096]``, see ``prescreen.families``).
DISPLAY_KEYS: frozenset[str] = frozenset({"axis_labels"})

#: kernel_name values Inductor writes before the real name is known.
_NAME_PLACEHOLDERS = ("KERNEL_NAME", "DESCRIPTIVE_NAME", "")


def _bad(detail: str) -> NotBounded:
    return NotBounded(Reason.INVALID_PLAN, detail)


def _seq(value: object, field: str) -> Sequence[object]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _bad(f"{field} must be a list, got {value!r}")
    return value


def _str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{field} must be a string, got {value!r}")
    return value


def _pairs(value: object, field: str, second: Callable[[object, str], T]) -> tuple[tuple[str, T], ...]:
    """``[[name, second], ...]`` as a tuple of pairs."""
    out = []
    for i, item in enumerate(_seq(value, field)):
        pair = _seq(item, f"{field}[{i}]")
        if len(pair) != 2:
            raise _bad(f"{field}[{i}] must be a pair, got {item!r}")
        out.append((_str(pair[0], f"{field}[{i}][0]"), second(pair[1], f"{field}[{i}][1]")))
    return tuple(out)


def _map(value: object, field: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise _bad(f"{field} must be a mapping, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class GroupFeature:
    """One grouping feature: a value bucketed by ascending upper bounds."""

    name: str
    source: FeatureSource
    axis_names: tuple[str, ...]
    buckets: tuple[int, ...]

    @staticmethod
    def from_payload(payload: object, where: str = "group_features[]") -> "GroupFeature":
        m = _map(payload, where)
        source = _str(m.get("source"), f"{where}.source")
        if source not in FEATURE_SOURCES:
            raise _bad(f"{where}.source {source!r} is not one of {', '.join(FEATURE_SOURCES)}")
        buckets = tuple(_int(b, f"{where}.buckets[]") for b in _seq(m.get("buckets"), f"{where}.buckets"))
        if any(later <= earlier for earlier, later in zip(buckets, buckets[1:])):
            raise _bad(f"{where}.buckets must be strictly ascending, got {list(buckets)}")
        axes = tuple(_str(a, f"{where}.axis_names[]") for a in _seq(m.get("axis_names"), f"{where}.axis_names"))
        return GroupFeature(_str(m.get("name"), f"{where}.name"), source, axes, buckets)  # type: ignore[arg-type]

    def to_payload(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "axis_names": list(self.axis_names),
                "buckets": list(self.buckets)}


@dataclasses.dataclass(frozen=True, slots=True)
class TensorArg:
    """A tensor the benchmark synthesizes, from a graph buffer or a constant."""

    name: str
    source: Literal["buffer", "constant"]
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    dtype: str
    device: str

    kind = "tensor"

    def to_payload(self) -> dict[str, object]:
        return {"kind": "tensor", "source": self.source, "name": self.name, "dtype": self.dtype, "device": self.device,
                "size_exprs": [expr_to_payload(e) for e in self.size],
                "stride_exprs": [expr_to_payload(e) for e in self.stride]}


@dataclasses.dataclass(frozen=True, slots=True)
class WorkspaceArg:
    """A scratch buffer of ``count`` elements the kernel needs."""

    name: str
    count: Expr
    dtype: str
    device: str
    zero_mode: str

    kind = "workspace"

    def to_payload(self) -> dict[str, object]:
        return {"kind": "workspace", "source": "workspace", "name": self.name, "count_expr": expr_to_payload(self.count),
                "dtype": self.dtype, "device": self.device, "zero_mode": self.zero_mode}


@dataclasses.dataclass(frozen=True, slots=True)
class SizeArg:
    """A scalar size argument: passed at run time, or an axis expression."""

    name: str
    source: Literal["runtime_arg", "axis_expr"]
    index: int | None = None
    expr: Expr | None = None

    kind = "size"

    def to_payload(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": "size", "source": self.source, "name": self.name}
        if self.source == "runtime_arg":
            out["index"] = self.index
        else:
            assert self.expr is not None
            out["expr"] = expr_to_payload(self.expr)
        return out


ArgSpec = Union[TensorArg, WorkspaceArg, SizeArg]


def _dtype_name(value: object, field: str) -> str:
    """A string, or a ``torch.dtype`` as its string (as torch_npu reads a dtype; not anything that prints like one)."""
    if isinstance(value, str):
        return value
    torch = sys.modules.get("torch")  # not imported here: if torch is not loaded, nothing is a torch.dtype
    if torch is not None and isinstance(value, torch.dtype):
        return str(value)
    raise _bad(f"{field} must be a dtype name or a torch.dtype, got {value!r}")


def arg_from_payload(payload: object, where: str) -> ArgSpec:
    """Parse one ``ordered_arg_specs`` entry."""
    m = _map(payload, where)
    kind, source = m.get("kind"), m.get("source")
    name = _str(m.get("name"), f"{where}.name")
    if kind == "tensor" and source in ("buffer", "constant"):
        size = tuple(expr_from_payload(e) for e in _seq(m.get("size_exprs"), f"{where}.size_exprs"))
        stride = tuple(expr_from_payload(e) for e in _seq(m.get("stride_exprs"), f"{where}.stride_exprs"))
        return TensorArg(name, source, size, stride, _dtype_name(m.get("dtype"), f"{where}.dtype"),
                         str(m.get("device", "")))
    if kind == "workspace" and source == "workspace":
        return WorkspaceArg(name, expr_from_payload(m.get("count_expr")), _dtype_name(m.get("dtype"), f"{where}.dtype"),
                            str(m.get("device", "")), str(m.get("zero_mode", "NONE")))
    if kind == "size" and source == "runtime_arg":
        return SizeArg(name=name, source="runtime_arg", index=_int(m.get("index"), f"{where}.index"))
    if kind == "size" and source == "axis_expr":
        return SizeArg(name=name, source="axis_expr", expr=expr_from_payload(m.get("expr")))
    raise _bad(f"{where} has unsupported kind={kind!r} source={source!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class KernelPlan:
    """Everything the footprint estimator needs to know about one kernel."""

    group_features: tuple[GroupFeature, ...]
    axis_names: tuple[str, ...]
    axis_static_values: tuple[tuple[str, int], ...]
    args: tuple[ArgSpec, ...]
    mutated_arg_names: tuple[str, ...] = ()
    kernel_name: str = ""
    axis_labels: tuple[tuple[str, str], ...] = ()  # (axis, family shown to users); not hashed

    @property
    def is_dynamic(self) -> bool:
        """True when some axis has no static length (a dynamic-shape kernel)."""
        static = {name for name, _ in self.axis_static_values}
        return any(name not in static for name in self.axis_names)

    @staticmethod
    def from_payload(payload: Mapping[str, object], *, unknown_keys: Literal["reject", "ignore"] = "reject") -> "KernelPlan":
        """Validate and convert an ``inductor_meta``-shaped dict.

        Every ``PLAN_KEYS`` key must be there (a missing one would read as an empty plan that tunes). Other
        keys are rejected unless torch_npu writes them (``NPU_META_KEYS``) or ``unknown_keys="ignore"``.
        """
        m = _map(payload, "plan")
        missing = [k for k in PLAN_KEYS if k not in m]
        if missing:
            raise _bad(f"plan is missing {', '.join(map(repr, missing))} (torch_npu always writes {', '.join(PLAN_KEYS)})")
        if unknown_keys == "reject":
            unknown = sorted(str(k) for k in m if k not in PLAN_KEYS and k not in NPU_META_KEYS
                             and k not in DISPLAY_KEYS)
            if unknown:
                raise _bad(f"plan has unknown key(s) {', '.join(map(repr, unknown))}")
        features = tuple(
            GroupFeature.from_payload(f, f"group_features[{i}]")
            for i, f in enumerate(_seq(m["group_features"], "group_features"))
        )
        axis_names = tuple(_str(a, "axis_names[]") for a in _seq(m["axis_names"], "axis_names"))
        raw_statics = m["axis_static_values"]
        if isinstance(raw_statics, Mapping):  # torch_npu writes pairs; it would iterate a mapping's keys
            raise _bad(f"axis_static_values must be a list of [name, value] pairs, got a mapping {dict(raw_statics)!r}")
        args = tuple(
            arg_from_payload(a, f"ordered_arg_specs[{i}]")
            for i, a in enumerate(_seq(m["ordered_arg_specs"], "ordered_arg_specs"))
        )
        mutated = tuple(_str(n, "mutated_arg_names[]") for n in _seq(m["mutated_arg_names"], "mutated_arg_names"))
        name = m.get("kernel_name", "")
        return KernelPlan(
            group_features=features,
            axis_names=axis_names,
            axis_static_values=_pairs(raw_statics, "axis_static_values", _int),
            args=args,
            mutated_arg_names=mutated,
            kernel_name=str(name) if name is not None else "",
            axis_labels=_pairs(m.get("axis_labels", ()), "axis_labels", _str),
        )

    def to_payload(self) -> dict[str, object]:
        """The JSON payload (inverse of ``from_payload``)."""
        payload: dict[str, object] = {
            "kernel_name": self.kernel_name,
            "group_features": [f.to_payload() for f in self.group_features],
            "axis_names": list(self.axis_names),
            "axis_static_values": [[n, v] for n, v in self.axis_static_values],
            "ordered_arg_specs": [a.to_payload() for a in self.args],
            "mutated_arg_names": list(self.mutated_arg_names),
        }
        if self.axis_labels:
            payload["axis_labels"] = [[a, text] for a, text in self.axis_labels]
        return payload

    def canonical_payload(self) -> dict[str, object]:
        """The hashed part: no kernel name or labels, static values (a repeated axis keeps its last value, as the
        estimator does) and mutated names sorted."""
        payload = self.to_payload()
        del payload["kernel_name"]
        payload.pop("axis_labels", None)
        payload["axis_static_values"] = [[n, v] for n, v in sorted(dict(self.axis_static_values).items())]
        payload["mutated_arg_names"] = sorted(set(self.mutated_arg_names))
        return payload

    @property
    def display_name(self) -> str:
        return self.kernel_name if self.kernel_name not in _NAME_PLACEHOLDERS else "<unnamed>"


def canonical_json(value: object) -> str:
    """Deterministic JSON: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
