"""The README's commands timed on this machine, one CSV row each: the tests' two tiers, the lessons, each lesson alone.

    python benchmarks/cpu_runs.py [--csv figures/data/cpu_runs.csv] [--only tests grid lessons lesson-01 ...]

``tests`` is the first tier (``python -m pytest``), ``grid`` every test that runs without a GPU, on every
core (``python -m pytest --grid``, what CI runs), ``lessons`` ``python lessons/run_all.py``.
Run from the repository root in the environment of ``requirements.txt``, without a GPU (the tests'
kernels then run on numba's simulator, as in CI), on an otherwise idle machine. Each command runs once,
as a user runs it; its wall time, and for the tests pytest's counts of passed, failed and skipped tests
and of the grid's tests it left out, go into a row with the date, the machine, its CPU count, the
versions and the commit. The README's Quickstart quotes the latest row of each command
(``tinyflash.bench.docs.quickstart_costs``). A row replaces the earlier row of the same command. The
tests check that the README quotes this file, so it is written only once no test command is left to run.

Each lesson is also timed alone (``--only lesson-05 lesson-07``), as a learner runs it: the paragraph of
its docstring that says how long it runs is written from that row (``tinyflash.bench.lesson_times``). A
row holds the command's CPU time too (``cpu_seconds``, user and system, of all its processes): where it is
well below the wall time, other work on the machine had the cores.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tinyflash.bench.record import environment  # noqa: E402

# the tests first: they check that the README quotes this file, which must not change while they run
COMMANDS = {"tests": "python -m pytest", "grid": "python -m pytest --grid",
            "lessons": "python lessons/run_all.py"}
# each lesson alone, as a learner runs it (lessons/run_all.py's pattern)
COMMANDS.update({f"lesson-{p.name[:2]}": f"python lessons/{p.name}"
                 for p in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))})
FIELDS = ["date", "machine", "cpus", "python", "numpy", "numba_cuda", "commit", "command", "seconds", "passed",
          "failed", "skipped", "left_out", "exit_code", "cpu_seconds"]


def counts(output: str) -> dict:
    """pytest's closing line ('872 passed, 291 skipped in 551.2s') as numbers, and the tests of the grid it left
    out (its line 'left out: 1,105 tests of the exhaustive grid ...'); zeros where absent."""
    last = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    found = dict.fromkeys(("passed", "failed", "skipped"), 0)
    for n, what in re.findall(r"(\d+) (passed|failed|skipped)", last[-1] if last else ""):
        found[what] = int(n)
    left_out = re.search(r"^left out: ([\d,]+) tests", output, flags=re.M)
    return {**found, "left_out": int(left_out.group(1).replace(",", "")) if left_out else 0}


def run(command: str) -> dict:
    """Run ``command`` (its ``python`` is this interpreter) in the repository root; its row."""
    argv = [sys.executable, *command.split()[1:]]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}  # as a user's shell has it
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the CPU time of the processes waited for so far
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
    blank = dict.fromkeys(("passed", "failed", "skipped", "left_out"), "")
    found = counts(done.stdout) if "pytest" in command else blank
    env_row = environment("cpu")
    return {"date": env_row["date"], "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "numpy": env_row["numpy"], "numba_cuda": env_row["numba_cuda"],
            "commit": env_row["commit"], "command": command, "seconds": f"{seconds:.1f}", **found,
            "exit_code": done.returncode, "cpu_seconds": f"{cpu_seconds:.1f}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=ROOT / "figures" / "data" / "cpu_runs.csv",
                    help="where the rows go (a row replaces the earlier row of its command)")
    ap.add_argument("--only", choices=list(COMMANDS), nargs="+", default=list(COMMANDS), metavar="NAME",
                    help=f"which commands to time, in this order: {', '.join(COMMANDS)} (default: all, the tests "
                    "first)")
    args = ap.parse_args(argv)
    rows = {}
    if args.csv.exists():
        with open(args.csv, newline="") as f:
            rows = {r["command"]: r for r in csv.DictReader(f)}
    failed = False
    for i, name in enumerate(args.only):
        row = run(COMMANDS[name])
        failed |= row["exit_code"] != 0
        rows[row["command"]] = row
        if not any("pytest" in COMMANDS[later] for later in args.only[i + 1:]):  # no test reads it any more: a
            with open(args.csv, "w", newline="") as f:  # run cut short later keeps what it measured
                writer = csv.DictWriter(f, fieldnames=FIELDS)
                writer.writeheader()
                writer.writerows(rows[c] for c in sorted(rows))
        print(f"{row['command']}: {row['seconds']} s, exit code {row['exit_code']}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
