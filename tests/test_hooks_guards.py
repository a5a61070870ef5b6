"""The epilogue-fusion guard and the version checks of the new patches, without a GPU."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
import sympy
import torch
from strategies import free_axes

from prescreen.decision import is_observed_oom
from prescreen.expr import Const
from prescreen.hooks import inductor_fusion as fus
from prescreen.hooks import inductor_select as sel
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
    monkeypatch.setattr(fus, "_is_benchmarked_fusion", lambda _a, _b: True)
    monkeypatch.setattr(fus, "plans_for_fusion", lambda _s, _a, _b: [_plan()])
    monkeypatch.setattr(fus, "_fusion_device", lambda _n: torch.device("cuda", 0))
    return guard_store


def _should_fuse(result: Any) -> bool:
    return bool(getattr(result, "should_fuse", result))


def test_fusion_over_budget_is_not_benchmarked(fusion_on_gpu: DiskStore) -> None:
    calls: list[int] = []

    def upstream(self: Any, a: Any, b: Any) -> bool:
        calls.append(1)
        return True

    guarded = fus._wrap_fusion(upstream)
    state.configure(ratio=1e-9)
    assert not _should_fuse(guarded(None, object(), object()))
    assert calls == []
    assert [e.decision.action for e in fusion_on_gpu.entries()] == ["fallback"]


def test_fusion_within_budget_runs_upstream(fusion_on_gpu: DiskStore) -> None:
    guarded = fus._wrap_fusion(lambda self, a, b: "upstream")
    assert guarded(None, object(), object()) == "upstream"


def test_fusion_oom_leaves_kernels_unfused_and_is_remembered(fusion_on_gpu: DiskStore) -> None:
    calls = []

    def upstream(self: Any, a: Any, b: Any) -> Any:
        calls.append(1)
        raise torch.OutOfMemoryError(OOM_TEXT)

    guarded = fus._wrap_fusion(upstream)
    assert not _should_fuse(guarded(None, object(), object()))
    assert calls == [1]
    (entry,) = list(fusion_on_gpu.entries())
    assert is_observed_oom(entry.decision) and "requested_bytes=536870912" in entry.decision.reason
    assert not _should_fuse(guarded(None, object(), object()))  # a hit: never benchmarked again
    assert calls == [1]


def _deferred(benchmark: Any) -> Any:
    """``speedup_by_fusion``'s deferred answer, as torch returns it: the benchmark to run once the kernels compile."""
    from torch._inductor import scheduler

    if not hasattr(scheduler, "FusionResult"):
        pytest.skip("this torch answers speedup_by_fusion with a bool")
    return scheduler.FusionResult.from_callable(benchmark, future=None)


def test_fusion_oom_in_the_deferred_benchmark_is_caught_and_remembered(fusion_on_gpu: DiskStore) -> None:
    """Upstream benchmarks the fused kernel after the call, once it compiles (``_finish_pending_fusions``): an OOM
    there leaves the kernels unfused and is stored, as one in the call is."""
    runs: list[int] = []

    def benchmark_when_ready() -> bool:
        runs.append(1)
        raise torch.OutOfMemoryError(OOM_TEXT)

    guarded = fus._wrap_fusion(lambda self, a, b: _deferred(benchmark_when_ready))
    result = guarded(None, object(), object())
    assert type(result).__name__ == "FusionResult" and result.should_fuse is None
    assert [e.decision.action for e in fusion_on_gpu.entries()] == ["tune"] and runs == []
    assert result.callable_fn() is False and runs == [1]
    (entry,) = list(fusion_on_gpu.entries())
    assert is_observed_oom(entry.decision) and "requested_bytes=536870912" in entry.decision.reason
    assert not _should_fuse(guarded(None, object(), object()))  # a hit: never benchmarked again
    assert runs == [1]


@pytest.mark.parametrize("answer", [True, False])
def test_fusion_deferred_benchmark_answers_as_upstream(fusion_on_gpu: DiskStore, answer: bool) -> None:
    guarded = fus._wrap_fusion(lambda self, a, b: _deferred(lambda: answer))
    assert guarded(None, object(), object()).callable_fn() is answer


def test_fusion_deferred_benchmark_error_that_is_not_an_oom_propagates(fusion_on_gpu: DiskStore) -> None:
    def broken() -> bool:
        raise RuntimeError("triton: an invalid config")

    result = fus._wrap_fusion(lambda self, a, b: _deferred(broken))(None, object(), object())
    with pytest.raises(RuntimeError, match="invalid config"):
        result.callable_fn()
    assert [e.decision.action for e in fusion_on_gpu.entries()] == ["tune"]


def test_fusion_guard_error_lets_upstream_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_a: Any, _b: Any) -> bool:
        raise AttributeError("no such node field in this torch")

    monkeypatch.setattr(fus, "_is_benchmarked_fusion", broken)
    assert fus._wrap_fusion(lambda self, a, b: "upstream")(None, object(), object()) == "upstream"


