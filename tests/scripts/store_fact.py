"""One process of the observed-OOM store tests: record a fact, look a plan up, or watch a plan until it falls back.

Argument: one JSON object.

- ``store``: ``{"disk": DIR}``, ``{"redis": URL}`` or ``{"tiered": [DIR, URL], "recheck": SECONDS}``
  (with ``"write_wait"``: the disk store's wait through a locked database);
- ``seed``: the plan (``test_store_support.make_plan``);
- ``do``: ``record`` (an observed OOM), ``lookup`` (once), or ``watch`` (look up every 20 ms, for at most
  ``timeout`` seconds, until the decision is an observed OOM);
- ``fact_wait``: ``prescreen.service.FACT_WAIT_SECONDS`` for this process;
- ``ready``: a file made once the store is open and the plan looked up once (``watch``); ``exit_after``: a
  file waited for (at most 60 s) before exiting normally.

Prints one ``RESULT`` JSON line: the decision's action, whether it was a hit and an observed OOM, and for
``watch`` the wall-clock time (``time.time()``) at which the observed OOM was first served.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_store_support import BUDGET, make_plan  # noqa: E402

from prescreen import service  # noqa: E402
from prescreen.decision import is_observed_oom  # noqa: E402
from prescreen.store import DiskStore, Store, TieredStore  # noqa: E402

spec = json.loads(sys.argv[1])
if "fact_wait" in spec:
    service.FACT_WAIT_SECONDS = spec["fact_wait"]


def open_spec(where: dict[str, object]) -> Store:
    disk_kw = {"write_wait": float(where["write_wait"])} if "write_wait" in where else {}  # type: ignore[arg-type]
    if "disk" in where:
        return DiskStore(str(where["disk"]), **disk_kw)  # type: ignore[arg-type]
    from prescreen.store import RedisStore

    if "redis" in where:
        return RedisStore(str(where["redis"]))
    local, url = where["tiered"]  # type: ignore[misc]
    return TieredStore(DiskStore(local, **disk_kw), RedisStore(url), recheck_seconds=float(where["recheck"]))  # type: ignore[arg-type]


store = open_spec(spec["store"])
plan = make_plan(int(spec["seed"]))
result: dict[str, object] = {}
if spec["do"] == "record":
    outcome = service.record_observed_oom(plan, BUDGET, store, requested_bytes=1, free_bytes=2, error="test")
    result["held"] = outcome.key in getattr(service, "_held", {})
else:
    outcome = service.lookup_or_decide(plan, BUDGET, store)
    if spec["do"] == "watch":
        Path(spec["ready"]).touch()
        deadline = time.monotonic() + float(spec["timeout"])
        while not is_observed_oom(outcome.decision) and time.monotonic() < deadline:
            time.sleep(0.02)
            outcome = service.lookup_or_decide(plan, BUDGET, store)
        result["seen_at"] = time.time() if is_observed_oom(outcome.decision) else None
result.update(action=outcome.decision.action, hit=outcome.hit, observed=is_observed_oom(outcome.decision))
print("RESULT " + json.dumps(result), flush=True)
if spec.get("close"):
    store.close()  # as the hooks close the store they opened (``state.reset``): exit writes a kept fact all the same
if "exit_after" in spec:
    gate = Path(spec["exit_after"])
    deadline = time.monotonic() + 60
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
# interpreter exit writes what this process still holds (``service.write_held_facts``)
