"""An out-of-memory error in torch_npu's grouped runtime benchmark: the call completes, and the fact is stored.

Driven through the real torch-npu 2.14.0 wheel's code (``npu_wheel.upstream_grouped_runtime``):
its ``NPUCachingAutotuner`` and ``NPUSymbolicGroupedAutotuner`` classes whole, and
its grouped candidate-plan builder ``_triton_config_npu_index_grouped`` with its
launch-policy helpers and ``symbolic_grouping``. What needs CANN or Triton is a
stand-in: the base ``CachingAutotuner``, ``triton.Config``, the Triton compile
(``_precompile_config``: a "launcher" that runs the kernel with torch on the host,
block by block as the launched grid would), the benchmarker, and the per-size
config generator. The device is simulated by an allocator with a capacity: the
wheel's own allocation hook ``_benchmark_tensor_factory`` (used for every
synthesized benchmark tensor) and the clone of mutated arguments go through it,
and raise ``torch.OutOfMemoryError`` past the capacity; tensors give their bytes
back when they die. Nothing here ran on an NPU.

The kernel: ``out_ptr0[x] = sum(in_ptr0[x, :10])`` over ``x0`` with one feature
bucketed at 8 (groups x0 <= 8 and x0 > 8, representatives 8 and 16). Its
grouped benchmark synthesizes 176 bytes for group 0 and 352 for group 1.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import npu_wheel
import pytest
import torch
from strategies import upstream_meta

from prescreen.budget import NPU_RATIO_ENV, RATIO_ENV
from prescreen.decision import is_observed_oom
from prescreen.hooks import npu, state
from prescreen.service import COUNTERS
from prescreen.store import DiskStore

GiB = 2**30
KERNEL = "triton_poi_fused_sum_0"
ARG_NAMES = ("out_ptr0", "in_ptr0", "x0_numel")
SYNTH_GROUP0, SYNTH_GROUP1 = 176, 352  # bytes the wheel's benchmark synthesizes per group
CLONE_GROUP0, CLONE_GROUP1 = 16, 32  # the mutated out_ptr0, cloned for every benchmarked launch


class Device:
    """A device with ``capacity`` bytes; an allocation past it raises the allocator's OOM."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.live: list[weakref.ref[torch.Tensor]] = []
        self.oom_at: int | None = None  # benchmarks started when the OOM was raised (the failing one included)

    def allocate(self, make: Callable[[], torch.Tensor], nbytes: int, benchmarks: int) -> torch.Tensor:
        if self.used + nbytes > self.capacity:
            self.oom_at = benchmarks
            raise torch.OutOfMemoryError(
                f"NPU out of memory. Tried to allocate {nbytes:.2f} B "
                f"({self.capacity - self.used} bytes free)")
        tensor = make()
        self.used += nbytes
        weakref.finalize(tensor, self._free, nbytes)
        self.live.append(weakref.ref(tensor))
        return tensor

    def _free(self, nbytes: int) -> None:
        self.used -= nbytes

    def live_tensors(self) -> int:
        return sum(ref() is not None for ref in self.live)


