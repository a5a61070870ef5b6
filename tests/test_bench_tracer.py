"""The GPU bench's lookup tracer (``bench/gpu_coverage.py --trace-lookups``) on this machine.

It wraps a private function of the service; a change of that function's signature made
every guarded lookup of a device run fail (caught, so the compile benchmarked as upstream
would, and the run measured nothing). This runs the wrapper where CI can.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from prescreen import service
from prescreen.budget import Budget
from prescreen.store import DiskStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def test_traced_lookups_still_decide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # gpu_coverage sets one on import
    import bench_cold_lookup
    import gpu_coverage

    monkeypatch.setattr(service, "_lookup_or_decide", service._lookup_or_decide)  # put back afterwards
    gpu_coverage.trace_lookups()
    budget = Budget("cuda", 140 * 2**30, 0.9)
    with DiskStore(tmp_path) as store:
        first = service.lookup_or_decide(bench_cold_lookup.runtime_plan(1), budget, store)
        again = service.lookup_or_decide(bench_cold_lookup.runtime_plan(1), budget, store)
    assert (first.hit, again.hit, first.decision.tune) == (False, True, True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  lookup autotune:")]
    assert [" hit False " in lines[0], " hit True " in lines[1]] == [True, True]


def test_meter_tells_other_threads_work_from_an_idle_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard's wall beyond its CPU is a wait: the meter's process clock says whether other threads
    worked through it (as Inductor's compile threads do) or the process sat idle."""
    import threading
    import time

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import gpu_coverage

    def burn() -> None:
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass

    def waits_for_a_busy_thread() -> None:
        worker = threading.Thread(target=burn)
        worker.start()
        worker.join()

    for fn, busy in ((waits_for_a_busy_thread, True), (lambda: time.sleep(0.2), False)):
        wall: dict[str, float] = {"x": 0.0}
        own: dict[str, float] = {"x": 0.0}
        process: dict[str, float] = {"x": 0.0}
        waits: dict[str, list[float]] = {"x": [0.0, 0.0]}
        gpu_coverage.timed(fn, wall, "x", cpu_seconds=own, process_seconds=process, waits=waits)()
        others = process["x"] - own["x"]
        assert wall["x"] >= 0.19 and own["x"] < 0.05
        assert (others >= 0.15) is busy, (fn, wall, own, process)
        assert waits["x"][1] >= 1 and 0 <= waits["x"][0] <= own["x"] + 1e-3  # it waited: a voluntary switch


def test_pieces_count_each_piece_of_a_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--pieces`` times each piece of a step where a device run calls it: a new decision reads, decides, makes
    an entry and writes once; its hit only reads."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import bench_cold_lookup
    import gpu_coverage

    for owner, attr, _ in gpu_coverage.piece_sites():  # put back afterwards
        monkeypatch.setattr(owner, attr, inspect.getattr_static(owner, attr))
    monkeypatch.setattr(gpu_coverage, "PIECES", {})
    gpu_coverage.trace_pieces()
    budget = Budget("cuda", 140 * 2**30, 0.9)
    with DiskStore(tmp_path) as store:
        for _ in range(2):
            service.lookup_or_decide(bench_cold_lookup.runtime_plan(1), budget, store)
    calls = {k: int(n) for k, (n, _) in gpu_coverage.PIECES.items() if n}
    assert calls == {"key": 2, "store read": 2, "decide": 1, "entry": 1, "store write": 1}
    assert all(cpu > 0 for n, cpu in gpu_coverage.PIECES.values() if n)
