"""Guard torch_npu's symbolic grouped autotune with the shared decision store.

Wraps ``NPUIndexTritonKernel._disable_grouped_autotune_if_benchmark_too_large``
(``torch_npu._inductor.codegen.triton``, torch-npu 2.14). The wrapper builds a
plan from ``inductor_meta``, looks the decision up by key (computing and storing
it on a miss) and applies it as upstream does: a fallback calls the kernel's own
``_disable_grouped_autotune(inductor_meta, reason)``, after which upstream's
codegen records ``enable_auto_blockify`` for dynamic kernels.

Never weaker than torch_npu: the budget is read from the same objects the
original method reads (its module's ``npu_config`` ratio and
``torch.npu.get_device_properties(device).total_memory``), and prescreen's own
ratio or device memory can only lower it. Anything prescreen cannot mirror
exactly (grouping code other than the torch-npu 2.14.0 code it mirrors, whatever
version the build reports: see ``prescreen.semantics``; a config value upstream
would not accept; a payload upstream would read differently; any error) calls the
original method instead.

Also wraps ``NPUSymbolicGroupedAutotuner._autotune_all_groups``
(``torch_npu._inductor.runtime.triton_heuristics``), the grouped benchmark run at
a kernel's first call: on an out-of-memory error it releases the failed step's
memory, stores ``observed_oom`` under the codegen key and finishes the step with
each group's first compiled, runnable candidate, unbenchmarked
(:func:`first_config_choices`); where it cannot mirror torch-npu 2.14 there, the
error propagates as before.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prescreen.budget import Budget
from prescreen.hooks import state
from prescreen.plan import KernelPlan
from prescreen.semantics import GROUPING_MODULE, installed_npu_version, why_not_mirrored
from prescreen.service import lookup_or_decide

log = logging.getLogger("prescreen.hooks")

NPU_MODULE = "torch_npu._inductor.codegen.triton"
NPU_CLASS = "NPUIndexTritonKernel"
GUARD_METHOD = "_disable_grouped_autotune_if_benchmark_too_large"
DISABLE_METHOD = "_disable_grouped_autotune"
#: The attribute of torch_npu's Inductor config the original method reads.
RATIO_ATTR = "symbolic_group_max_benchmark_memory_ratio"
_ORIGINAL_ATTR = "_prescreen_original_guard"


class Defer(Exception):
    """prescreen cannot mirror torch_npu here; the original method decides."""


def _upstream_globals(original: Callable[..., Any]) -> Mapping[str, Any]:
    """The module globals torch_npu's method reads (not copied: this runs at every decision)."""
    names: Mapping[str, Any] = getattr(inspect.unwrap(original), "__globals__", None) or {}
    return names


