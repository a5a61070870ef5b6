"""The epilogue-fusion guard and the version checks of the new patches, without a GPU."""

from __future__ import annotations

import types
from typing import Any

import pytest
import sympy
import torch

from prescreen.decision import is_observed_oom
from prescreen.expr import Const
from prescreen.hooks import select_algorithm as sel
from prescreen.hooks import state
from prescreen.plan import KernelPlan, TensorArg
from prescreen.store import DiskStore

OOM_TEXT = "CUDA out of memory. Tried to allocate 512.00 MiB"


def _plan() -> KernelPlan:
    arg = TensorArg("buf0", "buffer", (Const(4096), Const(4096)), (Const(4096), Const(1)), "torch.float16", "cuda:0")
    return KernelPlan(group_features=(), axis_names=(), axis_static_values=(), args=(arg,),
                      kernel_name="fusion:epilogue")


@pytest.fixture()
def fusion_on_gpu(monkeypatch: pytest.MonkeyPatch, guard_store: DiskStore) -> DiskStore:
    """A fusion that upstream would benchmark, on a (pretend) 64 GiB CUDA device."""
    monkeypatch.setattr(sel, "_is_benchmarked_fusion", lambda _a, _b: True)
    monkeypatch.setattr(sel, "plans_for_fusion", lambda _s, _a, _b: [_plan()])
    monkeypatch.setattr(sel, "_fusion_device", lambda _n: torch.device("cuda", 0))
    return guard_store


def _should_fuse(result: Any) -> bool:
    return bool(getattr(result, "should_fuse", result))


def test_fusion_over_budget_is_not_benchmarked(fusion_on_gpu: DiskStore) -> None:
    calls: list[int] = []

    def upstream(self: Any, a: Any, b: Any) -> bool:
        calls.append(1)
        return True

    guarded = sel._wrap_fusion(upstream)
    state.configure(ratio=1e-9)
    assert not _should_fuse(guarded(None, object(), object()))
    assert calls == []
    assert [e.decision.action for e in fusion_on_gpu.entries()] == ["fallback"]


def test_fusion_within_budget_runs_upstream(fusion_on_gpu: DiskStore) -> None:
    guarded = sel._wrap_fusion(lambda self, a, b: "upstream")
    assert guarded(None, object(), object()) == "upstream"


def test_fusion_oom_leaves_kernels_unfused_and_is_remembered(fusion_on_gpu: DiskStore) -> None:
    calls = []

    def upstream(self: Any, a: Any, b: Any) -> Any:
        calls.append(1)
        raise torch.OutOfMemoryError(OOM_TEXT)

    guarded = sel._wrap_fusion(upstream)
    assert not _should_fuse(guarded(None, object(), object()))
    assert calls == [1]
    (entry,) = list(fusion_on_gpu.entries())
    assert is_observed_oom(entry.decision) and "requested_bytes=536870912" in entry.decision.reason
    assert not _should_fuse(guarded(None, object(), object()))  # a hit: never benchmarked again
    assert calls == [1]


def test_fusion_guard_error_lets_upstream_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_a: Any, _b: Any) -> bool:
        raise AttributeError("no such node field in this torch")

    monkeypatch.setattr(sel, "_is_benchmarked_fusion", broken)
    assert sel._wrap_fusion(lambda self, a, b: "upstream")(None, object(), object()) == "upstream"


def test_fusion_tunes_only_if_every_benchmarked_kernel_fits(monkeypatch: pytest.MonkeyPatch,
                                                            fusion_on_gpu: DiskStore) -> None:
    """The kernels are benchmarked one at a time: one plan each, and any plan over budget skips the step."""
    small, big = _plan(), KernelPlan(group_features=(), axis_names=(), axis_static_values=(),
                                     args=(TensorArg("buf0", "buffer", (Const(2**20), Const(2**14)),
                                                     (Const(2**14), Const(1)), "torch.float16", "cuda:0"),),
                                     kernel_name="fusion:fused")
    monkeypatch.setattr(sel, "plans_for_fusion", lambda _s, _a, _b: [small, big])  # 32 MiB and 32 GiB
    calls: list[int] = []
    guarded = sel._wrap_fusion(lambda self, a, b: calls.append(1) or True)
    assert not _should_fuse(guarded(None, object(), object())) and calls == []
    assert sorted(e.decision.action for e in fusion_on_gpu.entries()) == ["fallback", "tune"]


