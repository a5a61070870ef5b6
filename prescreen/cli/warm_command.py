"""``prescreen warm``: compile a target over shape families (or decide exported plans) and fill the store.

A ``--spec`` file's settings become the defaults of the other options (``ctx.default_map``), so the command
line wins over the file; an error in a value names the option or the spec key it came from.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from prescreen import display
from prescreen.budget import format_bytes, parse_memory, parse_ratio
from prescreen.display import KEY_CHARS, markup, out
from prescreen.errors import ConfigError
from prescreen.target import ShapeRange, load_spec, merge_inductor_config, parse_inductor_config, parse_shape

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from prescreen.warm import WarmReport

__all__ = ["given_as", "warm"]

#: ``ctx.meta`` key of the ``--spec`` file whose settings are warm's defaults.
SPEC = "prescreen.spec"


def given_as(ctx: click.Context, name: str) -> str:
    """How an error names where parameter ``name``'s value came from: its option, its environment variable, or
    the ``--spec`` file (``spec 'warm.toml': ratio``)."""
    source = ctx.get_parameter_source(name)
    if source is ParameterSource.DEFAULT_MAP:
        return f"spec {ctx.meta[SPEC]!r}: {name}"
    param = next(p for p in ctx.command.params if p.name == name)
    if source is ParameterSource.ENVIRONMENT and isinstance(param.envvar, str):
        return param.envvar
    return param.opts[0] if isinstance(param, click.Option) else name.upper()


class Parsed(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A value read by one of prescreen's parsers, ``parse(value, where)``; its error names ``where`` the value
    came from (see :func:`given_as`)."""

    def __init__(self, name: str, parse: Callable[[Any, str], Any]) -> None:
        self.name, self._parse = name, parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        where = given_as(ctx, param.name) if ctx is not None and param is not None and param.name else "value"
        return self._parse(value, where)


def _memory(value: str | int, where: str) -> int:
    try:
        return parse_memory(value)
    except ConfigError as exc:  # the message starts with the value: --device-memory '0.1' is less than one byte
        raise ConfigError(f"{where} {exc}") from None


def _shape(value: str | ShapeRange, where: str) -> ShapeRange:
    return value if isinstance(value, ShapeRange) else parse_shape(value)  # a spec's shapes are parsed already


