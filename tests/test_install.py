"""prescreen as users install it: entry points under prescreen's namespace, ``import torch`` untouched.

``make test`` installs the built wheel non-editable into a fresh venv and runs
this file with ``python -P`` (the repository is not on ``sys.path``); the
``PRESCREEN_TEST_INSTALLED=1`` it sets makes the first test insist on that.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import prescreen

ROOT = Path(__file__).resolve().parent.parent

#: What a process that did not opt in may load from prescreen during ``import torch``: the entry
#: point's own top-level module, nothing under ``prescreen``.
AUTOLOAD_MODULES = {"_prescreen_autoload"}


def _run(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in ``cwd`` with ``cwd`` first on ``sys.path``, as ``python train.py`` has its folder."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("PRESCREEN") or k == "PRESCREEN_TEST_INSTALLED"}
    full.pop("PYTHONSAFEPATH", None)
    full["PYTHONPATH"] = str(cwd)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=300)


def test_tests_run_against_the_installed_wheel() -> None:
    if os.environ.get("PRESCREEN_TEST_INSTALLED") != "1":
        pytest.skip("not run by `make test` (which installs the wheel non-editable)")
    import prescreen.hooks.activation as activation

    for module in (prescreen, activation):
        path = Path(module.__file__ or "").resolve()
        assert "site-packages" in path.parts, path
        assert not path.is_relative_to(ROOT / "prescreen") and not path.is_relative_to(ROOT / "hooks"), path


def test_entry_points_name_prescreen_modules_only() -> None:
    """The backend lives under ``prescreen.hooks``; the ``import torch`` hook in its own top-level module."""
    expected = {"torch.backends": "_prescreen_autoload:autoload",
                "torch_dynamo_backends": "prescreen.hooks.backend:prescreen_backend"}
    for group, value in expected.items():
        ours = [ep.value for ep in entry_points(group=group) if ep.name == "prescreen"]
        assert ours == [value], (group, ours)


CHECK = """
import sys, torch
act = sys.modules.get("prescreen.hooks.activation")
loaded = sorted(m for m in sys.modules if m == "_prescreen_autoload" or m.split(".")[0] == "prescreen")
print("RESULT " + __import__("json").dumps({"installed": bool(act and act.is_installed()), "loaded": loaded}))
"""


def _user_hooks(tmp_path: Path, layout: str) -> Path:
    """A training repo with its own ``hooks`` module that must never be imported by ``import torch``."""
    repo = tmp_path / layout
    body = "raise RuntimeError('the user hooks module was imported by import torch')\n"
    if layout == "module":
        repo.mkdir()
        (repo / "hooks.py").write_text(body)
    else:
        (repo / "hooks").mkdir(parents=True)
        (repo / "hooks" / "__init__.py").write_text(body)
    return repo


@pytest.mark.parametrize("layout", ["module", "package"])
@pytest.mark.parametrize("enable", ["", "1"])
def test_import_torch_beside_a_user_hooks_module(tmp_path: Path, layout: str, enable: str) -> None:
    repo = _user_hooks(tmp_path, layout)
    env = {"PRESCREEN": enable} if enable else {}
    proc = _run(CHECK, repo, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["installed"] is bool(enable)
    if not enable:
        assert set(result["loaded"]) <= AUTOLOAD_MODULES, result["loaded"]
    # the user's own module still imports as theirs
    mine = _run("import hooks", repo)
    assert "the user hooks module was imported" in mine.stderr


def _user_prescreen(tmp_path: Path, layout: str) -> Path:
    """A working directory with its own ``prescreen`` (a project of that name, or a source checkout)."""
    repo = tmp_path / f"own-{layout}"
    if layout == "module":
        repo.mkdir()
        (repo / "prescreen.py").write_text("MINE = True\n")
    else:
        (repo / "prescreen").mkdir(parents=True)
        (repo / "prescreen" / "__init__.py").write_text("MINE = True\n")
    return repo


@pytest.mark.parametrize("layout", ["module", "package"])
@pytest.mark.parametrize("enable", ["", "1"])
def test_import_torch_beside_a_user_prescreen(tmp_path: Path, layout: str, enable: str) -> None:
    """A ``prescreen`` in the working directory shadows ours: ``import torch`` must still work."""
    repo = _user_prescreen(tmp_path, layout)
    env = {"PRESCREEN": enable} if enable else {}
    proc = _run("import torch, prescreen; print('OK', prescreen.MINE)", repo, **env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK True"), proc.stderr[-3000:]


def test_autoload_imports_only_the_standard_library(tmp_path: Path) -> None:
    code = """
