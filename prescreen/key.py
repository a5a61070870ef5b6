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
_by_value: collections.OrderedDict[KernelPlan, tuple[str, str]] = collections.OrderedDict()
_by_id: dict[int, tuple[KernelPlan, tuple[str, str]]] = {}
_memo_lock = threading.Lock()


def plan_hashes(plan: KernelPlan) -> tuple[str, str]:
    """``(plan hash, family hash)`` of ``plan``, computed once per distinct plan in this process.

    Hashing the canonical JSON costs about as much as a store hit, so it is
    remembered in a bounded LRU keyed by the (frozen, hashable) plan's value;
    the same plan *object* is found by identity without even hashing its
    fields (the entry holds the object, so its id cannot be reused meanwhile).
    """
    found = _by_id.get(id(plan))
    if found is not None and found[0] is plan:
        return found[1]
    try:
        with _memo_lock:
            hashes = _by_value.get(plan)
            if hashes is not None:
                _by_value.move_to_end(plan)
    except TypeError:  # a plan built by hand with a list inside is not hashable: no memo
        return _hash_plan(plan)
    if hashes is None:
        hashes = _hash_plan(plan)
    with _memo_lock:
        _by_value[plan] = hashes
        if len(_by_value) > HASH_MEMO_SIZE:
            _by_value.popitem(last=False)
        if len(_by_id) >= HASH_MEMO_SIZE:
            _by_id.clear()  # identity is only the fast path; the value memo stays
        _by_id[id(plan)] = (plan, hashes)
    return hashes


def _hash_plan(plan: KernelPlan) -> tuple[str, str]:
    canonical = plan.canonical_payload()  # one encoding serves both hashes
    return _sha(canonical), _sha(_family_of(canonical))


_keys: dict[tuple[object, ...], tuple[str, KeyParts]] = {}


def forget_plan_hashes() -> None:
    """Empty the plan-hash and key memos (benchmarks use it to time a first lookup)."""
    with _memo_lock:
        _by_value.clear()
        _by_id.clear()
        _keys.clear()


def build_key(plan: KernelPlan, budget: Budget) -> tuple[str, KeyParts]:
    """The store key for deciding ``plan`` under ``budget``, and its parts."""
    plan_hash, fam_hash = plan_hashes(plan)
    # Types too: 1 == 1.0 == True, but the canonical JSON (so the key) tells them apart.
    memo_key = (plan_hash, fam_hash, budget.device_kind, budget.total_memory, type(budget.total_memory),
                budget.ratio, type(budget.ratio))
    found = _keys.get(memo_key)
    if found is not None:
        return found
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
    result = (parts.digest(), parts)
    with _memo_lock:
        if len(_keys) >= HASH_MEMO_SIZE:
            _keys.clear()
        _keys[memo_key] = result
    return result
