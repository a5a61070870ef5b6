"""Guard Triton runtime autotuning: ``CachingAutotuner.benchmark_all_configs`` (CUDA, XPU, ROCm).

A pointwise, reduction or template kernel compiled with several configs is
benchmarked at its first call, on the real arguments. What that adds to the
device is the benchmarker's L2-flush buffer and a clone of each argument the
kernel mutates (``maybe_clone_args``), except, under ``optimize_mem`` (the
default in inference), the arguments upstream copies to the host instead:
those whose clone would raise the process's peak (``copy_args_to_cpu_if_needed``).
The plan mirrors that rule on the live allocator (``_device_clones``), so it
holds exactly the clones upstream makes on the device, at the concrete sizes
of the call; the key is the kernel's plan and sizes.

Over budget the first config is taken without benchmarking (upstream's
smallest safe choice: what runs when autotuning is off); the decision is
stored like every other. Every step is looked up (about 0.2 to 0.35 ms), so
an observed OOM stored under its key, by this process or any other, is what
the step gets. An out-of-memory error inside the benchmark is caught, the
step's clones released, the first config taken, and the fact stored as an
``observed_oom`` fallback under the step's key.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from prescreen.expr import Const
from prescreen.hooks import oom, state
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.service import Outcome, lookup_or_decide

log = logging.getLogger("prescreen.hooks")

MODULE = "torch._inductor.runtime.triton_heuristics"
_ORIGINAL_ATTR = "_prescreen_original_benchmark_all_configs"

#: Device types whose mutated args upstream may copy to the host under ``optimize_mem``.
HOST_COPY_DEVICES: tuple[str, ...] = ("cuda", "xpu")


def _storage_elements(size: Iterable[int], stride: Iterable[int]) -> int:
    size, stride = list(size), list(stride)
    if any(d == 0 for d in size):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(size, stride))


def _named_args(autotuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    names = list(getattr(autotuner.fn, "arg_names", []))
    return list(zip(names[: len(args)], args)) + list(kwargs.items())


def _device_of(named: list[tuple[str, Any]]) -> Any:
    import torch

    for _name, value in named:
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _peak_headroom(device: Any) -> int | None:
    """What upstream's ``copy_args_to_cpu_if_needed`` reads: the process's peak minus what is allocated.

    None where upstream clones every mutated argument: no accelerator, or an
    allocator without these statistics (a ``RuntimeError`` upstream too).
    """
    import torch

    try:
        acc = getattr(torch, "accelerator", None)
        if acc is not None and hasattr(acc, "max_memory_allocated"):
            if acc.current_accelerator() is None:
                return None
            stats = _allocated_bytes_stats(torch, acc)
            if stats is not None:
                return int(stats.get("peak", 0)) - int(stats.get("current", 0))
            return int(acc.max_memory_allocated()) - int(acc.memory_allocated())
        backend = getattr(torch, getattr(device, "type", "cuda"))
        return int(backend.max_memory_allocated(device)) - int(backend.memory_allocated(device))
    except (RuntimeError, AttributeError):
        return None


#: The module whose ``max_memory_allocated`` and ``memory_allocated`` ``_allocated_bytes_stats`` stands in for.
ACCELERATOR_MEMORY_MODULE = "torch.accelerator.memory"


def _allocated_bytes_stats(torch: Any, acc: Any) -> dict[str, Any] | None:
    """The ``allocated_bytes.all`` statistics that ``acc.max_memory_allocated()`` (``.peak``) and
    ``acc.memory_allocated()`` (``.current``) read, from one call of the allocator's nested table.

    Each of those flattens the allocator's whole table (about 3,000 Python calls, 0.2 ms
    on an H200 host), and upstream reads the two. None where they are not torch's own
    (then the caller calls them), or the table is not shaped as they expect.
    """
    stats_of = getattr(torch._C, "_accelerator_getDeviceStats", None)
    initialized = getattr(torch._C, "_accelerator_isAllocatorInitialized", None)
    if stats_of is None or initialized is None or any(
        getattr(fn, "__module__", None) != ACCELERATOR_MEMORY_MODULE
        for fn in (acc.max_memory_allocated, acc.memory_allocated)
    ):
        return None
    if not initialized():
        return {}  # upstream's table is empty then: both read 0
    table = stats_of(acc.current_device_index())
    found = table.get("allocated_bytes") if isinstance(table, dict) else None
    found = found.get("all") if isinstance(found, dict) else None
    return found if isinstance(found, dict) and not any(isinstance(v, dict) for v in found.values()) else None


def _clone_bytes(value: Any) -> int:
    return int(_storage_elements(value.size(), value.stride()) * value.element_size())


def _greedy(candidates: list[tuple[str, Any, int]], budget: int) -> list[tuple[str, Any, int]]:
    """Upstream's rule: in argument order, clone what fits in the budget left; the rest go to the host.

    ``candidates``: (name, tensor, its clone's bytes).
    """
    kept = []
    for candidate in candidates:
        size = candidate[2]
        if size <= budget:
            budget -= size
            kept.append(candidate)
    return kept


def _device_clones(autotuner: Any, named: list[tuple[str, Any]], device: Any, flush: int) -> list[tuple[str, Any]]:
    """The mutated tensor args upstream clones on the device for the largest of its per-config benchmarks.

    Without ``optimize_mem`` every one. With it, upstream decides per config:
    what fits under the peak's headroom is cloned. The headroom can only grow
    between configs (by the flush buffer and the clones of the config before),
    so the budgets are followed to their fixed point and the set with the most
    bytes is kept. Where the flush buffer alone holds every clone, the second
    config clones them all, whatever the headroom.
    """
    candidates = _mutated_tensors(autotuner, named)
    if not candidates or not getattr(autotuner, "optimize_mem", False):
        return candidates
    on_device = [(n, v, _clone_bytes(v)) for n, v in candidates if v.device.type in HOST_COPY_DEVICES]
    always = [(n, v) for n, v in candidates if v.device.type not in HOST_COPY_DEVICES]  # upstream clones those
    configs = max(len(getattr(autotuner, "launchers", ())), 1)
    if configs > 1 and sum(size for _n, _v, size in on_device) <= flush:
        # The second config's budget is at least the flush buffer, which holds them all: the headroom
        # (an allocator-statistics read) cannot change the answer.
        return always + [(n, v) for n, v, _size in on_device]
    headroom = _peak_headroom(device)
    if headroom is None:
        return candidates
    best: list[tuple[str, Any, int]] = []
    best_bytes = 0
    budget, seen = max(headroom, 0), set[int]()
    while budget not in seen and len(seen) < configs:
        seen.add(budget)
        kept = _greedy(on_device, budget)
        kept_bytes = sum(size for _n, _v, size in kept)
        if kept_bytes > best_bytes:
            best, best_bytes = kept, kept_bytes
        budget = max(budget, flush + kept_bytes)
    return always + [(n, v) for n, v, _size in best]


def _mutated_tensors(autotuner: Any, named: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The tensor args the kernel mutates: what upstream clones for its benchmark (or copies to the host)."""
    import torch

    mutated = set(getattr(autotuner, "mutated_arg_names", ()) or ())
    return [(n, v) for n, v in named if n in mutated and isinstance(v, torch.Tensor)]


def plan_for_autotuner(
    autotuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any], named: list[tuple[str, Any]] | None = None,
    device: Any = None,
) -> KernelPlan:
    """The runtime benchmark of one kernel: the mutated args upstream clones on the device, and the flush buffer.

    ``named`` and ``device``: ``_named_args`` of the call and ``_device_of`` them, where the caller has them.
    """
    from prescreen.hooks.inductor_select import GPU_SLACK_BYTES, concrete_tensor_arg, flush_buffer_bytes

    if named is None:
        named = _named_args(autotuner, args, kwargs)
    if device is None:
        device = _device_of(named)
    flush = flush_buffer_bytes(device)
    plan_args: list[TensorArg | WorkspaceArg] = [
        concrete_tensor_arg(f"clone:{name}", value) for name, value in _device_clones(autotuner, named, device, flush)
    ]
    if flush:
        dev = str(device)
        plan_args.append(WorkspaceArg("benchmark.cache_flush", Const(flush), "torch.uint8", dev, "NONE"))
        plan_args.append(WorkspaceArg("benchmark.slack", Const(GPU_SLACK_BYTES), "torch.uint8", dev, "NONE"))
    return KernelPlan(group_features=(), axis_names=(), axis_static_values=(), args=tuple(plan_args),
                      kernel_name=_kernel_name(autotuner))


