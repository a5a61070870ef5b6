"""One process of the end-to-end test: compile the example MLP with the hooks, print what happened."""

from __future__ import annotations

import json
import sys

import torch
import torch._inductor.config as ic
from tiny_models import mlp

import prescreen
from prescreen.hooks import state
from prescreen.service import OBSERVERS

ic.freezing = True  # constant weights: the CPU GEMM template competes with ATen and is benchmarked
ic.fx_graph_cache = False
decisions: dict[str, str] = {}
OBSERVERS.append(lambda outcome, plan: decisions.__setitem__(outcome.key, outcome.decision.action))
prescreen.install(device_memory=sys.argv[1], ratio=float(sys.argv[2]))
model, (x,) = mlp(batch=8)
with torch.no_grad():
    y = torch.compile(model, dynamic=True, mode="max-autotune")(x)
    ref = model(x)
c = state.counters()
print("RESULT " + json.dumps({
    "lookups": c.lookups, "hits": c.hits, "estimator_calls": c.estimator_calls, "decisions": decisions,
    "output": y.flatten().tolist()[:16], "max_err": float((y - ref).abs().max()),
}))
