"""The two commands a user types, ``python -m tinyflash.bench`` and ``python -m tinyflash.plots``:
their usage line shows that command, and every option says what it does."""

import argparse
import os
import subprocess
import sys
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


SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_answers_help_without_a_gpu(script, tmp_path):
    """``--help`` prints the usage and does nothing else: no measurement, no file written."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(env, PYTHONPATH=str(script.parent.parent / "src")), timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_the_gpu_session_runs_every_file_with_gpu_tests():
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("gpu_tests", root / "benchmarks" / "gpu_tests.py")
    gpu_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_tests)
    grouped = {f for group in gpu_tests.GROUPS for f in group.split()}
    marked = {f"tests/{p.name}" for p in (root / "tests").glob("test_*.py") if "mark.gpu" in p.read_text()}
    assert marked <= grouped, sorted(marked - grouped)
    assert all((root / f).exists() for f in grouped)
