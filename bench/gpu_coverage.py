"""Does the guard hold for the whole compile? Every op family, measured on a CUDA device.

For each case: FX-graph and autotune caches off (the Inductor cache directory is
a fresh temporary one), ``torch.compile(mode="max-autotune-no-cudagraphs",
dynamic=True)``, prescreen installed at ratio 1.0 (every decision is tune, so
every benchmark really runs). Measured with ``torch.cuda.max_memory_allocated``:

- whole: the peak the compile and first call add over the inputs (the first
  call's own output and intermediates are in it: that part is the model's, not
  the benchmark's, and is shown apart);
- step: the peak inside each guarded step over what was allocated when it
  began: ``AlgorithmSelectorCache.autotune`` (selection benchmark),
  ``Scheduler.speedup_by_fusion`` when it benchmarks (epilogue fusion; the
  fused benchmark it defers until the kernels compile is a step of its own),
  and ``CachingAutotuner.benchmark_all_configs`` (Triton runtime autotuning);
- estimate: prescreen's estimate for the same step (the plan the guard builds);
- guard ms: the time spent in prescreen's own code during the case, exactly: the
  time inside each of prescreen's wrappers (``AlgorithmSelectorCache.__call__``,
  ``.autotune`` and ``.lookup``, ``Scheduler.speedup_by_fusion``,
  ``CachingAutotuner.benchmark_all_configs`` and ``._coordinate_descent_tuning``) minus the time inside the upstream
  method that wrapper calls (both timed by wrappers put around them, below and
  above prescreen's: ``GuardClock``). Building plans, lookups, opening the
  store, logging and the wrappers themselves are in it; the meter's own time
  in each call (``meter_bias``, measured at start) is taken off, and the row
  keeps the calls per wrapper and the time before that correction;
- guard CPU ms: the compiling thread's CPU in the same windows, and the CPU the
  process's other threads ran meanwhile (``others_cpu_ms_in_guard``): a guard's
  wall far above its CPU is a wait for the GIL, filled with their work or idle; of the
  thread's CPU, the system part and its voluntary context switches (``guard_system_cpu_ms``,
  ``guard_waits``): the wake-ups of those waits, the rest being Python work.

    python bench/gpu_coverage.py [--cases mm,bmm,...] [--json out.json]

``--cases`` also takes whole models (``MODELS``: GPT-2, a 4-layer Llama, ResNet-50, random weights).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import platform
import resource
import tempfile
import time
import traceback
from collections.abc import Callable, MutableMapping
from typing import Any

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-coverage-"))

import torch  # noqa: E402

Case = Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]
dev = "cuda"
f16, bf16 = torch.float16, torch.bfloat16


def _r(*shape: int, dtype: torch.dtype = f16) -> torch.Tensor:
    return torch.randn(*shape, device=dev, dtype=dtype)


def case_mm() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (lambda a, b: a @ b), (_r(8192, 4096), _r(4096, 4096))


def case_mm_t() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (lambda a, b: a @ b.t()), (_r(8192, 4096), _r(4096, 4096))


def case_bmm() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (lambda a, b: torch.bmm(a, b)), (_r(32, 1024, 1024), _r(32, 1024, 1024))


def case_addmm() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (lambda c, a, b: torch.addmm(c, a, b)), (_r(4096), _r(8192, 4096), _r(4096, 4096))


def case_mm_epilogue() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (lambda a, b, c: torch.relu(a @ b) * c), (_r(8192, 4096), _r(4096, 4096), _r(8192, 4096))


def case_mlp() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    model = model.to(dev, bf16).eval()
    return model, (_r(8192, 1024, dtype=bf16),)


def case_block() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from tiny_models import Block

    torch.manual_seed(0)
    model = Block(d_model=512, heads=8).to(dev, bf16).eval()
    return model, (_r(8, 512, 512, dtype=bf16),)


def _conv(dim: int, channels_last: bool = False) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    torch.manual_seed(0)
    cls = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dim]
    model = cls(128, 128, 3, padding=1).to(dev, f16).eval()
    shape = {1: (32, 128, 8192), 2: (32, 128, 128, 128), 3: (4, 128, 32, 32, 32)}[dim]
    x = _r(*shape)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        x = x.to(memory_format=torch.channels_last)
    return model, (x,)


def case_conv2d_weight_heavy() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """ResNet-50's stage-4 3x3 convolution: a weight (4.5 MiB) larger than its activations (0.8 MiB each)."""
    torch.manual_seed(0)
    return torch.nn.Conv2d(512, 512, 3, padding=1, bias=False).to(dev, f16).eval(), (_r(16, 512, 7, 7),)


