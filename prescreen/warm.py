"""``prescreen warm``: compile a model over its shape families with the hooks on, or decide plans directly."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prescreen import artifact as prescreen_artifact
from prescreen import families
from prescreen import target as targets
from prescreen.budget import Budget, resolve_ratio
from prescreen.errors import ConfigError, NotBounded
from prescreen.expr import Const
from prescreen.plan import KernelPlan
from prescreen.service import OBSERVERS, Outcome, lookup_or_decide
from prescreen.store.base import NullStore, Store
from prescreen.store.entry import Entry
from prescreen.target import ShapeRange, build, check_device, check_fits, first_line, load_target, shape_points

#: ``progress(done, total, sizes)``: what a warm reports before each compile (or plan).
Progress = Callable[[int, int, dict[str, int]], None]


class ReadOnlyStore(NullStore):
    """Looks decisions up in another store and never writes (``--dry-run``: the hooks hold a store, not a flag)."""

    backend = "dry-run"

    def __init__(self, inner: Store) -> None:
        super().__init__("dry run: nothing is stored")
        self.inner, self.location = inner, inner.location

    def get(self, key: str) -> Entry | None:
        return self.inner.get(key)

    def lookup(self, key: str) -> Entry | None:
        return self.inner.lookup(key)


@dataclasses.dataclass
class Record:
    """One decision ``warm`` saw."""

    key: str
    kernel: str
    sizes: dict[str, int]
    action: str
    bounded: bool
    estimated_bytes: int | None
    budget_bytes: int
    hit: bool
    reason: str
    site: str = ""  # the kernel independent of the sizes it was compiled at (see kernel_site)
    family: str = ""  # the shape family the decision covers, e.g. "batch in (2048, 4096]" (empty: static)


@dataclasses.dataclass
class WarmReport:
    """What ``warm`` prints: per-decision records and totals."""

    records: list[Record] = dataclasses.field(default_factory=list)
    compiles: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    store: str = ""
    families: int = 0  # shape families the compiled sizes cover (one bucket per shape)
    decided_families: int = 0  # of those, the ones whose compile made at least one decision
    cache_answered: int = 0  # compiles torch's FX/AOTAutograd caches answered (then lowered again to decide)
    carried: int = 0  # ``--plan-only``: sizes decided from another size's lowering of the same graph
    plan_only: bool = False  # every benchmark skipped: the decisions alone (``--plan-only``)
    #: Why nothing was guarded, and what to change, when a compile saw no autotuned kernel.
    hints: list[str] = dataclasses.field(default_factory=list)
    artifact: prescreen_artifact.Saved | None = None  # what ``--artifact`` wrote

    @property
    def kernels(self) -> int:
        """Distinct kernels (a GEMM compiled at several sizes counts once)."""
        return len({r.site or r.key for r in self.records})

    @property
    def tuned(self) -> int:
        return sum(r.action == "tune" for r in self.unique())

    @property
    def fell_back(self) -> int:
        return sum(r.action == "fallback" and r.bounded for r in self.unique())

    @property
    def not_bounded(self) -> int:
        return sum(not r.bounded for r in self.unique())

    @property
    def largest(self) -> int | None:
        sizes = [r.estimated_bytes for r in self.records if r.estimated_bytes is not None]
        return max(sizes) if sizes else None

    def unique(self) -> list[Record]:
        seen: dict[str, Record] = {}
        for r in self.records:
            seen.setdefault(r.key, r)
        return list(seen.values())

    def to_json(self) -> dict[str, Any]:
        fields = dataclasses.asdict(dataclasses.replace(self, records=[]))  # the records go as "decisions", once
        del fields["records"]
        return {"kernels": self.kernels, "decisions_made": len(self.unique()), "lookups": len(self.records),
                "tuned": self.tuned, "fell_back": self.fell_back, "not_bounded": self.not_bounded,
                "largest_estimated_bytes": self.largest, **fields, "seconds": round(self.seconds, 3),
                "decisions": [dataclasses.asdict(r) for r in self.unique()]}


def kernel_site(plan: KernelPlan) -> str:
    """A digest of the kernel without its dynamic sizes (name; each arg's name, dtype and static dims, ``?`` for a
    dynamic one): one kernel compiled at several sizes makes several decisions, and counts once."""
    args = [(a.name, getattr(a, "dtype", ""), [e.value if isinstance(e, Const) else "?" for e in getattr(a, "size", ())])
            for a in plan.args]
    return hashlib.sha256(json.dumps([plan.display_name, args]).encode()).hexdigest()[:16]


def _record(outcome: Outcome, plan: KernelPlan, sizes: Mapping[str, int]) -> Record:
    d = outcome.decision
    return Record(outcome.key, plan.display_name, dict(sizes), d.action, d.bounded, d.estimated_bytes, d.budget_bytes,
                  outcome.hit, d.reason, kernel_site(plan), ", ".join(text for _, text in plan.axis_labels))


def select_points(shapes: tuple[ShapeRange, ...], points: int | None = None) -> list[dict[str, int]]:
    """The sizes ``warm`` compiles at, every combination over the shapes (one ``{}`` without shapes): one size per
    shape family each range reaches, or ``points`` (``exact`` buckets: 2) spread geometrically over each range."""
    if not shapes:
        return [{}]
    scheme = families.scheme_from_env()
    if points is not None or scheme.kind == "exact":
        return list(shape_points(shapes, points or 2))
    per_shape = [[families.point_of(b, i) for b in scheme.covering(s.low, s.high)] for i, s in enumerate(shapes)]
    return [dict(zip((s.name for s in shapes), values)) for values in itertools.product(*per_shape)]


def families_covered(grid: list[dict[str, int]]) -> int:
    """How many shape families (one bucket per shape) the sizes in ``grid`` fall in."""
    scheme = families.active_scheme()
    return len({tuple((k, scheme.bucket(v)) for k, v in sorted(sizes.items())) for sizes in grid})


#: The ``torch._inductor.select_algorithm`` functions that print autotune tables and choice statistics, by the
#: Inductor setting that governs each. ``warm`` silences the functions, not the settings: Inductor's config is
#: part of torch's cache keys, so a quieter config would fill torch's caches under keys no replica computes.
QUIET_AUTOTUNE: dict[str, str] = {
    "autotune_num_choices_displayed": "AlgorithmSelectorCache.log_results",
    "max_autotune_report_choices_stats": "_log_autotune_choices_stats",
}


def _silent(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def _patched(changes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each ``(owner, attribute, value)`` set inside the block, the owner's own value back after it."""
    saved = [(owner, attr, vars(owner)[attr]) for owner, attr, _ in changes]
    try:
        for owner, attr, value in changes:
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def _autotune_output_held(settings: Mapping[str, Any], verbose: bool) -> contextlib.AbstractContextManager[None]:
    """Inside the block, Inductor's autotune tables and choice statistics print nothing (see ``QUIET_AUTOTUNE``)."""
    from torch._inductor import select_algorithm

    changes = []
    for name in (name for setting, name in QUIET_AUTOTUNE.items() if not verbose and setting not in settings):
        owner_name, _, attr = name.rpartition(".")
        owner = getattr(select_algorithm, owner_name, None) if owner_name else select_algorithm
        if owner is None or attr not in vars(owner):
            logging.getLogger("prescreen").info("prescreen warm: this torch has no select_algorithm.%s; its "
                                                "autotune output is not held back", name)
        else:
            changes.append((owner, attr, staticmethod(_silent) if owner_name else _silent))
    return _patched(changes)


