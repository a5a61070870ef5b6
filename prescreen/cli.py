"""The ``prescreen`` command: warm, inspect, clear, stats, export, import."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from prescreen.budget import Budget, format_bytes, parse_memory, resolve_ratio
from prescreen.errors import ConfigError
from prescreen.store.base import Store
from prescreen.store.entry import Entry


def _width(stream: Any) -> int | None:
    """Piped output (logs, CI, ``| less``) gets 160 columns instead of rich's 80, unless $COLUMNS says."""
    return None if stream.isatty() or os.environ.get("COLUMNS") else 160


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))


def fail(message: str) -> NoReturn:
    """One clear line on stderr, exit code 2, no traceback."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    sys.exit(2)


class Ctx:
    def __init__(self, cache_dir: str | None, redis_url: str | None) -> None:
        self.cache_dir, self.redis_url = cache_dir, redis_url
        self._store: Store | None = None

    def store(self, writable: bool = True) -> Store:
        """Open the configured store, or exit 2 naming why it is unreachable.

        Reading commands accept a read-only store (a cache baked into an image).
        """
        if self._store is None:
            from prescreen.store import open_store

            # Hold back the store's fault warnings while opening it: an unusable store is one
            # error line naming the fault, not a warning line and then the error.
            faults = _Faults()
            with faults:
                try:
                    store = open_store(cache_dir=self.cache_dir, redis_url=self.redis_url)
                except ConfigError as exc:
                    fail(str(exc))
                health = store.stats()
            readable = health.entries > 0 or "read-only" in (health.detail or "")
            if not health.healthy and (writable or not readable):
                why = faults.first() or health.detail or "not usable"
                fail(f"store unreachable: {health.backend} at {health.location}: {why}")
            faults.replay()
            self._store = store
        return self._store


class _Faults(logging.Handler):
    """Collects ``prescreen.store`` warnings for as long as it is entered."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self._log = logging.getLogger("prescreen.store")
        self._propagate = True

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> _Faults:
        self._propagate, self._log.propagate = self._log.propagate, False
        self._log.addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._log.removeHandler(self)
        self._log.propagate = self._propagate

    def first(self) -> str | None:
        """The first fault as ``what (cause)``, without the logger's store prefix."""
        if not self.records:
            return None
        r = self.records[0]
        if isinstance(r.args, tuple) and len(r.args) == 4:  # Store.warn_once: backend, location, what, exc
            return f"{r.args[2]} ({r.args[3]})"
        return r.getMessage()

    def replay(self) -> None:
        for r in self.records:
            self._log.handle(r)


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ConfigError as exc:
        fail(str(exc))


@click.group()
@click.option("--cache-dir", envvar="PRESCREEN_CACHE_DIR", help="diskcache directory [env PRESCREEN_CACHE_DIR].")
@click.option("--redis-url", envvar="PRESCREEN_REDIS_URL", help="Fleet store, e.g. redis://127.0.0.1:6379/0.")
@click.version_option(package_name="prescreen")
@click.pass_context
def cli(ctx: click.Context, cache_dir: str | None, redis_url: str | None) -> None:
    """Pre-screen torch.compile autotune benchmarks against device memory, once per shape family."""
    global console, err_console
    console, err_console = Console(width=_width(sys.stdout)), Console(stderr=True, width=_width(sys.stderr))
    ctx.obj = Ctx(cache_dir, redis_url)


def _memory(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_memory(value)
    except ConfigError as exc:
        fail(f"--device-memory: {exc}")


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=True)


def _summary(report: Any) -> Table:
    table = Table(title="prescreen warm" + (" (dry run: nothing stored)" if report.dry_run else ""))
    for col in ("kernels seen", "tuned", "fell back", "not bounded", "largest estimate", "compiles", "time"):
        table.add_column(col, justify="right")
    table.add_row(str(len(report.unique())), str(report.tuned), str(report.fell_back), str(report.not_bounded),
                  format_bytes(report.largest), str(report.compiles), f"{report.seconds:.1f}s")
    return table


