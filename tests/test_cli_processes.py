"""The console script in real processes: one ``error:`` line and exit 2 for every bad input, and no torch.

Each case runs ``prescreen.cli.main`` in a fresh interpreter through a wrapper that records, at
exit, whether ``torch`` got imported. ``--help``, the reading commands (inspect, report, stats,
export, import, clear) and every argument error must not import it; only a model warm (and
checks that need torch itself, such as ``--device``) may. All processes start at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli import ANSI, CLEAN_ENV, PLANS, assert_one_error_line

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
    "plans_with_shapes": 'plans = "p.json"\ndevice_memory = "1MiB"\n[shapes]\nbatch = "1..8"\n',
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
    (["warm", "--spec", "{spec_points_abc}"], {}, "'points' must be a whole number, got 'abc'"),
    (["warm", "--spec", "{spec_batch_min_only}"], {}, "shape 'batch' must be 'MIN..MAX' or {min = MIN, max = MAX}"),
    (["warm", "--spec", "{spec_dashed_key}"], {}, "unknown key 'device-memory' (did you mean 'device_memory'?)"),
    (["warm", "--spec", "{spec_inductor_config_number}"], {}, "'inductor_config' must be a table"),
    (["warm", "--plans", "{plans}", "--device-kind", "banana"], {}, "--device-kind: 'banana' is not one of"),
    (["warm", "--plans", "{plans}", "--device-memory", "0.1"], {}, "--device-memory '0.1' is less than one byte"),
    (["warm", "--plans", "{plans}", "--device-memory", "lots"], {}, "--device-memory 'lots' is not a memory size"),
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
    # odd URLs and paths
    (["--redis-url", "redis://:pw@[::1/0", "stats"], {}, "'redis://:***@[::1/0' is not a valid URL (Invalid IPv6 URL)"),
    (["--redis-url", "user:PASSWORD@host:6379/0", "stats"], {}, "--redis-url 'user:***@host:6379/0' is not a Redis URL"),
    (["stats"], {"PRESCREEN_REDIS_URL": "user:PASSWORD@host:6379/0"},
     "PRESCREEN_REDIS_URL 'user:***@host:6379/0' is not a Redis URL"),
    (["--cache-dir", "", "stats"], {}, "--cache-dir is empty"),
    (["--cache-dir", " ", "warm", "--plans", "{plans}", "--device-memory", "1MiB"], {}, "--cache-dir is empty"),
    (["nosuch\x1b]0;title\x07command"], {}, "no such command 'nosuch\\x1b]0;title\\x07command'"),
    (["--cache-dir", "{plans}/c\x1b]0;title\x07", "stats"], {}, "store unreachable: disk at "),
    # junk settings are errors before anything is compiled, not a warm of "0 decisions"
    (["warm", "{tiny}:mlp", "--shape", "batch=8"], {"PRESCREEN_DEVICE_MEMORY": "junk"},
     "PRESCREEN_DEVICE_MEMORY 'junk' is not a memory size"),
    (["warm", "{tiny}:mlp", "--shape", "batch=8"], {"PRESCREEN_BUDGET_BASIS": "junk"},
     "PRESCREEN_BUDGET_BASIS='junk' is not one of total, free"),
    (["warm", "--plans", "{plans}", "--device-memory", "2e18"], {}, "--device-memory '2e18' is more than 1 EiB"),
    (["warm", "{tiny}:mlp", "--shape", "batch=1..1e23"], {}, "1e23 is more than 9223372036854775807 (2**63 - 1)"),
    # flags that do not apply
    (["warm", "--plans", "{plans}", "--device-memory", "1MiB", "--shape", "batch=1..8"], {},
     "--shape does not apply to --plans"),
    (["warm", "--plans", "{plans}", "--device-memory", "1MiB", "--mode", "default"], {},
     "--mode does not apply to --plans"),
    (["warm", "--plans", "{plans}", "--device-memory", "1MiB", "--inductor-config", "freezing=True"], {},
     "--inductor-config does not apply to --plans"),
    (["warm", "{tiny}:mlp", "--device-kind", "cuda"], {}, "--device-kind applies to --plans only"),
    (["warm", "{tiny}:mlp", "--shape", "batch=1..4", "--shape", "batch=8"], {},
     "--shape batch is given twice (1..4 and 8..8)"),
    (["warm", "--spec", "{spec_plans_with_shapes}"], {}, "plans_with_shapes.toml': shapes does not apply to --plans"),
]

#: Errors only torch can tell (the target runs, the device is asked).
TORCH_ERRORS: list[tuple[list[str], dict[str, str], str]] = [
    (["warm", "{boom}:make", "--shape", "batch=4..8", "--points", "1", "--device-memory", "64GiB"], {},
     "target make(batch=8, device='cpu') raised ValueError: no model today"),
    (["warm", "{tiny}:mlp", "--device", "nosuchdev", "--device-memory", "64GiB"], {},
     "--device 'nosuchdev' is not a device"),
    (["warm", "{tiny}:mlp", "--inductor-config", "no_such_option=1", "--device-memory", "64GiB"], {},
     "torch._inductor.config has no 'no_such_option'"),
    # a range warm could never hold is refused before anything is built (measured on the meta device)
    (["warm", "{tiny}:mlp", "--shape", "batch=1..1e12", "--device-memory", "64GiB"], {},
     "warm at batch=999999999999 needs at least 232.8 TiB (256000000099200 bytes) for the model and its example "
     "inputs, more than the"),
    (["warm", "{tiny}:mlp", "--shape", "batch=1..9e18", "--device-memory", "64GiB"], {},
     "the largest sizes are too large: measuring the model at batch=8999999999999999999 on the meta device failed"),
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


def test_an_escape_in_an_error_line_is_shown_as_text(procs: Procs) -> None:
    index = next(i for i, c in enumerate(NO_TORCH_ERRORS) if "{plans}/c\x1b" in " ".join(c[0]))
    done, _ = finished(procs, f"error{index}")
    assert "c\\x1b]0;title\\x07" in done.stderr and "\x1b]" not in done.stderr and "\x07" not in done.stderr


@pytest.mark.parametrize("secret", ["hunter2", "PASSWORD", ":pw@"])
def test_a_password_in_a_bad_redis_url_is_not_printed(procs: Procs, secret: str) -> None:
    cases = [i for i, c in enumerate(NO_TORCH_ERRORS) if secret in " ".join(c[0]) + " ".join(c[1].values())]
    assert cases
    for index in cases:
        done, _ = finished(procs, f"error{index}")
        assert secret not in done.stderr and "***" in done.stderr, done.stderr


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


@pytest.mark.parametrize(("text", "memory"), [("64Gi", 64 * 2**30), ("1e9", 10**9), ("2.5e3KiB", 2500 * 1024)])
def test_memory_sizes_in_kubernetes_and_exponent_spelling(tmp_path: Path, text: str, memory: int) -> None:
    """``64Gi`` is 64 GiB and ``1e9`` is bytes (both used to be "less than one byte")."""
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps(PLANS))
    out, _ = _done(_cli(tmp_path / "cache", "warm", "--plans", str(plans), "--device-memory", text, "--json"))
    assert {d["budget_bytes"] for d in json.loads(out)["decisions"]} == {memory // 4}


# --- hostile names, read-only file systems, 80 columns: each command in a real process ---------------------------

#: Kernel names a shared store (or a plans file) may hold: rich markup, and terminal escapes that would write the
#: clipboard (OSC 52), set the window title, clear the screen, and a bidi override.
HOSTILE = ("k[/]bad[bold]x", "evil\x1b]52;c;aGk=\x07\x1b[2J\x1b]0;title\x07\u202e")
RAW = ("\x1b]", "\x07", "\x1b[2J", "\u202e")


def _cli(cache: Path, *argv: str, columns: int = 250) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    return subprocess.Popen([sys.executable, "-c", "from prescreen.cli import main; main()", "--cache-dir", str(cache),
                             *argv], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, "COLUMNS": str(columns)})


def _done(proc: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err, (proc.args, out, err)
    return out, err


def test_hostile_kernel_names_are_shown_as_text(tmp_path: Path) -> None:
    """Markup in a name does not make rich raise; escapes reach the terminal as visible text, never raw."""
    from test_cli import plan

    plans = tmp_path / "hostile.json"
    plans.write_text(json.dumps([plan(HOSTILE[0], 10), plan(HOSTILE[1], 1 << 20)]))
    cache = tmp_path / "cache"
    warm_out, warm_err = _done(_cli(cache, "warm", "--plans", str(plans), "--device-memory", "1MiB"))
    entries = json.loads(_done(_cli(cache, "inspect", "--json"))[0])
    fallback = next(e["key"] for e in entries if e["decision"]["action"] == "fallback")
    running = {name: _cli(cache, *argv) for name, argv in {
        "inspect": ["inspect"], "inspect-key": ["inspect", fallback[:10]], "report": ["report"],
        "report-tune": ["report", "--decision", "tune"], "verify": ["inspect", "--verify"], "stats": ["stats"],
        "warm-again": ["warm", "--plans", str(plans), "--device-memory", "1MiB"]}.items()}
    outputs = {"warm": warm_out + warm_err, **{n: "".join(_done(p)) for n, p in running.items()}}
    outputs["clear"] = "".join(_done(_cli(cache, "clear", "--all", "--yes")))  # prints the names after deleting
    for name, text in outputs.items():
        assert not any(raw in text for raw in RAW), (name, text)
    for name in ("warm", "inspect", "inspect-key", "report", "warm-again", "clear"):
        assert "\\x1b]52;c;aGk=\\x07\\x1b[2J\\x1b]0;title\\x07\\u202e" in outputs[name], (name, outputs[name])
    for name in ("warm", "inspect", "report-tune", "clear"):
        assert HOSTILE[0] in outputs[name], (name, outputs[name])
    assert "2 entries removed" in outputs["clear"]
    assert json.loads(_done(_cli(cache, "stats", "--json"))[0])["entries"] == 0


def test_a_store_warning_shows_escapes_as_text(tmp_path: Path) -> None:
    """A warning names the store's path (here with a title-setting escape in it): logged as visible text too."""
    cache = tmp_path / "c\x1b]0;title\x07"
    cache.mkdir(mode=0o700)
    (cache / "cache.db").write_bytes(b"not a database" * 100)  # recovered, and warned about
    out, err = _done(_cli(cache, "stats"))
    assert "database file is corrupt" in err and "c\\x1b]0;title\\x07" in err, err
    assert not any(raw in out + err for raw in RAW), err


