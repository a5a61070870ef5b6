"""One process of the torch-cache tests: compile ``pair_bmm`` with Inductor's caches at their defaults.

Arguments: ``MEMORY RATIO SIZES [--oom] [--save FILE] [--load FILE]``. Prints one ``RESULT`` JSON line:
prescreen's counters, Inductor's and AOTAutograd's, the benchmarks run, and whether the outputs equal eager.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from tiny_models import pair_bmm
from torch._dynamo.utils import counters
from torch._inductor.runtime import benchmarking

import prescreen
from prescreen.hooks import state

parser = argparse.ArgumentParser()
parser.add_argument("memory")
parser.add_argument("ratio", type=float)
parser.add_argument("sizes")
parser.add_argument("--oom", action="store_true", help="every synthesized benchmark input raises an OOM")
parser.add_argument("--save")
parser.add_argument("--load")
opts = parser.parse_args()

if opts.load:
    torch.compiler.load_cache_artifacts(Path(opts.load).read_bytes())
if opts.oom:
    from torch._inductor import select_algorithm as sa

    def _oom(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    sa.rand_strided = _oom  # type: ignore[assignment]

# Benchmarks counted where they run: Inductor's ``benchmarking.*`` counters are no measure, since an FX graph
# cache hit adds back those of the compile that made the entry.
ran = [0]


def _counting(method: Any) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        ran[0] += 1
        return method(*args, **kwargs)
    return counted


for cls in (benchmarking.Benchmarker, benchmarking.TritonBenchmarker, benchmarking.InductorBenchmarker):
    for name in [n for n in ("benchmark_cpu", "benchmark_gpu") if n in vars(cls)]:
        setattr(cls, name, _counting(vars(cls)[name]))
prescreen.install(device_memory=opts.memory, ratio=opts.ratio)
equal = True
tags = []
for batch in (int(s) for s in opts.sizes.split(",")):
    model, inputs = pair_bmm(batch=batch)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, dynamic=True, mode="max-autotune")(*inputs)
        equal = equal and bool(torch.allclose(out, model(*inputs), atol=1e-4, rtol=1e-4))
    tags.append(torch.compiler.config.cache_key_tag)
if opts.save:
    saved = torch.compiler.save_cache_artifacts()
    assert saved is not None
    Path(opts.save).write_bytes(saved[0])
c = state.counters()
inductor = counters["inductor"]
print("RESULT " + json.dumps({
    "lookups": c.lookups, "hits": c.hits, "computed": c.estimator_calls, "fell_back": c.fell_back,
    "fx_hit": inductor["fxgraph_cache_hit"], "fx_miss": inductor["fxgraph_cache_miss"],
    "benchmarks": ran[0],
    "template": inductor["cpp_templated_kernel_counter"], "extern": inductor["extern_calls"],
    "tags": tags, "equal": equal,
}))
