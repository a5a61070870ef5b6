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
SCHEMA_VERSION = 5


@functools.cache
def library_versions() -> tuple[tuple[str, str], ...]:
    """Versions of the libraries whose behaviour a decision depends on ("absent" where not installed)."""
    return tuple((dist, _version(dist)) for dist in ("torch", "torch_npu", "triton", "triton-ascend"))


def _version(dist: str) -> str:
    """``importlib.metadata.version(dist)`` from the header lines only: the full email parse of torch's
    METADATA takes 2 to 200 ms, inside a process's first compile."""
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
        d: dict[str, object] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["versions"] = dict(self.versions)
        return d

    def digest(self) -> str:
        """The key: sha256 of the parts' canonical JSON."""
        return _sha(self.to_payload())


def _sha(value: object) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


#: What defines a plan's shape families. The representatives are a pure function of these (for one estimator
#: version), so hashing them identifies the families without enumerating every group.
_FAMILY_FIELDS = ("group_features", "axis_names", "axis_static_values")


def plan_hashes(plan: KernelPlan) -> tuple[str, str]:
    """``(plan hash, family hash)``: sha256 of the canonical plan payload and of its shape-family fields."""
    canonical = plan.canonical_payload()
    return _sha(canonical), _sha({k: canonical[k] for k in _FAMILY_FIELDS})


def build_key(plan: KernelPlan, budget: Budget) -> tuple[str, KeyParts]:
    """The store key for deciding ``plan`` under ``budget``, and its parts."""
    plan_hash, fam_hash = plan_hashes(plan)
    parts = KeyParts(plan_hash=plan_hash, family_hash=fam_hash, device_kind=budget.device_kind,
                     total_memory=budget.total_memory, ratio=budget.ratio, schema_version=SCHEMA_VERSION,
                     estimator_version=ESTIMATOR_VERSION, versions=library_versions())
    return parts.digest(), parts
