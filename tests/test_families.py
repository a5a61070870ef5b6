"""Shape families of Inductor selections: buckets, range clamping, warm's points, the display label."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prescreen import families
from prescreen.errors import ConfigError
from prescreen.families import Bucket, Scheme, parse_scheme
from prescreen.target import ShapeRange

ROOT = Path(__file__).resolve().parent.parent

hints = st.integers(min_value=1, max_value=2**40)
bound_lists = st.lists(st.integers(min_value=1, max_value=10**6), min_size=1, max_size=8, unique=True).map(
    lambda xs: tuple(sorted(xs))
)
schemes = st.one_of(st.just(Scheme("pow2")), st.just(Scheme("exact")), bound_lists.map(lambda b: Scheme("bounds", b)))


# ---------------------------------------------------------------- buckets


@given(schemes, hints)
def test_bucket_holds_its_hint_and_bound_is_never_below_it(scheme: Scheme, hint: int) -> None:
    bucket = scheme.bucket(hint)
    assert hint in bucket
    assert bucket.high >= hint and bucket.low < hint


@given(schemes, hints, st.integers(min_value=0, max_value=2**20))
def test_every_hint_in_a_bucket_gets_that_bucket(scheme: Scheme, hint: int, offset: int) -> None:
    """Buckets partition the hints: any other hint inside one maps to the same bucket (so the same key)."""
    bucket = scheme.bucket(hint)
    other = bucket.low + 1 + offset % (bucket.high - bucket.low)
    assert other in bucket
    assert scheme.bucket(other) == bucket
    assert bucket.high >= other  # the estimate at the bound never undercounts it


@given(st.integers(min_value=0, max_value=60))
def test_pow2_boundaries(k: int) -> None:
    pow2 = Scheme("pow2")
    assert pow2.bucket(2**k) == Bucket(2 ** (k - 1) if k else 0, 2**k)
    assert pow2.bucket(2**k + 1) == Bucket(2**k, 2 ** (k + 1))


def test_pow2_small_and_named_buckets() -> None:
    pow2 = Scheme("pow2")
    assert [pow2.bucket(h) for h in (1, 2, 3, 4, 5, 3000, 4096)] == [
        Bucket(0, 1), Bucket(1, 2), Bucket(2, 4), Bucket(2, 4), Bucket(4, 8), Bucket(2048, 4096), Bucket(2048, 4096)]
    assert pow2.bucket(0) == Bucket(-1, 0)  # a zero-size dim is its own family
    assert Bucket(2048, 4096).describe("batch") == "batch in (2048, 4096]"
    assert Bucket(1, 2).describe("batch") == "batch=2"


def test_bounds_scheme_then_pow2_above_the_last_bound() -> None:
    scheme = parse_scheme("64,512,3000")
    assert scheme.bucket(1) == Bucket(0, 64)
    assert scheme.bucket(64) == Bucket(0, 64)
    assert scheme.bucket(65) == Bucket(64, 512)
    assert scheme.bucket(2999) == Bucket(512, 3000)
    assert scheme.bucket(3001) == Bucket(3000, 4096)  # cut at the last bound
    assert scheme.bucket(5000) == Bucket(4096, 8192)


def test_exact_scheme_is_the_hint() -> None:
    assert parse_scheme("exact").bucket(3000) == Bucket(2999, 3000)


@pytest.mark.parametrize("text", ["pow3", "64,32", "0,4", "64,,128", "-1", "1.5", "64,64"])
def test_bad_scheme_is_an_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match="PRESCREEN_SHAPE_BUCKETS") as info:
        parse_scheme(text)
    assert repr(text) in str(info.value)


def test_scheme_from_env_and_a_bad_env_warns_and_uses_the_default(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    assert families.scheme_from_env({}) == Scheme("pow2")
    assert families.scheme_from_env({"PRESCREEN_SHAPE_BUCKETS": " Exact "}) == Scheme("exact")
    monkeypatch.setenv("PRESCREEN_SHAPE_BUCKETS", "not-a-scheme")
    with pytest.raises(ConfigError, match="not-a-scheme"):
        families.scheme_from_env()
    with caplog.at_level("WARNING", logger="prescreen.families"):
        assert families.active_scheme() == Scheme("pow2")
    assert "not-a-scheme" in caplog.text


# ---------------------------------------------------------------- range clamping


@given(schemes, hints, st.integers(min_value=0, max_value=2**20), st.integers(min_value=0, max_value=2**20))
def test_clamped_bucket_stays_in_range_and_holds_the_hint(scheme: Scheme, hint: int, below: int, above: int) -> None:
    lower, upper = max(hint - below, 1), hint + above
    bucket = scheme.bucket(hint).clamp(lower, upper)
    assert hint in bucket
    assert bucket.high <= upper and bucket.low >= lower - 1
    assert bucket.high <= scheme.bucket(hint).high  # clamping only tightens


def test_clamp_examples() -> None:
    pow2 = Scheme("pow2")
    assert pow2.bucket(3000).clamp(2, 3000) == Bucket(2048, 3000)  # mark_dynamic(max=3000)
    assert pow2.bucket(2).clamp(2, None) == Bucket(1, 2)  # Dynamo's >= 2
    assert pow2.bucket(150).clamp(100, None) == Bucket(128, 256)  # a lower bound below the bucket: no change
    assert pow2.bucket(64).clamp(64, 64) == Bucket(63, 64)  # a specialized symbol: exact
    assert Bucket(2048, 4096).clamp(5000, None) == Bucket(2048, 4096)  # nothing left: unclamped


class _Range:
    def __init__(self, lower: Any, upper: Any) -> None:
        self.lower, self.upper = lower, upper


class _BoundEnv:
    def __init__(self, lower: Any, upper: Any) -> None:
        self.range = _Range(lower, upper)

    def bound_sympy(self, sym: Any) -> _Range:
        return self.range


class _RangeOnlyEnv:
    def __init__(self, ranges: dict[str, _Range]) -> None:
        self.var_to_range = ranges


def test_symbol_range_degrades_gracefully() -> None:
    import sympy

    assert families.symbol_range(None, "s0") == (None, None)
    assert families.symbol_range(_BoundEnv(sympy.Integer(2), sympy.Integer(4096)), "s0") == (2, 4096)
    assert families.symbol_range(_BoundEnv(2, sympy.oo), "s0") == (2, None)
    assert families.symbol_range(_RangeOnlyEnv({"s0": _Range(3, 9)}), "s0") == (3, 9)  # no bound_sympy
    assert families.symbol_range(_RangeOnlyEnv({}), "s0") == (None, None)
    assert families.symbol_range(object(), "s0") == (None, None)


def test_symbol_range_reads_a_real_shape_env() -> None:
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    sym = env.create_symbol(3000, ConstantSource("x"))
    assert families.symbol_range(env, sym) == (2, None)  # int_oo above: unbounded
    env.constrain_symbol_range(sym, compiler_min=2, compiler_max=3500)
    assert families.symbol_range(env, sym) == (2, 3500)
    assert Scheme("pow2").bucket(3000).clamp(*families.symbol_range(env, sym)) == Bucket(2048, 3500)


# ---------------------------------------------------------------- warm's points and names


@given(schemes, st.integers(min_value=1, max_value=5000), st.integers(min_value=0, max_value=5000),
       st.integers(min_value=0, max_value=3))
@settings(max_examples=200)
def test_covering_partitions_the_range_and_points_fall_in_their_bucket(scheme: Scheme, low: int, width: int,
                                                                       index: int) -> None:
    high = low + width
    covered = scheme.covering(low, high)
    assert covered[0].low == low - 1 and covered[-1].high == high
    assert all(a.high == b.low for a, b in zip(covered, covered[1:]))
    for bucket in covered:
        point = families.point_of(bucket, index)
        assert point in bucket and low <= point <= high
        assert scheme.bucket(point).clamp(low, high) == bucket


def test_select_points_one_per_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    from prescreen.warm import families_covered, select_points

    monkeypatch.delenv("PRESCREEN_SHAPE_BUCKETS", raising=False)
    grid = select_points((ShapeRange("batch", 1, 4096),))
    assert [p["batch"] for p in grid] == [1, 2, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 2047, 4095]
    assert families_covered(grid) == 13
    two = select_points((ShapeRange("batch", 1, 8), ShapeRange("seq", 5, 8)))
    assert families_covered(two) == len(two) == 4 * 1
    assert select_points((ShapeRange("batch", 1, 4096),), 3) == [{"batch": 1}, {"batch": 64}, {"batch": 4096}]
    assert families_covered(select_points((ShapeRange("batch", 1, 4096),), 3)) == 3
    monkeypatch.setenv("PRESCREEN_SHAPE_BUCKETS", "exact")
    assert select_points((ShapeRange("batch", 1, 4096),)) == [{"batch": 1}, {"batch": 4096}]
    monkeypatch.setenv("PRESCREEN_SHAPE_BUCKETS", "4096,64")
    with pytest.raises(ConfigError, match="4096,64"):
        select_points((ShapeRange("batch", 1, 4096),))


def test_naming_maps_a_unique_size_back_to_its_shape() -> None:
    assert families.name_for(3000) is None
    with families.naming({"batch": 3000, "seq": 64, "heads": 64}):
        assert families.name_for(3000) == "batch"
        assert families.name_for(64) is None  # two shapes at 64: ambiguous
        with families.naming({"seq": 7}):
            assert families.name_for(7) == "seq" and families.name_for(3000) is None
        assert families.name_for(3000) == "batch"
    assert families.name_for(3000) is None


def test_module_imports_no_torch() -> None:
    code = "import sys, prescreen.families; print('torch' in sys.modules, 'sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ---------------------------------------------------------------- labels on plans


def test_axis_labels_are_kept_but_not_hashed() -> None:
    from prescreen.expr import Axis
    from prescreen.key import plan_hashes
    from prescreen.plan import KernelPlan, TensorArg

    arg = TensorArg("x", "buffer", (Axis("s0"), ), (Axis("s0"),), "torch.float32", "cpu")
    plain = KernelPlan((), ("s0",), (("s0", 4096),), (arg,), kernel_name="select:mm")
    labelled = KernelPlan((), ("s0",), (("s0", 4096),), (arg,), kernel_name="select:mm",
                          axis_labels=(("s0", "batch in (2048, 4096]"),))
    assert plan_hashes(labelled)[0] == plan_hashes(plain)[0]
    assert "axis_labels" not in plain.to_payload()
    assert KernelPlan.from_payload(labelled.to_payload()) == labelled
    bad = dict(labelled.to_payload(), axis_labels=[["s0"]])
    with pytest.raises(ValueError, match=r"axis_labels\[0\]"):
        KernelPlan.from_payload(bad)


# ---------------------------------------------------------------- end to end (CPU, freezing on)


@pytest.mark.slow
def test_two_batches_in_one_bucket_share_one_stored_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real compile at batch 40 stores the (32, 64] decisions; batch 50 hits them, batch 70 does not."""
    monkeypatch.delenv("PRESCREEN_SHAPE_BUCKETS", raising=False)
    import torch
    import torch._inductor.config as ic

    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_models import mlp  # type: ignore[import-not-found]

    import prescreen
    from prescreen.hooks import state  # type: ignore[import-not-found]
    from prescreen.plan import KernelPlan
    from prescreen.store import DiskStore

    store = DiskStore(tmp_path / "store")
    state.reset()

    def compile_at(batch: int, max_batch: int | None = None) -> dict[str, int]:
        before = state.counters()
        seen = (before.lookups, before.hits, before.estimator_calls)
        model, (x,) = mlp(batch=batch)
        torch._dynamo.reset()
        if max_batch is not None:
            torch._dynamo.mark_dynamic(x, 0, min=2, max=max_batch)
        with torch.no_grad():
            y = torch.compile(model, dynamic=True, mode="max-autotune")(x)  # type: ignore[no-untyped-call]
            torch.testing.assert_close(y, model(x), atol=1e-4, rtol=1e-4)
        after = state.counters()
        now = (after.lookups, after.hits, after.estimator_calls)
        return dict(zip(("lookups", "hits", "estimator_calls"), (b - a for a, b in zip(seen, now))))

    try:
        with ic.patch(freezing=True, fx_graph_cache=False), \
                prescreen.installed(store=store, device_memory="64GiB", ratio=1e-9):
            first = compile_at(40)
            entries = {e.key: e for e in store.entries()}
            second = compile_at(50)
            after_second = {e.key for e in store.entries()}
            third = compile_at(70)
            clamped = compile_at(40, max_batch=50)
    finally:
        state.reset()
    assert first["lookups"] > 0 and first["estimator_calls"] == first["lookups"] and first["hits"] == 0
    assert second == {"lookups": first["lookups"], "hits": first["lookups"], "estimator_calls": 0}
    assert after_second == set(entries)  # one stored entry per selection serves both batch sizes
    selections = [e for e in entries.values() if e.kernel.startswith("select:")]
    assert selections
    for e in selections:
        plan = KernelPlan.from_payload(e.plan)
        assert 64 in dict(plan.axis_static_values).values()  # estimated at the bound
        assert plan.axis_labels and all(text.endswith(" in (32, 64]") for _, text in plan.axis_labels)
    assert third["hits"] == 0 and third["estimator_calls"] == third["lookups"] > 0  # (64, 128]: a new family
    assert clamped["hits"] == 0 and clamped["estimator_calls"] > 0  # mark_dynamic(max=50): (32, 50]
    statics = [dict(KernelPlan.from_payload(e.plan).axis_static_values) for e in store.entries()]
    assert any(50 in s.values() for s in statics)


