"""Never weaker than torch_npu: a differential property test against the 2.14.0 wheel's own guard.

For random torch_npu config values (set in code, or through its variable before
or after its config is imported), random prescreen overrides, random device
memory and random plans in every payload shape, the class patched by
``prescreen.hooks.npu`` must never leave grouping on where the unpatched class
(torch_npu's own methods, executed from the wheel) turns it off. prescreen may
be stricter, never laxer; the counts of each outcome are printed.
"""

from __future__ import annotations

import collections
import copy
import os
import types
from collections.abc import Iterator

import npu_wheel
import pytest
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
        "config_mode": draw(st.sampled_from(["default", "code", "env_before_import", "env_after_import"])),
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
    from prescreen import semantics

    monkeypatch.setattr(npu, "installed_npu_version", lambda: "2.15.0")
    monkeypatch.setattr(npu, "lookup_or_decide", lambda *a, **k: pytest.fail("prescreen decided for 2.15"))
    theirs, ours = _one(classes, upstream_meta(), 4000, npu_wheel.import_upstream_npu_config(), DiskStore(tmp_path))
    assert ours == theirs
    assert semantics.npu_semantics("2.14.0") == "torch_npu-2.14"
    assert semantics.npu_semantics("2.14.0.post2") == "torch_npu-2.14"
    assert semantics.npu_semantics("2.15.0") is None
    assert semantics.npu_semantics("banana") is None


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
    npu.unpatch_runtime_class(GroupedAutotuner)
    assert not hasattr(GroupedAutotuner._autotune_all_groups, npu._ORIGINAL_RUNTIME_ATTR)


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
