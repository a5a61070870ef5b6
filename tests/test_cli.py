"""The ``prescreen`` command line: warm, inspect, clear, stats, export/import and its error paths.

Almost everything runs in-process through click's ``CliRunner`` on ``warm --plans``
(no compile). A few error paths and one small real ``torch.compile`` warm run through
the console-script entry point in subprocesses, all started at once to keep the wall
time down.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import plan_payloads, upstream_meta

from prescreen.cli import cli
from prescreen.key import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "tiny_models.py"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: Settings from the caller's shell that would change what these tests see.
CLEAN_ENV: dict[str, str | None] = {
    "PRESCREEN_CACHE_DIR": None, "PRESCREEN_REDIS_URL": None, "PRESCREEN_CACHE": None,
    "PRESCREEN_REDIS_LOCAL_TIER": None, "PRESCREEN_DEVICE_MEMORY": None,
    "PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO": None, "INDUCTOR_ASCEND_SYMBOLIC_GROUP_MAX_BENCHMARK_MEMORY_RATIO": None,
    "COLUMNS": "250",  # rich tables wide enough that no cell wraps
}


# --- helpers -------------------------------------------------------------------------------------------------------


def plan(kernel: str, width: int) -> dict[str, object]:
    """torch_npu's upstream footprint plan (outer_product over x0, buckets [8], fp16), ``in_ptr0`` x0 by ``width``."""
    payload = upstream_meta()
    payload["kernel_name"] = kernel
    in_ptr = payload["ordered_arg_specs"][1]  # type: ignore[index]
    in_ptr["size_exprs"][1] = {"const": width}
    in_ptr["stride_exprs"][0] = {"const": width}
    return payload


#: Two small plans (tune under 1 MiB x 0.25) and one of ~48 MiB (falls back under it, tunes under 64 GiB).
PLANS = [plan("triton_poi_fused_add_0", 10), plan("triton_poi_fused_mul_1", 20),
         plan("triton_poi_fused_huge_2", 1 << 20)]
HUGE = "triton_poi_fused_huge_2"


def invoke(cache: Path | None, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    argv = (["--cache-dir", str(cache)] if cache is not None else []) + list(args)
    return CliRunner().invoke(cli, argv, input=input, env={**CLEAN_ENV, **(env or {})})


def text(result: Result) -> str:
    return ANSI.sub("", result.stdout)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return text(result)


def ok_json(result: Result) -> Any:
    return json.loads(ok(result))


def rows(output: str) -> list[list[str]]:
    """The body rows of the rich tables in ``output``, as stripped cells."""
    return [[c.strip() for c in line.strip().strip("│").split("│")]
            for line in output.splitlines() if line.strip().startswith("│")]


def assert_one_error_line(stderr: str, stdout: str, code: int, needle: str) -> None:
    """Exit 2, no traceback, nothing on stdout, and exactly one non-blank stderr line holding ``needle``."""
    stderr, stdout = ANSI.sub("", stderr), ANSI.sub("", stdout)
    assert code == 2, (code, stdout, stderr)
    assert "Traceback" not in stderr + stdout
    assert stdout.strip() == ""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    assert needle in lines[0], (needle, lines[0])


def assert_cli_error(result: Result, needle: str) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert_one_error_line(result.stderr, result.stdout, result.exit_code, needle)


def stored(cache: Path) -> list[dict[str, Any]]:
    return ok_json(invoke(cache, "inspect", "--json"))


@pytest.fixture
def plans_file(tmp_path: Path) -> Path:
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(PLANS))
    return path


@pytest.fixture
def filled(tmp_path: Path, plans_file: Path) -> Path:
    """A store with six decisions: the plans for npu under 1 MiB (2 tune, 1 fallback) and for cuda under 64 GiB."""
    cache = tmp_path / "cache"
    ok(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "1MiB"))
    ok(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "64GiB", "--device-kind", "cuda"))
    assert len(stored(cache)) == 6
    return cache


def keys_of(entries: list[dict[str, Any]]) -> set[str]:
    return {e["key"] for e in entries}


def by_kernel(entries: list[dict[str, Any]], kernel: str, device: str) -> dict[str, Any]:
    (entry,) = [e for e in entries if e["kernel"] == kernel and e["parts"]["device_kind"] == device]
    return entry