def config_ratio(config: object) -> float:
    """``config.symbolic_group_max_benchmark_memory_ratio`` where torch_npu would accept it; else ``Defer``.

    An int stays an int: torch_npu's ``int(total_memory * ratio)`` multiplies by it
    exactly, where ``float(ratio)`` would round a total above 2**53 bytes (up, at times).
    """
    value = getattr(config, RATIO_ATTR, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Defer(f"npu_config.{RATIO_ATTR}={value!r} is not a number")
    ratio = int(value) if isinstance(value, int) else float(value)
    if not math.isfinite(ratio) or not 0.0 < ratio <= 1.0:
        raise Defer(f"npu_config.{RATIO_ATTR}={value!r} is outside (0, 1]")
    return ratio


def npu_total_memory(torch_mod: Any, device: Any) -> int:
    """``torch.npu.get_device_properties(device).total_memory``, as torch_npu reads it; else ``Defer``."""
    try:
        total = int(torch_mod.npu.get_device_properties(device).total_memory)
    except Exception as exc:
        raise Defer(f"torch.npu.get_device_properties({device!r}) failed: {exc!r}") from None
    if total <= 0:
        raise Defer(f"invalid NPU total memory {total}")
    return total


def _process_fraction(torch_mod: Any, device: Any) -> float:
    """A ``set_per_process_memory_fraction`` cap, where torch.npu reports one (else 1.0)."""
    getter = getattr(getattr(torch_mod, "npu", None), "get_per_process_memory_fraction", None)
    if getter is None:
        return 1.0
    try:
        fraction = float(getter(device))
    except Exception:
        return 1.0
    return fraction if 0.0 < fraction < 1.0 else 1.0


def npu_budget(original: Callable[..., Any], device: Any) -> Budget:
    """torch_npu's own budget for ``device``, lowered (never raised) by prescreen's overrides.

    The ratio is the config object's (set in code or from torch_npu's variable
    when its config was imported), not the variable read now. A per-process
    memory fraction lowers the total (the safe direction).
    """
    names = _upstream_globals(original)
    return budget_from(names.get("npu_config"), names.get("torch"), device)


def budget_from(config: object, torch_mod: Any, device: Any) -> Budget:
    """torch_npu's budget from its config object and ``torch`` module, lowered by prescreen's overrides."""
    ratio = config_ratio(config)
    total = npu_total_memory(torch_mod, device)
    own_ratio, own_memory = state.overrides()
    if own_ratio is not None:
        # A float below torch_npu's int ratio (1) cannot raise the budget over ``total``: its product
        # rounds to at most the float next below float(total), and that float is below total.
        ratio = min(ratio, own_ratio)
    if own_memory is not None:
        total = min(total, own_memory)
    fraction = _process_fraction(torch_mod, device)
    if fraction < 1.0:
        total = max(1, int(total * fraction))
    return Budget("npu", total, ratio)


def _check_semantics(names: Mapping[str, Any]) -> None:
    """``Defer`` unless the grouping code a torch_npu module (its globals, ``names``) calls is the code prescreen
    mirrors: identified by that code itself, never by the version label alone (``prescreen.semantics``)."""
    why = why_not_mirrored(names, installed_npu_version())
    if why is not None:
        raise Defer(why)


def _runtime_names(autotuner: Any) -> Mapping[str, Any]:
    """The globals the grouped autotuner's own method runs with, else the imported ``symbolic_grouping``'s."""
    method = getattr(type(autotuner), RUNTIME_METHOD, None)
    names = getattr(inspect.unwrap(method), "__globals__", None) if callable(method) else None
    if isinstance(names, Mapping) and "build_group_representatives" in names:
        return names
    module = sys.modules.get(GROUPING_MODULE)
    return vars(module) if module is not None else {}


def guard(self: Any, inductor_meta: dict[str, Any], device: Any, original: Callable[..., Any]) -> None:
    """Decide from the store; apply like upstream; wherever prescreen cannot mirror upstream, defer to it."""
    if not inductor_meta.get("group_enabled", False):
        original(self, inductor_meta, device)
        return
    try:
        _check_semantics(_upstream_globals(original))
        budget = npu_budget(original, device)
        plan = KernelPlan.from_payload(inductor_meta, unknown_keys="ignore")
        outcome = lookup_or_decide(plan, budget, state.get_store())
    except Defer as exc:
        state.log_once(f"npu-defer:{exc}", logging.INFO, "prescreen: %s; using torch_npu's own check", exc)
        original(self, inductor_meta, device)
        return
    except Exception as exc:  # never break a compile: upstream decides instead
        state.log_once(f"npu-error:{type(exc).__name__}", logging.WARNING,
                       "prescreen: grouped-autotune guard could not decide (%s); using torch_npu's own check", exc)
        original(self, inductor_meta, device)
        return
    decision = outcome.decision
    if decision.tune:
        return
    state.log_once(outcome.key, logging.INFO, "prescreen: %s: %s [key %s, %s]", plan.display_name,
                   decision.reason, outcome.key[:12], "store hit" if outcome.hit else "computed")
    getattr(self, DISABLE_METHOD)(inductor_meta, decision.reason)


def _wrap_method(cls: type, method: str, marker: str,
                 wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``cls.<method>`` by ``wrapper(original)``, which keeps the original under ``marker``."""
    current = getattr(cls, method)
    wrapped = functools.wraps(current)(wrapper(current))
    setattr(wrapped, marker, current)
    setattr(cls, method, wrapped)


def _restore_method(cls: type, method: str, marker: str) -> None:
    """Put back the original a :func:`_wrap_method` kept, if ``cls.<method>`` is wrapped."""
    original = getattr(getattr(cls, method, None), marker, None)
    if original is not None:
        setattr(cls, method, original)


def _guarding(current: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self: Any, inductor_meta: dict[str, Any], device: Any) -> None:
        guard(self, inductor_meta, device, current)

    return guarded


def patch_class(cls: type) -> None:
    """Wrap ``cls``'s guard method (idempotent)."""
    if hasattr(getattr(cls, GUARD_METHOD), _ORIGINAL_ATTR):
        return
    if not callable(getattr(cls, DISABLE_METHOD, None)):
        raise AttributeError(f"{cls.__name__} has no {DISABLE_METHOD}; torch_npu layout not recognised")
    _wrap_method(cls, GUARD_METHOD, _ORIGINAL_ATTR, _guarding)


def unpatch_class(cls: type) -> None:
    """Restore ``cls``'s original guard method."""
    _restore_method(cls, GUARD_METHOD, _ORIGINAL_ATTR)


# --- learning from a real OOM in torch_npu's grouped benchmark (runtime) ------------------------------------

RUNTIME_MODULE = "torch_npu._inductor.runtime.triton_heuristics"
RUNTIME_CLASS = "NPUSymbolicGroupedAutotuner"
RUNTIME_METHOD = "_autotune_all_groups"
#: The grouped autotuner's setter of one group's winner (torch-npu 2.14), called for each fallback choice.
SET_WINNER_METHOD = "_set_group_best_candidate"
CONFIG_MODULE = "torch_npu._inductor.config"
_ORIGINAL_RUNTIME_ATTR = "_prescreen_original_autotune_all_groups"


@dataclass(frozen=True)
class GroupChoice:
    """The candidate one group runs with after an out-of-memory error, chosen without benchmarking."""

    group_id: int
    candidate: Mapping[str, Any]
    launcher: Any

    @property
    def candidate_id(self) -> object:
        return self.candidate.get("candidate_id")


def _tensor_device(args: tuple[Any, ...]) -> Any:
    for value in args:
        if hasattr(value, "device") and hasattr(value, "data_ptr"):
            return value.device
    return "npu"


def _sequence(name: str, value: object) -> Sequence[Any]:
    if not isinstance(value, (tuple, list)):
        raise Defer(f"{RUNTIME_CLASS}.{name} is {type(value).__name__}, not a sequence as in torch-npu 2.14")
    return value


def first_config_choices(autotuner: Any) -> tuple[GroupChoice, ...]:
    """For every reachable group still without a winner, its first compiled, runnable candidate.

    This is the choice torch_npu makes without benchmarking: a group's
    candidates (``candidate_plan["group_to_candidates"][group_id]``) come in the
    order of the configs its non-grouped heuristic generates at the group's
    representative size, and where ``NPUCachingAutotuner.autotuner`` skips
    benchmarking (one candidate, deterministic reductions) it takes the first
    compiled one (``_first_compiled_candidate_entry``). Launchers are matched
    to candidates and filtered as ``_build_grouped_benchmark_entries`` does
    (``compiled_candidate_entries`` by ``candidate_id``, ``launcher.runnable``),
    so no candidate the grouped benchmark could not have picked is chosen.
    Nothing is allocated and nothing is launched here.

    Raises ``Defer`` where the grouping code is not the torch-npu 2.14.0 code
    prescreen mirrors, where the autotuner is not laid out as torch-npu 2.14's
    ``NPUSymbolicGroupedAutotuner``, or where a group has no runnable candidate
    (torch_npu would fail there too): the caller then lets the error propagate.
    """
    _check_semantics(_runtime_names(autotuner))
    plan = getattr(autotuner, "candidate_plan", None)
    groups = _sequence("candidate_plan['group_to_candidates']",
                       plan.get("group_to_candidates") if isinstance(plan, Mapping) else None)
    keys = _sequence("reachable_selection_keys", getattr(autotuner, "reachable_selection_keys", None))
    entries = _sequence("compiled_candidate_entries", getattr(autotuner, "compiled_candidate_entries", None))
    winners = getattr(autotuner, "best_launcher_map", None)
    if not isinstance(winners, Mapping) or not callable(getattr(autotuner, SET_WINNER_METHOD, None)):
        raise Defer(f"{RUNTIME_CLASS} has no best_launcher_map / {SET_WINNER_METHOD} as in torch-npu 2.14")
    try:
        launchers = {entry["candidate"]["candidate_id"]: entry["launcher"] for entry in entries}
        choices = []
        for group_id in keys:
            if group_id in winners:
                continue
            if isinstance(group_id, bool) or not isinstance(group_id, int) or not 0 <= group_id < len(groups):
                raise Defer(f"reachable group {group_id!r} is not an index of group_to_candidates")
            for candidate in groups[group_id]:
                launcher = launchers.get(candidate["candidate_id"])
                if launcher is not None and getattr(launcher, "runnable", False):
                    choices.append(GroupChoice(group_id, candidate, launcher))
                    break
            else:
                raise Defer(f"group {group_id} has no compiled, runnable candidate")
    except (KeyError, TypeError) as exc:
        raise Defer(f"{RUNTIME_CLASS}'s candidates are not laid out as in torch-npu 2.14 ({exc!r})") from None
    return tuple(choices)


def learn_from_oom(autotuner: Any, device: Any, requested_bytes: int | None, free_bytes: int | None,
                   error: str) -> str:
    """Store an ``observed_oom`` fallback for the kernel whose grouped benchmark ran out of memory.

    The key is the one the codegen hook looks up (the plan in the kernel's
    ``inductor_meta``, torch_npu's budget), so the next compile of this kernel
    takes the non-grouped path with auto-blockify and benchmarks no group.
    Returns the key.
    """
    from prescreen.service import record_observed_oom

    _check_semantics(_runtime_names(autotuner))
    budget = budget_from(sys.modules.get(CONFIG_MODULE), sys.modules.get("torch"), device)
    plan = KernelPlan.from_payload(dict(getattr(autotuner, "inductor_meta", None) or {}), unknown_keys="ignore")
    outcome = record_observed_oom(plan, budget, state.get_store(), requested_bytes=requested_bytes,
                                  free_bytes=free_bytes, error=error)
    return outcome.key


def _fallback_choices(autotuner: Any) -> tuple[tuple[GroupChoice, ...] | None, str]:
    """:func:`first_config_choices`, or None and why not (no exception leaves, so a re-raise keeps its context)."""
    try:
        return first_config_choices(autotuner), ""
    except Defer as exc:
        return None, str(exc)
    except Exception as exc:  # an autotuner prescreen cannot read: torch_npu's behaviour
        return None, repr(exc)


def _record(autotuner: Any, device: Any, info: tuple[int | None, int | None, str], name: str) -> str:
    """Store ``observed_oom`` (never raises); the key's first 12 characters, or "?"."""
    try:
        return learn_from_oom(autotuner, device, *info)[:12]
    except Exception as exc:
        log.warning("prescreen: could not record torch_npu's out-of-memory error in %s (%r)", name, exc)
        return "?"


def _remembering(current: Callable[..., Any]) -> Callable[..., Any]:
    def remembered(self: Any, *args: Any, **kwargs: Any) -> Any:
        from prescreen.hooks import oom

        name = str((getattr(self, "inductor_meta", None) or {}).get("kernel_name", "?"))
        try:
            return current(self, *args, **kwargs)
        except Exception as exc:
            if not oom.is_oom(exc):
                raise
            device = _tensor_device(args)
            info = oom.info(exc, device)
            choices, why = _fallback_choices(self)
            if choices is None:
                oom.release(device)
                key = _record(self, device, info, name)
                log.warning("prescreen: torch_npu's grouped benchmark of %s ran out of memory (%s); stored as "
                            "observed_oom [key %s]; no fallback in this process (%s): the error propagates as "
                            "in torch_npu", name, info[2], key, why)
                raise
        # The error, its traceback and the failed step's frames (the benchmark tensors, the closures
        # holding their launch arguments) are gone once the except block ends: give the memory back.
        oom.release(device)
        key = _record(self, device, info, name)
        setter = getattr(self, SET_WINNER_METHOD)
        for choice in choices:
            setter(choice.group_id, choice.candidate, choice.launcher)
        log.warning("prescreen: torch_npu's grouped benchmark of %s ran out of memory (%s; requested %s bytes, "
                    "%s free); released its buffers, running each group's first config unbenchmarked (%s) and "
                    "stored as observed_oom [key %s]: later compiles take the non-grouped path", name, info[2],
                    info[0], info[1], ", ".join(f"group {c.group_id}: {c.candidate_id}" for c in choices), key)
        return None

    return remembered


def patch_runtime_class(cls: type) -> None:
    """Wrap ``cls._autotune_all_groups`` so that the call completes after an out-of-memory error (idempotent).

    On an OOM the wrapper drops the failed step's frames, empties the device
    cache, stores ``observed_oom`` under the codegen key (every later compile of
    the kernel falls back at codegen) and gives every reachable group its first
    compiled, runnable candidate without benchmarking (:func:`first_config_choices`),
    so the kernel launches and the call returns as upstream's would. Where the
    autotuner is not laid out as torch-npu 2.14's, the error is raised as before.
    """
    if not hasattr(getattr(cls, RUNTIME_METHOD), _ORIGINAL_RUNTIME_ATTR):
        _wrap_method(cls, RUNTIME_METHOD, _ORIGINAL_RUNTIME_ATTR, _remembering)


def unpatch_runtime_class(cls: type) -> None:
    """Restore ``cls``'s original grouped-autotune method."""
    _restore_method(cls, RUNTIME_METHOD, _ORIGINAL_RUNTIME_ATTR)


def patch_runtime() -> bool:
    """Patch torch_npu's grouped runtime autotuner if its module is imported; True if patched."""
    module = sys.modules.get(RUNTIME_MODULE)
    cls = getattr(module, RUNTIME_CLASS, None) if module is not None else None
    if cls is None or not callable(getattr(cls, RUNTIME_METHOD, None)):
        return False
    patch_runtime_class(cls)
    return True


def patch() -> bool:
    """Patch torch_npu if its Inductor codegen is already imported; True if patched."""
    module = sys.modules.get(NPU_MODULE)
    cls = getattr(module, NPU_CLASS, None) if module is not None else None
    if cls is None:
        return False
    if not hasattr(cls, GUARD_METHOD):
        log.warning("prescreen: %s.%s has no %s (torch_npu version without the grouped guard); not patched",
                    NPU_MODULE, NPU_CLASS, GUARD_METHOD)
        return False
    patch_class(cls)
    return True


def unpatch() -> None:
    """Restore torch_npu's original methods, where they were patched."""
    module = sys.modules.get(NPU_MODULE)
    cls = getattr(module, NPU_CLASS, None) if module is not None else None
    if cls is not None:
        unpatch_class(cls)
    runtime = sys.modules.get(RUNTIME_MODULE)
    runtime_cls = getattr(runtime, RUNTIME_CLASS, None) if runtime is not None else None
    if runtime_cls is not None:
        unpatch_runtime_class(runtime_cls)