@contextlib.contextmanager
def _decision_lines_held() -> Iterator[None]:
    """Drops the hooks' per-decision diagnostics (``state.log_once``): warm's table shows each decision."""
    def drop(record: logging.LogRecord) -> bool:
        return record.funcName != "log_once"

    hooks_log = logging.getLogger("prescreen.hooks")
    hooks_log.addFilter(drop)
    try:
        yield
    finally:
        hooks_log.removeFilter(drop)


def why_nothing_was_guarded(device: str, mode: str, settings: Mapping[str, Any]) -> list[str]:
    """What to change when the compiles saw no autotuned kernel (``warm`` prints these instead of an empty table)."""
    hints = ["prescreen guards Inductor's autotune benchmarks, and these compiles ran none."]
    if mode not in ("max-autotune", "max-autotune-no-cudagraphs") and not settings.get("max_autotune"):
        hints.append(f"--mode {mode} does not autotune: use --mode max-autotune.")
    if device.split(":")[0] == "cpu" and not settings.get("freezing"):
        hints.append("On CPU, Inductor autotunes GEMM templates only for frozen weights: add "
                     "--inductor-config freezing=True (or inductor_config = \"freezing=True\" in the spec).")
    if len(hints) == 1:
        hints.append("The model may hold no GEMM or convolution Inductor autotunes at these sizes; try larger "
                     "shapes, or -v to see Inductor's autotune output.")
    return hints


