"""What one guarded runtime step costs, piece by piece: the plan, the budget, the key, the store read.

A Triton kernel's first call (runtime autotuning, then coordinate descent) asks prescreen once; on a short
compile that call is most of the hook's share. This times each piece of ``triton_autotune._decide`` on real
device tensors (three mutated arguments, ``optimize_mem`` on, as inference compiles them), a warm store,
nothing else running: microseconds of wall and of this thread's CPU, medians of ``--reps`` rounds.

    python -P bench/bench_runtime_step.py [--device cuda] [--reps 2000]

On CPU the device is faked as ``cuda:0`` (the allocator statistics then read 0).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
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
        ("allocator statistics (torch.accelerator.memory_stats)", triton_autotune._peak_headroom),
        ("plan (plan_for_autotuner)", lambda: triton_autotune.plan_for_autotuner(tuner, call, {})),
        ("budget (state.budget_for)", lambda: state.budget_for(cuda)),
        ("key (build_key)", lambda: build_key(plan, budget)),
        ("store read, a hit (DiskStore.lookup)", lambda: store.lookup(key)),  # type: ignore[union-attr]
        ("lookup_or_decide, a hit", lambda: lookup_or_decide(plan, budget, store)),
        ("the whole step (_decide)", lambda: triton_autotune._decide(tuner, call, {})),
    ]
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
    contended(triton_autotune._decide, tuner, call, max(args.reps // 20, 20))


def contended(decide: Callable[..., Any], tuner: Any, call: tuple[Any, ...], reps: int) -> None:
    """The same step while two other threads run Python (as Inductor's precompile threads do): the store's reads
    release the GIL, and taking it back waits out the switch interval, unless a lookup shortens it."""
    import threading

    from prescreen import service

    busy = [True]

    def spin() -> None:
        while busy[0]:
            pass

    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    fresh = iter(range(10**6, 10**9))
    short = service.LOOKUP_SWITCH_INTERVAL
    results = {}
    for interval in (None, short):
        service.LOOKUP_SWITCH_INTERVAL = interval
        hit = timed(lambda: decide(tuner, call, {}), reps)[0]
        miss = timed(lambda: decide(tuner, (call[0][:next(fresh) % 2**19 + 1], *call[1:]), {}), reps)[0]
        results[interval] = (hit, miss)
    busy[0] = False
    service.LOOKUP_SWITCH_INTERVAL = short
    (hit0, miss0), (hit1, miss1) = results[None], results[short]
    print(f"\nwith two busy threads ({reps} reps, medians): a hit {hit0 / 1e3:.2f} ms with the default switch interval, "
          f"{hit1 / 1e3:.2f} ms with {short} s during lookups ({hit0 / hit1:.0f}x); a new step {miss0 / 1e3:.2f} ms vs "
          f"{miss1 / 1e3:.2f} ms ({miss0 / miss1:.0f}x)")


if __name__ == "__main__":
    main()
