"""The lessons' one helper: where the kernels run, seeded inputs, the committed measurements, printing code.

Every lesson imports ``tinyflash`` (the book: the package's modules) and this file, nothing of the
tooling (``tinyflash.bench``, ``tinyflash.plots``). What is here is lesson machinery, not attention:

* :func:`use_gpu_or_simulator` decides, before numba is imported, where the kernels run;
* :func:`lesson_rng` draws the lessons' inputs from a seeded generator and prints the seed, so a
  learner's numbers are the same from run to run; ``TINYFLASH_SEED=7 python lessons/03_blocked_attention.py``
  draws others (the tests run every lesson with another seed too: its checks hold for any seed);
* :func:`record` reads the measurements committed in ``figures/data/`` (the lessons read, never measure, the H200);
* :func:`excerpt` and :func:`show` print lines of the package's source, so that what a lesson shows is what runs;
* :func:`num` prints a number, or '–' where there is none.
"""

from __future__ import annotations

import csv
import inspect
import math
import os
import textwrap
from pathlib import Path

import numpy as np

from tinyflash.gpu.where import use_gpu_or_simulator  # noqa: F401  (imports no numba)

SEED_VARIABLE = "TINYFLASH_SEED"
LESSON_SEED = 2022  # the lessons' default seed (the year FlashAttention was published)
RECORD = Path(__file__).resolve().parent.parent / "figures" / "data"


def lesson_seed() -> int:
    """The seed a lesson uses: TINYFLASH_SEED if set, else :data:`LESSON_SEED`."""
    text = os.environ.get(SEED_VARIABLE, "").strip()
    try:
        return int(text) if text else LESSON_SEED
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be a non-negative integer; got {text!r}") from None


def lesson_rng() -> np.random.Generator:
    """A generator seeded with :func:`lesson_seed`; prints the seed and how to change it."""
    seed = lesson_seed()
    print(f"random seed {seed} (set {SEED_VARIABLE}=<integer> for other inputs)")
    return np.random.default_rng(seed)


def record(name: str) -> list[dict]:
    """The rows of ``figures/data/<name>.csv`` (every field a string)."""
    with open(RECORD / f"{name}.csv", newline="") as f:
        return list(csv.DictReader(f))


def excerpt(fn, first: str, last: str) -> str:
    """The lines of fn's source from the one containing ``first`` to the one containing ``last``."""
    lines = inspect.getsource(fn).splitlines()
    i = next(n for n, line in enumerate(lines) if first in line)
    j = next(n for n, line in enumerate(lines[i:], i) if last in line)
    return textwrap.dedent("\n".join(lines[i:j + 1]))


def show(title: str, code: str) -> None:
    """Print ``code`` under ``title``, each line marked as source."""
    print(f"\n--- {title}\n" + textwrap.indent(code, "  | ", predicate=lambda _line: True))


def num(x, spec: str = ".1f", width: int = 0) -> str:
    """``x`` formatted by ``spec``, or '–' for None, '' or NaN (a measurement that does not exist)."""
    missing = x is None or x == "" or (isinstance(x, float) and math.isnan(x))
    return f"{'–' if missing else format(float(x), spec):>{width}}"