def _cache_hits() -> int:
    """How many compiles torch's FX graph and AOTAutograd caches have answered (nothing lowered, nothing decided)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]) + int(counters["aot_autograd"]["autograd_cache_hit"])


@contextlib.contextmanager
def _torch_caches_bypassed() -> Iterator[None]:
    """Neither read nor write the FX graph and AOTAutograd caches (local or remote) inside the block."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
            functorch_config.patch(enable_autograd_cache=False, enable_remote_autograd_cache=False):
        yield


class _Planned(Exception):
    """Raised in place of a ``--plan-only`` compile's code generation: by then the scheduler has made its
    fusion decisions and lowering its algorithm selections, which is all prescreen decides at compile time.
    It carries the lowering's ShapeEnv, whose guards say which other sizes the same graph serves."""

    def __init__(self, shape_env: Any = None) -> None:
        super().__init__("planned")
        self.shape_env = shape_env


def _planned(exc: BaseException | None) -> _Planned | None:
    """``exc`` if it is ``_Planned``, however torch wrapped it (``inner_exception``, cause, context)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _Planned):
            return exc
        seen.add(id(exc))
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return None


def _stop_at_codegen(self: Any, *args: Any, **kwargs: Any) -> None:
    from torch._inductor.virtualized import V

    raise _Planned(getattr(V.graph.sizevars, "shape_env", None))


def _one_template_choice(original: Callable[..., Any], generated: dict[int, Any]) -> Callable[..., Any]:
    """``maybe_append_choice`` generating one template choice per selection (its ``layout``): a decision needs
    to know only that a template would compete with ATen, and generating every config's code is the bulk of a
    ``--plan-only`` lowering. A skipped one reads as a config that does not apply (``NotImplementedError``)."""

    def maybe_append_choice(self: Any, choices: list[Any], **kwargs: Any) -> Any:
        layout = kwargs.get("layout")
        if id(layout) in generated:
            return NotImplementedError("prescreen --plan-only: one template choice per selection")
        count = len(choices)
        result = original(self, choices, **kwargs)
        if layout is not None and len(choices) > count:
            generated[id(layout)] = layout  # kept alive: its id is not reused during the lowering
        return result

    return maybe_append_choice


def _planning_lowering() -> contextlib.AbstractContextManager[None]:
    """A ``--plan-only`` lowering: one template choice per selection, stopped where its kernels would be
    generated (most of a compile once nothing is benchmarked)."""
    from torch._inductor import select_algorithm
    from torch._inductor.codegen.common import KernelTemplate
    from torch._inductor.scheduler import Scheduler

    generated: dict[int, Any] = {}
    return _patched([(Scheduler, "codegen", _stop_at_codegen)] + [
        (cls, "maybe_append_choice", _one_template_choice(cls.__dict__["maybe_append_choice"], generated))
        for cls in (KernelTemplate, select_algorithm.TritonTemplate) if "maybe_append_choice" in cls.__dict__])


Signature = list[tuple[str, tuple[int, ...]]]


def _signature(model: Any, inputs: tuple[Any, ...]) -> Signature:
    """Dtype and sizes of every tensor a compile sees (``target.tensors_of``)."""
    return [(str(t.dtype), tuple(t.shape)) for t in targets.tensors_of(model, inputs)]


def _serves(shape_env: Any, compiled: Mapping[str, int], signature: Signature, target: Mapping[str, int],
            signature_at: Callable[..., Signature]) -> bool:
    """Whether the graph lowered at ``compiled`` is the one Dynamo would give ``target``: each moved size one
    unspecialized symbol in its range, every guard true at ``target``'s sizes, then (a model build, so last) the
    same tensors, each size equal or a named size moved to ``target``'s value."""
    moved = {v: int(target[n]) for n, v in compiled.items() if n in target and target[n] != v}
    if shape_env is None or len(set(compiled.values())) != len(compiled) or not _guards_hold(shape_env, moved):
        return False
    built = signature_at(dict(target))
    return len(signature) == len(built) and all(
        dtype == dtype_t and len(sizes) == len(sizes_t) and all(a == b or moved.get(a) == b for a, b in zip(sizes, sizes_t))
        for (dtype, sizes), (dtype_t, sizes_t) in zip(signature, built))


def _guards_hold(shape_env: Any, moved: Mapping[int, int]) -> bool:
    import sympy

    try:
        hints = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val  # torch >= 2.12 / 2.11
        values = {sym: sympy.sympify(v) for sym, v in hints.items()}  # float symbols too (``zf0``: eps, scale)
        for old, new in moved.items():
            symbols = [sym for sym, v in values.items() if v.is_Integer and v == old]
            low, high = families.symbol_range(shape_env, symbols[0]) if len(symbols) == 1 else (None, None)
            if len(symbols) != 1 or (low is not None and new < low) or (high is not None and new > high):
                return False
            values[symbols[0]] = sympy.Integer(new)
        return all(guard.expr.xreplace(values) is sympy.true for guard in shape_env.guards)
    except Exception:  # a guard this check cannot evaluate: the target is lowered itself
        return False


