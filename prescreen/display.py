"""Untrusted text made safe to print: kernel names, paths and reasons read from the store or a plans file.

A store is shared (a fleet's Redis, a cache baked into an image), so anything it holds may have been
written to attack the terminal that shows it: an escape sequence that writes the clipboard (OSC 52),
sets the window title or clears the screen, or rich markup (``[/]``) that makes rich raise. Every
CLI output passes such text through :func:`visible` (plain output) or :func:`markup` (text rich
parses): control characters become visible escapes (``\\x1b``), markup becomes literal text.
Standard library only; rich is imported only by :func:`markup`.
"""

from __future__ import annotations

import re

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
