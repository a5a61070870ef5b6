"""Learning from a real OOM, simulated on CPU: retry with the fallback, a negative entry, reuse."""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from prescreen.budget import Budget
from prescreen.decision import Decision, is_observed_oom
from prescreen.errors import Reason
from prescreen.expr import Const
from prescreen.hooks import oom
from prescreen.hooks.inductor_select import ORIGINAL_ATTR
from prescreen.plan import KernelPlan, TensorArg
from prescreen.service import COUNTERS, lookup_or_decide, record_observed_oom
from prescreen.store import DiskStore
from prescreen.store.entry import Entry

OOM_TEXT = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB"


def _plan(n: int = 1024) -> KernelPlan:
    arg = TensorArg("x", "buffer", (Const(n), Const(n)), (Const(n), Const(1)), "torch.float16", "cuda:0")
    return KernelPlan(group_features=(), axis_names=(), axis_static_values=(), args=(arg,), kernel_name="select:mm")


BUDGET = Budget("cuda", 64 * 2**30, 0.25)


# ------------------------------------------------------------------ recognising an OOM


class NPUOutOfMemoryError(RuntimeError):
    pass


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError(OOM_TEXT),
    NPUOutOfMemoryError("device memory exhausted"),
    RuntimeError("NPU out of memory. Tried to allocate 20.00 MiB"),
])
def test_is_oom_recognises_cuda_npu_and_allocator_messages(exc: BaseException) -> None:
    assert oom.is_oom(exc)


def test_is_oom_follows_the_cause_chain_and_rejects_other_errors() -> None:
    try:
        try:
            raise torch.OutOfMemoryError(OOM_TEXT)
        except RuntimeError as inner:
            raise ValueError("benchmark failed") from inner
    except ValueError as outer:
        assert oom.is_oom(outer)
    assert not oom.is_oom(RuntimeError("invalid argument"))
    assert not oom.is_oom(type("OutOfResources", (Exception,), {})("out of resource: shared memory"))


def test_requested_bytes_is_read_off_the_message() -> None:
    assert oom.requested_bytes(torch.OutOfMemoryError(OOM_TEXT)) == 2 * 2**30
    assert oom.requested_bytes(RuntimeError("NPU out of memory. Tried to allocate 20.00 MiB")) == 20 * 2**20
    assert oom.requested_bytes(RuntimeError("out of memory")) is None


# ------------------------------------------------------------------ the negative entry


def test_observed_oom_replaces_a_computed_tune_and_is_reused(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "s")
    plan = _plan()
    first = lookup_or_decide(plan, BUDGET, store)
    assert first.decision.tune and not first.hit
    rec = record_observed_oom(plan, BUDGET, store, requested_bytes=2 * 2**30, free_bytes=123, error="OOM here")
    assert rec.key == first.key
    again = lookup_or_decide(plan, BUDGET, store)
    assert again.hit and again.decision.action == "fallback" and is_observed_oom(again.decision)
    obs = dict(t.split("=", 1) for t in again.decision.reason.split(" error=")[0].split(": ", 1)[1].split())
    assert obs["requested_bytes"] == str(2 * 2**30) and obs["free_bytes"] == "123"
    assert obs["estimated_bytes"] == str(first.decision.estimated_bytes)
    assert obs["host"] and obs["at"].endswith("Z") and again.decision.reason.endswith("error=OOM here")
    assert again.decision.reason.startswith(Reason.OBSERVED_OOM.value)


def test_a_computed_tune_never_overwrites_an_observed_oom(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "s")
    plan = _plan()
    rec = record_observed_oom(plan, BUDGET, store, requested_bytes=None, free_bytes=None)
    computed = lookup_or_decide(plan, BUDGET, None)  # what a fresh computation says: tune
    assert computed.decision.tune
    assert not store.put(Entry.new(computed.key, computed.entry.parts, plan, None, computed.decision))  # type: ignore[union-attr]
    hit = store.get(rec.key)
    assert hit is not None and is_observed_oom(hit.decision)


def test_a_fact_stored_between_a_lookups_read_and_its_put_is_the_answer(tmp_path: Path) -> None:
    """Another process records the fact after this lookup read the store and before its put: the put keeps
    the fact, and the lookup answers with it, not with the ``tune`` it computed."""
    theirs = record_observed_oom(_plan(), BUDGET, None, requested_bytes=1, free_bytes=2).entry
    assert theirs is not None

    class Racing(DiskStore):
        def put_all(self, entries: Sequence[Entry]) -> list[bool]:
            DiskStore.put_all(self, [theirs])  # the other process, just before
            return super().put_all(entries)

    with Racing(tmp_path / "s") as store:
        outcome = lookup_or_decide(_plan(), BUDGET, store)
        assert outcome.hit and is_observed_oom(outcome.decision) and outcome.decision == theirs.decision
        again = lookup_or_decide(_plan(), BUDGET, store)
        assert again.hit and is_observed_oom(again.decision)


