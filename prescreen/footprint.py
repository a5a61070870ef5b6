"""Benchmark memory footprint of a grouped plan over its representative groups."""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Union

from prescreen.errors import NotBounded, Reason
from prescreen.expr import Add, Axis, Const, Expr, FloorDiv, Mul, evaluate
from prescreen.plan import KernelPlan, SizeArg, TensorArg, WorkspaceArg
from prescreen.representatives import SINGLE, STATIC, Group, GroupGrid, Representatives, RepsProgram

if TYPE_CHECKING:  # numpy loads with the first large grid: reading a store never pays for it
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
        return ArgFootprint(
            group_id=d["group_id"],
            name=d["name"],
            kind=d["kind"],
            dtype=d["dtype"],
            size=tuple(d["size"]),
            stride=tuple(d["stride"]),
            num_bytes=d["num_bytes"],
        )


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
    args: list[TensorArg | WorkspaceArg] = []
    for arg in plan.args:
        if isinstance(arg, (TensorArg, WorkspaceArg)):
            args.append(arg)
        elif not isinstance(arg, SizeArg):  # pragma: no cover - the plan model admits nothing else
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
# feature; numpy broadcasting then adds the arguments up into per-group totals.
# Where some group fails (a zero denominator, a negative size), the first such
# group in group order is evaluated again the plain way, which raises exactly
# the plain loop's error. Numbers stay exact: int64 is used only when an upper
# bound of every intermediate value, and of the sum over all groups, fits;
# otherwise the same code runs on arrays of Python ints (dtype=object).

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
        import numpy as np

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


def _vectorized(
    plan: KernelPlan, args: list[TensorArg | WorkspaceArg], layout: _Layout, exact: bool
) -> Footprint:
    import numpy as np

    shape = layout.shape
    n_groups = math.prod(shape)
    ev = _Evaluator(layout, exact)
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
        _raise_first_failure(args, layout.env_at(first_failure))
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
        size, stride, nbytes_at = _arg_bytes(arg, layout.env_at(at))
        dominant = ArgFootprint(
            layout.group_ids[at], arg.name, arg.kind, _canonical_dtype(arg.dtype), size, stride, nbytes_at
        )
    ids = layout.group_ids
    group_bytes = tuple(zip(ids, flat_totals))
    return Footprint(synthetic, peak_clone, synthetic + peak_clone, group_bytes, ids[largest], dominant)


def _raise_first_failure(args: list[TensorArg | WorkspaceArg], env: Mapping[str, int]) -> NoReturn:
    """Evaluate the first failing group the plain way: raises exactly the plain loop's error."""
    for arg in args:
        _arg_bytes(arg, env)
    raise AssertionError("a failing group evaluated cleanly")  # pragma: no cover


class _Distinct:
    """Arguments by distinct expressions: several buffers of one shape share one evaluation.

    ``keys[i]`` numbers argument ``i``'s distinct size/stride (or count)
    expressions and ``new`` lists, in order, the arguments that bring a new
    key; both stop before the first argument of unknown dtype (which fails in
    every group; ``failed`` says so). Hashing and comparing expressions costs
    about what evaluating them on a tiny grid does, so with ``share=False``
    every argument is its own key.
    """

    def __init__(self, args: list[TensorArg | WorkspaceArg], share: bool = True) -> None:
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
            if share:
                expr_key = (arg.size, arg.stride) if isinstance(arg, TensorArg) else arg.count
                key = seen.get(expr_key)
                if key is None:
                    key = seen[expr_key] = len(self.new)
                    self.new.append(arg)
                self.keys.append(key)
            else:
                self.keys.append(len(self.new))
                self.new.append(arg)

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

        ``peaks[k]``: the largest element count of key ``k``; ``first(k, n)``:
        the first group where key ``k`` has ``n`` elements. Item sizes are
        positive, so an argument is largest where its element count is.
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


# --- The pure-Python path for small grids ---------------------------------------------------------
#
# The same algorithm on lists: numpy's fixed cost per operation (about a
# microsecond) exceeds a small grid's whole evaluation. A column is an int (the
# same in every group) or a list with one value per group, in group order.

FlatColumn = Union[int, list[int]]


