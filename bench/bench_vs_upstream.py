"""prescreen's estimator against torch_npu 2.14.0's own, on the same plans, in one process.

torch_npu's ``symbolic_grouping.py`` is read out of the real torch-npu 2.14.0
wheel (found in ``$PRESCREEN_NPU_WHEEL_DIR`` or ``.npu-wheel/``, else fetched
with ``pip download --no-deps torch_npu==2.14.0``) and loaded standalone; where
the wheel cannot be had, the reason is printed and nothing is timed.

Per plan: torch_npu's ``build_group_representatives`` +
``estimate_grouped_benchmark_footprint`` on the payload (what its guard runs)
against prescreen's ``build_representatives`` + ``estimate_footprint`` on the
parsed plan (``ours_us``; nothing is kept between calls), and each side with
the footprint step alone (representatives built fresh, outside the timing,
before every call). Results are checked to be identical. The two sides take turns, call after call, so that load on the
machine weighs on both alike. Plans: ``bench_estimate.py``'s grid (1 to 64 args, 1 to 4 features),
plans whose every tensor uses every axis ("dense"), and torch_npu's own test
plan. Times are medians in microseconds.

    python bench/bench_vs_upstream.py [--max-groups 1000] [--reps 5] [--big]

``--big`` adds the 83,521-group plans (torch_npu takes seconds to half a
minute on each).
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from bench_estimate import ARGS, BUCKETS, FEATURES, make_plan  # noqa: E402
from npu_wheel import (  # type: ignore[import-not-found]  # noqa: E402
    NPU_VERSION,
    WheelUnavailable,
    load_upstream_symbolic_grouping,
)

from prescreen.footprint import Footprint, estimate_footprint  # noqa: E402
from prescreen.plan import KernelPlan  # noqa: E402
from prescreen.representatives import Representatives, build_representatives  # noqa: E402


def dense_plan(n_args: int, n_features: int, n_buckets: int) -> KernelPlan:
    """Every tensor arg spans every axis (size ``[a0, ..., aF-1]``, contiguous), so no two groups share its bytes."""
    axes = [f"a{i}" for i in range(n_features)]
    buckets = [2 ** (j + 2) for j in range(n_buckets)]
    sizes = [{"axis_name": a} for a in axes]
    strides = [{"mul": sizes[i + 1:]} if i + 1 < len(sizes) else {"const": 1} for i in range(len(sizes))]
    args = [
        {"kind": "tensor", "source": "buffer", "name": f"buf{k}", "dtype": ("torch.float16", "torch.float32")[k % 2],
         "device": "npu:0", "size_exprs": sizes, "stride_exprs": strides}
        for k in range(n_args)
    ]
    return KernelPlan.from_payload({
        "kernel_name": f"dense_{n_args}_{n_features}_{n_buckets}",
        "group_features": [{"name": f"f{i}", "source": "axis", "axis_names": [a], "buckets": buckets}
                           for i, a in enumerate(axes)],
        "axis_names": axes, "axis_static_values": [], "ordered_arg_specs": args, "mutated_arg_names": ["buf0"],
    })


def npu_test_plan() -> KernelPlan:
    """torch_npu's own footprint test plan: 2 tensors and a size arg, one feature with one bucket (2 groups)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from strategies import upstream_meta  # type: ignore[import-not-found]

    return KernelPlan.from_payload(upstream_meta())


def interleaved_us(
    calls: list[tuple[Callable[[Any], object], Callable[[], Any]]], reps: int, min_seconds: float = 0.2
) -> list[tuple[float, Any]]:
    """Median wall time in microseconds of each ``fn(setup())`` (``setup`` untimed, GC paused), and its last result.

    The calls take turns, round after round, in an order that rotates each
    round, so that load on the machine and the state of the CPU caches weigh
    on all of them alike; rounds go on until each call has ``reps``
    samples and the rounds took ``min_seconds`` (at most 2,000 rounds). A call
    whose first run took over 0.5 s is not repeated: that run is its sample.
    """
    samples: list[list[float]] = [[] for _ in calls]
    results: list[Any] = [None] * len(calls)
    slow = [False] * len(calls)
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        rounds = 0
        while rounds < 2000 and (rounds <= reps or time.perf_counter() - began < min_seconds):
            # The order rotates round by round: the call right after torch_npu's (which sweeps the CPU
            # caches) is a different one each round, so no side always pays for it.
            order = [(rounds + k) % len(calls) for k in range(len(calls))]
            for i in order:
                fn, setup = calls[i]
                if slow[i]:
                    continue
                arg = setup()
                start = time.perf_counter()
                results[i] = fn(arg)
                took = (time.perf_counter() - start) * 1e6
                if rounds == 0:
                    slow[i] = took > 5e5
                    if not slow[i]:
                        continue  # the first round warms up
                samples[i].append(took)
            rounds += 1
            if all(slow):
                break
    finally:
        gc.enable()
    return [(statistics.median(t), r) for t, r in zip(samples, results)]


