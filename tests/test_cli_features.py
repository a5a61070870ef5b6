"""The CLI's behaviour beyond errors: spec precedence, explained no-ops, quiet autotuning, kernel counts,
filters, layout by width, stats --json, help texts, and the picture (terminal chart, HTML, PNG)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import test_cli
from click.testing import CliRunner
from test_cli import CLEAN_ENV, HUGE, assert_cli_error, by_kernel, invoke, ok, ok_json, plan, rows, stored

from prescreen.cli import cli
from prescreen.plan import KernelPlan
from prescreen.warm import Record, WarmReport, kernel_site, why_nothing_was_guarded

plans_file = test_cli.plans_file  # the same fixtures: a plans file, and a store filled from it
filled = test_cli.filled

# --- spec files: the command line wins --------------------------------------------------------------------------




class Captured:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, target: str, shapes: Any, store: Any, **kwargs: Any) -> WarmReport:
        self.calls.append({"target": target, "shapes": shapes, **kwargs})
        return WarmReport(store=store.location)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Captured:
    import prescreen.warm

    fake = Captured()
    monkeypatch.setattr(prescreen.warm, "warm_model", fake)
    return fake


def test_spec_settings_reach_warm(tmp_path: Path, captured: Captured) -> None:
    spec = tmp_path / "warm.toml"
    spec.write_text('target = "examples.tiny_models:block"\npoints = 3\nratio = 0.5\nmode = "default"\n'
                    'device_memory = "8GiB"\ninductor_config = "freezing=True, max_autotune_gemm_backends=ATEN,TRITON"\n'
                    '[shapes]\nbatch = "1..64"\n')
    ok(invoke(tmp_path / "c", "warm", "--spec", str(spec)))
    (call,) = captured.calls
    assert call["target"] == "examples.tiny_models:block" and call["points"] == 3 and call["ratio"] == 0.5
    assert call["mode"] == "default" and call["device_memory"] == 8 * 2**30 and call["device"] == "cpu"
    assert call["inductor_config"] == {"freezing": True, "max_autotune_gemm_backends": "ATEN,TRITON"}
    assert [(s.name, s.low, s.high) for s in call["shapes"]] == [("batch", 1, 64)]


def test_the_command_line_wins_over_the_spec_for_every_option(tmp_path: Path, captured: Captured) -> None:
    spec = tmp_path / "warm.toml"
    spec.write_text('target = "examples.tiny_models:block"\npoints = 3\nratio = 0.5\nmode = "default"\n'
                    'device_memory = "8GiB"\ninductor_config = ["freezing=True", "max_autotune=1"]\n'
                    '[shapes]\nbatch = "1..64"\n')
    ok(invoke(tmp_path / "c", "warm", "examples.tiny_models:mlp", "--spec", str(spec), "--points", "1", "--ratio",
              "0.1", "--mode", "max-autotune", "--device-memory", "1GiB", "--shape", "batch=2..4",
              "--inductor-config", "freezing=False"))
    (call,) = captured.calls
    assert call["target"] == "examples.tiny_models:mlp" and call["points"] == 1 and call["ratio"] == 0.1
    assert call["mode"] == "max-autotune" and call["device_memory"] == 2**30
    assert [(s.name, s.low, s.high) for s in call["shapes"]] == [("batch", 2, 4)]
    assert call["inductor_config"] == {"max_autotune": True, "freezing": False}  # key by key


def test_spec_plans_with_command_line_budget(tmp_path: Path, plans_file: Path) -> None:
    spec = tmp_path / "plans.toml"
    spec.write_text(f'plans = "{plans_file}"\ndevice_memory = "64GiB"\nratio = 0.5\ndevice_kind = "cuda"\n')
    from_spec = ok_json(invoke(tmp_path / "a", "warm", "--spec", str(spec), "--json"))
    assert {d["budget_bytes"] for d in from_spec["decisions"]} == {int(64 * 2**30 * 0.5)}
    overridden = ok_json(invoke(tmp_path / "b", "warm", "--spec", str(spec), "--device-memory", "1MiB", "--ratio",
                                "0.1", "--device-kind", "npu", "--json"))
    assert {d["budget_bytes"] for d in overridden["decisions"]} == {int(2**20 * 0.1)}
    assert {e["parts"]["device_kind"] for e in stored(tmp_path / "b")} == {"npu"}
    assert {e["parts"]["device_kind"] for e in stored(tmp_path / "a")} == {"cuda"}


def test_plans_honour_prescreen_device_memory(tmp_path: Path, plans_file: Path) -> None:
    report = ok_json(invoke(tmp_path / "c", "warm", "--plans", str(plans_file), "--json",
                            env={"PRESCREEN_DEVICE_MEMORY": "1MiB"}))
    assert {d["budget_bytes"] for d in report["decisions"]} == {2**20 // 4}
    assert (report["tuned"], report["fell_back"]) == (2, 1)
    assert_cli_error(invoke(tmp_path / "c", "warm", "--plans", str(plans_file), env={"PRESCREEN_DEVICE_MEMORY": "x"}),
                     "PRESCREEN_DEVICE_MEMORY 'x' is not a memory size")


# --- silent no-ops, noise, counting -----------------------------------------------------------------------------


def test_nothing_guarded_says_why_and_what_to_change() -> None:
    cpu = " ".join(why_nothing_was_guarded("cpu", "max-autotune", {}))
    assert "--inductor-config freezing=True" in cpu and "--mode" not in cpu
    default = " ".join(why_nothing_was_guarded("cpu", "default", {"freezing": True}))
    assert "--mode max-autotune" in default and "freezing" not in default
    cuda = " ".join(why_nothing_was_guarded("cuda:0", "max-autotune", {}))
    assert "freezing" not in cuda and "-v" in cuda


def test_hints_are_printed_after_the_summary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import prescreen.warm

    def empty(target: str, shapes: Any, store: Any, **kwargs: Any) -> WarmReport:
        return WarmReport(compiles=2, hints=why_nothing_was_guarded(kwargs["device"], kwargs["mode"], {}))

    monkeypatch.setattr(prescreen.warm, "warm_model", empty)
    out = ok(invoke(tmp_path / "c", "warm", "examples.tiny_models:mlp", "--device-memory", "1GiB"))
    assert "decisions" not in out.split("prescreen warm", 1)[1].split("\n", 3)[-1]  # no empty decisions table
    assert "these compiles ran none" in out and "--inductor-config freezing=True" in out


def test_autotune_tables_are_quiet_unless_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    from torch._inductor import config
    from torch._inductor import select_algorithm as sa

    from prescreen.warm import QUIET_AUTOTUNE, _autotune_output_held

    assert all(hasattr(config, k) for k in QUIET_AUTOTUNE)  # a torch rename fails here, not silently
    tables, stats = sa.AlgorithmSelectorCache.log_results, sa._log_autotune_choices_stats
    with _autotune_output_held({}, verbose=False):
        assert sa.AlgorithmSelectorCache.log_results is not tables and sa._log_autotune_choices_stats is not stats
        sa._log_autotune_choices_stats("bmm", {object(): 1.0})  # type: ignore[dict-item]
    assert capsys.readouterr().err == ""
    assert (sa.AlgorithmSelectorCache.log_results, sa._log_autotune_choices_stats) == (tables, stats)
    with _autotune_output_held({"autotune_num_choices_displayed": 5}, verbose=False):  # the caller's setting wins
        assert sa.AlgorithmSelectorCache.log_results is tables and sa._log_autotune_choices_stats is not stats
    with _autotune_output_held({}, verbose=True):
        assert (sa.AlgorithmSelectorCache.log_results, sa._log_autotune_choices_stats) == (tables, stats)


def test_kernels_are_counted_as_kernels() -> None:
    small, other = KernelPlan.from_payload(plan("k", 10)), KernelPlan.from_payload(plan("k", 20))
    resized = plan("k", 10)
    resized["axis_static_values"] = [["x0", 64]]  # the same kernel compiled at another size
    again = KernelPlan.from_payload(resized)
    assert kernel_site(small) == kernel_site(again) != kernel_site(other)

    def record(key: str, site: str) -> Record:
        return Record(key, "k", {}, "tune", True, 1, 2, False, "", site)

    report = WarmReport(records=[record("a", "s1"), record("b", "s1"), record("c", "s2"), record("c", "s2")])
    assert (report.kernels, len(report.unique()), len(report.records)) == (2, 3, 4)
    assert report.to_json()["kernels"] == 2 and report.to_json()["decisions_made"] == 3


# --- one filter language ----------------------------------------------------------------------------------------


def test_inspect_and_clear_share_globs_and_filters(filled: Path) -> None:
    glob = ok_json(invoke(filled, "inspect", "--kernel", "triton_poi_*_mul_?", "--json"))
    assert {e["kernel"] for e in glob} == {"triton_poi_fused_mul_1"} and len(glob) == 2
    assert len(ok_json(invoke(filled, "inspect", "--kernel", "fused_mul", "--json"))) == 2  # substring still works
    fallback = ok_json(invoke(filled, "inspect", "--decision", "fallback", "--json"))
    key = fallback[0]["key"]
    assert [e["key"] for e in ok_json(invoke(filled, "inspect", "--key", key[:6], "--json"))] == [key]
    assert ok_json(invoke(filled, "inspect", "--older-than", "1d", "--json")) == []

    out = ok(invoke(filled, "clear", "--decision", "fallback", "--yes"))
    assert "1 entries removed" in out and key not in {e["key"] for e in stored(filled)}
    out = ok(invoke(filled, "clear", "--kernel", "triton_poi_*_mul_?", "--device", "cuda", "--yes"))
    assert "1 entries removed" in out and len(stored(filled)) == 4


# --- stats --json, layout, help -----------------------------------------------------------------------------------


def test_stats_json(filled: Path) -> None:
    ok(invoke(filled, "warm", "--plans", str(filled.parent / "plans.json"), "--device-memory", "1MiB"))  # 3 hits
    s = ok_json(invoke(filled, "stats", "--json"))
    assert (s["backend"], s["location"], s["entries"], s["tune"], s["fallback"]) == ("disk", str(filled), 6, 5, 1)
    assert s["hits"] == 3 and s["hit_rate"] == pytest.approx(3 / 9) and s["healthy"] is True
    assert isinstance(s["size_bytes"], int) and s["size_bytes"] > 0


@pytest.mark.parametrize("columns", [100, 129])  # 80 columns: test_cli_processes (rows wrap between words there)
def test_compact_layout_keeps_one_line_per_entry(filled: Path, columns: int) -> None:
    env = {"COLUMNS": str(columns)}
    out = ok(invoke(filled, "inspect", env=env))
    assert max(len(line) for line in out.splitlines()) <= columns
    body = rows(out)
    assert len(body) == 6  # no cell folded onto a second line
    assert {r[2] for r in body} == {"1 features, 2 groups"}  # the shape family is kept
    assert {r[3] for r in body} == {"npu", "cuda"} and sum(r[4] == "fallback" for r in body) == 1
    fallback = next(r for r in body if r[4] == "fallback")
    assert fallback[5] == "48.0 MiB > 256.0 KiB (in_ptr0)"
    warm = ok(invoke(filled, "warm", "--plans", str(filled.parent / "plans.json"), "--device-memory", "1MiB", env=env))
    assert max(len(line) for line in warm.splitlines()) <= columns
    assert "prescreen warm: 3 kernels, 3 decisions, 2 tuned, 1 fell back" in " ".join(warm.split())
    assert len(rows(warm)) == 3


def test_wide_layout_shows_every_column(filled: Path) -> None:
    out = ok(invoke(filled, "inspect", env={"COLUMNS": "250"}))
    header = next(line for line in out.splitlines() if "┃" in line and "key" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == [
        "key", "kernel", "shape family", "device", "ratio", "decision", "estimated", "budget", "why", "created", "hits"]


def test_help_texts_have_no_markup() -> None:
    for argv in [[], *([name] for name in cli.commands)]:
        result = CliRunner().invoke(cli, [*argv, "--help"], env=CLEAN_ENV)
        assert result.exit_code == 0, result.output
        assert "`" not in result.output and ":func:" not in result.output, (argv, result.output)


# --- the picture ----------------------------------------------------------------------------------------------------


def test_inspect_key_draws_groups_against_the_budget(filled: Path) -> None:
    entry = by_kernel(stored(filled), HUGE, "npu")
    out = ok(invoke(filled, "inspect", entry["key"][:10], env={"COLUMNS": "100"}))
    chart = out[out.index("per-group bytes vs budget"):]
    assert "2 of 2 groups over the budget 256.0 KiB" in " ".join(chart.split())
    assert "dominant arg in_ptr0 (32.0 MiB) in group 1" in " ".join(chart.split())
    bars = [line for line in chart.splitlines() if "█" in line]
    assert [re.findall(r"[0-9.]+ MiB", line)[-1] for line in bars] == ["32.0 MiB", "16.0 MiB"]  # largest first
    assert bars[0].rstrip().endswith("*")  # the dominant arg's group
    assert all(len(line) <= 100 for line in out.splitlines())


def test_report_html_holds_the_numbers(filled: Path, tmp_path: Path) -> None:
    page = tmp_path / "review.html"
    assert f"wrote 1 entries to {page}" in ok(invoke(filled, "report", "--html", str(page)))
    html = page.read_text()
    entry = by_kernel(stored(filled), HUGE, "npu")
    assert entry["key"][:12] in html and HUGE in html and "<svg" in html
    for group, nbytes in entry["decision"]["group_bytes"]:
        assert f"<td>{group}</td>" in html and f"<td class=n>{nbytes}</td>" in html
    assert f"<b>{entry['decision']['budget_bytes']}</b> bytes" in html
    tuned = tmp_path / "tuned.html"
    assert "wrote 5 entries" in ok(invoke(filled, "report", "--decision", "tune", "--html", str(tuned)))
    assert_cli_error(invoke(filled, "report", "--html", str(tmp_path / "no" / "dir.html")), "cannot write")


def test_report_in_the_terminal(filled: Path) -> None:
    out = ok(invoke(filled, "report", env={"COLUMNS": "100"}))
    assert HUGE in out and out.count("per-group bytes vs budget") == 1
    empty = ok(invoke(filled, "report", "--device", "cuda"))
    assert "no fallback decisions" in empty


def test_report_png(filled: Path, tmp_path: Path) -> None:
    image = tmp_path / "review.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert_cli_error(invoke(filled, "report", "--png", str(image)), "--png needs matplotlib")
        pytest.skip("matplotlib is not installed (pip install 'prescreen[plot]')")
    assert "wrote 1 entries" in ok(invoke(filled, "report", "--png", str(image)))
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 1000


def test_warm_holds_the_hooks_decision_lines(caplog: pytest.LogCaptureFixture) -> None:
    """The table shows every decision, so the hooks' per-decision lines are held back; other warnings are not."""
    import logging

    from prescreen.hooks import state
    from prescreen.warm import _decision_lines_held

    with caplog.at_level(logging.INFO, logger="prescreen.hooks"):
        with _decision_lines_held():
            state.log_once("test-held-1", logging.WARNING, "prescreen: decision %s", 1)
            logging.getLogger("prescreen.hooks").warning("prescreen: guard not installed")
        state.log_once("test-held-2", logging.WARNING, "prescreen: decision %s", 2)  # shown again afterwards
    assert [r.getMessage() for r in caplog.records if r.name == "prescreen.hooks"] == [
        "prescreen: guard not installed", "prescreen: decision 2"]


