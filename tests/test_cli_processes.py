"""The console script in real processes: one ``error:`` line and exit 2 for every bad input, and no torch.

Each case runs ``prescreen.cli.main`` in a fresh interpreter through a wrapper that records, at
exit, whether ``torch`` got imported. ``--help``, the reading commands (inspect, report, stats,
export, import, clear) and every argument error must not import it; only a model warm (and
checks that need torch itself, such as ``--device``) may. All processes start at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli import CLEAN_ENV, PLANS, assert_one_error_line

from prescreen.cli import cli

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "tiny_models.py"

#: Runs the CLI with the given arguments; at exit writes whether torch was imported to $PRESCREEN_TEST_MODULES.
WRAPPER = (
    "import atexit, os, sys\n"
    "def _record():\n"
    "    with open(os.environ['PRESCREEN_TEST_MODULES'], 'w') as f:\n"
    "        f.write('torch' if 'torch' in sys.modules else 'no torch')\n"
    "atexit.register(_record)\n"
    "from prescreen.cli import main\n"
    "main(sys.argv[1:])\n"
)

SPECS = {
    "points_abc": 'points = "abc"\n',
    "batch_min_only": 'target = "x:y"\n[shapes]\nbatch = { min = 1 }\n',
    "dashed_key": 'target = "x:y"\ndevice-memory = "64GiB"\n',
    "inductor_config_number": 'target = "x:y"\ninductor_config = 3\n',
}

#: (argv with {placeholders}, extra env, what the error line holds). None of these may import torch.
NO_TORCH_ERRORS: list[tuple[list[str], dict[str, str], str]] = [
    (["warm", "{tiny}:mlp", "--points", "0"], {}, "--points: 0 is not in the range 1<=x<=16"),
    (["warm", "{tiny}:mlp", "--mode", "nonsense"], {}, "--mode: 'nonsense' is not one of 'default'"),
    (["inspect", "--decision", "maybe"], {}, "--decision: 'maybe' is not one of 'tune', 'fallback'"),
    (["export", "{tmp}"], {}, "PATH: file"),
    (["export"], {}, "missing argument PATH"),
    (["export", "{tmp}/no/such/dir/out.json"], {}, "no directory"),
    (["export", "/proc/prescreen-test.json"], {}, "cannot write bundle '/proc/prescreen-test.json'"),
    (["warm", "--spec", "{spec_points_abc}"], {}, "points 'abc' is not a whole number from 1 to 16"),
    (["warm", "--spec", "{spec_batch_min_only}"], {}, "shape 'batch' must be 'MIN..MAX' or {min = MIN, max = MAX}"),
    (["warm", "--spec", "{spec_dashed_key}"], {}, "unknown key 'device-memory' (did you mean 'device_memory'?)"),
    (["warm", "--spec", "{spec_inductor_config_number}"], {}, "'inductor_config' must be a table"),
    (["warm", "--plans", "{plans}", "--device-kind", "banana"], {}, "--device-kind: 'banana' is not one of"),
    (["warm", "--plans", "{plans}", "--device-memory", "0.1"], {}, "--device-memory '0.1' is less than one byte"),
    (["warm", "--plans", "{plans}", "--device-memory", "lots"], {}, "invalid memory size 'lots'"),
    (["warm", "--plans", "{plans}", "--device-memory", "1MiB", "--ratio", "abc"], {}, "--ratio='abc' is not a number"),
    (["warm", "--plans", "{plans}"], {}, "--plans needs --device-memory or PRESCREEN_DEVICE_MEMORY"),
    (["warm", "{tiny}:mlp", "--plans", "{plans}"], {}, "give TARGET or --plans, not both"),
    (["warm", "{tiny}:mlp", "--shape", "batch=10..2"], {}, "min 10 is greater than max 2"),
    (["warm", "{tiny}:mlp", "--inductor-config", "freezing"], {}, "expected KEY=VALUE"),
    (["warm", "--device-memory", "1MiB"], {}, "missing TARGET"),
    (["--redis-url", "notaurl", "stats"], {}, "--redis-url 'notaurl' is not a Redis URL"),
    (["stats"], {"PRESCREEN_REDIS_URL": "notaurl"}, "PRESCREEN_REDIS_URL 'notaurl' is not a Redis URL"),
    (["--redis-url", "http://user:hunter2@cache:6379/0", "stats"], {}, "is not a Redis URL"),
    (["nosuchcommand"], {}, "no such command 'nosuchcommand'"),
    (["warm", "--no-such-option"], {}, "no such option '--no-such-option'"),
    (["clear"], {}, "nothing selected"),
    (["clear", "--all", "--decision", "tune", "--yes"], {}, "--all cannot be combined"),
    (["inspect", "--older-than", "soon"], {}, "invalid duration 'soon'"),
    (["inspect", "zz"], {}, "invalid key prefix 'zz'"),
    (["import", "{tmp}/absent.json"], {}, "cannot read bundle"),
    (["report", "--decision", "maybe"], {}, "--decision: 'maybe' is not one of"),
]

#: Errors only torch can tell (the target runs, the device is asked).
TORCH_ERRORS: list[tuple[list[str], dict[str, str], str]] = [
    (["warm", "{boom}:make", "--shape", "batch=4..8", "--points", "1", "--device-memory", "64GiB"], {},
     "target make(batch=8, device='cpu') raised ValueError: no model today"),
    (["warm", "{tiny}:mlp", "--device", "nosuchdev", "--device-memory", "64GiB"], {},
     "--device 'nosuchdev' is not a device"),
    (["warm", "{tiny}:mlp", "--inductor-config", "no_such_option=1", "--device-memory", "64GiB"], {},
     "torch._inductor.config has no 'no_such_option'"),
]
CUDA_ERROR: tuple[list[str], dict[str, str], str] = (["warm", "{tiny}:mlp", "--device", "cuda", "--device-memory", "64GiB"], {},
              "--device 'cuda': no cuda device is available")

#: Commands that succeed without importing torch, on a filled store ({cache}) or a copy of it ({scratch}).
NO_TORCH_OK: list[tuple[str, list[str]]] = [
    ("help", ["--help"]),
    ("warm-help", ["warm", "--help"]),
    ("no-args", []),
    ("inspect", ["--cache-dir", "{cache}", "inspect"]),
    ("inspect-json", ["--cache-dir", "{cache}", "inspect", "--json", "--kernel", "*huge*"]),
    ("inspect-key", ["--cache-dir", "{cache}", "inspect", "{fallback_key}"]),
    ("report", ["--cache-dir", "{cache}", "report"]),
    ("report-html", ["--cache-dir", "{cache}", "report", "--html", "{tmp}/report.html"]),
    ("stats", ["--cache-dir", "{cache}", "stats"]),
    ("stats-json", ["--cache-dir", "{cache}", "stats", "--json"]),
    ("export", ["--cache-dir", "{cache}", "export", "{tmp}/bundle.json"]),
    ("import", ["--cache-dir", "{tmp}/imported", "import", "{bundle}"]),
    ("clear", ["--cache-dir", "{scratch}", "clear", "--kernel", "*huge*", "--yes"]),
]


#: One real max-autotune compile of a two-GEMM MLP on CPU (frozen weights, so Inductor autotunes both).
QUIET_WARM = ["warm", "{tiny}:mlp", "--shape", "batch=16", "--device-memory", "64GiB", "--inductor-config",
              "freezing=True", "--json"]


def _fill(cache: Path, plans: Path) -> None:
    env = {**CLEAN_ENV}
    for memory, kind in (("1MiB", "npu"), ("64GiB", "cuda")):
        result = CliRunner().invoke(cli, ["--cache-dir", str(cache), "warm", "--plans", str(plans), "--device-memory",
                                          memory, "--device-kind", kind], env=env)
        assert result.exit_code == 0, result.output


Procs = dict[str, tuple[Path, "subprocess.Popen[str]"]]


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    tmp = tmp_path_factory.mktemp("cli-procs")
    plans = tmp / "plans.json"
    plans.write_text(json.dumps(PLANS))
    cache, scratch = tmp / "cache", tmp / "scratch"
    _fill(cache, plans)
    _fill(scratch, plans)
    bundle = tmp / "seed-bundle.json"
    assert CliRunner().invoke(cli, ["--cache-dir", str(cache), "export", str(bundle)], env=CLEAN_ENV).exit_code == 0
    fallback = [e for e in json.loads(bundle.read_text())["entries"] if e["decision"]["action"] == "fallback"]
    boom = tmp / "boom.py"
    boom.write_text("def make(batch=2, device='cpu'):\n    raise ValueError('no model today')\n")
    names = {"tmp": str(tmp), "plans": str(plans), "tiny": str(TINY), "cache": str(cache), "scratch": str(scratch),
             "bundle": str(bundle), "fallback_key": fallback[0]["key"][:10], "boom": str(boom)}
    for name, text in SPECS.items():
        (tmp / f"{name}.toml").write_text(text)
        names[f"spec_{name}"] = str(tmp / f"{name}.toml")
    base = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    started: Procs = {}

    def start(case: str, argv: list[str], env: dict[str, str]) -> None:
        marker = tmp / f"{case}.modules"
        own_cache = argv and "--cache-dir" not in argv and "--help" not in argv
        full = ["--cache-dir", str(tmp / f"{case}-cache")] if own_cache else []
        args = [a.format(**names) for a in full + argv]
        started[case] = (marker, subprocess.Popen(
            [sys.executable, "-c", WRAPPER, *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**base, "COLUMNS": "120", **env, "PRESCREEN_TEST_MODULES": str(marker)}))

    try:
        for i, (argv, env, _) in enumerate(NO_TORCH_ERRORS):
            start(f"error{i}", argv, env)
        for name, argv in NO_TORCH_OK:
            start(name, argv, {})
        for i, (argv, env, _) in enumerate(TORCH_ERRORS):
            start(f"torch{i}", argv, env)
        start("cuda", CUDA_ERROR[0], CUDA_ERROR[1])
        start("quiet-warm", QUIET_WARM, {})
        yield started
    finally:
        for _, proc in started.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def finished(procs: Procs, case: str) -> tuple[subprocess.CompletedProcess[str], str]:
    marker, proc = procs[case]
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), marker.read_text()


@pytest.mark.parametrize("index", range(len(NO_TORCH_ERRORS)), ids=[" ".join(c[0]) for c in NO_TORCH_ERRORS])
def test_argument_errors_are_one_line_and_import_no_torch(procs: Procs, index: int) -> None:
    done, modules = finished(procs, f"error{index}")
    assert_one_error_line(done.stderr, done.stdout, done.returncode, NO_TORCH_ERRORS[index][2])
    assert modules == "no torch"


def test_a_password_in_a_bad_redis_url_is_not_printed(procs: Procs) -> None:
    index = next(i for i, c in enumerate(NO_TORCH_ERRORS) if "hunter2" in " ".join(c[0]))
    done, _ = finished(procs, f"error{index}")
    assert "hunter2" not in done.stderr and "***" in done.stderr


@pytest.mark.parametrize("index", range(len(TORCH_ERRORS)), ids=[" ".join(c[0]) for c in TORCH_ERRORS])
def test_errors_that_need_torch_are_one_line_too(procs: Procs, index: int) -> None:
    done, _ = finished(procs, f"torch{index}")
    assert_one_error_line(done.stderr, done.stdout, done.returncode, TORCH_ERRORS[index][2])


def test_device_cuda_without_cuda(procs: Procs) -> None:
    import torch

    done, _ = finished(procs, "cuda")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    assert_one_error_line(done.stderr, done.stdout, done.returncode, CUDA_ERROR[2])


@pytest.mark.parametrize("name", [n for n, _ in NO_TORCH_OK])
def test_reading_commands_import_no_torch(procs: Procs, name: str) -> None:
    done, modules = finished(procs, name)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert modules == "no torch"
    if name in ("help", "no-args"):
        assert "Commands:" in done.stdout and "inspect" in done.stdout
    if name == "stats-json":
        assert json.loads(done.stdout)["entries"] == 6
    if name == "inspect-key":
        assert "per-group bytes vs budget" in done.stdout


@pytest.mark.slow
def test_warm_is_quiet_and_counts_kernels(procs: Procs) -> None:
    """Inductor's AUTOTUNE tables and choice stats stay off stderr; two GEMMs are two kernels."""
    done, modules = finished(procs, "quiet-warm")
    assert done.returncode == 0, done.stderr[-3000:]
    assert modules == "torch"
    assert "AUTOTUNE" not in done.stderr and "Autotune Choices Stats" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["compiles"] == 1 and report["kernels"] == 2 and report["hints"] == []
    assert all(d["kernel"].startswith("select:") and d["action"] == "tune" for d in report["decisions"])
