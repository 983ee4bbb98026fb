"""The GPU tests, several pytest processes at once, and a CSV of their results: one row per file and process.

    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv --smoke       # the GPU smoke tier: every entry point and
                                                                        # kernel version once
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv --part 1      # the whole GPU suite in two calls:
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv --part 2      # each runs half of it
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv --part 1 --deadline 480   # groups still running after
                                                                        # 480 s are interrupted: their rows hold
                                                                        # the tests that ended
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv               # the whole GPU suite in one call
    PYTHONPATH=src python benchmarks/gpu_tests.py OUT.csv "tests/a.py tests/b.py" ...   # these groups, as given

The GPU suite is :data:`FILES`, every test in them (``--grid``: the exhaustive grid included). Its tests are
split into parts of whole files, and each part into ``--processes`` groups, one pytest process each, all at
once: most of a GPU test's time is numba compiling kernels and NumPy computing float64 references, both on the
CPU. The split is balanced by the records (:data:`RECORDS`): each file's seconds per test in its newest run, times
its tests now; a test function's cases stay in one group where they fit (they share compiled kernels), else
they go in runs that keep a kernel's sizes together (:func:`kernels_together`), and a part holds whole files, so that a part's rows replace the rows of the same files. ``--plan`` prints the groups
and runs nothing (no GPU needed).

Each process writes a JUnit XML report and a log (gpu_tests_<first file>.log, beside the CSV, or in
``--log-dir``); from the reports, one row per test file and process: the device, the date, the versions and
the commit (``tinyflash.bench.record.environment``), the file, its tests, how many passed, failed, were skipped
or gave errors, and the seconds they took, written as each group ends (a run cut short by a time limit keeps
the groups that ended). The CSV keeps the rows of files this run does not run (``--part 2`` after ``--part 1``
adds to its rows); a file that several processes ran has a row from each. A group whose pytest stopped without
reporting a failing test (a file not found, a crash) gives each of its files that ran no test one error.
Prints a line per row, a line per test that failed or gave an error, and the totals; the exit code is 0 when nothing failed or gave an error.
"""

from __future__ import annotations

import argparse
import csv
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
PARTS = 2  # calls of the whole suite: each well inside the 10 minutes one command may run on a lent GPU machine
MIN_SECONDS = 0.05  # a test's least estimate: pytest's own time per test
PROCESSES = 14  # pytest processes at once, each holding its own CUDA context: most of a 16-core machine's cores
# the thread pools of the libraries under the tests (OpenBLAS, OpenMP, MKL, PyTorch's CPU ops): one thread each per
# process's share of the cores, unless the caller set them; left alone, each of the processes starts a pool as
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


def balance(weights: dict, bins: int) -> list[list]:
    """The keys of ``weights`` in ``bins`` lists of nearly equal weight: heaviest first, each into the lightest
    list so far (longest processing time first)."""
    out, loads = [[] for _ in range(bins)], [0.0] * bins
    for key in sorted(weights, key=lambda k: -weights[k]):
        lightest = loads.index(min(loads))
        out[lightest].append(key)
        loads[lightest] += weights[key]
    return out


