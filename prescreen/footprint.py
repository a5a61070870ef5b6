"""Benchmark memory footprint of a grouped plan over its representative groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from prescreen.errors import NotBounded, Reason
from prescreen.expr import evaluate, free_axes
from prescreen.plan import KernelPlan, SizeArg, TensorArg, WorkspaceArg
from prescreen.representatives import Representatives


@dataclasses.dataclass(frozen=True, slots=True)
class ArgFootprint:
    """Bytes one benchmark argument takes in one group."""

    group_id: int
    name: str
    kind: str
    dtype: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    num_bytes: int

    def to_payload(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        d["size"], d["stride"] = list(self.size), list(self.stride)
        return d

    @staticmethod
    def from_payload(d: object) -> "ArgFootprint":
        """Strictly validate a stored arg footprint; raises ``ValueError`` on anything off."""
        fields = ("group_id", "name", "kind", "dtype", "size", "stride", "num_bytes")
        if not isinstance(d, dict) or set(d) != set(fields):
            raise ValueError(f"dominant_arg must be an object with fields {list(fields)}, got {d!r}")

        def exact_int(v: object, what: str) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"dominant_arg.{what} must be an int, got {v!r}")
            return v

        def ints(key: str) -> tuple[int, ...]:
            v = d[key]
            if not isinstance(v, list):
                raise ValueError(f"dominant_arg.{key} must be a list of ints, got {v!r}")
            return tuple(exact_int(x, f"{key}[]") for x in v)

        for key in ("name", "kind", "dtype"):
            if not isinstance(d[key], str):
                raise ValueError(f"dominant_arg.{key} must be a string, got {d[key]!r}")
        num_bytes = exact_int(d["num_bytes"], "num_bytes")
        if num_bytes < 0:
            raise ValueError(f"dominant_arg.num_bytes must be >= 0, got {num_bytes}")
        return ArgFootprint(
            group_id=exact_int(d["group_id"], "group_id"),
            name=d["name"],
            kind=d["kind"],
            dtype=d["dtype"],
            size=ints("size"),
            stride=ints("stride"),
            num_bytes=num_bytes,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Footprint:
    """Synthetic bytes summed over reachable groups plus the peak mutated clone."""

    synthetic_bytes: int
    mutated_clone_bytes: int
    total_bytes: int
    group_bytes: tuple[tuple[int, int], ...]
    largest_group_id: int | None
    dominant_arg: ArgFootprint | None


def required_storage_numel(size: Sequence[int], stride: Sequence[int]) -> int:
    """Elements a strided tensor's storage needs (PyTorch's computeStorageNbytes)."""
    size, stride = tuple(int(d) for d in size), tuple(int(s) for s in stride)
    if len(size) != len(stride):
        raise NotBounded(Reason.RANK_MISMATCH, f"size/stride rank mismatch: size={size} stride={stride}")
    if any(d < 0 for d in size):
        raise NotBounded(Reason.NEGATIVE_SIZE, f"negative benchmark tensor size {size}")
    if any(s < 0 for s in stride):
        raise NotBounded(Reason.NEGATIVE_STRIDE, f"negative benchmark tensor stride {stride}")
    if any(d == 0 for d in size):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(size, stride))


def dtype_itemsize(name: str) -> int:
    """Item size of a dtype named like ``torch.float16`` or ``float16``."""
    dtype = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise NotBounded(Reason.UNKNOWN_DTYPE, f"unknown dtype {name!r}")
    return int(dtype.itemsize)


def _canonical_dtype(name: str) -> str:
    return str(getattr(torch, name.removeprefix("torch.")))


def _arg_bytes(arg: TensorArg | WorkspaceArg, env: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Size, stride and bytes of one benchmark argument at one group's axis values."""
    if isinstance(arg, TensorArg):
        size = tuple(evaluate(e, env) for e in arg.size)
        stride = tuple(evaluate(e, env) for e in arg.stride)
        return size, stride, required_storage_numel(size, stride) * dtype_itemsize(arg.dtype)
    count = evaluate(arg.count, env)
    if count < 0:
        raise NotBounded(Reason.NEGATIVE_SIZE, f"negative workspace count {count} for {arg.name!r}")
    return (count,), (1,), count * dtype_itemsize(arg.dtype)


def _axes_of(arg: TensorArg | WorkspaceArg) -> tuple[str, ...]:
    exprs = (*arg.size, *arg.stride) if isinstance(arg, TensorArg) else (arg.count,)
    return tuple(sorted(frozenset().union(*(free_axes(e) for e in exprs))))


def estimate_footprint(plan: KernelPlan, reps: Representatives) -> Footprint:
    """Estimate the bytes the grouped autotune benchmark synthesizes; fails closed.

    An argument's bytes depend only on the axes its expressions name, so they
    are computed once per distinct value of those axes and reused across
    groups (most groups differ in axes a given argument does not use). Groups
    and arguments are still visited in order, so the first failure, the
    dominant argument and every tie are exactly those of a plain loop.
    """
    mutated = set(plan.mutated_arg_names)
    args = [a for a in plan.args if not isinstance(a, SizeArg)]
    for arg in args:
        if not isinstance(arg, (TensorArg, WorkspaceArg)):  # pragma: no cover - the plan model admits nothing else
            raise NotBounded(Reason.INVALID_PLAN, f"unsupported arg {arg!r}")
    axes = [_axes_of(a) for a in args]
    memo: list[dict[tuple[int | None, ...], tuple[tuple[int, ...], tuple[int, ...], int]]] = [{} for _ in args]
    synthetic = peak_clone = 0
    group_bytes: list[tuple[int, int]] = []
    dominant: ArgFootprint | None = None
    for group in reps.groups:
        env = dict(group.axis_values)
        current = current_mutated = 0
        for i, arg in enumerate(args):
            key = tuple(env.get(a) for a in axes[i])
            hit = memo[i].get(key)
            if hit is None:
                hit = memo[i][key] = _arg_bytes(arg, env)
            size, stride, nbytes = hit
            current += nbytes
            if arg.name in mutated:
                current_mutated += nbytes
            if dominant is None or nbytes > dominant.num_bytes:
                dominant = ArgFootprint(
                    group.group_id, arg.name, arg.kind, _canonical_dtype(arg.dtype), size, stride, nbytes
                )
        group_bytes.append((group.group_id, current))
        synthetic += current
        peak_clone = max(peak_clone, current_mutated)
    largest = max(group_bytes, key=lambda item: item[1])[0] if group_bytes else None
    return Footprint(synthetic, peak_clone, synthetic + peak_clone, tuple(group_bytes), largest, dominant)
