"""Everything the CLI draws: tables that fit the terminal, and per-group bytes against the budget (terminal, HTML,
PNG).

A store is shared, so its text (kernel names, paths, reasons) may be written to attack the terminal that shows it:
an escape sequence (OSC 52 writes the clipboard) or rich markup that makes rich raise. Every output passes such
text through :func:`visible` (plain) or :func:`markup` (text rich parses). Standard library only at import.
"""

from __future__ import annotations

import datetime as dt
import html
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prescreen.budget import format_bytes
from prescreen.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console, RenderableType
    from rich.table import Table

    from prescreen.store.entry import Entry

T = TypeVar("T")

#: C0 controls (ESC included), DEL, C1 controls, and the Unicode line/paragraph separators and bidi
#: overrides that reorder what a terminal shows (a name can then read as another one).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\x07``, ``\\u202e``)."""
    return _UNSAFE.sub(_escape, str(text))


def markup(text: object) -> str:
    """``text`` for a string rich parses as markup (table cells, titles, rules): visible, brackets literal."""
    from rich.markup import escape

    return escape(visible(text))


# --- tables that fit the terminal ----------------------------------------------------------------------------------

#: Below this many columns (an 80- or 100-column terminal) tables drop columns and shorten keys.
COMPACT_BELOW = 130
#: Key characters shown in tables (a prefix this long is unambiguous in any real store).
KEY_CHARS, COMPACT_KEY_CHARS = 12, 8
NOT_BOUNDED_NOTE = "* not bounded: the footprint could not be estimated, so the benchmark is skipped (fail closed)"


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


def wrap_items(head: str, items: Sequence[str], width: int) -> str:
    """``head`` and the comma-separated ``items`` in lines of at most ``width``, broken only between items (never
    between a count and what it counts: ``2 compiles`` stays on one line)."""
    glue = "\u00a0"  # textwrap breaks at ASCII whitespace only
    pieces = [head, *(f"{item}," for item in items[:-1]), *items[-1:]]
    lines = textwrap.wrap(" ".join(p.replace(" ", glue) for p in pieces), width, break_long_words=False,
                          break_on_hyphens=False)
    return "\n".join(lines).replace(glue, " ")


def widest_fitting(layouts: Sequence[T], build: Callable[[T], Table]) -> Table:
    """The table of the first of ``layouts`` (widest first) whose rows fit the terminal on one line each, measured
    at their natural width; the last (narrowest) where none does, and at once under :data:`COMPACT_BELOW`."""
    from rich.measure import Measurement

    console = out()
    unbounded = console.options.update_width(1 << 16)
    for layout in layouts[-1:] if compact() else layouts:
        table = build(layout)
        if layout == layouts[-1] or Measurement.get(console, unbounded, table).maximum <= console.width:
            break
    return table


def table(title: str, cols: Sequence[str], rows: Sequence[dict[str, str]], narrow: bool,
          wrapping: Sequence[str]) -> Table:
    """A table of ``rows`` (escaped) under ``cols``; a narrow layout gets the widths of :func:`_narrow_widths`."""
    from rich.table import Table

    drawn = Table(title=markup(title))
    widths = _narrow_widths(cols, rows, out().width, wrapping) if narrow else {}
    for col in cols:
        drawn.add_column(col, overflow="ellipsis" if col == "kernel" else "fold", no_wrap=col not in wrapping,
                         width=widths.get(col))
    for row in rows:
        drawn.add_row(*(markup(row[c]) for c in cols))
    return drawn


def _narrow_widths(cols: Sequence[str], rows: Sequence[dict[str, str]], width: int,
                   wrapping: Sequence[str]) -> dict[str, int]:
    """Column widths that fit ``width`` where they can: every cell on one line if that fits; else the kernel name
    gives way first (down to 8 characters, an ellipsis), then the ``wrapping`` columns wrap between words, the
    widest first, never narrower than their longest word, so no cell is cut mid-word or off the terminal's edge."""
    widths = {c: max([len(c), *(len(visible(r[c])) for r in rows)]) for c in cols}
    longest_word = {c: max([len(c), *(len(word) for r in rows for word in visible(r[c]).split())]) for c in wrapping}
    floor = {c: min(longest_word[c] if c in wrapping else 8 if c == "kernel" else widths[c], widths[c]) for c in cols}
    room = width - (len(cols) + 1) - 2 * len(cols)  # the box's rules and one space of padding either side
    for shrinking in (["kernel"], [c for c in cols if c in wrapping]):
        while sum(widths.values()) > room:
            movable = [c for c in shrinking if c in widths and widths[c] > floor[c]]
            if not movable:
                break
            widths[max(movable, key=lambda c: widths[c])] -= 1
    return widths


def fields(title: str, rows: Sequence[tuple[str, str]]) -> Table:
    """A two-column table of named values (escaped), without a header."""
    from rich.table import Table

    drawn = Table(title=markup(title), show_header=False)
    drawn.add_column("field", style="bold", no_wrap=True)
    drawn.add_column("value", overflow="fold")
    for field, value in rows:
        drawn.add_row(markup(field), markup(value))
    return drawn


