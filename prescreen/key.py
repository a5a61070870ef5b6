"""Store keys: sha256 over plan, shape family, device, ratio and versions."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import threading
from collections.abc import Callable
from importlib import metadata
from typing import TypeVar

from prescreen.budget import Budget
from prescreen.decision import ESTIMATOR_VERSION
from prescreen.expr import Add, Axis, Const, Expr, FloorDiv, Mul, RuntimeArg
from prescreen.plan import KernelPlan, SizeArg, TensorArg, WorkspaceArg, canonical_json

#: Bumped whenever the stored entry layout changes.
SCHEMA_VERSION = 5  # 2: the plan is one JSON string field of the entry; 3: the plan is the stored text's second line;
# 4: the decision's per-group bytes and dominant argument on a line of their own, between the head and the plan;
# 5: the key parts, kernel, family, provenance and hits on a record line of their own, after the details


@functools.cache
def library_versions() -> tuple[tuple[str, str], ...]:
    """Versions of the libraries whose behaviour a decision depends on ("absent" where not installed)."""
    return tuple((dist, _version(dist)) for dist in ("torch", "torch_npu", "triton", "triton-ascend"))


def _version(dist: str) -> str:
    """``importlib.metadata.version(dist)``, read from the metadata's header lines only.

    ``metadata.version`` parses the whole METADATA file (torch's long description
    included) with the email parser: 2 to 200 ms in a process's first lookup,
    inside its first compile. The ``Version:`` header comes before the first
    blank line.
    """
    try:
        found = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return "absent"
    text = found.read_text("METADATA") or found.read_text("PKG-INFO") or ""
    for line in text.splitlines():
        if not line:
            break
        if line.startswith("Version:"):
            return line[len("Version:"):].strip()
    return found.version  # an unusual file: the full parser


@dataclasses.dataclass(frozen=True, slots=True)
class KeyParts:
    """Everything a key is made of; shown by ``prescreen inspect KEY``."""

    plan_hash: str
    family_hash: str
    device_kind: str
    total_memory: int
    ratio: float
    schema_version: int
    estimator_version: int
    versions: tuple[tuple[str, str], ...]

    def to_payload(self) -> dict[str, object]:
        # Not dataclasses.asdict: this runs twice per lookup and asdict deep-copies every field.
        d: dict[str, object] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["versions"] = dict(self.versions)
        return d

    def digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()

    def text(self) -> str:
        """``canonical_json(self.to_payload())``, written directly where every field has its usual type."""
        try:
            ratio_text = _number_text[self.ratio.__class__]
            versions_text = _versions_text(self.versions)
            if (self.total_memory.__class__ is not int or self.schema_version.__class__ is not int
                    or self.estimator_version.__class__ is not int):
                raise ValueError("not an int")
            return (f'{{"device_kind":{_quote(self.device_kind)},"estimator_version":{_int_text(self.estimator_version)},'
                    f'"family_hash":{_quote(self.family_hash)},"plan_hash":{_quote(self.plan_hash)},'
                    f'"ratio":{ratio_text(self.ratio)},"schema_version":{_int_text(self.schema_version)},'
                    f'"total_memory":{_int_text(self.total_memory)},"versions":{versions_text}}}')
        except (KeyError, TypeError, ValueError):  # a field of another type (json writes it), an int too long to write
            return canonical_json(self.to_payload())


def _finite_repr(value: float) -> str:
    """What json writes for a float: its repr when finite (json writes NaN and Infinity otherwise)."""
    if value != value or value in (math.inf, -math.inf):
        raise ValueError("not a finite float")
    return float.__repr__(value)


# KeyParts.text: how json writes a ratio of each usual type.
_number_text: dict[type, Callable[[object], str]] = {int: int.__repr__, float: _finite_repr}  # type: ignore[dict-item]


@functools.lru_cache(maxsize=16)
def _versions_text(versions: tuple[tuple[str, str], ...]) -> str:
    """The versions' JSON text (a process's keys nearly all hold ``library_versions()``)."""
    return canonical_json(dict(versions))


_FAMILY_FIELDS = ("group_features", "axis_names", "axis_static_values")


def _sha(value: object) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def family_payload(plan: KernelPlan) -> dict[str, object]:
    """What defines a plan's shape families: features, axes and static axis values.

    The representatives are a pure function of this (for one estimator
    version), so hashing it identifies them without enumerating every group.
    """
    return _family_of(plan.canonical_payload())


def _family_of(canonical: dict[str, object]) -> dict[str, object]:
    return {k: canonical[k] for k in _FAMILY_FIELDS}


def family_hash(plan: KernelPlan) -> str:
    """sha256 of the shape-family definition."""
    return _sha(family_payload(plan))


# --- The canonical text, written directly ----------------------------------------------------------
#
# ``canonical_json(plan.canonical_payload())`` builds the payload's nested dicts and has
# ``json.dumps`` sort their keys; for a 16-argument plan that costs several times what
# deciding it does. ``canonical_texts`` writes the very same text (byte for byte: keys
# stay what they were) straight from the typed plan, keys in their sorted order, strings
# through json's own C encoder and exact ints through ``int.__repr__`` as json does. A
# value of any other type (a hand-built plan holding a bool or a list) leaves it to the
# general path. The family text is the plan text's first three fields.
#
# The expressions are most of the work (a 16-argument plan has ~130 nodes). Buffers of one
# shape are common, but finding them costs more than writing them: a frozen dataclass's
# ``__hash__`` and ``__eq__`` are Python functions, recursive over the tree. So each node is
# written, with no memo of whole shapes; the text of a leaf (an axis by its name, a constant
# by its value: both hash in C) comes from a small process-wide table instead, as do a tensor's
# device, dtype and name, and the usual nodes among a list's items (axes, constants, products)
# are written without a call of their own.

_quote = json.encoder.encode_basestring_ascii
_int_text = int.__repr__


class _Other(Exception):
    """A value the direct writer does not cover: use ``canonical_json``."""


# A JSON string: json's own C encoder, which raises TypeError for anything but a str (caught by the callers,
# which then take the general path), so no check of our own is needed.
_s: Callable[[object], str] = _quote  # type: ignore[assignment]


def _i(value: object) -> str:
    if value.__class__ is not int:
        raise _Other
    return _int_text(value)


#: How many leaf texts (axis names, constants) the tables below keep before they start over.
LEAF_MEMO_SIZE = 1024


K = TypeVar("K")


class _LeafTexts(dict[K, str]):
    """A bounded table: a leaf value -> its JSON text, written by ``write`` the first time (cleared when full).

    Strings: json's encoder raises TypeError for anything but a str (the caller then takes the
    general path), and a str subclass finds the text of the equal str, which is its own. Constants:
    callers look up exact ints only (``True == 1``).
    """

    def __init__(self, write: Callable[[K], str]) -> None:
        super().__init__()
        self.write = write

    def __missing__(self, value: K) -> str:
        text = self.write(value)
        if len(self) >= LEAF_MEMO_SIZE:
            self.clear()
        self[value] = text
        return text


# the device, dtype and name of tensors: few distinct ones in a process
_string_texts: _LeafTexts[str] = _LeafTexts(_quote)
_axis_texts: _LeafTexts[str] = _LeafTexts(lambda name: '{"axis_name":' + _quote(name) + "}")
_const_texts: _LeafTexts[int] = _LeafTexts(lambda value: '{"const":' + _int_text(value) + "}")


def _expr_text(expr: Expr) -> str:
    kind = expr.__class__
    if kind is Axis:
        return _axis_texts[expr.name]  # type: ignore[union-attr]
    if kind is Const:
        value = expr.value  # type: ignore[union-attr]
        if value.__class__ is not int:
            raise _Other
        return _const_texts[value]
    if kind is Mul:
        return '{"mul":[' + _exprs_text(expr.operands) + "]}"  # type: ignore[union-attr]
    if kind is Add:
        return '{"add":[' + _exprs_text(expr.operands) + "]}"  # type: ignore[union-attr]
    if kind is FloorDiv:
        return ('{"floordiv":[' + _expr_text(expr.numerator) + ","  # type: ignore[union-attr]
                + _expr_text(expr.denominator) + "]}")  # type: ignore[union-attr]
    if kind is RuntimeArg:
        return '{"runtime_arg_index":' + _i(expr.index) + "}"  # type: ignore[union-attr]
    raise _Other


def _exprs_text(exprs: tuple[Expr, ...]) -> str:
    """The items of a JSON list of expressions, comma-separated (no brackets).

    Axes, constants and products, the usual nodes, are written here without a call of their own.
    """
    axis_texts, const_texts = _axis_texts, _const_texts
    out = []
    for e in exprs:  # a loop, not a comprehension: in Python 3.11 that is one call more
        kind = e.__class__
        if kind is Axis:
            out.append(axis_texts[e.name])  # type: ignore[union-attr]
        elif kind is Const and e.value.__class__ is int:  # type: ignore[union-attr]
            out.append(const_texts[e.value])  # type: ignore[union-attr]
        elif kind is Mul:
            out.append('{"mul":[' + _exprs_text(e.operands) + "]}")  # type: ignore[union-attr]
        else:
            out.append(_expr_text(e))
    return ",".join(out)


_TENSOR_SOURCES = {"buffer": '"buffer"', "constant": '"constant"'}  # a tensor's source -> its JSON text


def _arg_text(arg: object) -> str:
    kind = arg.__class__
    if kind is TensorArg:
        a: TensorArg = arg  # type: ignore[assignment]
        source = _TENSOR_SOURCES.get(a.source)
        if source is None:
            raise _Other
        texts = _string_texts
        return (f'{{"device":{texts[a.device]},"dtype":{texts[a.dtype]},"kind":"tensor","name":{texts[a.name]},'
                f'"size_exprs":[{_exprs_text(a.size)}],"source":{source},"stride_exprs":[{_exprs_text(a.stride)}]}}')
    if kind is WorkspaceArg:
        w: WorkspaceArg = arg  # type: ignore[assignment]
        return (f'{{"count_expr":{_expr_text(w.count)},"device":{_s(w.device)},"dtype":{_s(w.dtype)},'
                f'"kind":"workspace","name":{_s(w.name)},"source":"workspace","zero_mode":{_s(w.zero_mode)}}}')
    if kind is SizeArg:
        z: SizeArg = arg  # type: ignore[assignment]
        if z.source == "runtime_arg":
            index = "null" if z.index is None else _i(z.index)
            return f'{{"index":{index},"kind":"size","name":{_s(z.name)},"source":"runtime_arg"}}'
        if z.source == "axis_expr" and z.expr is not None:
            return f'{{"expr":{_expr_text(z.expr)},"kind":"size","name":{_s(z.name)},"source":"axis_expr"}}'
    raise _Other


def _names_text(names: object) -> str:
    return "[" + ",".join(map(_s, names)) + "]"  # type: ignore[call-overload]


def _ints_text(values: tuple[int, ...]) -> str:
    """Exact ints, comma-separated (anything else: ``_Other``)."""
    if not set(map(type, values)) <= _INT_ONLY:
        raise _Other
    return ",".join(map(_int_text, values))


_INT_ONLY = {int}


def _features_text(plan: KernelPlan) -> str:
    return ",".join([
        f'{{"axis_names":{_names_text(f.axis_names)},"buckets":[{_ints_text(f.buckets)}],'
        f'"name":{_s(f.name)},"source":{_s(f.source)}}}'
        for f in plan.group_features
    ])


def _pairs_text(pairs: object, value: object) -> str:
    """``[[name, value], ...]`` of (str, int) pairs (``value`` is ``_i``) or (str, str) pairs (``_s``)."""
    out = []
    for pair in pairs:  # type: ignore[attr-defined]
        name, v = pair
        out.append("[" + _s(name) + "," + value(v) + "]")  # type: ignore[operator]
    return "[" + ",".join(out) + "]"


def canonical_texts(plan: KernelPlan) -> tuple[str, str]:
    """``(family text, plan text)``: ``canonical_json`` of ``family_payload(plan)`` and of ``plan.canonical_payload()``."""
    try:
        statics = dict(plan.axis_static_values)
        if any(k.__class__ is not str for k in statics):
            raise _Other
        head = ('{"axis_names":' + _names_text(plan.axis_names) + ',"axis_static_values":'
                + _pairs_text(sorted(statics.items()), _i) + ',"group_features":[' + _features_text(plan) + "]")
        mutated = set(plan.mutated_arg_names)
        if any(n.__class__ is not str for n in mutated):
            raise _Other
        text = (head + ',"mutated_arg_names":' + _names_text(sorted(mutated)) + ',"ordered_arg_specs":['
                + ",".join(map(_arg_text, plan.args)) + "]}")
        return head + "}", text
    except (_Other, TypeError, ValueError):
        canonical = plan.canonical_payload()
        return canonical_json(_family_of(canonical)), canonical_json(canonical)


def payload_text(plan: KernelPlan) -> str:
    """``canonical_json(plan.to_payload())``, written directly (what an entry stores as its plan)."""
    try:
        labels = ('"axis_labels":' + _pairs_text(plan.axis_labels, _s) + ",") if plan.axis_labels else ""
        return ("{" + labels + '"axis_names":' + _names_text(plan.axis_names) + ',"axis_static_values":'
                + _pairs_text(plan.axis_static_values, _i) + ',"group_features":[' + _features_text(plan)
                + '],"kernel_name":' + _s(plan.kernel_name) + ',"mutated_arg_names":'
                + _names_text(plan.mutated_arg_names) + ',"ordered_arg_specs":['
                + ",".join(map(_arg_text, plan.args)) + "]}")
    except (_Other, TypeError, ValueError):
        return canonical_json(plan.to_payload())


#: How many distinct plans' hashes ``plan_hashes`` remembers (least recently used dropped first).
HASH_MEMO_SIZE = 4096


_by_text: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()  # plan text -> hashes
_keys: dict[tuple[object, ...], tuple[str, "KeyParts"]] = {}
_parts_by_key: dict[str, "KeyParts"] = {}  # the keys ``build_key`` made in this process
_memo_lock = threading.Lock()
_generation = 0  # bumped by ``forget_plan_hashes``: what plan objects remember from before is not used


def plan_hashes(plan: KernelPlan) -> tuple[str, str]:
    """``(plan hash, family hash)`` of ``plan``, computed once per distinct plan in this process.

    The plan object remembers them (``KernelPlan.cache``), so the same object is
    answered without writing or hashing anything; an equal plan object writes its
    canonical text and finds the hashes in a bounded LRU keyed by that text (no
    sha256, and no recursive hash of the plan's dataclasses, which costs more
    than the sha256 it would save).
    """
    cache = plan.cache
    mine = cache.hashes
    if mine is not None and mine[0] == _generation:
        return mine[1]  # type: ignore[no-any-return]
    generation = _generation
    family, text = canonical_texts(plan)
    with _memo_lock:
        hashes = _by_text.get(text)
        if hashes is not None:
            _by_text.move_to_end(text)
    if hashes is None:
        hashes = hashlib.sha256(text.encode()).hexdigest(), hashlib.sha256(family.encode()).hexdigest()
        with _memo_lock:
            _by_text[text] = hashes
            if len(_by_text) > HASH_MEMO_SIZE:
                _by_text.popitem(last=False)
    cache.hashes = (generation, hashes, None, None)  # (generation, hashes, last budget, its (key, parts))
    return hashes


def forget_plan_hashes() -> None:
    """Empty the plan-hash and key memos (benchmarks use it to time a first lookup)."""
    global _generation
    with _memo_lock:
        _generation += 1
        _by_text.clear()
        _keys.clear()
        _parts_by_key.clear()


def known_parts(key: str) -> "KeyParts | None":
    """The parts ``build_key`` digested into ``key`` in this process, if it did (saves re-digesting them)."""
    return _parts_by_key.get(key)


def build_key(plan: KernelPlan, budget: Budget) -> tuple[str, KeyParts]:
    """The store key for deciding ``plan`` under ``budget``, and its parts (memoised, see ``plan_hashes``)."""
    mine = plan.cache.hashes
    if mine is not None and mine[2] is budget and mine[0] == _generation:
        return mine[3]  # type: ignore[no-any-return]
    plan_hash, fam_hash = plan_hashes(plan)
    # Types too: 1 == 1.0 == True, but the canonical JSON (so the key) tells them apart.
    memo_key = (plan_hash, fam_hash, budget.device_kind, budget.total_memory, type(budget.total_memory),
                budget.ratio, type(budget.ratio))
    result = _keys.get(memo_key)
    if result is None:
        result = _new_key(plan_hash, fam_hash, budget)
        with _memo_lock:
            if len(_keys) >= HASH_MEMO_SIZE:
                _keys.clear()
                _parts_by_key.clear()
            _keys[memo_key] = result
            _parts_by_key[result[0]] = result[1]
    cache = plan.cache
    mine = cache.hashes
    if mine is not None:
        cache.hashes = (mine[0], mine[1], budget, result)  # one store: threads see all or none
    return result


def _new_key(plan_hash: str, fam_hash: str, budget: Budget) -> tuple[str, KeyParts]:
    parts = KeyParts(
        plan_hash=plan_hash,
        family_hash=fam_hash,
        device_kind=budget.device_kind,
        total_memory=budget.total_memory,
        ratio=budget.ratio,
        schema_version=SCHEMA_VERSION,
        estimator_version=ESTIMATOR_VERSION,
        versions=library_versions(),
    )
    return parts.digest(), parts
