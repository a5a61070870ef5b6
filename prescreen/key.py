"""Store keys: sha256 over plan, shape family, device, ratio and versions."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import threading
from importlib import metadata

from prescreen.budget import Budget
from prescreen.decision import ESTIMATOR_VERSION
from prescreen.plan import KernelPlan, canonical_json

#: Bumped whenever the stored entry layout changes.
SCHEMA_VERSION = 2  # 2: the plan is one JSON string field of the entry, decoded only when needed


@functools.cache
def library_versions() -> tuple[tuple[str, str], ...]:
    """Versions of the libraries whose behaviour a decision depends on."""
    out = []
    for dist in ("torch", "torch_npu", "triton", "triton-ascend"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "absent"
        out.append((dist, version))
    return tuple(out)


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


#: How many distinct plans' hashes ``plan_hashes`` remembers (least recently used dropped first).
HASH_MEMO_SIZE = 4096
#: How many plan objects the identity fast path holds (it keeps them alive, so it stays small).
ID_MEMO_SIZE = 256


class _PlanKey:
    """A plan as a dict key, its (recursive, uncached) dataclass hash computed once."""

    __slots__ = ("plan", "hash")

    def __init__(self, plan: KernelPlan) -> None:
        self.plan = plan
        self.hash = hash(plan)  # TypeError for a hand-built plan holding a list

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PlanKey) and (other.plan is self.plan or other.plan == self.plan)


_by_value: collections.OrderedDict[_PlanKey, tuple[_PlanKey, tuple[str, str]]] = collections.OrderedDict()
# id(plan) -> [plan, (plan hash, family hash), last budget, (key, parts) for that budget]; the entry
# holds the plan object, so its id cannot be reused by another object while it is here.
_by_id: dict[int, list[object]] = {}
_keys: dict[tuple[object, ...], tuple[str, "KeyParts"]] = {}
_parts_by_key: dict[str, "KeyParts"] = {}  # the keys ``build_key`` made in this process
_memo_lock = threading.Lock()


def plan_hashes(plan: KernelPlan) -> tuple[str, str]:
    """``(plan hash, family hash)`` of ``plan``, computed once per distinct plan in this process.

    Hashing the canonical JSON costs about as much as a store hit, so it is
    remembered in a bounded LRU keyed by the (frozen, hashable) plan's value;
    the same plan *object* is found by identity without hashing its fields.
    """
    found = _by_id.get(id(plan))
    if found is not None and found[0] is plan:
        return found[1]  # type: ignore[return-value]
    try:
        pkey = _PlanKey(plan)
    except TypeError:  # not hashable: no memo
        return _hash_plan(plan)
    with _memo_lock:
        hit = _by_value.get(pkey)
        if hit is not None:
            _by_value.move_to_end(hit[0])
    if hit is not None:
        hashes = hit[1]
    else:
        hashes = _hash_plan(plan)
        with _memo_lock:
            _by_value[pkey] = (pkey, hashes)
            if len(_by_value) > HASH_MEMO_SIZE:
                _by_value.popitem(last=False)
    with _memo_lock:
        if len(_by_id) >= ID_MEMO_SIZE:
            _by_id.clear()  # identity is only the fast path; the value memo stays
        _by_id[id(plan)] = [plan, hashes, None, None]
    return hashes


def _hash_plan(plan: KernelPlan) -> tuple[str, str]:
    canonical = plan.canonical_payload()  # one encoding serves both hashes
    return _sha(canonical), _sha(_family_of(canonical))


def forget_plan_hashes() -> None:
    """Empty the plan-hash and key memos (benchmarks use it to time a first lookup)."""
    with _memo_lock:
        _by_value.clear()
        _by_id.clear()
        _keys.clear()
        _parts_by_key.clear()


def known_parts(key: str) -> "KeyParts | None":
    """The parts ``build_key`` digested into ``key`` in this process, if it did (saves re-digesting them)."""
    return _parts_by_key.get(key)


def build_key(plan: KernelPlan, budget: Budget) -> tuple[str, KeyParts]:
    """The store key for deciding ``plan`` under ``budget``, and its parts (memoised, see ``plan_hashes``)."""
    found = _by_id.get(id(plan))
    if found is not None and found[0] is plan and found[2] is budget:
        return found[3]  # type: ignore[return-value]
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
    slot = _by_id.get(id(plan))
    if slot is not None and slot[0] is plan:
        slot[2], slot[3] = budget, result
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