def _largest_first(grid: list[dict[str, int]]) -> list[dict[str, int]]:
    """``grid`` with its point of most elements first: Inductor guards a size only where it picks 32-bit
    indexing (``can_use_32bit_indexing``; 64-bit needs no guard), so the largest point's graph is the one most
    likely to serve every other family, and a ``--plan-only`` warm lowers the fewest graphs from it."""
    largest = max(reversed(grid), key=lambda p: math.prod(p.values()))
    return [largest, *(p for p in grid if p is not largest)]


def _compile_point(fn: Callable[..., Any], sizes: dict[str, int], device: str, mode: str,
                   plan_only: bool = False, also: list[dict[str, int]] | None = None) -> list[dict[str, int]]:
    """One fresh compile of the target at ``sizes`` (dynamo reset first, so nothing in memory answers); with
    ``plan_only`` it stops where its kernels would be generated (most of a compile once nothing is benchmarked)
    and decides for the sizes in ``also`` too: it returns those the same graph serves (``_serves``)."""
    import torch

    model, inputs = build(fn, sizes, device)
    signature_at = _signature_at(fn, device)
    signature = signature_at(sizes, (model, inputs)) if also else []
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=True, mode=mode)
    carried: list[dict[str, int]] = []
    try:
        with torch.no_grad(), families.naming(sizes, also if plan_only else None), \
                _planning_lowering() if plan_only else contextlib.nullcontext():
            try:
                compiled(*inputs)  # type: ignore[no-untyped-call]
            finally:
                carried = families.also_deciding()
    except Exception as exc:
        planned = _planned(exc) if plan_only else None
        if planned is None:
            raise
        return [t for t in carried if _serves(planned.shape_env, sizes, signature, t, signature_at)]
    return []


def _signature_at(fn: Callable[..., Any], device: str) -> Callable[..., Signature]:
    """The target's signature at some sizes, built on the meta device where it builds there (nothing allocated,
    no weights initialized), else on ``device`` (or taken from ``built``, a real build at those sizes)."""

    def at(sizes: dict[str, int], built: tuple[Any, tuple[Any, ...]] | None = None) -> Signature:
        try:
            return _signature(*targets.build_on_meta(fn, sizes))
        except Exception:  # a target that cannot build on the meta device is built for real
            return _signature(*(built or build(fn, sizes, device)))

    return at