class _Flat:
    """Evaluates expressions over the groups of a small grid; ``fail_at`` is the first group that fails."""

    def __init__(self, layout: _Layout) -> None:
        shape = layout.shape
        n = math.prod(shape)
        self.n = n
        self.fail_at = -1
        cols: dict[str, FlatColumn] = {}
        for name, (dim, values) in layout.columns.items():
            if dim is None:
                cols[name] = values[0]
                continue
            inner = math.prod(shape[dim + 1:])
            column = [v for v in values for _ in range(inner)] if inner > 1 else list(values)
            cols[name] = column * (n // len(column))
        self.cols = cols

    def failed(self, at: int) -> None:
        if self.fail_at < 0 or at < self.fail_at:
            self.fail_at = at

    def ev(self, expr: Expr) -> FlatColumn:
        kind = type(expr)
        if kind is Const:
            return expr.value  # type: ignore[union-attr]
        if kind is Axis:
            hit = self.cols.get(expr.name)  # type: ignore[union-attr]
            if hit is None:
                raise _Fails
            return hit
        if kind is Add or kind is Mul:
            operands = expr.operands  # type: ignore[union-attr]
            x = self.ev(operands[0])
            add = kind is Add
            for operand in operands[1:]:
                y = self.ev(operand)
                if isinstance(x, int):
                    if isinstance(y, int):
                        x = x + y if add else x * y
                    else:
                        x = [x + v for v in y] if add else [x * v for v in y]
                elif isinstance(y, int):
                    x = [v + y for v in x] if add else [v * y for v in x]
                else:
                    x = [u + v for u, v in zip(x, y)] if add else [u * v for u, v in zip(x, y)]
            return x
        if kind is FloorDiv:
            num = self.ev(expr.numerator)  # type: ignore[union-attr]
            den = self.ev(expr.denominator)  # type: ignore[union-attr]
            if isinstance(den, int):
                if den == 0:
                    raise _Fails
                return num // den if isinstance(num, int) else [v // den for v in num]
            if 0 in den:
                self.failed(den.index(0))
                den = [v or 1 for v in den]
            return [num // v for v in den] if isinstance(num, int) else [u // v for u, v in zip(num, den)]
        raise _Fails  # RuntimeArg (never boundable) or an unknown node

    def nonnegative(self, col: FlatColumn) -> None:
        if isinstance(col, int):
            if col < 0:
                raise _Fails
        elif min(col) < 0:
            self.failed(next(i for i, v in enumerate(col) if v < 0))

    def numel(self, arg: TensorArg | WorkspaceArg) -> tuple[FlatColumn, list[FlatColumn], list[FlatColumn]]:
        """Elements per group (the workspace count, or the tensor's storage), and the size and stride columns."""
        if isinstance(arg, WorkspaceArg):
            count = self.ev(arg.count)
            self.nonnegative(count)
            return count, [count], [1]
        ev = self.ev
        sizes = [ev(e) for e in arg.size]
        strides = [ev(e) for e in arg.stride]
        if len(sizes) != len(strides):
            raise _Fails
        varying = False
        for col in (*sizes, *strides):
            if isinstance(col, int):
                if col < 0:
                    raise _Fails
            else:
                varying = True
                if min(col) < 0:
                    self.failed(next(i for i, v in enumerate(col) if v < 0))
        if not varying:
            if 0 in sizes:
                return 0, sizes, strides
            return 1 + sum((d - 1) * s for d, s in zip(sizes, strides)), sizes, strides  # type: ignore[operator, misc]
        acc: FlatColumn = 1
        empty: list[list[int]] = []
        for d, s in zip(sizes, strides):
            if isinstance(d, int):
                if d == 0:
                    return 0, sizes, strides
                term: FlatColumn = (d - 1) * s if isinstance(s, int) else [(d - 1) * v for v in s]
            else:
                if 0 in d:
                    empty.append(d)
                term = [(u - 1) * s for u in d] if isinstance(s, int) else [(u - 1) * v for u, v in zip(d, s)]
            if isinstance(acc, int):
                acc = acc + term if isinstance(term, int) else [acc + v for v in term]
            else:
                acc = [a + term for a in acc] if isinstance(term, int) else [a + v for a, v in zip(acc, term)]
        assert not isinstance(acc, int)  # some size or stride varies
        for d in empty:
            acc = [0 if u == 0 else a for a, u in zip(acc, d)]
        return acc, sizes, strides


def _small(plan: KernelPlan, args: list[TensorArg | WorkspaceArg], layout: _Layout) -> Footprint:
    flat = _Flat(layout)
    distinct = _Distinct(args, share=len(args) > 2)
    numels: list[tuple[FlatColumn, list[FlatColumn], list[FlatColumn]]] = []
    if distinct.failed:
        flat.fail_at = 0
    for arg in distinct.new:
        try:
            numels.append(flat.numel(arg))
        except _Fails:
            flat.fail_at = 0
            break
    if flat.fail_at >= 0:
        _raise_first_failure(args, layout.env_at(flat.fail_at))

    n = flat.n
    weights, clone_weights = distinct.weights(plan.mutated_arg_names)
    totals = _flat_sum([(numel, w) for (numel, _, _), w in zip(numels, weights)], n)
    clone_parts = [(numel, c) for (numel, _, _), c in zip(numels, clone_weights) if c]
    peak_clone = max(0, max(_flat_sum(clone_parts, n))) if clone_parts else 0
    synthetic = sum(totals)
    largest = totals.index(max(totals))

    dominant: ArgFootprint | None = None
    if args:
        peaks = [numel if isinstance(numel, int) else max(numel) for numel, _, _ in numels]

        def first(k: int, top: int) -> int:
            numel = numels[k][0]
            return 0 if isinstance(numel, int) else numel.index(top)

        at, i = distinct.dominant(peaks, first)
        arg = args[i]
        _, sizes, strides = numels[distinct.keys[i]]
        nbytes = peaks[distinct.keys[i]] * distinct.itemsizes[i]
        dominant = ArgFootprint(
            layout.group_ids[at],
            arg.name,
            arg.kind,
            _canonical_dtype(arg.dtype),
            tuple([c if isinstance(c, int) else c[at] for c in sizes]),
            tuple([c if isinstance(c, int) else c[at] for c in strides]),
            nbytes,
        )
    ids = layout.group_ids
    return Footprint(synthetic, peak_clone, synthetic + peak_clone, tuple(zip(ids, totals)), ids[largest], dominant)


def _flat_sum(parts: list[tuple[FlatColumn, int]], n: int) -> list[int]:
    """Per-group sum of ``column * weight`` over ``parts``."""
    const = 0
    lists: list[list[int]] = []
    for col, w in parts:
        if isinstance(col, int):
            const += col * w
        elif w == 1:
            lists.append(col)
        elif w:
            lists.append([v * w for v in col])
    if not lists:
        return [const] * n
    totals = lists[0] if len(lists) == 1 else [sum(t) for t in zip(*lists)]
    return [t + const for t in totals] if const else totals


# --- The compiled path ----------------------------------------------------------------------------
#
# Most plans' expressions are sums, products and floordivs by non-zero constants
# over the axes, with known dtypes. For those, what the evaluation needs from
# the plan alone (each distinct argument's size and stride expressions turned
# into closures over the feature columns, with constant parts folded; item
# sizes, weights of shared expressions and mutated clones; names and dtypes of
# the dominant-argument candidates) is worked out once per plan object and kept
# on it (``KernelPlan.cache``). Each call then computes the axis columns from
# the representatives it is given and evaluates every distinct argument over
# them. The general path above runs wherever this one does not apply: a plan
# with an expression that can fail in some group (a runtime argument, a missing
# axis, an unknown node or dtype, a floordiv by a non-constant or by zero, a
# rank mismatch, a negative constant size), representatives not built by the
# compiled ``build_representatives`` for this very plan object, a grid of more
# than ``_SMALL_GRID`` groups, or a call where some size or stride comes out
# negative (the general path then raises the plain loop's exact error).

ColumnFn = Callable[[list[list[int]]], list[int]]
Compiled = Union[int, ColumnFn]


class _Unsupported(Exception):
    """The compiled path does not cover this plan (the general path decides it)."""


class _Negative(Exception):
    """A size or stride is negative in some group: the general path raises the plain loop's error."""


def _compile_expr(
    expr: Expr, slots: Mapping[str, int], constants: Mapping[str, int], shared: dict[Expr, Compiled] | None = None
) -> Compiled:
    """An int (the same in every group) or a function of the feature columns giving one value per group.

    With ``shared``, equal expressions of one plan compile to one function (the dominant
    argument's size and stride parts are then evaluated once each).
    """
    kind = type(expr)
    if shared is not None and kind is not Const:  # (1 == True: constants are not shared)
        try:
            found = shared.get(expr)
        except TypeError:  # a hand-built expression holding a list: compiled on its own
            return _compile_expr(expr, slots, constants)
        if found is None:
            found = shared[expr] = _compile_expr(expr, slots, constants)
        return found
    if kind is Const:
        return expr.value  # type: ignore[union-attr]
    if kind is Axis:
        name = expr.name  # type: ignore[union-attr]
        if name in slots:
            return operator.itemgetter(slots[name])
        if name in constants:
            return constants[name]
        raise _Unsupported
    if kind is Add or kind is Mul:
        add = kind is Add
        const = 0 if add else 1
        fns: list[ColumnFn] = []
        for operand in expr.operands:  # type: ignore[union-attr]
            part = _compile_expr(operand, slots, constants)
            if isinstance(part, int):
                const = const + part if add else const * part
            else:
                fns.append(part)
        if not fns or (not add and const == 0):  # nothing here can fail, so x * 0 is 0
            return const
        return _nary(fns, const, add)
    if kind is FloorDiv:
        num = _compile_expr(expr.numerator, slots, constants)  # type: ignore[union-attr]
        den = _compile_expr(expr.denominator, slots, constants)  # type: ignore[union-attr]
        if not isinstance(den, int) or den == 0:
            raise _Unsupported
        if isinstance(num, int):
            return num // den
        return _floordiv(num, den)
    raise _Unsupported  # RuntimeArg, or an unknown node


def _nary(fns: list[ColumnFn], const: int, add: bool) -> ColumnFn:
    if len(fns) == 1:
        f = fns[0]
        if add:
            return f if const == 0 else (lambda cols: [v + const for v in f(cols)])
        return f if const == 1 else (lambda cols: [v * const for v in f(cols)])
    first, rest = fns[0], fns[1:]

    def combine(cols: list[list[int]]) -> list[int]:
        acc = first(cols)
        for f in rest:
            acc = [u + v for u, v in zip(acc, f(cols))] if add else [u * v for u, v in zip(acc, f(cols))]
        if add:
            return acc if const == 0 else [v + const for v in acc]
        return acc if const == 1 else [v * const for v in acc]

    return combine


def _floordiv(num: ColumnFn, den: int) -> ColumnFn:
    return lambda cols: [v // den for v in num(cols)]


def _nonneg(expr: Expr, safe: frozenset[str], constants: Mapping[str, int]) -> bool:
    """True when ``expr`` is >= 0 in every group: its column needs no check (``safe``: axes never negative)."""
    kind = type(expr)
    if kind is Const:
        return expr.value >= 0  # type: ignore[union-attr]
    if kind is Axis:
        name = expr.name  # type: ignore[union-attr]
        return name in safe or constants.get(name, -1) >= 0
    if kind is Add or kind is Mul:
        return all(_nonneg(e, safe, constants) for e in expr.operands)  # type: ignore[union-attr]
    if kind is FloorDiv:
        den = expr.denominator  # type: ignore[union-attr]
        return type(den) is Const and den.value > 0 and _nonneg(expr.numerator, safe, constants)  # type: ignore[union-attr]
    return False


NumelFn = Callable[[list[Any]], list[int]]


def _checked(f: ColumnFn) -> ColumnFn:
    """``f``, raising ``_Negative`` where some value is negative."""

    def check(cols: list[Any]) -> list[int]:
        col = f(cols)
        if min(col) < 0:
            raise _Negative
        return col

    return check


def _compile_numel(
    arg: TensorArg | WorkspaceArg, slots: Mapping[str, int], constants: Mapping[str, int], safe: frozenset[str],
    shared: dict[Expr, Compiled],
) -> tuple[int | NumelFn, tuple[Compiled, ...], tuple[Compiled, ...]]:
    """Elements per group (an int, or a function of the feature columns), and the size and stride parts."""

    def checked(part: ColumnFn, expr: Expr) -> ColumnFn:
        return part if _nonneg(expr, safe, constants) else _checked(part)

    if isinstance(arg, WorkspaceArg):
        count = _compile_expr(arg.count, slots, constants, shared)
        if isinstance(count, int):
            if count < 0:
                raise _Unsupported
            return count, (count,), (1,)
        return checked(count, arg.count), (count,), (1,)
    if len(arg.size) != len(arg.stride):
        raise _Unsupported
    sizes = tuple(_compile_expr(e, slots, constants, shared) for e in arg.size)
    strides = tuple(_compile_expr(e, slots, constants, shared) for e in arg.stride)
    base = 1
    empty = False
    dims: list[tuple[Compiled, Compiled]] = []  # the dims that vary, their columns checked where they can be < 0
    for d, s, d_expr, s_expr in zip(sizes, strides, arg.size, arg.stride):
        if isinstance(d, int) and d < 0 or isinstance(s, int) and s < 0:
            raise _Unsupported  # negative in every group: the general path raises it
        if isinstance(d, int) and d == 0:
            empty = True  # zero elements in every group (a varying stride is still checked)
        if isinstance(d, int) and isinstance(s, int):
            if d != 0:
                base += (d - 1) * s
        else:
            dims.append((d if isinstance(d, int) else checked(d, d_expr), s if isinstance(s, int) else checked(s, s_expr)))
    if not dims:
        return (0 if empty else base), sizes, strides
    if len(dims) == 1 and not empty:  # the common case: one varying dim
        d, s = dims[0]
        if isinstance(s, int):  # 1 + ... + (u - 1) * s, zero where u == 0
            assert not isinstance(d, int)
            size_col, offset = d, base - s

            def one_size(cols: list[Any]) -> list[int]:
                col = size_col(cols)
                if 0 in col:
                    return [0 if u == 0 else u * s + offset for u in col]
                return [u * s + offset for u in col]

            return one_size, sizes, strides
        if isinstance(d, int):  # 1 + ... + (d - 1) * v, d > 0 here
            stride_col, factor = s, d - 1
            return (lambda cols: [v * factor + base for v in stride_col(cols)]), sizes, strides
    terms = [_term(d, s) for d, s in dims]
    if empty:

        def nothing(cols: list[Any]) -> list[int]:
            for term in terms:  # evaluated for their checks only
                out = term(cols)
            return [0] * len(out[1] if out.__class__ is tuple else out)

        return nothing, sizes, strides
    if len(terms) == 2:
        t0, t1 = terms

        def two(cols: list[Any]) -> list[int]:
            x, y = t0(cols), t1(cols)
            if x.__class__ is list and y.__class__ is list:
                return [u + v + base for u, v in zip(x, y)]
            return _combine([x, y], base)

        return two, sizes, strides
    return (lambda cols: _combine([term(cols) for term in terms], base)), sizes, strides


TermFn = Callable[[list[Any]], Union[list[int], tuple[list[int], list[int]]]]


def _term(d: Compiled, s: Compiled) -> TermFn:
    """``(size - 1) * stride`` per group for one dim where either varies; ``(sizes, terms)`` where a size is 0.

    The columns come checked (``_checked``) wherever they might be negative."""
    if isinstance(d, int):  # d > 0 here (0 makes the tensor empty, negative is refused)
        assert not isinstance(s, int)
        stride_col, factor = s, d - 1
        return lambda cols: [v * factor for v in stride_col(cols)]
    size_col = d
    if isinstance(s, int):

        def size_term(cols: list[Any]) -> list[int] | tuple[list[int], list[int]]:
            dc = size_col(cols)
            out = [u * s - s for u in dc]
            return (dc, out) if 0 in dc else out

        return size_term
    stride_col = s

    def both_term(cols: list[Any]) -> list[int] | tuple[list[int], list[int]]:
        dc = size_col(cols)
        out = [(u - 1) * v for u, v in zip(dc, stride_col(cols))]
        return (dc, out) if 0 in dc else out

    return both_term


def _combine(parts: list[list[int] | tuple[list[int], list[int]]], base: int) -> list[int]:
    """``base`` plus the terms per group, zero where some size is zero."""
    zeros = [p[0] for p in parts if p.__class__ is tuple]
    cols = [p[1] if p.__class__ is tuple else p for p in parts]
    acc = cols[0] if len(cols) == 1 else [sum(t) for t in zip(*cols)]
    column = [base + a for a in acc]  # type: ignore[operator]
    for dc in zeros:
        column = [0 if u == 0 else a for a, u in zip(column, dc)]
    return column


class FootprintProgram:
    """A plan's arguments compiled against its representatives' program (see above).

    Per distinct argument (``key``): its element count, a constant or a function of the
    feature columns; the item sizes of its arguments summed (``weights``) and of its
    mutated ones (``clone_weights``); and the one of its arguments that can be the
    dominant one (the largest item size, the first of equals). Constant keys are
    summed here once; ``varying`` lists the others.
    """

    __slots__ = ("reps_program", "varying", "const_bytes", "const_clone", "const_best", "shapes", "best_item",
                 "best_arg", "names", "kinds", "dtypes", "has_args", "first_key", "line")

    def __init__(self, plan: KernelPlan, reps_program: RepsProgram) -> None:
        self.reps_program = reps_program
        args = _benchmark_args(plan)
        base = reps_program.base_values  # the plan's axes: a group has a value for these only
        slots = {axis: f for f, axis in enumerate(reps_program.varying_axes) if axis is not None and axis in base}
        constants = {a: v for a, v in base.items() if a not in slots}
        distinct = _Distinct(args)
        if distinct.failed:
            raise _Unsupported
        safe = frozenset(  # axes whose columns are never negative: a feature's buckets from 0 up, a solved axis
            axis for axis, spec in zip(reps_program.varying_axes, reps_program.features)
            if axis in slots and (spec[0] != SINGLE or spec[1][0] >= 0)
        )
        shared: dict[Expr, Compiled] = {}
        compiled = [_compile_numel(arg, slots, constants, safe, shared) for arg in distinct.new]
        weights, clone_weights = distinct.weights(plan.mutated_arg_names)
        self.best_item = [0] * len(compiled)
        self.best_arg = [0] * len(compiled)
        for i, (k, itemsize) in enumerate(zip(distinct.keys, distinct.itemsizes)):
            if itemsize > self.best_item[k]:
                self.best_item[k], self.best_arg[k] = itemsize, i
        self.shapes = [(c[1], c[2]) for c in compiled]
        self.varying: list[tuple[int, NumelFn, int, int]] = []
        self.const_bytes = self.const_clone = 0
        self.const_best = (-1, -1)  # (bytes, key) of the largest constant key's dominant candidate
        for k, (numel, _, _) in enumerate(compiled):
            if isinstance(numel, int):
                self.const_bytes += numel * weights[k]
                self.const_clone += numel * clone_weights[k]
                candidate = (numel * self.best_item[k], k)
                if candidate[0] > self.const_best[0] or (
                    candidate[0] == self.const_best[0] and self.best_arg[k] < self.best_arg[self.const_best[1]]
                ):
                    self.const_best = candidate
            else:
                self.varying.append((k, numel, weights[k], clone_weights[k]))
        self.has_args = bool(args)
        self.first_key = distinct.keys[0] if args else -1
        self.names = [a.name for a in args]
        self.kinds = [a.kind for a in args]
        self.dtypes = [_canonical_dtype(a.dtype) for a in args]
        features = reps_program.features
        #: the line path's form (see ``_compile_line``), or None where it does not apply; until the plan
        #: object's second estimate, what compiling it takes (a plan estimated once does not pay for it)
        self.line: _Line | tuple[Any, ...] | None = None
        if len(features) == 1 and features[0][0] != STATIC:
            self.line = (self, distinct.new, weights, features[0], slots, constants)


# --- The line path: one feature, expressions affine in its axis -----------------------------------
#
# The commonest small plans have one group feature, and every size, stride and
# count is affine in the one axis it varies (``x``, ``x + 1``, ``3 * x``, a
# constant). An argument's element count ``1 + sum((size - 1) * stride)`` is then
# a polynomial of degree at most 2 in that axis, and so is each group's bytes
# summed over the arguments. ``_compile_line`` works out, once per plan object,
# those polynomials' coefficients from the plan's expressions alone (no bucket,
# no axis value is looked at), the axis values where some size would be zero,
# and the range where every size and stride is >= 0. Each call then takes the
# axis column from the representatives it is given, checks it against that range
# and those zeros, and computes every group's bytes from the column; the
# dominant argument is the plain loop's (see ``_run_compiled``): a key's largest
# element count and its first group follow from the column's extremes, as the
# polynomial is convex or monotone there (a concave one is evaluated group by
# group). A column outside the range or hitting a zero size leaves the call to
# ``_run_compiled`` (and the general path), which gives the plain loop's result
# or error.

Affine = tuple[int, int]  # (a, b): a * x + b


def _affine(expr: Expr, axis: str | None, constants: Mapping[str, int]) -> Affine | None:
    """``expr`` as ``a * x + b`` over the feature's axis ``x``; None where it is not affine (or not covered)."""
    kind = type(expr)
    if kind is Const:
        return 0, expr.value  # type: ignore[union-attr]
    if kind is Axis:
        name = expr.name  # type: ignore[union-attr]
        if name == axis:
            return 1, 0
        value = constants.get(name)
        return None if value is None else (0, value)
    if kind is Add or kind is Mul:
        add = kind is Add
        a, b = 0, 0 if add else 1
        for operand in expr.operands:  # type: ignore[union-attr]
            part = _affine(operand, axis, constants)
            if part is None:
                return None
            pa, pb = part
            if add:
                a, b = a + pa, b + pb
            elif a and pa:
                return None  # quadratic
            else:
                a, b = a * pb + b * pa, b * pb
        return a, b
    if kind is FloorDiv:
        num = _affine(expr.numerator, axis, constants)  # type: ignore[union-attr]
        den = _affine(expr.denominator, axis, constants)  # type: ignore[union-attr]
        if num is None or den is None or num[0] or den[0] or den[1] == 0:
            return None
        return 0, num[1] // den[1]
    return None


Poly = tuple[int, int, int]  # (A, B, C): (A * x + B) * x + C


class _Line:
    """The line path's form of a plan (see above); made by ``_compile_line``."""

    __slots__ = ("total", "clone", "keys", "parts", "lo", "hi", "zeros", "single", "rising")

    def __init__(self) -> None:
        self.total: Poly = (0, 0, 0)  # each group's bytes, the constant keys' included
        self.clone: Poly | None = None  # the varying keys' mutated bytes (None: no varying key is mutated)
        self.keys: list[tuple[int, int, int, int, int]] = []  # per varying key: (key, A, B, C, dominant item size)
        self.parts: list[tuple[tuple[Affine, ...], tuple[Affine, ...]]] = []  # per key: its sizes and strides
        self.lo: int | None = None  # every size and stride is >= 0 where lo <= x <= hi (None: no bound to check)
        self.hi: int | None = None
        self.zeros: frozenset[int] | None = None  # values of x where some size of a varying key is 0
        #: the one varying key, where there is exactly one: (key, weight, dominant item size, clone weight)
        self.single: tuple[int, int, int, int] | None = None
        #: every key's count rises with x (or is constant): x is never negative and no coefficient is
        self.rising = False


def _compile_line(
    program: "FootprintProgram", new: list[TensorArg | WorkspaceArg], weights: list[int], feature: tuple[Any, ...],
    slots: Mapping[str, int], constants: Mapping[str, int],
) -> _Line | None:
    """``program``'s plan on the line path, or None where it does not apply (``_run_compiled`` then runs)."""
    kind, buckets, _names, axis, factor, _pairs = feature
    if axis not in slots:
        axis = None  # an axis the plan does not name: no expression names it either (or there is no program)
    # The least value the feature's column can take (``build_representatives``: the buckets' bounds and twice
    # the last one; a product's symbolic axis solved for each, rounded up, at least 1; the factor is >= 1).
    floor = min(buckets[0], 2 * buckets[-1]) if kind == SINGLE else max(1, -(-buckets[0] // factor))
    line = _Line()
    polys: list[Poly] = []
    lows: list[int] = []
    highs: list[int] = []
    zeros: set[int] = set()
    for arg in new:
        if isinstance(arg, WorkspaceArg):
            count = _affine(arg.count, axis, constants)
            if count is None:
                return None
            sizes: tuple[Affine, ...] = (count,)
            strides: tuple[Affine, ...] = ((0, 1),)
            polys.append((0, count[0], count[1]))
        else:
            size_parts = [_affine(e, axis, constants) for e in arg.size]
            stride_parts = [_affine(e, axis, constants) for e in arg.stride]
            if None in size_parts or None in stride_parts or len(size_parts) != len(stride_parts):
                return None
            sizes, strides = tuple(size_parts), tuple(stride_parts)  # type: ignore[arg-type]
            if (0, 0) in sizes:  # no elements in any group
                polys.append((0, 0, 0))
            else:
                big_a, big_b, big_c = 0, 0, 1
                for (a, b), (c, d) in zip(sizes, strides):  # (a * x + b - 1) * (c * x + d)
                    big_a += a * c
                    big_b += a * d + (b - 1) * c
                    big_c += (b - 1) * d
                    if a and b % a == 0:
                        zeros.add(-b // a)
                polys.append((big_a, big_b, big_c))
        for a, b in (*sizes, *strides):  # a * x + b >= 0
            if a > 0:
                lows.append(-(b // a))
            elif a < 0:
                highs.append(b // -a)
            elif b < 0:
                return None
        line.parts.append((sizes, strides))
    total_a, total_b, total_c = 0, 0, program.const_bytes
    clone_a = clone_b = clone_c = 0
    mutated = False
    for k, _, w, c in program.varying:
        big_a, big_b, big_c = polys[k]
        total_a, total_b, total_c = total_a + w * big_a, total_b + w * big_b, total_c + w * big_c
        if c:
            mutated = True
            clone_a, clone_b, clone_c = clone_a + c * big_a, clone_b + c * big_b, clone_c + c * big_c
        line.keys.append((k, big_a, big_b, big_c, program.best_item[k]))
    line.total = (total_a, total_b, total_c)
    line.clone = (clone_a, clone_b, clone_c) if mutated else None
    if len(line.keys) == 1:
        k, _, _, _, item = line.keys[0]
        line.single = (k, weights[k], item, program.varying[0][3])
    lo = max(lows) if lows else None
    line.lo = None if lo is None or lo <= floor else lo
    line.hi = min(highs) if highs else None
    least = floor if lo is None else max(lo, floor)
    line.zeros = frozenset(z for z in zeros if z >= least) or None
    line.rising = least >= 0 and all(big_a >= 0 and big_b >= 0 for _, big_a, big_b, _, _ in line.keys)
    return line


def _top(poly: Poly, col: Sequence[int], low: int, high: int) -> tuple[int, int]:
    """The largest value of ``poly`` over the column and the first index where it is reached."""
    a, b, c = poly
    if a < 0:  # concave: group by group
        values = [(a * x + b) * x + c for x in col]
        top = max(values)
        return top, values.index(top)
    if not a and not b:
        return c, 0
    # Convex or monotone: the largest value is at the least or the greatest x, and only there.
    at_low, at_high = (a * low + b) * low + c, (a * high + b) * high + c
    if at_low > at_high:
        return at_low, col.index(low)
    if at_high > at_low:
        return at_high, col.index(high)
    return at_low, min(col.index(low), col.index(high))


def _run_line(program: "FootprintProgram", line: _Line, col: tuple[int, ...]) -> Footprint | None:
    """The line path's footprint of the groups over ``col``; None to leave the call to ``_run_compiled``.

    Written for a small call's fixed cost: plain loops (cheaper than comprehensions on a few groups), and the
    result objects built through their slots (``_footprint``, ``_arg_footprint``).
    """
    lo, hi, zeros = line.lo, line.hi, line.zeros
    if lo is not None and min(col) < lo or hi is not None and max(col) > hi:
        return None  # some size or stride is negative in some group
    if zeros is not None and not zeros.isdisjoint(col):
        return None  # some size is zero in some group: its argument takes no bytes there
    a, b, c = line.total
    totals: list[int] = []
    if a:
        for x in col:
            totals.append((a * x + b) * x + c)
    else:
        for x in col:
            totals.append(b * x + c)
    top = max(totals)
    largest = totals.index(top)
    synthetic = sum(totals)
    peak_clone = program.const_clone
    dominant = None
    if program.has_args:
        # The plain loop's dominant argument: the largest bytes, first in group order, then argument order.
        peak, key = program.const_best
        at = 0
        best_arg = program.best_arg
        single = line.single
        if single is not None:  # one varying key: its counts are the totals less the constant keys', over its weight
            k, weight, item, clone = single
            elements = (top - program.const_bytes) // weight
            if clone:
                peak_clone += clone * elements
            bytes_ = elements * item
            if bytes_ > peak or bytes_ == peak and (largest == 0 and best_arg[k] < best_arg[key]):
                peak, key, at = bytes_, k, largest
        elif line.rising:  # every key's count is largest at the greatest x (and only there, unless constant)
            high = max(col)
            at_high = col.index(high)
            if line.clone is not None:
                big_a, big_b, big_c = line.clone
                peak_clone += (big_a * high + big_b) * high + big_c
            for k, big_a, big_b, big_c, item in line.keys:
                bytes_ = ((big_a * high + big_b) * high + big_c) * item
                first = at_high if big_a or big_b else 0
                if bytes_ > peak:
                    peak, key, at = bytes_, k, first
                elif bytes_ == peak and (first < at or (first == at and best_arg[k] < best_arg[key])):
                    key, at = k, first
        else:  # some coefficient or some x below 0
            low, high = min(col), max(col)
            if line.clone is not None:
                peak_clone += _top(line.clone, col, low, high)[0]
            for k, big_a, big_b, big_c, item in line.keys:
                elements, first = _top((big_a, big_b, big_c), col, low, high)
                bytes_ = elements * item
                if bytes_ > peak:
                    peak, key, at = bytes_, k, first
                elif bytes_ == peak and (first < at or (first == at and best_arg[k] < best_arg[key])):
                    key, at = k, first
        if peak == 0:  # every argument takes 0 bytes in every group: the first one, in the first group
            arg_index, key, at = 0, program.first_key, 0
        else:
            arg_index = best_arg[key]
        size_parts, stride_parts = line.parts[key]
        x = col[at]
        sizes: list[int] = []
        for p, q in size_parts:
            sizes.append(p * x + q)
        strides: list[int] = []
        for p, q in stride_parts:
            strides.append(p * x + q)
        # the group ids are 0, 1, ...: every group of one feature is reachable
        dominant = _arg_footprint(at, program.names[arg_index], program.kinds[arg_index], program.dtypes[arg_index],
                                  tuple(sizes), tuple(strides), peak)
    return _footprint(synthetic, peak_clone, synthetic + peak_clone, tuple(enumerate(totals)), largest, dominant)


_NOT_COMPILED = object()  # marks a plan the compiled path does not cover


def footprint_program(reps_program: RepsProgram, plan: KernelPlan) -> FootprintProgram | None:
    """The compiled form of ``plan``'s arguments, or None where it does not apply.

    It is made once per plan object and kept on the plan's ``RepsProgram``
    (itself kept on the plan, see ``KernelPlan.cache``).
    """
    program = reps_program.footprint
    if program is None:
        try:
            program = FootprintProgram(plan, reps_program)
        except _Unsupported:
            program = _NOT_COMPILED
        reps_program.footprint = program
    return program if program.__class__ is FootprintProgram else None


# The compiled paths' result objects are built as instances of these twins (same slots, in the same order,
# not frozen) and then given the frozen class: setting slots of a plain class is a third of the cost of
# going through the frozen dataclass's setters one by one, a large part of a small call.


class _FootprintBuilder:
    __slots__ = ("synthetic_bytes", "mutated_clone_bytes", "total_bytes", "group_bytes", "largest_group_id",
                 "dominant_arg")
    synthetic_bytes: int
    mutated_clone_bytes: int
    total_bytes: int
    group_bytes: tuple[tuple[int, int], ...]
    largest_group_id: int | None
    dominant_arg: ArgFootprint | None


class _ArgBuilder:
    __slots__ = ("group_id", "name", "kind", "dtype", "size", "stride", "num_bytes")
    group_id: int
    name: str
    kind: str
    dtype: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    num_bytes: int


assert _FootprintBuilder.__slots__ == Footprint.__slots__ and _ArgBuilder.__slots__ == ArgFootprint.__slots__


def _footprint(
    synthetic: int, clone: int, total: int, group_bytes: tuple[tuple[int, int], ...], largest: int | None,
    dominant: ArgFootprint | None,
) -> Footprint:
    """``Footprint(...)`` without the frozen dataclass's per-field guard (the compiled path's last step)."""
    out = _FootprintBuilder()
    out.synthetic_bytes = synthetic
    out.mutated_clone_bytes = clone
    out.total_bytes = total
    out.group_bytes = group_bytes
    out.largest_group_id = largest
    out.dominant_arg = dominant
    out.__class__ = Footprint  # type: ignore[assignment]
    return out  # type: ignore[return-value]


def _arg_footprint(
    group_id: int, name: str, kind: str, dtype: str, size: tuple[int, ...], stride: tuple[int, ...], num_bytes: int
) -> ArgFootprint:
    """``ArgFootprint(...)`` without the frozen dataclass's per-field guard."""
    out = _ArgBuilder()
    out.group_id = group_id
    out.name = name
    out.kind = kind
    out.dtype = dtype
    out.size = size
    out.stride = stride
    out.num_bytes = num_bytes
    out.__class__ = ArgFootprint  # type: ignore[assignment]
    return out  # type: ignore[return-value]


def _at(part: Compiled, cols: list[Any], index: int, seen: dict[object, list[int]]) -> int:
    if isinstance(part, int):
        return part
    col = seen.get(part)
    if col is None:
        col = seen[part] = part(cols)
    return col[index]


def _run_compiled(program: FootprintProgram, grid: GroupGrid) -> Footprint:
    n = grid._len
    shape = grid.shape
    if len(shape) == 1:
        cols: Any = grid.picks  # one feature: its column is its picks, in group order
    else:
        cols = []
        inner = 1
        for f, pick in enumerate(grid.picks):
            if isinstance(pick, tuple):
                col = list(pick) if inner == 1 else [v for v in pick for _ in range(inner)]
                cols.append(col if len(col) == n else col * (n // len(col)))
            else:
                cols.append(pick)
            inner *= shape[-1 - f]
    const, clone_const = program.const_bytes, program.const_clone
    best_item = program.best_item
    lists: list[list[int]] = []
    clone_lists: list[list[int]] = []
    candidates: list[tuple[int, int, int, list[int]]] = []  # (peak bytes, key, peak elements, column)
    for k, numel, w, c in program.varying:
        col = numel(cols)
        scaled = col if w == 1 else [v * w for v in col]
        lists.append(scaled)
        if c:
            clone_lists.append(scaled if c == w else col if c == 1 else [v * c for v in col])
        top = max(col)
        candidates.append((top * best_item[k], k, top, col))
    if not lists:
        totals = [const] * n
    else:
        if len(lists) == 1:
            totals = lists[0]
        elif len(lists) == 2:
            totals = [a + b for a, b in zip(*lists)]
        else:
            totals = [sum(t) for t in zip(*lists)]
        if const:
            totals = [t + const for t in totals]
    if clone_lists:
        peak_clone = clone_const + (
            max(clone_lists[0]) if len(clone_lists) == 1 else max([sum(t) for t in zip(*clone_lists)])
        )
    else:
        peak_clone = clone_const
    synthetic = sum(totals)
    ids = grid.group_ids()
    dominant: ArgFootprint | None = None
    if program.has_args:
        # The plain loop's dominant argument: the largest bytes, first in group order, then argument order.
        peak, key = program.const_best
        at = 0
        best_arg = program.best_arg
        for bytes_, k, top, col in candidates:
            if bytes_ > peak:
                peak, key, at = bytes_, k, col.index(top)
            elif bytes_ == peak:
                first = col.index(top)
                if first < at or (first == at and best_arg[k] < best_arg[key]):
                    key, at = k, first
        if peak == 0:  # every argument takes 0 bytes in every group: the first one, in the first group
            arg_index, key, at = 0, program.first_key, 0
        else:
            arg_index = best_arg[key]
        sizes, strides = program.shapes[key]
        seen: dict[object, list[int]] = {}  # a sub-expression of both a size and a stride is evaluated once
        dominant = _arg_footprint(
            ids[at],
            program.names[arg_index],
            program.kinds[arg_index],
            program.dtypes[arg_index],
            tuple([_at(d, cols, at, seen) for d in sizes]),
            tuple([_at(s, cols, at, seen) for s in strides]),
            peak,
        )
    return _footprint(synthetic, peak_clone, synthetic + peak_clone, tuple(zip(ids, totals)),
                      ids[totals.index(max(totals))], dominant)


def estimate_footprint(plan: KernelPlan, reps: Representatives) -> Footprint:
    """Estimate the bytes the grouped autotune benchmark synthesizes; fails closed.

    Gives exactly what ``reference_footprint`` (the plain loop over groups and
    arguments) gives, including the first failure, the dominant argument and
    every tie, but evaluates each expression once over the groups (see above).
    """
    groups = reps.groups
    if groups.__class__ is GroupGrid:
        grid: GroupGrid = groups
        reps_prog = grid.program
        cache = plan._cache
        # Built by the compiled path for this very plan object (its compiled form is on the plan)?
        if reps_prog is not None and cache is not None and cache.representatives is reps_prog \
                and grid._len <= _SMALL_GRID:
            program = reps_prog.footprint
            if program is None:
                program = footprint_program(reps_prog, plan)
            elif program.__class__ is FootprintProgram:
                line = program.line
                if line is not None:
                    if line.__class__ is tuple:  # the plan object's second estimate: compile the line form now
                        line = program.line = _compile_line(*line)
                    if line is not None:
                        found = _run_line(program, line, grid.picks[0])  # type: ignore[arg-type]
                        if found is not None:
                            return found
            if program.__class__ is FootprintProgram:
                try:
                    return _run_compiled(program, grid)
                except _Negative:
                    pass
    args = _benchmark_args(plan)
    n_groups = len(groups)
    if not n_groups:
        return Footprint(0, 0, 0, (), None, None)
    layout = _grid_layout(groups) if isinstance(groups, GroupGrid) else _generic_layout(groups)
    if layout is None:
        return reference_footprint(plan, reps)
    if n_groups <= _SMALL_GRID:
        return _small(plan, args, layout)
    try:
        return _vectorized(plan, args, layout, exact=False)
    except _Overflow:
        return _vectorized(plan, args, layout, exact=True)
