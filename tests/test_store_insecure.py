"""Foreign or insecure cache directories are refused; files are private; no row names a path outside the cache."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from diskcache.core import MODE_TEXT
from test_store_support import BUDGET, make_entry, make_plan, warnings_of

from prescreen.cli import cli
from prescreen.decision import decide
from prescreen.errors import ConfigError
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore, trust

OTHER_UID = 4242


@pytest.fixture
def foreign(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make a path owned by another user: chown as root, else pretend to be another user."""

    def make(path: Path) -> None:
        if os.geteuid() == 0:
            os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
        else:
            real = os.geteuid()
            monkeypatch.setattr(trust, "current_uid", lambda: real + 1)

    return make


def planted(directory: Path) -> str:
    """A valid entry stored in ``directory`` by its owner; returns its key."""
    entry = make_entry(1)
    with DiskStore(directory) as store:
        assert store.put(entry)
    return entry.key


def assert_refused(directory: Path, key: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="prescreen.store"):
        store = DiskStore(directory)
        assert store.get(key) is None
        assert store.put(make_entry(2)) is False
        plan = make_plan(1)
        assert lookup_or_decide(plan, BUDGET, store).decision == decide(plan, BUDGET)
        stats = store.stats()
        store.close()
    assert not stats.healthy and stats.detail.startswith("refused:")
    messages = warnings_of(caplog)
    assert len(messages) == 1 and "not safe to use" in messages[0], messages


def test_directory_owned_by_another_user(tmp_path: Path, foreign, caplog) -> None:
    directory = tmp_path / "cache"
    key = planted(directory)
    foreign(directory)
    assert_refused(directory, key, caplog)


@pytest.mark.parametrize("mode", [0o770, 0o757, 0o777, 0o1777])
def test_directory_writable_by_group_or_others(tmp_path: Path, mode: int, caplog) -> None:
    directory = tmp_path / "cache"
    key = planted(directory)
    os.chmod(directory, mode)
    assert_refused(directory, key, caplog)


def test_parent_writable_by_others(tmp_path: Path, caplog) -> None:
    shared = tmp_path / "shared"
    key = planted(shared / "cache")
    os.chmod(shared, 0o777)  # anyone may rename "cache" and put their own in its place
    assert_refused(shared / "cache", key, caplog)


def test_symlink_into_someone_elses_directory(tmp_path: Path, foreign, caplog) -> None:
    theirs = tmp_path / "theirs"
    key = planted(theirs)
    foreign(theirs)
    link = tmp_path / "link"
    link.symlink_to(theirs)
    assert_refused(link, key, caplog)