import sys
before = set(sys.modules)
from _prescreen_autoload import autoload
autoload()
new = sorted(m for m in set(sys.modules) - before
             if m.split(".")[0] not in sys.stdlib_module_names and "prescreen" not in m)
extra = sorted(m for m in set(sys.modules) - before
               if (m == "_prescreen_autoload" or m.split(".")[0] == "prescreen") and m not in {mods})
print("NEW", new, extra)
""".replace("{mods}", repr(AUTOLOAD_MODULES))
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "NEW [] []", proc.stdout


@pytest.mark.parametrize("env", [
    {"PRESCREEN": "1", "PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO": "abc"},
    {"PRESCREEN": "1", "PRESCREEN_DEVICE_MEMORY": "lots"},
    {"PRESCREEN": "1", "PRESCREEN_REDIS_URL": "notaurl"},
    {"PRESCREEN": "1", "PRESCREEN_CACHE_DIR": "/proc/nope/cache"},
])
def test_import_torch_survives_bad_configuration(tmp_path: Path, env: dict[str, str]) -> None:
    proc = _run("import torch; print('OK')", tmp_path, **env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]


def test_autoload_never_raises_even_if_install_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import _prescreen_autoload as autoload
    import prescreen.hooks.activation as activation

    def boom(**_: object) -> None:
        raise RuntimeError("install exploded")

    monkeypatch.setenv("PRESCREEN", "1")
    monkeypatch.setattr(activation, "install", boom)
    autoload.autoload()  # logs, does not raise


def test_lazy_install_constants_match_the_guards() -> None:
    from prescreen.hooks import activation, npu

    assert activation.NPU_MODULE == npu.NPU_MODULE
    assert activation.NPU_RUNTIME_MODULE == npu.RUNTIME_MODULE


def test_a_junk_prescreen_value_is_said_once_at_import_torch(tmp_path: Path) -> None:
    """``PRESCREEN=banana`` leaves the guards off, as any value that is not on does, but says so (not silently)."""
    proc = _run("import sys, torch; print('OK', 'prescreen.hooks.activation' in sys.modules)", tmp_path,
                PRESCREEN="banana")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK False"), proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "prescreen" in line]
    assert lines == ["prescreen: PRESCREEN='banana' is not one of 1, true, yes, on (or 0, false, no, off); the guards "
                     "stay off"], proc.stderr[-3000:]


@pytest.mark.parametrize("value", ["", "0", "off", "False", " no "])
def test_an_off_prescreen_value_is_quiet(tmp_path: Path, value: str) -> None:
    proc = _run("from _prescreen_autoload import autoload; autoload(); print('OK')", tmp_path, PRESCREEN=value)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK" and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("configured", [False, True])
def test_verbose_prints_its_summary_without_logging_configured(tmp_path: Path, configured: bool) -> None:
    """``PRESCREEN_VERBOSE=1`` prints the exit summary on stderr when logging is not set up (logging's last-resort
    handler drops INFO), and logs it once, not twice, when it is."""
    setup = "import logging; logging.basicConfig(level=logging.INFO, format='LOG %(message)s'); " if configured else ""
    proc = _run(setup + "from prescreen.hooks.activation import install; install(lazy=True)", tmp_path,
                PRESCREEN_VERBOSE="1", PRESCREEN_CACHE_DIR=str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    summaries = [line for line in proc.stderr.splitlines() if re.search(r"prescreen: \d+ lookups, \d+ store hits",
                                                                        line)]
    assert len(summaries) == 1, proc.stderr
    assert summaries[0].startswith("LOG ") == configured, proc.stderr
