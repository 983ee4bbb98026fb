"""The README and docs/*.md: every number they quote is the record's, their examples run, their links hold.

* Each generated block (between ``<!-- name:start -->`` and ``<!-- name:end -->``) holds exactly what
  :mod:`tinyflash.bench.docs` makes of the committed CSVs; ``python -m tinyflash.bench --docs`` rewrites them.
* Outside blocks and code, a page names things but quotes no measurement: every number there is a small
  count, a power of two (sizes, tiles, head dims, sequence lengths) or one of :data:`NAMED`, each of which
  a file of the project states.
* The README is a front door: at most 300 lines, the first command on the first screen, its examples run.
* The indexes are whole: a page's list of contents names every section of it, in order, and
  docs/notes/README.md has a line for every dated note.
* Each lesson's docstring says how long it runs in the words :mod:`tinyflash.bench.lesson_times` makes of the
  record (``figures/data/cpu_runs.csv``), the same command rewriting both.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinyflash.bench import docs, lesson_times
from tinyflash.bench.suites import BENCHMARKS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = docs.doc_files()
FIRST_SCREEN = 24  # lines of a terminal's first screen
MAX_README_LINES = 300
# numbers that name a thing rather than measure it, and the file of the project that states each
NAMED = {
    "2.1": ("src/tinyflash/core/masks.py", "FlashAttention >= 2.1"),  # the release that aligned the mask bottom-right
    "8.0": ("src/tinyflash/gpu/ptx.py", "compute capability 8.0"),  # what the tensor-core instructions need
    "13": ("requirements-gpu.txt", "CUDA 13"),  # the CUDA of the GPU requirements
    "2.5": ("requirements.txt", "numpy 2.5 removed"),  # the NumPy that numba-cuda cannot compile with
}
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?!\w)")


def prose(text: str) -> str:
    """``text`` without generated blocks, code (fenced, indented, inline), comments and link targets."""
    text = docs.MARKER.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def allowed(token: str) -> bool:
    if token in NAMED:
        return True
    if "." in token:
        return False
    value = int(token.replace(",", ""))
    return value <= 10 or (value & (value - 1) == 0 and value >= 16)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_blocks_hold_what_the_record_says(path):
    found = docs.blocks_in(path.read_text())
    assert found == {name: docs.BLOCKS[name]() for name in found}, "run: python -m tinyflash.bench --docs"


def test_every_block_is_used_and_every_use_has_a_maker():
    used = [name for path in PAGES for name in docs.blocks_in(path.read_text())]
    assert sorted(set(used)) == sorted(docs.BLOCKS)
    assert len(used) == len(set(used)), "a block appears twice"


@pytest.mark.parametrize("lesson", lesson_times.lesson_files(), ids=lambda p: p.name)
def test_a_lesson_says_how_long_it_runs(lesson):
    """Its docstring's ``Running time:`` paragraph is what the record says (``python -m tinyflash.bench --docs``)."""
    assert lesson_times.docstring_paragraph(lesson.read_text()) == lesson_times.running_time(lesson), (
        "run: python -m tinyflash.bench --docs")


def test_the_running_time_reads_the_record():
    """A row gives the rounded time, its CPU time where other work shared the machine, the cores; no row says how
    to time the lesson."""
    lesson = lesson_times.lesson_files()[4]  # lesson 05: its kernels run on the simulator
    row = {"command": f"python lessons/{lesson.name}", "seconds": "37.4", "cpus": "2", "cpu_seconds": "20.2",
           "exit_code": "0", "date": "2026-12-05 10:00 UTC", "commit": "abc1234"}
    said = " ".join(lesson_times.running_time(lesson, [row]).split())
    assert said.startswith("Running time: about 35 s (20 s of CPU time: other work shared the machine) on 2 CPU "
                           "cores without a GPU, its kernels on numba's simulator (")
    alone = " ".join(lesson_times.running_time(lesson, [{**row, "cpu_seconds": "36.0"}]).split())
    assert alone.startswith("Running time: about 35 s on 2 CPU cores")
    assert "not timed yet" in lesson_times.running_time(lesson, [])
    text = f'"""Lesson.\n\n{said}\n"""\nx = 1\n'
    assert lesson_times.docstring_paragraph(text) == said  # the paragraph ends at the docstring's end


