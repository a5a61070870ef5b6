"""Shape families of Inductor selections: one bucket of size hints per dynamic symbol.

Keying a decision by the exact hint would make every new batch size a miss, so each dynamic symbol's hint
is put in a bucket ``(low, high]`` and the decision is estimated and keyed at ``high``: every expression the
estimator accepts grows with its symbols, so ``high`` never undercounts a hint inside the bucket.
``$PRESCREEN_SHAPE_BUCKETS`` is ``pow2`` (default: 1, 2, (2, 4], (4, 8], ...), ``exact``, or ascending
bounds ``B1,...,Bn`` (then powers of two above ``Bn``). A symbol's ShapeEnv value range clamps its bucket;
hints below 1 are exact. Imports neither torch nor sympy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from prescreen.errors import ConfigError

BUCKETS_ENV = "PRESCREEN_SHAPE_BUCKETS"
DEFAULT_SCHEME = "pow2"

log = logging.getLogger("prescreen.families")


@dataclasses.dataclass(frozen=True, slots=True)
class Bucket:
    """The hints ``low < h <= high``; a decision for the bucket is made at ``high``."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low >= self.high:
            raise ValueError(f"empty bucket ({self.low}, {self.high}]")

    def __contains__(self, hint: object) -> bool:
        return isinstance(hint, int) and self.low < hint <= self.high

    @property
    def exact(self) -> bool:
        """True when the bucket holds one hint."""
        return self.high - self.low == 1

    def clamp(self, lower: int | None, upper: int | None) -> Bucket:
        """The bucket cut to the value range ``[lower, upper]`` (None: unbounded); itself if that leaves nothing."""
        low = self.low if lower is None else max(self.low, lower - 1)
        high = self.high if upper is None else min(self.high, upper)
        return Bucket(low, high) if low < high else self

    def describe(self, name: str) -> str:
        """``batch in (2048, 4096]``, or ``batch=2`` for a one-hint bucket."""
        return f"{name}={self.high}" if self.exact else f"{name} in ({self.low}, {self.high}]"