@pytest.mark.parametrize("columns", [150, 170, 200, 250])
def test_wider_terminals_get_the_widest_layout_that_fits(filled: Path, columns: int) -> None:
    out = ok(invoke(filled, "inspect", env={"COLUMNS": str(columns)}))
    assert max(len(line) for line in out.splitlines()) <= columns
    assert len(rows(out)) == 6  # one line per entry
    header = next(line for line in out.splitlines() if "┃" in line and "key" in line)
    names = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert names[:3] == ["key", "kernel", "shape family"] and "why" in names
    assert ("created" in names) == (columns >= 200)  # all eleven columns need about 190


@pytest.mark.parametrize(("text", "needle"), [
    ("points = 0", "points: 0 is not in the range 1<=x<=16"),
    ('mode = "nonsense"', "mode: 'nonsense' is not one of 'default'"),
    ('device_kind = "banana"\nplans = "p.json"', "device_kind: 'banana' is not one of 'npu'"),
    ('device_memory = "lots"\nplans = "p.json"', "device_memory 'lots' is not a memory size"),
])
def test_a_spec_value_is_checked_as_its_option_is(tmp_path: Path, text: str, needle: str) -> None:
    spec = tmp_path / "w.toml"
    spec.write_text('target = "m:f"\n' * ("plans" not in text) + text + "\n")
    assert_cli_error(invoke(tmp_path / "c", "warm", "--spec", str(spec)), f"spec '{spec}': {needle}")


def test_a_bad_spec_value_names_the_spec(tmp_path: Path, plans_file: Path) -> None:
    spec = tmp_path / "w.toml"
    spec.write_text(f'plans = "{plans_file}"\nratio = 2\ndevice_memory = "0.5"\n')
    assert_cli_error(invoke(tmp_path / "c", "warm", "--spec", str(spec), "--device-memory", "1MiB"),
                     "spec '" + str(spec) + "': ratio=2 is out of range")
    assert_cli_error(invoke(tmp_path / "c", "warm", "--spec", str(spec), "--ratio", "0.5"),
                     "spec '" + str(spec) + "': device_memory '0.5' is less than one byte")


def test_the_dry_run_store_reads_through_and_writes_nothing(tmp_path: Path) -> None:
    from test_store_support import make_entry

    from prescreen.store import DiskStore
    from prescreen.warm import ReadOnlyStore

    with DiskStore(tmp_path / "store") as inner:
        entry = make_entry(1)
        assert inner.put(entry)
        dry = ReadOnlyStore(inner)
        assert dry.location == inner.location and not dry.writable
        assert dry.lookup(entry.key) is not None and dry.get(entry.key) is not None
        assert not dry.put(make_entry(2)) and [e.key for e in inner.entries()] == [entry.key]