def test_fusion_tunes_only_if_every_benchmarked_kernel_fits(monkeypatch: pytest.MonkeyPatch,
                                                            fusion_on_gpu: DiskStore) -> None:
    """The kernels are benchmarked one at a time: one plan each, and any plan over budget skips the step."""
    small, big = _plan(), KernelPlan(group_features=(), axis_names=(), axis_static_values=(),
                                     args=(TensorArg("buf0", "buffer", (Const(2**20), Const(2**14)),
                                                     (Const(2**14), Const(1)), "torch.float16", "cuda:0"),),
                                     kernel_name="fusion:fused")
    monkeypatch.setattr(fus, "plans_for_fusion", lambda _s, _a, _b: [small, big])  # 32 MiB and 32 GiB
    calls: list[int] = []
    guarded = fus._wrap_fusion(lambda self, a, b: calls.append(1) or True)
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
        plans = fus.plans_for_fusion(self, node1, node2)
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
        plans = fus.plans_for_fusion(self, node1, node2)
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


def _exprs(arg: Any) -> list[Any]:
    return [*arg.size, *arg.stride] if isinstance(arg, TensorArg) else [arg.count]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_fusion_plans_axes_are_its_buffers_symbols(monkeypatch: pytest.MonkeyPatch, dynamic: bool) -> None:
    """A symbolic buffer's shape families are the axes of each plan that takes it; a clone is its buffer
    converted again under the clone's label; building the plans again gives equal plans."""
    from torch._inductor import config as inductor_config
    from torch._inductor import scheduler

    seen: list[bool] = []
    original = scheduler.Scheduler.speedup_by_fusion

    def spy(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        plans = fus.plans_for_fusion(self, node1, node2)
        assert plans == fus.plans_for_fusion(self, node1, node2)
        for plan in plans:
            by_label = {a.name: a for a in plan.args}
            for label, arg in by_label.items():
                if label.endswith("clone"):
                    assert arg == dataclasses.replace(by_label[label.split(".")[0]], name=label)
        for plan in plans:  # every symbol of a plan's arguments is one of its axes
            assert {a for arg in plan.args for e in _exprs(arg) for a in free_axes(e)} <= set(plan.axis_names)
        seen.append(any(p.axis_names for p in plans))
        return original(self, node1, node2, *args, **kwargs)

    monkeypatch.setattr(scheduler.Scheduler, "speedup_by_fusion", spy)
    torch._dynamo.reset()
    x = torch.rand(64, 128)
    with inductor_config.patch(force_disable_caches=True):
        out = torch.compile(lambda t: (t * 2).sum(1).relu() + 1, backend="inductor", dynamic=dynamic)(x)
    torch.testing.assert_close(out, (x * 2).sum(1).relu() + 1)
    assert seen and all(axes == dynamic for axes in seen)


def test_patch_installs_every_guard_and_unpatch_restores_upstream() -> None:
    from torch._inductor import scheduler
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    originals = (AlgorithmSelectorCache.__call__, AlgorithmSelectorCache.autotune,
                 scheduler.Scheduler.speedup_by_fusion)
    was = [hasattr(f, sel.ORIGINAL_ATTR) for f in originals]
    sel.unpatch()
    try:
        assert sel.patch()
        assert hasattr(AlgorithmSelectorCache.__call__, sel.ORIGINAL_ATTR)
        assert hasattr(AlgorithmSelectorCache.autotune, sel.ORIGINAL_ATTR)
        assert hasattr(scheduler.Scheduler.speedup_by_fusion, sel.ORIGINAL_ATTR)
        sel.unpatch()
        assert not hasattr(AlgorithmSelectorCache.autotune, sel.ORIGINAL_ATTR)
        assert not hasattr(scheduler.Scheduler.speedup_by_fusion, sel.ORIGINAL_ATTR)
    finally:
        if any(was):
            sel.patch()


def test_an_autotune_with_another_signature_is_left_alone(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    class Fake:
        def autotune(self, choices: Any, name: Any) -> None:  # parameters in another order
            pass

    original = Fake.autotune
    assert not sel.patch_attr(Fake, "autotune", sel._AUTOTUNE_PARAMS, sel._wrap_autotune, "autotune OOM-retry")
    assert Fake.autotune is original
    assert "does not take (name, input_nodes, layout, input_gen_fns, choices)" in caplog.text


def test_conv_workspace_copies_on_gpus_only() -> None:
    cuda = torch.device("cuda", 0)
    assert sel.extern_workspace_copies("convolution", cuda) == sel.CONV_WORKSPACE_COPIES["contiguous"] == (2, 1)
    assert sel.extern_workspace_copies("convolution", torch.device("cpu")) == (0, 0)
    assert sel.extern_workspace_copies("mm", cuda) == (0, 0)


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
    assert sel.extern_workspace_copies("convolution", cuda, Conv(), nhwc) == (1, 0)
    assert sel.extern_workspace_copies("convolution", cuda, Conv(), nchw) == (2, 1)


class _StaticSizeVars:
    def optimization_hint(self, e: Any, fallback: int = 0) -> int:
        return int(e)

    size_hint = optimization_hint


@pytest.mark.parametrize(("strides", "copies"), [
    (([25088, 49, 7, 1], [4608, 9, 3, 1]), (2, 1)),  # contiguous: one weight more, as ResNet-50 measured
    (([25088, 1, 3584, 512], [4608, 1, 1536, 512]), (1, 0)),  # channels-last
])
def test_convolution_selection_plan_counts_cudnns_workspace(strides: tuple[list[int], list[int]],
                                                            copies: tuple[int, int]) -> None:
    """ResNet-50's 512x512x3x3 convolution on 16x512x7x7 fp16: the plan holds input, weight, output, the
    workspace's copies of (input + output) and of the weight, flush and slack."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    from prescreen.budget import Budget
    from prescreen.decision import decide

    cuda = torch.device("cuda", 0)
    x = ir.Buffer(name="x", layout=ir.FixedLayout(cuda, torch.float16, [16, 512, 7, 7], strides[0]))
    w = ir.Buffer(name="w", layout=ir.FixedLayout(cuda, torch.float16, [512, 512, 3, 3], strides[1]))
    out = ir.FixedLayout(cuda, torch.float16, [16, 512, 7, 7], strides[0])
    graph = types.SimpleNamespace(sizevars=_StaticSizeVars())
    with V.set_graph_handler(graph):  # type: ignore[arg-type]
        plan = sel.plan_for_selection("convolution", [x, w], out)
    activation, weight = 16 * 512 * 49 * 2, 512 * 512 * 9 * 2
    expected = (2 * activation + weight) + copies[0] * 2 * activation + copies[1] * weight
    fixed = sel.flush_buffer_bytes(cuda) + sel.GPU_SLACK_BYTES
    assert decide(plan, Budget("cuda", 2**40, 1.0)).estimated_bytes == expected + fixed


_S0 = sympy.Symbol("s0", positive=True, integer=True)


class _Range:
    def __init__(self, lower: int, upper: int) -> None:
        self.lower, self.upper = lower, upper


class _RangedShapeEnv:
    """A ShapeEnv's range table and ``bound_sympy``."""

    def __init__(self) -> None:
        self.var_to_range = {_S0: _Range(2, 10**9)}

    def bound_sympy(self, e: Any) -> _Range:
        return self.var_to_range[e]


class _RangedSizeVars:
    """A graph's sizevars: s0's hint is 3000."""

    def __init__(self) -> None:
        self.shape_env = _RangedShapeEnv()

    def size_hint(self, e: Any, fallback: int = 0) -> int:
        return int(sympy.sympify(e).subs({_S0: 3000}))

    optimization_hint = size_hint


def test_each_plan_of_one_converter_has_the_axes_met_since_the_last() -> None:
    """A step's plans share one converter (each symbol read once); a plan's axes are its own symbols only."""
    conv = sel._Converter(_RangedSizeVars())
    conv.expr(_S0 * 2)
    first = sel.benchmark_plan(conv, [], torch.device("cpu"), "first")
    conv.expr(64)
    second = sel.benchmark_plan(conv, [], torch.device("cpu"), "second")
    conv.expr(_S0)
    third = sel.benchmark_plan(conv, [], torch.device("cpu"), "third")
    assert (first.axis_names, second.axis_names, third.axis_names) == (("s0",), (), ("s0",))
    assert first.axis_static_values == third.axis_static_values == (("s0", 4096),)


def test_a_symbols_family_follows_its_current_range_name_and_scheme() -> None:
    """Each plan reads a symbol's family as the graph holds it now: a range a guard narrowed, a name from
    ``warm`` and the bucketing scheme all show in the next plan."""
    from prescreen import families
    from prescreen.expr import Axis, Mul

    def converted(graph: _RangedSizeVars,
                  scheme: families.Scheme | None = None) -> tuple[dict[str, int], dict[str, str]]:
        conv = sel._Converter(graph, scheme)
        assert conv.expr(_S0 * 2) == Mul((Const(2), Axis("s0")))
        return conv.statics, conv.labels

    graph = _RangedSizeVars()
    assert converted(graph) == ({"s0": 4096}, {"s0": "s0 in (2048, 4096]"})
    graph.shape_env.var_to_range[_S0] = _Range(2, 3500)  # a guard narrowed it
    assert converted(graph) == ({"s0": 3500}, {"s0": "s0 in (2048, 3500]"})
    with families.naming({"batch": 3000}):
        assert converted(graph) == ({"s0": 3500}, {"s0": "batch in (2048, 3500]"})
    assert converted(graph, families.parse_scheme("exact")) == ({"s0": 3000}, {})


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