def warm_model(
    target: str,
    shapes: tuple[ShapeRange, ...],
    store: Store,
    *,
    device: str = "cpu",
    device_memory: str | int | None = None,
    ratio: float | None = None,
    mode: str = "max-autotune",
    points: int | None = None,
    dry_run: bool = False,
    inductor_config: Mapping[str, Any] | None = None,
    verbose: bool = False,
    progress: Progress | None = None,
    plan_only: bool = False,
    artifact: str | None = None,
) -> WarmReport:
    """Compile ``target`` once per shape point (fresh each time) with the hooks on (docs/torch-caches.md).

    torch's caches keep their defaults (the warm fills them for deployment); a compile they answered decided
    nothing, so it is lowered again with them bypassed. ``plan_only`` benchmarks nothing and stops before code
    generation (runtime autotuning, decided at a kernel's first call, is not covered); ``artifact`` writes
    torch's mega-cache and these decisions to one file. A failing target or compile is a ``ConfigError`` naming
    the sizes and the cause.
    """
    from torch._inductor import config as inductor_settings

    from prescreen.hooks import activation, state

    resolve_ratio(ratio)  # a bad ratio is an error before any compile
    check_device(device)
    if artifact is not None:
        if dry_run:
            raise ConfigError("--artifact needs the decisions stored: it does not go with --dry-run")
        if plan_only:
            raise ConfigError("--artifact holds the compiles' torch caches, and --plan-only keeps none")
        prescreen_artifact.check_writable(artifact)
    fn = load_target(target)
    grid = select_points(shapes, points)
    check_fits(fn, grid, device)  # a range too large for the device is refused before anything is built
    report = WarmReport(dry_run=dry_run, store=store.location, plan_only=plan_only,
                        families=families_covered(grid) if shapes else 0)
    settings = {**(inductor_config or {}), **({"force_disable_caches": True} if plan_only else {})}
    sizes: dict[str, int] = {}  # the point being compiled
    selections_only = [True]  # whether this lowering decided selections alone (the plans retargeting carries)

    def observe(outcome: Outcome, plan: KernelPlan) -> None:
        report.records.append(_record(outcome, plan, families.current_point()))
        selections_only[0] &= plan.kernel_name.startswith("select:")

    start = time.perf_counter()
    was_active = activation.is_installed()
    activation.install(store=ReadOnlyStore(store) if dry_run else store, device_memory=device_memory, ratio=ratio)
    OBSERVERS.append(observe)
    try:
        with inductor_settings.patch(settings), warnings.catch_warnings(), state.planning(plan_only), \
                contextlib.nullcontext() if verbose else _decision_lines_held(), \
                _autotune_output_held(settings, verbose):
            if not verbose:
                warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
            left = _largest_first(grid) if plan_only else list(grid)
            while left:
                sizes = left.pop(0)
                if progress:
                    progress(len(grid) - len(left) - 1, len(grid), sizes)
                seen, hits = len(report.records), _cache_hits()
                selections_only[0] = True
                served: list[dict[str, int]] = []
                try:
                    served = _compile_point(fn, sizes, device, mode, plan_only, left)
                except Exception as exc:
                    if _cache_hits() == hits:
                        raise
                    # A graph torch's caches gave for other sizes failed at these: lowered again below.
                    logging.getLogger("prescreen").warning(
                        "prescreen: torch's FX graph cache answered the compile at %s with a graph that failed "
                        "(%s); compiling it again without the cache", sizes, str(exc).splitlines()[0][:200])
                report.compiles += 1
                if _cache_hits() > hits:  # torch's caches answered: lower again, to decide this family
                    report.cache_answered += 1
                    with _torch_caches_bypassed():
                        _compile_point(fn, sizes, device, mode)
                served = served if selections_only[0] else []
                decided_for = [sizes, *served]  # a dropped target's records go: it gets its own lowering
                report.records[seen:] = [r for r in report.records[seen:] if r.sizes in decided_for]
                report.decided_families += sum(any(r.sizes == p for r in report.records[seen:]) for p in decided_for)
                report.carried += len(served)
                left = [t for t in left if t not in served]
    except ConfigError:
        raise
    except Exception as exc:
        at = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "its example inputs"
        raise ConfigError(f"compiling {target} at {at} failed: {type(exc).__name__}: {first_line(exc)}") from None
    finally:
        OBSERVERS.remove(observe)
        state.reset()
        if not was_active:
            activation.uninstall()
    report.seconds = time.perf_counter() - start
    if report.compiles and not report.records:
        report.hints = why_nothing_was_guarded(device, mode, settings)
    if artifact is not None:
        import torch

        saved = torch.compiler.save_cache_artifacts()  # every compile of this process so far
        report.artifact = prescreen_artifact.save(artifact, store, [r.key for r in report.records],
                                                  saved[0] if saved else None)
    return report


def load_plans(path: str | Path) -> list[KernelPlan]:
    """Plans from a JSON list of payloads, ``{"plans": [...]}``, or an export bundle."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read plans {str(p)!r}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"plans file {str(p)!r} is not JSON: {exc}") from None
    if isinstance(data, Mapping):
        if "plans" in data:
            data = data["plans"]
        elif "entries" in data:
            data = [e.get("plan") if isinstance(e, Mapping) else e for e in data["entries"]]
            # A bundle entry keeps its plan as one JSON string field (its plan line in the store).
            try:
                data = [json.loads(plan) if isinstance(plan, str) else plan for plan in data]
            except ValueError as exc:
                raise ConfigError(f"plans file {str(p)!r} holds a stored plan that is not JSON: {exc}") from None
    if not isinstance(data, list):
        raise ConfigError(f"plans file {str(p)!r} must hold a list of plan payloads")
    plans = []
    for i, payload in enumerate(data):
        try:
            plans.append(KernelPlan.from_payload(payload))
        except NotBounded as exc:
            raise ConfigError(f"plans file {str(p)!r}: plan #{i} is invalid: {exc}") from None
    return plans


def warm_plans(plans: list[KernelPlan], store: Store, budget: Budget, *, dry_run: bool = False,
               progress: Progress | None = None) -> WarmReport:
    """Decide exported plans directly, without a model."""
    report = WarmReport(dry_run=dry_run, store=store.location)
    start = time.perf_counter()
    for i, plan in enumerate(plans):
        if progress:
            progress(i, len(plans), {})
        report.records.append(_record(lookup_or_decide(plan, budget, store, write=not dry_run), plan, {}))
    report.seconds = time.perf_counter() - start
    return report