def test_observed_entry_survives_json_validation() -> None:
    plan = _plan()
    rec = record_observed_oom(plan, BUDGET, None, requested_bytes=1, free_bytes=2)
    assert rec.entry is not None
    back = Entry.from_json(rec.entry.to_json())
    assert back.decision == rec.decision and back.decision.estimated_bytes <= back.decision.budget_bytes  # type: ignore[operator]


def test_a_plain_fallback_under_budget_is_still_rejected() -> None:
    plan = _plan()
    good = lookup_or_decide(plan, BUDGET, None).decision
    payload = good.to_payload()
    payload["action"] = "fallback"
    payload["reason"] = "made up"
    with pytest.raises(ValueError, match="contradicts"):
        Decision.from_payload(payload)


# ------------------------------------------------------------------ runtime autotuning (fake autotuner)


class _Launcher:
    def __init__(self, i: int) -> None:
        self.config = f"cfg{i}"


class _Fn:
    __name__ = "triton_poi_fused_add_0"
    arg_names = ["in_out_ptr0", "in_ptr0", "xnumel"]


class FakeAutotuner:
    """What ``benchmark_all_configs`` sees of a ``CachingAutotuner``."""

    def __init__(self, raise_oom: bool) -> None:
        self.fn = _Fn()
        self.mutated_arg_names = ["in_out_ptr0"]
        self.launchers = [_Launcher(0), _Launcher(1), _Launcher(2)]
        self.raise_oom = raise_oom
        self.benchmarked = 0
        self.zeroed = 0

    def reset_to_zero_args(self, *args: Any, **kwargs: Any) -> None:
        self.zeroed += 1

    def benchmark_all_configs(self, *args: Any, **kwargs: Any) -> dict[Any, float]:
        self.benchmarked += 1
        if self.raise_oom:
            raise torch.OutOfMemoryError(OOM_TEXT)
        return {launcher: float(3 - i) for i, launcher in enumerate(self.launchers)}


@pytest.fixture()
def gpu_like(monkeypatch: pytest.MonkeyPatch, guard_store: DiskStore) -> DiskStore:
    """The runtime guard as on a GPU: tensors "on cuda", 64 GiB device memory, a fresh store."""
    from prescreen.hooks import triton_autotune

    monkeypatch.setattr(triton_autotune, "_device_of", lambda _named: torch.device("cuda", 0))
    return guard_store


def _args() -> tuple[torch.Tensor, torch.Tensor, int]:
    return torch.zeros(1024, 1024), torch.zeros(1024, 1024), 1024 * 1024


def test_runtime_autotune_oom_takes_first_config_and_next_process_skips_benchmark(gpu_like: DiskStore) -> None:
    from prescreen.hooks import triton_autotune

    guarded = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)
    tuner = FakeAutotuner(raise_oom=True)
    timings = guarded(tuner, *_args())
    assert tuner.benchmarked == 1 and tuner.zeroed == 1
    best = min(timings, key=timings.get)  # what autotune_to_one_config keeps
    assert best is tuner.launchers[0] and timings[tuner.launchers[1]] == float("inf")
    entries = list(gpu_like.entries())
    assert len(entries) == 1 and is_observed_oom(entries[0].decision)
    assert entries[0].kernel == "autotune:triton_poi_fused_add_0"

    later = FakeAutotuner(raise_oom=True)  # would die again if benchmarked
    timings = guarded(later, *_args())
    assert later.benchmarked == 0 and min(timings, key=timings.get) is later.launchers[0]


def test_runtime_autotune_plan_counts_mutated_clones_and_flush() -> None:
    from prescreen.decision import decide
    from prescreen.hooks import triton_autotune

    tuner = FakeAutotuner(raise_oom=False)
    x, y, n = _args()
    plan = triton_autotune.plan_for_autotuner(tuner, (x, y, n), {})
    names = [a.name for a in plan.args]
    assert names == ["clone:in_out_ptr0"]  # CPU tensors: no flush buffer, only the clone
    assert decide(plan, BUDGET).estimated_bytes == x.numel() * 4