def _pow2_bucket(hint: int, floor: int = 0) -> Bucket:
    high = 1 << max(hint - 1, 0).bit_length()  # the smallest power of two >= hint
    return Bucket(max(high // 2, floor), high)


@dataclasses.dataclass(frozen=True, slots=True)
class Scheme:
    """How hints are bucketed: ``kind`` is ``pow2``, ``exact`` or ``bounds`` (with ``bounds`` ascending)."""

    kind: str
    bounds: tuple[int, ...] = ()

    def bucket(self, hint: int) -> Bucket:
        """The bucket holding ``hint`` (unclamped)."""
        if hint < 1 or self.kind == "exact":
            return Bucket(hint - 1, hint)
        if self.kind == "bounds":
            low = 0
            for bound in self.bounds:
                if hint <= bound:
                    return Bucket(low, bound)
                low = bound
            return _pow2_bucket(hint, floor=low)
        return _pow2_bucket(hint)

    def covering(self, low: int, high: int) -> tuple[Bucket, ...]:
        """The buckets holding some hint in ``[low, high]``, ascending, each cut to that range."""
        if low > high:
            raise ValueError(f"empty range {low}..{high}")
        out: list[Bucket] = []
        hint = low
        while hint <= high:
            bucket = self.bucket(hint).clamp(low, high)
            out.append(bucket)
            hint = bucket.high + 1
        return tuple(out)

    def __str__(self) -> str:
        return ",".join(map(str, self.bounds)) if self.kind == "bounds" else self.kind


@functools.lru_cache(maxsize=16)
def parse_scheme(text: str) -> Scheme:
    """``pow2``, ``exact`` or ``B1,B2,...`` -> Scheme; a ConfigError names a bad value."""
    value = text.strip().lower()
    if value in ("", "pow2"):
        return Scheme("pow2")
    if value == "exact":
        return Scheme("exact")
    try:
        bounds = tuple(int(part) for part in value.split(","))
    except ValueError:
        bounds = ()
    if not bounds or any(b < 1 for b in bounds) or any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ConfigError(f"{BUCKETS_ENV}={text!r} is not 'pow2', 'exact' or strictly ascending whole numbers "
                          ">= 1 separated by commas (e.g. 64,512,4096)")
    return Scheme("bounds", bounds)


def scheme_from_env(environ: Mapping[str, str] | None = None) -> Scheme:
    """The scheme ``$PRESCREEN_SHAPE_BUCKETS`` asks for; a ConfigError names a bad value."""
    return parse_scheme((os.environ if environ is None else environ).get(BUCKETS_ENV, DEFAULT_SCHEME))


def active_scheme() -> Scheme:
    """The scheme for a compile: a bad ``$PRESCREEN_SHAPE_BUCKETS`` warns once and gives the default (a bad
    setting must not leave a compile unguarded)."""
    try:
        return scheme_from_env()
    except ConfigError as exc:
        _warn_once(str(exc))
        return parse_scheme(DEFAULT_SCHEME)


@functools.lru_cache(maxsize=8)
def _warn_once(message: str) -> None:
    log.warning("prescreen: %s; using %s buckets", message, DEFAULT_SCHEME)


def _as_int(value: object) -> int | None:
    """A finite whole number (int or sympy Integer), else None (``int_oo``, ``oo``, anything else)."""
    if isinstance(value, int):
        return None if isinstance(value, bool) else value
    numerator = getattr(value, "p", None) if getattr(value, "is_Integer", False) is True else None
    return numerator if type(numerator) is int else None  # a sympy Integer's own int: no printing


def symbol_range(shape_env: Any, symbol: Any) -> tuple[int | None, int | None]:
    """The ShapeEnv's value range of ``symbol`` as (lower, upper), None where unknown or infinite
    (``bound_sympy``, else ``var_to_range``; anything else is no bound)."""
    if shape_env is None:
        return None, None
    found: Any = None
    try:
        found = shape_env.bound_sympy(symbol)
    except Exception:
        try:
            found = getattr(shape_env, "var_to_range", {}).get(symbol)
        except Exception:
            found = None
    if found is None:
        return None, None
    return _as_int(getattr(found, "lower", None)), _as_int(getattr(found, "upper", None))


# ---------------------------------------------------------------- names from ``warm``

_names: dict[int, str] = {}
_point: dict[str, int] = {}  # the sizes being compiled
_also: list[dict[str, int]] = []  # other sizes this lowering decides too (``warm --plan-only``)
_dropped: list[dict[str, int]] = []  # of those, the ones a plan could not be carried to
_remap: dict[int, int] = {}  # while retargeting: a named size of the compiled point -> the target's size


class NotRetargetable(Exception):
    """A plan holds an expression taken at a hint that retargeting would change."""


@contextlib.contextmanager
def naming(sizes: Mapping[str, int], also: list[dict[str, int]] | None = None) -> Iterator[None]:
    """While a ``warm`` compile runs: a symbol whose hint is one shape's size is labelled with its name; ``also``
    are the other sizes the guards decide for from this one lowering (see :func:`retargeting`)."""
    global _names, _point, _also, _dropped
    previous = _names, _point, _also, _dropped
    by_value: dict[int, list[str]] = {}
    for name, value in sizes.items():
        by_value.setdefault(int(value), []).append(name)
    _names = {value: names[0] for value, names in by_value.items() if len(names) == 1}  # ambiguous: no name
    _point, _also, _dropped = dict(sizes), list(also or []), []
    try:
        yield
    finally:
        _names, _point, _also, _dropped = previous


def name_for(hint: int) -> str | None:
    """The shape name ``warm`` compiled at ``hint``, if exactly one has that size."""
    return _names.get(hint)


def current_point() -> dict[str, int]:
    """The sizes decisions are being made for: the compiled point's, or a retargeting's target."""
    return dict(_point)


def also_deciding() -> list[dict[str, int]]:
    """The other sizes this lowering decides for (empty outside ``warm --plan-only``), less the dropped ones."""
    return [t for t in _also if t not in _dropped]


@contextlib.contextmanager
def retargeting(target: Mapping[str, int]) -> Iterator[None]:
    """Plans built inside the block take each named size of the compiled point at ``target``'s value, as the
    same graph lowered at ``target`` would (one lowering decides several families). A plan that cannot
    (:class:`NotRetargetable`) drops ``target``: it gets its own lowering."""
    global _remap
    remap = {value: int(target[name]) for value, name in _names.items() if name in target}
    dropped_here = _dropped  # naming(target) sets its own list; the compiled point's is this one
    try:
        with naming(target):
            _remap = remap
            yield
    except NotRetargetable:
        dropped_here.append(dict(target))
    finally:
        _remap = {}


def retarget(hint: int) -> int:
    """``hint`` as the retargeting's target has it (itself outside :func:`retargeting`)."""
    return _remap.get(hint, hint)


def point_of(bucket: Bucket, index: int = 0) -> int:
    """The size ``warm`` compiles a bucket at for its ``index``-th shape (any size in it gives the same key):
    not the bound, which Dynamo's duck sizing could merge with an equal model dim; ``index`` keeps shapes apart."""
    return max(bucket.high - 1 - index, bucket.low + 1)
