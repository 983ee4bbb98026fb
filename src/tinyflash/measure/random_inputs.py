"""The random generator of the lessons: seeded, the seed printed, another seed on request.

Every lesson draws its inputs from :func:`lesson_rng`, so a learner's numbers are the same from
run to run and the same as a classmate's. ``TINYFLASH_SEED=7 python lessons/03_blocked_attention.py``
draws other inputs (the tests run every lesson with another seed too: the lessons' checks hold
for any seed). The tests' fixtures read the same variable to replay a seed.
"""

from __future__ import annotations

import os

import numpy as np

SEED_VARIABLE = "TINYFLASH_SEED"
LESSON_SEED = 2022  # the lessons' default seed (the year FlashAttention was published)


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