def test_render_fills_empty_and_full_blocks_alike():
    text = "a\n<!-- x:start -->\n<!-- x:end -->\nb\n<!-- y:start -->\nold\n<!-- y:end -->\n"
    out = docs.render(text, {"x": "one", "y": "two"})
    assert out == "a\n<!-- x:start -->\none\n<!-- x:end -->\nb\n<!-- y:start -->\ntwo\n<!-- y:end -->\n"
    assert docs.blocks_in(out) == {"x": "one", "y": "two"}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_numbers_outside_blocks_only_name_things(path):
    stray = sorted({t.rstrip(",") for t in NUMBER.findall(prose(path.read_text()))} - {""})
    assert [t for t in stray if not allowed(t)] == [], "put measured numbers in a generated block"


def test_the_named_numbers_are_stated_by_the_project():
    for token, (file, phrase) in NAMED.items():
        assert phrase in (ROOT / file).read_text(), (token, file)


def test_the_number_checker_catches_a_measurement():
    text = "v6 runs at 1.07× flash, 361.5 TFLOP/s, at N = 16,384 with d = 128 and 4 warps; `0.93` in code"
    assert [t for t in NUMBER.findall(prose(text)) if not allowed(t.rstrip(","))] == ["1.07", "361.5"]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_reach_files_and_headings(path):
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", docs.MARKER.sub("", text)):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        assert where.exists(), target
        if anchor and where.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", where.read_text(), flags=re.M)
            slugs = {slug(h) for h in headings}
            assert anchor in slugs, target


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_contents_list_names_every_section(path):
    """A page with a list of contents (a list of links to its own headings) lists every ``## `` section, in order."""
    text = docs.MARKER.sub("", path.read_text())
    listed = re.findall(r"^\* \[[^\]]+\]\(#([\w-]+)\)$", text, flags=re.M)
    if listed:
        assert listed == [slug(h) for h in re.findall(r"^## (.+)$", text, flags=re.M)]


def test_every_note_is_indexed():
    """docs/notes/README.md links every dated note, and every link there is a note."""
    notes = ROOT / "docs" / "notes"
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", (notes / "README.md").read_text()))
    assert linked == {p.name for p in notes.glob("[0-9]*.md")}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_name_real_benchmarks_and_files(path):
    text = path.read_text()
    for name in re.findall(r"python -m tinyflash\.bench ([a-z][\w-]*)", text):
        assert name in BENCHMARKS, name
    for file in re.findall(r"(?:figures|benchmarks|lessons|tests|docs)/[\w./-]+\.(?:csv|py|sh|md|png)", text):
        assert (ROOT / file).exists(), file


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES
    assert "```bash" in lines[:FIRST_SCREEN], "the first command belongs on the first screen"
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"{ci}\n" in README.read_text(), "the README's test command is the one CI runs"


def examples(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_numpy_example_runs():
    code = examples("python")[0]
    assert "import numpy" in code and "cuda" not in code
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) < 1e-12  # float64 against float64: rounding only


def test_readme_simulator_example_runs():
    """The bash example, with this interpreter for ``python``: the kernel v5 on numba's simulator."""
    (command,) = [c for c in examples("bash") if "NUMBA_ENABLE_CUDASIM=1" in c]
    code = re.search(r'python -c "(.*)"', command, flags=re.S).group(1)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) < 1e-5  # float32 against float64


@pytest.mark.gpu
def test_readme_pytorch_example_runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU for PyTorch")
    code = examples("python")[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