def _use_spec(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """``--spec`` (eager): the file's settings become the defaults of warm's other parameters."""
    if path:
        ctx.meta[SPEC] = path
        ctx.default_map = {k: v for k, v in load_spec(path).items() if v != ()}
    return path


@click.command()
@click.argument("target", required=False)
@click.option("--shape", "shapes", type=Parsed("shape", _shape), multiple=True, metavar="NAME=MIN..MAX",
              help="A dynamic size and the range it spans in deployment; repeat for several.")
@click.option("--spec", type=click.Path(dir_okay=False), metavar="FILE", is_eager=True, callback=_use_spec,
              help="A TOML or JSON file holding any of these options (the command line wins).")
@click.option("--plans", type=click.Path(dir_okay=False), metavar="FILE",
              help="Decide exported plan payloads directly; no model, no torch.compile.")
@click.option("--device-memory", type=Parsed("size", _memory), metavar="SIZE",
              help="Plan for this much device memory, e.g. 64GiB [env PRESCREEN_DEVICE_MEMORY].")
@click.option("--ratio", type=Parsed("ratio", parse_ratio), metavar="R", help="The benchmark budget as a fraction of "
              "device memory, in (0, 1] [env PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO; default 0.25].")
@click.option("--device", metavar="DEVICE", default="cpu", help="The device the target builds its model on "
              "[default: cpu].")
@click.option("--device-kind", type=click.Choice(["npu", "cuda", "xpu", "cpu"]), default="npu",
              help="The device kind --plans decides for [default: npu].")
@click.option("--mode", type=click.Choice(["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]),
              default="max-autotune", help="The torch.compile mode [default: max-autotune].")
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
def warm(ctx: click.Context, target: str | None, shapes: tuple[ShapeRange, ...], spec: str | None, plans: str | None,
         device_memory: int | None, ratio: float | None, device: str, device_kind: str, mode: str,
         points: int | None, inductor_config: tuple[str, ...], dry_run: bool, artifact: str | None, plan_only: bool,
         as_json: bool, verbose: bool) -> None:
    """Compile TARGET (module:callable or file.py:callable) over shape families and fill the store.

    A --spec file holds the same settings under the options' names with '_' for '-' (target, shapes, plans, device,
    device_kind, device_memory, ratio, mode, points, inductor_config); an option given on the command line wins
    over the file, and --inductor-config items win key by key.
    """
    from prescreen.budget import budget_basis, memory_override, resolve_ratio
    source = ctx.get_parameter_source
    if target and plans:  # one from the command line and one from the spec: the command line's wins
        if source("target") is source("plans"):
            raise ConfigError("give TARGET or --plans, not both" if source("plans") is ParameterSource.COMMANDLINE
                              else f"spec {ctx.meta[SPEC]!r} sets both 'target' and 'plans'; keep one")
        target, plans = (target, None) if source("target") is ParameterSource.COMMANDLINE else (None, plans)
    if target or plans:
        _check_applies(ctx, plans_warm=bool(plans))
    _check_shape_names(shapes, given_as(ctx, "shapes"))
    ratio = ratio if ratio is not None else resolve_ratio()
    config_items = merge_inductor_config((ctx.default_map or {}).get("inductor_config", ()), inductor_config)
    budget_basis()  # a junk environment is an error here, not a warm that silently decides nothing
    if plans and artifact:
        raise ConfigError("--artifact applies to a model warm (it holds the compiles' torch caches), not to --plans")
    if plans and plan_only:
        raise ConfigError("--plan-only applies to a model warm (--plans already decides without compiling)")
    memory = memory_override(device_memory)  # $PRESCREEN_DEVICE_MEMORY checked (the hooks would only warn)
    if not target and not plans:
        raise ConfigError("missing TARGET (module:callable or file.py:callable), --spec or --plans")
    from prescreen import warm as warming

    if plans:
        if memory is None:
            raise ConfigError("--plans needs --device-memory or PRESCREEN_DEVICE_MEMORY (the fleet's device memory, "
                              "e.g. 64GiB)")
        from prescreen.budget import Budget

        loaded = warming.load_plans(plans)
        with _progress() as tick:
            report = warming.warm_plans(loaded, ctx.obj.store(), Budget(device_kind, memory, ratio), dry_run=dry_run,
                                        progress=tick)
    else:
        overrides = parse_inductor_config(config_items)
        store = ctx.obj.store()
        with _progress() as tick:
            report = warming.warm_model(str(target), shapes, store, device=device, device_memory=device_memory,
                                        ratio=ratio, mode=mode, points=points, dry_run=dry_run,
                                        inductor_config=overrides, verbose=verbose, progress=tick, artifact=artifact,
                                        plan_only=plan_only)
    _print_report(report, as_json)


#: warm's settings that apply to one kind of warm only, by their parameter (and spec key) names.
_MODEL_ONLY = ("shapes", "device", "mode", "points", "inductor_config")
_PLANS_ONLY = ("device_kind",)


def _check_applies(ctx: click.Context, plans_warm: bool) -> None:
    """A setting the chosen warm would not use is an error, on the command line or in the spec, not a silent no-op."""
    why = ("does not apply to --plans (the plans hold their sizes; nothing is compiled)" if plans_warm
           else "applies to --plans only (a model warm decides for the device it compiles on: --device)")
    for name in _MODEL_ONLY if plans_warm else _PLANS_ONLY:
        if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.DEFAULT_MAP):
            raise ConfigError(f"{given_as(ctx, name)} {why}")


def _check_shape_names(shapes: tuple[ShapeRange, ...], source: str) -> None:
    for i, shape in enumerate(shapes):
        first = next((s for s in shapes[:i] if s.name == shape.name), None)
        if first is not None:
            raise ConfigError(f"{source} {shape.name} is given twice ({first.low}..{first.high} and "
                              f"{shape.low}..{shape.high}); give each shape once")


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[int, int, dict[str, int]], None]]:
    """A transient progress bar on stderr, and the ``progress`` callback of a warm that moves it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=display.err(), transient=True) as bar:
        task = bar.add_task("warming", total=None)

        def tick(done: int, total: int, sizes: dict[str, int]) -> None:
            label = ", ".join(f"{k}={v}" for k, v in sizes.items())
            bar.update(task, completed=done, total=total, description=f"warming {label}".strip())

        yield tick


def _print_report(report: WarmReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    console = out()
    console.print(_summary(report))
    if report.records:
        console.print(display.widest_fitting([False, True], lambda narrow: _decision_layout(report, narrow)))
        if report.not_bounded:
            console.print(display.NOT_BOUNDED_NOTE)
    for hint in report.hints:
        console.print(markup(hint), highlight=False)
    if report.artifact:
        a = report.artifact
        console.print(f"artifact {markup(a.path)}: {a.decisions} decisions, torch caches {format_bytes(a.torch_bytes)} "
                      f"({format_bytes(a.file_bytes)} in all)", highlight=False)


def _summary(report: WarmReport) -> Any:
    from rich.table import Table

    title = ("prescreen warm" + (" (plan only: nothing benchmarked)" if report.plan_only else "")
             + (" (dry run: nothing stored)" if report.dry_run else ""))
    values = [("kernels", str(report.kernels)), ("decisions", str(len(report.unique()))),
              ("tuned", str(report.tuned)), ("fell back", str(report.fell_back)),
              ("not bounded", str(report.not_bounded)), ("largest", format_bytes(report.largest)),
              ("compiles", str(report.compiles)), ("families", str(report.families)),
              ("families decided", str(report.decided_families)),
              ("from another's lowering", str(report.carried)) if report.plan_only
              else ("cache answered", str(report.cache_answered)),
              ("time", f"{report.seconds:.1f}s")]
    if display.compact():
        items = [f"{v} {k}" if k not in ("largest", "time") else f"{k} {v}" for k, v in values]
        return display.wrap_items(f"{title}:", items, out().width)
    table = Table(title=title)
    for col, _ in values:
        table.add_column(col, justify="right")
    table.add_row(*(v for _, v in values))
    return table


def _decision_layout(report: WarmReport, narrow: bool) -> Table:
    cols = ["key", "kernel", "sizes", "decision", "estimated", "budget", "source", "reason"]
    if narrow:  # the reason holds the estimate and the budget
        cols = [c for c in cols if c not in ("estimated", "budget")]
        if not any(r.sizes or r.family for r in report.records):
            cols.remove("sizes")
    rows = [{
        "key": r.key[:display.COMPACT_KEY_CHARS if narrow else KEY_CHARS], "kernel": r.kernel,
        "sizes": r.family or ",".join(f"{k}={v}" for k, v in r.sizes.items()) or "-",
        "decision": r.action if r.bounded else "fallback*", "estimated": format_bytes(r.estimated_bytes),
        "budget": format_bytes(r.budget_bytes), "source": "hit" if r.hit else "computed",
        "reason": display.short_reason(r.action, r.bounded, r.estimated_bytes, r.budget_bytes, r.reason, brief=narrow),
    } for r in report.unique()]
    return display.table("decisions", cols, rows, narrow, wrapping=("sizes", "reason"))