def case_int_mm() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    a = torch.randint(-8, 8, (8192, 4096), device=dev, dtype=torch.int8)
    b = torch.randint(-8, 8, (4096, 4096), device=dev, dtype=torch.int8)
    return (lambda x, y: torch._int_mm(x, y)), (a, b)


def case_scaled_mm() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    a = _r(8192, 4096).to(torch.float8_e4m3fn)
    b = _r(4096, 4096).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as cuBLASLt wants
    sa, sb = torch.tensor(1.0, device=dev), torch.tensor(1.0, device=dev)
    return (lambda x, y, s, t: torch._scaled_mm(x, y, scale_a=s, scale_b=t, out_dtype=bf16)), (a, b, sa, sb)


def case_flex() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    from torch.nn.attention.flex_attention import flex_attention

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + (i - j) * 0.01)

    return f, (_r(4, 8, 2048, 64), _r(4, 8, 2048, 64), _r(4, 8, 2048, 64))


def case_pointwise_mutated() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5).add_(y)
        return x

    return f, (torch.randn(2**28, device=dev), torch.randn(2**28, device=dev))  # 1 GiB each, x mutated


def case_reduction_mutated() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.sub_(x.mean(dim=-1, keepdim=True))
        return x

    return f, (torch.randn(2**16, 2**12, device=dev),)  # 1 GiB, mutated by a reduction kernel