def test_runtime_autotune_over_budget_skips_the_benchmark(gpu_like: DiskStore) -> None:
    from prescreen.hooks import state, triton_autotune

    state.configure(ratio=1e-9)
    guarded = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)
    tuner = FakeAutotuner(raise_oom=False)
    timings = guarded(tuner, *_args())
    assert tuner.benchmarked == 0 and min(timings, key=timings.get) is tuner.launchers[0]
    entries = list(gpu_like.entries())
    assert len(entries) == 1 and entries[0].decision.action == "fallback" and not is_observed_oom(entries[0].decision)


def test_runtime_autotune_within_budget_benchmarks_as_upstream(gpu_like: DiskStore) -> None:
    from prescreen.hooks import triton_autotune

    guarded = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)
    tuner = FakeAutotuner(raise_oom=False)
    timings = guarded(tuner, *_args())
    assert tuner.benchmarked == 1 and min(timings, key=timings.get) is tuner.launchers[2]


def test_other_errors_in_runtime_autotune_propagate(gpu_like: DiskStore) -> None:
    """Raised once, from the one benchmark, never retried as the guard's own failure."""
    from prescreen.hooks import triton_autotune

    calls: list[int] = []

    class Broken(FakeAutotuner):
        def benchmark_all_configs(self, *args: Any, **kwargs: Any) -> dict[Any, float]:
            calls.append(1)
            raise ValueError("not an OOM")

    guarded = triton_autotune._wrap(Broken.benchmark_all_configs)
    with pytest.raises(ValueError, match="not an OOM"):
        guarded(Broken(raise_oom=False), *_args())
    assert len(calls) == 1
    stored = [e.decision for e in gpu_like.entries()]
    assert len(stored) == 1 and stored[0].tune  # the lookup's decision; no observed_oom


# ------------------------------------------------------------------ every runtime step is looked up


def test_a_step_that_fits_is_looked_up_and_its_decision_stored(gpu_like: DiskStore) -> None:
    from prescreen.hooks import triton_autotune

    before = dataclasses.replace(COUNTERS)
    tuner = FakeAutotuner(raise_oom=False)
    timings = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)(tuner, *_args())
    assert tuner.benchmarked == 1 and min(timings, key=timings.get) is tuner.launchers[2]  # upstream's answer
    assert COUNTERS.lookups == before.lookups + 1
    stored = list(gpu_like.entries())  # written before the step benchmarked: acknowledged means written
    assert len(stored) == 1 and stored[0].decision.tune and stored[0].kernel == "autotune:triton_poi_fused_add_0"


def test_a_step_that_runs_out_stores_the_fact_under_its_plan(gpu_like: DiskStore) -> None:
    from prescreen.hooks import state, triton_autotune

    guarded = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)
    tuner = FakeAutotuner(raise_oom=True)
    timings = guarded(tuner, *_args())
    assert tuner.benchmarked == 1 and min(timings, key=timings.get) is tuner.launchers[0]
    plan = triton_autotune.plan_for_autotuner(tuner, _args(), {})
    stored = gpu_like.get(lookup_or_decide(plan, state.budget_for(torch.device("cuda", 0)), None).key)
    assert stored is not None and is_observed_oom(stored.decision)
    later = FakeAutotuner(raise_oom=True)  # would run out again if benchmarked
    timings = guarded(later, *_args())
    assert later.benchmarked == 0 and min(timings, key=timings.get) is later.launchers[0]


def test_a_fact_written_without_this_prescreen_is_served_to_the_step(gpu_like: DiskStore) -> None:
    """An observed OOM put into the database directly (an older prescreen, a copied ``cache.db``): the step
    is looked up, so it falls back (the runtime screen once benchmarked it)."""
    from prescreen.hooks import state, triton_autotune

    tuner = FakeAutotuner(raise_oom=True)
    plan = triton_autotune.plan_for_autotuner(tuner, _args(), {})
    fact = record_observed_oom(plan, state.budget_for(torch.device("cuda", 0)), None, requested_bytes=1,
                               free_bytes=2).entry
    assert fact is not None and gpu_like._cache is not None
    gpu_like._cache.set(fact.key, fact.to_json())
    timings = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)(tuner, *_args())
    assert tuner.benchmarked == 0 and min(timings, key=timings.get) is tuner.launchers[0]


