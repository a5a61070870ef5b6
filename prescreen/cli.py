"""The prescreen command: warm, inspect, report, clear, stats, export, import, load.

Only ``warm`` of a model and ``load`` of an artifact import torch; the other commands, ``--help`` and every
argument error cost the standard library, click and the store. Bad input is one
``error:`` line on stderr and exit status 2, click's usage errors included.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from prescreen.budget import format_bytes, parse_memory
from prescreen.display import markup, visible
from prescreen.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table

    from prescreen.decision import Decision
    from prescreen.store.base import Store
    from prescreen.store.clear import Predicate
    from prescreen.store.entry import Entry
    from prescreen.target import ShapeRange, Spec
    from prescreen.warm import WarmReport

T = TypeVar("T")

#: Below this many columns (an 80- or 100-column terminal) tables drop columns and shorten keys.
COMPACT_BELOW = 130
#: Key characters shown in tables (a prefix this long is unambiguous in any real store).
KEY_CHARS, COMPACT_KEY_CHARS = 12, 8


def _width(stream: Any) -> int | None:
    """Piped output (logs, CI, ``| less``) gets 160 columns instead of rich's 80, unless $COLUMNS says."""
    isatty = getattr(stream, "isatty", None)
    return None if (isatty is not None and isatty()) or os.environ.get("COLUMNS") else 160


def out() -> Console:
    """A console on the current stdout (click's test runner swaps it per invocation)."""
    from rich.console import Console

    return Console(width=_width(sys.stdout))


def err() -> Console:
    from rich.console import Console

    return Console(stderr=True, width=_width(sys.stderr))


def compact() -> bool:
    return out().width < COMPACT_BELOW


def fail(message: str) -> NoReturn:
    """One clear line on stderr, exit code 2, no traceback (control characters shown as escapes)."""
    line = visible(" ".join(message.split()))
    click.echo(f"{click.style('error:', fg='red', bold=True)} {line}", err=True)
    sys.exit(2)


def _usage_line(exc: click.ClickException) -> str:
    """Click's usage error as one line in prescreen's wording, with where to find help."""
    text = " ".join(exc.format_message().split()).rstrip(".")
    bad_value = re.match(r"^Invalid value for '([^']+)': (.*)$", text)
    if bad_value:
        rest = bad_value.group(2)
        text = f"{bad_value.group(1)}: {rest[:1].lower()}{rest[1:]}"
    else:
        text = re.sub(r"^Missing (argument|option) '([^']+)'", r"missing \1 \2", text)
        text = text[:1].lower() + text[1:]
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        text += f" (see '{ctx.command_path} --help')"
    return text


class _VisibleStderr(logging.Handler):
    """prescreen's warnings on the current stderr, as logging's last resort would print them (the message alone),
    but with control characters shown as escapes: a warning can hold a path or a value from the store."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(visible(self.format(record)) + "\n")  # the stream of now (click's runner swaps it)
        except Exception:  # pragma: no cover - as logging's own handlers do
            self.handleError(record)


def _visible_warnings() -> None:
    log = logging.getLogger("prescreen")
    if not any(isinstance(h, _VisibleStderr) for h in log.handlers):
        log.addHandler(_VisibleStderr())


class PrescreenGroup(click.Group):
    """A group whose usage errors read like prescreen's own: one ``error:`` line, exit 2."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        standalone = standalone_mode
        _visible_warnings()
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help())
            rv = 0
        except click.ClickException as exc:
            fail(_usage_line(exc))
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        if not standalone:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


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
            click.get_current_context().call_on_close(store.close)  # writes the batched hit counts
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