def _causal_lm(kind: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A Hugging Face causal LM with random weights, fp16, 4 x 256 tokens: GPT-2 (124M) or a 4-layer Llama."""
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2":
        config: Any = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                          num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16)
        model = transformers.LlamaForCausalLM(config)
    model = model.to(dev, f16).eval()
    ids = torch.randint(0, config.vocab_size, (4, 256), device=dev)
    return (lambda x: model(input_ids=x, use_cache=False).logits), (ids,)


def case_resnet50() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50().to(dev, f16).eval(), (_r(16, 3, 224, 224),)


def _raise_peak() -> None:
    """Allocate and free 3 GiB: the process's peak now leaves room for upstream to clone on the device."""
    scratch = torch.empty(3 * 2**30, dtype=torch.uint8, device=dev)
    del scratch


#: Run after the peak is reset and before the compile (what the process did before).
BEFORE_COMPILE: dict[str, Callable[[], None]] = {"pointwise_mutated_headroom": _raise_peak}

CASES: dict[str, Case] = {
    "mm": case_mm,
    "mm_transposed": case_mm_t,
    "bmm": case_bmm,
    "addmm_bias": case_addmm,
    "mm_epilogue": case_mm_epilogue,
    "mlp": case_mlp,
    "transformer_block": case_block,
    "conv1d": lambda: _conv(1),
    "conv2d": lambda: _conv(2),
    "conv2d_channels_last": lambda: _conv(2, channels_last=True),
    "conv3d": lambda: _conv(3),
    "conv2d_weight_heavy": case_conv2d_weight_heavy,
    "int_mm": case_int_mm,
    "scaled_mm_fp8": case_scaled_mm,
    "flex_attention": case_flex,
    "pointwise_mutated": case_pointwise_mutated,
    "reduction_mutated": case_reduction_mutated,
    "pointwise_mutated_headroom": case_pointwise_mutated,
}

#: Whole models (random weights), named with ``--cases``; minutes each, so not in the default run.
MODELS: dict[str, Case] = {
    "gpt2": lambda: _causal_lm("gpt2"),
    "llama_4layer": lambda: _causal_lm("llama"),
    "resnet50": case_resnet50,
}


class Meter:
    """Step peaks over what was allocated when each step began.

    Selection and fusion steps reset ``max_memory_allocated`` at entry (a nested
    step's peak is folded into its parents, and a parent's estimate covers its
    children's: each nested step is guarded by its own decision). Runtime
    autotuning is measured from the allocator's trace instead
    (``torch.cuda.memory._record_memory_history``): resetting the peak there would
    change what upstream does, since under ``optimize_mem`` it clones a mutated
    argument only when the clone fits under the peak reached so far.
    """

    def __init__(self) -> None:
        self.stack: list[dict[str, Any]] = []
        self.global_peak = 0
        self.steps: list[dict[str, Any]] = []

    def _fold(self) -> int:
        torch.cuda.synchronize()
        cur = torch.cuda.max_memory_allocated()
        self.global_peak = max(self.global_peak, cur)
        for frame in self.stack:
            frame["peak"] = max(frame["peak"], cur)
        return cur

    def enter(self, kind: str, kernel: str, estimate: Callable[[], int | None]) -> None:
        self._fold()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.stack.append({"kind": kind, "kernel": kernel, "estimate": estimate(), "base": base, "peak": base,
                           "children": 0})

    def step(self, kind: str, kernel: str, estimate: Callable[[], int | None], fn: Callable[[], Any]) -> Any:
        """``fn()`` as one guarded step, between ``enter`` and ``exit``."""
        self.enter(kind, kernel, estimate)
        try:
            return fn()
        finally:
            self.exit()

    def exit(self) -> None:
        self._fold()
        frame = self.stack.pop()
        est = max(frame["estimate"] or 0, frame["children"]) or None
        if self.stack:
            self.stack[-1]["children"] = max(self.stack[-1]["children"], est or 0)
        self._record(frame["kind"], frame["kernel"], est, frame["peak"] - frame["base"])

    def _record(self, kind: str, kernel: str, est: int | None, step: int) -> None:
        self.steps.append({"kind": kind, "kernel": kernel, "estimate": est, "step_peak": step,
                           "ratio": round(est / step, 3) if est and step > 0 else None})

    def traced(self, kind: str, kernel: str, estimate: int | None, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` with the allocator's trace on, without touching the peak statistics."""
        import inspect

        record = torch.cuda.memory._record_memory_history
        extra = {"clear_history": True} if "clear_history" in inspect.signature(record).parameters else {}
        torch.cuda.synchronize()
        record(enabled="all", context=None, stacks="python", max_entries=1_000_000, **extra)
        try:
            result = fn()
            torch.cuda.synchronize()
            trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
        finally:
            record(enabled=None)
        running = peak = 0
        for event in trace:
            if event["action"] == "alloc":
                running += event["size"]
                peak = max(peak, running)
            elif event["action"] == "free_completed":
                running -= event["size"]
        self._fold()
        self._record(kind, kernel, estimate, peak)
        return result

    def peak(self) -> int:
        self._fold()
        return self.global_peak


GUARDED = ("select", "autotune", "lookup", "fusion", "runtime", "coordesc")


def _guarded_methods() -> dict[str, tuple[Any, str]]:
    from torch._inductor import scheduler
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    return {"select": (AlgorithmSelectorCache, "__call__"), "autotune": (AlgorithmSelectorCache, "autotune"),
            "fusion": (scheduler.Scheduler, "speedup_by_fusion"),
            "lookup": (AlgorithmSelectorCache, "lookup"),
            "runtime": (CachingAutotuner, "benchmark_all_configs"),
            "coordesc": (CachingAutotuner, "_coordinate_descent_tuning")}


def _thread_waits() -> tuple[float, int]:
    """The calling thread's system CPU seconds and voluntary context switches so far (Linux)."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_stime, usage.ru_nvcsw


def timed(fn: Callable[..., Any], seconds: MutableMapping[str, float], key: str,
          calls: MutableMapping[str, int] | None = None,
          cpu_seconds: MutableMapping[str, float] | None = None,
          process_seconds: MutableMapping[str, float] | None = None,
          waits: MutableMapping[str, list[float]] | None = None) -> Callable[..., Any]:
    """``fn``, adding the seconds of each call to ``seconds[key]`` (and counting it in ``calls[key]``;
    with ``cpu_seconds``, adding the calling thread's CPU seconds there too, with ``process_seconds``
    the CPU seconds of all the process's threads, and with ``waits`` the thread's system CPU seconds and
    voluntary context switches: each wait for the GIL or for I/O is a switch, its wake-ups system time)."""

    @functools.wraps(fn)  # keeps the signature prescreen checks before it patches
    def timed_call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        cpu_start = time.thread_time() if cpu_seconds is not None else 0.0
        process_start = time.process_time() if process_seconds is not None else 0.0
        waits_start = _thread_waits() if waits is not None else (0.0, 0)
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - start
            if cpu_seconds is not None:
                cpu_seconds[key] += time.thread_time() - cpu_start
            if process_seconds is not None:
                process_seconds[key] += time.process_time() - process_start
            if waits is not None:
                system, switches = _thread_waits()
                waits[key][0] += system - waits_start[0]
                waits[key][1] += switches - waits_start[1]
            if calls is not None:
                calls[key] += 1

    return timed_call


class GuardClock:
    """prescreen's own time, exactly: time inside its wrappers minus time inside the upstream methods they call.

    ``below()`` wraps the upstream methods before prescreen is installed (so
    prescreen's wrappers call the timed ones); ``above()`` wraps prescreen's
    wrappers after. Summed over all wrappers, outer minus inner is prescreen's
    exclusive time, nested wrappers included (the inner time of an outer
    wrapper holds the whole of a nested one, outer and inner). Wall time
    (``split``) and the compiling thread's CPU time (``split_cpu``): the wall
    time also holds the waits for the GIL while Inductor's own threads hold it.
    """

    def __init__(self) -> None:
        self.outer = dict.fromkeys(GUARDED, 0.0)
        self.inner = dict.fromkeys(GUARDED, 0.0)
        self.outer_cpu = dict.fromkeys(GUARDED, 0.0)
        self.inner_cpu = dict.fromkeys(GUARDED, 0.0)
        self.outer_process = dict.fromkeys(GUARDED, 0.0)
        self.inner_process = dict.fromkeys(GUARDED, 0.0)
        self.outer_waits = {k: [0.0, 0.0] for k in GUARDED}  # system CPU seconds, voluntary switches
        self.inner_waits = {k: [0.0, 0.0] for k in GUARDED}
        self.calls = dict.fromkeys(GUARDED, 0)
        self.wrapped: list[str] = []
        self.bias, self.bias_cpu = meter_bias()

    def _wrap(self, table: dict[str, float], cpu: dict[str, float], process: dict[str, float],
              waits: dict[str, list[float]], kind: str, calls: dict[str, int] | None = None) -> None:
        cls, attr = _guarded_methods()[kind]
        # getattr_static: a method a base class defines (``lookup`` is PersistentCache's in torch 2.11)
        setattr(cls, attr, timed(inspect.getattr_static(cls, attr), table, kind, calls, cpu_seconds=cpu,
                                 process_seconds=process, waits=waits))

    def below(self) -> None:
        for kind in GUARDED:
            self._wrap(self.inner, self.inner_cpu, self.inner_process, self.inner_waits, kind)

    def above(self) -> None:
        """Wrap each of prescreen's wrappers; a method prescreen left alone (no Triton) is not counted."""
        for kind, (cls, attr) in _guarded_methods().items():
            if any(name.startswith("_prescreen_original") for name in vars(inspect.getattr_static(cls, attr))):
                self._wrap(self.outer, self.outer_cpu, self.outer_process, self.outer_waits, kind, self.calls)
                self.wrapped.append(kind)
            else:
                print(f"prescreen did not wrap {cls.__name__}.{attr} here: not counted")

    def split(self, raw: bool = False) -> dict[str, float]:
        """Seconds of prescreen's own time so far, per wrapper, less the inner meter's own time in each call
        (``meter_bias``; ``raw``: not taken off)."""
        bias = 0.0 if raw else self.bias
        return {k: self.outer[k] - self.inner[k] - bias * self.calls[k] for k in self.wrapped}

    def split_cpu(self) -> dict[str, float]:
        """CPU seconds of the compiling thread in prescreen's own code so far, per wrapper (bias taken off)."""
        return {k: self.outer_cpu[k] - self.inner_cpu[k] - self.bias_cpu * self.calls[k] for k in self.wrapped}

    def others_cpu(self) -> float:
        """CPU seconds the process's other threads ran while prescreen's own code ran (the meter's own time
        is in both clocks and cancels): where a guard's wall is a wait for the GIL, whether other threads
        worked through it (Inductor's compile threads, doing work the compile needs) or nothing ran."""
        return sum((self.outer_process[k] - self.inner_process[k]) - (self.outer_cpu[k] - self.inner_cpu[k])
                   for k in self.wrapped)

    def waits(self) -> tuple[float, float]:
        """The compiling thread's system CPU seconds and voluntary context switches in prescreen's own code so
        far: a guard CPU mostly system time was the wake-ups of its waits, mostly user time its Python work."""
        return (sum(self.outer_waits[k][0] - self.inner_waits[k][0] for k in self.wrapped),
                sum(self.outer_waits[k][1] - self.inner_waits[k][1] for k in self.wrapped))


def meter_bias(n: int = 50_000) -> tuple[float, float]:
    """Seconds (wall, CPU) the meter itself adds to each wrapped call's outer-minus-inner time: the inner
    wrapper's clock reads and bookkeeping, outside the time it measures and inside the outer one. Measured
    here with no prescreen between the two (about 2 us a call on the CPU box, where coordinate descent's
    wrapper runs at every launch of a template kernel: without this, most of its time was the meter's)."""
    outer, inner, outer_cpu, inner_cpu = {"x": 0.0}, {"x": 0.0}, {"x": 0.0}, {"x": 0.0}
    process = {"x": 0.0}  # read as GuardClock's meters read it: its clock reads are part of the bias
    waits = {"x": [0.0, 0.0]}
    fn = timed(timed(lambda: None, inner, "x", cpu_seconds=inner_cpu, process_seconds=process, waits=waits),
               outer, "x", cpu_seconds=outer_cpu, process_seconds=process, waits=waits)
    for _ in range(n):
        fn()
    return (outer["x"] - inner["x"]) / n, (outer_cpu["x"] - inner_cpu["x"]) / n


def trace_lookups() -> None:
    """With ``--trace-lookups``: one line per lookup that reads the store or decides (plan, groups, hit, ms
    past the key, and the calling thread's CPU ms of them), with the garbage collector's time inside it
    and the threads alive (others may hold the GIL)."""
    import gc
    import threading

    from prescreen import service

    inner = service._lookup_or_decide
    collected = {"seconds": 0.0, "start": 0.0}

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            collected["start"] = time.perf_counter()
        else:
            collected["seconds"] += time.perf_counter() - collected["start"]

    gc.callbacks.append(on_gc)

    def traced(plans: Any, *rest: Any) -> Any:
        cpu_before = time.thread_time()
        start, gc_before = time.perf_counter(), collected["seconds"]
        outs = inner(plans, *rest)
        elapsed = time.perf_counter() - start
        cpu = time.thread_time() - cpu_before
        for plan, out in zip(plans, outs):  # a step's plans: the times are the step's
            groups = 1
            for feature in plan.group_features:
                groups *= len(feature.buckets) + 1
            print(f"  lookup {plan.kernel_name[:40]:40s} features {len(plan.group_features)} groups <= {groups} "
                  f"args {len(plan.args)} hit {out.hit} {1e3 * elapsed:.2f} ms, CPU {1e3 * cpu:.2f} ms "
                  f"(gc {1e3 * (collected['seconds'] - gc_before):.2f} ms; threads {threading.active_count()}; "
                  f"step of {len(plans)})", flush=True)
        return outs

    service._lookup_or_decide = traced


#: ``--pieces``: (calls, the compiling thread's CPU seconds) per piece of a guarded step (``trace_pieces``)
PIECES: dict[str, list[float]] = {}


def piece_sites() -> list[tuple[Any, str, str]]:
    """(owner, attribute, label) of each piece ``--pieces`` times."""
    from prescreen import service
    from prescreen.hooks import inductor_fusion, inductor_select, state, triton_autotune
    from prescreen.store.disk import DiskStore
    from prescreen.store.entry import Entry

    return [(inductor_fusion, "plans_for_fusion", "plans: fusion"),
            (inductor_select, "plan_for_selection", "plans: selection"),
            (triton_autotune, "plan_for_autotuner", "plans: runtime"),
            (state, "budget_for", "budget"), (service, "build_key", "key"),
            (DiskStore, "lookup", "store read"), (service, "decide_with_representatives", "decide"),
            (Entry, "new", "entry"), (DiskStore, "put_all", "store write")]


def trace_pieces() -> None:
    """With ``--pieces``: the compiling thread's CPU in each piece of prescreen's steps (plans, key, store read,
    decision, entry, store write, budget), so a device run says where a step's CPU goes without a profiler
    (cProfile records every thread on Python 3.12). Nested pieces are in their callers' time too."""
    for owner, attr, label in piece_sites():
        PIECES[label] = slot = [0, 0.0]
        fn = inspect.getattr_static(owner, attr)
        wrapped = _piece(fn.__func__ if isinstance(fn, staticmethod) else fn, slot)
        setattr(owner, attr, staticmethod(wrapped) if isinstance(fn, staticmethod) else wrapped)


def _piece(fn: Callable[..., Any], slot: list[float]) -> Callable[..., Any]:
    @functools.wraps(fn)  # keeps the signature prescreen checks
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            slot[0] += 1
            slot[1] += time.thread_time() - start

    return call


def instrument(meter: Meter) -> None:
    """Wrap prescreen's guarded steps (outermost, so a retry is inside the window)."""
    from torch._inductor import scheduler
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    from prescreen.decision import decide
    from prescreen.hooks import inductor_fusion as fus
    from prescreen.hooks import inductor_select as sel
    from prescreen.hooks import triton_autotune as rt

    def estimate(plans_fn: Callable[[], Any]) -> int | None:
        try:
            plans = plans_fn()
            return max(decide(p, _BUDGET).estimated_bytes for p in (plans if isinstance(plans, list) else [plans]))
        except Exception as exc:  # a plan the guard cannot build is reported as such
            print(f"  (no estimate: {exc!r})")
            return None

    inner_autotune = AlgorithmSelectorCache.autotune

    def autotune(self: Any, name: str, input_nodes: Any, layout: Any, *args: Any, **kwargs: Any) -> Any:
        return meter.step("select", name, lambda: estimate(lambda: sel.plan_for_selection(name, input_nodes, layout)),
                          lambda: inner_autotune(self, name, input_nodes, layout, *args, **kwargs))

    AlgorithmSelectorCache.autotune = autotune  # type: ignore[method-assign]

    inner_fusion = scheduler.Scheduler.speedup_by_fusion

    def benchmarked(node1: Any, node2: Any) -> bool:
        try:
            return bool(fus._is_benchmarked_fusion(node1, node2))
        except Exception:
            return False

    def fusion(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        if not benchmarked(node1, node2):
            return inner_fusion(self, node1, node2, *args, **kwargs)
        est = estimate(lambda: fus.plans_for_fusion(self, node1, node2))
        result = meter.step("fusion", "epilogue", lambda: est, lambda: inner_fusion(self, node1, node2, *args, **kwargs))
        # upstream's fused benchmark, run once the kernels compile: a step of its own
        return fus.map_deferred(result, lambda deferred: lambda: meter.step("fusion", "epilogue, deferred",
                                                                            lambda: est, deferred))

    scheduler.Scheduler.speedup_by_fusion = fusion  # type: ignore[method-assign]

    inner_bench = CachingAutotuner.benchmark_all_configs

    def bench(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(self.launchers) <= 1:
            return inner_bench(self, *args, **kwargs)  # type: ignore[no-untyped-call]
        est = estimate(lambda: rt.plan_for_autotuner(self, args, kwargs))  # the allocator state upstream sees
        return meter.traced("runtime", getattr(self.fn, "__name__", "?"), est,
                            lambda: inner_bench(self, *args, **kwargs))  # type: ignore[no-untyped-call]

    CachingAutotuner.benchmark_all_configs = bench  # type: ignore[method-assign]


_BUDGET: Any = None


def _nbytes(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.untyped_storage().nbytes()
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(o) for o in out)
    return 0


def run_case(name: str, meter: Meter, clock: GuardClock) -> dict[str, Any]:
    from prescreen.service import COUNTERS

    torch._dynamo.reset()
    torch.cuda.empty_cache()
    try:
        fn, inputs = {**CASES, **MODELS}[name]()
    except Exception as exc:  # e.g. a dtype this stack lacks
        return {"case": name, "ok": False, "error": f"setup: {exc!r}"[:200], "steps": [], "whole_peak": 0,
                "largest_lookup_estimate": 0, "seconds": 0}
    ref = None
    try:
        with torch.no_grad():
            cloned = tuple(i.clone() if isinstance(i, torch.Tensor) else i for i in inputs)
            ref = fn(*cloned)
            ref = ref.float().cpu() if isinstance(ref, torch.Tensor) else None
            del cloned
    except Exception as exc:
        print(f"  eager failed: {exc!r}")
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    BEFORE_COMPILE.get(name, lambda: None)()
    meter.global_peak = base
    meter.steps = []
    largest_before = COUNTERS.largest_estimate
    COUNTERS.largest_estimate = 0
    lookup_before, guard_before, cpu_before = COUNTERS.seconds, clock.split(), clock.split_cpu()
    others_before, waits_before = clock.others_cpu(), clock.waits()
    raw_before, calls_before = clock.split(raw=True), dict(clock.calls)
    start = time.perf_counter()
    row: dict[str, Any] = {"case": name}
    try:
        compiled = torch.compile(fn, dynamic=True, mode="max-autotune-no-cudagraphs")
        with torch.no_grad():
            out = compiled(*inputs)
        row["whole_peak"] = meter.peak() - base
        row["output_bytes"] = _nbytes(out)
        if ref is not None and isinstance(out, torch.Tensor) and "mutated" not in name:
            row["max_abs_err"] = float((out.float().cpu() - ref).abs().max())
        del out
        row["ok"] = True
    except KeyboardInterrupt:  # ``timeout -s INT``: the compile so far is still a share (a whole model's minutes)
        row["ok"] = False
        row["error"] = "interrupted: the compile did not finish; its figures cover the part that ran"
        row["whole_peak"] = meter.peak() - base
    except Exception as exc:
        row["ok"] = False
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        traceback.print_exc()
        row["whole_peak"] = meter.peak() - base
    elapsed = time.perf_counter() - start
    row["seconds"] = round(elapsed, 1)
    # prescreen's own time in this case, exactly (GuardClock), split by wrapper; lookups are a part of it
    split = {k: v - guard_before.get(k, 0.0) for k, v in clock.split().items()}
    guard = sum(split.values())
    row["guard_ms"] = round(guard * 1000, 2)
    row["guard_ms_by_wrapper"] = {k: round(v * 1000, 3) for k, v in split.items()}
    row["guard_calls"] = {k: clock.calls[k] - calls_before.get(k, 0) for k in clock.wrapped}
    row["guard_ms_raw"] = round(1000 * sum(v - raw_before.get(k, 0.0) for k, v in clock.split(raw=True).items()), 2)
    row["meter_bias_us"] = round(clock.bias * 1e6, 3)
    row["lookup_ms"] = round((COUNTERS.seconds - lookup_before) * 1000, 3)
    row["guard_share"] = f"{guard / max(elapsed, 1e-9):.4%}"
    # CPU time: the compiling thread's in prescreen's code (its store writes included: they are synchronous);
    # the wall time above also holds waits for the GIL other threads held
    split_cpu = {k: v - cpu_before.get(k, 0.0) for k, v in clock.split_cpu().items()}
    guard_cpu = sum(split_cpu.values())
    row["guard_cpu_ms_by_wrapper"] = {k: round(v * 1000, 3) for k, v in split_cpu.items()}
    row["guard_cpu_ms"] = round(guard_cpu * 1000, 2)
    row["guard_cpu_share"] = f"{guard_cpu / max(elapsed, 1e-9):.4%}"
    row["others_cpu_ms_in_guard"] = round((clock.others_cpu() - others_before) * 1000, 2)
    system, switches = (now - before for now, before in zip(clock.waits(), waits_before))
    row["guard_system_cpu_ms"], row["guard_waits"] = round(system * 1000, 2), int(switches)
    row["largest_lookup_estimate"] = COUNTERS.largest_estimate
    COUNTERS.largest_estimate = max(largest_before, COUNTERS.largest_estimate)
    if PIECES:  # this case's, then cleared for the next
        row["pieces_cpu_ms"] = {k: [int(n), round(1000 * cpu, 3)] for k, (n, cpu) in PIECES.items() if n}
        for slot in PIECES.values():
            slot[:] = [0, 0.0]
    row["steps"] = list(meter.steps)
    del inputs, fn
    torch.cuda.empty_cache()
    return row


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    steps = [s for s in row["steps"] if s["step_peak"] > 0]
    top = max(steps, key=lambda s: s["step_peak"]) if steps else None
    ests = [s["estimate"] for s in row["steps"] if s["estimate"]] + [row["largest_lookup_estimate"] or 0]
    ratios = [s["ratio"] for s in steps if s["ratio"] is not None]
    return {
        "estimate": max(ests) if ests else None,
        "step_peak": top["step_peak"] if top else 0,
        "step": f"{top['kind']}:{top['kernel']}" if top else "-",
        "ratio": top["ratio"] if top else None,
        "min_ratio": min(ratios) if ratios else None,
        "max_ratio": max(ratios) if ratios else None,
    }


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def main() -> None:
    global _BUDGET
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--trace-lookups", action="store_true", help="print every lookup that reads the store or decides")
    ap.add_argument("--pieces", action="store_true", help="each case's row gets the compiling thread's CPU ms and "
                    "calls per piece of prescreen's steps (pieces_cpu_ms)")
    ap.add_argument("--sqlite-mmap", type=int, default=None, metavar="BYTES",
                    help="how much of the store's database SQLite memory-maps (prescreen maps none, diskcache 64 MiB); "
                         "to compare the two, each in its own store directory (the setting is kept there)")
    ap.add_argument("--switch-interval", default=None, metavar="SECONDS|none",
                    help="the switch interval a lookup sets (prescreen.service.LOOKUP_SWITCH_INTERVAL; none: left "
                         "alone); bench/bench_runtime_step.py shows the trade on the CPU")
    args = ap.parse_args()
    if args.switch_interval is not None:
        from prescreen import service

        service.LOOKUP_SWITCH_INTERVAL = None if args.switch_interval == "none" else float(args.switch_interval)
    if args.sqlite_mmap is not None:
        from prescreen.store import disk

        disk.SQLITE_MMAP_SIZE = args.sqlite_mmap
    import torch._inductor.config as ic

    import prescreen
    from prescreen.budget import Budget

    ic.fx_graph_cache = False
    ic.autotune_local_cache = False
    ic.autotune_remote_cache = False
    clock = GuardClock()
    _guarded_methods()  # imports the modules, so prescreen patches them at install
    clock.below()
    installing = time.perf_counter()
    prescreen.install(ratio=1.0)  # every decision is tune: the real benchmarks run; opens the store
    install_ms = 1e3 * (time.perf_counter() - installing)
    clock.above()
    if args.trace_lookups:
        trace_lookups()
    if args.pieces:
        trace_pieces()
    _BUDGET = Budget.for_device(torch.device(dev, 0), None, 1.0)
    meter = Meter()
    instrument(meter)
    torch.ones(8, 8, device=dev) @ torch.ones(8, 8, device=dev)  # cuBLAS handle and workspace outside the windows
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; triton "
          f"{__import__('triton').__version__}; python {platform.python_version()}; "
          f"inductor cache {os.environ['TORCHINDUCTOR_CACHE_DIR']}; install() {install_ms:.2f} ms (patching, store opening)", flush=True)
    rows = []
    for name in args.cases.split(","):
        print(f"== {name}", flush=True)
        try:
            row = run_case(name, meter, clock)
        except Exception as exc:
            traceback.print_exc()
            row = {"case": name, "ok": False, "error": repr(exc)[:200], "steps": [], "whole_peak": 0,
                   "largest_lookup_estimate": 0, "seconds": 0}
        meter.stack.clear()
        row.update(summarize(row))
        for s in row["steps"]:
            print(f"  step {s['kind']:8s} {s['kernel'][:40]:40s} est {mib(s['estimate']):>9s} MiB  "
                  f"peak {mib(s['step_peak']):>9s} MiB  ratio {s['ratio']}", flush=True)
        print("  ROW " + json.dumps({k: v for k, v in row.items() if k != "steps"}), flush=True)
        rows.append(row)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        if str(row.get("error", "")).startswith("interrupted"):
            break
    print("\n| case | ok | estimate MiB | whole-compile peak MiB | of which first-call output MiB | "
          "step peak MiB (largest step) | estimate / step peak | min over steps | steps | s | guard ms | guard share | "
          "guard CPU ms (compile thread) | CPU share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['ok']} | {mib(r['estimate'])} | {mib(r['whole_peak'])} | "
              f"{mib(r.get('output_bytes'))} | {mib(r['step_peak'])} ({r['step']}) | {r['ratio']} | "
              f"{r['min_ratio']} | {len(r['steps'])} | {r['seconds']} | {r.get('guard_ms')} | {r.get('guard_share')} | "
              f"{r.get('guard_cpu_ms')} | {r.get('guard_cpu_share')} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