def nothing() -> None:
    return None


def same(ours: Footprint, theirs: Any) -> bool:
    d, u = ours.dominant_arg, theirs.dominant_arg
    dominant_same = (d is None and u is None) or (
        d is not None and u is not None
        and (d.group_id, d.name, d.kind, d.dtype, d.size, d.stride, d.num_bytes)
        == (u.group_id, u.name, u.kind, u.dtype, tuple(u.size), tuple(u.stride), u.num_bytes)
    )
    return dominant_same and (
        ours.synthetic_bytes, ours.mutated_clone_bytes, ours.total_bytes, ours.group_bytes, ours.largest_group_id
    ) == (theirs.synthetic_bytes, theirs.mutated_clone_bytes, theirs.total_bytes, tuple(theirs.group_bytes),
          theirs.largest_group_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-groups", type=int, default=1000, help="skip plans with more groups (default 1000)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per plan, median reported (default 5)")
    parser.add_argument("--big", action="store_true", help="also the 83,521-group plans (slow for torch_npu)")
    opts = parser.parse_args()
    try:
        upstream = load_upstream_symbolic_grouping()
    except WheelUnavailable as exc:
        print(f"skipped: {exc}")
        return 0
    except Exception as exc:  # noqa: BLE001 - any failure to load the wheel's module is reported, not raised
        print(f"skipped: torch-npu {NPU_VERSION} symbolic_grouping.py does not load standalone: {exc!r}")
        return 0
    began = time.perf_counter()
    print(f"machine: {platform.platform()} | {platform.machine()} | python {platform.python_version()} "
          f"| torch {torch.__version__} | torch_npu {NPU_VERSION} symbolic_grouping.py from the wheel")

    cases: list[tuple[str, KernelPlan]] = [("npu_test 2 args 1x1", npu_test_plan())]
    limit = 83521 if opts.big else opts.max_groups
    for n_features in FEATURES:
        for n_buckets in BUCKETS:
            if (n_buckets + 1) ** n_features > limit:
                continue
            for n_args in ARGS:
                cases.append((f"grid {n_args} args {n_features}x{n_buckets}", make_plan(n_args, n_features, n_buckets)))
    for n_args, n_features, n_buckets in ((4, 1, 2), (16, 2, 8), (64, 2, 16), (16, 3, 8), (16, 4, 16)):
        if (n_buckets + 1) ** n_features <= limit:
            cases.append((f"dense {n_args} args {n_features}x{n_buckets}", dense_plan(n_args, n_features, n_buckets)))

    print(f"{'plan':<26} {'groups':>6} {'npu_us':>12} {'ours_us':>10} {'ratio':>7} "
          f"{'npu_fp_us':>12} {'ours_fp_us':>10} {'fp_ratio':>8}  same")
    worst: tuple[float, str] | None = None
    all_same = True
    for name, plan in cases:
        p = plan.to_payload()

        def up_reps(p: dict[str, Any] = p) -> Any:
            return upstream.build_group_representatives(p["group_features"], p["axis_names"], p["axis_static_values"])

        def up_fp(reps: Any, p: dict[str, Any] = p) -> Any:
            return upstream.estimate_grouped_benchmark_footprint(reps, p["ordered_arg_specs"], p["mutated_arg_names"])

        def our_reps(plan: KernelPlan = plan) -> Representatives:
            return build_representatives(plan)

        def our_fp(reps: Representatives, plan: KernelPlan = plan) -> Footprint:
            return estimate_footprint(plan, reps)

        def up_both(_: None) -> Any:
            return up_fp(up_reps())

        def our_both(_: None) -> Footprint:
            return our_fp(our_reps())

        (up_all, up_result), (our_all, our_result) = interleaved_us(
            [(up_both, nothing), (our_both, nothing)], opts.reps)
        (up_only, _), (our_only, _) = interleaved_us([(up_fp, up_reps), (our_fp, our_reps)], opts.reps)
        ok = same(our_result, up_result)
        all_same &= ok
        groups = len(build_representatives(plan).groups)
        ratio = up_all / our_all
        worst = min(worst, (ratio, name)) if worst else (ratio, name)
        print(f"{name:<26} {groups:>6} {up_all:>12.1f} {our_all:>10.1f} {ratio:>6.1f}x "
              f"{up_only:>12.1f} {our_only:>10.1f} {up_only / our_only:>7.1f}x  {'yes' if ok else 'NO'}", flush=True)
    assert worst is not None
    print(f"ratio = torch_npu time / prescreen time, representatives + footprint (fp: the footprint step alone); "
          f"lowest {worst[0]:.1f}x ({worst[1]}); results identical on every plan: {all_same}; "
          f"total {time.perf_counter() - began:.1f} s")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
