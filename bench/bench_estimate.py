"""Time the estimator: build_representatives, estimate_footprint and decide, per plan.

Plans of 1..64 args and 1..4 group features with 4..16 buckets each; the group
count is (buckets + 1) ** features, up to 83,521. Plans over ``--max-groups``
are skipped (and listed). Each time is the median of several repetitions, in
microseconds; ratios are against the smallest plan. The last line gives the
slowest decision among the largest plans (the goal is under 0.2 s).

``--crossover`` instead times the footprint's two evaluations on every plan,
the plain loop (``reference_footprint``) and numpy, taking turns, and prints
the largest group x argument count where the loop was still faster: where
``footprint.LOOP_MAX`` comes from.

    python bench/bench_estimate.py [--max-groups 83521] [--reps 5] [--crossover]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from prescreen import footprint  # noqa: E402
from prescreen.budget import Budget  # noqa: E402
from prescreen.decision import decide  # noqa: E402
from prescreen.footprint import estimate_footprint, reference_footprint  # noqa: E402
from prescreen.plan import KernelPlan  # noqa: E402
from prescreen.representatives import build_representatives  # noqa: E402

ARGS = (1, 4, 16, 64)
FEATURES = (1, 2, 3, 4)
BUCKETS = (4, 8, 16)
SOURCES = ("primary_axis", "outer_product", "reduction_product", "axis")
DTYPES = ("torch.float16", "torch.float32", "torch.bfloat16", "torch.int64")


def make_plan(n_args: int, n_features: int, n_buckets: int) -> KernelPlan:
    """One feature per symbolic axis ``a{i}``; product features also carry a static axis ``s{i}``."""
    features, axes, statics = [], [], []
    for i in range(n_features):
        source = SOURCES[i % len(SOURCES)]
        feature_axes = [f"a{i}"] + ([f"s{i}"] if "product" in source else [])
        if "product" in source:
            statics.append([f"s{i}", 3 + i])
        axes += feature_axes
        features.append(
            {"name": f"f{i}", "source": source, "axis_names": feature_axes,
             "buckets": [2 ** (j + 2) for j in range(n_buckets)]}
        )
    args = []
    for k in range(n_args):
        a, b = axes[k % len(axes)], axes[(k + 1) % len(axes)]
        if k % 8 == 7:
            args.append({"kind": "size", "source": "axis_expr", "name": f"ks{k}", "expr": {"axis_name": a}})
        elif k % 8 == 6:
            args.append({"kind": "workspace", "source": "workspace", "name": f"ws{k}", "dtype": "torch.int32",
                         "device": "npu:0", "zero_mode": "NONE",
                         "count_expr": {"floordiv": [{"mul": [{"axis_name": a}, {"axis_name": b}]}, 2]}})
        else:
            args.append({"kind": "tensor", "source": "buffer", "name": f"buf{k}", "dtype": DTYPES[k % 4],
                         "device": "npu:0",
                         "size_exprs": [{"axis_name": a}, {"add": [{"axis_name": b}, 1]}],
                         "stride_exprs": [{"add": [{"axis_name": b}, 1]}, 1]})
    return KernelPlan.from_payload({
        "kernel_name": f"bench_{n_args}_{n_features}_{n_buckets}", "group_features": features,
        "axis_names": axes, "axis_static_values": statics, "ordered_arg_specs": args,
        "mutated_arg_names": [args[0]["name"]],
    })


def median_us(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of ``fn`` in microseconds (one warm-up call, GC paused while timing).

    A call slower than 50 ms gets at most 3 repetitions, to keep the run short.
    """
    start = time.perf_counter()
    fn()
    if time.perf_counter() - start > 0.05:
        reps = min(reps, 3)
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        gc.enable()
    return statistics.median(samples)


