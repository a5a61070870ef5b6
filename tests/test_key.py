"""Keys: sha256 of canonical JSON; the family hash follows the shape family alone; versions as importlib reads them.

The exact hex strings every key and hash must keep are in ``test_key_golden.py``.
"""

from __future__ import annotations

import dataclasses
from importlib import metadata

import pytest
from hypothesis import given, settings
from strategies import plan_payloads, upstream_meta

from prescreen.budget import Budget
from prescreen.key import _version, build_key, library_versions, plan_hashes
from prescreen.plan import KernelPlan

BUDGET = Budget("npu", 16 * 2**30, 0.25)


@settings(max_examples=100, deadline=None)
@given(plan_payloads(extra_keys=True))
def test_a_key_is_the_digest_of_its_parts_and_the_parts_are_the_plan_s(payload: dict[str, object]) -> None:
    plan = KernelPlan.from_payload(payload)
    key, parts = build_key(plan, BUDGET)
    assert key == parts.digest()
    assert (parts.plan_hash, parts.family_hash) == plan_hashes(plan) and parts.plan_hash == plan_hashes(plan)[0]
    assert (parts.device_kind, parts.total_memory, parts.ratio) == (BUDGET.device_kind, BUDGET.total_memory,
                                                                    BUDGET.ratio)
    assert parts.versions == library_versions()


def test_every_part_changes_the_key() -> None:
    _, parts = build_key(KernelPlan.from_payload(upstream_meta()), BUDGET)
    changed = [dataclasses.replace(parts, **{name: value}) for name, value in (
        ("plan_hash", "0" * 64), ("family_hash", "0" * 64), ("device_kind", "cuda"), ("total_memory", 2**34 + 1),
        ("ratio", 0.5), ("schema_version", 99), ("estimator_version", 99), ("versions", (("torch", "0"),)),
    )]
    assert len({parts.digest(), *(p.digest() for p in changed)}) == len(changed) + 1


def test_the_family_hash_follows_the_groups_not_the_arguments() -> None:
    plan = KernelPlan.from_payload(upstream_meta())
    fewer_args = dataclasses.replace(plan, args=plan.args[:1], mutated_arg_names=())
    assert plan_hashes(fewer_args)[1] == plan_hashes(plan)[1] and plan_hashes(fewer_args)[0] != plan_hashes(plan)[0]
    meta = upstream_meta()
    meta["group_features"][0]["buckets"] = [16]  # type: ignore[index]
    assert plan_hashes(KernelPlan.from_payload(meta))[1] != plan_hashes(plan)[1]


@pytest.mark.parametrize("dist", ["torch", "numpy", "click", "diskcache", "sympy", "prescreen", "no-such-dist-xyz"])
def test_versions_are_read_from_the_metadata_headers_as_importlib_reads_them(dist: str) -> None:
    try:
        expected = metadata.version(dist)
    except metadata.PackageNotFoundError:
        expected = "absent"
    assert _version(dist) == expected
    assert dict(library_versions())["torch"] == metadata.version("torch")
