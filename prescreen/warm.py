"""``prescreen warm``: compile a model over its shape families with the hooks on, or decide plans directly."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prescreen import families
from prescreen.budget import Budget, resolve_ratio
from prescreen.errors import ConfigError, NotBounded
from prescreen.expr import Const
from prescreen.plan import KernelPlan
from prescreen.service import OBSERVERS, Outcome, lookup_or_decide
from prescreen.store.base import Store, StoreStats
from prescreen.store.entry import Entry
from prescreen.target import ShapeRange, build, check_device, load_target, shape_points


class ReadOnlyStore(Store):
    """Reads through to another store and never writes (``--dry-run``)."""

    backend = "dry-run"

    def __init__(self, inner: Store) -> None:
        super().__init__()
        self.inner = inner
        self.location = inner.location

    def get(self, key: str) -> Entry | None:
        return self.inner.get(key)

    def lookup(self, key: str) -> Entry | None:
        return self.inner.lookup(key)

    def put(self, entry: Entry) -> bool:
        return False

    def entries(self) -> Iterator[Entry]:
        return self.inner.entries()

    def delete(self, keys: list[str]) -> int:
        return 0

    def stats(self) -> StoreStats:
        return self.inner.stats()


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
    #: Why nothing was guarded, and what to change, when a compile saw no autotuned kernel.
    hints: list[str] = dataclasses.field(default_factory=list)

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
        return {
            "kernels": self.kernels,
            "decisions_made": len(self.unique()),
            "lookups": len(self.records),
            "tuned": self.tuned,
            "fell_back": self.fell_back,
            "not_bounded": self.not_bounded,
            "largest_estimated_bytes": self.largest,
            "compiles": self.compiles,
            "families": self.families,
            "seconds": round(self.seconds, 3),
            "dry_run": self.dry_run,
            "store": self.store,
            "hints": list(self.hints),
            "decisions": [dataclasses.asdict(r) for r in self.unique()],
        }


def kernel_site(plan: KernelPlan) -> str:
    """A short digest of the kernel with its dynamic sizes left out: name, and each arg's name, dtype and
    static dims (a dynamic dim is ``?``).

    Compiling one model at several sizes gives one decision per kernel and shape family; this
    is what says they are the same kernel, so ``warm`` counts kernels as kernels.
    """
    args = [(a.name, getattr(a, "dtype", ""), [e.value if isinstance(e, Const) else "?" for e in getattr(a, "size", ())])
            for a in plan.args]
    return hashlib.sha256(json.dumps([plan.display_name, args]).encode()).hexdigest()[:16]


def _observer(report: WarmReport, sizes: Mapping[str, int]) -> Callable[[Outcome, KernelPlan], None]:
    def observe(outcome: Outcome, plan: KernelPlan) -> None:
        d = outcome.decision
        report.records.append(
            Record(outcome.key, plan.display_name, dict(sizes), d.action, d.bounded, d.estimated_bytes,
                   d.budget_bytes, outcome.hit, d.reason, kernel_site(plan),
                   ", ".join(text for _, text in plan.axis_labels))
        )

    return observe


def select_points(shapes: tuple[ShapeRange, ...], points: int | None = None) -> list[dict[str, int]]:
    """The sizes ``warm`` compiles at, every combination over the shapes (one ``{}`` without shapes).

    By default one size per shape family (bucket, ``prescreen.families``) a range reaches
    (``families.point_of``), so the compiles cover every size in it. ``points`` instead spreads
    that many sizes geometrically over each range (also what ``$PRESCREEN_SHAPE_BUCKETS=exact``
    gets, 2 per range, since every size is its own family then). A bad scheme is a ConfigError.
    """
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


#: Inductor settings that print autotune tables on stderr; ``warm`` sets them quiet unless ``verbose``.
QUIET_AUTOTUNE: dict[str, Any] = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


def _settings(inductor_config: Mapping[str, Any] | None, verbose: bool) -> dict[str, Any]:
    """The Inductor config patch for the compiles: quiet autotuning unless verbose; the caller's settings win."""
    from torch._inductor import config

    quiet = {k: v for k, v in QUIET_AUTOTUNE.items() if not verbose and hasattr(config, k)}
    return {**quiet, **dict(inductor_config or {})}


class _DecisionLines(logging.Filter):
    """Drops the hooks' per-decision diagnostics (``state.log_once``): warm's table shows each decision."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.funcName != "log_once"


@contextlib.contextmanager
def _decision_lines_held(hold: bool) -> Iterator[None]:
    if not hold:
        yield
        return
    hooks_log, drop = logging.getLogger("prescreen.hooks"), _DecisionLines()
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
    progress: Callable[[int, int, dict[str, int]], None] | None = None,
) -> WarmReport:
    """Compile ``target`` once per shape point (fresh each time) with the hooks on.

    A target that raises, or a compile that fails, is a ``ConfigError`` naming the sizes and the cause.
    """
    import torch
    from torch._inductor import config as inductor_settings

    from prescreen.hooks import activation, state

    resolve_ratio(ratio)  # a bad ratio is an error before any compile
    check_device(device)
    fn = load_target(target)
    used = ReadOnlyStore(store) if dry_run else store
    report = WarmReport(dry_run=dry_run, store=store.location)
    grid = select_points(shapes, points)
    report.families = families_covered(grid) if shapes else 0
    settings = _settings(inductor_config, verbose)
    start = time.perf_counter()
    was_active = activation.is_installed()
    activation.install(store=used, device_memory=device_memory, ratio=ratio)
    try:
        with inductor_settings.patch(settings), warnings.catch_warnings(), _decision_lines_held(not verbose):
            if not verbose:
                warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
            for i, sizes in enumerate(grid):
                if progress:
                    progress(i, len(grid), sizes)
                model, inputs = build(fn, sizes, device)
                observer = _observer(report, sizes)
                OBSERVERS.append(observer)
                try:
                    torch._dynamo.reset()
                    compiled = torch.compile(model, dynamic=True, mode=mode)
                    with torch.no_grad(), families.naming(sizes):
                        compiled(*inputs)  # type: ignore[no-untyped-call]
                    report.compiles += 1
                except ConfigError:
                    raise
                except Exception as exc:
                    at = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "its example inputs"
                    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                    raise ConfigError(f"compiling {target} at {at} failed: {type(exc).__name__}: "
                                      f"{lines[0] if lines else '(no message)'}") from None
                finally:
                    OBSERVERS.remove(observer)
        if progress:
            progress(len(grid), len(grid), {})
    finally:
        state.reset()
        if not was_active:
            activation.uninstall()
    report.seconds = time.perf_counter() - start
    if report.compiles and not report.records:
        report.hints = why_nothing_was_guarded(device, mode, settings)
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


def warm_plans(
    plans: list[KernelPlan], store: Store, budget: Budget, *, dry_run: bool = False,
    progress: Callable[[int, int, dict[str, int]], None] | None = None,
) -> WarmReport:
    """Decide exported plans directly, without a model."""
    used = ReadOnlyStore(store) if dry_run else store
    report = WarmReport(dry_run=dry_run, store=store.location)
    start = time.perf_counter()
    observer = _observer(report, {})
    OBSERVERS.append(observer)
    try:
        for i, plan in enumerate(plans):
            if progress:
                progress(i, len(plans), {})
            lookup_or_decide(plan, budget, used)
        if progress:
            progress(len(plans), len(plans), {})
    finally:
        OBSERVERS.remove(observer)
    report.seconds = time.perf_counter() - start
    return report