# --- warm --plans ----------------------------------------------------------------------------------------------------


def test_warm_plans_summary_and_decisions(tmp_path: Path, plans_file: Path) -> None:
    cache = tmp_path / "cache"
    out = ok(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "1MiB"))
    assert "prescreen warm" in out and "dry run" not in out
    summary, *decisions = rows(out)
    # kernels, decisions, tuned, fell back, not bounded, largest estimate, compiles, time
    assert summary[:7] == ["3", "3", "2", "1", "0", "48.0 MiB", "0"]
    assert len(decisions) == 3
    assert {r[1]: r[3] for r in decisions} == {"triton_poi_fused_add_0": "tune", "triton_poi_fused_mul_1": "tune",
                                              HUGE: "fallback"}
    assert {r[6] for r in decisions} == {"computed"}
    assert {r[0] for r in decisions} == {e["key"][:12] for e in stored(cache)}

    again = rows(ok(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "1MiB")))
    assert again[0][:5] == ["3", "3", "2", "1", "0"]
    assert {r[6] for r in again[1:]} == {"hit"}
    assert len(stored(cache)) == 3


def test_warm_plans_json(tmp_path: Path, plans_file: Path) -> None:
    cache = tmp_path / "cache"
    report = ok_json(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "1MiB", "--json"))
    assert {k: report[k] for k in ("kernels", "decisions_made", "lookups", "tuned", "fell_back", "not_bounded",
                                   "compiles")} == {
        "kernels": 3, "decisions_made": 3, "lookups": 3, "tuned": 2, "fell_back": 1, "not_bounded": 0, "compiles": 0}
    assert report["dry_run"] is False and report["store"] == str(cache)
    assert report["largest_estimated_bytes"] == max(d["estimated_bytes"] for d in report["decisions"])
    assert {d["kernel"]: d["action"] for d in report["decisions"]} == {
        "triton_poi_fused_add_0": "tune", "triton_poi_fused_mul_1": "tune", HUGE: "fallback"}
    budget = 2**20 // 4
    for d in report["decisions"]:
        assert d["bounded"] is True and d["hit"] is False and d["budget_bytes"] == budget and d["sizes"] == {}
        assert (d["estimated_bytes"] <= budget) == (d["action"] == "tune")
    assert keys_of(stored(cache)) == {d["key"] for d in report["decisions"]}

    second = ok_json(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "1MiB", "--json"))
    assert [d["hit"] for d in second["decisions"]] == [True] * 3
    assert (second["tuned"], second["fell_back"]) == (2, 1)
    assert [d["key"] for d in second["decisions"]] == [d["key"] for d in report["decisions"]]

    # Another budget is another key: the huge plan now tunes, and nothing is a hit.
    roomy = ok_json(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "64GiB", "--json"))
    assert (roomy["tuned"], roomy["fell_back"]) == (3, 0)
    assert not any(d["hit"] for d in roomy["decisions"])


def test_warm_plans_dry_run_stores_nothing(tmp_path: Path, plans_file: Path) -> None:
    cache = tmp_path / "cache"
    args = ("warm", "--plans", str(plans_file), "--device-memory", "1MiB", "--dry-run")
    report = ok_json(invoke(cache, *args, "--json"))
    assert report["dry_run"] is True and (report["tuned"], report["fell_back"], report["decisions_made"]) == (2, 1, 3)
    assert "dry run: nothing stored" in ok(invoke(cache, *args))
    assert stored(cache) == []
    assert ok(invoke(cache, "inspect")).count("0 decisions") == 1
    # A real run afterwards computes everything (the dry runs left no hits behind).
    real = ok_json(invoke(cache, "warm", "--plans", str(plans_file), "--device-memory", "1MiB", "--json"))
    assert not any(d["hit"] for d in real["decisions"])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(plan_payloads(max_groups=16), min_size=1, max_size=4),
       memory=st.sampled_from(["1KiB", "1MiB", "64GiB"]))
