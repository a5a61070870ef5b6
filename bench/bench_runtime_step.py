"""What one guarded runtime step costs, piece by piece: the plan, the budget, the key, the store read.

A Triton kernel's first call (runtime autotuning, then coordinate descent) asks prescreen once; on a short
compile that call is most of the hook's share. This times each piece of ``triton_autotune._decide`` on real
device tensors (three mutated arguments, ``optimize_mem`` on, as inference compiles them), a warm store,
nothing else running: microseconds of wall and of this thread's CPU, medians of ``--reps`` rounds.

    python -P bench/bench_runtime_step.py [--device cuda] [--reps 2000] [--skip-contended]

On CPU the device is faked as ``cuda:0`` (the allocator statistics then read 0).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any


class _Fn:
    __name__ = "triton_poi_fused_add_copy__mul_0"
    arg_names = ["in_out_ptr0", "in_out_ptr1", "in_ptr0", "xnumel"]


class _Tuner:
    """What ``_decide`` reads of a ``CachingAutotuner``."""

    def __init__(self) -> None:
        self.fn = _Fn()
        self.mutated_arg_names = ["in_out_ptr0", "in_out_ptr1"]
        self.optimize_mem = True
        self.launchers = [object(), object()]
        self.inductor_meta: dict[str, Any] = {}


def timed(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """Median wall and CPU microseconds of one call."""
    walls, cpus = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.thread_time()
        fn()
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
    return 1e6 * statistics.median(walls), 1e6 * statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--skip-contended", action="store_true", help="leave out the step beside busy threads (the slowest)")
    args = ap.parse_args()
    import torch

    import prescreen
    from prescreen.hooks import state, triton_autotune
    from prescreen.key import build_key
    from prescreen.service import lookup_or_decide
    from prescreen.store import DiskStore

    device = torch.device(args.device, 0) if args.device != "cpu" else torch.device("cpu")
    if args.device == "cpu":
        triton_autotune._device_of = lambda _named: torch.device("cuda", 0)  # type: ignore[assignment]
    prescreen.install(store=DiskStore(tempfile.mkdtemp(prefix="bench-step-")),
                      device_memory=None if args.device != "cpu" else "80GiB")
    tuner = _Tuner()
    call = (torch.zeros(2**20, device=device), torch.zeros(2**19, device=device), torch.zeros(2**18, device=device),
            2**20)
    cuda = torch.device("cuda", 0)
    plan = triton_autotune.plan_for_autotuner(tuner, call, {})
    budget = state.budget_for(cuda)
    key = build_key(plan, budget)[0]
    store = state.get_store()
    lookup_or_decide(plan, budget, store)  # stored: every read below is a hit
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("allocator statistics, nested (_peak_headroom: prescreen's read)", triton_autotune._peak_headroom),
        ("plan (plan_for_autotuner)", lambda: triton_autotune.plan_for_autotuner(tuner, call, {})),
        ("budget (state.budget_for)", lambda: state.budget_for(cuda)),
        ("key (build_key)", lambda: build_key(plan, budget)),
        ("store read, a hit (DiskStore.lookup)", lambda: store.lookup(key)),  # type: ignore[union-attr]
        ("lookup_or_decide, a hit", lambda: lookup_or_decide(plan, budget, store)),
        ("the whole step (_decide)", lambda: triton_autotune._decide(tuner, call, {})),
    ]
    if torch.accelerator.current_accelerator() is not None:  # upstream reads them flattened, twice a step
        rows.insert(0, ("allocator statistics, flattened (torch.accelerator.memory_stats)", torch.accelerator.memory_stats))
    fresh = iter(range(1, 10**9))

    def new_step() -> Any:  # another size each time: a miss, decided and stored
        n = next(fresh)
        return triton_autotune._decide(tuner, (call[0][:n], call[1][:n], call[2], n), {})

    rows.append(("a new step: a miss, decided and stored (_decide)", new_step))
    print(f"device {args.device} ({torch.cuda.get_device_name(0) if args.device == 'cuda' else 'faked as cuda:0'}), "
          f"torch {torch.__version__}, {args.reps} reps, medians")
    print("| piece | wall us | CPU us |\n|---|---|---|")
    for name, fn in rows:
        wall, cpu = timed(fn, args.reps)
        print(f"| {name} | {wall:.1f} | {cpu:.1f} |")
    if not args.skip_contended:
        contended(triton_autotune._decide, tuner, call, max(args.reps // 20, 20))
    whole_job(triton_autotune._decide, tuner, call)


def lookup_intervals(intervals: tuple[float | None, ...]) -> Iterator[str]:
    """Set each switch interval as the one a lookup uses (None: the default), in turn, yielding its label;
    prescreen's own setting is back once the loop ends."""
    from prescreen import service

    kept = service.LOOKUP_SWITCH_INTERVAL
    try:
        for interval in intervals:
            service.LOOKUP_SWITCH_INTERVAL = interval
            yield "default" if interval is None else f"{interval:g} s"
    finally:
        service.LOOKUP_SWITCH_INTERVAL = kept


