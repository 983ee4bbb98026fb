"""The two commands a user types, ``python -m tinyflash.bench`` and ``python -m tinyflash.plots``:
their usage line shows that command, and every option says what it does."""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tinyflash import plots
from tinyflash.bench.__main__ import main as bench_main


@pytest.mark.parametrize("main, prog", [(bench_main, "python -m tinyflash.bench"),
                                        (plots.main, "python -m tinyflash.plots")])
def test_help_names_the_command_and_every_option(main, prog, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: {prog} ")
    seen = {}

    def keep(self, args=None, namespace=None):
        seen["parser"] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", keep)
    with pytest.raises(SystemExit):
        main([])
    undocumented = [a.dest for a in seen["parser"]._actions if not (a.help or "").strip()]
    assert not undocumented, f"{prog}: options without help: {undocumented}"


def test_bench_summary_prints_the_table_of_each_record(capsys):
    """``--summary CSV`` picks the table of the CSV's benchmark: the tensor-cores record's is the stage-3 table
    (v6 under stage 3, not stage 2), and every committed benchmark record with a table prints one."""
    from tinyflash.bench import record, tables

    printed = 0
    for path in sorted(record.data_dir().glob("*.csv")):
        rows = record.read_csv(path)
        if rows and "benchmark" in rows[0] and rows[0]["benchmark"] in tables.TABLES:
            assert bench_main(["--summary", str(path)]) == 0
            assert capsys.readouterr().out.strip() == tables.summary(rows)
            printed += 1
    assert printed >= 7
    bench_main(["--summary", str(record.data_dir() / "tensor_cores_h200.csv")])
    assert capsys.readouterr().out.startswith("| dtype | d | causal | N | v6 TFLOP/s | v6 / flash |")


def test_bench_list_names_every_benchmark(capsys):
    from tinyflash.bench.suites import BENCHMARKS

    assert bench_main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name} " in out and bench.doc in out for name, bench in BENCHMARKS.items())


ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_answers_help_without_a_gpu(script, tmp_path):
    """``--help`` prints the usage and does nothing else: no measurement, no file written."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(env, PYTHONPATH=str(script.parent.parent / "src")), timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def gpu_tests_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_tests", ROOT / "benchmarks" / "gpu_tests.py")
    gpu_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_tests)
    return gpu_tests


def test_the_gpu_session_runs_every_file_with_gpu_tests():
    """The GPU suite holds every file with a test that runs kernels: marked gpu, or simulator (on a GPU, there)."""
    files = set(gpu_tests_module().FILES)
    marked = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
              if "mark.gpu" in p.read_text() or "mark.simulator" in p.read_text()}
    assert marked <= files, sorted(marked - files)
    assert all((ROOT / f).exists() for f in files)


def test_a_report_names_the_tests_that_ended_by_their_node_ids(tmp_path):
    """The node ids read back from a JUnit report (xunit1) are pytest's: a function's, a class's method's, a
    parametrized case's with spaces in its id; the nameless entry of an interrupted test is not one."""
    gpu_tests = gpu_tests_module()
    report = tmp_path / "run.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.test_a" name="test_x[documents causal-1]" file="tests/test_a.py"/>'
                      '<testcase classname="tests.test_a.TestB" name="test_y" file="tests/test_a.py"/>'
                      '<testcase time="0.000"/></testsuite></testsuites>')
    assert gpu_tests.ended_tests(report) == ["tests/test_a.py::test_x[documents causal-1]",
                                             "tests/test_a.py::TestB::test_y"]


def test_a_state_serves_only_its_own_commit(tmp_path):
    gpu_tests = gpu_tests_module()
    state = tmp_path / "state.json"
    assert gpu_tests.load_state(state, "abc1234") == set()  # none yet
    state.write_text('{"commit": "abc1234", "ended": ["tests/test_a.py::test_x"]}')
    assert gpu_tests.load_state(state, "abc1234") == {"tests/test_a.py::test_x"}
    assert gpu_tests.load_state(state, "def5678") == set()  # another commit's: started over