class Benchmarker:
    """Triton's benchmarker: runs the call once; the time favours the smaller ``X0BLOCK_SUB`` (not the first)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.current: Any = None

    def benchmark_gpu(self, fn: Callable[[], None], rep: int = 1, device_type: str | None = None) -> float:
        self.started.append(repr(self.current))
        fn()
        return float(self.current.config.kwargs["X0BLOCK_SUB"]) if self.current is not None else 1.0


class Launcher:
    """A "compiled" variant: runs the kernel on the host, one program per ``X0BLOCK`` rows."""

    def __init__(self, config: Any, kernel: Any) -> None:
        self.config = config
        self.kernel = kernel
        self.runnable = True
        self.n_spills = 0
        self.store_cubin = False

    def __call__(self, out: torch.Tensor, inp: torch.Tensor, numel: int, block: int, stream: object = None) -> None:
        self.kernel.launches.append((self.config.kwargs["X0BLOCK_SUB"], int(numel), int(block),
                                     self.kernel.device.used, self.kernel.device.live_tensors()))
        for start in range(0, int(numel), int(block)):
            out[start:start + block] = inp[start:start + block].sum(-1)


class CompileResult:
    def __init__(self, config: Any, kernel: Any) -> None:
        self.config, self.kernel = config, kernel

    def make_launcher(self) -> Launcher:
        return Launcher(self.config, self.kernel)


def legacy_configs(size_hints: dict[str, int], inductor_meta: dict[str, Any]) -> list[npu_wheel.StandInConfig]:
    """Two configs per representative size, as the non-grouped heuristic would list them."""
    n = int(size_hints["x0"])
    return [npu_wheel.StandInConfig({"X0BLOCK": n, "X0BLOCK_SUB": 4}, num_warps=1, num_stages=1),
            npu_wheel.StandInConfig({"X0BLOCK": max(1, n // 2), "X0BLOCK_SUB": 2}, num_warps=1, num_stages=1)]


def kernel_meta() -> dict[str, Any]:
    """The codegen's ``inductor_meta`` for the kernel (torch_npu's footprint-test plan, size arg named as the codegen does)."""
    meta: dict[str, Any] = upstream_meta()
    meta["kernel_name"] = KERNEL
    for spec in meta["ordered_arg_specs"]:
        spec["device"] = "npu:0"
        if spec["kind"] == "size":
            spec["name"] = "x0_numel"
    meta.update(group_enabled=True, group_template="pointwise", group_workload=None, primary_group_axis="x0",
                static_split_axes=(), secondary_runtime_symbolic_axes=(), runtime_block_arg_names=("X0BLOCK",))
    return meta


Runtime = tuple[dict[str, object], Benchmarker]


@pytest.fixture(scope="module")
def runtime() -> Iterator[Runtime]:
    if npu_wheel.npu_wheel_path() is None:
        pytest.skip(npu_wheel.unavailable_reason())
    bench = Benchmarker()
    config = types.SimpleNamespace(aggresive_autotune=False, precompile_thread_num=1, num_vector_core=48)
    yield npu_wheel.upstream_grouped_runtime(config, bench, legacy_configs), bench


@pytest.fixture()
def store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A store, torch_npu's config module (its 0.25 default) and a 64 GiB ``torch.npu``, as a process would see them."""
    monkeypatch.delenv(NPU_RATIO_ENV, raising=False)
    monkeypatch.delenv(RATIO_ENV, raising=False)
    monkeypatch.setitem(sys.modules, npu.CONFIG_MODULE, npu_wheel.import_upstream_npu_config())
    fake_npu = types.SimpleNamespace(get_device_properties=lambda _d: types.SimpleNamespace(total_memory=64 * GiB))
    monkeypatch.setattr(torch, "npu", fake_npu, raising=False)
    state.reset()
    state.configure(store=DiskStore(tmp_path / "store"))
    yield tmp_path / "store"
    state.reset()