def contended(decide: Callable[..., Any], tuner: Any, call: tuple[Any, ...], reps: int,
              intervals: tuple[float | None, ...] = (None, 1e-3, 1e-4)) -> None:
    """The same step beside two busy threads, at each switch interval a lookup may set (None: the default):
    threads running Python (they give the GIL up when asked), then threads in long native calls that hold it (as
    Triton's compiler does in Inductor's precompile threads; modelled by ``sorted`` of 200,000 floats). The
    store's reads release the GIL, and each time this thread waits to take it back."""
    import random
    import threading

    from prescreen import service

    floats = [random.random() for _ in range(200_000)]
    fresh = iter(range(10**6, 10**9))
    print(f"\nbeside two busy threads ({reps} reps, medians; ms of wall / of this thread's CPU; "
          f"prescreen sets {service.LOOKUP_SWITCH_INTERVAL} s):")
    print("| other threads | interval | a hit | a new step |\n|---|---|---|---|")
    for kind, work in (("running Python", lambda: None), ("in native calls", lambda: sorted(floats))):
        busy = [True]

        def spin(work: Callable[[], Any] = work, busy: list[bool] = busy) -> None:
            while busy[0]:
                work()

        threads = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        for label in lookup_intervals(intervals):
            hit = timed(lambda: decide(tuner, call, {}), reps)
            miss = timed(lambda: decide(tuner, (call[0][:next(fresh) % 2**19 + 1], *call[1:]), {}), reps)
            print(f"| {kind} | {label} | {hit[0] / 1e3:.2f} / "
                  f"{hit[1] / 1e3:.2f} | {miss[0] / 1e3:.2f} / {miss[1] / 1e3:.2f} |")
        busy[0] = False
        for t in threads:
            t.join()


def whole_job(decide: Callable[..., Any], tuner: Any, call: tuple[Any, ...], slices: int = 100, rounds: int = 3,
              intervals: tuple[float | None, ...] = (None, 1e-3, 1e-4)) -> None:
    """Does a step's wait for the GIL lengthen the job around it? A job: this thread's Python work in ``slices``
    slices, each followed by a hit or not, beside two threads doing a fixed amount of work (Python, or native
    calls that hold the GIL); it lasts until all three are done. Where every thread is GIL-bound, the waits hand
    the GIL to work the job must do anyway, and a step lengthens the job by about its CPU time, not by the wall
    it waited. Not modelled: a compiling thread that feeds worker processes idles them while it waits."""
    import random
    import threading

    floats = [random.random() for _ in range(100_000)]

    def job(work: Callable[[], Any], steps: bool) -> tuple[float, float, float]:
        others = [threading.Thread(target=lambda: [work() for _ in range(40)]) for _ in range(2)]
        inside = [0.0, 0.0]
        start = time.perf_counter()
        for t in others:
            t.start()
        for _ in range(slices):
            sum(range(20_000))  # this thread's own compile work
            if steps:
                w, c = time.perf_counter(), time.thread_time()
                decide(tuner, call, {})
                inside[0] += time.perf_counter() - w
                inside[1] += time.thread_time() - c
        for t in others:
            t.join()
        return time.perf_counter() - start, inside[0], inside[1]

    print(f"\na job: {slices} slices of this thread's work, with a hit after each or not, beside two threads doing "
          f"fixed work ({rounds} rounds, medians, ms):")
    print("| other threads | interval | job without | job with the hits | the hits' wall | the hits' CPU |\n"
          "|---|---|---|---|---|---|")
    for kind, work in (("running Python", lambda: sum(range(300_000))), ("in native calls", lambda: sorted(floats))):
        for label in lookup_intervals(intervals):
            without = statistics.median(job(work, False)[0] for _ in range(rounds))
            with_ = [statistics.median(x) for x in zip(*(job(work, True) for _ in range(rounds)))]
            print(f"| {kind} | {label} | {1e3 * without:.0f} | "
                  f"{1e3 * with_[0]:.0f} | {1e3 * with_[1]:.0f} | {1e3 * with_[2]:.1f} |")


if __name__ == "__main__":
    main()
