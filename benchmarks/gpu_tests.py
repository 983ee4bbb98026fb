"""The GPU tests in parallel, and a CSV of their results: one row per test file and run.

    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv --smoke       # the GPU smoke tier: every entry point and
                                                                        # kernel version once
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv               # the whole GPU suite in one call
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv --deadline 420 --state S.json   # in calls of at most
                                                                        # 420 s (+ 30 s), each taking up the tests
                                                                        # the calls before did not end; repeat
                                                                        # until it prints "nothing left"
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv tests/a.py tests/b.py::test_c   # these tests
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv --plan        # how many tests, and the record's estimate

The GPU suite is :data:`FILES`, every test in them (``--grid``: the exhaustive grid included). It runs as one
pytest with ``--processes`` workers (pytest-xdist, ``--dist worksteal``): most of a GPU test's time is numba
compiling kernels and NumPy computing float64 references, both on the CPU, one core per worker. Each worker starts
with a run of consecutive tests (a test function's cases, which share compiled kernels), and a worker that runs out
takes half of a busy worker's remaining tests, so the run ends when its work does.

A lent GPU runs one command for at most 10 minutes, and the suite takes longer. ``--deadline S`` interrupts the
run after S seconds (SIGINT to pytest and its workers: each ends the test it is in), and the rows hold the tests
that ended. ``--state FILE`` keeps, for one commit, the node ids of the tests that ended (passed, failed or
skipped); the next call with the same state runs only the others, and adds its rows to the CSV's. A state from
another commit is started over. The tests cut at a deadline run again in the next call: one test a worker.

The run writes a JUnit XML report and a log (gpu_tests_<tag>.log, beside the CSV, or in ``--log-dir``); from the
report, one row per test file: the device, the date, the versions and the commit
(``tinyflash.bench.record.environment``), the file, its tests, how many passed, failed, were skipped or gave
errors, and the seconds its tests took (summed over the workers). Without ``--state`` the CSV keeps the rows of
files this run does not run. A run that stopped without reporting a failing test (a file not found, a crash)
gives each of its files that ran no test one error. Prints a line per row, a line per test that failed or gave an
error, and the totals; the exit code is 0 when every test ran and nothing failed or gave an error.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the whole suite's runs on each GPU (gpu_tests_h200.csv, gpu_tests_h100.csv, ...): what balances the split
RECORDS = sorted((ROOT / "figures" / "data").glob("gpu_tests_*.csv"))
FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "commit", "file", "tests", "passed", "failed",
          "skipped", "errors", "seconds"]
# the GPU suite: every test file with a test marked gpu or simulator (tests/test_commands.py checks it), and those
# that check the GPU's instructions, its launches and the kernel cache where a GPU runs them
FILES = ["tests/test_cuda_gpu.py", "tests/test_cuda_kernel.py", "tests/test_nonfinite.py",
         "tests/test_kernel_versions.py",
         "tests/test_tensor_core_gpu.py", "tests/test_tensor_core_ptx.py", "tests/test_tensor_core.py",
         "tests/test_tensor_core_head_dims.py", "tests/test_docs.py", "tests/test_backward_gpu.py",
         "tests/test_backward_kernel.py", "tests/test_gqa.py", "tests/test_bfloat16_cuda_cores.py",
         "tests/test_decode_kernels.py", "tests/test_decode_tensor_cores.py", "tests/test_decode_plan.py",
         "tests/test_gpu_runtime.py", "tests/test_commands.py", "tests/test_driver_launch.py", "tests/test_bench.py",
         "tests/test_backward_tensor_cores_gpu.py", "tests/test_backward_tensor_cores.py", "tests/test_torch_gpu.py",
         "tests/test_decode_torch_gpu.py", "tests/test_kernel_cache.py", "tests/test_hopper_gpu.py",
         "tests/test_hopper.py", "tests/test_wgmma_ptx.py", "tests/test_tma_ptx.py", "tests/test_backward_wgmma_gpu.py",
         "tests/test_backward_wgmma.py", "tests/test_backward_warp_specialized_gpu.py",
         "tests/test_backward_warp_specialized.py", "tests/test_fp8_ptx.py", "tests/test_wgmma_fp8_ptx.py",
         "tests/test_flex_tensor_cores.py", "tests/test_flex_tensor_cores_gpu.py", "tests/test_varlen_tensor_cores.py",
         "tests/test_varlen_tensor_cores_gpu.py", "tests/test_hopper_fp8_gpu.py", "tests/test_hopper_fp8.py",
         "tests/test_flex_hopper.py", "tests/test_flex_hopper_gpu.py",
         "tests/test_flex_backward.py", "tests/test_flex_backward_gpu.py"]
MIN_SECONDS = 0.05  # a test's least estimate: pytest's own time per test
PROCESSES = 15  # pytest-xdist workers, each holding its own CUDA context: a 16-core machine's cores but one (the
# pytest that hands out the tests, the GPU's driver threads)
# the thread pools of the libraries under the tests (OpenBLAS, OpenMP, MKL, PyTorch's CPU ops): one thread each per
# worker's share of the cores, unless the caller set them; left alone, each of the workers starts a pool as
# large as the machine and they contend for its cores in the float64 references' matrix products
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
GRACE = 30.0  # seconds an interrupted pytest has to write its report before it is killed
INTERRUPTED = 2  # pytest's exit code when interrupted


def collect(files: list[str], smoke: bool) -> list[str]:
    """The node ids of the tests of ``files`` (the smoke tier's only, with ``smoke``), in pytest's order."""
    chosen = ["-m", "smoke"] if smoke else ["--grid"]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0",
                           *chosen, *files], cwd=ROOT, env=test_env(), capture_output=True, text=True)
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if done.returncode not in (0, 5) or not ids:
        raise SystemExit(f"collecting the tests failed (exit code {done.returncode}):\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    return ids


def seconds_per_test(records: list[Path]) -> dict:
    """file -> its seconds per test in its newest run in the records (the rows of that date, summed)."""
    rows = []
    for record in records:
        with open(record, newline="") as f:
            rows += list(csv.DictReader(f))
    newest = {}
    for row in rows:
        newest[row["file"]] = max(newest.get(row["file"], ""), row["date"])
    totals = {}
    for row in rows:
        if row["date"] == newest[row["file"]] and int(row["tests"]):
            tests, seconds = totals.get(row["file"], (0, 0.0))
            totals[row["file"]] = (tests + int(row["tests"]), seconds + float(row["seconds"]))
    return {file: seconds / tests for file, (tests, seconds) in totals.items()}


def unrecorded_rate(per_test: dict) -> float:
    """The seconds per test of a file not yet in the record: the record's slowest file's (a new file is the
    likeliest to compile a kernel of its own in each test)."""
    return max(per_test.values(), default=1.0)


def estimate(ids: list[str], per_test: dict) -> float:
    """The record's estimate of the seconds the tests ``ids`` take, one after another."""
    unknown = unrecorded_rate(per_test)
    return sum(max(per_test.get(node.split("::")[0], unknown), MIN_SECONDS) for node in ids)


def test_env(processes: int = 1) -> dict:
    """The environment of the pytest processes: this checkout's src/ first on PYTHONPATH, output unbuffered, and
    each process's thread pools sized to its share of the cores (:data:`THREAD_VARIABLES`, where not set)."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    threads = str(max(1, (os.cpu_count() or 1) // max(1, processes)))
    return {**{name: threads for name in THREAD_VARIABLES}, **os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def outcome(case: ET.Element) -> str:
    """'failed', 'errors', 'skipped' or 'passed' of one <testcase> (an xfail is 'skipped', as JUnit reports it)."""
    tags = {child.tag for child in case}
    if "failure" in tags:
        return "failed"
    if "error" in tags:
        return "errors"
    return "skipped" if "skipped" in tags else "passed"


def case_file(case: ET.Element, files: list[str]) -> str:
    """The test file of a <testcase>: its 'file' attribute (junit_family xunit1); for a file that could not be
    collected, the run's file that its error names, or its name ('tests.test_x' -> 'tests/test_x.py')."""
    if case.get("file"):
        return case.get("file")
    text = " ".join(child.text or "" for child in case)
    named = [f for f in files if str((ROOT / f).resolve()) in text or f in text]
    if named:
        return named[0]
    name = case.get("classname") or case.get("name") or "?"
    return name.replace(".", "/") + ".py" if name != "?" else "(not collected)"


def count(report: Path, files: list[str]) -> dict:
    """file -> {tests, passed, failed, skipped, errors, seconds} from a JUnit XML report; every file of the run
    gets a row (one that ran no test: zeros). A run may name tests ('tests/a.py::test_b'): their file's row."""
    found = count_nothing(files)
    files = list(found)  # the run's files, a test named in it ('tests/a.py::test_b') as its file
    for case in ET.parse(report).getroot().iter("testcase"):
        if not case.get("name"):  # the nameless entry pytest writes for a test interrupted (--deadline) mid-run
            continue
        row = found.setdefault(case_file(case, files), count_nothing(["?"])["?"])
        row["tests"] += 1
        row[outcome(case)] += 1
        row["seconds"] += float(case.get("time") or 0.0)
    return found


def failures(report: Path) -> list[str]:
    """'file::test' of each test that failed or gave an error in a JUnit XML report."""
    return [f"{case.get('file') or case.get('classname')}::{case.get('name')}"
            for case in ET.parse(report).getroot().iter("testcase") if outcome(case) in ("failed", "errors")]


def count_nothing(files: list[str]) -> dict:
    """The rows of a run that left no report: no test counted in any of its files (a test named in the run,
    'tests/a.py::test_b', counts in its file's row)."""
    return {f.split("::")[0]: {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "errors": 0, "seconds": 0.0}
            for f in files}


def run_tests(tests: list[str], processes: int, log: Path, report: Path, deadline: float | None = None):
    """One pytest of ``tests`` (files or node ids, the grid's too: ``--grid``) with ``processes`` workers; its exit
    code, and whether the deadline stopped it. ``deadline``: seconds after which a pytest still running is
    interrupted (SIGINT to it and its workers, which end the tests they are in: the report holds the tests that
    ended), and killed GRACE seconds later if it has not ended."""
    workers = ["-n", str(processes), "--dist", "worksteal"] if processes > 1 else ["-n", "0"]
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *workers, "--grid", "--durations=30",
               f"--junitxml={report}", "-o", "junit_family=xunit1", *tests]  # xunit1: each <testcase> says its
    # file; -v: the log names each test's result as it ends, so a run stopped by a time limit still says which
    # failed; --durations: the log names the slowest tests, setup (compiling) apart from the call
    start = time.perf_counter()
    with open(log, "w") as out:  # a session of its own: the deadline's signal reaches pytest and its workers
        proc = subprocess.Popen(command, cwd=ROOT, env=test_env(processes), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=deadline), False
        except subprocess.TimeoutExpired:
            print(f"stopped at the deadline, {time.perf_counter() - start:.0f} s", flush=True)
            os.killpg(proc.pid, signal.SIGINT)
        try:
            return proc.wait(timeout=GRACE), True
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(), True


