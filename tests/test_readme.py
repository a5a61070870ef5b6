"""Every fenced block of the README and of docs/*.md runs as written, or says what it is.

An HTML comment on the line before a fence says what the block is; without one a block is run
by its language:

- ``python``: run in a fresh interpreter (``python -P``, so the installed package is imported);
- ``bash``: run with ``bash -e``, the venv's console scripts first on ``PATH``;
- ``toml``: a warm spec, loaded as ``prescreen warm --spec`` loads it;
- ``<!-- readme: output of the block above -->``: what the block above prints on stdout, compared
  exactly; ``(keys, times and cache counts vary)`` after it masks 8-hex-digit keys, ``time 1.2s`` and the
  counts of families torch's caches answered (warm or not, outside the test's control);
- ``<!-- readme: transcript -->``: each ``$ command`` line is run with bash, and the lines after it,
  up to the next ``$``, are what it prints (stdout and stderr), compared exactly;
- ``<!-- readme: output -->``: shown output (a log line, an excerpt), not run;
- ``<!-- readme: not run: WHY -->``: a command the suite must not run, and why.

Every run uses the repository as its working directory, a scratch store, and 80 columns. The docs pages
follow the same rules, so moving a block from the README to a page keeps it checked.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
ROOT = README.parent
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FENCE = re.compile(r"^```(\w*)$")
MARK = re.compile(r"^<!-- readme: (.+?) -->$")
KINDS = ("output of the block above", "transcript", "output", "not run")


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    page: str  # README.md or docs/NAME.md
    lang: str
    mark: str  # the comment before it, or ""
    body: str

    @property
    def kind(self) -> str:
        if not self.mark:
            return self.lang
        return next((k for k in KINDS if self.mark.startswith(k)), f"unknown mark {self.mark!r}")

    @property
    def id(self) -> str:
        return f"{self.page}:line{self.line}-{self.kind.replace(' ', '-')}"


def blocks(text: str | None = None, page: Path = README) -> list[Block]:
    lines = (page.read_text() if text is None else text).splitlines()
    name = page.relative_to(ROOT).as_posix()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(before)
        found.append(Block(i + 1, name, fence.group(1), mark.group(1) if mark else "",
                           "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page=page)]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRESCREEN") or k == "PRESCREEN_TEST_INSTALLED"}
    env.update(PRESCREEN_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="80",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def _run(block: Block, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-P", "-c", block.body] if block.lang == "python" else ["bash", "-e", "-c", block.body]
    done = subprocess.run(argv, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{block.page} block at line {block.line} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def _normal(text: str, vary: bool) -> str:
    text = ANSI.sub("", text)
    if vary:
        text = re.sub(r"\b[0-9a-f]{8}\b", "KEY", text)
        text = re.sub(r"time [0-9.]+s", "time Ns", text)
        text = re.sub(r"\b\d+ (families decided|cache answered)", r"N \1", text)  # Inductor's caches warm or not
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _expected_output(block: Block) -> Block | None:
    after = ALL[ALL.index(block) + 1:]
    follows = after and after[0].page == block.page and after[0].kind == "output of the block above"
    return after[0] if follows else None


def test_every_block_is_run_or_marked() -> None:
    kinds = {b.id: b.kind for b in ALL}
    assert len(ALL) >= 10 and sum(b.page == "README.md" for b in ALL) >= 5, kinds
    unknown = {i: k for i, k in kinds.items() if k not in (*KINDS, "python", "bash", "toml")}
    assert not unknown, f"each README block needs a runnable language or a mark (see this module's docstring): {unknown}"
    for b in ALL:
        if b.kind == "output of the block above":
            before = ALL[ALL.index(b) - 1]
            assert before.page == b.page and before.kind in ("python", "bash"), \
                f"{b.page} line {b.line}: the block above (line {before.line}) is not run"
        if b.kind == "not run":
            assert re.match(r"not run: \S", b.mark), f"{b.page} line {b.line}: say why it is not run"


def test_the_parser_sees_marks_and_languages() -> None:
    text = "x\n\n<!-- readme: output -->\n```\nA\n```\n\n```bash\necho hi\n```\n"
    assert [(b.lang, b.kind, b.body) for b in blocks(text)] == [("", "output", "A\n"), ("bash", "bash", "echo hi\n")]


def _slow(b: Block) -> bool:
    return "import torch" in b.body or "prescreen warm examples" in b.body


RUN = [b for b in ALL if b.kind in ("python", "bash")]


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if _slow(b) else [])
                                   for b in RUN])
def test_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    done = _run(block, tmp_path)
    expected = _expected_output(block)
    if expected is not None:
        vary = "vary" in expected.mark
        assert _normal(done.stdout, vary) == _normal(expected.body, vary)
    if "prescreen.installed(" in block.body:  # the "Inside torch.compile" block guarded the MLP's two GEMMs
        store = subprocess.run([sys.executable, "-P", "-m", "prescreen.cli", "inspect", "--json"], cwd=ROOT,
                               env=_env(tmp_path), capture_output=True, text=True, timeout=120)
        assert store.returncode == 0, store.stderr
        assert store.stdout.count('"select:') >= 2, store.stdout[:2000]


TRANSCRIPTS = [b for b in ALL if b.kind == "transcript"]


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if _slow(b) else [])
                                   for b in TRANSCRIPTS])
def test_transcript_prints_what_the_readme_shows(block: Block, tmp_path: Path) -> None:
    steps: list[tuple[str, list[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"{block.page} line {block.line}: a transcript starts with a '$ command' line"
            steps[-1][1].append(line)
    for command, shown in steps:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                              timeout=600)
        vary = "vary" in block.mark
        assert _normal(done.stdout + done.stderr, vary) == _normal("\n".join(shown), vary), command


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in ALL if b.kind == "toml"])
def test_toml_block_is_a_valid_warm_spec(block: Block, tmp_path: Path) -> None:
    from prescreen.target import load_spec

    spec = tmp_path / "warm.toml"
    spec.write_text(block.body)
    loaded = load_spec(spec)
    assert loaded["target"] and loaded["shapes"]


def test_the_demo_falls_back_where_the_readme_says() -> None:
    """``make demo`` warms what the README's warm example warms, and that example shows a fallback and a tune."""
    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^DEMO_WARM := (.*?)(?<!\\)\n", makefile, re.S | re.M)
    assert demo, "no DEMO_WARM in the Makefile"
    warm = next(b for b in RUN if b.page == "README.md" and b.lang == "bash" and "prescreen warm examples" in b.body)
    assert " ".join(demo.group(1).replace("\\\n", " ").split()) == " ".join(
        warm.body.replace("\\\n", " ").split()).removeprefix("prescreen ")
    shown = _expected_output(warm)
    assert shown is not None
    summary = " ".join(shown.body.split())
    fell_back = re.search(r"(\d+) tuned, (\d+) fell back", summary)
    assert fell_back and int(fell_back.group(1)) >= 1 and int(fell_back.group(2)) >= 1, summary


def test_every_prescreen_env_var_in_the_code_is_documented() -> None:
    names = set()
    for path in list((ROOT / "prescreen").rglob("*.py")) + list((ROOT / "hooks").rglob("*.py")):
        names |= set(re.findall(r'"(PRESCREEN[A-Z_]*|INDUCTOR_ASCEND_[A-Z_]+)"', path.read_text()))
    assert names, "no env var names found: the pattern is wrong"
    table = CONFIGURATION.read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    missing = sorted(n for n in names if f"`{n}`" not in table)
    assert not missing, f"undocumented env vars: {missing}"


def test_every_docs_page_is_linked_once_from_the_readme() -> None:
    """The README stays short by linking each page of depth once; a page nobody links is lost."""
    text = README.read_text()
    counts = {page.name: text.count(f"](docs/{page.name})") for page in PAGES[1:]}
    assert counts and all(n == 1 for n in counts.values()), counts


def test_every_relative_link_points_to_a_file() -> None:
    """Pages moved into docs/ link to each other and to bench/; a renamed page must not leave a dead link."""
    dead = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                dead.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not dead, dead