def test_a_read_only_file_system_is_named(tmp_path: Path) -> None:
    """A cache directory that cannot be created on a read-only mount says so, not "No such file"."""
    unshare = shutil.which("unshare")
    ro = tmp_path / "ro"
    ro.mkdir()
    mount = f"mount -t tmpfs -o ro tmpfs {ro}"
    if unshare is None or subprocess.run([unshare, "-rm", "sh", "-c", mount], capture_output=True).returncode:
        pytest.skip("no unshare -rm here to make a read-only mount in a private namespace")
    cli = f"{sys.executable} -c 'from prescreen.cli import main; main()' --cache-dir {ro}/cache stats"
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    done = subprocess.run([unshare, "-rm", "sh", "-c", f"{mount} && exec {cli}"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=120)
    assert_one_error_line(done.stderr, done.stdout, done.returncode, "cache is read-only (cannot create")
    assert "Read-only file system" in done.stderr and "No such file" not in done.stderr


def _family_plan(width: int, batch: int, family: str) -> dict[str, object]:
    """An Inductor-style plan (no group features; one static axis labelled with its shape family)."""
    from test_cli import plan

    payload = plan("select:linear_unary", width)
    payload.update(group_features=[], axis_static_values=[["x0", batch]], axis_labels=[["x0", family]])
    return payload


#: One kernel at two shape families, and one whose estimate (2098176 B) rounds like its budget (2 MiB).
FAMILY_PLANS = [_family_plan(300, 2048, "batch in (1024, 2048]"), _family_plan(300, 4096, "batch in (2048, 4096]"),
                _family_plan(510, 2049, "batch in (2048, 4096]")]


def test_80_columns_keep_families_and_whole_words(tmp_path: Path) -> None:
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps(FAMILY_PLANS))
    cache = tmp_path / "cache"
    argv = ["warm", "--plans", str(plans), "--device-memory", "8MiB", "--device-kind", "cpu"]
    warm, _ = _done(_cli(cache, *argv, columns=80))
    listing, _ = _done(_cli(cache, "inspect", columns=80))
    for text in (warm, listing):
        lines = ANSI.sub("", text).splitlines()
        assert max(len(line) for line in lines) <= 80, text
        words = set(" ".join(line.replace("│", " ").replace("┃", " ") for line in lines).split())
        # no word cut: each word of every family and reason is whole somewhere in the output
        for expected in ("batch", "in", "(1024,", "2048]", "(2048,", "4096]", "2098176", "2097152", "B", ">",
                         "(in_ptr0)", "fallback", "tune"):
            assert expected in words, (expected, text)
    header = next(line for line in listing.splitlines() if "┃" in line and "key" in line)
    assert "shape family" in header and "why" in header
    summary = " ".join(ANSI.sub("", warm).split("decisions\n")[0].split())
    assert "3 decisions, 1 tuned, 2 fell back" in summary, summary
    assert "2.0 MiB > 2.0 MiB" not in warm + listing