def _decisions(report: Any) -> Table:
    table = Table(title="decisions")
    for col in ("key", "kernel", "sizes", "decision", "estimated", "budget", "source"):
        table.add_column(col)
    for r in report.unique():
        sizes = ",".join(f"{k}={v}" for k, v in r.sizes.items()) or "-"
        table.add_row(r.key[:12], r.kernel, sizes, r.action if r.bounded else "fallback (not bounded)",
                      format_bytes(r.estimated_bytes), format_bytes(r.budget_bytes), "hit" if r.hit else "computed")
    return table


@cli.command()
@click.argument("target", required=False)
@click.option("--shape", "shapes", multiple=True, metavar="NAME=MIN..MAX", help="A dynamic size and its range.")
@click.option("--spec", type=click.Path(dir_okay=False), help="TOML/JSON spec: target, shapes, device_memory, ratio.")
@click.option("--plans", type=click.Path(dir_okay=False), help="Decide exported plan payloads; no model needed.")
@click.option("--device-memory", callback=_memory, help="Plan for this much device memory, e.g. 64GiB.")
@click.option("--ratio", type=str, help="Benchmark budget as a fraction of device memory, in (0, 1].")
@click.option("--device", default="cpu", show_default=True, help="Device the target builds its model on.")
@click.option("--device-kind", default=None, help="Device kind the --plans decisions are for (npu, cuda, cpu).")
@click.option("--mode", default="max-autotune", show_default=True, help="torch.compile mode.")
@click.option("--points", default=2, show_default=True, type=click.IntRange(1, 16), help="Sizes compiled per family.")
@click.option("--inductor-config", "inductor_config", multiple=True, metavar="KEY=VALUE",
              help="torch._inductor.config setting for the compiles, e.g. freezing=True.")
