"""Benchmark memory footprint of a grouped plan over its representative groups."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Union

from prescreen.errors import NotBounded, Reason
from prescreen.expr import Add, Axis, Const, Expr, FloorDiv, Mul, evaluate
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.representatives import GroupGrid, Representatives

if TYPE_CHECKING:  # numpy loads with the first large plan: reading a store never pays for it
    import numpy as np


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
        # Not dataclasses.asdict: it deep-copies every field, a quarter of a store write's own time.
        return {"group_id": self.group_id, "name": self.name, "kind": self.kind, "dtype": self.dtype,
                "size": list(self.size), "stride": list(self.stride), "num_bytes": self.num_bytes}

    @staticmethod
    def from_payload(d: object) -> "ArgFootprint":
        """Strictly validate a stored arg footprint; raises ``ValueError`` on anything off."""
        if not isinstance(d, dict) or d.keys() != _ARG_FIELDS:
            raise ValueError(f"dominant_arg must be an object with fields {sorted(_ARG_FIELDS)}, got {d!r}")
        for key in ("name", "kind", "dtype"):
            if not isinstance(d[key], str):
                raise ValueError(f"dominant_arg.{key} must be a string, got {d[key]!r}")
        for key in ("group_id", "num_bytes"):
            if d[key].__class__ is not int:  # bools too
                raise ValueError(f"dominant_arg.{key} must be an int, got {d[key]!r}")
        if d["num_bytes"] < 0:
            raise ValueError(f"dominant_arg.num_bytes must be >= 0, got {d['num_bytes']}")
        for key in ("size", "stride"):
            v = d[key]
            if v.__class__ is not list or not set(map(type, v)) <= {int}:
                raise ValueError(f"dominant_arg.{key} must be a list of ints, got {v!r}")
        return ArgFootprint(**{**d, "size": tuple(d["size"]), "stride": tuple(d["stride"])})


_ARG_FIELDS = frozenset(f.name for f in dataclasses.fields(ArgFootprint))


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
    size, stride = tuple(map(int, size)), tuple(map(int, stride))
    if len(size) != len(stride):
        raise NotBounded(Reason.RANK_MISMATCH, f"size/stride rank mismatch: size={size} stride={stride}")
    if size and min(size) < 0:
        raise NotBounded(Reason.NEGATIVE_SIZE, f"negative benchmark tensor size {size}")
    if stride and min(stride) < 0:
        raise NotBounded(Reason.NEGATIVE_STRIDE, f"negative benchmark tensor stride {stride}")
    if 0 in size:
        return 0
    return 1 + sum([(d - 1) * s for d, s in zip(size, stride)])


@functools.lru_cache(maxsize=256)
def _dtype_info(name: str) -> tuple[str, int] | None:
    import torch  # here, not at module level: reading a store (inspect, stats) never needs torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        return None
    return str(dtype), int(dtype.itemsize)


def dtype_itemsize(name: str) -> int:
    """Item size of a dtype named like ``torch.float16`` or ``float16``."""
    info = _dtype_info(name) if isinstance(name, str) else None
    if info is None:
        raise NotBounded(Reason.UNKNOWN_DTYPE, f"unknown dtype {name!r}")
    return info[1]


def _canonical_dtype(name: str) -> str:
    info = _dtype_info(name)
    assert info is not None  # only called after dtype_itemsize accepted the name
    return info[0]


def _arg_bytes(arg: TensorArg | WorkspaceArg, env: Mapping[str, int]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Size, stride and bytes of one benchmark argument at one group's axis values."""
    if isinstance(arg, TensorArg):
        size = tuple([evaluate(e, env) for e in arg.size])
        stride = tuple([evaluate(e, env) for e in arg.stride])
        return size, stride, required_storage_numel(size, stride) * dtype_itemsize(arg.dtype)
    count = evaluate(arg.count, env)
    if count < 0:
        raise NotBounded(Reason.NEGATIVE_SIZE, f"negative workspace count {count} for {arg.name!r}")
    return (count,), (1,), count * dtype_itemsize(arg.dtype)


