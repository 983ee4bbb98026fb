"""Run every lesson in order, each in its own process, and stop at the first failure.

    python lessons/run_all.py        (from the repository root)
    python run_all.py                (from inside lessons/)
    python lessons/run_all.py 03 07  (only the lessons whose numbers are given)

Every file lessons/NN_*.py (two digits, then a name) runs with this same Python, from the
repository root, with the repository's src/ first on PYTHONPATH, so the lessons import this
checkout's tinyflash even if another copy is installed. A lesson passes when it exits with 0;
its asserts are its checks. The exit code is 0 if every lesson passed, else the failing
lesson's exit code (1 if it was killed by a signal).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

LESSONS = Path(__file__).resolve().parent
ROOT = LESSONS.parent


def lesson_files() -> list[Path]:
    """The numbered lessons, in order: 01_..., 02_..., ..."""
    return sorted(LESSONS.glob("[0-9][0-9]_*.py"))


def lesson_env() -> dict:
    """This process's environment with the repository's src/ prepended to PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python lessons/run_all.py", description=__doc__.split("\n")[0])
    parser.add_argument("numbers", nargs="*", metavar="NN", help="run only these lessons (two digits: 01 05); default: all")
    args = parser.parse_args(argv)
    files = [p for p in lesson_files() if not args.numbers or p.name[:2] in args.numbers]
    if not files:
        print(f"no lessons {' '.join(args.numbers)} found in {LESSONS}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    for path in files:
        print(f"\n{'=' * 24} {path.name} {'=' * 24}", flush=True)  # flush: the lesson writes to the same stdout
        t0 = time.perf_counter()
        code = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=lesson_env()).returncode
        seconds = time.perf_counter() - t0
        if code != 0:
            print(f"---- {path.name} FAILED (exit code {code}) after {seconds:.1f} s; stopping here", flush=True)
            return code if code > 0 else 1  # a negative code means killed by a signal
        print(f"---- {path.name} passed in {seconds:.1f} s", flush=True)
    print(f"\nall {len(files)} lessons passed in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
