"""Recompute a stored decision and compare (``prescreen inspect --verify``)."""

from __future__ import annotations

from prescreen.budget import Budget
from prescreen.decision import decide
from prescreen.plan import KernelPlan
from prescreen.store.entry import Entry


def verify_entry(entry: Entry) -> bool:
    """True when a fresh ``decide`` for the entry's plan and budget gives exactly its decision."""
    plan = KernelPlan.from_payload(entry.plan)
    budget = Budget(entry.parts.device_kind, entry.parts.total_memory, entry.parts.ratio)
    return decide(plan, budget) == entry.decision
