"""The backward kernels, one file per version, and their registry (like ``tinyflash.forward.kernels``).

    tiling.py          who computes what in a block, and where tiles live in shared memory
    rows.py            the two O(N·d) kernels around the main one: D = rowsum(dO ∘ O) before, dQ's scale after
    v1_atomic_dq.py    the main kernel: one block per key tile, dK_j and dV_j in registers, dQ by atomics

:data:`VERSIONS` registers each main kernel once; ``cuda_attention_backward(kernel=...)``, the
tests and the benchmark iterate over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import v1_atomic_dq


@dataclass(frozen=True)
class BackwardVersion:
    """One registered backward kernel version."""

    name: str
    module: str  # its file in tinyflash/backward/kernels/
    changed: str  # what it does, or what changed since the version before
    launch: Callable  # launch(args: LaunchArgs, prob: AttentionProblem, **options)
    options: tuple = ()
    deterministic: tuple = ("dk", "dv")  # the gradients that are bitwise identical from run to run
    max_head_dim: int = 256


VERSIONS = {v.name: v for v in (
    BackwardVersion("v1", "v1_atomic_dq.py", "one block per key tile and head; dK_j, dV_j in registers; P_ij "
                    "recomputed from lse; dQ added with float32 atomics", v1_atomic_dq.launch, ("config", "vector")),
)}
LATEST = "v1"


def get(name: str | None = None) -> BackwardVersion:
    """The registered version ``name`` (None: :data:`LATEST`); a ValueError names the versions."""
    name = LATEST if name is None else name
    if name not in VERSIONS:
        raise ValueError(f"kernel must be one of {', '.join(VERSIONS)} (None: {LATEST}); got {name!r}")
    return VERSIONS[name]
