"""Benchmark footprint: storage sizes, per-group bytes, mutated clones, failing closed."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import upstream_meta

from prescreen.errors import NotBounded, Reason
from prescreen.footprint import ArgFootprint, dtype_itemsize, estimate_footprint, required_storage_numel
from prescreen.plan import KernelPlan
from prescreen.representatives import build_representatives

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
]


def footprint(meta: dict[str, object]):  # noqa: ANN201 - a Footprint
    plan = KernelPlan.from_payload(meta)
    return estimate_footprint(plan, build_representatives(plan))


def tensor(name: str, sizes: list[object], strides: list[object], dtype: str = "torch.float32") -> dict[str, object]:
    return {"kind": "tensor", "source": "buffer", "name": name, "dtype": dtype, "device": "npu:0",
            "size_exprs": sizes, "stride_exprs": strides}


def workspace(name: str, count: object, dtype: str = "torch.int32") -> dict[str, object]:
    return {"kind": "workspace", "source": "workspace", "name": name, "count_expr": count, "dtype": dtype,
            "device": "npu:0", "zero_mode": "ZERO_ON_CALL"}


def with_args(*args: dict[str, object], mutated: tuple[str, ...] = ()) -> dict[str, object]:
    meta = upstream_meta()
    meta["ordered_arg_specs"] = list(args)
    meta["mutated_arg_names"] = list(mutated)
    return meta


X0 = {"axis_name": "x0"}


@pytest.mark.parametrize(
    ("size", "stride", "expected"),
    [
        ((8, 10), (10, 1), 80),
        ((3, 4), (8, 1), 20),
        ((8, 10), (0, 1), 10),
        ((0, 10), (10, 1), 0),
        ((10, 0), (0, 0), 0),
        ((), (), 1),
        ((5,), (0,), 1),
        ((2, 3), (1, 2), 6),
    ],
)
def test_required_storage_numel(size: tuple[int, ...], stride: tuple[int, ...], expected: int) -> None:
    assert required_storage_numel(size, stride) == expected


@pytest.mark.parametrize(
    ("size", "stride", "reason"),
    [
        ((8, 10), (10,), Reason.RANK_MISMATCH),
        ((8,), (1, 1), Reason.RANK_MISMATCH),
        ((8, -1), (10, 1), Reason.NEGATIVE_SIZE),
        ((8, 10), (-10, 1), Reason.NEGATIVE_STRIDE),
        ((0, 10), (-10, 1), Reason.NEGATIVE_STRIDE),  # an empty tensor still may not have a negative stride
    ],
)
def test_required_storage_numel_fails_closed(size: tuple[int, ...], stride: tuple[int, ...], reason: Reason) -> None:
    with pytest.raises(NotBounded) as info:
        required_storage_numel(size, stride)
    assert info.value.reason is reason


@settings(max_examples=500, deadline=None)
@given(
    st.integers(0, 5).flatmap(
        lambda rank: st.tuples(
            st.lists(st.integers(0, 4), min_size=rank, max_size=rank),
            st.lists(st.integers(0, 6), min_size=rank, max_size=rank),
        )
    ),
    st.sampled_from(DTYPES),
)
def test_storage_matches_torch(shape: tuple[list[int], list[int]], dtype: torch.dtype) -> None:
    size, stride = shape
    nbytes = torch.empty_strided(size, stride, dtype=dtype).untyped_storage().nbytes()
    assert required_storage_numel(size, stride) * dtype_itemsize(str(dtype)) == nbytes


@pytest.mark.parametrize("dtype", DTYPES + [torch.float8_e4m3fn, torch.complex128, torch.uint16])
def test_dtype_itemsize(dtype: torch.dtype) -> None:
    expected = torch.empty((), dtype=dtype).element_size()
    assert dtype_itemsize(str(dtype)) == expected
    assert dtype_itemsize(str(dtype).removeprefix("torch.")) == expected


@pytest.mark.parametrize("name", ["torch.float17", "float128x", "torch.Size", "torch.cuda", "tensor", ""])
def test_unknown_dtype_fails_closed(name: str) -> None:
    with pytest.raises(NotBounded) as info:
        dtype_itemsize(name)
    assert info.value.reason is Reason.UNKNOWN_DTYPE


def test_upstream_footprint() -> None:
    fp = footprint(upstream_meta())
    assert fp.group_bytes == ((0, 176), (1, 352))
    assert (fp.synthetic_bytes, fp.mutated_clone_bytes, fp.total_bytes) == (528, 32, 560)
    assert fp.largest_group_id == 1
    assert fp.dominant_arg == ArgFootprint(1, "in_ptr0", "tensor", "torch.float16", (16, 10), (10, 1), 320)


def test_runtime_arg_in_a_size_expr_fails_closed() -> None:
    meta = upstream_meta()
    meta["ordered_arg_specs"][1]["size_exprs"][0] = {"runtime_arg_index": 2}  # type: ignore[index]
    with pytest.raises(NotBounded) as info:
        footprint(meta)
    assert info.value.reason is Reason.RUNTIME_DEPENDENT


@pytest.mark.parametrize(
    ("arg", "reason"),
    [
        (tensor("t", [X0, {"const": -2}], [1, 1]), Reason.NEGATIVE_SIZE),
        (tensor("t", [X0], [{"mul": [X0, -1]}]), Reason.NEGATIVE_STRIDE),
        (tensor("t", [X0, X0], [1]), Reason.RANK_MISMATCH),
        (tensor("t", [{"floordiv": [X0, {"add": [X0, {"mul": [X0, -1]}]}]}], [1]), Reason.DIVISION_BY_ZERO),
        (tensor("t", [X0], [{"runtime_arg_index": 0}]), Reason.RUNTIME_DEPENDENT),
        (tensor("t", [X0], [1], "torch.float17"), Reason.UNKNOWN_DTYPE),
        (tensor("t", [{"axis_name": "r9"}], [1]), Reason.MISSING_AXIS),
        (workspace("w", {"add": [X0, -100]}), Reason.NEGATIVE_SIZE),
        (workspace("w", {"runtime_arg_index": 3}), Reason.RUNTIME_DEPENDENT),
        (workspace("w", X0, "int33"), Reason.UNKNOWN_DTYPE),
    ],
)
def test_fails_closed(arg: dict[str, object], reason: Reason) -> None:
    with pytest.raises(NotBounded) as info:
        footprint(with_args(tensor("ok", [X0], [1]), arg))
    assert info.value.reason is reason


def test_failure_in_the_open_bucket_only_still_fails_closed() -> None:
    """x0 - 9 is negative only at the representatives of the first group."""
    with pytest.raises(NotBounded) as info:
        footprint(with_args(tensor("t", [{"add": [X0, -9]}], [1])))
    assert info.value.reason is Reason.NEGATIVE_SIZE
    assert footprint(with_args(tensor("t", [{"add": [X0, -8]}], [1]))).group_bytes == ((0, 0), (1, 32))


def test_zero_size_tensors_are_zero_bytes() -> None:
    fp = footprint(with_args(tensor("e", [X0, 0], [1, X0], "torch.float64"), tensor("f", [0], [0])))
    assert fp.group_bytes == ((0, 0), (1, 0))
    assert (fp.synthetic_bytes, fp.mutated_clone_bytes, fp.total_bytes) == (0, 0, 0)
    assert fp.dominant_arg is not None and fp.dominant_arg.num_bytes == 0


def test_workspace_is_count_times_itemsize() -> None:
    fp = footprint(with_args(workspace("ws", {"mul": [X0, 3]}, "torch.int64"), mutated=("ws",)))
    assert fp.group_bytes == ((0, 8 * 3 * 8), (1, 16 * 3 * 8))
    assert fp.mutated_clone_bytes == 16 * 3 * 8
    assert fp.dominant_arg == ArgFootprint(1, "ws", "workspace", "torch.int64", (48,), (1,), 384)


def test_size_args_are_not_synthesized() -> None:
    meta = with_args(
        tensor("t", [X0], [1], "torch.int8"),
        {"kind": "size", "source": "axis_expr", "name": "ks0", "expr": {"runtime_arg_index": 1}},
        {"kind": "size", "source": "axis_expr", "name": "ks1", "expr": {"floordiv": [X0, 0]}},
        {"kind": "size", "source": "runtime_arg", "name": "ks2", "index": 2},
    )
    assert footprint(meta).group_bytes == ((0, 8), (1, 16))


def test_mutated_clone_is_the_peak_over_groups_not_the_sum() -> None:
    meta = with_args(tensor("a", [X0], [1]), tensor("b", [X0, 2], [2, 1]), mutated=("a", "b", "unknown"))
    fp = footprint(meta)
    assert fp.group_bytes == ((0, 8 * 4 * 3), (1, 16 * 4 * 3))
    assert fp.mutated_clone_bytes == 16 * 4 * 3
    assert fp.total_bytes == fp.synthetic_bytes + fp.mutated_clone_bytes


def test_dominant_ties_keep_the_first_and_dtype_is_canonical() -> None:
    fp = footprint(with_args(tensor("a", [X0], [1], "half"), tensor("b", [X0], [1], "torch.float16")))
    assert fp.dominant_arg is not None
    assert (fp.dominant_arg.name, fp.dominant_arg.group_id, fp.dominant_arg.dtype) == ("a", 1, "torch.float16")


def test_largest_group_ties_keep_the_first() -> None:
    fp = footprint(with_args(tensor("a", [{"floordiv": [X0, 100]}], [1])))
    assert fp.group_bytes == ((0, 0), (1, 0))
    assert fp.largest_group_id == 0


def test_unreachable_groups_are_not_counted() -> None:
    meta = with_args(tensor("t", [{"axis_name": "r0"}, X0], [X0, 1]))
    meta["group_features"] = [  # type: ignore[index]
        {"name": "s", "source": "reduction_product", "axis_names": ["r0"], "buckets": [8, 32]},
        {"name": "x", "source": "primary_axis", "axis_names": ["x0"], "buckets": [4]},
    ]
    meta["axis_names"] = ["x0", "r0"]
    meta["axis_static_values"] = [["r0", 20]]
    fp = footprint(meta)
    assert fp.group_bytes == ((1, 20 * 4 * 4), (4, 20 * 8 * 4))


def test_arg_footprint_payload_round_trip_and_validation() -> None:
    arg = ArgFootprint(1, "in_ptr0", "tensor", "torch.float16", (16, 10), (10, 1), 320)
    assert ArgFootprint.from_payload(arg.to_payload()) == arg
    for key, value in [("num_bytes", 3.5), ("num_bytes", -1), ("size", "16"), ("stride", [1.0]), ("name", 5),
                       ("group_id", True), ("kind", None)]:
        bad = copy.deepcopy(arg.to_payload())
        bad[key] = value
        with pytest.raises(ValueError):
            ArgFootprint.from_payload(bad)
    bad = arg.to_payload()
    del bad["dtype"]
    with pytest.raises(ValueError):
        ArgFootprint.from_payload(bad)
    with pytest.raises(ValueError):
        ArgFootprint.from_payload("in_ptr0")
