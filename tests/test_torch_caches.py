"""prescreen beside torch's own compile caches, left at their defaults (FX graph, AOTAutograd, mega-cache,
the local autotune timing cache), in real processes on CPU.

The model (``examples/tiny_models.py:pair_bmm``) is a bmm Inductor autotunes on CPU without ``freezing``
(C++ template vs ATen), so its compile is one the FX graph and AOTAutograd caches keep.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests/scripts/cached_compile.py"
pytestmark = pytest.mark.slow
TINY = "1e-9"  # a ratio under which every selection falls back


def run(inductor: Path, store: Path, memory: str, ratio: str, sizes: str = "8", *extra: str) -> dict[str, Any]:
    """One process compiling ``pair_bmm`` at ``sizes`` with the hooks installed; its RESULT line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESCREEN", "TORCHINDUCTOR", "TORCH_COMPILE"))}
    env.update(PRESCREEN_CACHE_DIR=str(store), TORCHINDUCTOR_CACHE_DIR=str(inductor),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "examples"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(SCRIPT), memory, ratio, sizes, *extra], env=env,
                          capture_output=True, text=True, timeout=600, cwd=inductor.parent)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(line[7:])
    result["stderr"] = proc.stderr
    assert result["equal"]
    return result


def test_a_fallback_does_not_leak_to_a_process_with_another_budget(tmp_path: Path) -> None:
    inductor, store = tmp_path / "inductor", tmp_path / "store"
    a = run(inductor, store, "64GiB", TINY)
    assert a["fell_back"] >= 1 and a["fx_miss"] >= 1 and a["benchmarks"] == 0
    b = run(inductor, store, "64GiB", "0.25")  # another budget: its own FX key, its own decision
    assert b["fx_hit"] == 0 and b["lookups"] >= 1 and b["fell_back"] == 0 and b["benchmarks"] > 0
    assert a["tags"][0] != b["tags"][0] and all(t.startswith("prescreen-") for t in a["tags"] + b["tags"])
    c = run(inductor, store, "64GiB", TINY)  # the same budget reuses A's compile: nothing to decide
    assert c["fx_hit"] >= 1 and c["lookups"] == 0 and c["benchmarks"] == 0


def test_a_users_own_tag_is_kept_and_prescreens_appended(tmp_path: Path) -> None:
    env_tag = "team-a"
    os.environ["TORCH_COMPILE_CACHE_KEY_TAG"] = env_tag
    try:
        script = ("import torch, prescreen\nfrom prescreen.hooks import cache_tag\n"
                  "prescreen.install(device_memory='64GiB', ratio=0.25)\n"
                  "print(cache_tag.apply(torch.device('cpu')), torch.compiler.config.cache_key_tag)\n"
                  "prescreen.uninstall()\nprint(torch.compiler.config.cache_key_tag)\n")
        env = dict(os.environ, PRESCREEN_CACHE_DIR=str(tmp_path / "s"))
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             timeout=300).stdout.split()
    finally:
        del os.environ["TORCH_COMPILE_CACHE_KEY_TAG"]
    ours, tag, after = out
    assert ours.startswith("prescreen-") and tag == f"{env_tag}+{ours}" and after == env_tag


def test_the_mega_cache_carries_no_fallback_to_a_machine_with_another_budget(tmp_path: Path) -> None:
    artifact = tmp_path / "megacache.bin"
    a = run(tmp_path / "ind-a", tmp_path / "store-a", "64GiB", TINY, "8", "--save", str(artifact))
    assert a["fell_back"] >= 1 and artifact.stat().st_size > 0
    with ThreadPoolExecutor(2) as pool:  # two machines loading the artifact, independent of each other
        other, same = pool.map(lambda at: run(tmp_path / f"ind-{at[0]}", tmp_path / f"store-{at[0]}", "64GiB", at[1],
                                              "8", "--load", str(artifact)), [("b", "0.25"), ("c", TINY)])
    assert other["fx_hit"] == 0 and other["lookups"] >= 1 and other["fell_back"] == 0 and other["benchmarks"] > 0
    assert same["fx_hit"] >= 1 and same["lookups"] == 0 and same["benchmarks"] == 0


def _local_timings(inductor: Path) -> dict[str, Any]:
    files = list((inductor / "cache").glob("*"))
    assert len(files) == 1, files
    found: dict[str, Any] = json.loads(files[0].read_text())["cache"]
    return found