def test_fusion_plans_follow_inductors_kernel_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real CPU compile: each kernel's plan holds the buffers its generated kernel takes.

    ``x / x.sum(1)`` schedules a reduction and a pointwise node. Alone, the
    reduction takes x and its row sums; the pointwise x, the sums and the
    output; fused, the sums are kernel-local and removed: x and the output.
    """
    from torch._inductor import scheduler

    from prescreen.budget import Budget
    from prescreen.decision import decide

    rows, cols = 256, 1024
    seen: list[dict[str, int]] = []
    original = scheduler.Scheduler.speedup_by_fusion

    def spy(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        plans = sel.plans_for_fusion(self, node1, node2)
        seen.append({p.kernel_name: decide(p, Budget("cpu", 2**40, 1.0)).estimated_bytes for p in plans})
        return original(self, node1, node2, *args, **kwargs)

    monkeypatch.setattr(scheduler.Scheduler, "speedup_by_fusion", spy)
    torch._dynamo.reset()
    x = torch.rand(rows, cols) + 1
    from torch._inductor import config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        out = torch.compile(lambda t: t / t.sum(1, keepdim=True), backend="inductor")(x)
    torch.testing.assert_close(out, x / x.sum(1, keepdim=True))
    full, sums = rows * cols * 4, rows * 4
    assert {"fusion:unfused1": full + sums, "fusion:unfused2": 2 * full + sums,
            "fusion:fused": 2 * full} in seen


def test_fusion_plans_count_an_in_place_output_twice_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pointwise epilogue may write into its intermediate input (``in_out_ptr``): two more clones.

    ``(x * 2).sum(1).relu() + 1``: the pointwise node alone reads the row sums,
    an intermediate only it uses, of the output's size and dtype, so Inductor may
    reuse that buffer for the output. Measured on an H200 (torch 2.11): such a
    kernel's first call clones the argument and its runtime autotuning clones it
    again. The reduction alone reads only a graph input: nothing to reuse.
    """
    from torch._inductor import config as inductor_config
    from torch._inductor import scheduler

    from prescreen.budget import Budget
    from prescreen.decision import decide

    rows, cols = 256, 1024
    seen: list[dict[str, list[str]]] = []
    original = scheduler.Scheduler.speedup_by_fusion

    def spy(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        plans = sel.plans_for_fusion(self, node1, node2)
        seen.append({p.kernel_name: [a.name for a in p.args] for p in plans})
        assert decide(plans[1], Budget("cpu", 2**40, 1.0)).estimated_bytes == 3 * rows * 4
        return original(self, node1, node2, *args, **kwargs)

    monkeypatch.setattr(scheduler.Scheduler, "speedup_by_fusion", spy)
    torch._dynamo.reset()
    x = torch.rand(rows, cols)
    with inductor_config.patch(force_disable_caches=True):
        out = torch.compile(lambda t: (t * 2).sum(1).relu() + 1, backend="inductor")(x)
    torch.testing.assert_close(out, (x * 2).sum(1).relu() + 1)
    assert {"fusion:unfused1": ["buf0", "buf1"], "fusion:unfused2": ["buf0", "buf1", "buf1.autotune_clone"],
            "fusion:fused": ["buf0", "buf1"]} in seen


def test_a_clone_in_a_fusion_plan_equals_its_buffer_converted_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """A buffer's clones are its converted argument under another name (``_relabeled``): each equals a fresh
    conversion of the buffer under the clone's label."""
    from torch._inductor import config as inductor_config
    from torch._inductor import scheduler
    from torch._inductor.virtualized import V

    compared: list[str] = []
    original = scheduler.Scheduler.speedup_by_fusion

    def spy(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        plans = sel.plans_for_fusion(self, node1, node2)
        for (_kernel, nodes), plan in zip(sel._fusion_kernels(node1, node2), plans, strict=True):
            names = sel._kernel_args(self, nodes)[0]
            by_label = {a.name: a for a in plan.args}
            conv = sel._Converter(V.graph.sizevars)
            for i, name in enumerate(names):
                sel._graph_tensor(conv, f"buf{i}", name)  # the buffer first, as the plan does
                for label in (f"buf{i}.clone", f"buf{i}.autotune_clone"):
                    if label in by_label:
                        assert [by_label[label]] == sel._graph_tensor(conv, label, name)
                        compared.append(label)
        return original(self, node1, node2, *args, **kwargs)

    monkeypatch.setattr(scheduler.Scheduler, "speedup_by_fusion", spy)
    torch._dynamo.reset()
    x = torch.rand(256, 1024)
    with inductor_config.patch(force_disable_caches=True):
        torch.compile(lambda t: (t * 2).sum(1).relu() + 1, backend="inductor")(x)
    assert "buf1.autotune_clone" in compared


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_buffer_is_converted_once_per_scheduler_and_its_symbols_are_each_plans_axes(
    monkeypatch: pytest.MonkeyPatch, dynamic: bool
) -> None:
    """Every buffer is converted once per scheduler and shared by the plans of its fusion steps' kernels; a
    symbolic one's shape families still become the axes of each plan that takes it. The plans equal plans
    whose every buffer was converted by their own converter."""
    import weakref

    from torch._inductor import config as inductor_config
    from torch._inductor import scheduler

    seen: list[tuple[int, int, bool]] = []
    original = scheduler.Scheduler.speedup_by_fusion
    shared_or_converted = sel._shared_or_converted
    conversions: list[str] = []
    graph_tensor = sel._graph_tensor

    def counted(conv: Any, label: str, name: str) -> Any:
        conversions.append(name)
        return graph_tensor(conv, label, name)

    def own(conv: Any, shared: Any, label: str, name: str) -> Any:
        return graph_tensor(conv, label, name)

    def spy(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        conversions.clear()
        shared = sel.plans_for_fusion(self, node1, node2)
        converted = list(conversions)
        kept = sel._fusion_plans
        monkeypatch.setattr(sel, "_fusion_plans", weakref.WeakKeyDictionary())
        monkeypatch.setattr(sel, "_shared_or_converted", own)
        alone = sel.plans_for_fusion(self, node1, node2)
        monkeypatch.setattr(sel, "_shared_or_converted", shared_or_converted)
        monkeypatch.setattr(sel, "_fusion_plans", kept)
        assert shared == alone
        assert len(converted) == len(set(converted))  # no buffer twice, whatever plans take it
        seen.append((len(converted), sum(len(p.args) for p in shared), any(p.axis_names for p in shared)))
        return original(self, node1, node2, *args, **kwargs)

    monkeypatch.setattr(sel, "_graph_tensor", counted)
    monkeypatch.setattr(scheduler.Scheduler, "speedup_by_fusion", spy)
    torch._dynamo.reset()
    x = torch.rand(64, 128) + 1
    with inductor_config.patch(force_disable_caches=True):
        out = torch.compile(lambda t: t / t.sum(1, keepdim=True), backend="inductor", dynamic=dynamic)(x)
    torch.testing.assert_close(out, x / x.sum(1, keepdim=True))
    assert seen
    assert all(axes == dynamic for _n, _args, axes in seen)  # the symbols are the plans' axes
    assert all(n < args for n, args, _axes in seen)  # fewer conversions than the plans' buffer arguments


class _OtherScheduler:
    def __init__(self, removable: Any) -> None:
        self.can_buffer_be_removed_through_fusion = removable


def test_a_schedulers_fusion_plans_are_built_once_and_equal_fresh_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked again about the same pair, the guard reuses the plan objects it built (so their lookups are
    answered from the plans' memory), and they equal plans built anew; another scheduler builds its own."""
    import weakref

    from torch._inductor import config as inductor_config
    from torch._inductor import scheduler

    checked: list[int] = []
    original = scheduler.Scheduler.speedup_by_fusion

    def spy(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        first = sel.plans_for_fusion(self, node1, node2)
        again = sel.plans_for_fusion(self, node1, node2)
        assert all(a is b for a, b in zip(first, again, strict=True))
        kept = sel._fusion_plans, sel._converted
        monkeypatch.setattr(sel, "_fusion_plans", weakref.WeakKeyDictionary())
        monkeypatch.setattr(sel, "_converted", weakref.WeakKeyDictionary())
        fresh = sel.plans_for_fusion(self, node1, node2)
        monkeypatch.setattr(sel, "_fusion_plans", kept[0])
        monkeypatch.setattr(sel, "_converted", kept[1])
        assert fresh == first and all(a is not b for a, b in zip(first, fresh, strict=True))
        other = _OtherScheduler(self.can_buffer_be_removed_through_fusion)
        theirs = sel.plans_for_fusion(other, node1, node2)
        assert theirs == first and all(a is not b for a, b in zip(first, theirs, strict=True))
        assert all(a is b for a, b in zip(theirs, sel.plans_for_fusion(other, node1, node2), strict=True))
        checked.append(len(first))
        return original(self, node1, node2, *args, **kwargs)

    monkeypatch.setattr(scheduler.Scheduler, "speedup_by_fusion", spy)
    torch._dynamo.reset()
    x = torch.rand(64, 128) + 1
    with inductor_config.patch(force_disable_caches=True):
        out = torch.compile(lambda t: t / t.sum(1, keepdim=True), backend="inductor")(x)
    torch.testing.assert_close(out, x / x.sum(1, keepdim=True))
    assert checked and all(n == 3 for n in checked)


def test_patch_installs_every_guard_and_unpatch_restores_upstream() -> None:
    from torch._inductor import scheduler
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    originals = (AlgorithmSelectorCache.__call__, AlgorithmSelectorCache.autotune,
                 scheduler.Scheduler.speedup_by_fusion)
    was = [hasattr(f, sel._ORIGINAL_ATTR) for f in originals]
    sel.unpatch()
    try:
        assert sel.patch()
        assert hasattr(AlgorithmSelectorCache.__call__, sel._ORIGINAL_ATTR)
        assert hasattr(AlgorithmSelectorCache.autotune, sel._ORIGINAL_ATTR)
        assert hasattr(scheduler.Scheduler.speedup_by_fusion, sel._ORIGINAL_ATTR)
        sel.unpatch()
        assert not hasattr(AlgorithmSelectorCache.autotune, sel._ORIGINAL_ATTR)
        assert not hasattr(scheduler.Scheduler.speedup_by_fusion, sel._ORIGINAL_ATTR)
    finally:
        if any(was):
            sel.patch()


def test_an_autotune_with_another_signature_is_left_alone(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    class Fake:
        def autotune(self, choices: Any, name: Any) -> None:  # parameters in another order
            pass

    original = Fake.autotune
    assert not sel._patch_attr(Fake, "autotune", sel._AUTOTUNE_PARAMS, sel._wrap_autotune, "autotune OOM-retry")
    assert Fake.autotune is original
    assert "does not take (name, input_nodes, layout, input_gen_fns, choices)" in caplog.text


def test_conv_workspace_copies_on_gpus_only() -> None:
    cuda = torch.device("cuda", 0)
    assert sel.extern_workspace_copies("convolution", cuda) == sel.CONV_WORKSPACE_COPIES["contiguous"] == 2
    assert sel.extern_workspace_copies("convolution", torch.device("cpu")) == 0
    assert sel.extern_workspace_copies("mm", cuda) == 0


def test_channels_last_input_needs_one_workspace_copy() -> None:
    class Node:
        def __init__(self, stride: list[int]) -> None:
            self.stride = stride

        def get_size(self) -> list[int]:
            return [8, 64, 32, 32]

        def get_stride(self) -> list[int]:
            return self.stride

    class Conv:
        hint = staticmethod(int)

    cuda = torch.device("cuda", 0)
    nhwc, nchw = Node([65536, 1, 2048, 64]), Node([65536, 1024, 32, 1])
    assert sel.extern_workspace_copies("convolution", cuda, Conv(), nhwc) == 1
    assert sel.extern_workspace_copies("convolution", cuda, Conv(), nchw) == 2


def test_a_graphs_symbol_hints_are_read_once_for_all_its_plans() -> None:
    """Reading a hint is a sympy substitution: every plan of one graph shares what was read (not another graph)."""
    import sympy

    from prescreen.expr import Axis, Mul

    s0 = sympy.Symbol("s0", positive=True, integer=True)

    class SizeVars:
        def __init__(self, hint: int) -> None:
            self.hint, self.calls = hint, 0
            self.shape_env = None

        def size_hint(self, e: Any, fallback: int = 0) -> int:
            self.calls += 1
            return int(sympy.sympify(e).subs({s0: self.hint}))

        optimization_hint = size_hint

    graph, other = SizeVars(3000), SizeVars(100)
    first, second = sel._Converter(graph), sel._Converter(graph)
    assert first.expr(s0 * 4) == Mul((Const(4), Axis("s0")))
    assert second.expr(s0) == Axis("s0")
    assert first.statics == second.statics == {"s0": 4096} and graph.calls == 1  # pow2 bucket (2048, 4096]
    again = sel._Converter(graph)  # a conversion already made in this graph still names its symbols
    assert again.expr(s0 * 4) == Mul((Const(4), Axis("s0"))) and again.statics == {"s0": 4096}
    assert again.labels == first.labels and graph.calls == 1
    third = sel._Converter(other)
    assert third.expr(s0) == Axis("s0") and third.statics == {"s0": 128} and other.calls == 1


_S0 = sympy.Symbol("s0", positive=True, integer=True)


class _Range:
    def __init__(self, lower: int, upper: int) -> None:
        self.lower, self.upper = lower, upper


class _RangedShapeEnv:
    """A ShapeEnv's range table and ``bound_sympy`` (counted)."""

    def __init__(self) -> None:
        self.var_to_range = {_S0: _Range(2, 10**9)}
        self.reads = 0

    def bound_sympy(self, e: Any) -> _Range:
        self.reads += 1
        return self.var_to_range[e]


class _RangedSizeVars:
    """A graph's sizevars: s0's hint is 3000."""

    def __init__(self) -> None:
        self.shape_env = _RangedShapeEnv()

    def size_hint(self, e: Any, fallback: int = 0) -> int:
        return int(sympy.sympify(e).subs({_S0: 3000}))

    optimization_hint = size_hint


def test_a_symbols_range_is_read_again_once_a_guard_narrows_it() -> None:
    """A range is reused only while the ShapeEnv holds the very object it was read from."""
    graph = _RangedSizeVars()
    first = sel._Converter(graph)
    first.expr(_S0)
    sel._Converter(graph).expr(_S0 * 2)
    assert first.statics == {"s0": 4096} and graph.shape_env.reads == 1
    graph.shape_env.var_to_range[_S0] = _Range(2, 3500)  # a guard narrowed it: a new object
    narrowed = sel._Converter(graph)
    narrowed.expr(_S0)
    assert narrowed.statics == {"s0": 3500} and graph.shape_env.reads == 2


def test_a_symbols_family_is_read_once_per_graph_until_its_range_or_name_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every converter of one graph reuses a symbol's bucket and label; a narrowed range, a name from
    ``warm`` or another scheme reads them again, and each answer equals a fresh graph's."""
    from prescreen import families

    buckets: list[int] = []
    bucket_for = families.bucket_for
    monkeypatch.setattr(families, "bucket_for", lambda hint, *rest: buckets.append(hint) or bucket_for(hint, *rest))

    def converted(graph: _RangedSizeVars,
                  scheme: families.Scheme | None = None) -> tuple[dict[str, int], dict[str, str]]:
        conv = sel._Converter(graph, scheme)
        conv.expr(_S0 * 2)
        return conv.statics, conv.labels

    graph = _RangedSizeVars()
    first = converted(graph)
    assert converted(graph) == first == ({"s0": 4096}, {"s0": "s0 in (2048, 4096]"}) and len(buckets) == 1
    graph.shape_env.var_to_range[_S0] = _Range(2, 3500)
    assert converted(graph) == converted(graph) == ({"s0": 3500}, {"s0": "s0 in (2048, 3500]"})
    assert len(buckets) == 2
    with families.naming({"batch": 3000}):
        assert converted(graph) == ({"s0": 3500}, {"s0": "batch in (2048, 3500]"}) and len(buckets) == 3
    assert converted(graph) == ({"s0": 3500}, {"s0": "s0 in (2048, 3500]"}) and len(buckets) == 4
    exact = families.parse_scheme("exact")
    fresh = _RangedSizeVars()
    fresh.shape_env.var_to_range[_S0] = _Range(2, 3500)
    assert converted(graph, exact) == converted(fresh, exact) == ({"s0": 3000}, {})


class _FakeGpuBackend:
    """``torch.<device type>`` as ``flush_buffer_bytes`` reads it: properties per device index."""

    def __init__(self, l2_by_index: dict[int, int]) -> None:
        self.l2_by_index = l2_by_index
        self.reads: list[int] = []
        self.current = 0

    def current_device(self) -> int:
        return self.current

    def get_device_properties(self, index: int) -> object:
        self.reads.append(index)
        return types.SimpleNamespace(L2_cache_size=self.l2_by_index[index])


def test_flush_buffer_is_each_devices_l2_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from prescreen.hooks import select_algorithm as sel

    backend = _FakeGpuBackend({0: 60 * 2**20, 1: 40 * 2**20, 2: 0})
    monkeypatch.setattr(torch, "fakegpu", backend, raising=False)
    monkeypatch.setattr(sel, "_flush_bytes", {})
    dev = types.SimpleNamespace
    assert sel.flush_buffer_bytes(dev(type="fakegpu", index=0)) == 60 * 2**20
    assert sel.flush_buffer_bytes(dev(type="fakegpu", index=1)) == 40 * 2**20
    assert sel.flush_buffer_bytes(dev(type="fakegpu", index=2)) == sel.TRITON_FLUSH_BYTES  # L2 unknown
    backend.current = 1
    assert sel.flush_buffer_bytes(dev(type="fakegpu", index=None)) == 40 * 2**20  # the current device's
    assert sel.flush_buffer_bytes(dev(type="fakegpu", index=0)) == 60 * 2**20
    assert backend.reads == [0, 1, 2]
    assert sel.flush_buffer_bytes(dev(type="cpu", index=None)) == 0
    assert sel.flush_buffer_bytes(dev(type="nosuchgpu", index=0)) == sel.TRITON_FLUSH_BYTES