# --- per-group bytes against the budget ----------------------------------------------------------------------------

#: Bars drawn per entry; the rest are summed into one line.
MAX_BARS = 12
_DOMINANT = re.compile(r"dominant=\(group_id=(\d+) arg=(\S+) .*bytes=(\d+)\)")


def short_reason(action: str, bounded: bool, estimated: int | None, budget: int, reason: str,
                 brief: bool = False) -> str:
    """A decision's reason in a few words: ``48.0 MiB > 256.0 KiB (in_ptr0 in group 1)``, ``not bounded:
    runtime_dependent``; ``brief`` leaves out the group."""
    if not bounded:
        cause = reason.split(" is not bounded: ", 1)[-1]
        return "not bounded: " + cause.split(":", 1)[0].strip()
    if action == "fallback" and reason.startswith("observed_oom"):
        return "observed OOM"
    if estimated is None:
        return reason
    shown, limit = format_bytes(estimated), format_bytes(budget)
    if shown == limit:  # rounded alike (2.0 MiB > 2.0 MiB): the exact bytes say which is larger
        shown, limit = f"{estimated} B", f"{budget} B"
    if action == "tune":
        return f"{shown} <= {limit}"
    dominant = _DOMINANT.search(reason)
    if not dominant:
        return f"{shown} > {limit}"
    return f"{shown} > {limit} ({dominant.group(2)}{'' if brief else f' in group {dominant.group(1)}'})"


def group_labels(plan: Mapping[str, Any], group_ids: Iterable[int]) -> dict[int, str]:
    """``{group id: "x0 in (8, 16]"}`` from the plan's group features (``group N`` where the plan has none)."""
    ids = list(group_ids)
    try:
        from prescreen.plan import GroupFeature
        from prescreen.representatives import decode_bucket_indices

        features = tuple(GroupFeature.from_payload(f) for f in plan.get("group_features") or ())
    except (ValueError, TypeError):
        features = ()
    if not features:  # an Inductor selection: one group, its family the plan's axis labels
        family = ", ".join(str(pair[1]) for pair in plan.get("axis_labels") or () if len(pair) == 2)
        return {g: family or f"group {g}" for g in ids}
    labels = {}
    for g in ids:
        parts = []
        for feature, idx in zip(features, decode_bucket_indices(g, features)):
            lower = feature.buckets[idx - 1] if idx > 0 else 0
            upper = feature.buckets[idx] if idx < len(feature.buckets) else None
            parts.append(f"{feature.name} > {lower}" if upper is None else f"{feature.name} in ({lower}, {upper}]")
        labels[g] = ", ".join(parts)
    return labels


class Bars:
    """One entry's per-group bytes, largest first, with the budget and the dominant arg."""

    def __init__(self, entry: Entry, limit: int = MAX_BARS) -> None:
        d = entry.decision
        self.key, self.kernel, self.budget = entry.key, entry.kernel, d.budget_bytes
        ranked = sorted(d.group_bytes, key=lambda gb: (-gb[1], gb[0]))
        labels = group_labels(entry.plan, [g for g, _ in ranked[:limit]])
        self.rows: list[tuple[int, str, int]] = [(g, labels[g], b) for g, b in ranked[:limit]]
        rest = ranked[limit:]
        self.rest_count, self.rest_max = len(rest), max((b for _, b in rest), default=0)
        self.over = sum(b > self.budget for _, b in ranked)
        self.groups = len(ranked)
        arg = d.dominant_arg
        self.dominant = (arg.group_id, arg.name, arg.num_bytes) if arg is not None else None
        self.reason = short_reason(d.action, d.bounded, d.estimated_bytes, d.budget_bytes, d.reason)
        self.scale = max([self.budget, *(b for _, _, b in self.rows)]) or 1

    def caption(self) -> str:
        if not self.groups:
            return "no per-group bytes (the footprint was not bounded)"
        text = f"{self.over} of {self.groups} groups over the budget {format_bytes(self.budget)}"
        if self.dominant:
            g, name, nbytes = self.dominant
            text += f"; dominant arg {name} ({format_bytes(nbytes)}) in group {g}"
        return text


