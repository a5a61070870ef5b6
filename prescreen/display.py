"""Untrusted text made safe to print: kernel names, paths and reasons read from the store or a plans file.

A store is shared (a fleet's Redis, a cache baked into an image), so anything it holds may have been
written to attack the terminal that shows it: an escape sequence that writes the clipboard (OSC 52),
sets the window title or clears the screen, or rich markup (``[/]``) that makes rich raise. Every
CLI output passes such text through :func:`visible` (plain output) or :func:`markup` (text rich
parses): control characters become visible escapes (``\\x1b``), markup becomes literal text.
It also holds the consoles and table layouts the commands share (80 columns and up). Standard library
only at import; rich is imported by the functions that draw.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table

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


# --- rich output that fits the terminal ----------------------------------------------------------------------------

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


def wrap_items(head: str, items: Sequence[str], width: int) -> str:
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


def fill(table: Table, cols: Sequence[str], rows: Sequence[dict[str, str]], narrow: bool,
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
