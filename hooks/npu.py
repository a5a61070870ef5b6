"""Guard torch_npu's symbolic grouped autotune with the shared decision store.

``NPUIndexTritonKernel._disable_grouped_autotune_if_benchmark_too_large`` (torch-npu 2.14 codegen): the plan in
``inductor_meta`` is decided (looked up, or computed and stored) and a fallback applied as upstream applies it,
through ``_disable_grouped_autotune``. Never weaker than torch_npu: the budget is read from the objects the
original reads, and prescreen's overrides only lower it. Anything prescreen cannot mirror exactly calls the original.

``NPUSymbolicGroupedAutotuner._autotune_all_groups`` (a kernel's first call): an out-of-memory error is stored as
``observed_oom`` under the codegen key and the step finishes with each group's first runnable candidate,
unbenchmarked; where that cannot be mirrored, the error propagates as before.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import inspect
import linecache
import logging
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from prescreen.budget import Budget
from prescreen.hooks import state
from prescreen.plan import KernelPlan
from prescreen.service import lookup_or_decide, record_observed_oom

log = logging.getLogger("prescreen.hooks")

NPU_MODULE = "torch_npu._inductor.codegen.triton"
NPU_CLASS = "NPUIndexTritonKernel"
GUARD_METHOD = "_disable_grouped_autotune_if_benchmark_too_large"
DISABLE_METHOD = "_disable_grouped_autotune"
RUNTIME_MODULE = "torch_npu._inductor.runtime.triton_heuristics"
RUNTIME_CLASS = "NPUSymbolicGroupedAutotuner"
RUNTIME_METHOD = "_autotune_all_groups"
#: The grouped autotuner's setter of one group's winner (torch-npu 2.14), called for each fallback choice.
SET_WINNER_METHOD = "_set_group_best_candidate"
CONFIG_MODULE = "torch_npu._inductor.config"
#: The attribute of torch_npu's Inductor config the original method reads.
RATIO_ATTR = "symbolic_group_max_benchmark_memory_ratio"
#: Where a wrapped method keeps torch_npu's original.
_ORIGINAL_ATTR = "_prescreen_original_guard"


class Defer(Exception):
    """prescreen cannot mirror torch_npu here; the original method decides."""


# --- is the grouping code torch_npu calls the torch-npu 2.14.0 code prescreen mirrors? ---------------------
#
# A version says nothing about the code (Ascend's master rounds some buckets differently, and a source build
# still calls itself 2.14.0), so the guard trusts the functions it calls only where each mirrored definition has
# 2.14.0's syntax tree, they answer a probe plan as 2.14.0 does (master differs), and an installed distribution,
# if any, is of the 2.14 series. The torch_npu version is in every key too.

MIRRORED_RELEASE = "2.14.0"
MIRRORED_SERIES = "2.14"
GROUPING_MODULE = "torch_npu._inductor.runtime.symbolic_grouping"
#: The functions the guard calls, and the module's functions and classes they use.
ENTRY_NAMES = ("build_group_representatives", "estimate_grouped_benchmark_footprint")
MIRRORED_NAMES = (
    *ENTRY_NAMES, "evaluate_grouped_benchmark_expr", "required_storage_numel",
    "_grouped_benchmark_dtype_itemsize", "_feature_field",
    "UnsupportedGroupedPlan", "GroupedBenchmarkFootprint", "GroupedBenchmarkArgFootprint",
)
#: Each one's syntax-tree digest in the torch-npu 2.14.0 wheel (the same on Python 3.10 to 3.13).
MIRRORED_DIGESTS: dict[str, str] = {
    "build_group_representatives": "4ab1517b025ae4807b7c1c684e2e37cb",
    "estimate_grouped_benchmark_footprint": "ecd0b42e1008d3ccb7d1d7c4f9f38ad0",
    "evaluate_grouped_benchmark_expr": "5a9b1a1c15a6bf58a8b284289a313c28",
    "required_storage_numel": "f5459414f44a1b63dae587c7bccbc763",
    "_grouped_benchmark_dtype_itemsize": "20cd52c8ac2b010bc70aa127a2d6cb83",
    "_feature_field": "ae71e3777d2c14a41da21aa51ab76879",
    "UnsupportedGroupedPlan": "4b9bc3d80dad5eab5d4b52336c6a3d2a",
    "GroupedBenchmarkFootprint": "a796c4e4160689afd29e5e0f88166630",
    "GroupedBenchmarkArgFootprint": "766e4b2b3b15b539365578d2311a9376",
}

#: The probe: one feature over ``x0 * x1`` (x1 = 64 static) with closed buckets at 100 and 1000, where
#: 2.14.0 takes x0 = ceil(100 / 64) = 2 and ceil(1000 / 64) = 16 (master: 1 and 15), an open bucket
#: (x0 = 32), and a feature over a static axis only, whose other bucket no group reaches.
PROBE_FEATURES = (
    {"name": "outer", "source": "outer_product", "axis_names": ("x0", "x1"), "buckets": (100, 1000)},
    {"name": "reduction", "source": "reduction_product", "axis_names": ("r0_",), "buckets": (8,)},
)
PROBE_AXES = ("x0", "x1", "r0_")
PROBE_STATICS = (("x1", 64), ("r0_", 4))
PROBE_ARGS = (
    {"kind": "tensor", "source": "buffer", "name": "in_ptr0", "dtype": "torch.float16",
     "size_exprs": ({"add": ({"axis_name": "x0"}, {"const": -1})}, {"axis_name": "x1"}),
     "stride_exprs": ({"axis_name": "x1"}, 1)},
    {"kind": "workspace", "source": "workspace", "name": "ws",
     "count_expr": {"floordiv": ({"mul": ({"axis_name": "x0"}, 3)}, {"axis_name": "r0_"})}, "dtype": "torch.int32"},
    {"kind": "size", "source": "axis_expr", "name": "xnumel", "expr": {"axis_name": "x0"}},
)
PROBE_MUTATED = ("in_ptr0",)
#: 2.14.0's answer: reachable groups, each one's axis values, and the footprint's total bytes.
PROBE_REACHABLE = (0, 1, 2)
PROBE_AXIS_VALUES = ((("x0", 2), ("x1", 64), ("r0_", 4)), (("x0", 16), ("x1", 64), ("r0_", 4)),
                     (("x0", 32), ("x1", 64), ("r0_", 4)))
PROBE_TOTAL_BYTES = 10132


@functools.cache
def installed_npu_version() -> str | None:
    """The installed torch_npu distribution's version, or None when there is no distribution metadata."""
    for dist in ("torch_npu", "torch-npu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def series_allows(version: str | None) -> bool:
    """False where an installed distribution names another release series; a 2.14 label or none is no proof."""
    if version is None:
        return True
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return match is not None and f"{match[1]}.{match[2]}" == MIRRORED_SERIES


def _canonical(node: object) -> object:
    """A syntax tree as nested tuples, without positions and without the empty or missing fields that differ
    between Python versions for the same code (3.12's ``type_params``, 3.13's defaults)."""
    if isinstance(node, ast.AST):
        return (type(node).__name__, tuple((name, _canonical(value)) for name, value in ast.iter_fields(node)
                                           if value is not None and value != [] and name != "type_comment"))
    if isinstance(node, list):
        return tuple(_canonical(item) for item in node)
    return node


def _defined_by(obj: object, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, filename: str) -> bool:
    """Whether ``obj`` is the object that ``node`` of ``filename`` defines (not one rebound under its name)."""
    first_line = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    code = getattr(obj, "__code__", None)
    if code is not None:
        return bool(code.co_filename == filename and code.co_firstlineno == first_line)
    if not isinstance(obj, type) or obj.__qualname__ != node.name:
        return False
    first = getattr(obj, "__firstlineno__", None)  # Python 3.13: its first decorator's line
    return getattr(sys.modules.get(obj.__module__), "__file__", None) == filename and first in (None, first_line)


def module_digests(module: Mapping[str, Any]) -> dict[str, str]:
    """The syntax-tree digest of each of ``MIRRORED_NAMES`` as the module's source file defines it; ``LookupError``
    names what is missing or rebound, ``OSError`` where the source cannot be read (then it is not mirrored)."""
    filename = getattr(getattr(module.get(ENTRY_NAMES[0]), "__code__", None), "co_filename", None)
    lines = linecache.getlines(filename) if isinstance(filename, str) else []
    if not lines:
        raise OSError(f"no source file for {filename or ENTRY_NAMES[0]}")
    defined = {node.name: node for node in ast.parse("".join(lines)).body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    digests = {}
    for name in MIRRORED_NAMES:
        node = defined.get(name)
        if node is None or not _defined_by(module.get(name), node, filename):  # type: ignore[arg-type]
            raise LookupError(f"its {name} is not defined in {filename}")
        digests[name] = hashlib.sha256(repr(_canonical(node)).encode()).hexdigest()[:32]
    return digests


def probe(module: Mapping[str, Any]) -> str | None:
    """How the module's functions answer the probe plan differently from 2.14.0, or None."""
    try:  # on copies: foreign code may edit what it is given
        reps = module[ENTRY_NAMES[0]](copy.deepcopy(PROBE_FEATURES), PROBE_AXES, PROBE_STATICS)
        reachable = tuple(reps["reachable_group_ids"])
        axis_values = tuple(tuple(reps["benchmark_axis_values_by_group"][g]) for g in reachable)
        total = module[ENTRY_NAMES[1]](reps, copy.deepcopy(PROBE_ARGS), PROBE_MUTATED).total_bytes
    except Exception as exc:  # foreign code: whatever it raises, it is not 2.14.0's
        return f"the probe plan raised {type(exc).__name__}: {exc}"
    if (reachable, axis_values, total) != (PROBE_REACHABLE, PROBE_AXIS_VALUES, PROBE_TOTAL_BYTES):
        return (f"on the probe plan it gives groups {reachable}, axis values {axis_values} and {total} bytes "
                f"where {MIRRORED_RELEASE} gives {PROBE_REACHABLE}, {PROBE_AXIS_VALUES} and {PROBE_TOTAL_BYTES}")
    return None


def _differs(module: Mapping[str, Any]) -> str | None:
    """Which mirrored function or class is not 2.14.0's, or how it answers the probe differently; else None."""
    try:
        digests = module_digests(module)
    except LookupError as exc:
        return str(exc.args[0])
    except (OSError, SyntaxError, ValueError) as exc:
        return f"its source cannot be read ({exc})"
    differ = [name for name in MIRRORED_NAMES if digests[name] != MIRRORED_DIGESTS[name]]
    return f"its {', '.join(differ)} differ from {MIRRORED_RELEASE}'s" if differ else probe(module)


#: The verdict per tuple of a module's mirrored objects: its source is parsed and the probe run once.
_verdicts: dict[tuple[object, ...], str | None] = {}


def _code_verdict(names: Mapping[str, Any], module: Mapping[str, Any]) -> str | None:
    """Why the grouping code ``names`` calls (from ``module``, its globals) is not 2.14.0's, or None where it is."""
    if not module:
        return f"it has no {ENTRY_NAMES[0]} function to check"
    # the caller's other imports must be that module's: a name rebound in the caller is another function
    for name in (ENTRY_NAMES[1], "UnsupportedGroupedPlan"):
        if name in names and names[name] is not module.get(name):
            return f"the caller's {name} is not that module's"
    objects = tuple(map(module.get, MIRRORED_NAMES))
    try:
        if objects not in _verdicts:  # computed twice by a race at worst: the same answer
            _verdicts[objects] = _differs(module)
    except TypeError:  # an unhashable object under a mirrored name: not a function or class, so not 2.14.0's
        return "a mirrored name holds neither a function nor a class"
    return _verdicts[objects]


def why_not_mirrored(names: Mapping[str, Any], version: str | None) -> str | None:
    """None where the grouping code ``names`` (a caller's globals) calls is the code prescreen mirrors; else why not."""
    if not series_allows(version):
        return f"torch_npu {version} is not a {MIRRORED_SERIES} release, whose grouped-footprint code prescreen mirrors"
    found = getattr(names.get(ENTRY_NAMES[0]), "__globals__", None)
    module: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    why = _code_verdict(names, module)
    if why is None:
        return None
    where = module.get("__file__") or module.get("__name__") or "not found"
    return (f"torch_npu's symbolic_grouping ({where}; version {version or 'without metadata'}) is not the "
            f"torch-npu {MIRRORED_RELEASE} code prescreen mirrors: {why}")


def _check_mirrored(names: Mapping[str, Any]) -> None:
    """``Defer`` unless the grouping code a torch_npu module (its globals, ``names``) calls is the code mirrored."""
    why = why_not_mirrored(names, installed_npu_version())
    if why is not None:
        raise Defer(why)


# --- the codegen guard ---------------------------------------------------------------------------------------

def budget_from(config: object, torch_mod: Any, device: Any) -> Budget:
    """torch_npu's budget from its config object and ``torch`` module, lowered (never raised) by prescreen's overrides.

    The ratio is the config object's, not the variable read now; an int ratio stays an int (torch_npu's
    ``int(total_memory * ratio)`` is exact for it). A per-process memory fraction lowers the total.
    """
    value = getattr(config, RATIO_ATTR, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Defer(f"npu_config.{RATIO_ATTR}={value!r} is not a number")
    ratio = int(value) if isinstance(value, int) else float(value)
    if not math.isfinite(ratio) or not 0.0 < ratio <= 1.0:
        raise Defer(f"npu_config.{RATIO_ATTR}={value!r} is outside (0, 1]")
    try:
        total = int(torch_mod.npu.get_device_properties(device).total_memory)
    except Exception as exc:
        raise Defer(f"torch.npu.get_device_properties({device!r}) failed: {exc!r}") from None
    if total <= 0:
        raise Defer(f"invalid NPU total memory {total}")
    own_ratio, own_memory = state.overrides()
    if own_ratio is not None:
        # A float below torch_npu's int ratio (1) cannot raise the budget over ``total``: its product
        # rounds to at most the float next below float(total), and that float is below total.
        ratio = min(ratio, own_ratio)
    if own_memory is not None:
        total = min(total, own_memory)
    try:
        fraction = float(torch_mod.npu.get_per_process_memory_fraction(device))
    except Exception:  # not reported by this torch.npu: no cap
        fraction = 1.0
    if 0.0 < fraction < 1.0:
        total = max(1, int(total * fraction))
    return Budget("npu", total, ratio)


def guard(self: Any, inductor_meta: dict[str, Any], device: Any, original: Callable[..., Any]) -> None:
    """Decide from the store; apply like upstream; wherever prescreen cannot mirror upstream, defer to it."""
    if not inductor_meta.get("group_enabled", False):
        original(self, inductor_meta, device)
        return
    try:
        names: Mapping[str, Any] = getattr(inspect.unwrap(original), "__globals__", None) or {}  # not copied
        _check_mirrored(names)
        budget = budget_from(names.get("npu_config"), names.get("torch"), device)
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


def _wrap(cls: type, method: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``cls.<method>`` by ``wrapper(original)``, keeping the original under ``_ORIGINAL_ATTR`` (idempotent)."""
    current = getattr(cls, method)
    if not hasattr(current, _ORIGINAL_ATTR):
        wrapped = functools.wraps(current)(wrapper(current))
        setattr(wrapped, _ORIGINAL_ATTR, current)
        setattr(cls, method, wrapped)


def _guarding(current: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self: Any, inductor_meta: dict[str, Any], device: Any) -> None:
        guard(self, inductor_meta, device, current)

    return guarded


def patch_class(cls: type) -> None:
    """Wrap ``cls``'s guard method (idempotent)."""
    if not callable(getattr(cls, DISABLE_METHOD, None)):
        raise AttributeError(f"{cls.__name__} has no {DISABLE_METHOD}; torch_npu layout not recognised")
    _wrap(cls, GUARD_METHOD, _guarding)


def unpatch_class(cls: type) -> None:
    """Put back torch_npu's methods on ``cls`` where prescreen wrapped them."""
    for method in (GUARD_METHOD, RUNTIME_METHOD):
        original = getattr(getattr(cls, method, None), _ORIGINAL_ATTR, None)
        if original is not None:
            setattr(cls, method, original)


# --- learning from a real OOM in torch_npu's grouped benchmark (runtime) ------------------------------------

@dataclass(frozen=True)
class GroupChoice:
    """The candidate one group runs with after an out-of-memory error, chosen without benchmarking."""

    group_id: int
    candidate: Mapping[str, Any]
    launcher: Any

    @property
    def candidate_id(self) -> object:
        return self.candidate.get("candidate_id")


def _runtime_names(autotuner: Any) -> Mapping[str, Any]:
    """The globals the grouped autotuner's own method runs with, else the imported ``symbolic_grouping``'s."""
    method = getattr(type(autotuner), RUNTIME_METHOD, None)
    names = getattr(inspect.unwrap(method), "__globals__", None) if callable(method) else None
    if isinstance(names, Mapping) and ENTRY_NAMES[0] in names:
        return names
    module = sys.modules.get(GROUPING_MODULE)
    return vars(module) if module is not None else {}


def _sequence(name: str, value: object) -> Sequence[Any]:
    if not isinstance(value, (tuple, list)):
        raise Defer(f"{RUNTIME_CLASS}.{name} is {type(value).__name__}, not a sequence as in torch-npu 2.14")
    return value


def first_config_choices(autotuner: Any) -> tuple[GroupChoice, ...]:
    """For every reachable group still without a winner, its first compiled, runnable candidate: torch_npu's own
    choice where it skips benchmarking (``_first_compiled_candidate_entry``), launchers matched and filtered as
    ``_build_grouped_benchmark_entries`` does. Nothing is allocated or launched. ``Defer`` where the grouping code
    or the autotuner's layout is not torch-npu 2.14.0's, or a group has no runnable candidate.
    """
    _check_mirrored(_runtime_names(autotuner))
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


def _record(autotuner: Any, device: Any, info: tuple[int | None, int | None, str], name: str) -> str:
    """Store ``observed_oom`` under the key the codegen guard looks up (so the next compile of the kernel takes
    the non-grouped path); never raises. Returns the key's first 12 characters, or "?"."""
    try:
        _check_mirrored(_runtime_names(autotuner))
        budget = budget_from(sys.modules.get(CONFIG_MODULE), sys.modules.get("torch"), device)
        plan = KernelPlan.from_payload(dict(getattr(autotuner, "inductor_meta", None) or {}), unknown_keys="ignore")
        return record_observed_oom(plan, budget, state.get_store(), requested_bytes=info[0], free_bytes=info[1],
                                   error=info[2]).key[:12]
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
            device = next((a.device for a in args if hasattr(a, "device") and hasattr(a, "data_ptr")), "npu")
            info = oom.info(exc, device)
            choices: tuple[GroupChoice, ...] | None = None
            try:  # no exception may leave here, so that the re-raise below keeps its context
                choices, why = first_config_choices(self), ""
            except Exception as error:  # an autotuner prescreen cannot read: torch_npu's behaviour
                why = str(error) if isinstance(error, Defer) else repr(error)
            if choices is None:
                oom.release(device)
                key = _record(self, device, info, name)
                log.warning("prescreen: torch_npu's grouped benchmark of %s ran out of memory (%s); stored as "
                            "observed_oom [key %s]; no fallback in this process (%s): the error propagates as "
                            "in torch_npu", name, info[2], key, why)
                raise
        # The failed step's frames (its benchmark tensors and launch closures) are gone now: give the memory back.
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
    """Wrap ``cls._autotune_all_groups`` so that the call completes after an out-of-memory error (idempotent)."""
    _wrap(cls, RUNTIME_METHOD, _remembering)


def patch() -> None:
    """Patch torch_npu's codegen guard, where its module is imported."""
    cls = getattr(sys.modules.get(NPU_MODULE), NPU_CLASS, None)
    if cls is None:
        return
    if not hasattr(cls, GUARD_METHOD):
        log.warning("prescreen: %s.%s has no %s (torch_npu version without the grouped guard); not patched",
                    NPU_MODULE, NPU_CLASS, GUARD_METHOD)
        return
    patch_class(cls)


def patch_runtime() -> None:
    """Patch torch_npu's grouped runtime autotuner, where its module is imported."""
    cls = getattr(sys.modules.get(RUNTIME_MODULE), RUNTIME_CLASS, None)
    if cls is not None and callable(getattr(cls, RUNTIME_METHOD, None)):
        patch_runtime_class(cls)


def unpatch() -> None:
    """Restore torch_npu's original methods, where they were patched."""
    for module, name in ((NPU_MODULE, NPU_CLASS), (RUNTIME_MODULE, RUNTIME_CLASS)):
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None:
            unpatch_class(cls)