def _benchmark_args(plan: KernelPlan) -> list[TensorArg | WorkspaceArg]:
    """The arguments the benchmark allocates (size arguments are scalars)."""
    return [arg for arg in plan.args if isinstance(arg, (TensorArg, WorkspaceArg))]


def reference_footprint(plan: KernelPlan, reps: Representatives) -> Footprint:
    """The plain loop, group by group and argument by argument (torch_npu's algorithm): the specification
    ``estimate_footprint`` equals, result and error alike."""
    mutated = set(plan.mutated_arg_names)
    args = _benchmark_args(plan)
    synthetic = peak_clone = 0
    group_bytes: list[tuple[int, int]] = []
    best: tuple[int, int, TensorArg | WorkspaceArg, tuple[int, ...], tuple[int, ...]] | None = None
    for group in reps.groups:
        env = dict(group.axis_values)
        current = current_mutated = 0
        for arg in args:
            size, stride, nbytes = _arg_bytes(arg, env)
            current += nbytes
            if arg.name in mutated:
                current_mutated += nbytes
            if best is None or nbytes > best[0]:  # the first of the largest, groups first
                best = (nbytes, group.group_id, arg, size, stride)
        group_bytes.append((group.group_id, current))
        synthetic += current
        peak_clone = max(peak_clone, current_mutated)
    largest = max(group_bytes, key=lambda item: item[1])[0] if group_bytes else None
    dominant = None
    if best is not None:
        nbytes, group_id, arg, size, stride = best
        dominant = ArgFootprint(group_id, arg.name, arg.kind, _canonical_dtype(arg.dtype), size, stride, nbytes)
    return Footprint(synthetic, peak_clone, synthetic + peak_clone, tuple(group_bytes), largest, dominant)


# --- The vectorized estimator --------------------------------------------------------------------
#
# Every axis value is set by at most one feature, so each expression is evaluated once as a numpy array
# shaped like the group grid (length 1 along features it does not use) and broadcasting adds the arguments
# up per group. The first failing group is evaluated again the plain way, raising the loop's exact error.
# int64 is used only where a bound of every intermediate value and of the total fits; else Python ints.

_INT64_LIMIT = 2**62
#: Plans of at most this many group x argument evaluations take the plain loop, larger ones numpy
#: (measured with bench/bench_estimate.py --crossover).
LOOP_MAX = 12

Column = Union[int, "np.ndarray[Any, Any]"]


class _Fails(Exception):
    """This argument fails to evaluate at every group (runtime arg, missing axis, unknown node...)."""


class _Overflow(Exception):
    """Some value may not fit in int64: evaluate this plan with Python ints."""