def _run(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ConfigError as exc:
        fail(str(exc))


_REDIS_SCHEMES = ("redis", "rediss", "unix")


def _check_redis_url(url: str, source: str) -> None:
    """A URL redis-py can open, else one error naming ``source`` (the option or the variable it came from)."""
    from urllib.parse import urlsplit

    try:
        scheme = urlsplit(url).scheme if "://" in url else ""
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket: redis://:pw@[::1/0
        scheme, why = None, f"is not a valid URL ({exc})"
    else:
        why = ("is not a Redis URL (expected redis://HOST:PORT/DB, rediss://... or unix:///path/to/socket)")
    if scheme not in _REDIS_SCHEMES:
        from prescreen.store.redis_store import redact_url

        fail(f"{source} {redact_url(url)!r} {why}")


@click.group(cls=PrescreenGroup, context_settings={"max_content_width": 120, "help_option_names": ["-h", "--help"]})
@click.option("--cache-dir", envvar="PRESCREEN_CACHE_DIR", metavar="DIR",
              help="The diskcache directory of the store [env PRESCREEN_CACHE_DIR].")
@click.option("--redis-url", envvar="PRESCREEN_REDIS_URL", metavar="URL",
              help="A fleet store behind the local one, e.g. redis://127.0.0.1:6379/0 [env PRESCREEN_REDIS_URL].")
@click.version_option(package_name="prescreen")
@click.pass_context
def cli(ctx: click.Context, cache_dir: str | None, redis_url: str | None) -> None:
    """Pre-screen torch.compile autotune benchmarks against device memory, once per shape family."""
    if cache_dir is not None and not cache_dir.strip():  # not the current directory by accident
        given = ctx.get_parameter_source("cache_dir") == click.core.ParameterSource.COMMANDLINE
        fail(f"{'--cache-dir' if given else 'PRESCREEN_CACHE_DIR'} is empty (give a directory, or leave it out for "
             "the default)")
    if redis_url:
        given = ctx.get_parameter_source("redis_url") == click.core.ParameterSource.COMMANDLINE
        _check_redis_url(redis_url, "--redis-url" if given else "PRESCREEN_REDIS_URL")
    ctx.obj = Ctx(cache_dir, redis_url)


# --- warm ------------------------------------------------------------------------------------------------------------


def _memory_option(value: str | int, source: str) -> int:
    try:
        return parse_memory(value)
    except ConfigError as exc:  # the message starts with the value: --device-memory '0.1' is less than one byte
        fail(f"{source} {exc}")


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err(), transient=True)


def _summary(report: WarmReport) -> Any:
    from rich.table import Table

    title = ("prescreen warm" + (" (plan only: nothing benchmarked)" if report.plan_only else "")
             + (" (dry run: nothing stored)" if report.dry_run else ""))
    values = [("kernels", str(report.kernels)), ("decisions", str(len(report.unique()))),
              ("tuned", str(report.tuned)), ("fell back", str(report.fell_back)),
              ("not bounded", str(report.not_bounded)), ("largest", format_bytes(report.largest)),
              ("compiles", str(report.compiles)), ("families", str(report.families)),
              ("families decided", str(report.decided_families)), ("cache answered", str(report.cache_answered)),
              ("time", f"{report.seconds:.1f}s")]
    if compact():
        items = [f"{v} {k}" if k not in ("largest", "time") else f"{k} {v}" for k, v in values]
        return _wrap_items(f"{title}:", items, out().width)
    table = Table(title=title)
    for col, _ in values:
        table.add_column(col, justify="right")
    table.add_row(*(v for _, v in values))
    return table


def _wrap_items(head: str, items: Sequence[str], width: int) -> str:
    """``head`` and the comma-separated ``items`` in lines of at most ``width``, broken only between items (never
    between a count and what it counts: ``2 compiles`` stays on one line)."""
    lines, line = [], head
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if len(line) + 1 + len(piece) > width and line:
            lines.append(line)
            line = piece
        else:
            line = f"{line} {piece}" if line else piece
    return "\n".join([*lines, line])


def _fits(table: Table) -> bool:
    """Whether ``table``'s rows fit the terminal on one line each (its natural width, not clamped)."""
    from rich.measure import Measurement

    console = out()
    unbounded = console.options.update_width(1 << 16)
    return Measurement.get(console, unbounded, table).maximum <= console.width


def _decisions(report: WarmReport) -> Table:
    """warm's decisions: every column where they fit on one line per row, else the compact layout."""
    if not compact():
        wide = _decision_layout(report, narrow=False)
        if _fits(wide):
            return wide
    return _decision_layout(report, narrow=True)


