"""Never weaker than torch_npu: a differential property test against the 2.14.0 wheel's own guard.

For random torch_npu config values (set in code, a float or the int 1, or through its variable before
or after its config is imported), random prescreen overrides, random device
memory and random plans in every payload shape, the class patched by
``prescreen.hooks.npu`` must never leave grouping on where the unpatched class
(torch_npu's own methods, executed from the wheel) turns it off. prescreen may
be stricter, never laxer; the counts of each outcome are printed.
"""

from __future__ import annotations

import collections
import copy
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import npu_wheel
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import plan_payloads, upstream_meta

from prescreen.budget import NPU_RATIO_ENV, RATIO_ENV
from prescreen.hooks import npu, state
from prescreen.store import DiskStore

_MEMORY = {"total": 64 * 2**20}
OUTCOMES: collections.Counter[str] = collections.Counter()
EXAMPLES = int(os.environ.get("PRESCREEN_PARITY_EXAMPLES", "2000"))
GiB = 2**30


@pytest.fixture(scope="module")
def classes() -> Iterator[tuple[type, type, dict[str, object]]]:
    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    upstream, namespace = npu_wheel.upstream_kernel_class(_MEMORY, types.SimpleNamespace())
    hooked = type("HookedKernel", (upstream,), {})
    npu.patch_class(hooked)
    yield upstream, hooked, namespace
    state.reset()


@pytest.fixture(scope="module")
def grouping() -> object:
    return npu_wheel.load_upstream_symbolic_grouping()


def _meta(payload: dict[str, object]) -> dict[str, object]:
    meta = copy.deepcopy(payload)
    meta.update(group_enabled=True, group_template="pointwise", group_workload=None)
    return meta


def _run(cls: type, payload: dict[str, object]) -> bool:
    """Whether grouping stays on after ``cls``'s guard (an exception counts as staying on: worst case)."""
    meta = _meta(payload)
    try:
        cls()._disable_grouped_autotune_if_benchmark_too_large(meta, "npu:0")
    except Exception:
        return True
    return bool(meta["group_enabled"])


def _footprint(grouping: object, payload: dict[str, object]) -> int:
    try:
        reps = grouping.build_group_representatives(  # type: ignore[attr-defined]
            payload.get("group_features", ()), payload.get("axis_names", ()), payload.get("axis_static_values", ()))
        fp = grouping.estimate_grouped_benchmark_footprint(  # type: ignore[attr-defined]
            reps, payload.get("ordered_arg_specs", ()), payload.get("mutated_arg_names", ()))
        return int(fp.total_bytes)
    except Exception:
        return 4096


RATIO_TEXTS = st.one_of(
    st.floats(min_value=0.01, max_value=1.0).map(lambda r: repr(round(r, 3))),
    st.sampled_from(["0.1", "0.25", "1", "1.0", "0", "-0.5", "1.5", "abc", "nan", "inf", " 0.3 ", ""]),
)


def _reshape(draw: st.DrawFn, payload: dict[str, object]) -> tuple[str, dict[str, object]]:
    """The same plan in another payload shape torch_npu might be handed."""
    shape = draw(st.sampled_from(["as_is", "as_is", "as_is", "statics_dict", "missing_key", "misspelled_key",
                                  "tuples"]))
    out = copy.deepcopy(payload)
    if shape == "statics_dict":
        out["axis_static_values"] = {name: value for name, value in out.get("axis_static_values", ())}  # type: ignore[misc]
    elif shape == "missing_key":
        del out[draw(st.sampled_from(sorted(k for k in out if k != "kernel_name")))]
    elif shape == "misspelled_key":
        key = draw(st.sampled_from(sorted(k for k in out if k != "kernel_name")))
        out[key[:-1]] = out.pop(key)
    elif shape == "tuples":
        out = {k: tuple(v) if isinstance(v, list) else v for k, v in out.items()}
    return shape, out


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    payload = draw(st.one_of(plan_payloads(fail_closed=True, max_groups=32, extra_keys=True), st.just(upstream_meta())))
    shape, payload = _reshape(draw, payload)
    return {
        "payload": payload,
        "shape": shape,
        "config_mode": draw(st.sampled_from(["default", "code", "code_int", "env_before_import", "env_after_import"])),
        "config_text": draw(RATIO_TEXTS),
        "later_env": draw(st.one_of(st.none(), RATIO_TEXTS)),
        "own_ratio": draw(st.one_of(st.none(), st.floats(min_value=0.01, max_value=1.0))),
        "own_ratio_env": draw(st.one_of(st.none(), st.sampled_from(["0.05", "0.5", "1"]))),
        "own_memory": draw(st.one_of(st.none(), st.integers(1, 2**40))),
        "memory_factor": draw(st.floats(min_value=0.25, max_value=4.0)),
        "boundary": draw(st.sampled_from([None, -1, 0, 1])),
    }


