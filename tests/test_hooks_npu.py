"""The torch_npu grouped-autotune guard against torch_npu's own method, run from the real wheel.

The upstream methods ``_disable_grouped_autotune`` and
``_disable_grouped_autotune_if_benchmark_too_large`` are taken from the wheel's
``codegen/triton.py`` (by ``ast``), executed with the wheel's own
``symbolic_grouping`` module, and compared with the same class after
``hooks.npu.patch_class``: for every generated ``inductor_meta`` the hooked
kernel must leave exactly the meta upstream leaves.
"""

from __future__ import annotations

import copy
import types

import npu_wheel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import plan_payloads, upstream_meta

from prescreen.budget import MEMORY_ENV, RATIO_ENV
from prescreen.hooks import npu, state
from prescreen.service import COUNTERS
from prescreen.store import DiskStore

TOTAL = 64 * 2**20
_MEMORY = {"total": TOTAL}  # what the stubbed torch.npu reports to the upstream method
RATIO = 0.25


@pytest.fixture(scope="module")
def upstream_kernel_cls() -> type:
    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    cls, _ = npu_wheel.upstream_kernel_class(_MEMORY, types.SimpleNamespace(symbolic_group_max_benchmark_memory_ratio=RATIO))
    return cls


@pytest.fixture()
def hooked(upstream_kernel_cls: type, tmp_path):
    store = DiskStore(tmp_path / "store")
    state.reset()
    state.configure(store=store, device_memory=TOTAL, ratio=RATIO)
    cls = type("HookedKernel", (upstream_kernel_cls,), {})
    npu.patch_class(cls)
    yield cls, store
    state.reset()


def _meta(payload: dict[str, object]) -> dict[str, object]:
    meta = copy.deepcopy(payload)
    meta.update(group_enabled=True, group_template="pointwise", group_workload=None, primary_group_axis="x0",
                static_split_axes=(), secondary_runtime_symbolic_axes=())
    return meta


def _both(upstream_cls: type, hooked_cls: type, payload: dict[str, object]) -> tuple[dict, dict]:
    theirs, ours = _meta(payload), _meta(payload)
    upstream_cls()._disable_grouped_autotune_if_benchmark_too_large(theirs, "npu:0")
    hooked_cls()._disable_grouped_autotune_if_benchmark_too_large(ours, "npu:0")
    return theirs, ours


def test_upstream_example_meta_matches(upstream_kernel_cls, hooked) -> None:
    cls, _ = hooked
    try:
        for memory, tuned in ((2240, True), (2239, False)):  # 560 bytes needed: int(2240 * 0.25) == 560
            _MEMORY["total"] = memory
            state.configure(device_memory=memory)
            theirs, ours = _both(upstream_kernel_cls, cls, upstream_meta())
            assert theirs == ours
            assert ours["group_enabled"] is tuned
    finally:
        _MEMORY["total"] = TOTAL


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=plan_payloads(fail_closed=True, max_groups=64, extra_keys=True))
def test_hooked_meta_equals_upstream_meta_and_reuses_store(upstream_kernel_cls, hooked, payload) -> None:
    cls, _store = hooked
    theirs, ours = _both(upstream_kernel_cls, cls, payload)
    assert ours == theirs
    calls = COUNTERS.estimator_calls
    again = _meta(payload)
    cls()._disable_grouped_autotune_if_benchmark_too_large(again, "npu:0")
    assert again == theirs
    assert COUNTERS.estimator_calls == calls, "second lookup of the same plan must be a store hit"


def test_disabled_group_is_left_alone(upstream_kernel_cls, hooked) -> None:
    cls, _ = hooked
    meta = _meta(upstream_meta())
    meta["group_enabled"] = False
    before = dict(meta)
    cls()._disable_grouped_autotune_if_benchmark_too_large(meta, "npu:0")
    assert meta == before


def test_hook_error_defers_to_upstream(upstream_kernel_cls, hooked, monkeypatch) -> None:
    cls, _ = hooked

    def boom(*_a, **_k):
        raise RuntimeError("store exploded")

    monkeypatch.setattr(npu, "lookup_or_decide", boom)
    state.configure(device_memory=1024)  # we would fall back; upstream (64 MiB) tunes, and upstream must decide
    theirs, ours = _both(upstream_kernel_cls, cls, upstream_meta())
    assert ours == theirs and ours["group_enabled"] is True


def test_patch_is_idempotent_and_reversible(upstream_kernel_cls) -> None:
    cls = type("K", (upstream_kernel_cls,), {})
    original = cls._disable_grouped_autotune_if_benchmark_too_large
    npu.patch_class(cls)
    npu.patch_class(cls)
    wrapped = cls._disable_grouped_autotune_if_benchmark_too_large
    assert wrapped is not original and wrapped._prescreen_original_guard is original
    npu.unpatch_class(cls)
    assert cls._disable_grouped_autotune_if_benchmark_too_large is original


_NEAR_2_53 = st.one_of(st.integers(2**53 - 16, 2**53 + 64), st.integers(2**60 - 64, 2**60 + 64))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    total=st.one_of(st.integers(1, 2**70), _NEAR_2_53),
    ratio=st.one_of(st.sampled_from([1, 1.0, 1 - 2**-53]), st.floats(0.01, 1.0)),
    own_ratio=st.one_of(st.none(), st.sampled_from([1.0, 1 - 2**-53]), st.floats(0.01, 1.0)),
    own_memory=st.one_of(st.none(), st.integers(1, 2**60), _NEAR_2_53.filter(lambda n: n <= 2**60)),  # 1 EiB at most
    fraction=st.one_of(st.none(), st.sampled_from([1 - 2**-53, 0.5]), st.floats(0.01, 0.999)),
)
def test_budget_is_torch_npus_arithmetic_and_overrides_only_lower_it(monkeypatch, total, ratio, own_ratio,
                                                                     own_memory, fraction) -> None:
    """torch_npu's ``int(total_memory * ratio)`` (exact for an int ratio; the float product for a float one),
    whatever prescreen's ratio, memory and the per-process fraction do to it: at most that, and that without them."""
    monkeypatch.delenv(RATIO_ENV, raising=False)
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    device = types.SimpleNamespace(get_device_properties=lambda _d: types.SimpleNamespace(total_memory=total))
    if fraction is not None:
        device.get_per_process_memory_fraction = lambda _d: fraction
    config = types.SimpleNamespace(symbolic_group_max_benchmark_memory_ratio=ratio)
    state.reset()
    try:
        state.configure(ratio=own_ratio, device_memory=own_memory)
        budget = npu.budget_from(config, types.SimpleNamespace(npu=device), "npu:0")
    finally:
        state.reset()
    theirs = int(total * ratio)
    assert budget.budget_bytes <= theirs
    if own_ratio is None and own_memory is None and fraction is None:
        assert budget.budget_bytes == theirs and type(budget.ratio) is type(ratio)