def _kernel_name(autotuner: Any) -> str:
    """A runtime step's plan's kernel name: ``autotune:`` and the Triton kernel's."""
    kernel = getattr(autotuner.fn, "__name__", None) or str(getattr(autotuner, "inductor_meta", {}).get("kernel_name"))
    return f"autotune:{kernel}"


#: ``fallen``: the id of the autotuner whose runtime step on this thread took its first config unbenchmarked.
_step = threading.local()


def _fallen_back(autotuner: Any) -> bool:
    return getattr(_step, "fallen", None) == id(autotuner)


def _first_config(autotuner: Any) -> dict[Any, float]:
    """Timings that make ``autotune_to_one_config`` keep the first config: 0 for it, inf for the rest.

    Marks the step as fallen back, so that neither its best-config save nor coordinate descent runs."""
    _step.fallen = id(autotuner)
    return {launcher: (0.0 if i == 0 else float("inf")) for i, launcher in enumerate(autotuner.launchers)}


def _describe_config(autotuner: Any) -> str:
    try:
        return str(autotuner.launchers[0].config)
    except Exception:
        return "the first config"


def _decide(autotuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[KernelPlan, Any, Outcome] | None:
    """The runtime step's plan, device and decision (runtime autotuning and coordinate descent share them);
    None on a host device, where nothing is guarded."""
    named = _named_args(autotuner, args, kwargs)
    device = _device_of(named)
    if getattr(device, "type", "cpu") in ("cpu", "meta"):
        return None
    plan = plan_for_autotuner(autotuner, args, kwargs, named, device)
    return plan, device, lookup_or_decide(plan, state.budget_for(device), state.get_store())


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def guarded_benchmark_all_configs(self: Any, *args: Any, **kwargs: Any) -> Any:
        plan: KernelPlan | None = None
        device: Any = None
        try:
            if len(getattr(self, "launchers", ())) > 1:
                decided = _decide(self, args, kwargs)
                if decided is not None:
                    plan, device, outcome = decided
                    if not outcome.decision.tune:
                        state.log_once(outcome.key, logging.WARNING,
                                       "prescreen: skipping runtime autotuning of %s (%d configs), using %s: "
                                       "%s [key %s, %s]", plan.kernel_name, len(self.launchers),
                                       _describe_config(self), outcome.decision.reason, outcome.key[:12],
                                       "store hit" if outcome.hit else "computed")
                        return _first_config(self)
                    if state.plan_only():
                        return _first_config(self)  # decided and recorded; nothing is benchmarked
        except Exception as exc:  # never break a compile
            state.log_once(f"autotune-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: runtime-autotune guard failed (%r); benchmarking as upstream would", exc)
            plan = None
        if plan is not None:
            return _benchmark(original, self, args, kwargs, device, plan)
        return original(self, *args, **kwargs)

    setattr(guarded_benchmark_all_configs, _ORIGINAL_ATTR, original)
    return guarded_benchmark_all_configs


def _benchmark(original: Callable[..., Any], autotuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               device: Any, plan: KernelPlan) -> Any:
    """Upstream's benchmark; on an out-of-memory error, the first config, and the fact stored under the
    step's ``plan``."""
    try:
        return original(autotuner, *args, **kwargs)
    except Exception as exc:
        if not oom.is_oom(exc):
            raise
        info = oom.info(exc, device)
    oom.release(device)
    try:
        autotuner.reset_to_zero_args(*args, **kwargs)  # where upstream leaves the args after benchmarking
    except Exception:
        pass
    oom.record(lambda: [plan], device, info, f"runtime autotuning of {_kernel_name(autotuner)}",
               _describe_config(autotuner))
    return _first_config(autotuner)


def _wrap_one_config(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autotune_to_one_config``: upstream saves its winner as the kernel's best config, in the local and
    the remote autotune cache, keyed by the kernel's source alone. A fallback is not a winner: saved, it
    would be run without benchmarking by every later process, whatever its budget. While the step runs,
    the save hook is a gate that drops the save where the step fell back."""

    @functools.wraps(original)
    def guarded_autotune_to_one_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        _step.fallen = None
        hook = getattr(self, "save_cache_hook", None)
        if hook:
            def save_unless_fallen_back(*a: Any, **k: Any) -> Any:
                return None if _fallen_back(self) else hook(*a, **k)

            self.save_cache_hook = save_unless_fallen_back
        try:
            return original(self, *args, **kwargs)
        finally:
            if hook:
                self.save_cache_hook = hook

    setattr(guarded_autotune_to_one_config, _ORIGINAL_ATTR, original)
    return guarded_autotune_to_one_config


#: Autotuners whose coordinate descent this guard skipped (kept only while upstream keeps them).
_coordesc_skipped: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _wrap_coordesc(original: Callable[..., Any]) -> Callable[..., Any]:
    """``coordinate_descent_tuning(launcher, *args)``: both max-autotune modes turn it on, and it benchmarks
    configs around the launcher on clones of the mutated args, as runtime autotuning does. It is guarded
    by the same decision (the same plan): skipped after a fallback, over budget, or under ``--plan-only``;
    an OOM inside it keeps the launcher it started from and is stored like any other."""

    @functools.wraps(original)
    def guarded_coordesc(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        # Upstream calls this at every launch until a config is marked found by coordinate descent: a kernel
        # it never tunes (a template, say) or one this guard skipped is answered at once, not looked up again.
        if getattr(self, "_should_coordesc_tune", True) is False:
            return original(self, launcher, *args, **kwargs)
        if self in _coordesc_skipped:
            return launcher
        plan: KernelPlan | None = None
        device: Any = None
        try:
            if _fallen_back(self):
                _coordesc_skipped.add(self)
                return launcher
            decided = _decide(self, args, kwargs)
            if decided is not None:
                plan, device, outcome = decided
                if not outcome.decision.tune or state.plan_only():
                    _coordesc_skipped.add(self)
                    state.log_once(f"coordesc:{outcome.key}", logging.WARNING,
                                   "prescreen: skipping coordinate descent of %s, keeping %s: %s [key %s]",
                                   plan.kernel_name, getattr(launcher, "config", launcher),
                                   outcome.decision.reason, outcome.key[:12])
                    return launcher
        except Exception as exc:  # never break a compile
            state.log_once(f"coordesc-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: coordinate-descent guard failed (%r); tuning as upstream would", exc)
            plan = None
        if plan is None:
            return original(self, launcher, *args, **kwargs)
        try:
            return original(self, launcher, *args, **kwargs)
        except Exception as exc:
            if not oom.is_oom(exc):
                raise
            info = oom.info(exc, device)
        oom.release(device)
        _coordesc_skipped.add(self)
        oom.record(lambda: [plan], device, info, f"coordinate descent of {_kernel_name(self)}",
                   str(getattr(launcher, "config", "the launcher it started from")))
        return launcher

    setattr(guarded_coordesc, _ORIGINAL_ATTR, original)
    return guarded_coordesc


#: (method, wrapper) pairs beside ``benchmark_all_configs``; each is installed where this torch has it.
_EXTRA = (("autotune_to_one_config", _wrap_one_config), ("coordinate_descent_tuning", _wrap_coordesc))


def patch() -> bool:
    """Install the guard on ``CachingAutotuner.benchmark_all_configs``; True if installed.

    A torch whose ``CachingAutotuner`` lacks the method (or has no ``launchers``
    it picks from) is left alone, with a warning naming the torch version.
    """
    import torch

    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError as exc:  # no Triton: nothing autotunes at run time
        log.info("prescreen: Triton runtime autotuning not available (%s); its guard is not installed", exc)
        return False
    current = getattr(CachingAutotuner, "benchmark_all_configs", None)
    if current is None or not hasattr(CachingAutotuner, "autotune_to_one_config"):
        log.warning("prescreen: CachingAutotuner in torch %s has no benchmark_all_configs/autotune_to_one_config; "
                    "the runtime-autotune guard is not installed", torch.__version__)
        return False
    if hasattr(current, _ORIGINAL_ATTR):
        return True
    params = list(inspect.signature(current).parameters)
    if params[:1] != ["self"] or not any(p.kind is inspect.Parameter.VAR_POSITIONAL
                                         for p in inspect.signature(current).parameters.values()):
        log.warning("prescreen: CachingAutotuner.benchmark_all_configs in torch %s does not take (self, *args, "
                    "**kwargs); the runtime-autotune guard is not installed", torch.__version__)
        return False
    CachingAutotuner.benchmark_all_configs = _wrap(current)  # type: ignore[method-assign]
    for attr, wrap in _EXTRA:
        method = getattr(CachingAutotuner, attr, None)
        if method is None:
            log.warning("prescreen: CachingAutotuner in torch %s has no %s; it is not guarded", torch.__version__, attr)
        elif not hasattr(method, _ORIGINAL_ATTR):
            setattr(CachingAutotuner, attr, wrap(method))
    return True


def unpatch() -> None:
    """Restore upstream's ``benchmark_all_configs``."""
    import sys

    module = sys.modules.get(MODULE)
    if module is None:
        return
    cls = module.CachingAutotuner
    for attr in ("benchmark_all_configs", *(name for name, _wrap_fn in _EXTRA)):
        original = getattr(getattr(cls, attr, None), _ORIGINAL_ATTR, None)
        if original is not None:
            setattr(cls, attr, original)
