"""Guard Triton runtime autotuning: ``CachingAutotuner.benchmark_all_configs`` (CUDA, XPU, ROCm).

A kernel compiled with several configs is benchmarked at its first call, on the real arguments: what that
adds to the device is the L2-flush buffer and the clones upstream makes of the mutated arguments
(``_device_clones``). Over budget the first config is taken unbenchmarked (what runs when autotuning is
off); an OOM inside the benchmark takes it too and is stored as ``observed_oom``. Coordinate descent is
guarded by the same decision, and a fallback is never saved as the kernel's best config.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from prescreen.footprint import required_storage_numel
from prescreen.hooks import oom, state
from prescreen.hooks.inductor_select import (
    benchmark_buffers,
    concrete_tensor_arg,
    flush_buffer_bytes,
    patch_attr,
    unpatch_attr,
)
from prescreen.plan import KernelPlan
from prescreen.service import Outcome, lookup_or_decide

log = logging.getLogger("prescreen.hooks")

#: Device types whose mutated args upstream may copy to the host under ``optimize_mem``.
HOST_COPY_DEVICES: tuple[str, ...] = ("cuda", "xpu")


def _named_args(autotuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    names = list(getattr(autotuner.fn, "arg_names", []))
    return list(zip(names[: len(args)], args)) + list(kwargs.items())


def _device_of(named: list[tuple[str, Any]]) -> Any:
    import torch

    return next((value.device for _name, value in named if isinstance(value, torch.Tensor)), None)


def _peak_headroom() -> int | None:
    """What upstream's ``copy_args_to_cpu_if_needed`` reads: the process's peak minus what is allocated.

    None where upstream clones every mutated argument: no accelerator, or an allocator without statistics."""
    import torch

    try:
        if torch.accelerator.current_accelerator() is None:
            return None
        try:  # the nested statistics ``memory_stats`` flattens (about 160 entries, 66 us a step on an H200)
            if not torch._C._accelerator_isAllocatorInitialized():
                return 0  # upstream reads no statistics: 0 - 0
            total = torch._C._accelerator_getDeviceStats(torch.accelerator.current_device_index())["allocated_bytes"]
            return int(total["all"]["peak"]) - int(total["all"]["current"])
        except (AttributeError, KeyError, TypeError):  # another torch: upstream's public, flattened read
            stats = torch.accelerator.memory_stats()
            return int(stats.get("allocated_bytes.all.peak", 0)) - int(stats.get("allocated_bytes.all.current", 0))
    except (RuntimeError, AttributeError):
        return None


def _device_clones(autotuner: Any, named: list[tuple[str, Any]], device: Any, flush: int) -> list[tuple[str, Any]]:
    """The mutated tensor args upstream clones on the device for the largest of its per-config benchmarks: all of
    them, or with ``optimize_mem`` those that fit, in order, under the peak's headroom, which only grows between
    configs (flush buffer, the previous clones): followed to its fixed point, the set of most bytes is kept."""
    import torch

    mutated = set(getattr(autotuner, "mutated_arg_names", ()) or ())
    candidates = [(n, v) for n, v in named if n in mutated and isinstance(v, torch.Tensor)]
    headroom = _peak_headroom() if candidates and getattr(autotuner, "optimize_mem", False) else None
    if headroom is None:
        return candidates
    on_device = [(n, v, required_storage_numel(v.size(), v.stride()) * v.element_size())
                 for n, v in candidates if v.device.type in HOST_COPY_DEVICES]
    always = [(n, v) for n, v in candidates if v.device.type not in HOST_COPY_DEVICES]  # upstream clones those
    configs = max(len(getattr(autotuner, "launchers", ())), 1)
    best: list[tuple[str, Any, int]] = []
    best_bytes = 0
    budget, seen = max(headroom, 0), set[int]()
    while budget not in seen and len(seen) < configs:
        seen.add(budget)
        kept, left = [], budget
        for candidate in on_device:
            if candidate[2] <= left:
                left -= candidate[2]
                kept.append(candidate)
        kept_bytes = budget - left
        if kept_bytes > best_bytes:
            best, best_bytes = kept, kept_bytes
        budget = max(budget, flush + kept_bytes)
    return always + [(n, v) for n, v, _size in best]


def plan_for_autotuner(autotuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> KernelPlan:
    """The runtime benchmark of one kernel: the mutated args upstream clones on the device, and the flush buffer."""
    named = _named_args(autotuner, args, kwargs)
    device = _device_of(named)
    clones = _device_clones(autotuner, named, device, flush_buffer_bytes(device))
    kernel = getattr(autotuner.fn, "__name__", None) or str(getattr(autotuner, "inductor_meta", {}).get("kernel_name"))
    return KernelPlan(group_features=(), axis_names=(), axis_static_values=(),
                      args=(*(concrete_tensor_arg(f"clone:{n}", v) for n, v in clones), *benchmark_buffers(device)),
                      kernel_name=f"autotune:{kernel}")


#: ``fallen``: the id of the autotuner whose runtime step on this thread took its first config unbenchmarked;
#: ``tuned``: (weak reference, decision) of the one whose runtime step decided to tune, for its coordinate
#: descent next (a weak reference: another autotuner may later get a freed one's id).
_step = threading.local()


def _fallen_back(autotuner: Any) -> bool:
    return getattr(_step, "fallen", None) == id(autotuner)


def _tuned_just_now(autotuner: Any) -> tuple[KernelPlan, Any, Outcome] | None:
    """The decision this autotuner's runtime step took a moment ago on this thread, taken once: its coordinate
    descent follows in the same call on the same arguments, so the plan and key are the same."""
    tuned, _step.tuned = getattr(_step, "tuned", None), None
    return tuned[1] if tuned is not None and tuned[0]() is autotuner else None


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
    device = _device_of(_named_args(autotuner, args, kwargs))
    if getattr(device, "type", "cpu") in ("cpu", "meta"):
        return None
    plan = plan_for_autotuner(autotuner, args, kwargs)
    return plan, device, lookup_or_decide(plan, state.budget_for(device), state.get_store())


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def guarded_benchmark_all_configs(self: Any, *args: Any, **kwargs: Any) -> Any:
        decided = None
        try:
            if len(getattr(self, "launchers", ())) > 1:
                decided = _decide(self, args, kwargs)
            if decided is not None:
                plan, _device, outcome = decided
                if not outcome.decision.tune:
                    state.log_once(outcome.key, logging.WARNING,
                                   "prescreen: skipping runtime autotuning of %s (%d configs), using %s: "
                                   "%s [key %s, %s]", plan.kernel_name, len(self.launchers),
                                   _describe_config(self), outcome.decision.reason, outcome.key[:12],
                                   "store hit" if outcome.hit else "computed")
                    return _first_config(self)
                if state.plan_only():
                    return _first_config(self)  # decided and recorded; nothing is benchmarked
                _step.tuned = (weakref.ref(self), decided)
        except Exception as exc:  # never break a compile
            state.log_once(f"autotune-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: runtime-autotune guard failed (%r); benchmarking as upstream would", exc)
            decided = None
        if decided is None:
            return original(self, *args, **kwargs)
        plan, device, _outcome = decided

        def first_config() -> dict[Any, float]:
            with contextlib.suppress(Exception):
                self.reset_to_zero_args(*args, **kwargs)  # where upstream leaves the args after benchmarking
            return _first_config(self)

        return oom.retry(lambda: original(self, *args, **kwargs), first_config, device, lambda: [plan],
                         f"runtime autotuning of {plan.kernel_name}", _describe_config(self))

    return guarded_benchmark_all_configs


def _wrap_one_config(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autotune_to_one_config`` saves its winner as the kernel's best config, keyed by source alone: the save
    is dropped where the step fell back, and a winner coordinate descent marked is saved marked (upstream saves
    it unmarked, and a replica would descend again)."""

    @functools.wraps(original)
    def guarded_autotune_to_one_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        _step.fallen = _step.tuned = None
        hook = getattr(self, "save_cache_hook", None)
        if hook:
            def save_unless_fallen_back(config: Any, *a: Any, **k: Any) -> Any:
                if _fallen_back(self):
                    return None
                if getattr(config, "found_by_coordesc", False):  # see the docstring
                    k["found_by_coordesc"] = True
                return hook(config, *a, **k)

            self.save_cache_hook = save_unless_fallen_back
        try:
            return original(self, *args, **kwargs)
        finally:
            if hook:
                self.save_cache_hook = hook

    return guarded_autotune_to_one_config