def test_warm_plans_drawn_payloads(payloads: list[dict[str, object]], memory: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plans.json"
        path.write_text(json.dumps(payloads))
        cache = Path(tmp) / "cache"
        report = ok_json(invoke(cache, "warm", "--plans", str(path), "--device-memory", memory, "--json"))
        keys = [d["key"] for d in report["decisions"]]
        assert report["lookups"] == len(payloads) and report["decisions_made"] == len(set(keys)) == len(keys)
        assert report["tuned"] + report["fell_back"] + report["not_bounded"] == report["decisions_made"]
        assert report["not_bounded"] == 0  # plan_payloads draws boundable plans only
        assert keys_of(stored(cache)) == set(keys)


def test_warm_accepts_a_plans_object_and_an_export_bundle(tmp_path: Path, filled: Path) -> None:
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"plans": PLANS}))
    bundle = tmp_path / "bundle.json"
    ok(invoke(filled, "export", str(bundle)))
    for source, lookups in ((wrapped, 3), (bundle, 6)):
        report = ok_json(invoke(tmp_path / "fresh", "warm", "--plans", str(source), "--device-memory", "1MiB",
                                "--json", "--dry-run"))
        assert report["lookups"] == lookups and report["decisions_made"] == 3  # the bundle holds each plan twice


# --- inspect ---------------------------------------------------------------------------------------------------------


def test_inspect_table_and_filters(filled: Path) -> None:
    entries = stored(filled)
    out = ok(invoke(filled, "inspect"))
    assert f"6 decisions in disk store {filled}" in out
    table = rows(out)
    assert sorted(r[0] for r in table) == sorted(e["key"][:12] for e in entries)
    assert sorted(r[1] for r in table) == sorted(e["kernel"] for e in entries)
    assert sorted(r[5] for r in table) == ["fallback"] + ["tune"] * 5
    assert {r[3] for r in table} == {"npu 1.0 MiB", "cuda 64.0 GiB"}
    assert {r[2] for r in table} == {"1 features, 2 groups"}

    fallback = rows(ok(invoke(filled, "inspect", "--decision", "fallback")))
    assert [(r[0], r[1], r[3]) for r in fallback] == [(by_kernel(entries, HUGE, "npu")["key"][:12], HUGE,
                                                        "npu 1.0 MiB")]
    cuda = rows(ok(invoke(filled, "inspect", "--device", "cuda")))
    assert len(cuda) == 3 and {r[3] for r in cuda} == {"cuda 64.0 GiB"} and {r[5] for r in cuda} == {"tune"}
    huge = rows(ok(invoke(filled, "inspect", "--kernel", "huge")))
    assert sorted((r[1], r[5]) for r in huge) == [(HUGE, "fallback"), (HUGE, "tune")]
    assert rows(ok(invoke(filled, "inspect", "--decision", "fallback", "--device", "cuda"))) == []


def test_inspect_json_and_filters(filled: Path) -> None:
    entries = stored(filled)
    assert len(entries) == 6 and all(e["schema_version"] == SCHEMA_VERSION for e in entries)
    assert {e["decision"]["action"] for e in entries} == {"tune", "fallback"}
    npu = ok_json(invoke(filled, "inspect", "--device", "npu", "--json"))
    assert len(npu) == 3 and {e["parts"]["device_kind"] for e in npu} == {"npu"}
    fallback = ok_json(invoke(filled, "inspect", "--decision", "fallback", "--json"))
    assert [e["key"] for e in fallback] == [by_kernel(entries, HUGE, "npu")["key"]]
    mul = ok_json(invoke(filled, "inspect", "--kernel", "fused_mul", "--json"))
    assert {e["kernel"] for e in mul} == {"triton_poi_fused_mul_1"} and len(mul) == 2


def test_inspect_one_entry(filled: Path) -> None:
    entry = by_kernel(stored(filled), HUGE, "npu")
    out = ok(invoke(filled, "inspect", entry["key"][:10]))
    assert f"entry {entry['key']}" in out
    fields = {r[0]: r[1] for r in rows(out) if r[0]}
    assert fields["kernel"] == HUGE and fields["decision"] == "fallback" and fields["bounded"] == "True"
    # Representatives 8 and 16 of x0: out_ptr0 16*x0 bytes plus in_ptr0 2 MiB*x0, per group.
    assert fields["per-group bytes"] == "0: 16.0 MiB, 1: 32.0 MiB"
    dominant = json.loads(fields["dominant arg"])
    assert dominant["name"] == "in_ptr0" and dominant["group_id"] == 1 and dominant["num_bytes"] == 16 * 2 * (1 << 20)
    assert fields["largest group"] == "1" and fields["key.device_kind"] == "npu"
    assert fields["budget"] == "256.0 KiB = 1.0 MiB x 0.25"

    assert ok_json(invoke(filled, "inspect", entry["key"][:10].upper(), "--json"))["key"] == entry["key"]