def _config(scenario: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> object:
    """torch_npu's config object as it would be in this scenario (its variable read once, at import)."""
    mode, text = scenario["config_mode"], str(scenario["config_text"])
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    if mode == "env_before_import":
        monkeypatch.setenv(NPU_RATIO_ENV, text)
    config = npu_wheel.import_upstream_npu_config()
    if mode == "code_int":  # the int 1, as code may set it: torch_npu's budget is then exact
        config.symbolic_group_max_benchmark_memory_ratio = 1
    if mode == "code":
        try:
            config.symbolic_group_max_benchmark_memory_ratio = float(text)
        except ValueError:
            config.symbolic_group_max_benchmark_memory_ratio = 0.1
    if scenario["later_env"] is not None:  # changed after import: torch_npu ignores it, so must prescreen
        monkeypatch.setenv(NPU_RATIO_ENV, str(scenario["later_env"]))
    return config


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenario=scenarios())
def test_patched_never_keeps_grouping_where_torch_npu_turns_it_off(classes, grouping, tmp_path_factory,
                                                                   scenario) -> None:
    upstream, hooked, namespace = classes
    with pytest.MonkeyPatch.context() as mp:
        config = _config(scenario, mp)
        if scenario["own_ratio_env"] is not None:
            mp.setenv(RATIO_ENV, str(scenario["own_ratio_env"]))
        else:
            mp.delenv(RATIO_ENV, raising=False)
        namespace["npu_config"] = config
        ratio = float(config.symbolic_group_max_benchmark_memory_ratio)
        if not 0.0 < ratio <= 1.0:  # torch_npu's own parser lets "nan" through: its guard then raises
            ratio = 0.25
        need = _footprint(grouping, scenario["payload"])
        total = max(1, int(need / ratio * float(scenario["memory_factor"])))
        if scenario["boundary"] is not None:  # int(total * ratio) == need +/- 1
            total = max(1, int((need + int(scenario["boundary"])) / ratio))
        _MEMORY["total"] = total
        state.reset()
        state.configure(store=_store(tmp_path_factory), ratio=scenario["own_ratio"],
                        device_memory=scenario["own_memory"])
        theirs = _run(upstream, scenario["payload"])
        ours = _run(hooked, scenario["payload"])
        again = _run(hooked, scenario["payload"])  # a store hit decides the same
    OUTCOMES[f"upstream {'tune' if theirs else 'fallback'} / prescreen {'tune' if ours else 'fallback'}"] += 1
    assert ours == again
    assert not (ours and not theirs), f"prescreen kept grouping on where torch_npu turns it off: {scenario}"


_STORES: dict[str, DiskStore] = {}


def _store(factory: pytest.TempPathFactory) -> DiskStore:
    if "s" not in _STORES:
        _STORES["s"] = DiskStore(factory.mktemp("parity-store"))
    return _STORES["s"]


