"""Store keys: sha256 over plan, shape family, device, ratio and versions."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from importlib import metadata

from prescreen.budget import Budget
from prescreen.decision import ESTIMATOR_VERSION
from prescreen.plan import KernelPlan, canonical_json

#: Bumped whenever the stored entry layout changes.
SCHEMA_VERSION = 1


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


def build_key(plan: KernelPlan, budget: Budget) -> tuple[str, KeyParts]:
    """The store key for deciding ``plan`` under ``budget``, and its parts."""
    canonical = plan.canonical_payload()  # one encoding serves both hashes
    parts = KeyParts(
        plan_hash=_sha(canonical),
        family_hash=_sha(_family_of(canonical)),
        device_kind=budget.device_kind,
        total_memory=budget.total_memory,
        ratio=budget.ratio,
        schema_version=SCHEMA_VERSION,
        estimator_version=ESTIMATOR_VERSION,
        versions=library_versions(),
    )
    return parts.digest(), parts