def test_inspect_unknown_key(filled: Path) -> None:
    used = {e["key"][0] for e in stored(filled)}
    absent = next(c for c in "0123456789abcdef" if c not in used)
    assert_cli_error(invoke(filled, "inspect", absent * 8), f"no entry with key '{absent * 8}'")


# --- clear -----------------------------------------------------------------------------------------------------------


def test_clear_needs_a_selector(filled: Path) -> None:
    assert_cli_error(invoke(filled, "clear"), "nothing selected")
    assert_cli_error(invoke(filled, "clear", "--yes"), "nothing selected")
    assert_cli_error(invoke(filled, "clear", "--all", "--kernel", "huge", "--yes"), "cannot be combined")
    assert_cli_error(invoke(filled, "clear", "--older-than", "soon", "--yes"), "invalid duration 'soon'")
    assert_cli_error(invoke(filled, "clear", "--key", "not-hex", "--yes"), "invalid key prefix")
    assert len(stored(filled)) == 6


def test_clear_by_key(filled: Path) -> None:
    entry = by_kernel(stored(filled), HUGE, "npu")
    out = ok(invoke(filled, "clear", "--key", entry["key"][:12], "--yes"))
    assert f"removed {entry['key'][:12]} {HUGE} (fallback)" in out and "1 entries removed" in out
    left = stored(filled)
    assert len(left) == 5 and entry["key"] not in keys_of(left)


def test_clear_by_kernel_and_device(filled: Path) -> None:
    out = ok(invoke(filled, "clear", "--kernel", "huge", "--yes"))
    assert out.count(f" {HUGE} (") == 2 and "2 entries removed" in out
    assert HUGE not in {e["kernel"] for e in stored(filled)}
    out = ok(invoke(filled, "clear", "--device", "cuda", "-y"))
    assert "2 entries removed" in out
    assert {e["parts"]["device_kind"] for e in stored(filled)} == {"npu"} and len(stored(filled)) == 2
    assert "nothing to remove" in ok(invoke(filled, "clear", "--device", "cuda", "--yes"))


def test_clear_older_than(tmp_path: Path, filled: Path) -> None:
    bundle = tmp_path / "bundle.json"
    ok(invoke(filled, "export", str(bundle)))
    data = json.loads(bundle.read_text())
    old = sorted(e["key"] for e in data["entries"])[:2]
    for e in data["entries"]:
        if e["key"] in old:
            e["created_at"] = time.time() - 8 * 86400
    bundle.write_text(json.dumps(data))
    aged = tmp_path / "aged"
    assert "imported 6 entries" in ok(invoke(aged, "import", str(bundle)))

    assert "nothing to remove" in ok(invoke(aged, "clear", "--older-than", "9d", "--yes"))
    out = ok(invoke(aged, "clear", "--older-than", "7d", "--yes"))
    assert "2 entries removed" in out and all(f"removed {k[:12]} " in out for k in old)
    assert keys_of(stored(aged)) == keys_of(stored(filled)) - set(old)


def test_clear_all(filled: Path) -> None:
    out = ok(invoke(filled, "clear", "--all", "--yes"))
    assert "6 entries removed" in out and sum(line.startswith("removed ") for line in out.splitlines()) == 6
    assert stored(filled) == []
    assert "nothing to remove" in ok(invoke(filled, "clear", "--all", "--yes"))


