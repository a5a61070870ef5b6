"""What the store commands select and check: entry predicates, the duration parser for ``--older-than`` and
``verify_entry`` for ``inspect --verify``."""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable

from prescreen.budget import Budget
from prescreen.decision import decide
from prescreen.errors import ConfigError
from prescreen.key import plan_hashes
from prescreen.plan import KernelPlan
from prescreen.store.entry import Entry, InvalidEntry

Predicate = Callable[[Entry], bool]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds from ``45s``, ``30m``, ``12h``, ``7d``, ``2w`` (a bare number is seconds)."""
    match = _DURATION_RE.match(text.lower()) if isinstance(text, str) else None
    if not match:
        raise ConfigError(
            f"invalid duration {text!r} (expected a number and a unit s, m, h, d or w, e.g. 7d, 12h, 30m)"
        )
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def match_key_prefix(prefix: str) -> Predicate:
    """Entries whose key starts with ``prefix`` (hex, as ``prescreen inspect`` prints keys)."""
    prefix = prefix.strip().lower()
    if not re.fullmatch("[0-9a-f]+", prefix):
        raise ConfigError(f"invalid key prefix {prefix!r} (expected hex digits of a key)")
    return lambda entry: entry.key.startswith(prefix)


def match_kernel(pattern: str) -> Predicate:
    """Entries whose kernel name contains ``pattern``, or matches it as a glob (``triton_poi_*_3``)."""
    if not pattern:
        raise ConfigError("empty kernel name")
    if any(c in pattern for c in "*?["):
        return lambda entry: fnmatch.fnmatchcase(entry.kernel, pattern)
    return lambda entry: pattern in entry.kernel


def match_device(kind: str) -> Predicate:
    """Entries decided for this device kind (``npu``, ``cuda``, ``cpu``)."""
    kind = kind.strip().lower()
    if not kind:
        raise ConfigError("empty device kind")
    return lambda entry: entry.parts.device_kind.lower() == kind


def match_older_than(seconds: float, now: float | None = None) -> Predicate:
    """Entries created more than ``seconds`` before ``now``."""
    if seconds < 0:
        raise ConfigError(f"older-than must not be negative, got {seconds}")
    cutoff = (time.time() if now is None else now) - seconds
    return lambda entry: entry.created_at < cutoff


def match_all() -> Predicate:
    """Every entry (``clear --all``, and a listing with no filter)."""
    return lambda entry: True


def build_predicate(
    *,
    everything: bool = False,
    key_prefix: str | None = None,
    kernel: str | None = None,
    device: str | None = None,
    older_than: str | float | None = None,
    now: float | None = None,
) -> Predicate:
    """The conjunction of the given filters; ``everything`` alone selects all. At least one is required."""
    preds: list[Predicate] = []
    if key_prefix is not None:
        preds.append(match_key_prefix(key_prefix))
    if kernel is not None:
        preds.append(match_kernel(kernel))
    if device is not None:
        preds.append(match_device(device))
    if older_than is not None:
        seconds = parse_duration(older_than) if isinstance(older_than, str) else float(older_than)
        preds.append(match_older_than(seconds, now))
    if everything:
        if preds:
            raise ConfigError("--all cannot be combined with other filters")
        return match_all()
    if not preds:
        raise ConfigError("nothing selected: pass --all or a filter (key prefix, kernel, device, older-than)")
    return lambda entry: all(p(entry) for p in preds)


def verify_entry(entry: Entry) -> bool:
    """True when the entry's stored plan hashes to its key's plan and family hashes, has its dynamic flag, and a
    fresh ``decide`` for it gives exactly its decision; a plan that does not decode or parse is False."""
    try:
        plan = KernelPlan.from_payload(entry.plan)
    except (InvalidEntry, ValueError):  # NotBounded is a ValueError
        return False
    budget = Budget(entry.parts.device_kind, entry.parts.total_memory, entry.parts.ratio)
    if plan.is_dynamic != entry.dynamic or plan_hashes(plan) != (entry.parts.plan_hash, entry.parts.family_hash):
        return False
    return decide(plan, budget) == entry.decision
