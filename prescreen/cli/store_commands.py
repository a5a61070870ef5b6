"""The commands over the store: inspect, report, clear, stats, export, import and load.

``inspect``, ``report`` and ``clear`` share one filter language (:func:`filter_options`); nothing here
imports torch but ``load``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from prescreen import display
from prescreen.budget import format_bytes
from prescreen.display import KEY_CHARS, markup, out, visible
from prescreen.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from prescreen.cli import StoreOpener
    from prescreen.store.base import Store
    from prescreen.store.clear import Predicate
    from prescreen.store.entry import Entry

__all__ = ["COMMANDS", "filter_options", "selection"]


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


def _short(e: Entry, brief: bool = False) -> str:
    d = e.decision
    return display.short_reason(d.action, d.bounded, d.estimated_bytes, d.budget_bytes, d.reason, brief=brief)


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
    """The entries the filter options select, all where none is given; with ``required`` (clear), no filter is an
    error, and ``everything`` (clear --all) takes no filter."""
    from prescreen.store.clear import build_predicate, match_all

    if everything and decision is not None:
        raise ConfigError("--all cannot be combined with other filters")
    filtered = any(v is not None for v in (key_prefix, kernel, device, older_than))
    base = (build_predicate(everything=everything, key_prefix=key_prefix, kernel=kernel, device=device,
                            older_than=older_than)
            if filtered or everything or (required and decision is None) else match_all())
    return base if decision is None else lambda e: e.decision.action == decision and base(e)


def _one(store: Store, key: str) -> Entry:
    prefix = key.strip().lower()
    if not prefix or not re.fullmatch(r"[0-9a-f]+", prefix):
        raise ConfigError(f"invalid key prefix {key!r} (expected hex digits of a key)")
    matches = [e for e in store.entries() if e.key.startswith(prefix)]
    if not matches:
        raise ConfigError(f"no entry with key {key!r}")
    if len(matches) > 1:
        raise ConfigError(f"key prefix {key!r} matches {len(matches)} entries; give more characters")
    return matches[0]


def _entry_table(entry: Entry) -> Table:
    d = entry.decision
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
    return display.fields(f"entry {entry.key}", rows)


#: The columns of the ``inspect`` listing, widest first: the widest whose rows fit the terminal is used.
LIST_COLUMNS = {
    "wide": ("key", "kernel", "shape family", "device", "ratio", "decision", "estimated", "budget", "why", "created",
             "hits"),
    "medium": ("key", "kernel", "shape family", "device", "decision", "why", "hits"),
    "compact": ("key", "kernel", "shape family", "device", "decision", "why"),  # paired rows differ by family
}


def _list_layout(entries: Sequence[Entry], title: str, layout: str) -> Table:
    from prescreen.decision import is_observed_oom

    narrow = layout == "compact"
    rows = [{
        "key": e.key[:display.COMPACT_KEY_CHARS if narrow else KEY_CHARS], "kernel": e.kernel, "shape family": _family(e),
        "device": e.parts.device_kind if narrow else f"{e.parts.device_kind} {format_bytes(e.parts.total_memory)}",
        "ratio": f"{e.parts.ratio:g}",
        "decision": "fallback!" if is_observed_oom(e.decision) else e.decision.action if e.decision.bounded
        else "fallback*",
        "estimated": format_bytes(e.decision.estimated_bytes), "budget": format_bytes(e.decision.budget_bytes),
        "why": _short(e, layout != "wide"), "created": _age(e.created_at), "hits": str(e.hits),
    } for e in entries]
    return display.table(title, LIST_COLUMNS[layout], rows, narrow, wrapping=("shape family", "why"))


@click.command()
@click.argument("key", required=False)
@filter_options
@click.option("--verify", is_flag=True, help="Recompute each shown decision and compare it with the stored one.")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@click.pass_obj
def inspect(obj: StoreOpener, key: str | None, key_prefix: str | None, kernel: str | None, device: str | None,
            decision: str | None, older_than: str | None, verify: bool, as_json: bool) -> None:
    """List stored decisions, or show the entry KEY (a prefix is enough) in full with its per-group chart."""
    from prescreen.decision import is_observed_oom

    chosen = selection(key_prefix, kernel, device, decision, older_than)
    store = obj.store(writable=False)
    if verify:
        from prescreen.store.clear import verify_entry

        shown = [_one(store, key)] if key else [e for e in store.entries() if chosen(e)]
        stale = [e for e in shown if not verify_entry(e)]
        for e in stale:
            display.err().print(f"[bold red]mismatch:[/] {markup(e.key[:KEY_CHARS])} {markup(e.kernel)}: stored decision "
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
        console = out()
        console.print(_entry_table(entry))
        console.print(display.bar_chart(entry, width=console.width))
        return
    entries = sorted((e for e in store.entries() if chosen(e)), key=lambda e: e.created_at)
    if as_json:
        click.echo(json.dumps([e.to_payload() for e in entries], indent=2))
        return
    console = out()
    title = f"{len(entries)} decisions in {store.backend} store {store.location}"
    console.print(display.widest_fitting(list(LIST_COLUMNS), lambda layout: _list_layout(entries, title, layout)))
    if any(not e.decision.bounded for e in entries):
        console.print(display.NOT_BOUNDED_NOTE)
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
def report(obj: StoreOpener, key_prefix: str | None, kernel: str | None, device: str | None, decision: str | None,
           older_than: str | None, html_path: str | None, png_path: str | None) -> None:
    """Chart every fallback in the store (per-group bytes against the budget) for a deployment review.

    Without --html or --png the charts are drawn in the terminal. --decision tune charts the tuned entries instead.
    """
    chosen = selection(key_prefix, kernel, device, decision or "fallback", older_than)
    store = obj.store(writable=False)
    entries = sorted((e for e in store.entries() if chosen(e)), key=lambda e: -(e.decision.estimated_bytes or 0))
    console = out()
    if html_path:
        n = display.write_html(entries, html_path, f"prescreen: {decision or 'fallback'} decisions in {store.location}")
        console.print(f"wrote {n} entries to {markup(html_path)}", highlight=False)
    if png_path:
        n = display.write_png(entries, png_path)
        console.print(f"wrote {n} entries to {markup(png_path)}", highlight=False)
    if html_path or png_path:
        return
    if not entries:
        console.print(f"no {decision or 'fallback'} decisions in {markup(store.location)}")
    for e in entries:
        console.rule(markup(f"{e.key[:KEY_CHARS]} {e.kernel}"), style="dim")
        console.print(display.bar_chart(e, width=console.width))


@click.command()
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
@filter_options
@click.option("--observed", is_flag=True,
              help="Only fallbacks stored after a real out-of-memory error (observed_oom, shown as fallback!).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def clear(obj: StoreOpener, everything: bool, key_prefix: str | None, kernel: str | None, device: str | None,
          decision: str | None, older_than: str | None, observed: bool, yes: bool) -> None:
    """Remove stored decisions: all, or those the filters select (the filters of inspect)."""
    from prescreen.decision import is_observed_oom

    if observed and everything:
        raise ConfigError("--all cannot be combined with --observed")
    base = selection(key_prefix, kernel, device, decision, older_than, required=not observed, everything=everything)
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
def stats(obj: StoreOpener, as_json: bool) -> None:
    """Entries, size on disk, hit rate, location and backend of the store."""
    store = obj.store(writable=False)
    s = store.stats()
    entries = list(store.entries())
    stored_hits = sum(e.hits for e in entries)
    lookups = stored_hits + s.entries  # every entry was computed once (a miss), then reused stored_hits times
    tune = sum(e.decision.action == "tune" for e in entries)
    fallback = len(entries) - tune  # a decision is one or the other
    if as_json:
        click.echo(json.dumps({
            "backend": s.backend, "location": s.location, "entries": s.entries, "size_bytes": s.size_bytes,
            "tune": tune, "fallback": fallback, "hits": stored_hits,
            "hit_rate": round(stored_hits / lookups, 6) if lookups else None, "healthy": s.healthy,
            "detail": s.detail,
        }, indent=2))
        return
    out().print(display.fields("prescreen store", [
        ("backend", s.backend), ("location", s.location), ("entries", str(s.entries)),
        ("decisions", f"{tune} tune, {fallback} fallback"),
        ("size", format_bytes(s.size_bytes)),
        ("hits", str(stored_hits)),
        ("hit rate", f"{stored_hits / lookups:.1%} (hits / (hits + entries computed))" if lookups else "-"),
        ("healthy", str(s.healthy)), ("detail", s.detail or "-"),
    ]))


@click.command("export")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def export_cmd(obj: StoreOpener, path: str) -> None:
    """Write every stored decision to a versioned JSON bundle at PATH."""
    from prescreen.store.bundle import export_bundle

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"cannot write bundle {path!r}: no directory {parent!r}")
    store = obj.store(writable=False)
    try:
        count = export_bundle(store, path)
    except OSError as exc:
        raise ConfigError(f"cannot write bundle {path!r}: {exc.strerror or exc}") from None
    out().print(f"exported {count} entries to {markup(path)}", highlight=False)


@click.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def import_cmd(obj: StoreOpener, path: str) -> None:
    """Load a bundle made by 'prescreen export' (every entry validated; another schema is refused)."""
    from prescreen.store.bundle import import_bundle

    imported, skipped = import_bundle(obj.store(), path)  # a file it cannot read is its ConfigError
    out().print(f"imported {imported} entries from {markup(path)} ({skipped} already present or skipped)",
                highlight=False)


@click.command("load")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def load_cmd(obj: StoreOpener, path: str) -> None:
    """Put an artifact made by 'prescreen warm --artifact' in place: its decisions and torch's compile caches.

    Everything in it is checked before anything is changed. Its torch part is compiled code (like a model
    file): load only artifacts you built or trust.
    """
    from prescreen.artifact import load

    out().print(markup(load(path, obj.store()).summary()), highlight=False)


#: The commands this module adds to the group.
COMMANDS = (inspect, report, clear, stats, export_cmd, import_cmd, load_cmd)