def test_an_oom_retry_writes_no_timings_so_a_larger_device_tunes_again(tmp_path: Path) -> None:
    inductor, store = tmp_path / "inductor", tmp_path / "store"
    a = run(inductor, store, "64GiB", "0.25", "8", "--oom")
    assert "ran out of memory" in a["stderr"] and a["benchmarks"] == 0
    assert not (inductor / "cache").exists() or not _local_timings(inductor).get("bmm")
    b = run(inductor, store, "128GiB", "0.25")  # the README's advice: a larger device
    assert b["fx_hit"] == 0 and b["fell_back"] == 0 and b["benchmarks"] > 0


def test_where_every_choice_has_a_cached_timing_upstream_chooses(tmp_path: Path) -> None:
    inductor, store = tmp_path / "inductor", tmp_path / "store"
    a = run(inductor, store, "64GiB", "0.25")
    assert a["benchmarks"] > 0
    # Make the template the cached winner, whatever this machine measured.
    path = next((inductor / "cache").glob("*"))
    data = json.loads(path.read_text())
    for per_precision in data["cache"]["bmm"].values():
        for timings in per_precision.values():
            for choice in timings:
                timings[choice] = 1.0 if choice.startswith("bmm") or "aten" in choice.lower() else 0.001
    path.write_text(json.dumps(data))
    b = run(inductor, store, "64GiB", TINY)  # would fall back: but upstream benchmarks nothing here
    assert b["fx_hit"] == 0 and b["lookups"] >= 1 and b["benchmarks"] == 0
    assert b["template"] == 1 and b["extern"] == 0


WARM = """
import json, sys
from torch._dynamo.utils import counters
from prescreen.store import DiskStore
from prescreen.target import parse_shape
from prescreen.warm import warm_model
report = warm_model(sys.argv[4], (parse_shape("batch=4..16"),), DiskStore(sys.argv[1]),
                    device_memory="64GiB", ratio=float(sys.argv[2]), plan_only=sys.argv[3] == "plan")
out = report.to_json()
out["benchmarks"] = sum(v for k, v in counters["inductor"].items() if k.startswith("benchmarking."))
print("RESULT " + json.dumps(out))
"""


def warm(tmp_path: Path, ratio: str, how: str = "full", target: str = "tiny_models:pair_bmm") -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESCREEN", "TORCHINDUCTOR", "TORCH_COMPILE"))}
    paths = [str(ROOT / "examples"), str(ROOT / "tests" / "scripts"), os.environ.get("PYTHONPATH")]
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), PYTHONPATH=os.pathsep.join(filter(None, paths)))
    tmp_path.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", WARM, str(tmp_path / "store"), ratio, how, target], env=env,
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(line[7:])
    return result


def test_warm_decides_every_family_with_the_caches_on_and_again_under_another_budget(tmp_path: Path) -> None:
    first = warm(tmp_path, "0.25")
    assert first["families"] == 3 and first["compiles"] == 3
    assert first["decisions_made"] == 3 and first["decided_families"] == 3
    assert first["cache_answered"] == 2  # batch 8 and 16 were answered by batch 4's FX graph, then lowered again
    other = warm(tmp_path, TINY)  # another budget: its own torch cache keys, its own decisions
    assert other["decisions_made"] == 3 and other["fell_back"] == 3 and other["cache_answered"] == 2
    assert not other["hints"]


def _keys(report: dict[str, Any]) -> set[str]:
    return {d["key"] for d in report["decisions"]}


def test_plan_only_lowers_once_per_graph_and_decides_what_a_full_warm_decides(tmp_path: Path) -> None:
    runs = {"plan": ("plan", "tiny_models:pair_bmm"), "full": ("full", "tiny_models:pair_bmm"),
            "branchy": ("plan", "plan_targets:branchy_bmm"), "normed": ("plan", "plan_targets:normed_bmm"),
            "tied": ("plan", "plan_targets:tied_bmm")}
    with ThreadPoolExecutor(2) as pool:  # independent processes and directories, two at a time
        done = dict(zip(runs, pool.map(lambda n: warm(tmp_path / n, "0.25", *runs[n]), runs)))
    planned, full, branchy, normed, tied = (done[n] for n in runs)
    assert planned["plan_only"] and planned["decisions_made"] == 3 and planned["tuned"] == 3
    assert planned["compiles"] == 1 and planned["carried"] == 2 and planned["decided_families"] == 3
    assert planned["benchmarks"] == 0 and planned["cache_answered"] == 0
    assert not (tmp_path / "plan" / "inductor" / "cache").exists()  # no timings written
    assert full["compiles"] == 3 and _keys(full) == _keys(planned)  # every family lowered and benchmarked
    # A guard on the batch (a branch above 8): 4 carries 7, 15 is lowered itself; the same bmm plans.
    assert branchy["compiles"] == 2 and branchy["carried"] == 1 and _keys(branchy) == _keys(full)
    # A layer norm's eps is a float symbol with guards of its own (as in GPT-2): they hold at every batch.
    assert normed["compiles"] == 1 and normed["carried"] == 2 and _keys(normed) == _keys(full)
    # A size that follows the batch without being it: nothing is carried.
    assert tied["compiles"] == 3 and tied["carried"] == 0 and _keys(tied) == _keys(full)