def test_a_cache_db_renamed_into_place_is_served_at_the_next_step(gpu_like: DiskStore, tmp_path: Path) -> None:
    """A ``cache.db`` holding an observed OOM for a step is renamed over the open store's (a copy deployed, a
    recovery elsewhere): the very next runtime step reads it and falls back (the runtime screen benchmarked
    such steps for 7 s and more)."""
    from prescreen.hooks import state, triton_autotune

    guarded = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)
    warmup = FakeAutotuner(raise_oom=False)
    guarded(warmup, torch.zeros(8, 8), torch.zeros(8, 8), 64)  # the store is open and has been read
    tuner = FakeAutotuner(raise_oom=True)
    plan = triton_autotune.plan_for_autotuner(tuner, _args(), {})
    budget = state.budget_for(torch.device("cuda", 0))
    with DiskStore(tmp_path / "elsewhere") as other:
        record_observed_oom(plan, budget, other, requested_bytes=1, free_bytes=2)
    live = sqlite3.connect(gpu_like.directory / "cache.db")
    live.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # a quiet moment: no write-ahead log left to
    live.close()  # replay (SQLite would lay it over whatever file is then named cache.db)
    os.replace(tmp_path / "elsewhere" / "cache.db", gpu_like.directory / "cache.db")
    timings = guarded(tuner, *_args())
    assert tuner.benchmarked == 0 and min(timings, key=timings.get) is tuner.launchers[0]


HOOKED_AND_KILLED = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[2])
import torch
from test_oom_retry import FakeAutotuner
from prescreen.hooks import state, triton_autotune
from prescreen.store import DiskStore
triton_autotune._device_of = lambda named: torch.device("cuda", 0)
state.configure(store=DiskStore(sys.argv[1]), device_memory="64GiB", ratio=0.25)
guarded = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)
for n in range(1, 21):
    guarded(FakeAutotuner(raise_oom=False), torch.zeros(n, 8), torch.zeros(n, 8), 8 * n)
os.kill(os.getpid(), signal.SIGKILL)  # no flush, no close, no exit handler
"""


def test_every_runtime_step_s_decision_is_stored_before_a_sigkill(tmp_path: Path) -> None:
    """Acknowledged means written: a guarded step's decision is in the store before the step goes on, so a
    process killed outright right after its steps loses none (a queued write was lost then)."""
    tests = str(Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", HOOKED_AND_KILLED, str(tmp_path), tests], timeout=300)
    assert proc.returncode == -signal.SIGKILL
    with DiskStore(tmp_path) as store:
        stored = list(store.entries())
    assert len(stored) == 20 and all(e.decision.tune for e in stored)


def test_warm_sees_every_step(gpu_like: DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An observer (``prescreen warm``'s report) gets every lookup, and each is stored."""
    from prescreen import service
    from prescreen.hooks import triton_autotune

    seen: list[str] = []
    monkeypatch.setattr(service, "OBSERVERS", [lambda outcome, plan: seen.append(plan.kernel_name)])
    triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)(FakeAutotuner(raise_oom=False), *_args())
    assert seen == ["autotune:triton_poi_fused_add_0"] and len(list(gpu_like.entries())) == 1


@pytest.mark.parametrize(("ratio", "coordesc_oom", "saved", "descended", "kept"), [
    (0.25, False, ["cfg2"], ["cfg2"], "cfg9"),  # within budget: upstream saves its winner and tunes around it
    (1e-9, False, [], [], "cfg0"),              # over budget: the first config, neither saved nor tuned around
    (0.25, True, ["cfg2"], ["cfg2"], "cfg2"),   # an OOM in coordinate descent keeps the launcher, stores the fact
])
def test_a_runtime_fallback_is_never_saved_nor_tuned_by_coordinate_descent(
    gpu_like: DiskStore, ratio: float, coordesc_oom: bool, saved: list[str], descended: list[str], kept: str
) -> None:
    from prescreen.hooks import state, triton_autotune

    tuned: list[str] = []

    class Tuner(FakeAutotuner):
        benchmark_all_configs = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)

        @triton_autotune._wrap_one_config
        def autotune_to_one_config(self, *args: Any, **kwargs: Any) -> Any:
            timings = self.benchmark_all_configs(*args, **kwargs)
            self.save_cache_hook(min(timings, key=timings.get).config)
            return min(timings, key=timings.get)

        @triton_autotune._wrap_coordesc
        def coordinate_descent_tuning(self, launcher: Any, *args: Any, **kwargs: Any) -> Any:  # where upstream descends
            tuned.append(launcher.config)
            if coordesc_oom:
                raise torch.OutOfMemoryError(OOM_TEXT)
            return _Launcher(9)

    state.configure(ratio=ratio)
    tuner, written = Tuner(raise_oom=False), []
    tuner.save_cache_hook = written.append
    best = tuner.autotune_to_one_config(*_args())
    assert tuner.coordinate_descent_tuning(best, *_args()).config == kept
    assert (written, tuned) == (saved, descended)
    assert [is_observed_oom(e.decision) for e in gpu_like.entries()] == [coordesc_oom]
    if kept != "cfg9":  # skipped: answered at once from then on
        assert tuner.coordinate_descent_tuning(best, *_args()) is best and tuned == descended


