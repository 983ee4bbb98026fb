"""Every numbered lesson runs to the end, and lessons/run_all.py runs them in order.

A lesson checks itself with asserts, so a lesson passes when its process exits with 0; on failure
the end of its output is shown. The lessons run as subprocesses from the repository root with
the repository's src/ first on PYTHONPATH (so they import this checkout, installed or not) and,
without a real GPU, NUMBA_ENABLE_CUDASIM=1 (lesson 05 runs its CUDA kernels on numba's simulator).
"""

import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HAS_GPU

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lessons"))
from lib import LESSON_SEED, SEED_VARIABLE  # noqa: E402  (the lessons' helper)
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))  # the same pattern as run_all.py
TIMEOUT_S = 300  # per lesson; the NumPy lessons take seconds, the simulator is slower


def lesson_env(seed: int | None = None) -> dict:
    """The lessons' environment; ``seed`` None: their default seed, else TINYFLASH_SEED=seed."""
    env = dict(os.environ)
    env.pop(SEED_VARIABLE, None)
    if seed is not None:
        env[SEED_VARIABLE] = str(seed)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    if not HAS_GPU:
        env["NUMBA_ENABLE_CUDASIM"] = "1"  # must be set before numba is imported: hence in the environment
    return env


def run(args, cwd, timeout=TIMEOUT_S, seed=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=lesson_env(seed), capture_output=True,
                          text=True, timeout=timeout)


def tail(proc: subprocess.CompletedProcess, chars: int = 4000) -> str:
    return f"--- stdout (end)\n{proc.stdout[-chars:]}\n--- stderr (end)\n{proc.stderr[-chars:]}"


@pytest.mark.lesson
def test_lessons_are_found():
    """The glob finds the lessons, and no two share a number (their order would be ambiguous)."""
    numbers = [p.name[:2] for p in LESSONS]
    assert len(LESSONS) >= 4, f"expected lessons in {ROOT / 'lessons'}; found {[p.name for p in LESSONS]}"
    assert len(set(numbers)) == len(numbers), f"two lessons share a number: {[p.name for p in LESSONS]}"


@pytest.mark.lesson
@pytest.mark.grid  # python lessons/run_all.py runs them so; the first tier runs them with another seed, below
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.name for p in LESSONS])
def test_lesson_runs(lesson):
    try:
        proc = run([lesson], cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"{lesson.name} did not finish within {TIMEOUT_S} s\n--- stdout (end)\n{out[-4000:]}")
    assert proc.returncode == 0, f"{lesson.name} exited with code {proc.returncode}\n{tail(proc)}"
    assert f"random seed {LESSON_SEED} " in proc.stdout  # seeded by default, and the seed printed


@pytest.mark.lesson
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.name for p in LESSONS])
def test_lesson_runs_with_another_seed(lesson, request):
    """A lesson's checks hold for any inputs, not only for the default seed's."""
    if request.config.getoption("grid") and not HAS_GPU and "use_gpu_or_simulator" in lesson.read_text():
        pytest.skip("with --grid, a lesson whose kernels run on the simulator runs once, with its default seed "
                    "(test_lesson_runs): twice would take minutes of CI's 15 (the first tier runs it with a fresh seed)")
    seed = secrets.randbelow(2**31 - 1)
    if seed == LESSON_SEED:
        seed += 1
    try:
        proc = run([lesson], cwd=ROOT, seed=seed)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{lesson.name} with {SEED_VARIABLE}={seed} did not finish within {TIMEOUT_S} s")
    assert proc.returncode == 0, f"{lesson.name} with {SEED_VARIABLE}={seed} failed\n{tail(proc)}"
    assert f"random seed {seed} " in proc.stdout


def fake_repo(tmp_path: Path, lessons: dict) -> Path:
    """A copy of run_all.py in tmp_path/lessons beside the given fake lessons {name: source}."""
    (tmp_path / "lessons").mkdir()
    (tmp_path / "src").mkdir()
    shutil.copy(ROOT / "lessons" / "run_all.py", tmp_path / "lessons" / "run_all.py")
    for name, source in lessons.items():
        (tmp_path / "lessons" / name).write_text(textwrap.dedent(source))
    return tmp_path


CHECK_CONTEXT = """
    import os, sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    assert Path.cwd().resolve() == root, "lessons run from the repository root"
    assert sys.path[1] == str(root / "src"), sys.path  # [0] is the script's folder, then PYTHONPATH
    print("ran", Path(__file__).name)
"""


@pytest.mark.lesson
@pytest.mark.parametrize("where", ["root", "lessons"])
def test_run_all_runs_in_order_from_root_or_lessons(tmp_path, where):
    repo = fake_repo(tmp_path, {"02_b.py": CHECK_CONTEXT, "01_a.py": CHECK_CONTEXT, "notes.py": "raise SystemExit(5)"})
    cwd = repo if where == "root" else repo / "lessons"
    proc = run(["lessons/run_all.py" if where == "root" else "run_all.py"], cwd=cwd, timeout=60)
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.index("ran 01_a.py") < proc.stdout.index("ran 02_b.py")  # in order
    assert "notes.py" not in proc.stdout and "all 2 lessons passed" in proc.stdout  # only numbered files


@pytest.mark.lesson
def test_run_all_stops_at_the_first_failure(tmp_path):
    repo = fake_repo(tmp_path, {"01_ok.py": "print('one')", "02_fails.py": "raise SystemExit(3)",
                                "03_never.py": "print('three')"})
    proc = run(["lessons/run_all.py"], cwd=repo, timeout=60)
    assert proc.returncode == 3, tail(proc)
    assert "one" in proc.stdout and "02_fails.py FAILED (exit code 3)" in proc.stdout
    assert "03_never.py" not in proc.stdout and "three" not in proc.stdout