def test_clear_asks_first(filled: Path) -> None:
    no = invoke(filled, "clear", "--kernel", "huge", input="n\n")
    out = ok(no)
    assert f"Remove 2 entries from {filled}? [y/N]" in out and "aborted; nothing removed" in out
    assert len(stored(filled)) == 6
    assert "aborted" in ok(invoke(filled, "clear", "--all", input="\n"))  # the default is no
    assert len(stored(filled)) == 6

    out = ok(invoke(filled, "clear", "--kernel", "huge", input="y\n"))
    assert "2 entries removed" in out
    assert len(stored(filled)) == 4


# --- stats, export, import ------------------------------------------------------------------------------------------


def test_stats(filled: Path, tmp_path: Path) -> None:
    fields = {r[0]: r[1] for r in rows(ok(invoke(filled, "stats")))}
    assert fields["backend"] == "disk" and fields["location"] == str(filled) and fields["entries"] == "6"
    assert fields["healthy"] == "True"
    empty = {r[0]: r[1] for r in rows(ok(invoke(tmp_path / "empty", "stats")))}
    assert empty["entries"] == "0" and empty["location"] == str(tmp_path / "empty")
    via_env = CliRunner().invoke(cli, ["stats"], env={**CLEAN_ENV, "PRESCREEN_CACHE_DIR": str(filled)})
    assert {r[0]: r[1] for r in rows(ok(via_env))}["entries"] == "6"