def test_coordinate_descent_after_a_tuned_runtime_step_takes_its_decision(gpu_like: DiskStore) -> None:
    """Upstream descends right after the runtime step, on the same arguments: the plan and key are the same,
    so the step's decision is taken, once; another kernel's descent, or a later one, looks up for itself."""
    from prescreen import service
    from prescreen.hooks import triton_autotune

    class Tuner(FakeAutotuner):
        benchmark_all_configs = triton_autotune._wrap(FakeAutotuner.benchmark_all_configs)

        @triton_autotune._wrap_one_config
        def autotune_to_one_config(self, *args: Any, **kwargs: Any) -> Any:
            timings = self.benchmark_all_configs(*args, **kwargs)
            return min(timings, key=timings.get)

        @triton_autotune._wrap_coordesc
        def coordinate_descent_tuning(self, launcher: Any, *args: Any, **kwargs: Any) -> Any:  # where upstream descends
            return _Launcher(9)

    def lookups(step: Callable[[], Any]) -> int:
        before = service.COUNTERS.lookups
        step()
        return service.COUNTERS.lookups - before

    tuner, other = Tuner(raise_oom=False), Tuner(raise_oom=False)
    best = tuner.autotune_to_one_config(*_args())
    assert lookups(lambda: other.coordinate_descent_tuning(best, *_args())) == 1  # not another kernel's
    assert lookups(lambda: tuner.coordinate_descent_tuning(best, *_args())) == 1  # cleared by the other's
    best = tuner.autotune_to_one_config(*_args())
    assert lookups(lambda: tuner.coordinate_descent_tuning(best, *_args())) == 0
    assert lookups(lambda: tuner.coordinate_descent_tuning(best, *_args())) == 1  # taken once


# ------------------------------------------------------------------ a real CPU compile (algorithm selection)


