"""Store keys: sha256 over plan, shape family, device, ratio and versions."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import threading
from collections.abc import Callable
from importlib import metadata

from prescreen.budget import Budget
from prescreen.decision import ESTIMATOR_VERSION
from prescreen.expr import Add, Axis, Const, Expr, FloorDiv, Mul, RuntimeArg
from prescreen.plan import KernelPlan, SizeArg, TensorArg, WorkspaceArg, canonical_json

#: Bumped whenever the stored entry layout changes.
SCHEMA_VERSION = 3  # 2: the plan is one JSON string field of the entry; 3: the plan is the stored text's second line


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
        return hashlib.sha256(canonical_json(self.to_payload()).encode()).hexdigest()


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


def _expr_text(expr: Expr) -> str:
    kind = expr.__class__
    if kind is Axis:
        return '{"axis_name":' + _s(expr.name) + "}"  # type: ignore[union-attr]
    if kind is Const:
        return '{"const":' + _i(expr.value) + "}"  # type: ignore[union-attr]
    if kind is Mul:
        return '{"mul":[' + ",".join([_expr_text(e) for e in expr.operands]) + "]}"  # type: ignore[union-attr]
    if kind is Add:
        return '{"add":[' + ",".join([_expr_text(e) for e in expr.operands]) + "]}"  # type: ignore[union-attr]
    if kind is FloorDiv:
        return ('{"floordiv":[' + _expr_text(expr.numerator) + ","  # type: ignore[union-attr]
                + _expr_text(expr.denominator) + "]}")  # type: ignore[union-attr]
    if kind is RuntimeArg:
        return '{"runtime_arg_index":' + _i(expr.index) + "}"  # type: ignore[union-attr]
    raise _Other


def _exprs_text(exprs: tuple[Expr, ...]) -> str:
    return "[" + ",".join([_expr_text(e) for e in exprs]) + "]"


def _arg_text(arg: object, shapes: dict[object, tuple[str, str]]) -> str:
    kind = arg.__class__
    if kind is TensorArg:
        a: TensorArg = arg  # type: ignore[assignment]
        if a.source not in ("buffer", "constant"):
            raise _Other
        shape = (a.size, a.stride)  # buffers of one shape are common: their text is written once
        texts = shapes.get(shape)
        if texts is None:
            texts = shapes[shape] = (_exprs_text(a.size), _exprs_text(a.stride))
        return ('{"device":' + _s(a.device) + ',"dtype":' + _s(a.dtype) + ',"kind":"tensor","name":' + _s(a.name)
                + ',"size_exprs":' + texts[0] + ',"source":' + _s(a.source) + ',"stride_exprs":' + texts[1] + "}")
    if kind is WorkspaceArg:
        w: WorkspaceArg = arg  # type: ignore[assignment]
        return ('{"count_expr":' + _expr_text(w.count) + ',"device":' + _s(w.device) + ',"dtype":' + _s(w.dtype)
                + ',"kind":"workspace","name":' + _s(w.name) + ',"source":"workspace","zero_mode":'
                + _s(w.zero_mode) + "}")
    if kind is SizeArg:
        z: SizeArg = arg  # type: ignore[assignment]
        if z.source == "runtime_arg":
            index = "null" if z.index is None else _i(z.index)
            return '{"index":' + index + ',"kind":"size","name":' + _s(z.name) + ',"source":"runtime_arg"}'
        if z.source == "axis_expr" and z.expr is not None:
            return '{"expr":' + _expr_text(z.expr) + ',"kind":"size","name":' + _s(z.name) + ',"source":"axis_expr"}'
    raise _Other


def _names_text(names: object) -> str:
    return "[" + ",".join(map(_s, names)) + "]"  # type: ignore[call-overload]


def _features_text(plan: KernelPlan) -> str:
    return ",".join([
        '{"axis_names":' + _names_text(f.axis_names) + ',"buckets":[' + ",".join([_i(b) for b in f.buckets])
        + '],"name":' + _s(f.name) + ',"source":' + _s(f.source) + "}"
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
        shapes: dict[object, tuple[str, str]] = {}
        if any(n.__class__ is not str for n in mutated):
            raise _Other
        text = (head + ',"mutated_arg_names":' + _names_text(sorted(mutated)) + ',"ordered_arg_specs":['
                + ",".join([_arg_text(a, shapes) for a in plan.args]) + "]}")
        return head + "}", text
    except (_Other, TypeError, ValueError):
        canonical = plan.canonical_payload()
        return canonical_json(_family_of(canonical)), canonical_json(canonical)


def payload_text(plan: KernelPlan) -> str:
    """``canonical_json(plan.to_payload())``, written directly (what an entry stores as its plan)."""
    try:
        shapes: dict[object, tuple[str, str]] = {}
        labels = ('"axis_labels":' + _pairs_text(plan.axis_labels, _s) + ",") if plan.axis_labels else ""
        return ("{" + labels + '"axis_names":' + _names_text(plan.axis_names) + ',"axis_static_values":'
                + _pairs_text(plan.axis_static_values, _i) + ',"group_features":[' + _features_text(plan)
                + '],"kernel_name":' + _s(plan.kernel_name) + ',"mutated_arg_names":'
                + _names_text(plan.mutated_arg_names) + ',"ordered_arg_specs":['
                + ",".join([_arg_text(a, shapes) for a in plan.args]) + "]}")
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