def make_kernel(runtime: Runtime, capacity: int, hooked: bool = True) -> Any:
    """The wheel's grouped autotuner for the kernel, with its candidate plan built by the wheel's own builder."""
    namespace, bench = runtime
    meta = kernel_meta()
    triton_meta = {"signature": {"out_ptr0": "*fp16", "in_ptr0": "*fp16", "x0_numel": "i32"}, "device": 0}
    variants = namespace["_triton_config_npu_index_grouped"]({"x0": 16}, meta, triton_meta=triton_meta)  # type: ignore[operator]
    device = Device(capacity)

    def precompile_config(self: Any, cfg: Any) -> CompileResult:  # the Triton compile
        return CompileResult(cfg, self)

    def benchmark_tensor_factory(self: Any, size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype,
                                 _device: object) -> torch.Tensor:  # the wheel's allocation hook
        numel = 0 if 0 in size else 1 + sum((d - 1) * s for d, s in zip(size, stride))
        make = lambda: torch.empty_strided(size, stride, dtype=dtype).fill_(1)  # noqa: E731
        device: Device = self.device
        return device.allocate(make, numel * dtype.itemsize, len(bench.started))

    def allocate_clone(self: Any, tensor: torch.Tensor) -> torch.Tensor:
        device: Device = self.device
        return device.allocate(tensor.clone, tensor.untyped_storage().nbytes(), len(bench.started))

    def bench_with_launch_args(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        bench.current = launcher
        return upstream_bench(self, launcher, *args, **kwargs)

    base: Any = namespace["NPUSymbolicGroupedAutotuner"]
    upstream_bench = base._bench_with_launch_args
    cls = type("GroupedKernel", (base,), {
        "_precompile_config": precompile_config, "_benchmark_tensor_factory": benchmark_tensor_factory,
        "allocate_clone": allocate_clone, "_bench_with_launch_args": bench_with_launch_args,
    })
    if hooked:
        npu.patch_runtime_class(cls)
    fn = types.SimpleNamespace(arg_names=list(ARG_NAMES), __name__=KERNEL, fn=types.SimpleNamespace(__name__=KERNEL))
    kernel = cls(fn, triton_meta, variants, None, ["out_ptr0"], False, namespace["HeuristicType"].POINTWISE,  # type: ignore[attr-defined]
                 {"x0": 16}, meta)
    kernel.device, kernel.launches = device, []
    bench.started.clear()
    return kernel


def call(kernel: Any, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled graph's call: real arguments in, the kernel's output and eager's out."""
    inp = torch.arange(numel * 10, dtype=torch.float16).reshape(numel, 10) % 7
    out = torch.full((numel,), float("nan"), dtype=torch.float16)
    kernel.run(out, inp, numel, stream=0)
    return out, inp.sum(-1)


def first_candidates(kernel: Any) -> dict[int, str]:
    plan = kernel.candidate_plan
    return {g: plan["group_to_candidates"][g][0]["candidate_id"] for g in kernel.reachable_selection_keys}


def chosen(kernel: Any) -> dict[int, str]:
    return {g: c["candidate_id"] for g, c in kernel.best_candidate_map.items()}


def observed(store_dir: Path) -> list[Any]:
    return [e for e in DiskStore(store_dir).entries() if is_observed_oom(e.decision)]


def test_without_oom_the_groups_are_benchmarked_and_nothing_is_stored(runtime: Runtime, store_dir: Path) -> None:
    kernel = make_kernel(runtime, capacity=10**6)
    out, eager = call(kernel, 13)
    assert torch.equal(out, eager)
    assert len(runtime[1].started) == 4  # two candidates in each of two groups
    assert chosen(kernel) == {0: "g0_c1", 1: "g1_c1"}  # the benchmark's winners, not the first configs
    assert first_candidates(kernel) == {0: "g0_c0", 1: "g1_c0"}
    assert observed(store_dir) == []


def test_without_prescreen_the_oom_kills_the_call(runtime: Runtime, store_dir: Path) -> None:
    kernel = make_kernel(runtime, capacity=SYNTH_GROUP0 + 100, hooked=False)
    with pytest.raises(torch.OutOfMemoryError):
        call(kernel, 13)
    assert observed(store_dir) == []


@pytest.mark.parametrize(
    ("where", "capacity", "benchmarks_before", "requested"),
    [
        # group 1's synthesized in_ptr0 (320 bytes) does not fit: nothing was benchmarked yet
        ("synthesizing group 1", SYNTH_GROUP0 + 100, 0, 320),
        # everything is synthesized; group 0's two candidates are benchmarked, and the clone of out_ptr0
        # for group 1's first benchmark (32 bytes) does not fit
        ("benchmarking group 1", SYNTH_GROUP0 + SYNTH_GROUP1 + CLONE_GROUP0 + 1, 3, CLONE_GROUP1),
    ],
)
def test_oom_falls_back_to_each_groups_first_config_and_completes(runtime: Runtime, store_dir: Path, where: str,
                                                                  capacity: int, benchmarks_before: int,
                                                                  requested: int) -> None:
    kernel = make_kernel(runtime, capacity=capacity)
    calls = COUNTERS.observed_oom
    out, eager = call(kernel, 13)  # group 1 (x0 > 8)

    assert torch.equal(out, eager), where
    assert kernel.device.oom_at == benchmarks_before
    assert len(runtime[1].started) == benchmarks_before, "no benchmark may run after the OOM"
    assert chosen(kernel) == first_candidates(kernel) == {0: "g0_c0", 1: "g1_c0"}
    for group, candidate in kernel.best_candidate_map.items():
        assert kernel.best_launcher_map[group] is kernel.variant_launcher_map[candidate["variant_id"]]
    # the launch ran with the first config's block (the runtime rule at x0=13) after the failed step's
    # benchmark tensors were all given back
    sub, numel, block, used, live = kernel.launches[-1]
    assert (sub, numel, used, live) == (4, 13, 0, 0)
    assert block >= 1 and math.ceil(13 / block) <= 48

    entries = observed(store_dir)
    assert len(entries) == 1 and COUNTERS.observed_oom == calls + 1
    reason = entries[0].decision.reason
    assert "OutOfMemoryError: NPU out of memory" in reason and f"requested_bytes={requested} " in reason

    # later calls in this process: every group has its winner, no benchmark, no allocation
    launches = len(kernel.launches)
    out, eager = call(kernel, 5)  # group 0
    assert torch.equal(out, eager)
    assert len(kernel.launches) == launches + 1 and kernel.launches[-1][0] == 4
    assert len(runtime[1].started) == benchmarks_before and kernel.device.used == 0


def test_a_later_compile_hits_the_observed_oom_and_takes_the_non_grouped_path(runtime: Runtime, store_dir: Path) -> None:
    kernel = make_kernel(runtime, capacity=SYNTH_GROUP0 + 100)
    call(kernel, 13)
    assert len(observed(store_dir)) == 1

    upstream, _ = npu_wheel.upstream_kernel_class({"total": 64 * GiB}, sys.modules[npu.CONFIG_MODULE])
    hooked = type("HookedKernel", (upstream,), {})
    npu.patch_class(hooked)
    # a new process: fresh hook state over the same store directory
    state.reset()
    state.configure(store=DiskStore(store_dir))
    theirs, ours = kernel_meta(), kernel_meta()
    upstream()._disable_grouped_autotune_if_benchmark_too_large(theirs, "npu:0")
    estimates = COUNTERS.estimator_calls
    hooked()._disable_grouped_autotune_if_benchmark_too_large(ours, "npu:0")
    assert theirs["group_enabled"] is True  # torch_npu's own estimate (560 bytes) fits 64 GiB: it would group
    assert ours["group_enabled"] is False  # the stored observed_oom: the non-grouped path
    assert COUNTERS.estimator_calls == estimates, "a store hit, not a new estimate"


SECOND_PROCESS = """
import json, sys, types
sys.path.insert(0, {tests!r})
import torch, npu_wheel
from prescreen.hooks import npu, state
from prescreen.service import COUNTERS
from prescreen.store import DiskStore
config = npu_wheel.import_upstream_npu_config()
sys.modules[npu.CONFIG_MODULE] = config
torch.npu = types.SimpleNamespace(get_device_properties=lambda _d: types.SimpleNamespace(total_memory=64 * 2**30))
upstream, _ = npu_wheel.upstream_kernel_class({{"total": 64 * 2**30}}, config)
hooked = type("HookedKernel", (upstream,), {{}})
npu.patch_class(hooked)
state.configure(store=DiskStore({store!r}))
theirs, ours = json.loads({meta!r}), json.loads({meta!r})
upstream()._disable_grouped_autotune_if_benchmark_too_large(theirs, "npu:0")
hooked()._disable_grouped_autotune_if_benchmark_too_large(ours, "npu:0")
print(json.dumps([theirs["group_enabled"], ours["group_enabled"], COUNTERS.estimator_calls, COUNTERS.hits]))
"""


def test_a_second_process_hits_the_stored_entry(runtime: Runtime, store_dir: Path) -> None:
    kernel = make_kernel(runtime, capacity=SYNTH_GROUP0 + 100)
    call(kernel, 13)
    code = SECOND_PROCESS.format(tests=str(Path(__file__).parent), store=str(store_dir),
                                 meta=json.dumps(kernel_meta()))
    env = {k: v for k, v in __import__("os").environ.items() if k not in (NPU_RATIO_ENV, RATIO_ENV)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs, ours, estimates, hits = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (theirs, ours) == (True, False)  # torch_npu alone would group; the stored observed_oom falls back
    assert estimates == 0 and hits == 1


def test_where_no_first_config_can_run_the_oom_propagates_and_is_still_stored(runtime: Runtime, store_dir: Path) -> None:
    kernel = make_kernel(runtime, capacity=SYNTH_GROUP0 + 100)
    kernel._precompile_variants()
    for launcher in kernel.launchers:
        launcher.runnable = False  # torch_npu would find no benchmark entry for any group either
    with pytest.raises(torch.OutOfMemoryError):
        call(kernel, 13)
    assert kernel.best_launcher_map == {} and kernel.device.used == 0
    assert len(observed(store_dir)) == 1


def test_an_error_that_is_not_an_oom_propagates_unchanged(runtime: Runtime, store_dir: Path) -> None:
    kernel = make_kernel(runtime, capacity=10**6)
    boom = RuntimeError("grouped plan is missing benchmark_axis_values_by_group")

    def broken(*_a: object) -> None:
        raise boom

    kernel._benchmark_tensor_factory = broken
    with pytest.raises(RuntimeError) as info:
        call(kernel, 13)
    assert info.value is boom and kernel.best_launcher_map == {}
    assert observed(store_dir) == []


@pytest.mark.parametrize("damage", ["no plan", "plan without group_to_candidates", "no setter",
                                    "candidate without id", "group out of range"])
def test_first_config_choices_defer_on_a_layout_that_is_not_2_14s(runtime: Runtime, damage: str) -> None:
    kernel = make_kernel(runtime, capacity=10**6)
    kernel._precompile_variants()
    assert [c.candidate_id for c in npu.first_config_choices(kernel)] == ["g0_c0", "g1_c0"]
    if damage == "no plan":
        kernel.candidate_plan = None
    elif damage == "plan without group_to_candidates":
        kernel.candidate_plan = {k: v for k, v in kernel.candidate_plan.items() if k != "group_to_candidates"}
    elif damage == "no setter":
        kernel._set_group_best_candidate = None
    elif damage == "candidate without id":
        kernel.candidate_plan = copy.deepcopy(kernel.candidate_plan)
        del kernel.candidate_plan["group_to_candidates"][1][0]["candidate_id"]
    else:
        kernel.reachable_selection_keys = (0, 1, 2)
    with pytest.raises(npu.Defer):
        npu.first_config_choices(kernel)


def test_under_an_unchecked_torch_npu_release_the_oom_propagates(runtime: Runtime, store_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(npu, "installed_npu_version", lambda: "2.15.0")
    kernel = make_kernel(runtime, capacity=SYNTH_GROUP0 + 100)
    with pytest.raises(torch.OutOfMemoryError):
        call(kernel, 13)
    assert kernel.best_launcher_map == {} and len(runtime[1].started) == 0