@click.option("--dry-run", is_flag=True, help="Estimate and report without storing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def warm(obj: Ctx, target: str | None, shapes: tuple[str, ...], spec: str | None, plans: str | None,
         device_memory: int | None, ratio: str | None, device: str, device_kind: str | None, mode: str,
         points: int, inductor_config: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Compile TARGET (module:callable or file.py:callable) over shape families and fill the store."""
    from prescreen.target import load_spec, parse_inductor_config, parse_shape
    from prescreen.warm import load_plans, warm_model, warm_plans

    settings: dict[str, Any] = _run(lambda: load_spec(spec)) if spec else {}
    target = target or settings.get("target")
    families = tuple(_run(lambda: [parse_shape(s) for s in shapes])) or settings.get("shapes", ())
    if device_memory is None and settings.get("device_memory") is not None:
        device_memory = _run(lambda: parse_memory(settings["device_memory"]))
    overrides = _run(lambda: parse_inductor_config(list(inductor_config) + list(settings.get("inductor_config", []))))
    ratio_value = _run(lambda: resolve_ratio(ratio if ratio is not None else settings.get("ratio")))
    store = obj.store()
    with _progress() as progress:
        task = progress.add_task("warming", total=None)

        def tick(done: int, total: int, sizes: dict[str, int]) -> None:
            label = ", ".join(f"{k}={v}" for k, v in sizes.items())
            progress.update(task, completed=done, total=total, description=f"warming {label}".strip())

        if plans:
            loaded = _run(lambda: load_plans(plans))
            if device_memory is None:
                fail("--plans needs --device-memory (the fleet's device memory, e.g. 64GiB)")
            budget = Budget(device_kind or "npu", device_memory, ratio_value)
            report = warm_plans(loaded, store, budget, dry_run=dry_run, progress=tick)
        else:
            if not target:
                fail("missing TARGET (module:callable or file.py:callable), --spec or --plans")
            report = _run(lambda: warm_model(
                target, families, store, device=device, device_memory=device_memory, ratio=ratio_value,
                mode=settings.get("mode", mode), points=int(settings.get("points", points)), dry_run=dry_run, inductor_config=overrides,
                progress=tick))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    console.print(_summary(report))
    console.print(_decisions(report))


def _age(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _family(e: Entry) -> str:
    plan = e.plan
    statics = plan.get("axis_static_values") or []
    features = plan.get("group_features") or []
    if features:
        groups = (e.family or {}).get("group_count", "?")
        return f"{len(features)} features, {groups} groups"
    return ",".join(f"{n}={v}" for n, v in statics) or "static"


def _why(d: Any) -> str:
    """The reason in a few words (``inspect KEY`` prints it whole)."""
    if not d.bounded:
        return "not bounded: " + d.reason.rsplit(": ", 2)[-2] if d.reason.count(": ") >= 2 else "not bounded"
    return "fits budget" if d.tune else "over budget"


def _filtered(store: Store, decision: str | None, device: str | None, kernel: str | None) -> Iterator[Entry]:
    for e in store.entries():
        if decision and e.decision.action != decision:
            continue
        if device and e.parts.device_kind != device:
            continue
        if kernel and kernel not in e.kernel:
            continue
        yield e


def _one(store: Store, key: str) -> Entry:
    matches = [e for e in store.entries() if e.key.startswith(key.lower())]
    if not matches:
        fail(f"no entry with key {key!r}")
    if len(matches) > 1:
        fail(f"key prefix {key!r} matches {len(matches)} entries; give more characters")
    return matches[0]


@cli.command()
@click.argument("key", required=False)
@click.option("--decision", type=click.Choice(["tune", "fallback"]), help="Only this decision.")
@click.option("--device", help="Only this device kind (cuda, npu, cpu).")
@click.option("--kernel", help="Only kernels whose name contains this.")
@click.option("--verify", is_flag=True, help="Recompute each shown decision and compare it with the stored one.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def inspect(obj: Ctx, key: str | None, decision: str | None, device: str | None, kernel: str | None,
            verify: bool, as_json: bool) -> None:
    """List stored decisions, or show the entry KEY (a prefix is enough) in full."""
    from prescreen.store.verify import verify_entry

    store = obj.store(writable=False)
    if verify:
        shown = [_one(store, key)] if key else list(_filtered(store, decision, device, kernel))
        stale = [e for e in shown if not verify_entry(e)]
        for e in stale:
            err_console.print(f"[bold red]mismatch:[/] {e.key[:12]} {e.kernel}: stored decision differs from a "
                              "fresh computation", highlight=False)
        console.print(f"verified {len(shown)} entries: {len(shown) - len(stale)} identical to a fresh computation")
        if stale:
            sys.exit(1)
        return
    if key:
        entry = _one(store, key)
        if as_json:
            click.echo(json.dumps(entry.to_payload(), indent=2))
            return
        d = entry.decision
        table = Table(title=f"entry {entry.key}", show_header=False)
        table.add_column("field", style="bold")
        table.add_column("value", overflow="fold")
        rows = [
            ("kernel", entry.kernel), ("decision", d.action), ("bounded", str(d.bounded)),
            ("enable_auto_blockify", str(d.enable_auto_blockify)),
            ("estimated", f"{format_bytes(d.estimated_bytes)} ({d.estimated_bytes} B)"),
            ("synthetic / mutated clone", f"{d.synthetic_bytes} / {d.mutated_clone_bytes} B"),
            ("budget", f"{format_bytes(d.budget_bytes)} = {format_bytes(d.total_memory)} x {d.ratio}"),
            ("reason", d.reason), ("largest group", str(d.largest_group_id)),
            ("dominant arg", json.dumps(d.dominant_arg.to_payload()) if d.dominant_arg else "none"),
            ("per-group bytes", ", ".join(f"{g}: {format_bytes(b)}" for g, b in d.group_bytes) or "-"),
            ("shape family", _family(entry)),
            ("created", f"{_age(entry.created_at)} by {entry.host} pid {entry.pid}"), ("hits", str(entry.hits)),
        ]
        rows += [(f"key.{k}", json.dumps(v) if not isinstance(v, str) else v) for k, v in entry.parts.to_payload().items()]
        for field, value in rows:
            table.add_row(field, value)
        console.print(table)
        return
    entries = sorted(_filtered(store, decision, device, kernel), key=lambda e: e.created_at)
    if as_json:
        click.echo(json.dumps([e.to_payload() for e in entries], indent=2))
        return
    table = Table(title=f"{len(entries)} decisions in {store.backend} store {store.location}")
    for col in ("key", "kernel", "shape family", "device", "ratio", "decision", "estimated", "budget", "why",
                "created", "hits"):
        table.add_column(col, overflow="fold")
    for e in entries:
        d = e.decision
        table.add_row(e.key[:12], e.kernel, _family(e), f"{e.parts.device_kind} {format_bytes(e.parts.total_memory)}",
                      f"{e.parts.ratio:g}", d.action if d.bounded else "fallback*", format_bytes(d.estimated_bytes),
                      format_bytes(d.budget_bytes), _why(d), _age(e.created_at), str(e.hits))
    console.print(table)
    if any(not e.decision.bounded for e in entries):
        console.print("* not bounded: the footprint could not be estimated, so the benchmark is skipped (fail closed)")


@cli.command()
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
@click.option("--key", help="Remove the entries whose key starts with this.")
@click.option("--kernel", help="Remove entries whose kernel name contains this.")
@click.option("--device", help="Remove entries for this device kind.")
@click.option("--older-than", help="Remove entries older than this, e.g. 7d, 12h, 30m.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def clear(obj: Ctx, everything: bool, key: str | None, kernel: str | None, device: str | None,
          older_than: str | None, yes: bool) -> None:
    """Remove stored decisions: all, or by key prefix, kernel, device or age."""
    from prescreen.store.clear import build_predicate

    predicate = _run(lambda: build_predicate(everything=everything, key_prefix=key, kernel=kernel, device=device,
                                             older_than=older_than))
    store = obj.store()
    doomed = [e for e in store.entries() if predicate(e)]
    if not doomed:
        console.print("nothing to remove")
        return
    if not yes and not click.confirm(f"Remove {len(doomed)} entries from {store.location}?", default=False):
        console.print("aborted; nothing removed")
        return
    removed = store.clear_all() if everything else store.delete([e.key for e in doomed])
    for e in doomed:
        console.print(f"removed {e.key[:12]} {e.kernel} ({e.decision.action})", highlight=False)
    console.print(f"{removed} entries removed")


@cli.command()
@click.pass_obj
def stats(obj: Ctx) -> None:
    """Entries, size on disk, hit rate, location and backend of the store."""
    store = obj.store(writable=False)
    s = store.stats()
    stored_hits = sum(e.hits for e in store.entries())
    lookups = stored_hits + s.entries  # every entry was computed once (a miss), then reused stored_hits times
    table = Table(show_header=False, title="prescreen store")
    for field, value in (
        ("backend", s.backend), ("location", s.location), ("entries", str(s.entries)),
        ("size", format_bytes(s.size_bytes)),
        ("hits", str(stored_hits)),
        ("hit rate", f"{stored_hits / lookups:.1%} (hits / (hits + entries computed))" if lookups else "-"),
        ("healthy", str(s.healthy)), ("detail", s.detail or "-"),
    ):
        table.add_row(field, value)
    console.print(table)


@cli.command("export")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def export_cmd(obj: Ctx, path: str) -> None:
    """Write every stored decision to a versioned JSON bundle."""
    from prescreen.store.bundle import export_bundle

    count = _run(lambda: export_bundle(obj.store(writable=False), path))
    console.print(f"exported {count} entries to {path}")


@cli.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def import_cmd(obj: Ctx, path: str) -> None:
    """Load a bundle made by ``prescreen export`` (validated; another schema is refused)."""
    from prescreen.store.bundle import import_bundle

    imported, skipped = _run(lambda: import_bundle(obj.store(), path))
    console.print(f"imported {imported} entries from {path} ({skipped} already present or skipped)")


def main() -> None:
    """Console-script entry point: click errors exit 2, config errors print one line."""
    try:
        cli.main(standalone_mode=True)
    except ConfigError as exc:  # pragma: no cover - every command routes through fail()
        fail(str(exc))