def test_a_plan_only_lowering_generates_one_template_choice_per_selection() -> None:
    """The decision needs only that a template competes with ATen: later configs of the same selection (its
    layout) read as not applying, unrendered; another selection generates its own; upstream's method is back
    after the lowering."""
    from torch._inductor.codegen.common import KernelTemplate

    from prescreen import warm

    rendered: list[str] = []

    class Template(KernelTemplate):
        def generate(self, **kwargs: Any) -> Any:
            rendered.append(kwargs["config"])
            if kwargs["config"] == "unsupported":
                raise NotImplementedError("does not apply")
            return kwargs["config"]

    template, first, second = Template("t"), object(), object()
    upstream = KernelTemplate.maybe_append_choice
    with warm._planning_lowering():
        choices: list[Any] = []
        for layout, config in ((first, "unsupported"), (first, "a"), (first, "b"), (second, "c"), (second, "d")):
            template.maybe_append_choice(choices, layout=layout, config=config)
        assert choices == ["a", "c"] and rendered == ["unsupported", "a", "c"]
    assert KernelTemplate.maybe_append_choice is upstream
    template.maybe_append_choice(choices, layout=first, config="b")
    assert choices == ["a", "c", "b"]


def test_aoti_compile_and_package_is_guarded_with_per_kernel_autotune_arguments(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from tiny_models import pair_bmm
    from torch._inductor import config as ic

    import prescreen
    from prescreen.hooks import state
    from prescreen.store import DiskStore

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    state.reset()
    seen: list[bool] = []
    model, inputs = pair_bmm(batch=8)
    store = DiskStore(tmp_path / "store")
    batch = torch.export.Dim("batch", min=2, max=64)
    with prescreen.installed(store=store, device_memory="64GiB", ratio=1e-9):
        program = torch.export.export(model, inputs, dynamic_shapes=({0: batch}, {0: batch}))
        path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "m.pt2"),
                                                        inductor_configs={"max_autotune": True})
        seen.append(bool(ic.aot_inductor.autotune_per_kernel_alloc))
    assert seen == [True] and not ic.aot_inductor.autotune_per_kernel_alloc  # given back after
    state.reset()
    entries = list(store.entries())
    assert [(e.kernel, e.decision.action) for e in entries] == [("select:bmm", "fallback")]
    runner = torch._inductor.aoti_load_package(path)
    torch.testing.assert_close(runner(*inputs), model(*inputs), atol=1e-4, rtol=1e-4)


def test_a_best_config_key_holds_the_users_tag_alone(tmp_path: Path) -> None:
    """Compile workers make the runtime autotune key with the tag their pool started with, the compiling
    process (an FX-cache hit) with the current one: prescreen's part stays out of it so both agree."""
    import torch
    import torch._inductor.compile_fx  # noqa: F401 - as in any compile: the guards patch it when imported
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    import prescreen
    from prescreen.hooks import cache_tag

    plain = AutotuneCache._prepare_key("/x/abc.py")
    with prescreen.installed(device_memory="64GiB", ratio=0.25, store=None):
        ours = cache_tag.apply(torch.device("cpu"))
        assert torch.compiler.config.cache_key_tag.endswith(ours)
        assert AutotuneCache._prepare_key("/x/abc.py") == plain
        assert torch.compiler.config.cache_key_tag.endswith(ours)  # given back after the key is made
    assert AutotuneCache._prepare_key("/x/abc.py") == plain


class _Config:
    """A Triton config as the autotune cache reads and writes it (there is no Triton on a CPU machine)."""

    def __init__(self, kwargs: dict[str, int], num_warps: int = 4, num_stages: int = 1, **_: Any) -> None:
        self.kwargs, self.num_warps, self.num_stages = dict(kwargs), num_warps, num_stages
        self.found_by_coordesc = False


class _Result:
    def __init__(self, config: _Config) -> None:
        self.config = config