def test_symlink_to_own_directory_is_fine(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    key = planted(mine)
    (tmp_path / "link").symlink_to(mine)
    with DiskStore(tmp_path / "link") as store:
        assert store.get(key) is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving one file to another user needs root")
def test_database_file_owned_by_another_user(tmp_path: Path, caplog) -> None:
    directory = tmp_path / "cache"
    key = planted(directory)
    os.chown(directory / "cache.db", OTHER_UID, OTHER_UID)
    assert_refused(directory, key, caplog)


def test_cli_exits_2_with_one_error_line(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    planted(directory)
    os.chmod(directory, 0o777)
    for command in (["stats"], ["inspect"], ["clear", "--all", "--yes"]):
        result = CliRunner().invoke(cli, ["--cache-dir", str(directory), *command], env={"PRESCREEN_REDIS_URL": ""})
        assert result.exit_code == 2, (command, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and "written by group or others" in lines[0], lines
        assert "Traceback" not in result.output


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


def test_directories_0700_and_files_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        top = tmp_path / "a"
        with DiskStore(top / "b" / "cache", min_file_size=4000) as store:
            assert store.put(make_entry(1, n_args=14))  # about 8 KB: a .val file
            assert store.put(make_entry(2))
            assert store.get(make_entry(2).key) is not None
            found = modes(top)
    finally:
        os.umask(old)
    assert any(name.endswith(".val") for name in found)
    assert any(name.endswith("cache.db-wal") for name in found)
    for name, mode in found.items():
        is_dir = (top / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), (name, oct(mode))


# -- the filename column -------------------------------------------------------


def aim_row_at(directory: Path, key: str, filename: str) -> None:
    """Rewrite ``key``'s row as a text-mode value stored in ``filename`` (what a hostile writer can do)."""
    con = sqlite3.connect(directory / "cache.db")
    with con:
        con.execute("UPDATE Cache SET mode = ?, filename = ?, value = NULL WHERE key = ?", (MODE_TEXT, filename, key))
    con.close()


@pytest.mark.parametrize("how", ["absolute", "dotdot", "dotdot-in-subdir"])
def test_rows_never_name_a_path_outside_the_cache(tmp_path: Path, how: str, caplog) -> None:
    directory = tmp_path / "cache"
    victim = tmp_path / "victim" / "deep" / "data.txt"
    victim.parent.mkdir(parents=True)
    content = make_entry(1).to_json()
    victim.write_text(content)  # a valid entry even: it must still not be read
    entries = [make_entry(seed) for seed in range(3)]
    with DiskStore(directory) as store:
        for entry in entries:
            assert store.put(entry)
    filename = {
        "absolute": str(victim),
        "dotdot": os.path.relpath(victim, directory),
        "dotdot-in-subdir": "ab/cd/../../" + os.path.relpath(victim, directory),
    }[how]
    aim_row_at(directory, entries[1].key, filename)
    aim_row_at(directory, entries[2].key, filename)
    with caplog.at_level(logging.WARNING, logger="prescreen.store"), DiskStore(directory) as store:
        assert store.get(entries[1].key) is None  # refused, not read
        assert store.put(entries[1])  # replaces the row: diskcache would delete the old file
        assert store.get(entries[1].key) is not None
        assert store.clear_all() == 3  # and clear deletes every row's file
        assert store.get(entries[0].key) is None
    assert victim.read_text() == content
    assert victim.parent.is_dir()  # emptied parent directories are not removed either
    assert any("outside the cache" in m for m in warnings_of(caplog))


# -- symlinks on the way to the directory ----------------------------------------------------


def owned_by(monkeypatch: pytest.MonkeyPatch, path: Path, uid: int) -> None:
    """Make ``os.lstat`` report ``path`` as owned by ``uid`` (the tests may run as root, who owns everything)."""
    real, target = os.lstat, str(path)

    def lstat(p: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real(p, *args, **kwargs)  # type: ignore[arg-type]
        if os.fspath(p) != target:  # type: ignore[arg-type]
            return st
        fields = list(st)  # mode, ino, dev, nlink, uid, gid, size, atime, mtime, ctime
        fields[4] = uid
        return os.stat_result(fields)

    monkeypatch.setattr(os, "lstat", lstat)


def test_symlink_in_the_middle_owned_by_another_user(tmp_path: Path, monkeypatch, caplog) -> None:
    # Before: only the last component was checked for a link; whoever owns "link" could re-point it at a
    # directory of their own holding their database, and a running process would read it.
    key = planted(tmp_path / "real" / "cache")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    owned_by(monkeypatch, link, OTHER_UID)
    assert_refused(link / "cache", key, caplog)


def test_symlink_in_a_links_target_owned_by_another_user(tmp_path: Path, monkeypatch, caplog) -> None:
    key = planted(tmp_path / "real" / "cache")
    theirs = tmp_path / "theirs"
    theirs.symlink_to(tmp_path / "real")
    (tmp_path / "mine").symlink_to("theirs/cache")  # mine is yours; the link it goes through is not
    owned_by(monkeypatch, theirs, OTHER_UID)
    assert_refused(tmp_path / "mine", key, caplog)


def test_links_you_own_on_the_way_are_fine(tmp_path: Path) -> None:
    key = planted(tmp_path / "real" / "cache")
    (tmp_path / "a").symlink_to(tmp_path / "real")
    (tmp_path / "b").symlink_to("a/./../a")
    with DiskStore(tmp_path / "b" / "cache") as store:
        assert store.get(key) is not None and store.refused is None


# -- odd paths: one error line in the CLI, in a real process (a FIFO would hang it) -------------

CLI = "import sys\nfrom prescreen.cli import main\nmain(sys.argv[1:])\n"


def cli_process(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PRESCREEN_", "TORCHINDUCTOR_"))}
    return subprocess.run([sys.executable, "-c", CLI, *args], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("case", ["component-over-255-bytes", "key-file-a-directory", "key-file-a-fifo"])
def test_odd_paths_are_one_error_line(tmp_path: Path, case: str) -> None:
    # Before: a traceback (OSError: File name too long; IsADirectoryError), or a hang on the FIFO's open.
    cache, key_path = tmp_path / "cache", tmp_path / "key"
    if case == "component-over-255-bytes":
        cache = tmp_path / ("d" * 300) / "cache"
        needle = "over the 255-byte limit"
    elif case == "key-file-a-directory":
        key_path.mkdir(mode=0o700)
        needle = "it is a directory, not a regular file"
    else:
        os.mkfifo(key_path, 0o600)
        needle = "it is a FIFO, not a regular file"
    env = {"PRESCREEN_SIGNING_KEY_FILE": str(key_path)} if case.startswith("key") else {}
    for command in (["stats"], ["inspect"]):
        done = cli_process(env, "--cache-dir", str(cache), *command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
        assert done.stdout.strip() == ""


def test_library_names_the_bad_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="is 300 bytes, over the 255-byte limit"):
        DiskStore(tmp_path / ("d" * 300))
    os.mkfifo(tmp_path / "fifo", 0o600)
    monkeypatch.setenv("PRESCREEN_SIGNING_KEY_FILE", str(tmp_path / "fifo"))
    with pytest.raises(ConfigError, match="'.*fifo': it is a FIFO"):  # at once: O_NONBLOCK, never waiting
        DiskStore(tmp_path / "cache")