def _decision_layout(report: WarmReport, narrow: bool) -> Table:
    from rich.table import Table

    from prescreen.report import short_reason

    table = Table(title="decisions")
    cols = ["key", "kernel", "sizes", "decision", "estimated", "budget", "source", "reason"]
    if narrow:  # the reason holds the estimate and the budget
        cols = [c for c in cols if c not in ("estimated", "budget")]
        if not any(r.sizes or r.family for r in report.records):
            cols.remove("sizes")
    rows = [{
        "key": r.key[:COMPACT_KEY_CHARS if narrow else KEY_CHARS], "kernel": r.kernel,
        "sizes": r.family or ",".join(f"{k}={v}" for k, v in r.sizes.items()) or "-",
        "decision": r.action if r.bounded else "fallback*", "estimated": format_bytes(r.estimated_bytes),
        "budget": format_bytes(r.budget_bytes), "source": "hit" if r.hit else "computed",
        "reason": short_reason(r.action, r.bounded, r.estimated_bytes, r.budget_bytes, r.reason, brief=narrow),
    } for r in report.unique()]
    _fill(table, cols, rows, narrow, wrapping=("sizes", "reason"))
    return table


def _fill(table: Table, cols: Sequence[str], rows: Sequence[dict[str, str]], narrow: bool,
          wrapping: Sequence[str]) -> None:
    """Add ``cols`` and ``rows`` (escaped) to ``table``; a narrow layout gets the widths of :func:`_narrow_widths`."""
    widths = _narrow_widths(cols, rows, out().width, wrapping) if narrow else {}
    for col in cols:
        table.add_column(col, overflow="ellipsis" if col == "kernel" else "fold", no_wrap=col not in wrapping,
                         width=widths.get(col))
    for row in rows:
        table.add_row(*(markup(row[c]) for c in cols))


def _narrow_widths(cols: Sequence[str], rows: Sequence[dict[str, str]], width: int,
                   wrapping: Sequence[str]) -> dict[str, int]:
    """Column widths that fit ``width`` where they can: every cell on one line if that fits; else the kernel name
    gives way first (down to 8 characters, an ellipsis), then the ``wrapping`` columns wrap between words, the
    widest first, never narrower than their longest word, so no cell is cut mid-word or off the terminal's edge."""
    def natural(col: str) -> int:
        return max([len(col), *(len(visible(r[col])) for r in rows)])

    def longest_word(col: str) -> int:
        return max([len(col), *(len(word) for r in rows for word in visible(r[col]).split())])

    room = width - (len(cols) + 1) - 2 * len(cols)  # the box's rules and one space of padding either side
    widths = {c: natural(c) for c in cols}
    floor = {c: longest_word(c) if c in wrapping else 8 if c == "kernel" else widths[c] for c in cols}
    floor = {c: min(floor[c], widths[c]) for c in cols}
    for shrinking in (["kernel"], [c for c in cols if c in wrapping]):
        while sum(widths.values()) > room:
            movable = [c for c in shrinking if c in widths and widths[c] > floor[c]]
            if not movable:
                break
            widest = max(movable, key=lambda c: widths[c])
            widths[widest] -= 1
    return widths


@click.command()
@click.argument("target", required=False)
@click.option("--shape", "shapes", multiple=True, metavar="NAME=MIN..MAX",
              help="A dynamic size and the range it spans in deployment; repeat for several.")
@click.option("--spec", type=click.Path(dir_okay=False), metavar="FILE",
              help="A TOML or JSON file holding any of these options (the command line wins).")
@click.option("--plans", type=click.Path(dir_okay=False), metavar="FILE",
              help="Decide exported plan payloads directly; no model, no torch.compile.")
@click.option("--device-memory", metavar="SIZE",
              help="Plan for this much device memory, e.g. 64GiB [env PRESCREEN_DEVICE_MEMORY].")
@click.option("--ratio", metavar="R", help="The benchmark budget as a fraction of device memory, in (0, 1] "
              "[env PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO; default 0.25].")
@click.option("--device", metavar="DEVICE", help="The device the target builds its model on [default: cpu].")
@click.option("--device-kind", type=click.Choice(["npu", "cuda", "xpu", "cpu"]),
              help="The device kind --plans decides for [default: npu].")
