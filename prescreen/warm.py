"""``prescreen warm``: compile a model over its shape families with the hooks on, or decide plans directly."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prescreen.budget import Budget, resolve_ratio
from prescreen.errors import ConfigError, NotBounded
from prescreen.plan import KernelPlan
from prescreen.service import OBSERVERS, Outcome, lookup_or_decide
from prescreen.store.base import Store, StoreStats
from prescreen.store.entry import Entry
from prescreen.target import ShapeRange, build, load_target, shape_points


class ReadOnlyStore(Store):
    """Reads through to another store and never writes (``--dry-run``)."""

    backend = "dry-run"

    def __init__(self, inner: Store) -> None:
        super().__init__()
        self.inner = inner
        self.location = inner.location

    def get(self, key: str) -> Entry | None:
        return self.inner.get(key)

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


@dataclasses.dataclass
class WarmReport:
    """What ``warm`` prints: per-decision records and totals."""

    records: list[Record] = dataclasses.field(default_factory=list)
    compiles: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    store: str = ""

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
            "kernels_seen": len(self.unique()),
            "lookups": len(self.records),
            "tuned": self.tuned,
            "fell_back": self.fell_back,
            "not_bounded": self.not_bounded,
            "largest_estimated_bytes": self.largest,
            "compiles": self.compiles,
            "seconds": round(self.seconds, 3),
            "dry_run": self.dry_run,
            "store": self.store,
            "decisions": [dataclasses.asdict(r) for r in self.unique()],
        }


def _observer(report: WarmReport, sizes: Mapping[str, int]) -> Callable[[Outcome, KernelPlan], None]:
    def observe(outcome: Outcome, plan: KernelPlan) -> None:
        d = outcome.decision
        report.records.append(
            Record(outcome.key, plan.display_name, dict(sizes), d.action, d.bounded, d.estimated_bytes,
                   d.budget_bytes, outcome.hit, d.reason)
        )

    return observe


def warm_model(
    target: str,
    shapes: tuple[ShapeRange, ...],
    store: Store,
    *,
    device: str = "cpu",
    device_memory: str | int | None = None,
    ratio: float | None = None,
    mode: str = "max-autotune",
    points: int = 2,
    dry_run: bool = False,
    inductor_config: Mapping[str, Any] | None = None,
    progress: Callable[[int, int, dict[str, int]], None] | None = None,
) -> WarmReport:
    """Compile ``target`` once per shape point (fresh each time) with the hooks on."""
    import torch
    from torch._inductor import config as inductor_settings

    from prescreen.hooks import activation, state

    fn = load_target(target)
    resolve_ratio(ratio)  # a bad ratio is an error before any compile
    used = ReadOnlyStore(store) if dry_run else store
    report = WarmReport(dry_run=dry_run, store=store.location)
    grid = list(shape_points(shapes, points)) if shapes else [{}]
    start = time.perf_counter()
    was_active = activation.is_installed()
    activation.install(store=used, device_memory=device_memory, ratio=ratio)
    try:
        with inductor_settings.patch(dict(inductor_config or {})):
            for i, sizes in enumerate(grid):
                if progress:
                    progress(i, len(grid), sizes)
                model, inputs = build(fn, sizes, device)
                observer = _observer(report, sizes)
                OBSERVERS.append(observer)
                try:
                    torch._dynamo.reset()
                    compiled = torch.compile(model, dynamic=True, mode=mode)
                    with torch.no_grad():
                        compiled(*inputs)
                    report.compiles += 1
                finally:
                    OBSERVERS.remove(observer)
        if progress:
            progress(len(grid), len(grid), {})
    finally:
        state.reset()
        if not was_active:
            activation.uninstall()
    report.seconds = time.perf_counter() - start
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