class _Evaluator:
    """Evaluates expressions over a grid of groups; records where floordiv meets zero."""

    def __init__(self, grid: GroupGrid, exact: bool) -> None:
        import numpy as np

        self.exact = exact
        self.dtype: Any = object if exact else np.int64
        self.cols: dict[str, tuple[Column, int]] = {}
        ndim = len(grid.shape)
        for name, (feature, values) in grid.axis_value_table().items():
            bound = max(abs(v) for v in values)
            if feature is None or len(set(values)) == 1:
                self.cols[name] = (values[0], bound)
            else:
                dim = ndim - 1 - feature  # numpy's axes: the last feature first
                if not exact and bound >= _INT64_LIMIT:
                    raise _Overflow
                shape = [1] * ndim
                shape[dim] = len(values)
                self.cols[name] = (np.array(values, dtype=self.dtype).reshape(shape), bound)
        self.fail: Column = False  # per-element failure mask of the current argument

    def check(self, bound: int) -> int:
        if not self.exact and bound >= _INT64_LIMIT:
            raise _Overflow
        return bound

    def ev(self, expr: Expr) -> tuple[Column, int]:
        """Value (an int, or an array broadcastable over the grid) and a bound of its magnitude."""
        import numpy as np

        kind = type(expr)
        if kind is Const:
            v = expr.value  # type: ignore[union-attr]
            return v, self.check(abs(v))
        if kind is Axis:
            hit = self.cols.get(expr.name)  # type: ignore[union-attr]
            if hit is None:
                raise _Fails
            return hit
        if kind is Mul or kind is Add:
            operands = expr.operands  # type: ignore[union-attr]
            value, bound = self.ev(operands[0])
            if kind is Mul:
                for operand in operands[1:]:
                    v, b = self.ev(operand)
                    bound = self.check(bound * b)
                    value = value * v
            else:
                for operand in operands[1:]:
                    v, b = self.ev(operand)
                    bound = self.check(bound + b)
                    value = value + v
            return value, bound
        if kind is FloorDiv:
            num, bound = self.ev(expr.numerator)  # type: ignore[union-attr]
            den, _ = self.ev(expr.denominator)  # type: ignore[union-attr]
            if isinstance(den, int):
                if den == 0:
                    raise _Fails
                return num // den, bound
            zero = den == 0
            if zero.any():
                self.fail = self.fail | zero
                den = np.where(zero, 1, den)
            return num // den, bound
        raise _Fails  # RuntimeArg (never boundable) or an unknown node

    def numel(self, arg: TensorArg | WorkspaceArg) -> tuple[Column, int, Column]:
        """Elements of ``arg`` per group (int or array), a bound of them, and where it fails (bool or mask)."""
        import numpy as np

        self.fail = False
        if isinstance(arg, WorkspaceArg):
            count, bound = self.ev(arg.count)
            if isinstance(count, int):
                if count < 0:
                    raise _Fails
            else:
                self.fail = self.fail | (count < 0)
            return count, bound, self.fail
        sizes = [self.ev(e) for e in arg.size]
        strides = [self.ev(e) for e in arg.stride]
        if len(sizes) != len(strides):
            raise _Fails
        numel: Column = 1
        empty: Column = False
        bound = 1
        for (d, bd), (s, bs) in zip(sizes, strides):
            for v in (d, s):
                if isinstance(v, int):
                    if v < 0:
                        raise _Fails
                else:
                    self.fail = self.fail | (v < 0)
            bound = self.check(bound + (bd + 1) * bs)
            empty = empty | (d == 0)
            numel = numel + (d - 1) * s
        if isinstance(empty, (bool, np.bool_)):
            return (0 if empty else numel), bound, self.fail
        return np.where(empty, 0, numel), bound, self.fail


def _first(mask: Column, shape: tuple[int, ...]) -> int:
    """Flat index (C order over the grid) of the first group where ``mask`` holds; -1 if none."""
    import numpy as np

    if isinstance(mask, (bool, int, np.bool_)):
        return 0 if mask else -1
    if not mask.any():
        return -1
    return int(np.argmax(np.broadcast_to(mask, shape)))


def _vectorized(plan: KernelPlan, args: list[TensorArg | WorkspaceArg], grid: GroupGrid, exact: bool) -> Footprint:
    import numpy as np

    shape = grid.shape
    n_groups = len(grid)
    ev = _Evaluator(grid, exact)
    distinct = _Distinct(args)
    numels: list[tuple[Column, int]] = []
    first_failure = 0 if distinct.failed else -1
    for arg in distinct.new:
        try:
            numel, bound, fail = ev.numel(arg)
        except _Fails:
            first_failure = 0
            break
        at = _first(fail, shape)
        if at >= 0:
            first_failure = at if first_failure < 0 else min(first_failure, at)
        numels.append((numel, bound))
    if first_failure >= 0:
        _raise_first_failure(args, dict(grid.group_at(first_failure).axis_values))
    weights, clone_weights = distinct.weights(plan.mutated_arg_names)
    ev.check(n_groups * sum(b * w for (_, b), w in zip(numels, weights)))

    total: Column = 0
    clones: Column = 0
    for (numel, _), w, c in zip(numels, weights, clone_weights):
        total = total + numel * w
        if c:
            clones = clones + numel * c
    totals = np.broadcast_to(np.asarray(total, dtype=ev.dtype), shape).ravel()
    synthetic = int(totals.sum())
    peak_clone = max(0, int(np.max(clones)))
    flat_totals = totals.tolist()  # Python ints, from int64 and from object arrays alike
    largest = int(np.argmax(totals))

    dominant: ArgFootprint | None = None
    if args:
        at, i = distinct.dominant(
            [int(np.max(numel)) for numel, _ in numels],
            lambda k, top: _first(np.asarray(numels[k][0]) == top, shape),
        )
        arg = args[i]
        group = grid.group_at(at)
        size, stride, nbytes_at = _arg_bytes(arg, dict(group.axis_values))
        dominant = ArgFootprint(group.group_id, arg.name, arg.kind, _canonical_dtype(arg.dtype), size, stride,
                                nbytes_at)
    ids = grid.group_ids()
    group_bytes = tuple(zip(ids, flat_totals))
    return Footprint(synthetic, peak_clone, synthetic + peak_clone, group_bytes, ids[largest], dominant)