# ---------------------------------------------------------------- the hook's size conversion


def test_only_expressions_that_grow_are_estimated_at_the_bound() -> None:
    """A size that cannot shrink as its symbols grow is read at the bucket's bound (s0 = 4096 for a hint of
    3000); any other, or one the estimator cannot read, at the hint."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from prescreen.expr import Const, evaluate
    from prescreen.hooks.inductor_select import _Converter

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    conv = _Converter(_SizeVars({"s0": 3000, "s1": 5}))
    at_bound = {"s0": 4096, "s1": 5}
    growing = (s0, s0 - 1, 2 * s0 * s1 + 3, s0**2, FloorDiv(s0, 16), FloorDiv(FloorDiv(s0 - 1, 2) + 1, 2) * s0,
               sympy.Integer(64))
    for e in growing:
        assert evaluate(conv.expr(e), at_bound) == int(e.subs({s0: 4096, s1: 5})), e
    for e in (64 - s0, FloorDiv(4096, s0), 4096 / s0, -s0 + s1, s0 / 16, ModularIndexing(s0, 1, 64),
              sympy.Max(s0, 3), 3 * FloorDiv(s0, -s1 + 8)):
        assert conv.expr(e) == Const(int(e.subs({s0: 3000, s1: 5}))), e


class _SizeVars:
    """The two things ``_Converter`` asks Inductor's sizevars for: hints and the ShapeEnv."""

    def __init__(self, values: dict[str, int], shape_env: Any = None) -> None:
        self.values, self.shape_env = values, shape_env

    def optimization_hint(self, e: Any, fallback: int | None = None) -> int:
        return int(e.subs({sym: self.values[sym.name] for sym in e.free_symbols}))

    size_hint = optimization_hint