class _Bmm(torch.nn.Module):
    """bmm with a weight: under max-autotune on CPU Inductor offers its C++ bmm template and ATen."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.w)


@pytest.mark.slow
def test_selection_oom_retries_with_aten_then_next_compile_hits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bmm under max-autotune on CPU: Inductor offers the C++ bmm template and ATen. Every
    synthesized benchmark input raises OOM (the allocation hook); the compile still completes
    with ATen, equal to eager, and the second compile hits the observed_oom entry and never
    allocates a benchmark input."""
    import torch._inductor.config as ic
    from torch._inductor import select_algorithm as sa

    import prescreen
    from prescreen.hooks import state

    calls = {"n": 0}

    def oom_allocation(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["n"] += 1
        raise torch.OutOfMemoryError(OOM_TEXT)

    monkeypatch.setattr(sa, "rand_strided", oom_allocation)

    torch.manual_seed(0)
    model, x = _Bmm().eval(), torch.randn(4, 16, 32)
    state.reset()
    store = DiskStore(tmp_path / "store")
    outs = []
    counts = []
    for _ in range(2):
        torch._dynamo.reset()
        before = calls["n"]
        with ic.patch(freezing=True, fx_graph_cache=False, autotune_local_cache=False), \
                prescreen.installed(store=store, device_memory="64GiB", ratio=0.25), torch.no_grad():
            outs.append(torch.compile(model, dynamic=True, mode="max-autotune")(x))
        counts.append(calls["n"] - before)
    state.reset()
    with torch.no_grad():
        ref = model(x)
    for out in outs:
        torch.testing.assert_close(out, ref)
    assert counts[0] >= 1 and counts[1] == 0
    observed = [e for e in store.entries() if is_observed_oom(e.decision)]
    assert len(observed) == 1 and observed[0].kernel == "select:bmm"


#: On the autotune subprocess's path: every input it synthesizes raises OOM, as on a device too full for them.
CHILD_OOM = f"""
import torch
from torch._inductor import autotune_process


def _oom(self, *args, **kwargs):
    raise torch.OutOfMemoryError({OOM_TEXT!r})


autotune_process.TensorMeta.to_tensor = _oom
"""


@pytest.mark.slow
def test_an_oom_answered_by_the_autotune_subprocess_is_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``autotune_in_subproc``: upstream benchmarks the C++ bmm template in its tuning subprocess, where the
    inputs raise OOM (a ``sitecustomize`` on its path), times it inf and picks ATen: the guard sees no error.
    The fact is stored all the same, and the next compile falls back without benchmarking."""
    import torch._inductor.config as ic
    from torch._inductor import autotune_process

    import prescreen
    from prescreen.hooks import inductor_select, state

    site = tmp_path / "child-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CHILD_OOM)
    monkeypatch.syspath_prepend(str(site))  # the subprocess's PYTHONPATH is this process's sys.path
    upstream = autotune_process.benchmark_in_sub_process
    sent: list[int] = []

    def counted(choices: Any) -> Any:
        sent.append(len(choices))
        return upstream(choices)

    monkeypatch.setattr(autotune_process, "benchmark_in_sub_process", counted)
    autotune_process.get_tuning_process_pool.cache_clear()

    torch.manual_seed(0)
    model, x = _Bmm().eval(), torch.randn(4, 16, 32)
    state.reset()
    store = DiskStore(tmp_path / "store")
    outs, benchmarked = [], []
    try:
        for _ in range(2):
            torch._dynamo.reset()
            before = len(sent)
            with ic.patch(freezing=True, fx_graph_cache=False, autotune_local_cache=False, autotune_in_subproc=True), \
                    prescreen.installed(store=store, device_memory="64GiB", ratio=0.25), torch.no_grad():
                outs.append(torch.compile(model, dynamic=True, mode="max-autotune")(x))
            benchmarked.append(len(sent) - before)
    finally:
        state.reset()
        autotune_process.get_tuning_process_pool().shutdown()
        autotune_process.get_tuning_process_pool.cache_clear()
    with torch.no_grad():
        ref = model(x)
    for out in outs:
        torch.testing.assert_close(out, ref)
    assert benchmarked == [1, 0]  # the template went to the subprocess once; the second compile fell back
    observed = [e for e in store.entries() if is_observed_oom(e.decision)]
    assert len(observed) == 1 and observed[0].kernel == "select:bmm"
    assert "Tried to allocate 2.00 GiB" in observed[0].decision.reason
    assert inductor_select._answered == [] and inductor_select._running == [0]


def test_a_subprocess_oom_is_stored_even_where_upstream_then_fails(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The subprocess answered OOM (upstream timed the choice inf), then ``autotune`` failed for another reason:
    that error propagates, and the fact is stored all the same."""
    import types

    import prescreen
    from prescreen.hooks import inductor_select as sel

    aten = object()
    monkeypatch.setattr(sel, "_fallback_choice", lambda choices: aten)
    monkeypatch.setattr(sel, "plan_for_selection", lambda name, input_nodes, layout: _plan(4096))

    def answer(self: Any, timeout: float = 120.0) -> Any:
        raise torch.OutOfMemoryError(OOM_TEXT)

    get = sel._wrap_process_get(answer)

    def upstream(self: Any, name: str, input_nodes: Any, layout: Any, input_gen_fns: Any, choices: Any) -> Any:
        with pytest.raises(torch.OutOfMemoryError):  # TuningProcessPool.target catches it: an inf timing
            get(None)
        raise RuntimeError("a later failure")

    store = DiskStore(tmp_path / "store")
    with prescreen.installed(store=store, device_memory="64GiB"), pytest.raises(RuntimeError, match="later"):
        sel._wrap_autotune(upstream)(None, "mm", [], types.SimpleNamespace(device=torch.device("cpu")), None,
                                     [aten])
    observed = [e for e in store.entries() if is_observed_oom(e.decision)]
    assert len(observed) == 1 and "Tried to allocate 2.00 GiB" in observed[0].decision.reason
    assert sel._answered == [] and sel._running == [0]


# ------------------------------------------------------------------ CLI: inspect marks them, clear --observed removes them


def test_cli_inspect_marks_and_clear_observed_removes_only_observed(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from prescreen.cli import cli

    cache = tmp_path / "s"
    with DiskStore(cache) as store:
        record_observed_oom(_plan(1024), BUDGET, store, requested_bytes=2 * 2**30, free_bytes=10)
        lookup_or_decide(_plan(2048), BUDGET, store)  # a computed tune stays
    env = {"COLUMNS": "250", "PRESCREEN_CACHE_DIR": None, "PRESCREEN_REDIS_URL": None}
    shown = CliRunner().invoke(cli, ["--cache-dir", str(cache), "inspect"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "fallback!" in shown.output and "observed_oom" in shown.output
    gone = CliRunner().invoke(cli, ["--cache-dir", str(cache), "clear", "--observed", "--yes"], env=env)
    assert gone.exit_code == 0, gone.output
    assert "1 entries removed" in gone.output
    with DiskStore(cache) as store:
        left = list(store.entries())
    assert len(left) == 1 and left[0].decision.tune
    both = CliRunner().invoke(cli, ["--cache-dir", str(cache), "clear", "--observed", "--all", "--yes"], env=env)
    assert both.exit_code == 2 and "error:" in both.output


class _MemTuner(FakeAutotuner):
    """Three mutated args of 4, 2 and 1 MiB (float32), as ``optimize_mem`` (inference) compiles them."""

    def __init__(self, optimize_mem: bool) -> None:
        super().__init__(raise_oom=False)
        self.fn.arg_names = ["in_out_ptr0", "in_out_ptr1", "in_out_ptr2", "xnumel"]  # type: ignore[misc]
        self.mutated_arg_names = ["in_out_ptr0", "in_out_ptr1", "in_out_ptr2"]
        self.optimize_mem = optimize_mem


MIB = 2**20


def _mem_args() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    return torch.zeros(MIB), torch.zeros(MIB // 2), torch.zeros(MIB // 4), MIB


@pytest.mark.parametrize(("headroom", "flush", "expected"), [
    (None, 0, ["in_out_ptr0", "in_out_ptr1", "in_out_ptr2"]),  # no allocator statistics: upstream clones all
    (0, 0, []),                                                 # no headroom: every arg goes to the host
    (3 * MIB, 0, ["in_out_ptr1", "in_out_ptr2"]),               # 4 MiB does not fit; 2 + 1 do
    (7 * MIB, 0, ["in_out_ptr0", "in_out_ptr1", "in_out_ptr2"]),
    # the peak rises between the three configs: headroom 0, then the flush (2 MiB: the 2 MiB arg is
    # cloned), then flush + 2 MiB (the 4 MiB arg): the largest set any config clones is kept
    (0, 2 * MIB, ["in_out_ptr0"]),
    (MIB, 3 * MIB, ["in_out_ptr0", "in_out_ptr1", "in_out_ptr2"]),  # headroom 1 -> 4 -> 7 MiB
    (0, 7 * MIB, ["in_out_ptr0", "in_out_ptr1", "in_out_ptr2"]),  # the flush alone holds all 7 MiB
    (0, 7 * MIB - 1, ["in_out_ptr0", "in_out_ptr1", "in_out_ptr2"]),  # 1 byte short: 0 -> 7 MiB - 1 -> 13 MiB - 1
])
def test_runtime_plan_mirrors_upstreams_host_copy_rule(monkeypatch: pytest.MonkeyPatch, headroom: int | None,
                                                       flush: int, expected: list[str]) -> None:
    """Under ``optimize_mem`` upstream clones a mutated arg only if it fits under the peak's headroom."""
    from prescreen.hooks import triton_autotune

    monkeypatch.setattr(triton_autotune, "HOST_COPY_DEVICES", ("cpu",))
    monkeypatch.setattr(triton_autotune, "_peak_headroom", lambda: headroom)
    tuner = _MemTuner(optimize_mem=True)
    named = triton_autotune._named_args(tuner, _mem_args(), {})
    kept = triton_autotune._device_clones(tuner, named, torch.device("cpu"), flush)
    assert [name for name, _ in kept] == expected
    if headroom == 0:
        tuner.launchers = tuner.launchers[:1]  # one config: nothing is benchmarked after the flush
        assert triton_autotune._device_clones(tuner, named, torch.device("cpu"), flush) == []


def test_runtime_plan_without_optimize_mem_clones_every_mutated_arg(monkeypatch: pytest.MonkeyPatch) -> None:
    from prescreen.hooks import triton_autotune

    monkeypatch.setattr(triton_autotune, "HOST_COPY_DEVICES", ("cpu",))
    monkeypatch.setattr(triton_autotune, "_peak_headroom", lambda: 0)
    plan = triton_autotune.plan_for_autotuner(_MemTuner(optimize_mem=False), _mem_args(), {})
    assert [a.name for a in plan.args] == ["clone:in_out_ptr0", "clone:in_out_ptr1", "clone:in_out_ptr2"]


def _allocator_stats(peak: int, current: int) -> dict[str, Any]:
    """The nested statistics the allocator reports (the shape ``torch.accelerator.memory_stats`` flattens)."""
    names = ("allocated", "allocated_bytes", "reserved_bytes", "active_bytes")
    nested: dict[str, Any] = {name: {pool: {"current": 10 * i + j, "peak": 10 * i + j + 5, "allocated": 1, "freed": 1}
                                     for j, pool in enumerate(("all", "large_pool", "small_pool"))}
                              for i, name in enumerate(names)}
    nested["allocated_bytes"]["all"].update(current=current, peak=peak)
    return {**nested, "num_ooms": 0, "num_alloc_retries": 0}


@pytest.mark.parametrize(("accelerator", "initialized", "expected"), [
    (torch.device("cuda", 0), True, 7 * MIB),
    (torch.device("cuda", 0), False, 0),  # no allocation yet: upstream reads empty statistics
    (None, True, None),  # no accelerator: upstream clones every mutated arg
])
@pytest.mark.parametrize("nested_read", [True, False])  # False: the nested answer laid out otherwise
def test_peak_headroom_is_what_upstream_reads(monkeypatch: pytest.MonkeyPatch, accelerator: Any, initialized: bool,
                                              expected: int | None, nested_read: bool) -> None:
    """One read of the allocator's statistics gives what upstream's two calls give, computed by upstream's own
    ``max_memory_allocated() - memory_allocated()`` over the same allocator answer."""
    import torch.accelerator.memory as acc_memory

    from prescreen.hooks import triton_autotune

    acc = torch.accelerator
    monkeypatch.setattr(acc, "current_accelerator", lambda *a, **k: accelerator)
    monkeypatch.setattr(torch._C, "_accelerator_getDeviceIndex", lambda: 0)
    monkeypatch.setattr(torch._C, "_accelerator_isAllocatorInitialized", lambda: initialized)
    answer = _allocator_stats(11 * MIB, 4 * MIB)
    monkeypatch.setattr(torch._C, "_accelerator_getDeviceStats", lambda index: answer)
    if expected is not None:  # the expression upstream's copy_args_to_cpu_if_needed evaluates
        assert expected == acc.max_memory_allocated() - acc.memory_allocated()
    if not nested_read:  # the nested answer laid out otherwise: the public, flattened read is used
        flat = dict(acc.memory_stats())
        monkeypatch.setattr(torch._C, "_accelerator_getDeviceStats", lambda index: {"renamed": answer})
        for module in (acc, acc_memory):
            monkeypatch.setattr(module, "memory_stats", lambda *a: flat)
    assert triton_autotune._peak_headroom() == expected

    def custom_allocator(index: int) -> dict[str, Any]:
        raise RuntimeError("custom allocator: no statistics")

    monkeypatch.setattr(torch._C, "_accelerator_isAllocatorInitialized", lambda: True)
    monkeypatch.setattr(torch._C, "_accelerator_getDeviceStats", custom_allocator)
    assert triton_autotune._peak_headroom() is None


@pytest.mark.parametrize(("heuristic", "looked_up"), [
    ("TEMPLATE", False), ("USER_AUTOTUNE", False), ("FIXED", False), ("POINTWISE", True)])
def test_only_a_kernel_upstream_descends_reaches_the_guard(gpu_like: DiskStore, heuristic: str, looked_up: bool) -> None:
    """Upstream asks for coordinate descent at every launch, each repetition of a compile-time benchmark
    included (8,000 asks in one GPT-2 compile on an H100): the guard sits where upstream's own
    ``coordinate_descent_tuning`` goes on to descend, so a kernel upstream never tunes costs nothing."""
    from torch._inductor.runtime.hints import HeuristicType
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from prescreen.hooks import triton_autotune

    class Tuner(FakeAutotuner):
        heuristic_type = HeuristicType[heuristic]
        deterministic_mode, compile_id, is_backward, inductor_meta = False, None, False, {"kernel_name": "k"}
        coordinate_descent_tuning = CachingAutotuner.coordinate_descent_tuning  # upstream's, unwrapped

        @triton_autotune._wrap_coordesc
        def _coordinate_descent_tuning(self, launcher: Any, *args: Any, **kwargs: Any) -> Any:
            return launcher

    should = CachingAutotuner.__dict__.get("_should_coordesc_tune")  # torch >= 2.12: a cached property
    if should is not None:
        Tuner._should_coordesc_tune = should  # type: ignore[attr-defined]
        should.__set_name__(Tuner, "_should_coordesc_tune")
    tuner = Tuner(raise_oom=False)
    for _ in range(3):
        assert tuner.coordinate_descent_tuning(tuner.launchers[0], *_args()) is tuner.launchers[0]
    assert len(list(gpu_like.entries())) == int(looked_up)
    try:  # and that is where the guard is installed
        assert triton_autotune.patch()
        assert hasattr(CachingAutotuner.__dict__["_coordinate_descent_tuning"], ORIGINAL_ATTR)
        assert not hasattr(CachingAutotuner.__dict__["coordinate_descent_tuning"], ORIGINAL_ATTR)
    finally:
        triton_autotune.unpatch()
