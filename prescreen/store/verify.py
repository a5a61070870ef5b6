"""Recompute a stored decision and compare (``prescreen inspect --verify``)."""

from __future__ import annotations

from prescreen.budget import Budget
from prescreen.decision import decide
from prescreen.key import plan_hashes
from prescreen.plan import KernelPlan
from prescreen.store.entry import Entry, InvalidEntry


def verify_entry(entry: Entry) -> bool:
    """True when the entry's stored plan (decoded from its own field) hashes to the key's plan and
    family hashes, has the entry's dynamic flag, and a fresh ``decide`` for it gives exactly the entry's decision.

    A stored plan that does not decode or parse is False, not an error.
    """
    try:
        plan = KernelPlan.from_payload(entry.plan)
    except (InvalidEntry, ValueError):  # NotBounded is a ValueError
        return False
    budget = Budget(entry.parts.device_kind, entry.parts.total_memory, entry.parts.ratio)
    if plan.is_dynamic != entry.dynamic or plan_hashes(plan) != (entry.parts.plan_hash, entry.parts.family_hash):
        return False
    return decide(plan, budget) == entry.decision