class _Static:
    """What ``recheck_autotune_cache`` sees of a kernel torch's FX graph cache handed back."""

    def __init__(self, filename: str, configs: list[_Config]) -> None:
        from types import SimpleNamespace

        self.filename, self.fn = filename, SimpleNamespace(fn=object())
        self.inductor_meta = {"coordinate_descent_tuning": True, "autotune_local_cache": True}
        self.compile_results = [_Result(c) for c in configs]
        self.compiled: list[_Config] = []
        from torch._inductor.runtime.autotune_cache import AutotuneCache
        from torch._inductor.runtime.triton_heuristics import hash_configs

        cache = AutotuneCache.create(self.inductor_meta, filename, hash_configs(configs))
        self.save_cache_hook = cache.save if cache else None

    def is_statically_launchable(self) -> bool:
        return True

    def _precompile_config(self, config: _Config) -> _Result:
        self.compiled.append(config)
        return _Result(config)


def _recheck_torch_2_11(self: Any, reload_kernel_from_src: Any) -> None:
    """torch 2.11's rule: only a kernel of several configs takes the cached winner, and unmarked when it
    was one of them."""
    from torch._inductor.runtime.triton_heuristics import check_autotune_cache, triton_config_to_hashable

    configs = [r.config for r in self.compile_results]
    cached, _cache, self.autotune_cache_info = check_autotune_cache(configs, self.filename, self.inductor_meta)
    if len(cached) == 1 and len(configs) > 1:
        same = [r for r in self.compile_results
                if triton_config_to_hashable(r.config) == triton_config_to_hashable(cached[0])]
        if same:
            self.compile_results = same
        elif cached[0].found_by_coordesc:
            self.compile_results = [self._precompile_config(cached[0])]


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same-dir", "compiled-elsewhere"])
@pytest.mark.parametrize(("configs", "best"), [(1, 0), (1, None), (3, 1), (3, None)])
def test_a_kernel_from_the_fx_cache_keeps_its_coordinate_descent_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, configs: int, best: int | None, elsewhere: bool
) -> None:
    """On a replica, a kernel the FX cache hands back must launch the config coordinate descent saved for it,
    marked found, or it descends (benchmarks) again: torch 2.13 does this, torch 2.11 does not (9 coordinate
    descent benchmarks on an H100 replica); with prescreen installed both do, and 2.13 is left as it is.
    ``compiled-elsewhere``: the kernel was pickled on the warm machine, so its path names that machine's cache
    directory, while the artifact put its best config in this one's; upstream alone misses it there."""
    from torch._inductor.runtime import autotune_cache
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner, hash_configs

    from prescreen.hooks import triton_autotune

    monkeypatch.setattr(autotune_cache, "Config", _Config)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "here"))
    candidates = [_Config({"XBLOCK": 2 ** (6 + i)}) for i in range(configs)]
    winner = candidates[best] if best is not None else _Config({"XBLOCK": 32}, num_warps=2)
    filename = str(tmp_path / "here" / "ab" / "cabc.py")
    saved = autotune_cache.AutotuneCache.create(_Static(filename, []).inductor_meta, filename,
                                                hash_configs(candidates))
    assert saved is not None
    saved.save(winner, 0, found_by_coordesc=True)
    pickled_at = str(tmp_path / "warm-machine" / "ab" / "cabc.py") if elsewhere else filename

    def rechecked(recheck: Any, guarded: bool = False) -> tuple[list[tuple[Any, bool]], int]:
        kernel = _Static(pickled_at, [_Config(c.kwargs) for c in candidates])
        (triton_autotune._wrap_recheck(recheck) if guarded else recheck)(kernel, lambda: kernel)
        if guarded:  # a later descent saves here too, not on the warm machine
            kernel.save_cache_hook(winner, 0, found_by_coordesc=True)
        return [(r.config.kwargs, r.config.found_by_coordesc) for r in kernel.compile_results], len(kernel.compiled)

    expected = [(winner.kwargs, True)]
    assert (rechecked(CachingAutotuner.recheck_autotune_cache) == (expected, int(best is None))) is not elsewhere
    assert rechecked(CachingAutotuner.recheck_autotune_cache, guarded=True) == (expected, int(best is None))
    # 2.11 keeps the result only where the winner needed a compile; elsewhere it would descend again
    assert (rechecked(_recheck_torch_2_11)[0] == expected) is (configs > 1 and best is None and not elsewhere)
    assert rechecked(_recheck_torch_2_11, guarded=True) == (expected, int(best is None))
    assert not (tmp_path / "warm-machine").exists()