def test_parity_counts_are_printed(capsys: pytest.CaptureFixture[str]) -> None:
    if not OUTCOMES:
        pytest.skip("the property test did not run")
    with capsys.disabled():
        print(f"\nnpu parity over {sum(OUTCOMES.values())} examples: " +
              ", ".join(f"{k}: {v}" for k, v in sorted(OUTCOMES.items())))
    assert OUTCOMES["upstream fallback / prescreen tune"] == 0
    assert OUTCOMES["upstream tune / prescreen tune"] > 0 and OUTCOMES["upstream fallback / prescreen fallback"] > 0


# --- the three ways the hook used to be laxer than torch_npu (each failed before the fix) ---------------

def _one(classes: tuple[type, type, dict[str, object]], payload: dict[str, object], total: int,
         config: object, store: DiskStore) -> tuple[bool, bool]:
    upstream, hooked, namespace = classes
    namespace["npu_config"] = config
    _MEMORY["total"] = total
    state.reset()
    state.configure(store=store)
    return _run(upstream, payload), _run(hooked, payload)


def test_ratio_set_in_code_is_honoured(classes, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    monkeypatch.delenv(RATIO_ENV, raising=False)
    config = npu_wheel.import_upstream_npu_config()
    config.symbolic_group_max_benchmark_memory_ratio = 0.1  # as torch_npu's own tests do
    # 560 bytes needed: 0.25 * 4000 = 1000 admits it, 0.1 * 4000 = 400 does not
    theirs, ours = _one(classes, upstream_meta(), 4000, config, DiskStore(tmp_path))
    assert theirs is False and ours is False


@pytest.mark.parametrize(("at_import", "later"), [("0.1", "1.0"), ("1.0", "0.1")])
def test_variable_is_read_once_at_import_like_torch_npu(classes, tmp_path, monkeypatch, at_import, later) -> None:
    monkeypatch.delenv(RATIO_ENV, raising=False)
    monkeypatch.setenv(NPU_RATIO_ENV, at_import)
    config = npu_wheel.import_upstream_npu_config()
    monkeypatch.setenv(NPU_RATIO_ENV, later)
    theirs, ours = _one(classes, upstream_meta(), 4000, config, DiskStore(tmp_path))
    assert theirs == (at_import == "1.0")
    assert ours == theirs


def test_static_values_as_a_dict_defer_to_torch_npu(classes, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    monkeypatch.delenv(RATIO_ENV, raising=False)
    meta = upstream_meta()
    meta["axis_names"] = ["x0", "r0_"]
    meta["axis_static_values"] = {"r0_": 4}
    meta["ordered_arg_specs"] = [{"kind": "tensor", "source": "buffer", "name": "in_ptr0", "dtype": "torch.float32",
                                  "device": "npu:0", "size_exprs": [{"const": 2**30}], "stride_exprs": [{"const": 1}]}]
    meta["mutated_arg_names"] = []
    theirs, ours = _one(classes, meta, 64 * GiB, npu_wheel.import_upstream_npu_config(), DiskStore(tmp_path))
    assert theirs is False and ours is False


def test_override_can_only_lower_torch_npus_budget(classes, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    upstream, hooked, namespace = classes
    namespace["npu_config"] = npu_wheel.import_upstream_npu_config()  # 0.25
    _MEMORY["total"] = 2000  # budget 500 < 560: torch_npu falls back
    state.reset()
    state.configure(store=DiskStore(tmp_path), ratio=1.0, device_memory=64 * GiB)  # a larger override
    assert _run(upstream, upstream_meta()) is False
    assert _run(hooked, upstream_meta()) is False
    _MEMORY["total"] = 64 * GiB  # torch_npu tunes; a smaller prescreen memory makes prescreen fall back
    state.configure(device_memory=1000)
    assert _run(upstream, upstream_meta()) is True
    assert _run(hooked, upstream_meta()) is False


def test_unmirrored_torch_npu_release_defers(classes, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(npu, "installed_npu_version", lambda: "2.15.0")
    monkeypatch.setattr(npu, "lookup_or_decide", lambda *a, **k: pytest.fail("prescreen decided for 2.15"))
    theirs, ours = _one(classes, upstream_meta(), 4000, npu_wheel.import_upstream_npu_config(), DiskStore(tmp_path))
    assert ours == theirs
    assert npu.series_allows("2.14.0") and npu.series_allows("2.14.0.post2")
    assert npu.series_allows("2.14.0+git1a2b3c4") and npu.series_allows(None)  # the code decides
    assert not npu.series_allows("2.15.0") and not npu.series_allows("banana")


# --- issue 29: source builds, foreign payload forms, an int ratio (each was laxer than torch_npu before) -------

#: torch-npu 2.14.0 solves a closed bucket of a product with static axes for its symbolic axis by rounding up.
_CEIL_2_14 = ("        target = upper if upper is not None else max(lower + 1, lower * 2)\n"
              "        symbolic_axis_value = max(1, (target + static_factor - 1) // static_factor)\n")
#: Ascend's master (its ``choose_symbolic_axis_value``) rounds down there, and drops a bucket no value reaches.
_FLOOR_MASTER = ("        if upper is None:\n"
                 "            target = max(lower + 1, lower * 2)\n"
                 "            symbolic_axis_value = max(1, (target + static_factor - 1) // static_factor)\n"
                 "        elif lower // static_factor + 1 > upper // static_factor:\n"
                 "            return None\n"
                 "        else:\n"
                 "            symbolic_axis_value = max(1, upper // static_factor)\n")


def _load_module(name: str, source: str, folder: Path) -> types.ModuleType:
    """``source`` imported from a file under ``name`` (a real file, as an installed torch_npu's modules are)."""
    path = folder / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def master_grouping(folder: Path) -> types.ModuleType:
    """A stand-in of master's ``symbolic_grouping``: the 2.14.0 wheel's module with master's rounding."""
    source = npu_wheel.upstream_source(npu_wheel.SYMBOLIC_GROUPING)
    assert source.count(_CEIL_2_14) == 1, "the 2.14.0 wheel's rounding is not where this stand-in expects it"
    return _load_module("_prescreen_master_symbolic_grouping", source.replace(_CEIL_2_14, _FLOOR_MASTER), folder)


def _kernel_classes(grouping: types.ModuleType) -> tuple[type, type, dict[str, object]]:
    """torch_npu's guard methods from the wheel, calling ``grouping``, and the same class patched by prescreen."""
    upstream, namespace = npu_wheel.upstream_kernel_class(_MEMORY, types.SimpleNamespace())
    for name in ("build_group_representatives", "estimate_grouped_benchmark_footprint", "UnsupportedGroupedPlan"):
        namespace[name] = getattr(grouping, name)
    hooked = type("HookedKernel", (upstream,), {})
    npu.patch_class(hooked)
    return upstream, hooked, namespace


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> tuple[type, type, dict[str, object]]:
    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    return _kernel_classes(master_grouping(tmp_path_factory.mktemp("master")))


def pad_like() -> dict[str, object]:
    """Issue 29's repro: ``x0 - 2`` rows of 64; x0 * 64 bucketed at 100 (2.14.0 picks x0 = 2, master x0 = 1)."""
    return {
        "kernel_name": "triton_poi_fused_constant_pad_nd_0",
        "group_features": [{"name": "outer", "source": "outer_product", "axis_names": ["x0", "x1"], "buckets": [100]}],
        "axis_names": ["x0", "x1"],
        "axis_static_values": [["x1", 64]],
        "ordered_arg_specs": [
            {"kind": "tensor", "source": "buffer", "name": "in_ptr0", "dtype": "torch.float32", "device": "npu:0",
             "size_exprs": [{"add": [{"axis_name": "x0"}, {"const": -2}]}, {"axis_name": "x1"}],
             "stride_exprs": [{"axis_name": "x1"}, {"const": 1}]},
        ],
        "mutated_arg_names": [],
    }


#: What a source build of master reports: a local version label, or no distribution metadata at all; an
#: unchanged version file says 2.14.0 outright.
SOURCE_BUILD_VERSIONS = ["2.14.0+git1a2b3c4", None, "2.14.0"]


@pytest.mark.parametrize("version", SOURCE_BUILD_VERSIONS)
def test_a_source_build_of_master_defers_to_its_own_guard(master, classes, tmp_path, monkeypatch, caplog,
                                                          version) -> None:
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    monkeypatch.delenv(RATIO_ENV, raising=False)
    monkeypatch.setattr(npu, "installed_npu_version", lambda: version)
    config = npu_wheel.import_upstream_npu_config()
    # under the 2.14.0 code, both tune (x0 = 2: a (0, 64) tensor) and prescreen decides itself
    assert _one(classes, pad_like(), 64 * GiB, config, DiskStore(tmp_path / "a")) == (True, True)
    # under master's code, torch_npu picks x0 = 1 and falls back on "negative benchmark tensor size: (-1, 64)"
    decided = []
    monkeypatch.setattr(npu, "lookup_or_decide", lambda *a, **k: decided.append(a))
    with caplog.at_level("INFO", logger="prescreen.hooks"):
        assert _one(master, pad_like(), 64 * GiB, config, DiskStore(tmp_path / "b")) == (False, False)
        assert _run(master[1], pad_like()) is False
    assert decided == []
    deferred = [r for r in caplog.records if "torch_npu's own check" in r.getMessage()]
    assert len(deferred) == 1, [r.getMessage() for r in caplog.records]  # logged once
    assert "build_group_representatives" in deferred[0].getMessage()


def test_the_wheels_code_is_the_code_prescreen_mirrors() -> None:
    from prescreen.budget import Budget
    from prescreen.decision import decide
    from prescreen.plan import KernelPlan

    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    wheel = npu_wheel.load_upstream_symbolic_grouping()
    assert npu.module_digests(vars(wheel)) == npu.MIRRORED_DIGESTS
    assert npu.probe(vars(wheel)) is None
    assert npu.why_not_mirrored(vars(wheel), "2.14.0+git1a2b3c4") is None
    assert npu.why_not_mirrored(vars(wheel), None) is None
    assert "2.15.0" in str(npu.why_not_mirrored(vars(wheel), "2.15.0"))
    # the probe's expectations are prescreen's own answers too
    plan = KernelPlan.from_payload({
        "group_features": [dict(f) for f in npu.PROBE_FEATURES], "axis_names": npu.PROBE_AXES,
        "axis_static_values": npu.PROBE_STATICS, "ordered_arg_specs": npu.PROBE_ARGS,
        "mutated_arg_names": npu.PROBE_MUTATED})
    decision = decide(plan, Budget("npu", 2**40, 0.25))
    assert decision.estimated_bytes == npu.PROBE_TOTAL_BYTES
    assert tuple(g for g, _ in decision.group_bytes) == npu.PROBE_REACHABLE


def test_master_fails_the_fingerprint_and_the_probe_each(master) -> None:
    module = vars(sys.modules["_prescreen_master_symbolic_grouping"])
    digests = npu.module_digests(module)
    assert [n for n in npu.MIRRORED_NAMES if digests[n] != npu.MIRRORED_DIGESTS[n]] == \
        ["build_group_representatives"]
    assert "x0', 1)" in str(npu.probe(module))  # the closed bucket solved by a floor


def test_same_source_other_behaviour_is_caught_by_the_probe(tmp_path) -> None:
    """A module whose mirrored sources are 2.14.0's but whose globals change what they do (here ``max``)."""
    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    source = npu_wheel.upstream_source(npu_wheel.SYMBOLIC_GROUPING) + "\n\ndef max(*values):\n    return min(values)\n"
    module = _load_module("_prescreen_patched_symbolic_grouping", source, tmp_path)
    assert npu.module_digests(vars(module)) == npu.MIRRORED_DIGESTS
    why = npu.why_not_mirrored(vars(module), "2.14.0")
    assert why is not None and "probe plan" in why


def test_code_without_readable_source_is_not_taken_for_2_14(tmp_path) -> None:
    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    module = _load_module("_prescreen_sourceless_symbolic_grouping",
                          npu_wheel.upstream_source(npu_wheel.SYMBOLIC_GROUPING), tmp_path)
    (tmp_path / "_prescreen_sourceless_symbolic_grouping.py").unlink()  # as where only .pyc files are shipped
    import linecache

    linecache.clearcache()
    why = npu.why_not_mirrored(vars(module), "2.14.0")
    assert why is not None and "cannot be read" in why
    # a module whose function was rebound after import (the source no longer defines what runs)
    module = _load_module("_prescreen_rebound_symbolic_grouping",
                          npu_wheel.upstream_source(npu_wheel.SYMBOLIC_GROUPING), tmp_path)
    module._feature_field = lambda spec, field: spec[field]  # type: ignore[attr-defined]
    assert "_feature_field is not defined in" in str(npu.why_not_mirrored(vars(module), "2.14.0"))
    # a caller whose other imports are not that module's
    wheel = npu_wheel.load_upstream_symbolic_grouping()
    names = {"build_group_representatives": wheel.build_group_representatives, "UnsupportedGroupedPlan": RuntimeError}
    assert "not that module's" in str(npu.why_not_mirrored(names, "2.14.0"))


SYMPY_FORMS = [
    pytest.param(("size_exprs", 1), sympy.Integer(10), id="size-Integer"),
    pytest.param(("stride_exprs", 1), sympy.S.One, id="stride-One"),
    pytest.param(("stride_exprs", 0), sympy.Integer(10), id="stride-Integer"),
    pytest.param(("size_exprs", 1), sympy.S.Zero, id="size-Zero"),
    pytest.param(("size_exprs", 1), {"mul": [sympy.Integer(2), {"const": 5}]}, id="mul-operand"),
    pytest.param(("size_exprs", 1), {"add": [sympy.S.Zero, 10]}, id="add-operand"),
    pytest.param(("size_exprs", 1), {"floordiv": [{"const": 20}, sympy.Integer(2)]}, id="floordiv-operand"),
]


@pytest.mark.parametrize(("where", "form"), SYMPY_FORMS)
def test_bare_sympy_integers_fail_closed_like_torch_npu(classes, tmp_path, monkeypatch, where, form) -> None:
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    monkeypatch.delenv(RATIO_ENV, raising=False)
    meta = upstream_meta()
    meta["ordered_arg_specs"][1][where[0]][where[1]] = form  # type: ignore[index]
    config = npu_wheel.import_upstream_npu_config()
    # torch_npu: "unsupported grouped benchmark expression" -> falls back, with 64 GiB to spare
    assert _one(classes, meta, 64 * GiB, config, DiskStore(tmp_path)) == (False, False)


def huge_plan(nbytes: int) -> dict[str, object]:
    """Two groups, each synthesizing one uint8 tensor of ``nbytes // 2`` bytes (``nbytes`` even)."""
    return {
        "kernel_name": "triton_poi_fused_huge_0",
        "group_features": [{"name": "outer", "source": "outer_product", "axis_names": ["x0"], "buckets": [8]}],
        "axis_names": ["x0"],
        "axis_static_values": [],
        "ordered_arg_specs": [
            {"kind": "tensor", "source": "buffer", "name": "in_ptr0", "dtype": "torch.uint8", "device": "npu:0",
             "size_exprs": [{"const": nbytes // 2}], "stride_exprs": [{"const": 1}]},
        ],
        "mutated_arg_names": [],
    }


@pytest.mark.parametrize(("ratio", "tunes"), [(1, False), (1.0, True)])
def test_the_budget_is_torch_npus_arithmetic_above_2_to_the_53(classes, tmp_path, monkeypatch, ratio, tunes) -> None:
    """``int(total_memory * ratio)``: exact for an int ratio; for a float one, the float product torch_npu takes."""
    monkeypatch.delenv(RATIO_ENV, raising=False)
    total = 2**53 + 3  # float(total) == 2**53 + 4
    plan = huge_plan(total + 1)  # one byte over an int ratio's budget; within the float product
    config = types.SimpleNamespace(symbolic_group_max_benchmark_memory_ratio=ratio)
    assert _one(classes, plan, total, config, DiskStore(tmp_path)) == (tunes, tunes)
    (entry,) = DiskStore(tmp_path).entries()  # stored and read back under the same key
    assert type(entry.parts.ratio) is type(ratio) and entry.parts.digest() == entry.key
    assert entry.decision.tune is tunes and entry.decision.budget_bytes == int(total * ratio)


# --- learning from a real OOM in torch_npu's grouped runtime benchmark ----------------------------------------

def test_oom_in_grouped_runtime_benchmark_makes_later_compiles_fall_back(classes, tmp_path, monkeypatch) -> None:
    import sys

    import torch

    from prescreen.errors import Reason

    upstream, hooked, namespace = classes
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    monkeypatch.delenv(RATIO_ENV, raising=False)
    config = npu_wheel.import_upstream_npu_config()
    namespace["npu_config"] = config
    _MEMORY["total"] = 64 * GiB  # the estimate fits easily: torch_npu and prescreen both tune
    monkeypatch.setitem(sys.modules, npu.CONFIG_MODULE, config)
    # the fake autotuner below runs with this test's globals: the hook checks the imported symbolic_grouping
    monkeypatch.setitem(sys.modules, npu.GROUPING_MODULE, npu_wheel.load_upstream_symbolic_grouping())
    monkeypatch.setattr(torch, "npu", namespace["torch"].npu, raising=False)  # what torch_npu's torch.npu reports
    store = DiskStore(tmp_path)
    state.reset()
    state.configure(store=store)
    assert _run(upstream, upstream_meta()) is True and _run(hooked, upstream_meta()) is True

    class GroupedAutotuner:  # torch_npu's NPUSymbolicGroupedAutotuner, as far as the hook sees it
        inductor_meta = _meta(upstream_meta())

        def _autotune_all_groups(self, *args: object, **kwargs: object) -> None:
            raise torch.OutOfMemoryError("NPU out of memory. Tried to allocate 2.00 GiB")

    npu.patch_runtime_class(GroupedAutotuner)
    npu.patch_runtime_class(GroupedAutotuner)  # idempotent
    with pytest.raises(torch.OutOfMemoryError):  # this process dies as it would without prescreen
        GroupedAutotuner()._autotune_all_groups(torch.zeros(1))
    reasons = [e.decision.reason for e in store.entries()]
    assert any(r.startswith(Reason.OBSERVED_OOM.value) for r in reasons), reasons
    # the next compile (a new process: a fresh hook state over the same store) falls back at codegen
    state.reset()
    state.configure(store=DiskStore(tmp_path))
    assert _run(upstream, upstream_meta()) is True
    assert _run(hooked, upstream_meta()) is False
    npu.unpatch_class(GroupedAutotuner)
    assert not hasattr(GroupedAutotuner._autotune_all_groups, npu._ORIGINAL_ATTR)


def test_runtime_names_patched_exist_in_the_wheel() -> None:
    import ast

    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    source = npu_wheel.upstream_source(npu.RUNTIME_MODULE.replace(".", "/") + ".py")
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == npu.RUNTIME_CLASS)
    method = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == npu.RUNTIME_METHOD)
    assert [a.arg for a in method.args.args] == ["self"] and method.args.vararg and method.args.kwarg
    config = npu_wheel.upstream_source(npu.CONFIG_MODULE.replace(".", "/") + ".py")
    assert npu.RATIO_ATTR in config