def plan(ids: list[str], per_test: dict, parts: int, processes: int) -> list[list[list[str]]]:
    """The node ids in ``parts`` parts of whole files, each in ``processes`` groups of nearly equal estimated
    seconds: a file stays in one group where it fits, else its test functions do, else runs of a function's
    cases."""
    unknown = unrecorded_rate(per_test)
    by_file = {}
    for node in ids:
        by_file.setdefault(node.split("::")[0], []).append(node)
    cost = {file: max(per_test.get(file, unknown), MIN_SECONDS) for file in by_file}
    out = []
    for files in balance({file: cost[file] * len(nodes) for file, nodes in by_file.items()}, parts):
        target = sum(cost[f] * len(by_file[f]) for f in files) / processes
        units = {}
        for file in files:
            if file not in per_test:  # not yet in the record: test by test, spread over the groups (a new file's
                units.update({(node,): cost[file] for node in by_file[file]})  # tests mostly compile kernels
                continue  # of their own, and one group holding them all would end last by far)
            if cost[file] * len(by_file[file]) <= target:  # a whole file where it fits: its kernels compiled once
                units[tuple(by_file[file])] = cost[file] * len(by_file[file])
                continue
            functions = {}
            for node in by_file[file]:
                functions.setdefault(node.split("[")[0], []).append(node)
            run = max(1, int(target // cost[file]))  # the cases a group holds at this file's rate
            for nodes in map(kernels_together, functions.values()):
                for start in range(0, len(nodes), run):
                    units[tuple(nodes[start:start + run])] = cost[file] * len(nodes[start:start + run])
        groups = [[node for unit in group for node in unit] for group in balance(units, processes)]
        out.append([group for group in groups if group])
    return out


def kernels_together(nodes: list[str]) -> list[str]:
    """One test function's cases, those that differ only in their sizes next to each other, so that a run of
    them in one group compiles each kernel once. A parameter is a size when all its values are integers and one
    is not a multiple of 8 (1, 17, 1000, 4097: a head dim or a tile is a multiple of 8); pytest's order is kept
    otherwise. ``test_x[1-64-False]`` … ``test_x[17-64-False]`` are one kernel's cases; ``test_x[1-96-False]`` is
    another's."""
    cases = [node[node.index("[") + 1:-1].split("-") if node.endswith("]") else [] for node in nodes]
    widths = {len(parts) for parts in cases}
    if len(widths) != 1 or not cases[0]:
        return list(nodes)
    columns = list(zip(*cases))
    sizes = {i for i, values in enumerate(columns)
             if all(v.isdigit() for v in values) and any(int(v) % 8 for v in values)}
    if not sizes:
        return list(nodes)
    kernel = lambda k: tuple(v for i, v in enumerate(cases[k]) if i not in sizes)  # noqa: E731
    first = {}
    for k in range(len(nodes)):
        first.setdefault(kernel(k), k)
    return [nodes[k] for k in sorted(range(len(nodes)), key=lambda k: (first[kernel(k)], k))]


def unrecorded_rate(per_test: dict) -> float:
    """The seconds per test of a file not yet in the record: a slow file's (the record's 90th percentile). A new
    file is the likeliest to compile many kernels of its own, and a file estimated too light lands whole in one
    process that then ends last; one estimated too heavy is only split into more groups."""
    known = sorted(per_test.values()) or [1.0]
    return known[int(0.9 * (len(known) - 1))]


def estimate(group: list[str], per_test: dict) -> float:
    unknown = unrecorded_rate(per_test)
    return sum(per_test.get(node.split("::")[0], unknown) for node in group)


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
    collected, the group's file that its error names, or its name ('tests.test_x' -> 'tests/test_x.py')."""
    if case.get("file"):
        return case.get("file")
    text = " ".join(child.text or "" for child in case)
    named = [f for f in files if str((ROOT / f).resolve()) in text or f in text]
    if named:
        return named[0]
    name = case.get("classname") or case.get("name") or "?"
    return name.replace(".", "/") + ".py" if name != "?" else "(not collected)"


def count(report: Path, files: list[str]) -> dict:
    """file -> {tests, passed, failed, skipped, errors, seconds} from a JUnit XML report; every file of the
    group gets a row (one that ran no test: zeros). A group may name tests ('tests/a.py::test_b'): their file's row."""
    found = count_nothing(files)
    files = list(found)  # the group's files, a test named in it ('tests/a.py::test_b') as its file
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
    """The rows of a group that left no report: no test counted in any of its files (a test named in the group,
    'tests/a.py::test_b', counts in its file's row)."""
    return {f.split("::")[0]: {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "errors": 0, "seconds": 0.0}
            for f in files}


def run_groups(groups: list[list[str]], log_dir: Path, report_dir: Path, tag: str, deadline: float | None = None):
    """Start one pytest per group, all at once. Yields (tests, report path, log path, exit code, stopped) of each
    group as it ends, first ended first, so that its rows are written at once: a run stopped by a time limit keeps
    them. A group's tests are files or node ids, run as named: the grid's too (``--grid``). ``deadline``: seconds
    after which each pytest still running is interrupted (SIGINT: it ends the test it is in, and its report holds
    the tests that ended; ``stopped`` is True), and killed GRACE seconds later if it has not ended."""
    start, interrupted = time.perf_counter(), False
    running = []
    for i, tests in enumerate(groups):
        report = report_dir / f"group_{i}.xml"
        log = log_dir / f"gpu_tests_{tag}{i}_{Path(tests[0].split('::')[0]).stem.removeprefix('test_')}.log"
        command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "0", "--grid",
                   "--durations=15", f"--junitxml={report}", "-o", "junit_family=xunit1", *tests]  # xunit1: each
        # <testcase> says its file; -n 0: each process runs its tests itself (the processes are the parallelism
        # here); -v: the log names each test's result as it ends, so a run stopped by a time limit still says
        # which failed; --durations: the log names the slowest tests, setup (compiling) apart from the call
        out = open(log, "w")
        running.append((tests, report, log, out, subprocess.Popen(command, cwd=ROOT, env=test_env(len(groups)),
                                                                  stdout=out, stderr=subprocess.STDOUT)))
    while running:
        ended = [group for group in running if group[-1].poll() is not None]
        for group in ended:
            tests, report, log, out, proc = group
            out.close()
            running.remove(group)
            yield tests, report, log, proc.returncode, interrupted
        elapsed = time.perf_counter() - start
        if deadline is not None and elapsed > deadline and not interrupted:
            interrupted = True
            for group in running:
                group[-1].send_signal(signal.SIGINT)
        if interrupted and elapsed > deadline + GRACE:
            for group in running:
                group[-1].kill()
        if not ended:
            time.sleep(0.5)


def kept_rows(path: Path, replaced: set) -> list[dict]:
    """The rows of an earlier run in ``path`` whose files are not in ``replaced`` (those this run writes anew)."""
    if not path.exists() or not path.stat().st_size:
        return []
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("file") not in replaced]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="the GPU suite:\n  " + "\n  ".join(FILES))
    ap.add_argument("csv", help="write one row per test file and process here (rows of other files are kept)")
    ap.add_argument("groups", nargs="*", help="groups of test files, each one quoted argument (default: the GPU "
                                              "suite, split by the record)")
    ap.add_argument("--part", type=int, help="run only this part (1 to --parts) of the GPU suite")
    ap.add_argument("--parts", type=int, default=PARTS, help=f"the parts of the GPU suite (default {PARTS})")
    ap.add_argument("--smoke", action="store_true", help="the GPU smoke tier: the tests marked smoke, every entry "
                                                         "point and kernel version once")
    ap.add_argument("--processes", type=int, default=PROCESSES,
                    help=f"pytest processes at once (default {PROCESSES})")
    ap.add_argument("--plan", action="store_true", help="print the groups and their estimated seconds; run nothing")
    ap.add_argument("--log-dir", help="where each group's pytest log goes (default: the CSV's folder)")
    ap.add_argument("--deadline", type=float, help="seconds after which the groups still running are interrupted, "
                                                   "their rows holding the tests that ended (inside a call's limit)")
    args = ap.parse_intermixed_args(argv)  # options before or after the groups

    per_test = seconds_per_test(RECORDS)
    groups, tag = chosen_groups(args, per_test)
    if args.part is not None and not groups:
        ap.error(f"--part must be 1 to {args.parts}")
    if args.plan:
        for i, group in enumerate(groups):
            files = sorted({node.split("::")[0] for node in group})
            print(f"group {i}: {len(group):4} tests, ~{estimate(group, per_test):5.0f} s: {' '.join(files)}")
        return 0
    csv_path = Path(args.csv)
    log_dir = Path(args.log_dir) if args.log_dir else csv_path.resolve().parent
    log_dir.mkdir(parents=True, exist_ok=True)
    return run_and_record(groups, tag, csv_path, log_dir, args.deadline)