def kept_rows(path: Path, replaced: set) -> list[dict]:
    """The rows of an earlier run in ``path`` whose files are not in ``replaced`` (those this run writes anew)."""
    if not path.exists() or not path.stat().st_size:
        return []
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("file") not in replaced]


def node_id(case: ET.Element) -> str | None:
    """The pytest node id of a <testcase> (junit_family xunit1: its file, its class under the module, its name);
    None for the nameless entry of a test interrupted mid-run."""
    file, name = case.get("file"), case.get("name")
    if not file or not name:
        return None
    module = file.removesuffix(".py").replace("/", ".")
    inside = (case.get("classname") or "").removeprefix(module).strip(".")
    return "::".join([file, *inside.split(".")] if inside else [file]) + "::" + name


def ended_tests(report: Path) -> list[str]:
    """The node ids of the tests that ended (passed, failed, skipped or gave an error) in a JUnit XML report."""
    return [node for node in map(node_id, ET.parse(report).getroot().iter("testcase")) if node]


def load_state(path: Path, commit: str) -> set:
    """The tests that ended in earlier calls at ``commit`` (none if the state is of another commit, or new)."""
    if not path.exists():
        return set()
    state = json.loads(path.read_text())
    return set(state["ended"]) if state.get("commit") == commit else set()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="the GPU suite:\n  " + "\n  ".join(FILES))
    ap.add_argument("csv", help="write one row per test file here (rows of other files are kept)")
    ap.add_argument("tests", nargs="*", help="test files or node ids to run (default: the GPU suite)")
    ap.add_argument("--smoke", action="store_true", help="the GPU smoke tier: the tests marked smoke, every entry "
                                                         "point and kernel version once")
    ap.add_argument("--processes", type=int, default=PROCESSES,
                    help=f"pytest-xdist workers (default {PROCESSES}; 1: pytest alone)")
    ap.add_argument("--deadline", type=float, help="seconds after which the run is interrupted, its rows holding "
                                                   "the tests that ended (inside a call's limit)")
    ap.add_argument("--state", help="a JSON file of the tests that ended at this commit: run only the others, "
                                    "and add the ones that end now")
    ap.add_argument("--plan", action="store_true", help="print the tests' count and the record's estimate of "
                                                        "their time; run nothing")
    ap.add_argument("--log-dir", help="where the pytest log goes (default: the CSV's folder)")
    args = ap.parse_intermixed_args(argv)  # options before or after the tests

    from tinyflash.bench.record import git_commit

    commit = git_commit()  # TINYFLASH_COMMIT where the checkout has no .git
    state = Path(args.state) if args.state else None
    if state and not commit:
        ap.error("--state needs the commit (no .git here: set TINYFLASH_COMMIT)")
    ended = load_state(state, commit) if state else set()
    files = args.tests or FILES
    ids = collect(files, smoke=args.smoke)
    left = [node for node in ids if node not in ended]
    if args.plan:
        per_test = seconds_per_test(RECORDS)
        print(f"{len(left)} tests of {len(ids)} left, ~{estimate(left, per_test):.0f} s of one worker by the record, "
              f"~{estimate(left, per_test) / args.processes:.0f} s on {args.processes}")
        return 0
    if not left:
        print(f"nothing left: the {len(ids)} tests ended at {commit} ({state})")
        return 0
    tests = files if len(left) == len(ids) and not args.smoke else left  # files where all run: a shorter command
    tag = "smoke" if args.smoke else "chosen" if args.tests else "all"
    csv_path = Path(args.csv)
    log_dir = Path(args.log_dir) if args.log_dir else csv_path.resolve().parent
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"gpu_tests_{tag}{f'_{len(ended)}' if ended else ''}.log"
    code, ran = run_and_record(tests, args.processes, log, csv_path, args.deadline, keep=bool(ended))
    if state:
        state.write_text(json.dumps({"commit": commit, "ended": sorted(ended | set(ran))}, indent=0))
        print(f"{len(ended | set(ran) & set(ids))} of {len(ids)} tests ended at {commit} (state: {state})")
    return code


