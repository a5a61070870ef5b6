"""What installing prescreen costs ``import torch``: wall time in fresh processes, alternated, one run.

Three variants, each ``python -c "import torch"`` in a new process:

* ``autoload off``: ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, torch loads no
  ``torch.backends`` entry point at all (a lower bound for "prescreen not
  installed": without prescreen torch still scans the entry points);
* ``installed``: prescreen's entry point loaded, ``PRESCREEN`` unset (what
  everyone who did not opt in pays);
* ``PRESCREEN=1``: the guards installed lazily.

It also times the entry point itself in-process (import + call, PRESCREEN unset).
Usage: ``python bench/bench_import.py [--reps 10]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "autoload off": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    "installed": {},
    "PRESCREEN=1": {"PRESCREEN": "1"},
}


def _time(env: dict[str, str], cwd: str) -> float:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PRESCREEN")}
    full.update(env)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], env=full, cwd=cwd, check=True)
    return time.perf_counter() - start


def _entry_point_cost() -> float:
    code = ("import time, os; os.environ.pop('PRESCREEN', None); t = time.perf_counter(); "
            "from _prescreen_autoload import autoload; autoload(); print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as cwd:
        _time({}, cwd)  # warm the page cache
        for _ in range(args.reps):
            for name, env in VARIANTS.items():
                times[name].append(_time(env, cwd))
    base = statistics.median(times["autoload off"])
    print(f"import torch, median of {args.reps} fresh processes each (alternated):")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"  {name:<14} {med * 1000:8.1f} ms   ratio to autoload off {med / base:.3f}")
    ep = statistics.median(_entry_point_cost() for _ in range(5))
    print(f"prescreen's entry point alone (import + call, PRESCREEN unset): {ep * 1e6:.0f} us")


if __name__ == "__main__":
    main()
