"""A replica of the artifact tests: compile ``pair_bmm`` at the given sizes with prescreen installed.

Arguments: ``MEMORY RATIO SIZES``. Inductor's caches stay at their defaults. Prints one ``RESULT``
JSON line: prescreen's lookups and estimator calls, the FX graph cache hits, the autotune
benchmarks run and whether the outputs equal eager.

Benchmarks are counted by wrapping Inductor's benchmarker: its ``benchmarking.*`` counters are
no measure here, since an FX graph cache hit adds the counters of the compile that made the
entry (``counter_deltas``), benchmarks included, though it runs none.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import torch
from tiny_models import pair_bmm
from torch._dynamo.utils import counters
from torch._inductor.runtime import benchmarking

import prescreen
from prescreen.hooks import state

ran = [0]


def _counted(method: Any) -> Any:
    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        ran[0] += 1
        return method(*args, **kwargs)

    return run


for cls in (benchmarking.Benchmarker, benchmarking.TritonBenchmarker, benchmarking.InductorBenchmarker):
    for name in ("benchmark_cpu", "benchmark_gpu"):
        if name in vars(cls):
            setattr(cls, name, _counted(vars(cls)[name]))

memory, ratio, sizes = sys.argv[1], float(sys.argv[2]), sys.argv[3]
prescreen.install(device_memory=memory, ratio=ratio)
equal = True
for batch in (int(s) for s in sizes.split(",")):
    model, inputs = pair_bmm(batch=batch)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, dynamic=True, mode="max-autotune")(*inputs)
        equal = equal and bool(torch.allclose(out, model(*inputs), atol=1e-4, rtol=1e-4))
c = state.counters()
inductor = counters["inductor"]
print("RESULT " + json.dumps({
    "lookups": c.lookups, "computed": c.estimator_calls, "benchmarks": ran[0],
    "counted": sum(v for k, v in inductor.items() if k.startswith("benchmarking.")),
    "fx_hit": inductor["fxgraph_cache_hit"], "fx_miss": inductor["fxgraph_cache_miss"], "equal": equal,
}))