#: Autotuners whose coordinate descent this guard skipped (kept only while upstream keeps them).
_coordesc_skipped: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _wrap_coordesc(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_coordinate_descent_tuning`` benchmarks configs around the launcher on clones of the mutated args,
    as runtime autotuning does: skipped after a fallback, over budget or under ``--plan-only``; an OOM in it
    keeps the launcher it started from and is stored like any other. Upstream enters it only for a kernel it
    descends (``coordinate_descent_tuning``, asked at every launch, templates' included, answers the rest)."""

    @functools.wraps(original)
    def guarded_coordesc(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        if self in _coordesc_skipped:  # asked again at every launch until a config is marked found
            return launcher
        decided = None
        try:
            if _fallen_back(self):
                _coordesc_skipped.add(self)
                return launcher
            if _descended_before(self, launcher):
                return launcher
            decided = _tuned_just_now(self) or _decide(self, args, kwargs)
            if decided is not None and (not decided[2].decision.tune or state.plan_only()):
                plan, _device, outcome = decided
                _coordesc_skipped.add(self)
                state.log_once(f"coordesc:{outcome.key}", logging.WARNING,
                               "prescreen: skipping coordinate descent of %s, keeping %s: %s [key %s]",
                               plan.kernel_name, getattr(launcher, "config", launcher),
                               outcome.decision.reason, outcome.key[:12])
                return launcher
        except Exception as exc:  # never break a compile
            state.log_once(f"coordesc-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: coordinate-descent guard failed (%r); tuning as upstream would", exc)
            decided = None
        if decided is None:
            return original(self, launcher, *args, **kwargs)
        plan, device, _outcome = decided

        def keep_launcher() -> Any:
            _coordesc_skipped.add(self)
            return launcher

        return oom.retry(lambda: original(self, launcher, *args, **kwargs), keep_launcher, device, lambda: [plan],
                         f"coordinate descent of {plan.kernel_name}",
                         str(getattr(launcher, "config", "the launcher it started from")))

    return guarded_coordesc


def _descended_before(autotuner: Any, launcher: Any) -> bool:
    """Whether the autotune cache holds the launcher's config as coordinate descent's winner (then marked): one
    compiled in Inductor's worker arrives unmarked (``Config.__setstate__``), and upstream would descend again."""
    from torch._inductor.runtime.runtime_utils import triton_config_to_hashable as hashable

    cache = _autotune_cache(autotuner)
    if cache is None:
        return False
    best = cache.read_best(autotuner.inductor_meta, [launcher.config])
    if not getattr(best, "found_by_coordesc", False) or hashable(best) != hashable(launcher.config):
        return False
    launcher.config.found_by_coordesc = True
    return True


def _autotune_cache(autotuner: Any) -> Any:
    """The ``AutotuneCache`` the kernel's best-config save hook writes to, or None."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    cache = getattr(getattr(autotuner, "save_cache_hook", None), "__self__", None)
    return cache if isinstance(cache, AutotuneCache) else None


def _quietly(what: str, step: Callable[..., None], *args: Any) -> None:
    try:
        step(*args)
    except Exception as exc:  # upstream's answer stands
        state.log_once(f"{what}:{type(exc).__name__}", logging.WARNING, "prescreen: could not %s (%r)", what, exc)


def _relocate(autotuner: Any) -> None:
    """A kernel the FX cache hands back names the cache directory it was compiled in, where torch reads and
    saves its best config: on a replica, the warm machine's. Point both at this process's."""
    from torch._inductor.codecache import get_path
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    if not isinstance(autotuner.filename, str):
        return  # a template: no best-config file
    here = get_path(os.path.splitext(os.path.basename(autotuner.filename))[0], "py")[2]
    cache = _autotune_cache(autotuner)
    if here != autotuner.filename and cache is not None:
        autotuner.save_cache_hook = (AutotuneCache.create(autotuner.inductor_meta, here, cache.configs_hash)
                                     or cache).save
    autotuner.filename = here


def _launch_marked_winner(autotuner: Any, configs: list[Any], reload_kernel_from_src: Callable[[], Any]) -> None:
    """torch 2.11 keeps a cached winner's coordinate-descent mark only for kernels of several configs whose
    winner needs a new compile: apply torch 2.13's rule (the marked winner is the only launcher)."""
    from torch._inductor.runtime.runtime_utils import triton_config_to_hashable as hashable
    from torch._inductor.runtime.triton_heuristics import check_autotune_cache

    results = autotuner.compile_results
    if (not autotuner.inductor_meta.get("coordinate_descent_tuning")
            or getattr(autotuner, "autotune_cache_info", {}).get("autotune_cache_state") != "hit"
            or (len(results) == 1 and getattr(results[0].config, "found_by_coordesc", False))):
        return  # no descent, nothing cached, or upstream launches the marked winner: no second read
    cached = check_autotune_cache(configs, autotuner.filename, autotuner.inductor_meta)[0]
    best = cached[0] if len(cached) == 1 else None
    if not getattr(best, "found_by_coordesc", False):
        return
    same = [r for r in results if hashable(r.config) == hashable(best)]
    if same:
        same[0].config.found_by_coordesc = True
    elif autotuner.fn.fn is None:  # the winner needs a compile
        autotuner.fn = reload_kernel_from_src().fn
    autotuner.compile_results = same[:1] or [autotuner._precompile_config(best)]


def _wrap_recheck(original: Callable[..., Any]) -> Callable[..., Any]:
    """A kernel torch's FX graph cache hands back rereads its best config in ``recheck_autotune_cache``; where
    that read misses (``_relocate``) or drops the winner's mark (``_launch_marked_winner``), a replica that
    loaded the artifact descends (benchmarks) again."""

    @functools.wraps(original)
    def recheck(self: Any, reload_kernel_from_src: Callable[[], Any]) -> None:
        configs = [result.config for result in self.compile_results]
        _quietly("point a cached kernel at this cache directory", _relocate, self)
        original(self, reload_kernel_from_src)
        _quietly("reread a cached coordinate-descent config", _launch_marked_winner, self, configs,
                 reload_kernel_from_src)

    return recheck


def patch() -> bool:
    """Install the runtime guards on ``CachingAutotuner``; True if runtime autotuning is guarded.

    ``benchmark_all_configs`` is guarded only where the best-config save is too (a fallback is never saved).
    """
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError as exc:  # no Triton: nothing autotunes at run time
        log.info("prescreen: Triton runtime autotuning not available (%s); its guard is not installed", exc)
        return False
    varargs = ("self", "args", "kwargs")
    ok = (patch_attr(CachingAutotuner, "autotune_to_one_config", varargs, _wrap_one_config, "best-config")
          and patch_attr(CachingAutotuner, "benchmark_all_configs", varargs, _wrap, "runtime-autotune"))
    if ok:
        patch_attr(CachingAutotuner, "_coordinate_descent_tuning", ("self", "launcher", "args", "kwargs"),
                   _wrap_coordesc, "coordinate-descent")
        patch_attr(CachingAutotuner, "recheck_autotune_cache", ("self", "reload_kernel_from_src"), _wrap_recheck,
                   "cached coordinate-descent config")
    return ok


def unpatch() -> None:
    """Restore upstream's methods."""
    module = sys.modules.get("torch._inductor.runtime.triton_heuristics")
    if module is not None:
        unpatch_attr(module.CachingAutotuner, "benchmark_all_configs", "autotune_to_one_config",
                     "_coordinate_descent_tuning", "recheck_autotune_cache")
