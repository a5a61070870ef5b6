"""Benchmark memory footprint of a grouped plan over its representative groups."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy as np

from prescreen.errors import NotBounded, Reason
from prescreen.expr import Add, Axis, Const, Expr, FloorDiv, Mul, evaluate
from prescreen.plan import KernelPlan, SizeArg, TensorArg, WorkspaceArg
from prescreen.representatives import Group, GroupGrid, Representatives


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
        size = tuple(evaluate(e, env) for e in arg.size)
        stride = tuple(evaluate(e, env) for e in arg.stride)
        return size, stride, required_storage_numel(size, stride) * dtype_itemsize(arg.dtype)
    count = evaluate(arg.count, env)
    if count < 0:
        raise NotBounded(Reason.NEGATIVE_SIZE, f"negative workspace count {count} for {arg.name!r}")
    return (count,), (1,), count * dtype_itemsize(arg.dtype)


def _benchmark_args(plan: KernelPlan) -> list[TensorArg | WorkspaceArg]:
    args = [a for a in plan.args if not isinstance(a, SizeArg)]
    for arg in args:
        if not isinstance(arg, (TensorArg, WorkspaceArg)):  # pragma: no cover - the plan model admits nothing else
            raise NotBounded(Reason.INVALID_PLAN, f"unsupported arg {arg!r}")
    return args


def reference_footprint(plan: KernelPlan, reps: Representatives) -> Footprint:
    """The plain loop, group by group and argument by argument (torch_npu's algorithm).

    ``estimate_footprint`` gives exactly this result (or raises exactly this
    error) faster; this one is kept as its specification, for tests, and for
    representatives whose groups are not a grid.
    """
    mutated = set(plan.mutated_arg_names)
    args = _benchmark_args(plan)
    synthetic = peak_clone = 0
    group_bytes: list[tuple[int, int]] = []
    dominant: ArgFootprint | None = None
    for group in reps.groups:
        env = dict(group.axis_values)
        current = current_mutated = 0
        for arg in args:
            size, stride, nbytes = _arg_bytes(arg, env)
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


# --- The vectorized estimator --------------------------------------------------------------------
#
# Every axis value of a group is set by at most one feature (or is the same in
# every group), so an argument's bytes depend only on the features its axes
# belong to. Each expression is evaluated once over those features' choices,
# as a numpy array shaped like the group grid with length 1 along every other
# feature; numpy broadcasting then gives per-group totals, and a sum over the
# grid is an array's sum times the number of groups it is repeated over.
# Python ints stay exact: values are int64 only when an upper bound of every
# intermediate value, and of the sum over all groups, fits; otherwise the same
# code runs on arrays of Python ints (dtype=object).

_INT64_LIMIT = 2**62
#: Grids of at most this many groups are evaluated on Python lists, larger ones with numpy.
_SMALL_GRID = 256

Column = Union[int, "np.ndarray[Any, Any]"]


class _Fails(Exception):
    """This argument fails to evaluate at every group (runtime arg, missing axis, unknown node...)."""


class _Overflow(Exception):
    """Some value may not fit in int64: evaluate this plan with Python ints."""


@dataclasses.dataclass(slots=True)
class _Layout:
    """The reachable groups as a grid: axis values per choice, group ids, and each group's env."""

    shape: tuple[int, ...]
    columns: dict[str, tuple[int | None, tuple[int, ...]]]  # axis -> (grid dim or None, values)
    group_ids: Sequence[int]
    env_at: Callable[[int], dict[str, int]]


def _grid_layout(grid: GroupGrid) -> _Layout:
    ndim = len(grid.features)
    columns: dict[str, tuple[int | None, tuple[int, ...]]] = {}
    for name, (feature, values) in grid.axis_value_table().items():
        if feature is None or len(set(values)) == 1:
            columns[name] = (None, values[:1])
        else:
            columns[name] = (ndim - 1 - feature, values)
    return _Layout(grid.shape, columns, grid.group_ids(), lambda i: dict(grid.group_at(i).axis_values))


def _generic_layout(groups: Sequence[Group]) -> _Layout | None:
    """One grid dimension over the groups themselves; None when groups name different axes."""
    envs = [dict(g.axis_values) for g in groups]
    names = set(envs[0])
    if any(set(env) != names for env in envs):
        return None
    columns: dict[str, tuple[int | None, tuple[int, ...]]] = {}
    for name in names:
        values = tuple(int(env[name]) for env in envs)
        columns[name] = (None, values[:1]) if len(set(values)) == 1 else (0, values)
    return _Layout((len(groups),), columns, [g.group_id for g in groups], lambda i: envs[i])


class _Evaluator:
    """Evaluates expressions over a layout; records where floordiv meets zero."""

    def __init__(self, layout: _Layout, exact: bool) -> None:
        self.exact = exact
        self.dtype: Any = object if exact else np.int64
        self.cols: dict[str, tuple[Column, int]] = {}
        ndim = len(layout.shape)
        for name, (dim, values) in layout.columns.items():
            bound = max(abs(v) for v in values)
            if dim is None:
                self.cols[name] = (values[0], bound)
            else:
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

    def arg_bytes(self, arg: TensorArg | WorkspaceArg) -> tuple[Column, int, Column]:
        """Bytes of ``arg`` per group (int or array), a bound of them, and where it fails (bool or mask)."""
        self.fail = False
        info = _dtype_info(arg.dtype) if isinstance(arg.dtype, str) else None
        if info is None:
            raise _Fails
        itemsize = info[1]
        if isinstance(arg, WorkspaceArg):
            count, bound = self.ev(arg.count)
            if isinstance(count, int):
                if count < 0:
                    raise _Fails
            else:
                self.fail = self.fail | (count < 0)
            return count * itemsize, self.check(bound * itemsize), self.fail
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
            nbytes: Column = 0 if empty else numel * itemsize
        else:
            nbytes = np.where(empty, 0, numel) * itemsize
        return nbytes, self.check(bound * itemsize), self.fail


def _first(mask: Column, shape: tuple[int, ...]) -> int:
    """Flat index (C order over the grid) of the first group where ``mask`` holds; -1 if none."""
    if isinstance(mask, (bool, int, np.bool_)):
        return 0 if mask else -1
    if not mask.any():
        return -1
    return int(np.argmax(np.broadcast_to(mask, shape)))


def _vectorized(
    plan: KernelPlan, args: list[TensorArg | WorkspaceArg], layout: _Layout, exact: bool
) -> Footprint:
    shape = layout.shape
    n_groups = math.prod(shape)
    ev = _Evaluator(layout, exact)
    per_arg: list[tuple[Column, int]] = []
    first_failure = -1
    for arg in args:
        try:
            nbytes, bound, fail = ev.arg_bytes(arg)
        except _Fails:
            first_failure = 0
            break
        at = _first(fail, shape)
        if at >= 0:
            first_failure = at if first_failure < 0 else min(first_failure, at)
        per_arg.append((nbytes, bound))
    if first_failure >= 0:
        env = layout.env_at(first_failure)
        for arg in args:
            _arg_bytes(arg, env)  # raises this group's first failure, exactly as the plain loop would
        raise AssertionError("a failing group evaluated cleanly")  # pragma: no cover
    ev.check(n_groups * sum(b for _, b in per_arg))

    mutated = set(plan.mutated_arg_names)
    total: Column = 0
    clones: Column = 0
    for arg, (nbytes, _) in zip(args, per_arg):
        total = total + nbytes
        if arg.name in mutated:
            clones = clones + nbytes
    totals = np.broadcast_to(np.asarray(total, dtype=ev.dtype), shape).ravel()
    synthetic = int(totals.sum())
    peak_clone = max(0, int(np.max(clones)))
    flat_totals = totals.tolist()
    largest = int(np.argmax(totals))

    dominant: ArgFootprint | None = None
    if args:
        peak = max(int(np.max(b)) for b, _ in per_arg)
        best = (n_groups, len(args))
        for i, (nbytes, _) in enumerate(per_arg):
            if int(np.max(nbytes)) == peak:
                best = min(best, (_first(np.asarray(nbytes) == peak, shape), i))
        at, i = best
        arg = args[i]
        size, stride, nbytes_at = _arg_bytes(arg, layout.env_at(at))
        dominant = ArgFootprint(
            layout.group_ids[at], arg.name, arg.kind, _canonical_dtype(arg.dtype), size, stride, nbytes_at
        )
    ids = layout.group_ids
    group_bytes = tuple(zip(ids, (int(b) for b in flat_totals)))
    return Footprint(synthetic, peak_clone, synthetic + peak_clone, group_bytes, ids[largest], dominant)


# --- The pure-Python path for small grids ---------------------------------------------------------
#
# The same algorithm on lists: numpy's fixed cost per operation (about a
# microsecond) exceeds a small grid's whole evaluation. A column is an int (the
# same in every group) or ``(dims, values)``: values over the listed grid
# dimensions in C order, constant along the others.

PyColumn = Union[int, tuple[tuple[int, ...], list[int]]]


class _PyGrid:
    """Index arithmetic over the grid: expansion between dimension sets, flat group indices."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        self.strides = strides
        self.fail_at = -1

    def index_map(self, dims: tuple[int, ...], target: tuple[int, ...]) -> list[int]:
        """For each position of ``target`` (C order), the position of the same groups in ``dims``."""
        src: dict[int, int] = {}
        step = 1
        for d in reversed(dims):
            src[d] = step
            step *= self.shape[d]
        idx = [0]
        for d in target:
            s = src.get(d, 0)
            idx = [j + i * s for j in idx for i in range(self.shape[d])]
        return idx

    def expand(self, col: tuple[tuple[int, ...], list[int]], target: tuple[int, ...]) -> list[int]:
        dims, values = col
        if dims == target:
            return values
        return [values[i] for i in self.index_map(dims, target)]

    def flat(self, dims: tuple[int, ...], pos: int) -> int:
        """Flat index of the first group holding position ``pos`` of a column over ``dims``."""
        out = 0
        for d in reversed(dims):
            pos, i = divmod(pos, self.shape[d])
            out += i * self.strides[d]
        return out

    def at(self, col: PyColumn, flat: int) -> int:
        """The value of ``col`` in the group with flat index ``flat``."""
        if isinstance(col, int):
            return col
        dims, values = col
        pos = 0
        for d in dims:
            pos = pos * self.shape[d] + (flat // self.strides[d]) % self.shape[d]
        return values[pos]

    def align(
        self, a: PyColumn, b: PyColumn
    ) -> tuple[tuple[int, ...], list[int] | int, list[int] | int]:
        if isinstance(a, int):
            assert not isinstance(b, int)
            return b[0], a, b[1]
        if isinstance(b, int):
            return a[0], a[1], b
        if a[0] == b[0]:
            return a[0], a[1], b[1]
        dims = tuple(sorted(set(a[0]) | set(b[0])))
        return dims, self.expand(a, dims), self.expand(b, dims)

    def failed(self, dims: tuple[int, ...], pos: int) -> None:
        at = self.flat(dims, pos)
        if self.fail_at < 0 or at < self.fail_at:
            self.fail_at = at

    def ev(self, expr: Expr, cols: dict[str, PyColumn]) -> PyColumn:
        kind = type(expr)
        if kind is Const:
            return expr.value  # type: ignore[union-attr]
        if kind is Axis:
            hit = cols.get(expr.name)  # type: ignore[union-attr]
            if hit is None:
                raise _Fails
            return hit
        if kind is Add or kind is Mul:
            operands = expr.operands  # type: ignore[union-attr]
            value = self.ev(operands[0], cols)
            add = kind is Add
            for operand in operands[1:]:
                other = self.ev(operand, cols)
                if isinstance(value, int) and isinstance(other, int):
                    value = value + other if add else value * other
                    continue
                dims, x, y = self.align(value, other)
                if isinstance(x, int):
                    value = (dims, [x + v for v in y] if add else [x * v for v in y])  # type: ignore[union-attr]
                elif isinstance(y, int):
                    value = (dims, [v + y for v in x] if add else [v * y for v in x])
                else:
                    value = (dims, [u + v for u, v in zip(x, y)] if add else [u * v for u, v in zip(x, y)])
            return value
        if kind is FloorDiv:
            num = self.ev(expr.numerator, cols)  # type: ignore[union-attr]
            den = self.ev(expr.denominator, cols)  # type: ignore[union-attr]
            if isinstance(den, int):
                if den == 0:
                    raise _Fails
                if isinstance(num, int):
                    return num // den
                return (num[0], [v // den for v in num[1]])
            dims, x, y = self.align(num, den)
            assert not isinstance(y, int)
            if 0 in y:
                self.failed(dims, y.index(0))
                y = [v or 1 for v in y]
            if isinstance(x, int):
                return (dims, [x // v for v in y])
            return (dims, [u // v for u, v in zip(x, y)])
        raise _Fails

    def nonnegative(self, col: PyColumn) -> None:
        if isinstance(col, int):
            if col < 0:
                raise _Fails
        elif min(col[1]) < 0:
            self.failed(col[0], next(i for i, v in enumerate(col[1]) if v < 0))

    def numel(
        self, arg: TensorArg | WorkspaceArg, cols: dict[str, PyColumn]
    ) -> tuple[PyColumn, list[PyColumn], list[PyColumn]]:
        """Elements per group (the workspace count, or the tensor's storage), and the size and stride columns."""
        if isinstance(arg, WorkspaceArg):
            count = self.ev(arg.count, cols)
            self.nonnegative(count)
            return count, [count], [1]
        ev = self.ev
        sizes = [ev(e, cols) for e in arg.size]
        strides = [ev(e, cols) for e in arg.stride]
        if len(sizes) != len(strides):
            raise _Fails
        lists: list[tuple[tuple[int, ...], list[int]]] = []
        for col in (*sizes, *strides):
            if isinstance(col, int):
                if col < 0:
                    raise _Fails
            else:
                lists.append(col)
                if min(col[1]) < 0:
                    self.failed(col[0], next(i for i, v in enumerate(col[1]) if v < 0))
        if not lists:
            ints = [c for c in sizes if isinstance(c, int)]
            if 0 in ints:
                return 0, sizes, strides
            return 1 + sum((d - 1) * s for d, s in zip(ints, strides) if isinstance(s, int)), sizes, strides
        dims = lists[0][0]
        if any(c[0] != dims for c in lists):
            dims = tuple(sorted({d for c in lists for d in c[0]}))
            n = math.prod(self.shape[d] for d in dims)
        else:
            n = len(lists[0][1])
        acc = [1] * n
        empty: list[list[int]] = []
        for d_col, s_col in zip(sizes, strides):
            s = s_col if isinstance(s_col, int) else self.expand(s_col, dims)
            if isinstance(d_col, int):
                if d_col == 0:
                    return 0, sizes, strides
                d = d_col - 1
                acc = [a + d * s for a in acc] if isinstance(s, int) else [a + d * v for a, v in zip(acc, s)]
                continue
            values = self.expand(d_col, dims)
            if 0 in values:
                empty.append(values)
            if isinstance(s, int):
                acc = [a + (u - 1) * s for a, u in zip(acc, values)]
            else:
                acc = [a + (u - 1) * v for a, u, v in zip(acc, values, s)]
        for values in empty:
            acc = [0 if u == 0 else a for a, u in zip(acc, values)]
        return (dims, acc), sizes, strides


def _small(plan: KernelPlan, args: list[TensorArg | WorkspaceArg], layout: _Layout) -> Footprint:
    grid = _PyGrid(layout.shape)
    cols: dict[str, PyColumn] = {
        name: values[0] if dim is None else ((dim,), list(values)) for name, (dim, values) in layout.columns.items()
    }
    # Arguments with the same expressions (several buffers of one shape) are evaluated once.
    memo: dict[object, tuple[PyColumn, list[PyColumn], list[PyColumn]]] = {}
    per_arg: list[tuple[PyColumn, list[PyColumn], list[PyColumn]]] = []
    for arg in args:
        info = _dtype_info(arg.dtype) if type(arg.dtype) is str else None
        if info is None:
            grid.fail_at = 0
            break
        key = (arg.size, arg.stride) if type(arg) is TensorArg else arg.count  # type: ignore[union-attr]
        hit = memo.get(key)
        if hit is None:
            try:
                hit = memo[key] = grid.numel(arg, cols)
            except _Fails:
                grid.fail_at = 0
                break
        numel, sizes, strides = hit
        itemsize = info[1]
        if isinstance(numel, int):
            per_arg.append((numel * itemsize, sizes, strides))
        elif itemsize == 1:
            per_arg.append(hit)
        else:
            per_arg.append(((numel[0], [v * itemsize for v in numel[1]]), sizes, strides))
    if grid.fail_at >= 0:
        env = layout.env_at(grid.fail_at)
        for arg in args:
            _arg_bytes(arg, env)  # raises this group's first failure, exactly as the plain loop would
        raise AssertionError("a failing group evaluated cleanly")  # pragma: no cover

    mutated = set(plan.mutated_arg_names)
    n_groups = math.prod(layout.shape)
    every = tuple(range(len(layout.shape)))
    totals = _py_sum(grid, [b for b, _, _ in per_arg], n_groups, every)
    if mutated:
        clone_bytes = [b for arg, (b, _, _) in zip(args, per_arg) if arg.name in mutated]
        peak_clone = max(0, max(_py_sum(grid, clone_bytes, n_groups, every))) if clone_bytes else 0
    else:
        peak_clone = 0
    synthetic = sum(totals)
    largest = totals.index(max(totals))

    dominant: ArgFootprint | None = None
    if args:
        peaks = [b if type(b) is int else max(b[1]) for b, _, _ in per_arg]  # type: ignore[index]
        peak = max(peaks)
        best = (n_groups, len(args))
        for i, (nbytes, _, _) in enumerate(per_arg):
            if peaks[i] == peak:
                at = 0 if type(nbytes) is int else grid.flat(nbytes[0], nbytes[1].index(peak))  # type: ignore[index]
                best = min(best, (at, i))
        at, i = best
        arg = args[i]
        _, sizes, strides = per_arg[i]
        dominant = ArgFootprint(
            layout.group_ids[at],
            arg.name,
            arg.kind,
            _canonical_dtype(arg.dtype),
            tuple(grid.at(c, at) for c in sizes),
            tuple(grid.at(c, at) for c in strides),
            peak,
        )
    ids = layout.group_ids
    return Footprint(synthetic, peak_clone, synthetic + peak_clone, tuple(zip(ids, totals)), ids[largest], dominant)


def _py_sum(grid: _PyGrid, columns: list[PyColumn], n_groups: int, every: tuple[int, ...]) -> list[int]:
    """Per-group sum of ``columns``: summed first among columns over the same dimensions, then expanded."""
    if len(columns) == 1:
        only = columns[0]
        return [only] * n_groups if isinstance(only, int) else grid.expand(only, every)
    const = 0
    by_dims: dict[tuple[int, ...], list[int]] = {}
    for col in columns:
        if isinstance(col, int):
            const += col
            continue
        dims, values = col
        acc = by_dims.get(dims)
        by_dims[dims] = values if acc is None else [a + v for a, v in zip(acc, values)]
    totals: list[int] | None = None
    for dims, values in by_dims.items():
        full = grid.expand((dims, values), every)
        totals = full if totals is None else [a + v for a, v in zip(totals, full)]
    if totals is None:
        return [const] * n_groups
    return [t + const for t in totals] if const else totals


def estimate_footprint(plan: KernelPlan, reps: Representatives) -> Footprint:
    """Estimate the bytes the grouped autotune benchmark synthesizes; fails closed.

    Gives exactly what ``reference_footprint`` (the plain loop over groups and
    arguments) gives, including the first failure, the dominant argument and
    every tie, but evaluates each expression once over the groups (see above).
    """
    args = _benchmark_args(plan)
    groups = reps.groups
    if not len(groups):
        return Footprint(0, 0, 0, (), None, None)
    layout = _grid_layout(groups) if isinstance(groups, GroupGrid) else _generic_layout(groups)
    if layout is None:
        return reference_footprint(plan, reps)
    if len(groups) <= _SMALL_GRID:
        return _small(plan, args, layout)
    try:
        return _vectorized(plan, args, layout, exact=False)
    except _Overflow:
        return _vectorized(plan, args, layout, exact=True)
