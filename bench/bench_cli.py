"""Wall time of the CLI's fast paths, as a ratio to ``python -c pass`` measured in the same run.

``--help``, ``inspect``, ``stats``, ``clear``, ``export``, ``import``, ``report`` and argument
errors must not import torch; this prints each command's median wall time over a few runs,
its ratio to a bare interpreter, and whether torch got imported (a wrapper records it at exit).
``python -c "import torch"`` is printed as the cost they avoid.

    python bench/bench_cli.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

WRAPPER = (
    "import atexit, os, sys\n"
    "atexit.register(lambda: open(os.environ['BENCH_MODULES'], 'w').write(str('torch' in sys.modules)))\n"
    "from prescreen.cli import main\n"
    "main(sys.argv[1:])\n"
)


def timed(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, int, bool | None]:
    """Median wall seconds, the last exit status, and whether torch was imported (None: not recorded)."""
    marker = Path(env["BENCH_MODULES"])
    times, code = [], 0
    for _ in range(repeat):
        marker.unlink(missing_ok=True)
        start = time.perf_counter()
        code = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        times.append(time.perf_counter() - start)
    torch = marker.read_text() == "True" if marker.exists() else None
    return statistics.median(times), code, torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from test_cli import PLANS

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        plans, cache, bundle = t / "plans.json", t / "cache", t / "bundle.json"
        plans.write_text(json.dumps(PLANS))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRESCREEN_")}
        env.update({"BENCH_MODULES": str(t / "modules"), "COLUMNS": "120"})
        cli = [sys.executable, "-c", WRAPPER]
        for memory, kind in (("1MiB", "npu"), ("64GiB", "cuda")):
            subprocess.run([*cli, "--cache-dir", str(cache), "warm", "--plans", str(plans), "--device-memory", memory,
                            "--device-kind", kind], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*cli, "--cache-dir", str(cache), "export", str(bundle)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        key = json.loads(bundle.read_text())["entries"][0]["key"][:10]
        c = ["--cache-dir", str(cache)]
        cases: list[tuple[str, list[str]]] = [
            ("prescreen --help", ["--help"]),
            ("prescreen warm --help", ["warm", "--help"]),
            ("inspect (6 entries)", [*c, "inspect"]),
            ("inspect KEY (chart)", [*c, "inspect", key]),
            ("inspect --json", [*c, "inspect", "--json"]),
            ("stats", [*c, "stats"]),
            ("stats --json", [*c, "stats", "--json"]),
            ("report --html", [*c, "report", "--html", str(t / "r.html")]),
            ("export", [*c, "export", str(t / "out.json")]),
            ("import", ["--cache-dir", str(t / "other"), "import", str(bundle)]),
            ("clear --kernel nomatch --yes", [*c, "clear", "--kernel", "nomatch*", "--yes"]),
            ("error: warm --ratio abc", [*c, "warm", "--plans", str(plans), "--device-memory", "1MiB", "--ratio",
                                         "abc"]),
            ("error: warm --points 0", [*c, "warm", "x:y", "--points", "0"]),
            ("error: --device-kind banana", [*c, "warm", "--plans", str(plans), "--device-kind", "banana"]),
            ("error: spec with unknown key", [*c, "warm", "--spec", str(_spec(t))]),
            ("warm --plans (3 plans, decides)", [*c, "warm", "--plans", str(plans), "--device-memory", "2MiB"]),
        ]
        base, _, _ = timed([sys.executable, "-c", "pass"], env, args.repeat)
        torch_cost, _, _ = timed([sys.executable, "-c", "import torch"], env, max(3, args.repeat // 2))
        print(f"python -c pass: {base * 1000:.0f} ms (median of {args.repeat}); the ratios below are to it")
        print(f"python -c 'import torch': {torch_cost * 1000:.0f} ms = {torch_cost / base:.1f}x\n")
        print(f"{'command':34} {'wall ms':>8} {'ratio':>6} {'exit':>4}  torch imported")
        for name, argv in cases:
            wall, code, torch = timed([*cli, *argv], env, args.repeat)
            print(f"{name:34} {wall * 1000:8.0f} {wall / base:5.1f}x {code:4d}  {torch}", flush=True)


def _spec(tmp: Path) -> Path:
    spec = tmp / "bad.toml"
    spec.write_text('target = "x:y"\ndevice-memory = "64GiB"\n')
    return spec


if __name__ == "__main__":
    main()