def chosen_groups(args, per_test: dict) -> tuple[list[list[str]], str]:
    """The groups this call runs (each a list of files or node ids), and a tag for their logs' names; no groups
    for a part past the last."""
    if args.groups:
        return [group.split() for group in args.groups], ""
    if args.smoke:
        return plan(collect(FILES, smoke=True), per_test, 1, args.processes)[0], "smoke"
    parts = plan(collect(FILES, smoke=False), per_test, 1 if args.part is None else args.parts, args.processes)
    if args.part is None:
        return parts[0], "all"
    return (parts[args.part - 1] if 1 <= args.part <= len(parts) else []), f"part{args.part}"


def run_and_record(groups: list[list[str]], tag: str, csv_path: Path, log_dir: Path,
                   deadline: float | None = None) -> int:
    """Run the groups at once; rows into ``csv_path`` as each ends, after the earlier rows of other files; the
    exit code (0: every test ran, and nothing failed or gave an error). ``deadline``: :func:`run_groups`'."""
    cut = 0
    from tinyflash.bench.record import CsvWriter, environment

    try:
        env = environment()  # the GPU's name, asked of CuPy
    except Exception:  # no CuPy or no GPU: the GPU tests skip themselves, and the rows say so
        env = environment(device="no GPU")
    earlier = kept_rows(csv_path, {node.split("::")[0] for group in groups for node in group})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if csv_path.exists():
            csv_path.unlink()  # rewritten below: the earlier rows that this run keeps, then this run's
        writer, totals = CsvWriter(csv_path, fields=FIELDS), dict.fromkeys(("tests", "passed", "failed", "skipped",
                                                                             "errors"), 0)
        for row in earlier:
            writer.write({k: row.get(k, "") for k in FIELDS})
        print(f"{env['device']}  numba-cuda {env['numba_cuda']}  cupy {env['cupy'] or '-'}  torch {env['torch'] or '-'}"
              f"  commit {env['commit'] or '-'}  {env['date']}  {len(groups)} processes", flush=True)
        for tests, report, log, code, stopped in run_groups(groups, log_dir, Path(tmp), tag, deadline):
            found = count(report, tests) if report.exists() else count_nothing(tests)
            for name in failures(report) if report.exists() else []:
                print(f"FAILED {name}  (log: {log.name})", flush=True)
            if stopped and code == INTERRUPTED:  # the rows hold the tests that ended before the deadline
                cut += 1
                print(f"stopped at the deadline: {log.name} ({sum(r['tests'] for r in found.values())} tests "
                      f"ended)", flush=True)
            elif code not in (0, 1, 5) and not any(row["failed"] or row["errors"] for row in found.values()):
                # pytest stopped without a failing test in its report (a file not found, a crash): the files
                # that ran no test get an error each (all of them if every file ran some); the log says why
                for row in [row for row in found.values() if not row["tests"]] or list(found.values()):
                    row["errors"] += 1
                print(f"pytest of {' '.join(sorted(found))} exited with {code}; see {log}")
            for file, row in found.items():
                writer.write({**{k: env[k] for k in FIELDS if k in env}, "file": file, **row,
                              "seconds": round(row["seconds"], 1)})
                for key in totals:
                    totals[key] += row[key]
                print(f"{file:42} {row['tests']:4} tests: {row['passed']:4} passed, {row['failed']} failed, "
                      f"{row['skipped']:3} skipped, {row['errors']} errors  {row['seconds']:7.1f} s", flush=True)
        writer.close()
    print(f"{totals['tests']} tests: {totals['passed']} passed, {totals['failed']} failed, "
          f"{totals['skipped']} skipped, "
          f"{totals['errors']} errors, in {time.perf_counter() - start:.0f} s (logs in {log_dir})"
          + (f"; {cut} of {len(groups)} groups stopped at the deadline" if cut else ""))
    return 0 if totals["failed"] == totals["errors"] == cut == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
