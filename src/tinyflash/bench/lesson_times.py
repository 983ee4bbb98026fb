"""How long each lesson runs, from the record, in a paragraph of its docstring.

A lesson's docstring holds one paragraph that starts with ``Running time:``; ``python -m tinyflash.bench --docs``
rewrites it from the row of ``python lessons/<lesson>.py`` in ``figures/data/cpu_runs.csv`` (written by
``python benchmarks/cpu_runs.py --only lesson-NN``: the lesson run once, as a learner runs it, without a GPU), and
``tests/test_docs.py`` checks that every lesson holds what the record says. A lesson the record has not timed says
so, and which command times it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from .record import data_dir, read_csv, repository

PARAGRAPH = re.compile(r'^Running time:.*?(?=\n\s*\n|\n"""|\Z)', re.S | re.M)  # to a blank line or the docstring's end
WIDTH = 100  # the lessons' docstrings wrap at about this width
SHARED = 0.8  # CPU time below this share of the wall time: the command waited for cores that other work held
NOTED = 5  # seconds: below this, a process's start is most of the time, and the CPU time is not worth a word


def lesson_files() -> list[Path]:
    """The numbered lessons, in order (the pattern of lessons/run_all.py)."""
    return sorted((repository() / "lessons").glob("[0-9][0-9]_*.py"))


def rounded(seconds: float) -> str:
    """'under a second', 'about 3 s' below ten seconds, else to the nearest 5 s ('about 35 s'): one run on a
    shared machine says no more than that."""
    if seconds < 1:
        return "under a second"
    if seconds < 10:
        return f"about {round(seconds)} s"
    return f"about {5 * round(seconds / 5)} s"


def running_time(lesson: Path, rows: list[dict] | None = None) -> str:
    """The paragraph of ``lesson``'s docstring that says how long it ran, from ``rows`` (default: the record)."""
    if rows is None:
        rows = read_csv(data_dir() / "cpu_runs.csv")
    command = f"python lessons/{lesson.name}"
    row = next((r for r in rows if r["command"] == command), None)
    if row is None:
        text = (f"Running time: not timed yet (python benchmarks/cpu_runs.py --only lesson-{lesson.name[:2]} "
                "records it).")
    else:
        kernels = ", its kernels on numba's simulator" if "use_gpu_or_simulator" in lesson.read_text() else ""
        cpu = float(row["cpu_seconds"]) if row.get("cpu_seconds") else None
        seconds = float(row["seconds"])
        busy = (f" ({cpu:.0f} s of CPU time: other work shared the machine)"
                if cpu is not None and seconds >= NOTED and cpu < SHARED * seconds else "")
        failed = "" if row["exit_code"] == "0" else ", and failed"
        text = (f"Running time: {rounded(seconds)}{busy} on {row['cpus']} CPU cores without a GPU"
                f"{kernels}{failed} (figures/data/cpu_runs.csv, {row['date'][:10]}, commit {row['commit']}).")
    return textwrap.fill(text, WIDTH)


def docstring_paragraph(text: str) -> str | None:
    """The ``Running time:`` paragraph of a lesson's source ``text`` (None where there is none)."""
    found = PARAGRAPH.search(text)
    return found.group(0) if found else None


def write_lessons() -> list[Path]:
    """Rewrite every lesson's ``Running time:`` paragraph from the record; returns the files that changed."""
    rows = read_csv(data_dir() / "cpu_runs.csv")
    changed = []
    for lesson in lesson_files():
        text = lesson.read_text()
        if docstring_paragraph(text) is None:
            raise ValueError(f"{lesson.name}: its docstring has no paragraph that starts with 'Running time:'")
        new = PARAGRAPH.sub(lambda _: running_time(lesson, rows), text, count=1)
        if new != text:
            lesson.write_text(new)
            changed.append(lesson)
    return changed