def test_a_run_cut_at_its_deadline_keeps_the_tests_that_ended(tmp_path):
    """A pytest with two workers, interrupted at its deadline inside a long test: it ends within seconds (the
    signal reaches the workers), and its report holds the quick tests and not the long one."""
    gpu_tests = gpu_tests_module()
    (tmp_path / "conftest.py").write_text('def pytest_addoption(parser):\n'
                                          '    parser.addoption("--grid", action="store_true")\n')
    (tmp_path / "test_t.py").write_text("import time\nimport pytest\n\n\n@pytest.mark.parametrize('i', range(3))\n"
                                        "def test_quick(i):\n    pass\n\n\ndef test_long():\n    time.sleep(600)\n")
    start = time.perf_counter()
    report = tmp_path / "report.xml"
    code, stopped = gpu_tests.run_tests([str(tmp_path / "test_t.py")], 2, tmp_path / "log.txt", report, deadline=8)
    assert stopped and code == gpu_tests.INTERRUPTED and time.perf_counter() - start < 8 + gpu_tests.GRACE
    ended = sorted(node.split("::")[-1] for node in gpu_tests.ended_tests(report))
    assert ended == ["test_quick[0]", "test_quick[1]", "test_quick[2]"], (tmp_path / "log.txt").read_text()[-2000:]


def test_a_report_cut_at_the_deadline_counts_the_tests_that_ended(tmp_path):
    """An interrupted pytest's JUnit report ends with a nameless entry for the test it was in: not counted."""
    gpu_tests = gpu_tests_module()
    report = tmp_path / "group.xml"
    report.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_x[1]" '
                      'file="tests/test_a.py" time="2.0"/><testcase classname="tests.test_a" name="test_x[2]" '
                      'file="tests/test_a.py" time="1.0"><failure message="no"/></testcase>'
                      '<testcase time="0.000"/></testsuite></testsuites>')
    found = gpu_tests.count(report, ["tests/test_a.py"])
    assert found == {"tests/test_a.py": {"tests": 2, "passed": 1, "failed": 1, "skipped": 0, "errors": 0,
                                         "seconds": 3.0}}


def test_the_ptxas_report_finds_uniform_registers_that_nothing_writes(monkeypatch):
    """The SASS check of benchmarks/ptxas_report.py, on listings in nvdisasm's form: ptxas 13.0's cp.async with a
    cache policy (decode's split kernel at d = 32) reads UR0 and the descriptor pair UR1, UR2 that no instruction
    writes; the same copy after UMOV and ULDC.64 writes is clean; a store's first operand is read, not written,
    and only the copies' reads are checked."""
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("ptxas_report", root / "benchmarks" / "ptxas_report.py")
    report = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ptxas_report", report)  # its dataclasses look their module up
    spec.loader.exec_module(report)
    broken = """
        /*2ca0*/                   UIMAD UR8, UR6, 0x1400, URZ ;
        /*2d30*/                   UMOV UR6, URZ ;
        /*2d90*/                   UMOV UR6, UR8 ;
        /*2f20*/                   LDGSTS.E.BYPASS.LTC128B.128 [R79+UR0], desc[UR1][R48.64], !P5 ;
    """
    clean = """
        /*0040*/                   ULDC.64 UR10, c[0x0][0x208] ;
        /*0760*/              @P0  S2UR UR4, SR_CgaCtaId ;
        /*0b10*/                   LDGSTS.E.BYPASS.LTC128B.128 [R33+UR4], desc[UR10][R18.64], !P3 ;
        /*0b20*/                   STS [UR4+0x10], R2 ;
    """
    assert report.unwritten_uniform_registers(broken) == ["UR0", "UR1", "UR2"]
    assert report.unwritten_uniform_registers(clean) == []
    assert report.unwritten_uniform_registers(clean.replace("ULDC.64", "ULDC")) == ["UR11"]  # half the pair
    assert report.unwritten_uniform_registers("        /*0010*/   STS [UR5], R1 ;\n") == []  # only copies are checked
