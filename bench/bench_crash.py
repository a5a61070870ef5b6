"""SIGKILL soak of the disk store: writers, recovery, clear and import, killed at random moments.

Run: ``python bench/bench_crash.py [--kills 50] [--scenarios live-recovery,...]``. Each scenario kills
child processes with SIGKILL at random times (``--kills`` per scenario) while they
write, recover a corrupt database, delete/clear, or import a bundle; in
``live-recovery`` a writer keeps writing while another process (this one)
finds a damaged database and recovers it, and is killed some time after. In
``oom-locked`` (``--kills`` / 5 rounds) a process records observed OOMs while
another holds the database's write lock for 0.5 to 3 s and two writers write;
in ``oom-writers`` 8 processes look up overlapping windows of 20,000 plans in
orders of their own (each started again 50 plans further on), record an
observed OOM for every fifth, and are killed at random. A child logs a key only
after ``put`` returned True (acknowledged), a fact only after
``record_observed_oom`` returned with it written. Afterwards the directory is
opened normally and the script prints, per scenario:

- acknowledged: puts that returned True before the kill (facts: the next column);
- facts: observed OOMs acknowledged as written (``oom-lost``: those missing afterwards, or not an
  observed OOM any more, must be 0);
- present: entries the store holds afterwards;
- lost: acknowledged entries missing afterwards (must be 0);
- wrong: entries whose stored decision differs from a fresh one (must be 0);
- orphaned: ``.val`` files no row refers to, left after the reopen;
- phantom: rows whose ``.val`` file was gone right after the kills (they read as misses and are cleaned);
- mid-op: kills that landed before the child finished its operation.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from prescreen import service
from prescreen.budget import Budget
from prescreen.decision import decide, is_observed_oom
from prescreen.key import build_key
from prescreen.plan import KernelPlan
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore, export_bundle
from prescreen.store.entry import Entry

BUDGET = Budget("npu", 16 * 2**30, 0.25)
MIN_FILE = 4000  # entries over this many bytes are .val files, the rest rows in cache.db


def plan(seed: int) -> KernelPlan:
    """Even seeds: a small plan (inline row); odd seeds: 30 args (about 12 KB of JSON, a .val file)."""
    x, r, s = {"axis_name": "x0"}, {"axis_name": "r0"}, {"axis_name": "s0"}
    args: list[dict[str, object]] = [
        {
            "kind": "tensor", "source": "buffer", "name": f"in_ptr{i}",
            "dtype": ("torch.float16", "torch.float32")[i % 2], "device": "npu:0",
            "size_exprs": [x, r, s], "stride_exprs": [{"mul": [r, s]}, s, {"const": 1}],
        }
        for i in range(30 if seed % 2 else 2)
    ]
    args.append({"kind": "size", "source": "axis_expr", "name": "xnumel", "expr": {"mul": [x, 2]}})
    return KernelPlan.from_payload({
        "kernel_name": f"triton_poi_fused_{seed}",
        "group_features": [
            {"name": "x", "source": "primary_axis", "axis_names": ["x0"], "buckets": [64, 128, 256]},
            {"name": "r", "source": "axis", "axis_names": ["r0"], "buckets": [64, 128, 256]},
        ],
        "axis_names": ["x0", "r0", "s0"],
        "axis_static_values": [["s0", 1 + seed]],
        "ordered_arg_specs": args,
        "mutated_arg_names": ["in_ptr0"],
    })


def entry(seed: int) -> Entry:
    outcome = lookup_or_decide(plan(seed), BUDGET, None)
    assert outcome.entry is not None
    return outcome.entry


# -- children ---------------------------------------------------------------------------------


class _AckStore(DiskStore):
    """A disk store that logs each acknowledged put (``seed key``) after ``put_all`` (which ``put`` and the service
    write through) returned True for it."""

    log_fd = -1
    seed_of: dict[str, int] = {}

    def put_all(self, entries: Sequence[Entry]) -> list[bool]:
        stored = super().put_all(entries)
        for e, ok in zip(entries, stored):
            if ok:
                os.write(self.log_fd, f"{self.seed_of.get(e.key, -1)} {e.key}\n".encode())
        return stored


def child(kind: str, directory: str, log: str, start: int, extra: str) -> None:
    """Everything slow (imports, decisions) happens before "ready"; the store is opened after it."""
    _AckStore.log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    entry(0)  # the first decision imports what the estimator needs (torch): seconds, not part of the soak
    count = int(extra or 0)
    known = {seed: entry(seed) for seed in range(count)} if kind in ("clear", "import") else {}
    _AckStore.seed_of = {e.key: seed for seed, e in known.items()}
    fresh = [entry(start + i) for i in range(count)] if kind == "clear" and start >= 0 else []
    _AckStore.seed_of.update({e.key: start + i for i, e in enumerate(fresh)})
    logging.getLogger("prescreen.store").setLevel(logging.ERROR)  # recoveries are expected here; the parent checks
    print("ready", flush=True)
    store = _AckStore(directory, min_file_size=MIN_FILE)  # a "recover" child recovers here
    if kind == "writer":
        for seed in range(start, start + 100_000):
            e = entry(seed)
            _AckStore.seed_of[e.key] = seed
            store.put(e)
    elif kind == "clear":
        if start < 0:
            store.clear_all()
        else:
            for new, seed in zip(fresh, range(count)):
                store.put(new)
                store.delete([known[seed].key])
    elif kind == "import":
        from prescreen.store import import_bundle

        import_bundle(store, log + ".bundle")
    elif kind in ("facts", "oom"):
        record_facts(store, kind, log, start, count)
    store.close()
    print("done", flush=True)


FACT_BASE = 3_000_000  # the plans of the observed-OOM scenarios
OOM_WINDOW = 20_000  # the plans one ``oom-writers`` process may look up (it is killed first): from 50 * its start


def record_facts(store: DiskStore, kind: str, log: str, start: int, count: int) -> None:
    """``facts``: the plans ``FACT_BASE + 50 * start + [0, count)`` in an order of ``start``'s (the next
    processes' windows overlap this one), each looked up, and an observed OOM recorded for every fifth (as a
    guarded step whose benchmark ran out); a fact is logged once written (one kept in the process is not: a
    SIGKILL loses it). ``oom``: a fact for each of ``count`` plans from ``start``, all logged (the process
    exits normally: one it kept is written at exit)."""
    facts = os.open(log + ".facts", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    first = FACT_BASE + 50 * start if kind == "facts" else start
    seeds = list(range(first, first + count))
    if kind == "facts":
        random.Random(start).shuffle(seeds)
    for seed in seeds:
        p = plan(seed)
        _AckStore.seed_of[build_key(p, BUDGET)[0]] = seed
        if kind == "facts":
            lookup_or_decide(p, BUDGET, store)
            if seed % 5:
                continue
        outcome = service.record_observed_oom(p, BUDGET, store, requested_bytes=1, free_bytes=2, error="bench")
        if kind == "oom" or outcome.key not in service._held:
            os.write(facts, f"{seed} {outcome.key}\n".encode())


# -- the parent ---------------------------------------------------------------------------------


def spawn(kind: str, directory: Path, log: Path, start: int = 0, extra: str = "") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-P", __file__, "--child", kind, str(directory), str(log), str(start), extra],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "ready", f"child said {line!r}"
    return proc


def duration(kind: str, directory: Path, log: Path, start: int = 0, extra: str = "") -> float:
    """Seconds from "ready" to "done" of one child left to finish (the window the kills are drawn from)."""
    proc = spawn(kind, directory, log, start, extra)
    began = time.monotonic()
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    took = time.monotonic() - began
    proc.wait()
    assert line == "done", f"child said {line!r}"
    return max(took, 0.01)


def kill(proc: subprocess.Popen[str]) -> bool:
    """SIGKILL ``proc``; True when it had not finished its operation."""
    proc.send_signal(signal.SIGKILL)
    assert proc.stdout is not None
    rest = proc.stdout.read()
    proc.wait()
    return "done" not in rest


def acked(log: Path) -> list[int]:
    """The seeds of the acknowledged puts a child logged."""
    if not log.exists():
        return []
    seeds = [int(line.split()[0]) for line in log.read_text().splitlines() if line.strip()]
    assert all(seed >= 0 for seed in seeds), "a put of an unknown entry was acknowledged"
    return seeds


def file_rows(directory: Path) -> tuple[set[str], int]:
    """(value files rows refer to, rows whose value file is gone), read straight from cache.db."""
    if not (directory / "cache.db").is_file():  # killed before the store made its directory
        return set(), 0
    con = sqlite3.connect(directory / "cache.db")
    try:
        names = {f for (f,) in con.execute("SELECT filename FROM Cache WHERE filename IS NOT NULL")}
    except sqlite3.OperationalError:  # killed after cache.db was created, before diskcache made its tables
        names = set()
    finally:
        con.close()
    return names, sum(not (directory / n).exists() for n in names)


def orphans(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    names, _ = file_rows(directory)
    return sum(str(p.relative_to(directory)) not in names for p in directory.glob("[0-9a-f][0-9a-f]/*/*.val"))


def check(directory: Path, seeds: list[int], expected: set[int] | None = None) -> dict[str, int]:
    """Reopen and check: every acknowledged seed present and right; every present entry right."""
    _, phantom = file_rows(directory)
    out = {"acknowledged": len(set(seeds)), "lost": 0, "wrong": 0, "phantom": phantom}
    with DiskStore(directory, min_file_size=MIN_FILE) as store:
        for seed in set(seeds) | (expected or set()):
            got = store.get(entry(seed).key)
            if got is None:
                out["lost"] += 1
            elif got.decision != decide(plan(seed), BUDGET):
                out["wrong"] += 1
        present = list(store.entries())
        out["present"] = len(present)
        out["wrong"] += sum(e.decision != decide(KernelPlan.from_payload(e.plan), BUDGET) for e in present)
        if len(store.keys()) != len(present):
            out["wrong"] += 1  # a counted entry that does not read back
    out["orphaned"] = orphans(directory)
    return out


def add(total: dict[str, int], part: dict[str, int]) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0) + v


def check_facts(directory: Path, log: Path, is_fact: Callable[[int], bool]) -> dict[str, int]:
    """Reopen and check: every acknowledged put present and right (or, for a plan ``is_fact`` says may be one,
    an observed OOM); every acknowledged fact present as an observed OOM; every present entry one of those."""
    puts, facts = set(acked(log)), set(acked(Path(str(log) + ".facts")))
    _, phantom = file_rows(directory)
    out = {"acknowledged": len(puts), "facts": len(facts), "lost": 0, "wrong": 0, "oom-lost": 0, "phantom": phantom}

    def right(seed: int, decision: object) -> bool:
        return decision == decide(plan(seed), BUDGET) or (is_fact(seed) and is_observed_oom(decision))  # type: ignore[arg-type]

    with DiskStore(directory, min_file_size=MIN_FILE) as store:
        for seed in puts:
            got = store.get(entry(seed).key)
            if got is None:
                out["lost"] += 1
            elif not right(seed, got.decision):
                out["wrong"] += 1
        for seed in facts:
            got = store.get(entry(seed).key)
            out["oom-lost"] += got is None or not is_observed_oom(got.decision)
        present = list(store.entries())
        out["present"] = len(present)
        out["wrong"] += sum(not right(int(e.kernel.rsplit("_", 1)[1]), e.decision) for e in present)
    out["orphaned"] = orphans(directory)
    return out


HOLD_LOCK = ("import sqlite3, sys, time\n"
             "con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)\n"
             "con.execute('BEGIN EXCLUSIVE')\n"
             "print('locked', flush=True)\n"
             "time.sleep(float(sys.argv[2]))\n"
             "con.execute('ROLLBACK')\n")


def oom_locked(root: Path, kills: int, rng: random.Random) -> dict[str, int]:
    """Observed OOMs recorded while another connection holds the write lock (0.5 to 3 s) and two writers write.

    Each round stores the computed decision under the 20 facts' keys first (the facts must replace them),
    starts the writers and the lock holder, then a process that records the 20 facts and exits normally.
    """
    total: dict[str, int] = {"kills": 0, "mid-op": 0}
    for k in range(max(1, kills // 5)):
        directory, log = root / f"locked-{k}", root / f"locked-{k}.log"
        first = FACT_BASE + 100_000 * (k + 1)
        seeds = set(range(first, first + 20))
        with DiskStore(directory, min_file_size=MIN_FILE) as store:
            for seed in seeds:
                lookup_or_decide(plan(seed), BUDGET, store)
        procs = [spawn("writer", directory, log, start=4_000_000 + 100_000 * w + 1000 * k) for w in range(2)]
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(directory / "cache.db"),
                                   f"{rng.uniform(0.5, 3.0):.2f}"], stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        recorder = spawn("oom", directory, log, start=first, extra="20")
        assert recorder.stdout is not None
        line = recorder.stdout.readline().strip()
        recorder.wait()
        assert line == "done", f"the recording child said {line!r}"
        holder.wait()
        for proc in procs:
            total["kills"] += 1
            total["mid-op"] += kill(proc)
        add(total, check_facts(directory, log, seeds.__contains__))
        shutil.rmtree(directory)
    return total


def oom_writers(root: Path, kills: int, rng: random.Random) -> dict[str, int]:
    """8 processes on overlapping windows of plans, each looked up and every fifth recorded as an observed OOM
    (by whichever process gets there: the others hit it or find it there); killed at random and started again
    on a window further on, so a process is mostly killed while it still decides and records."""
    directory, log = root / "oom-writers", root / "oom-writers.log"
    procs = [spawn("facts", directory, log, start=w, extra=str(OOM_WINDOW)) for w in range(8)]
    mid = 0
    for k in range(kills):
        time.sleep(rng.uniform(0.05, 1.0))
        w = k % 8
        mid += kill(procs[w])
        procs[w] = spawn("facts", directory, log, start=8 * (k + 1) + w, extra=str(OOM_WINDOW))
    for proc in procs:
        mid += kill(proc)
    out = check_facts(directory, log, lambda seed: seed % 5 == 0)
    return {"kills": kills + 8, "mid-op": mid, **out}


def writers(root: Path, kills: int, rng: random.Random) -> dict[str, int]:
    directory, log = root / "writers", root / "writers.log"
    procs = [spawn("writer", directory, log, start=1_000_000 * (w + 1)) for w in range(2)]
    mid = 0
    for k in range(kills):
        time.sleep(rng.uniform(0.05, 1.0))
        w = k % 2
        mid += kill(procs[w])
        procs[w] = spawn("writer", directory, log, start=1_000_000 * (w + 1) + 1000 * (k + 1))
    for proc in procs:
        kill(proc)
    out = check(directory, acked(log))
    return {"kills": kills, "mid-op": mid, **out}


def recovery(root: Path, kills: int, rng: random.Random) -> dict[str, int]:
    template = root / "recovery-template"
    seeds = list(range(100))  # 50 odd seeds: .val files, restorable after the database is destroyed
    with DiskStore(template, min_file_size=MIN_FILE) as store:
        for seed in seeds:
            assert store.put(entry(seed))
    (template / "cache.db").write_bytes(os.urandom(16384))
    for name in ("cache.db-wal", "cache.db-shm"):
        (template / name).unlink(missing_ok=True)
    restorable = {s for s in seeds if s % 2}
    probe = root / "recovery-probe"
    shutil.copytree(template, probe)
    kill_window = duration("recover", probe, root / "probe.log")
    total: dict[str, int] = {"kills": kills, "mid-op": 0}
    for k in range(kills):
        directory = root / f"recovery-{k}"
        shutil.copytree(template, directory)
        proc = spawn("recover", directory, root / f"recovery-{k}.log")
        time.sleep(rng.uniform(0, kill_window))
        total["mid-op"] += kill(proc)
        result = check(directory, [], expected=restorable)
        result["acknowledged"] = len(restorable)  # every valid .val entry must come back
        add(total, result)
        shutil.rmtree(directory)
    return total


def _table_leaf_holding(data: bytes, marker: bytes, page_size: int) -> int:
    """The offset of the table leaf page (type 0x0D) whose bytes hold ``marker`` (a row's own text)."""
    at = -1
    while True:
        at = data.index(marker, at + 1)
        base = at // page_size * page_size
        if base > 0 and data[base] == 0x0D:
            return base


def damage_in_place(db: Path, garble: bytes, destroy: bytes) -> None:
    """Garble the rowid of the row holding ``garble`` (to the largest its varint holds, as a flipped bit can:
    "the next rowid" after the one before it then names it, past every later row) and fill the page holding
    ``destroy`` with random bytes (what a read finds: a recovery). Only those bytes are written, in place: a
    live writer's checkpoints write the same file."""
    data = db.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    base = _table_leaf_holding(data, garble, page_size)
    at = data.index(garble, base)
    cells = int.from_bytes(data[base + 3 : base + 5], "big")
    starts = [base + int.from_bytes(data[base + 8 + 2 * i : base + 10 + 2 * i], "big") for i in range(cells)]
    pos = max(start for start in starts if start <= at)
    while data[pos] & 0x80:  # the cell's payload size
        pos += 1
    first = pos = pos + 1
    while data[pos] & 0x80:  # its rowid
        pos += 1
    assert pos > first, "the garbled row's rowid must take two bytes or more (a rowid of 128 or more)"
    destroyed = _table_leaf_holding(data, destroy, page_size)
    with open(db, "r+b") as out:
        out.seek(first)
        out.write(b"\xff" * (pos - first) + b"\x7f")
        out.seek(destroyed)
        out.write(os.urandom(page_size))


def live_recovery(root: Path, kills: int, rng: random.Random) -> dict[str, int]:
    """A writer writes while this process finds a damaged page and recovers; the writer goes on, is killed.

    300 small entries are stored first (rows 1-300, in ``cache.db``); each round damages two of them: one
    row's rowid garbled (before every row readable by rowid was salvaged, this lost every row after it: all
    the writer's), one page destroyed. Those two are the only entries a round may lose, and none of the
    writer's acknowledged ones.
    """
    template = root / "live-template"
    prefilled = list(range(0, 600, 2))  # even seeds: rows inline in cache.db
    with DiskStore(template, min_file_size=MIN_FILE) as store:
        for seed in prefilled:
            assert store.put(entry(seed))
    marker = {seed: f"triton_poi_fused_{seed}\"".encode() for seed in prefilled}
    logging.getLogger("prescreen.store").setLevel(logging.ERROR)  # the recoveries here are expected
    total: dict[str, int] = {"kills": kills, "mid-op": 0, "no-recovery": 0, "prefilled-lost": 0}
    for k in range(kills):
        directory, log = root / f"live-{k}", root / f"live-{k}.log"
        shutil.copytree(template, directory)
        proc = spawn("writer", directory, log, start=1_000_000)
        time.sleep(rng.uniform(0.3, 1.0))  # the writer writing
        damage_in_place(directory / "cache.db", garble=marker[prefilled[150]], destroy=marker[prefilled[60]])
        with DiskStore(directory, min_file_size=MIN_FILE) as store:  # finds the destroyed page: recovers
            for seed in prefilled:
                store.get(entry(seed).key)
            total["no-recovery"] += store.recovered is None
        time.sleep(rng.uniform(0.2, 1.0))  # the writer goes on in the fresh database
        total["mid-op"] += kill(proc)
        add(total, check(directory, acked(log)))
        with DiskStore(directory, min_file_size=MIN_FILE) as store:
            present = sum(store.get(entry(seed).key) is not None for seed in prefilled)
        total["prefilled-lost"] += len(prefilled) - 2 - present
        shutil.rmtree(directory)
    return total


def clear(root: Path, kills: int, rng: random.Random) -> dict[str, int]:
    template = root / "clear-template"
    with DiskStore(template, min_file_size=MIN_FILE) as store:
        for seed in range(40):
            assert store.put(entry(seed))
    windows = []
    for everything in (False, True):
        shutil.copytree(template, root / "clear-probe")
        windows.append(duration("clear", root / "clear-probe", root / "clear-probe.log", -1 if everything else 400_000, "40"))
        shutil.rmtree(root / "clear-probe")
    total: dict[str, int] = {"kills": kills, "mid-op": 0}
    for k in range(kills):
        directory, log = root / f"clear-{k}", root / f"clear-{k}.log"
        shutil.copytree(template, directory)
        everything = k % 2 == 1  # odd rounds: clear_all; even rounds: put a new entry, delete an old one
        proc = spawn("clear", directory, log, start=-1 if everything else 500_000 + 100 * k, extra="40")
        time.sleep(rng.uniform(0.0, windows[everything]))
        total["mid-op"] += kill(proc)
        add(total, check(directory, acked(log)))
        with DiskStore(directory, min_file_size=MIN_FILE) as store:  # and clear always empties
            store.clear_all()
            total["not-emptied"] = total.get("not-emptied", 0) + len(store.keys()) + orphans(directory)
        shutil.rmtree(directory)
    return total


def import_(root: Path, kills: int, rng: random.Random) -> dict[str, int]:
    source = root / "import-source"
    count = 60
    with DiskStore(source, min_file_size=MIN_FILE) as store:
        for seed in range(count):
            assert store.put(entry(seed))
        bundle_text_path = root / "bundle.json"
        export_bundle(store, bundle_text_path)
    shutil.copy(bundle_text_path, str(root / "import-probe.log") + ".bundle")
    window = duration("import", root / "import-probe", root / "import-probe.log", extra=str(count))
    total: dict[str, int] = {"kills": kills, "mid-op": 0}
    for k in range(kills):
        directory, log = root / f"import-{k}", root / f"import-{k}.log"
        shutil.copy(bundle_text_path, str(log) + ".bundle")
        proc = spawn("import", directory, log, extra=str(count))
        time.sleep(rng.uniform(0.0, window))
        total["mid-op"] += kill(proc)
        add(total, check(directory, acked(log)))
        from prescreen.store import import_bundle

        with DiskStore(directory, min_file_size=MIN_FILE) as store:  # finishing the import leaves all of it
            import_bundle(store, bundle_text_path)
            total["incomplete-after-reimport"] = total.get("incomplete-after-reimport", 0) + count - len(store.keys())
        shutil.rmtree(directory)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLs per scenario (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", default="", help="comma-separated names to run (default: all)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, directory, log, start, extra = args.child
        child(kind, directory, log, int(start), extra)
        return
    rng = random.Random(args.seed)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.kills} SIGKILLs per scenario")
    columns = ["kills", "mid-op", "acknowledged", "facts", "present", "lost", "wrong", "orphaned", "phantom"]
    print(f"{'scenario':<14}" + "".join(f"{c:>14}" for c in columns) + "  other")
    failed = False
    with tempfile.TemporaryDirectory(prefix="prescreen-crash-") as tmp:
        root = Path(tmp)
        scenarios = (("writers", writers), ("recovery", recovery), ("live-recovery", live_recovery),
                     ("clear", clear), ("import", import_), ("oom-locked", oom_locked), ("oom-writers", oom_writers))
        chosen = {name for name in args.scenarios.split(",") if name}
        unknown = chosen - {name for name, _ in scenarios}
        if unknown:
            parser.error(f"unknown scenarios {sorted(unknown)} (one of {', '.join(n for n, _ in scenarios)})")
        for name, scenario in scenarios:
            if chosen and name not in chosen:
                continue
            started = time.monotonic()
            result = scenario(root, args.kills, rng)
            other = {k: v for k, v in result.items() if k not in columns}
            print(f"{name:<14}" + "".join(f"{result.get(c, 0):>14}" for c in columns)
                  + f"  {other} ({time.monotonic() - started:.0f} s)", flush=True)
            failed |= result.get("lost", 0) > 0 or result.get("wrong", 0) > 0 or any(other.values())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