@click.option("--mode", type=click.Choice(["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]),
              help="The torch.compile mode [default: max-autotune].")
@click.option("--points", type=click.IntRange(1, 16), help="Sizes spread over each --shape range, 1 to 16 [default: one per shape family].")
@click.option("--inductor-config", "inductor_config", multiple=True, metavar="KEY=VALUE",
              help="A torch._inductor.config setting for the compiles, e.g. freezing=True; repeat for several.")
@click.option("--dry-run", is_flag=True, help="Estimate and report; store nothing.")
@click.option("--artifact", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write one file to deploy: torch's compile caches and these decisions ('prescreen load FILE').")
@click.option("--plan-only", is_flag=True,
              help="Decide every family without benchmarking anything (a fast audit: which kernels would fall back "
                   "on this device memory and ratio); torch's caches are left untouched.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Keep Inductor's autotune tables and warnings.")
@click.pass_context
def warm(ctx: click.Context, target: str | None, shapes: tuple[str, ...], spec: str | None, plans: str | None,
         device_memory: str | None, ratio: str | None, device: str | None, device_kind: str | None, mode: str | None,
         points: int | None, inductor_config: tuple[str, ...], dry_run: bool, artifact: str | None, plan_only: bool,
         as_json: bool, verbose: bool) -> None:
    """Compile TARGET (module:callable or file.py:callable) over shape families and fill the store.

    A --spec file holds the same settings under the options' names with '_' for '-' (target, shapes, plans, device,
    device_kind, device_memory, ratio, mode, points, inductor_config); an option given on the command line wins
    over the file, and --inductor-config items win key by key.
    """
    from prescreen.budget import budget_basis, memory_override, parse_ratio, resolve_ratio
    from prescreen.target import Spec, check_mode, load_spec, merge_inductor_config, parse_shape

    s = _run(lambda: load_spec(spec)) if spec else Spec()
    if target and plans:
        fail("give TARGET or --plans, not both")
    if not target and not plans:  # the spec's, unless the command line chose
        if s.target and s.plans:
            fail(f"spec {s.path!r} sets both 'target' and 'plans'; keep one")
        target, plans = s.target, s.plans
    if target or plans:
        _check_applies(bool(plans), s, {"shapes": shapes, "device": device, "mode": mode, "points": points,
                                        "inductor_config": inductor_config, "device_kind": device_kind})
    families = tuple(_run(lambda: [parse_shape(x) for x in shapes])) if shapes else s.shapes
    _check_shape_names(families, "--shape" if shapes else f"spec {s.path!r}: shapes")
    memory_text = device_memory if device_memory is not None else s.device_memory
    memory = (_memory_option(memory_text, "--device-memory" if device_memory is not None else f"spec {s.path!r}: "
                             "device_memory") if memory_text is not None else None)
    if ratio is None and s.ratio is not None:  # an error names the spec, not --ratio
        ratio_value = _run(lambda: parse_ratio(s.ratio if s.ratio is not None else "", f"spec {s.path!r}: ratio"))
    else:
        ratio_value = _run(lambda: resolve_ratio(ratio))
    mode = _run(lambda: check_mode(mode or s.mode or "max-autotune"))
    points = points if points is not None else s.points
    config_items = _run(lambda: merge_inductor_config(s.inductor_config, inductor_config))
    _run(budget_basis)  # a junk environment is an error here, not a warm that silently decides nothing
    if plans and artifact:
        fail("--artifact applies to a model warm (it holds the compiles' torch caches), not to --plans")
    if plans and plan_only:
        fail("--plan-only applies to a model warm (--plans already decides without compiling)")
    if plan_only and artifact:
        fail("--plan-only benchmarks nothing and keeps no compile, so it has no --artifact to write")
    if plans:
        memory = _run(lambda: memory_override(memory))
        if memory is None:
            fail("--plans needs --device-memory or PRESCREEN_DEVICE_MEMORY (the fleet's device memory, e.g. 64GiB)")
        _warm_plans(ctx.obj, plans, memory, ratio_value, device_kind or s.device_kind or "npu", dry_run, as_json)
        return
    if not target:
        fail("missing TARGET (module:callable or file.py:callable), --spec or --plans")
    from prescreen.target import parse_inductor_config

    _run(lambda: memory_override(memory))  # $PRESCREEN_DEVICE_MEMORY checked (the hooks would only warn)
    overrides = _run(lambda: parse_inductor_config(config_items))
    store = ctx.obj.store()
    from prescreen.warm import warm_model

    with _progress() as progress:
        tick = _ticker(progress)
        report = _run(lambda: warm_model(
            target, families, store, device=device or s.device or "cpu", device_memory=memory, ratio=ratio_value,
            mode=mode, points=points, dry_run=dry_run, inductor_config=overrides, verbose=verbose, progress=tick,
            artifact=artifact, plan_only=plan_only))
    _print_report(report, as_json)


#: warm's settings that apply to one kind of warm only, by their spec key (the option's name with '_' for '-').
_MODEL_ONLY = ("shapes", "device", "mode", "points", "inductor_config")
_PLANS_ONLY = ("device_kind",)


def _check_applies(plans_warm: bool, spec: Spec, given: dict[str, object]) -> None:
    """A setting the chosen warm would not use is an error, on the command line or in the spec, not a silent no-op."""
    for key in _MODEL_ONLY if plans_warm else _PLANS_ONLY:
        option = "--shape" if key == "shapes" else "--" + key.replace("_", "-")
        where = option if given[key] else f"spec {spec.path!r}: {key!r}" if getattr(spec, key) else None
        if where is None:
            continue
        if plans_warm:
            fail(f"{where} does not apply to --plans (the plans hold their sizes; nothing is compiled)")
        fail(f"{where} applies to --plans only (a model warm decides for the device it compiles on: --device)")


def _check_shape_names(families: tuple[ShapeRange, ...], source: str) -> None:
    seen: dict[str, ShapeRange] = {}
    for family in families:
        if family.name in seen:
            first = seen[family.name]
            fail(f"{source} {family.name} is given twice ({first.low}..{first.high} and {family.low}..{family.high}); "
                 "give each shape once")
        seen[family.name] = family


def _ticker(progress: Any) -> Callable[[int, int, dict[str, int]], None]:
    task = progress.add_task("warming", total=None)

    def tick(done: int, total: int, sizes: dict[str, int]) -> None:
        label = ", ".join(f"{k}={v}" for k, v in sizes.items())
        progress.update(task, completed=done, total=total, description=f"warming {label}".strip())

    return tick


def _warm_plans(obj: Ctx, path: str, memory: int, ratio: float, kind: str, dry_run: bool, as_json: bool) -> None:
    from prescreen.budget import Budget
    from prescreen.warm import load_plans, warm_plans

    loaded = _run(lambda: load_plans(path))
    store = obj.store()
    with _progress() as progress:
        report = warm_plans(loaded, store, Budget(kind, memory, ratio), dry_run=dry_run, progress=_ticker(progress))
    _print_report(report, as_json)


def _print_report(report: WarmReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    console = out()
    console.print(_summary(report))
    if report.records:
        console.print(_decisions(report))
        if report.not_bounded:
            console.print("* not bounded: the footprint could not be estimated, so the benchmark is skipped "
                          "(fail closed)")
    for hint in report.hints:
        console.print(markup(hint), highlight=False)
    if report.artifact:
        a = report.artifact
        console.print(f"artifact {markup(a.path)}: {a.decisions} decisions, torch caches {format_bytes(a.torch_bytes)} "
                      f"({format_bytes(a.file_bytes)} in all)", highlight=False)


# --- reading the store -----------------------------------------------------------------------------------------------


def _age(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _family(e: Entry) -> str:
    plan: dict[str, Any] = dict(e.plan)
    statics = plan.get("axis_static_values") or []
    features = plan.get("group_features") or []
    if features:
        groups = (e.family or {}).get("group_count", "?")
        return f"{len(features)} features, {groups} groups"
    labels = dict(plan.get("axis_labels") or [])  # an Inductor selection's buckets (prescreen.families)
    if labels:
        return ",".join(labels.get(n, f"{n}={v}") for n, v in statics)
    return ",".join(f"{n}={v}" for n, v in statics) or "static"


def is_observed_oom(d: Decision) -> bool:
    from prescreen.decision import is_observed_oom as observed

    return observed(d)


def _short(e: Entry, brief: bool = False) -> str:
    from prescreen.report import short_reason

    d = e.decision
    return short_reason(d.action, d.bounded, d.estimated_bytes, d.budget_bytes, d.reason, brief=brief)


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The one filter language of ``inspect``, ``report`` and ``clear`` (filters combine with AND)."""
    options = [
        click.option("--key", "key_prefix", metavar="PREFIX", help="Entries whose key starts with these hex digits."),
        click.option("--kernel", metavar="PATTERN",
                     help="Kernels whose name contains PATTERN, or matches it as a glob ('select:packed*')."),
        click.option("--device", metavar="KIND", help="Entries decided for this device kind (npu, cuda, xpu, cpu)."),
        click.option("--decision", type=click.Choice(["tune", "fallback"]), help="Only this decision."),
        click.option("--older-than", metavar="AGE", help="Entries older than AGE, e.g. 7d, 12h, 30m."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def selection(key_prefix: str | None = None, kernel: str | None = None, device: str | None = None,
              decision: str | None = None, older_than: str | None = None, *, required: bool = False,
              everything: bool = False) -> Predicate:
    """The entries the filter options select; with ``required`` (clear), no filter is an error."""
    from prescreen.store.clear import build_predicate, match_all

    given = any(v is not None for v in (key_prefix, kernel, device, older_than, decision))
    if not given and not required and not everything:
        base = match_all()
    else:
        try:
            base = build_predicate(everything=everything, key_prefix=key_prefix, kernel=kernel, device=device,
                                   older_than=older_than)
        except ConfigError as exc:
            if decision is None or "nothing selected" not in str(exc):
                fail(str(exc))
            base = match_all()
        if everything and decision is not None:
            fail("--all cannot be combined with other filters")
    if decision is None:
        return base
    return lambda e: e.decision.action == decision and base(e)


def _one(store: Store, key: str) -> Entry:
    prefix = key.strip().lower()
    if not prefix or not re.fullmatch(r"[0-9a-f]+", prefix):
        fail(f"invalid key prefix {key!r} (expected hex digits of a key)")
    matches = [e for e in store.entries() if e.key.startswith(prefix)]
    if not matches:
        fail(f"no entry with key {key!r}")
    if len(matches) > 1:
        fail(f"key prefix {key!r} matches {len(matches)} entries; give more characters")
    return matches[0]


def _entry_table(entry: Entry) -> Table:
    from rich.table import Table

    d = entry.decision
    table = Table(title=markup(f"entry {entry.key}"), show_header=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    rows = [
        ("kernel", entry.kernel), ("decision", d.action), ("bounded", str(d.bounded)),
        ("enable_auto_blockify", str(d.enable_auto_blockify)),
        ("estimated", f"{format_bytes(d.estimated_bytes)} ({d.estimated_bytes} B)"),
        ("synthetic / mutated clone", f"{d.synthetic_bytes} / {d.mutated_clone_bytes} B"),
        ("budget", f"{format_bytes(d.budget_bytes)} = {format_bytes(d.total_memory)} x {d.ratio}"),
        ("why", _short(entry)), ("reason", d.reason), ("largest group", str(d.largest_group_id)),
        ("dominant arg", json.dumps(d.dominant_arg.to_payload()) if d.dominant_arg else "none"),
        ("per-group bytes", ", ".join(f"{g}: {format_bytes(b)}" for g, b in d.group_bytes) or "-"),
        ("shape family", _family(entry)),
        ("created", f"{_age(entry.created_at)} by {entry.host} pid {entry.pid}"), ("hits", str(entry.hits)),
    ]
    rows += [(f"key.{k}", json.dumps(v) if not isinstance(v, str) else v) for k, v in entry.parts.to_payload().items()]
    for field, value in rows:
        table.add_row(markup(field), markup(value))
    return table


#: The columns of the ``inspect`` listing, widest first: the widest whose rows fit the terminal is used.
LIST_COLUMNS = {
    "compact": ("key", "kernel", "shape family", "device", "decision", "why"),  # paired rows differ by family
    "medium": ("key", "kernel", "shape family", "device", "decision", "why", "hits"),
    "wide": ("key", "kernel", "shape family", "device", "ratio", "decision", "estimated", "budget", "why", "created",
             "hits"),
}


def _list_table(entries: Sequence[Entry], title: str) -> Table:
    """The widest layout whose rows fit the terminal on one line each; the compact one under COMPACT_BELOW."""
    layouts = ["compact"] if compact() else ["wide", "medium", "compact"]
    for layout in layouts:
        table = _list_layout(entries, title, layout)
        if layout == "compact" or _fits(table):
            break
    return table


def _list_layout(entries: Sequence[Entry], title: str, layout: str) -> Table:
    from rich.table import Table

    narrow = layout == "compact"
    table = Table(title=markup(title))
    cols = LIST_COLUMNS[layout]
    rows = [{
        "key": e.key[:COMPACT_KEY_CHARS if narrow else KEY_CHARS], "kernel": e.kernel, "shape family": _family(e),
        "device": e.parts.device_kind if narrow else f"{e.parts.device_kind} {format_bytes(e.parts.total_memory)}",
        "ratio": f"{e.parts.ratio:g}",
        "decision": "fallback!" if is_observed_oom(e.decision) else e.decision.action if e.decision.bounded
        else "fallback*",
        "estimated": format_bytes(e.decision.estimated_bytes), "budget": format_bytes(e.decision.budget_bytes),
        "why": _short(e, layout != "wide"), "created": _age(e.created_at), "hits": str(e.hits),
    } for e in entries]
    _fill(table, cols, rows, narrow, wrapping=("shape family", "why"))
    return table


@click.command()
@click.argument("key", required=False)
@filter_options
@click.option("--verify", is_flag=True, help="Recompute each shown decision and compare it with the stored one.")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@click.pass_obj
def inspect(obj: Ctx, key: str | None, key_prefix: str | None, kernel: str | None, device: str | None,
            decision: str | None, older_than: str | None, verify: bool, as_json: bool) -> None:
    """List stored decisions, or show the entry KEY (a prefix is enough) in full with its per-group chart."""
    chosen = selection(key_prefix, kernel, device, decision, older_than)
    store = obj.store(writable=False)
    if verify:
        from prescreen.store.verify import verify_entry

        shown = [_one(store, key)] if key else [e for e in store.entries() if chosen(e)]
        stale = [e for e in shown if not verify_entry(e)]
        for e in stale:
            err().print(f"[bold red]mismatch:[/] {markup(e.key[:KEY_CHARS])} {markup(e.kernel)}: stored decision "
                        "differs from a fresh computation", highlight=False)
        out().print(f"verified {len(shown)} entries: {len(shown) - len(stale)} identical to a fresh computation")
        if stale:
            sys.exit(1)
        return
    if key:
        entry = _one(store, key)
        if as_json:
            click.echo(json.dumps(entry.to_payload(), indent=2))
            return
        from prescreen.report import bar_chart

        console = out()
        console.print(_entry_table(entry))
        console.print(bar_chart(entry, width=console.width))
        return
    entries = sorted((e for e in store.entries() if chosen(e)), key=lambda e: e.created_at)
    if as_json:
        click.echo(json.dumps([e.to_payload() for e in entries], indent=2))
        return
    console = out()
    console.print(_list_table(entries, f"{len(entries)} decisions in {store.backend} store {store.location}"))
    if any(not e.decision.bounded for e in entries):
        console.print("* not bounded: the footprint could not be estimated, so the benchmark is skipped (fail closed)")
    if any(is_observed_oom(e.decision) for e in entries):
        console.print("! observed_oom: the benchmark ran out of memory here once; never retried "
                      "(`prescreen clear --observed` forgets it)")


@click.command()
@filter_options
@click.option("--html", "html_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write an HTML page: a chart and the numbers per fallback.")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the charts as one PNG (needs matplotlib: pip install 'prescreen[plot]').")
@click.pass_obj
def report(obj: Ctx, key_prefix: str | None, kernel: str | None, device: str | None, decision: str | None,
           older_than: str | None, html_path: str | None, png_path: str | None) -> None:
    """Chart every fallback in the store (per-group bytes against the budget) for a deployment review.

    Without --html or --png the charts are drawn in the terminal. --decision tune charts the tuned entries instead.
    """
    from prescreen.report import bar_chart, write_html, write_png

    chosen = selection(key_prefix, kernel, device, decision or "fallback", older_than)
    store = obj.store(writable=False)
    entries = sorted((e for e in store.entries() if chosen(e)), key=lambda e: -(e.decision.estimated_bytes or 0))
    console = out()
    if html_path:
        n = _run(lambda: write_html(entries, html_path, f"prescreen: {decision or 'fallback'} decisions in "
                                    f"{store.location}"))
        console.print(f"wrote {n} entries to {markup(html_path)}", highlight=False)
    if png_path:
        n = _run(lambda: write_png(entries, png_path))
        console.print(f"wrote {n} entries to {markup(png_path)}", highlight=False)
    if html_path or png_path:
        return
    if not entries:
        console.print(f"no {decision or 'fallback'} decisions in {markup(store.location)}")
    for e in entries:
        console.rule(markup(f"{e.key[:KEY_CHARS]} {e.kernel}"), style="dim")
        console.print(bar_chart(e, width=console.width))


@click.command()
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
@filter_options
@click.option("--observed", is_flag=True,
              help="Only fallbacks stored after a real out-of-memory error (observed_oom, shown as fallback!).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def clear(obj: Ctx, everything: bool, key_prefix: str | None, kernel: str | None, device: str | None,
          decision: str | None, older_than: str | None, observed: bool, yes: bool) -> None:
    """Remove stored decisions: all, or those the filters select (the filters of inspect)."""
    if observed and everything:
        fail("--all cannot be combined with --observed")
    filtered = any(v is not None for v in (key_prefix, kernel, device, decision, older_than))
    base = selection(key_prefix, kernel, device, decision, older_than, required=not observed or filtered,
                     everything=everything)
    chosen = (lambda e: is_observed_oom(e.decision) and base(e)) if observed else base
    store = obj.store()
    doomed = [e for e in store.entries() if chosen(e)]
    console = out()
    if not doomed and not (everything and store.stats().entries):  # --all also removes invalid values
        console.print("nothing to remove")
        return
    if not yes and not click.confirm(f"Remove {len(doomed)} entries from {visible(store.location)}?", default=False):
        console.print("aborted; nothing removed")
        return
    removed = store.clear_all() if everything else store.delete([e.key for e in doomed])
    for e in doomed:
        console.print(markup(f"removed {e.key[:KEY_CHARS]} {e.kernel} ({e.decision.action})"), highlight=False)
    console.print(f"{removed} entries removed")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@click.pass_obj
def stats(obj: Ctx, as_json: bool) -> None:
    """Entries, size on disk, hit rate, location and backend of the store."""
    store = obj.store(writable=False)
    s = store.stats()
    entries = list(store.entries())
    stored_hits = sum(e.hits for e in entries)
    lookups = stored_hits + s.entries  # every entry was computed once (a miss), then reused stored_hits times
    counts = {"tune": sum(e.decision.action == "tune" for e in entries),
              "fallback": sum(e.decision.action == "fallback" for e in entries)}
    if as_json:
        click.echo(json.dumps({
            "backend": s.backend, "location": s.location, "entries": s.entries, "size_bytes": s.size_bytes,
            "tune": counts["tune"], "fallback": counts["fallback"], "hits": stored_hits,
            "hit_rate": round(stored_hits / lookups, 6) if lookups else None, "healthy": s.healthy,
            "detail": s.detail,
        }, indent=2))
        return
    from rich.table import Table

    table = Table(show_header=False, title="prescreen store")
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for field, value in (
        ("backend", s.backend), ("location", s.location), ("entries", str(s.entries)),
        ("decisions", f"{counts['tune']} tune, {counts['fallback']} fallback"),
        ("size", format_bytes(s.size_bytes)),
        ("hits", str(stored_hits)),
        ("hit rate", f"{stored_hits / lookups:.1%} (hits / (hits + entries computed))" if lookups else "-"),
        ("healthy", str(s.healthy)), ("detail", s.detail or "-"),
    ):
        table.add_row(field, markup(value))
    out().print(table)


@click.command("export")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def export_cmd(obj: Ctx, path: str) -> None:
    """Write every stored decision to a versioned JSON bundle at PATH."""
    from prescreen.store.bundle import export_bundle

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        fail(f"cannot write bundle {path!r}: no directory {parent!r}")
    store = obj.store(writable=False)
    try:
        count = _run(lambda: export_bundle(store, path))
    except OSError as exc:
        fail(f"cannot write bundle {path!r}: {exc.strerror or exc}")
    out().print(f"exported {count} entries to {markup(path)}", highlight=False)


@click.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def import_cmd(obj: Ctx, path: str) -> None:
    """Load a bundle made by 'prescreen export' (every entry validated; another schema is refused)."""
    from prescreen.store.bundle import import_bundle

    store = obj.store()
    try:
        imported, skipped = _run(lambda: import_bundle(store, path))
    except OSError as exc:
        fail(f"cannot read bundle {path!r}: {exc.strerror or exc}")
    out().print(f"imported {imported} entries from {markup(path)} ({skipped} already present or skipped)",
                highlight=False)


@click.command("load")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def load_cmd(obj: Ctx, path: str) -> None:
    """Put an artifact made by 'prescreen warm --artifact' in place: its decisions and torch's compile caches.

    Everything in it is checked before anything is changed. Its torch part is compiled code (like a model
    file): load only artifacts you built or trust.
    """
    from prescreen.artifact import load

    store = obj.store()
    loaded = _run(lambda: load(path, store))
    out().print(markup(loaded.summary()), highlight=False)


for _command in (warm, inspect, report, clear, stats, export_cmd, import_cmd, load_cmd):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: every error is one ``error:`` line and exit status 2."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="prescreen")


if __name__ == "__main__":  # pragma: no cover
    main()