def test_a_degraded_store_still_reads_and_keeps_its_warning(filled: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Local tier readable, Redis behind it down: reading commands work, and the fault is still logged."""
    result = invoke(filled, "--redis-url", "redis://127.0.0.1:1/0", "inspect", "--json")
    assert len(ok_json(result)) == 6
    assert any(r.name == "prescreen.store" and "Redis is unreachable" in r.getMessage() for r in caplog.records)


def test_export_import_round_trip(tmp_path: Path, filled: Path) -> None:
    bundle = tmp_path / "decisions.json"
    assert f"exported 6 entries to {bundle}" in ok(invoke(filled, "export", str(bundle)))
    data = json.loads(bundle.read_text())
    assert data["format"] == "prescreen-bundle" and data["schema_version"] == SCHEMA_VERSION
    copy = tmp_path / "copy"
    assert "imported 6 entries" in ok(invoke(copy, "import", str(bundle)))
    assert "imported 0 entries" in ok(invoke(copy, "import", str(bundle)))  # already there

    def without_hits(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {e["key"]: {k: v for k, v in e.items() if k != "hits"} for e in entries}

    assert without_hits(stored(copy)) == without_hits(stored(filled))
    # The imported decisions serve lookups: warming the same plans again is all hits.
    report = ok_json(invoke(copy, "warm", "--plans", str(bundle), "--device-memory", "1MiB", "--json"))
    assert report["decisions"] and all(d["hit"] for d in report["decisions"])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"schema_version": SCHEMA_VERSION + 1}, f"holds decisions of schema {SCHEMA_VERSION + 1}"),
        ({"format": "something-else"}, "is not a prescreen bundle: format is 'something-else'"),
        ({"bundle_version": 99}, "has bundle_version 99"),
    ],
)
def test_import_refuses_other_bundles(tmp_path: Path, filled: Path, change: dict[str, object], needle: str) -> None:
    bundle = tmp_path / "bundle.json"
    ok(invoke(filled, "export", str(bundle)))
    bundle.write_text(json.dumps({**json.loads(bundle.read_text()), **change}))
    target = tmp_path / "target"
    assert_cli_error(invoke(target, "import", str(bundle)), needle)
    assert stored(target) == []


def test_import_rejects_what_is_not_a_bundle(tmp_path: Path) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    assert_cli_error(invoke(tmp_path / "c", "import", str(junk)), "junk.json is not a prescreen bundle")
    assert_cli_error(invoke(tmp_path / "c", "import", str(tmp_path / "absent.json")), "cannot read bundle")


# --- errors ----------------------------------------------------------------------------------------------------------

#: (argv with {tmp}, {plans}, {tiny}, {file} placeholders, extra env, what the one error line says, also as a process)
ERRORS: list[tuple[list[str], dict[str, str], str, bool]] = [
    (["warm", "nosuchmodule:fn", "--device-memory", "64GiB"], {}, "cannot import 'nosuchmodule'", True),
    (["warm", "{tiny}", "--device-memory", "64GiB"], {}, "expected module:callable or file.py:callable", False),
    (["warm", "{tiny}:no_such_model", "--device-memory", "64GiB"], {}, "has no callable 'no_such_model'", False),
    (["warm", "{tmp}/missing.py:fn", "--device-memory", "64GiB"], {}, "no file", False),
    (["warm", "{tiny}:mlp", "--shape", "batch=10..2"], {}, "min 10 is greater than max 2", False),
    (["warm", "{tiny}:mlp", "--shape", "x"], {}, "invalid shape 'x'", False),
    (["warm", "{tiny}:mlp", "--shape", "batch=0..4"], {}, "sizes must be at least 1", False),
    (["warm", "--plans", "{plans}", "--device-memory", "lots"], {}, "'lots' is not a memory size", True),
    (["warm", "--plans", "{plans}", "--device-memory", "0"], {}, "--device-memory '0' is not positive", False),
    (["warm", "--plans", "{plans}", "--device-memory", "1MiB", "--ratio", "0"], {}, "--ratio='0' is out of range",
     False),
    (["warm", "--plans", "{plans}", "--device-memory", "1MiB", "--ratio", "2"], {}, "--ratio='2' is out of range",
     False),
    (["warm", "--plans", "{plans}", "--device-memory", "1MiB"], {"PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO": "abc"},
     "PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO='abc' is not a number", True),
    (["warm", "--plans", "{plans}"], {}, "--plans needs --device-memory", False),
    (["warm", "--plans", "{tmp}/absent.json", "--device-memory", "1MiB"], {}, "cannot read plans", False),
    (["warm", "--device-memory", "1MiB"], {}, "missing TARGET", False),
    (["--cache-dir", "{file}/cache", "warm", "--plans", "{plans}", "--device-memory", "1MiB"], {},
     "store unreachable: disk at", False),
    (["--cache-dir", "{file}/cache", "stats"], {}, "store unreachable: disk at", True),
    (["--cache-dir", "{file}/cache", "inspect"], {}, "store unreachable: disk at", False),
    (["--cache-dir", "{file}/cache", "export", "{tmp}/out.json"], {}, "store unreachable: disk at", False),
    (["--redis-url", "redis://127.0.0.1:1/0", "inspect"], {"PRESCREEN_REDIS_LOCAL_TIER": "0"},
     "store unreachable: redis at redis://127.0.0.1:1/0", True),
    (["--redis-url", "redis://127.0.0.1:1/0", "stats"], {"PRESCREEN_REDIS_LOCAL_TIER": "0"},
     "store unreachable: redis at redis://127.0.0.1:1/0", False),
    (["inspect"], {"PRESCREEN_REDIS_LOCAL_TIER": "maybe", "PRESCREEN_REDIS_URL": "redis://127.0.0.1:1/0"},
     "PRESCREEN_REDIS_LOCAL_TIER='maybe' is not a switch", False),
]
ERROR_IDS = [" ".join([*(f"{k}={v}" for k, v in case[1].items()), *case[0]]) for case in ERRORS]


def _argv(argv: list[str], tmp: Path, plans: Path) -> list[str]:
    """``argv`` with its placeholders filled, after a ``--cache-dir`` in ``tmp`` (a later one in argv wins)."""
    regular = tmp / "regular-file"
    regular.write_text("")
    names = {"tmp": str(tmp), "plans": str(plans), "tiny": str(TINY), "file": str(regular)}
    return ["--cache-dir", str(tmp / "cache"), *(a.format(**names) for a in argv)]


@pytest.mark.parametrize(("argv", "env", "needle", "_"), ERRORS, ids=ERROR_IDS)
def test_errors_in_process(tmp_path: Path, plans_file: Path, argv: list[str], env: dict[str, str], needle: str,
                           _: bool) -> None:
    assert_cli_error(CliRunner().invoke(cli, _argv(argv, tmp_path, plans_file), env={**CLEAN_ENV, **env}), needle)
    assert stored(tmp_path / "cache") == []  # nothing was warmed


# --- real processes: the console-script entry point -----------------------------------------------------------------

SUBPROCESS_ERRORS = [i for i, case in enumerate(ERRORS) if case[3]]
WARM_MLP = ["warm", "examples/tiny_models.py:mlp", "--shape", "batch=8..16", "--points", "1",
            "--device-memory", "64GiB", "--mode", "default", "--json"]
Started = dict[object, tuple[list[str], "subprocess.Popen[str]"]]


@pytest.fixture(scope="module", autouse=True)
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    """Start every real-process case when this module starts, so they run while the in-process tests do.

    Keyed by ERRORS index, or "warm" for the real compile; whatever is still running at the end is killed.
    """
    tmp = tmp_path_factory.mktemp("cli-processes")
    plans = tmp / "plans.json"
    plans.write_text(json.dumps(PLANS))
    base = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    entry = [sys.executable, "-c", "from prescreen.cli import main; main()"]
    procs: Started = {}

    def start(key: object, argv: list[str], env: dict[str, str]) -> None:
        procs[key] = (argv, subprocess.Popen(entry + argv, cwd=ROOT, env={**base, **env, "COLUMNS": "250"},
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    try:
        start("warm", WARM_MLP, {"PRESCREEN_CACHE_DIR": str(tmp / "warm-cache")})
        for i in SUBPROCESS_ERRORS:
            argv, env, _, _ = ERRORS[i]
            case = tmp / f"case{i}"
            case.mkdir()
            start(i, _argv(argv, case, plans), env)
        yield procs
    finally:
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def finished(started: Started, key: object) -> subprocess.CompletedProcess[str]:
    argv, proc = started[key]
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("index", SUBPROCESS_ERRORS, ids=[ERROR_IDS[i] for i in SUBPROCESS_ERRORS])
def test_errors_in_a_real_process(started: Started, index: int) -> None:
    done = finished(started, index)
    assert_one_error_line(done.stderr, done.stdout, done.returncode, ERRORS[index][2])


@pytest.mark.slow
def test_warm_real_compile(started: Started) -> None:
    done = finished(started, "warm")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["compiles"] >= 1
    assert set(report) >= {"kernels", "decisions_made", "lookups", "tuned", "fell_back", "not_bounded", "largest_estimated_bytes",
                           "compiles", "seconds", "dry_run", "store", "decisions"}
    assert report["dry_run"] is False and isinstance(report["decisions"], list)
    # --mode default autotunes nothing on CPU: no decisions, and the report says why and what to change.
    assert report["decisions"] == [] and report["kernels"] == 0
    hints = " ".join(report["hints"])
    assert "--mode max-autotune" in hints and "--inductor-config freezing=True" in hints
    assert report["decisions_made"] == len(report["decisions"])
    assert report["tuned"] + report["fell_back"] + report["not_bounded"] == report["decisions_made"]
    for d in report["decisions"]:
        assert set(d) == {"key", "kernel", "sizes", "action", "bounded", "estimated_bytes", "budget_bytes", "hit",
                          "reason", "site", "family"}


def test_inspect_verify_recomputes_stored_decisions(tmp_path) -> None:
    from click.testing import CliRunner
    from strategies import upstream_meta

    from prescreen.cli import cli
    from prescreen.store import DiskStore
    from prescreen.store.entry import Entry

    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps([upstream_meta()]))
    cache = str(tmp_path / "c")
    runner = CliRunner()
    assert runner.invoke(cli, ["--cache-dir", cache, "warm", "--plans", str(plans), "--device-memory", "4KiB"]).exit_code == 0
    ok = runner.invoke(cli, ["--cache-dir", cache, "inspect", "--verify"])
    assert ok.exit_code == 0 and "1 identical" in ok.output
    # A self-consistent forgery (budget and action agree) that a fresh computation contradicts.
    store = DiskStore(cache)
    (entry,) = list(store.entries())
    payload = entry.to_payload()
    payload["decision"]["estimated_bytes"] += 8
    payload["decision"]["synthetic_bytes"] += 8
    payload["decision"]["group_bytes"][-1][1] += 8
    payload["decision"]["reason"] = payload["decision"]["reason"].replace("560", "568")
    forged = Entry.from_payload(payload)
    store.delete([entry.key])
    assert store.put(forged)
    store.close()
    bad = runner.invoke(cli, ["--cache-dir", cache, "inspect", "--verify"])
    assert bad.exit_code == 1 and "mismatch" in bad.output