@pytest.mark.parametrize("guarded", [False, True])
def test_a_winner_coordinate_descent_already_marked_is_saved_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarded: bool
) -> None:
    """Coordinate descent that finds nothing better marks the config it started from, in place; a later
    autotune over those configs that picks it skips descent, but upstream saves it unmarked, so a replica
    reading the best config descends again. With the guards it is saved marked."""
    from torch._inductor.runtime import autotune_cache
    from torch._inductor.runtime.triton_heuristics import hash_configs

    from prescreen.hooks import triton_autotune

    monkeypatch.setattr(autotune_cache, "Config", _Config)
    candidates = [_Config({"XBLOCK": 2 ** (6 + i)}) for i in range(3)]
    candidates[1].found_by_coordesc = True
    filename = str(tmp_path / "ab" / "cabc.py")
    kernel = _Static(filename, candidates)

    def autotune_to_one_config(self: Any) -> None:  # upstream's save, after the benchmark picked candidates[1]
        self.save_cache_hook(candidates[1], 0, triton_cache_hash=None)

    (triton_autotune._wrap_one_config(autotune_to_one_config) if guarded else autotune_to_one_config)(kernel)
    cache = autotune_cache.AutotuneCache.create(kernel.inductor_meta, filename, hash_configs(candidates))
    assert cache is not None
    best = cache.read_best(kernel.inductor_meta, [_Config(c.kwargs) for c in candidates])
    assert best is not None and best.kwargs == candidates[1].kwargs
    assert best.found_by_coordesc is guarded


@pytest.mark.parametrize(("saved_marked", "descends"), [(True, False), (False, True)])
def test_a_cached_winner_whose_mark_was_lost_in_transit_is_not_descended_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_marked: bool, descends: bool
) -> None:
    """A kernel compiled in Inductor's worker from a cached coordinate-descent winner arrives unpickled without
    the mark (Triton's ``Config.__setstate__`` keeps its own fields), and upstream would descend again: the guard
    reads the cache, finds the launcher's config marked there, and launches it. Saved unmarked, it descends."""
    from types import SimpleNamespace

    from torch._inductor.runtime import autotune_cache

    from prescreen.hooks import triton_autotune

    monkeypatch.setattr(autotune_cache, "Config", _Config)
    winner = _Config({"XBLOCK": 128}, num_warps=2)
    kernel = _Static(str(tmp_path / "ab" / "cabc.py"), [_Config({"XBLOCK": 64}), winner])
    kernel.save_cache_hook(winner, 0, found_by_coordesc=saved_marked)
    descended: list[Any] = []
    guarded = triton_autotune._wrap_coordesc(lambda self, launcher, *a, **k: descended.append(launcher) or launcher)
    arrived = SimpleNamespace(config=_Config(winner.kwargs, num_warps=2))  # the same config, its mark lost
    monkeypatch.setattr(triton_autotune, "_decide", lambda *a: None)  # not the budget's business here
    assert guarded(kernel, arrived) is arrived
    assert (descended == [arrived]) is descends and arrived.config.found_by_coordesc is not descends


def test_a_cached_kernel_without_a_source_file_is_rechecked_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """A Triton template the FX cache hands back has no source file (``filename`` None), so no best config:
    the recheck leaves it to upstream and says nothing."""
    from types import SimpleNamespace

    from prescreen.hooks import triton_autotune

    kernel = SimpleNamespace(filename=None, inductor_meta={"coordinate_descent_tuning": True},
                             compile_results=[_Result(_Config({"XBLOCK": 64}))])
    seen: list[Any] = []
    with caplog.at_level(logging.DEBUG, logger="prescreen"):
        triton_autotune._wrap_recheck(lambda self, reload: seen.append(self.filename))(kernel, lambda: kernel)
    assert seen == [None] and kernel.filename is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_plan_only_warm_lowers_the_point_of_most_elements_first() -> None:
    """Inductor guards a size only where it picks 32-bit indexing, so the largest point's graph serves the most
    families; the other points keep their order."""
    from prescreen.warm import _largest_first

    grid = [{"b": b, "s": s} for b in (1, 8, 64) for s in (16, 128)]
    assert _largest_first(grid) == [{"b": 64, "s": 128}, *grid[:-1]]
    assert _largest_first([{"b": 4, "s": 2}, {"b": 2, "s": 4}]) == [{"b": 2, "s": 4}, {"b": 4, "s": 2}]
    assert _largest_first([{}]) == [{}]
