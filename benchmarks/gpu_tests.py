"""The GPU test files, several pytest processes at once, and a CSV of their results: one row per file.

    PYTHONPATH=src python benchmarks/gpu_tests.py gpu_tests_h200.csv ["tests/a.py tests/b.py" ...]

Each argument after the CSV is a group of test files that one pytest process runs (default: GROUPS);
the groups run in parallel, since most of a GPU test's time is numba compiling kernels and NumPy
computing float64 references, both on the CPU. Each process writes a JUnit XML report and a log
(gpu_tests_<first file>.log, beside the CSV, or in ``--log-dir``); from the reports, one row per test
file: the device, the date, the versions and the commit (``tinyflash.bench.record.environment``), the
file, its tests, how many passed, failed, were skipped or gave errors, and the seconds they took,
written as each group ends (a run cut short by a time limit keeps the groups that ended). A group
whose pytest stopped without reporting a failing test (a file not found, a crash) gives each of its
files that ran no test one error. Prints a line per file and the totals; the exit code is 0 when
nothing failed or gave an error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "commit", "file", "tests", "passed", "failed",
          "skipped", "errors", "seconds"]
# the test files that run kernels on the GPU, in groups: one pytest process each, all at once
# (every test file with a test marked gpu is in one: tests/test_commands.py checks it)
GROUPS = ["tests/test_cuda_gpu.py", "tests/test_cuda_kernel.py tests/test_nonfinite.py",
          "tests/test_tensor_core_gpu.py tests/test_tensor_core_ptx.py", "tests/test_tensor_core.py tests/test_docs.py",
          "tests/test_backward_gpu.py", "tests/test_backward_kernel.py tests/test_gqa.py",
          "tests/test_decode_kernels.py", "tests/test_decode_tensor_cores.py tests/test_gpu_runtime.py "
          "tests/test_commands.py tests/test_driver_launch.py",
          "tests/test_backward_tensor_cores_gpu.py tests/test_backward_tensor_cores.py", "tests/test_torch_gpu.py tests/test_decode_torch_gpu.py tests/test_kernel_cache.py",
          "tests/test_hopper_gpu.py tests/test_hopper.py tests/test_wgmma_ptx.py",
          "tests/test_backward_wgmma_gpu.py tests/test_backward_wgmma.py",
          "tests/test_backward_warp_specialized_gpu.py tests/test_backward_warp_specialized.py"]


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
        row = found.setdefault(case_file(case, files), count_nothing(["?"])["?"])
        row["tests"] += 1
        row[outcome(case)] += 1
        row["seconds"] += float(case.get("time") or 0.0)
    return found


def count_nothing(files: list[str]) -> dict:
    """The rows of a group that left no report: no test counted in any of its files (a test named in the group,
    'tests/a.py::test_b', counts in its file's row)."""
    return {f.split("::")[0]: {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "errors": 0, "seconds": 0.0}
            for f in files}


def run_groups(groups: list[list[str]], log_dir: Path, report_dir: Path):
    """Start one pytest per group, all at once. Yields (files, report path, log path, exit code) of each group as
    it ends, first ended first, so that its rows are written at once: a run stopped by a time limit keeps them."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    running = []
    for i, files in enumerate(groups):
        report = report_dir / f"group_{i}.xml"
        log = log_dir / f"gpu_tests_{Path(files[0].split('::')[0]).stem.removeprefix('test_')}.log"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                   "-o", "junit_family=xunit1", *files]  # xunit1: each <testcase> says its file
        out = open(log, "w")
        running.append((files, report, log, out, subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                                                  stderr=subprocess.STDOUT)))
    while running:
        ended = [group for group in running if group[-1].poll() is not None]
        for group in ended:
            files, report, log, out, proc = group
            out.close()
            running.remove(group)
            yield files, report, log, proc.returncode
        if not ended:
            time.sleep(0.5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="default groups:\n  " + "\n  ".join(GROUPS))
    ap.add_argument("csv", help="write one row per test file here")
    ap.add_argument("groups", nargs="*", default=GROUPS, help="groups of test files, each one quoted argument")
    ap.add_argument("--log-dir", help="where each group's pytest log goes (default: the CSV's folder)")
    args = ap.parse_intermixed_args(argv)  # --log-dir before or after the groups

    from tinyflash.bench.record import CsvWriter, environment

    try:
        env = environment()  # the GPU's name, asked of CuPy
    except Exception:  # no CuPy or no GPU: the GPU tests skip themselves, and the rows say so
        env = environment(device="no GPU")
    csv_path = Path(args.csv)
    log_dir = Path(args.log_dir) if args.log_dir else csv_path.resolve().parent
    log_dir.mkdir(parents=True, exist_ok=True)
    groups = [group.split() for group in args.groups]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        writer, totals = CsvWriter(csv_path, fields=FIELDS), dict.fromkeys(("tests", "passed", "failed", "skipped",
                                                                             "errors"), 0)
        print(f"{env['device']}  numba-cuda {env['numba_cuda']}  cupy {env['cupy'] or '-'}  torch {env['torch'] or '-'}"
              f"  commit {env['commit'] or '-'}  {env['date']}", flush=True)
        for files, report, log, code in run_groups(groups, log_dir, Path(tmp)):
            found = count(report, files) if report.exists() else count_nothing(files)
            if code not in (0, 1, 5) and not any(row["failed"] or row["errors"] for row in found.values()):
                # pytest stopped without a failing test in its report (a file not found, a crash): the files
                # that ran no test get an error each (all of them if every file ran some); the log says why
                for row in [row for row in found.values() if not row["tests"]] or list(found.values()):
                    row["errors"] += 1
                print(f"pytest of {' '.join(files)} exited with {code}; see {log}")
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
          f"{totals['errors']} errors, in {time.perf_counter() - start:.0f} s (logs in {log_dir})")
    return 0 if totals["failed"] == totals["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
