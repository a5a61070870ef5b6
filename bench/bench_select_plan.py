"""What building one algorithm-selection plan costs for ResNet-50's convolutions under ``dynamic=True``.

Every input dimension is a symbol, so after the stem a spatial size is a floor division (``(s1 - 1) // 16 + 1``
after four stride-2 stages) and each stride a product of them. This builds the plan of a 3x3 convolution on
``[s0, C, H, W]`` fp16 at the stem and after four stages, through a real ShapeEnv and Inductor's
SizeVarAllocator, as the selection guard does, and reports the median CPU of a plan and the part spent judging
whether sizes grow (``expr.grows``). The device is named ``cuda:0``; nothing runs on it.

    python -P bench/bench_select_plan.py [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    import torch
    from torch._dynamo.source import ConstantSource
    from torch._inductor import ir
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.virtualized import V
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch.utils._sympy.functions import FloorDiv

    from prescreen.hooks import inductor_select as sel

    env = ShapeEnv()
    batch, height, width = (env.create_symbol(v, ConstantSource(f"x{i}"), dynamic_dim=DimDynamic.DYNAMIC)
                            for i, v in enumerate((16, 224, 224)))
    graph = types.SimpleNamespace(sizevars=SizeVarAllocator(env), get_allocation_size=lambda node: node.get_size())
    cuda = torch.device("cuda", 0)
    spent = [0.0]
    grows = sel.grows

    def timed_grows(e: Any) -> bool:
        start = time.thread_time()
        try:
            return grows(e)
        finally:
            spent[0] += time.thread_time() - start

    sel.grows = timed_grows  # type: ignore[assignment]

    def layout(size: list[Any]) -> Any:
        strides, step = [], 1
        for d in reversed(size):
            strides.insert(0, step)
            step = step * d
        return ir.FixedLayout(cuda, torch.float16, size, strides)

    print(f"torch {torch.__version__}, {args.reps} plans a depth, medians of this thread's CPU")
    print("| stride-2 stages | plan us | of which growth checks us |\n|---|---|---|")
    with V.set_graph_handler(graph):  # type: ignore[arg-type]
        for stages, channels in ((0, 64), (4, 512)):
            h, w = height, width
            for _ in range(stages):
                h, w = FloorDiv(h - 1, 2) + 1, FloorDiv(w - 1, 2) + 1
            size = [batch, channels, h, w]
            x = ir.Buffer(name="x", layout=layout(size))
            weight = ir.Buffer(name="w", layout=layout([channels, channels, 3, 3]))
            cpu, checks = [], []
            for _ in range(args.reps):
                spent[0], start = 0.0, time.thread_time()
                sel.plan_for_selection("convolution", [x, weight], layout(size))
                cpu.append(time.thread_time() - start)
                checks.append(spent[0])
            print(f"| {stages} | {1e6 * statistics.median(cpu):.0f} | {1e6 * statistics.median(checks):.0f} |")


if __name__ == "__main__":
    main()