def test_converter_keys_by_bucket_bound_and_takes_a_shrinking_expression_at_the_hint() -> None:
    import sympy

    from prescreen.expr import Axis, Const
    from prescreen.hooks.inductor_select import _Converter

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    conv = _Converter(_SizeVars({"s0": 3000}))
    assert conv.expr(s0) == Axis("s0") and conv.expr(64) == Const(64)
    assert conv.statics == {"s0": 4096}
    assert conv.labels == {"s0": "s0 in (2048, 4096]"}
    assert conv.expr(5000 - s0) == Const(2000)  # at the bound it would be 904: an undercount
    clamped = _Converter(_SizeVars({"s0": 3000}, _BoundEnv(2, 3500)))
    clamped.expr(s0)
    assert clamped.statics == {"s0": 3500} and clamped.labels == {"s0": "s0 in (2048, 3500]"}
    with families.naming({"batch": 3000}):
        named = _Converter(_SizeVars({"s0": 3000}))
        named.expr(s0)
    assert named.labels == {"s0": "batch in (2048, 4096]"}


def test_retargeting_carries_a_plan_to_another_family_or_drops_the_target() -> None:
    import sympy

    from prescreen.expr import Axis
    from prescreen.hooks.inductor_select import _Converter

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    big, small = {"batch": 6000}, {"batch": 100}
    with families.naming({"batch": 3000}, also=[big, small]):
        with families.retargeting(big):
            assert families.current_point() == big and families.retarget(3000) == 6000
            conv = _Converter(_SizeVars({"s0": 3000}))
            assert conv.expr(s0) == Axis("s0") and conv.statics == {"s0": 8192}
            assert conv.labels == {"s0": "batch in (4096, 8192]"}
        with families.retargeting(small):  # an expression taken at the hint cannot move: small is dropped
            _Converter(_SizeVars({"s0": 3000})).expr(5000 - s0)
            raise AssertionError("not reached")
        assert families.also_deciding() == [big]  # small dropped: it gets its own lowering
        assert families.current_point() == {"batch": 3000} and families.retarget(3000) == 3000
    assert families.also_deciding() == [] and families.current_point() == {}