def crossover(max_groups: int, reps: int) -> None:
    """Loop against numpy on the bench plans and a few tiny ones, by group x argument evaluations."""
    plans = [make_plan(n_args, 1, n_buckets) for n_args in (1, 2, 3, 4, 6, 8) for n_buckets in (1, 2, 3, 4, 6, 8)]
    plans += [make_plan(n_args, f, b) for f in FEATURES for b in BUCKETS for n_args in ARGS
              if (b + 1) ** f <= max_groups]
    rows = []
    for plan in plans:
        reps_ = build_representatives(plan)
        n = len(reps_.groups) * sum(1 for a in plan.args if a.kind != "size")
        loop_s, numpy_s = [], []
        gc.disable()
        try:
            for _ in range(max(reps, 5) * 4):
                start = time.perf_counter()
                reference_footprint(plan, reps_)
                loop_s.append(time.perf_counter() - start)
                with _loop_max(0):
                    start = time.perf_counter()
                    estimate_footprint(plan, reps_)
                    numpy_s.append(time.perf_counter() - start)
        finally:
            gc.enable()
        rows.append((n, statistics.median(loop_s) * 1e6, statistics.median(numpy_s) * 1e6))
    rows.sort()
    print(f"{'evals':>6} {'loop_us':>10} {'numpy_us':>10}")
    for n, loop_us, numpy_us in rows:
        print(f"{n:>6} {loop_us:>10.1f} {numpy_us:>10.1f}")
    faster = [n for n, loop_us, numpy_us in rows if loop_us < numpy_us]
    print(f"largest evaluation count where the loop was faster: {max(faster) if faster else 0} "
          f"(footprint.LOOP_MAX = {footprint.LOOP_MAX})")


@contextlib.contextmanager
def _loop_max(value: int) -> Iterator[None]:
    old, footprint.LOOP_MAX = footprint.LOOP_MAX, value
    try:
        yield
    finally:
        footprint.LOOP_MAX = old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-groups", type=int, default=83521, help="skip plans with more groups (default 83521)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per plan, median reported (default 5)")
    parser.add_argument("--crossover", action="store_true", help="loop against numpy, by evaluations")
    opts = parser.parse_args()
    if opts.crossover:
        crossover(min(opts.max_groups, 1000), opts.reps)
        return
    began = time.perf_counter()
    budget = Budget("npu", 64 * 2**30, 0.25)
    print(f"machine: {platform.platform()} | {platform.machine()} | python {platform.python_version()} "
          f"| torch {torch.__version__}")
    print(f"{'args':>4} {'feat':>4} {'bkts':>4} {'groups':>6} {'reps_us':>10} {'foot_us':>10} {'decide_us':>10} "
          f"{'us/group':>8} {'ratio':>8}")
    base: float | None = None
    skipped = []
    largest: tuple[int, float] = (0, 0.0)
    for n_features in FEATURES:
        for n_buckets in BUCKETS:
            groups = (n_buckets + 1) ** n_features
            for n_args in ARGS:
                if groups > opts.max_groups:
                    skipped.append((n_args, n_features, n_buckets, groups))
                    continue
                plan = make_plan(n_args, n_features, n_buckets)
                reps = build_representatives(plan)
                reps_us = median_us(lambda p=plan: build_representatives(p), opts.reps)
                foot_us = median_us(lambda p=plan, r=reps: estimate_footprint(p, r), opts.reps)
                decide_us = median_us(lambda p=plan: decide(p, budget), opts.reps)
                base = base or decide_us
                if len(reps.groups) >= largest[0]:
                    largest = (len(reps.groups), max(decide_us, largest[1]) if len(reps.groups) == largest[0] else decide_us)
                print(f"{n_args:>4} {n_features:>4} {n_buckets:>4} {len(reps.groups):>6} {reps_us:>10.1f} "
                      f"{foot_us:>10.1f} {decide_us:>10.1f} {decide_us / len(reps.groups):>8.2f} "
                      f"{decide_us / base:>7.1f}x")
    if skipped:
        shapes = ", ".join(f"{f}x{b} buckets ({g} groups)" for _, f, b, g in skipped[:: len(ARGS)])
        print(f"skipped {len(skipped)} plans over --max-groups={opts.max_groups}: {shapes}, each for args {ARGS}")
    print(f"slowest decision among the {largest[0]}-group plans: {largest[1] / 1000:.1f} ms")
    print(f"ratio = decide time / smallest plan's decide time; decide = representatives + footprint + decision; "
          f"total {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