def bar_chart(entry: Entry, width: int = 80) -> RenderableType:
    """The terminal chart: one bar per group (largest first), ``│`` where the budget is, over-budget bars red."""
    from rich.console import Group
    from rich.text import Text

    bars = Bars(entry)
    lines: list[Text] = [Text(visible(f"per-group bytes vs budget ({bars.caption()})"), style="bold")]
    if not bars.rows:
        return Group(*lines)
    label_w = min(max(len(visible(label)) for _, label, _ in bars.rows), max(12, width // 3))
    size_w = max(len(format_bytes(b)) for _, _, b in bars.rows)
    bar_w = max(10, width - label_w - size_w - 6)
    mark = min(bar_w - 1, round(bars.budget / bars.scale * bar_w))
    for g, label, nbytes in bars.rows:
        filled = max(1 if nbytes else 0, round(nbytes / bars.scale * bar_w))
        cells = "".join("█" if i < filled else ("│" if i == mark else " ") for i in range(bar_w))
        if mark < filled:
            cells = cells[:mark] + "│" + cells[mark + 1:]
        star = "*" if bars.dominant and bars.dominant[0] == g else " "
        line = Text(f"{visible(label)[:label_w]:<{label_w}} ")
        line.append(cells, style="red" if nbytes > bars.budget else "green")
        line.append(f" {format_bytes(nbytes):>{size_w}}{star}")
        lines.append(line)
    if bars.rest_count:
        lines.append(Text(f"... {bars.rest_count} more groups, none above {format_bytes(bars.rest_max)}", style="dim"))
    legend = f"budget {format_bytes(bars.budget)} at │"
    if bars.dominant:
        legend += f"   * group of the dominant arg {bars.dominant[1]}"
    lines.append(Text(visible(legend), style="dim"))
    return Group(*lines)


def _svg(bars: Bars, width: int = 720) -> str:
    row_h, label_w, pad = 22, 220, 8
    bar_w = width - label_w - 110
    height = row_h * max(1, len(bars.rows)) + 2 * pad
    x_budget = label_w + bars.budget / bars.scale * bar_w
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for i, (g, label, nbytes) in enumerate(bars.rows):
        y = pad + i * row_h
        w = max(1.0, nbytes / bars.scale * bar_w)
        color = "#c0392b" if nbytes > bars.budget else "#27ae60"
        svg.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">{html.escape(label)}</text>')
        svg.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{color}">'
                   f'<title>group {g}: {nbytes} bytes</title></rect>')
        svg.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 15}" font-size="12">{format_bytes(nbytes)}</text>')
    svg.append(f'<line x1="{x_budget:.1f}" x2="{x_budget:.1f}" y1="0" y2="{height}" stroke="#000" '
               f'stroke-dasharray="4 3"><title>budget {bars.budget} bytes</title></line></svg>')
    return "".join(svg)


def write_html(entries: Sequence[Entry], path: str | Path, title: str) -> int:
    """One self-contained HTML page: a chart and the exact numbers for each entry. Returns the entries written."""
    sections = []
    for e in entries:
        bars = Bars(e)
        rows = "".join(
            f"<tr><td>{g}</td><td>{html.escape(label)}</td><td class=n>{nbytes}</td><td class=n>"
            f"{format_bytes(nbytes)}</td><td>{'over' if nbytes > bars.budget else 'fits'}</td></tr>"
            for g, label, nbytes in bars.rows)
        if bars.rest_count:
            rows += f"<tr><td colspan=5>... {bars.rest_count} more groups, none above {bars.rest_max} bytes</td></tr>"
        p = e.parts
        sections.append(
            f"<section><h2>{html.escape(e.kernel)} <code>{e.key[:12]}</code></h2>"
            f"<p>{html.escape(p.device_kind)} {format_bytes(p.total_memory)} x {p.ratio:g}: budget "
            f"<b>{bars.budget}</b> bytes ({format_bytes(bars.budget)}); decision <b>{e.decision.action}</b>: "
            f"{html.escape(bars.reason)}</p><p>{html.escape(bars.caption())}</p>"
            + (_svg(bars) if bars.rows else "")
            + "<table><tr><th>group</th><th>shape family</th><th>bytes</th><th></th><th></th></tr>"
            + rows + "</table></section>")
    made = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    page = (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}"
        "td,th{padding:2px 8px;text-align:left}.n{text-align:right;font-family:monospace}"
        "section{border-top:1px solid #ccc;margin-top:1.5em}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{len(entries)} fallbacks, written {made}.</p>"
        + ("".join(sections) or "<p>No fallbacks in the store.</p>") + "</body></html>\n")
    try:
        Path(path).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    return len(entries)


def write_png(entries: Sequence[Entry], path: str | Path) -> int:
    """The same charts as one PNG (needs matplotlib: ``pip install 'prescreen[plot]'``)."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError("--png needs matplotlib, which is not installed (pip install 'prescreen[plot]')") from None
    charts = [Bars(e) for e in entries]
    height = sum(1.2 + 0.35 * len(bars.rows) for bars in charts) or 2.0
    fig, axes = plt.subplots(max(1, len(charts)), 1, figsize=(9, height), squeeze=False)
    for ax, bars in zip(axes[:, 0], charts):
        labels = [label for _, label, _ in bars.rows][::-1]
        values = [nbytes for _, _, nbytes in bars.rows][::-1]
        ax.barh(labels, values, color=["#c0392b" if v > bars.budget else "#27ae60" for v in values])
        ax.axvline(bars.budget, color="black", linestyle="--", label=f"budget {format_bytes(bars.budget)}")
        ax.set_title(f"{bars.kernel} {bars.key[:12]}: {bars.caption()}", fontsize=8)
        ax.set_xlabel("bytes")
        ax.legend(fontsize=7)
    if not charts:
        axes[0, 0].text(0.5, 0.5, "No fallbacks in the store.", ha="center")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return len(charts)
