"""The README's worked example runs and prints what the README says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _block_after(heading: str, lang: str, text: str) -> str:
    section = text[text.index(heading):]
    match = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert match, f"no ```{lang} block after {heading!r}"
    return match.group(1)


def test_worked_example_output_matches_readme() -> None:
    text = README.read_text()
    code = _block_after("## Worked example", "python", text)
    expected = _block_after("Output:", "", text[text.index("## Worked example"):])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == expected.strip()


def test_every_prescreen_env_var_in_the_code_is_documented() -> None:
    root = README.parent
    names = set()
    for path in list((root / "prescreen").rglob("*.py")) + list((root / "hooks").rglob("*.py")):
        names |= set(re.findall(r'"(PRESCREEN[A-Z_]*|INDUCTOR_ASCEND_[A-Z_]+)"', path.read_text()))
    assert names, "no env var names found: the pattern is wrong"
    table = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    missing = sorted(n for n in names if f"`{n}`" not in table)
    assert not missing, f"undocumented env vars: {missing}"