def _raise_first_failure(args: list[TensorArg | WorkspaceArg], env: Mapping[str, int]) -> NoReturn:
    """Evaluate the first failing group the plain way: raises exactly the plain loop's error."""
    for arg in args:
        _arg_bytes(arg, env)
    raise AssertionError("a failing group evaluated cleanly")  # pragma: no cover


class _Distinct:
    """Arguments by distinct expressions (several buffers of one shape share one evaluation): ``keys[i]`` numbers
    argument ``i``'s, ``new`` lists those that bring a new key; both stop at an unknown dtype (``failed``)."""

    def __init__(self, args: list[TensorArg | WorkspaceArg]) -> None:
        self.args = args
        self.keys: list[int] = []
        self.itemsizes: list[int] = []
        self.new: list[TensorArg | WorkspaceArg] = []
        self.failed = False
        seen: dict[object, int] = {}
        for arg in args:
            info = _dtype_info(arg.dtype) if isinstance(arg.dtype, str) else None
            if info is None:
                self.failed = True
                break
            self.itemsizes.append(info[1])
            expr_key = (arg.size, arg.stride) if isinstance(arg, TensorArg) else arg.count
            key = seen.get(expr_key)
            if key is None:
                key = seen[expr_key] = len(self.new)
                self.new.append(arg)
            self.keys.append(key)

    def weights(self, mutated_names: Sequence[str]) -> tuple[list[int], list[int]]:
        """Per key: the item sizes of its arguments summed, and of its mutated arguments."""
        mutated = set(mutated_names)
        if len(self.new) == len(self.keys):  # nothing shared: one key per argument
            return self.itemsizes, [s if a.name in mutated else 0 for a, s in zip(self.args, self.itemsizes)]
        n = len(self.new)
        weights, clones = [0] * n, [0] * n
        for arg, key, itemsize in zip(self.args, self.keys, self.itemsizes):
            weights[key] += itemsize
            if arg.name in mutated:
                clones[key] += itemsize
        return weights, clones

    def dominant(self, peaks: list[int], first: Callable[[int, int], int]) -> tuple[int, int]:
        """(group index, arg index) of the first largest argument, groups first, as the plain loop finds it.

        ``peaks[k]``: key ``k``'s largest element count; ``first(k, n)``: the first group where it has ``n``.
        """
        peak = max(peaks[k] * itemsize for k, itemsize in zip(self.keys, self.itemsizes))
        best = (-1, -1)
        firsts: dict[int, int] = {}
        for i, (k, itemsize) in enumerate(zip(self.keys, self.itemsizes)):
            if peaks[k] * itemsize == peak:
                at = firsts.get(k)
                if at is None:
                    at = firsts[k] = first(k, peaks[k])
                if best[0] < 0 or at < best[0]:
                    best = (at, i)
        return best


def estimate_footprint(plan: KernelPlan, reps: Representatives) -> Footprint:
    """Estimate the bytes the grouped autotune benchmark synthesizes; fails closed. Exactly ``reference_footprint``'s
    result or error, ties included: that loop up to ``LOOP_MAX`` group x argument evaluations, numpy above."""
    args = _benchmark_args(plan)
    if len(reps.grid) * len(args) <= LOOP_MAX:
        return reference_footprint(plan, reps)
    try:
        return _vectorized(plan, args, reps.grid, exact=False)
    except _Overflow:
        return _vectorized(plan, args, reps.grid, exact=True)