def run_and_record(tests: list[str], processes: int, log: Path, csv_path: Path, deadline: float | None = None,
                   keep: bool = False) -> tuple[int, list[str]]:
    """Run the tests; one row per file into ``csv_path``, after the earlier rows of other files (of every file
    with ``keep``); the exit code (0: every test ran, and nothing failed or gave an error) and the node ids of
    the tests that ended. ``deadline``: :func:`run_tests`'."""
    from tinyflash.bench.record import CsvWriter, environment

    try:
        env = environment()  # the GPU's name, asked of CuPy
    except Exception:  # no CuPy or no GPU: the GPU tests skip themselves, and the rows say so
        env = environment(device="no GPU")
    files = list(dict.fromkeys(t.split("::")[0] for t in tests))
    print(f"{env['device']}  numba-cuda {env['numba_cuda']}  cupy {env['cupy'] or '-'}  torch {env['torch'] or '-'}"
          f"  commit {env['commit'] or '-'}  {env['date']}  {len(tests)} tests or files, {processes} workers",
          flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        code, stopped = run_tests(tests, processes, log, report, deadline)
        found = count(report, files) if report.exists() else count_nothing(files)
        names = failures(report) if report.exists() else []
        ran = ended_tests(report) if report.exists() else []
    for name in names:
        print(f"FAILED {name}  (log: {log.name})", flush=True)
    if stopped:
        print(f"stopped at the deadline: {len(ran)} tests ended", flush=True)
    elif code not in (0, 1, 5) and not any(row["failed"] or row["errors"] for row in found.values()):
        # pytest stopped without a failing test in its report (a file not found, a crash): the files that ran no
        # test get an error each (all of them if every file ran some); the log says why
        for row in [row for row in found.values() if not row["tests"]] or list(found.values()):
            row["errors"] += 1
        print(f"pytest of {' '.join(sorted(found))} exited with {code}; see {log}")
    earlier = kept_rows(csv_path, set() if keep else set(found))
    totals = dict.fromkeys(("tests", "passed", "failed", "skipped", "errors"), 0)
    if csv_path.exists():
        csv_path.unlink()  # rewritten: the earlier rows that this run keeps, then this run's
    writer = CsvWriter(csv_path, fields=FIELDS)
    for row in earlier:
        writer.write({k: row.get(k, "") for k in FIELDS})
    for file, row in found.items():
        if not row["tests"] and stopped:
            continue  # a file the deadline came before: no row, its tests are left for the next call
        writer.write({**{k: env[k] for k in FIELDS if k in env}, "file": file, **row, "seconds": round(row["seconds"], 1)})
        for key in totals:
            totals[key] += row[key]
        print(f"{file:42} {row['tests']:4} tests: {row['passed']:4} passed, {row['failed']} failed, "
              f"{row['skipped']:3} skipped, {row['errors']} errors  {row['seconds']:7.1f} s", flush=True)
    writer.close()
    print(f"{totals['tests']} tests: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped, "
          f"{totals['errors']} errors, in {time.perf_counter() - start:.0f} s (log: {log})"
          + ("; stopped at the deadline" if stopped else ""))
    return (0 if totals["failed"] == totals["errors"] == 0 and not stopped else 1), ran


if __name__ == "__main__":
    sys.exit(main())
