"""Shared helpers for the store tests (no tests here): synthetic plans and a budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prescreen.budget import Budget
from prescreen.plan import KernelPlan
from prescreen.service import lookup_or_decide
from prescreen.store.entry import Entry
from prescreen.store.trust import canonical

DTYPES = ("torch.float16", "torch.float32", "torch.bfloat16", "torch.int8")
BUDGET = Budget("npu", 16 * 2**30, 0.25)


def plan_payload(seed: int, n_args: int = 2, n_buckets: int = 3, mutated: bool = True) -> dict[str, object]:
    """An inductor_meta-shaped plan: x0 and r0 grouped, static axis s0 varies with ``seed``."""
    buckets = [2 ** (6 + i) for i in range(n_buckets)]
    args: list[dict[str, object]] = []
    for i in range(n_args):
        x, r, s = {"axis_name": "x0"}, {"axis_name": "r0"}, {"axis_name": "s0"}
        args.append(
            {
                "kind": "tensor",
                "source": "buffer",
                "name": f"in_ptr{i}",
                "dtype": DTYPES[(seed + i) % len(DTYPES)],
                "device": "npu:0",
                "size_exprs": [x, r, s],
                "stride_exprs": [{"mul": [r, s]}, s, {"const": 1}],
            }
        )
    if seed % 13 == 5:  # an extent known only at run time: not bounded, falls back
        args[-1]["size_exprs"] = [{"runtime_arg_index": 0}, {"axis_name": "r0"}, {"axis_name": "s0"}]
    args.append({"kind": "size", "source": "axis_expr", "name": "xnumel", "expr": {"mul": [{"axis_name": "x0"}, 2]}})
    return {
        "kernel_name": f"triton_poi_fused_{seed % 97}_{seed}",
        "group_features": [
            {"name": "x", "source": "primary_axis", "axis_names": ["x0"], "buckets": buckets},
            {"name": "r", "source": "axis", "axis_names": ["r0"], "buckets": buckets},
        ],
        "axis_names": ["x0", "r0", "s0"],
        "axis_static_values": [["s0", 1 + seed]],
        "ordered_arg_specs": args,
        "mutated_arg_names": ["in_ptr0"] if mutated else [],
    }


def make_plan(seed: int, n_args: int = 2, n_buckets: int = 3) -> KernelPlan:
    return KernelPlan.from_payload(plan_payload(seed, n_args, n_buckets))


def make_entry(seed: int, **plan_kw: int) -> Entry:
    """A freshly computed entry for ``make_plan(seed)`` under ``BUDGET`` (nothing stored)."""
    outcome = lookup_or_decide(make_plan(seed, **plan_kw), BUDGET, None)
    assert outcome.entry is not None
    return outcome.entry


def warnings_of(caplog: object) -> list[str]:
    """The prescreen.store warning messages captured by pytest's ``caplog``."""
    return [r.getMessage() for r in caplog.records if r.name == "prescreen.store" and r.levelname == "WARNING"]


def entry_fields(text: str | bytes) -> dict[str, Any]:
    """A stored entry text (head, details, record and plan lines) as one payload dict: the details in the
    decision, the record's fields beside the head's, the plan a string field."""
    head, details, record, plan = (text.decode() if isinstance(text, bytes) else text).split("\n")
    fields: dict[str, Any] = json.loads(head)
    fields["decision"].update(json.loads(details))
    fields.update(json.loads(record))
    fields["plan"] = plan
    return fields


def entry_text(fields: dict[str, Any]) -> str:
    """The stored text of a payload dict (edited or not): ``signing.canonical``."""
    return canonical(fields)


FACT_SCRIPT = Path(__file__).parent / "scripts" / "store_fact.py"


def fact_child(spec: dict[str, Any], env: dict[str, str | None] | None = None) -> subprocess.Popen[str]:
    """Start ``tests/scripts/store_fact.py`` with ``spec`` in a process of its own; ``env`` adds to (or, with a
    None value, removes from) the environment, which has no ``PRESCREEN_*`` variable of the caller's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PRESCREEN")}
    for name, value in (env or {}).items():
        if value is None:
            base.pop(name, None)
        else:
            base[name] = value
    return subprocess.Popen([sys.executable, str(FACT_SCRIPT), json.dumps(spec)], env=base, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def fact_result(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    """The ``RESULT`` a ``fact_child`` printed, once it exited 0."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, (out, err)
    found: dict[str, Any] = json.loads(lines[0][len("RESULT "):])
    found["stderr"] = err
    return found
