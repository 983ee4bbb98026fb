"""Stage 2's kernels, one file per version, and the registry that lists them.

Each version is a complete, runnable numba.cuda kernel computing what stage 1
(``tinyflash.forward.blocked``) computes, with its names. A version imports ``tinyflash.core``
(the attention rules: the causal mask, the online softmax's constants), ``tinyflash.gpu`` (the
runtime: loads, shared memory, launch) and, for the register-tiled ones, ``tiling.py`` beside
it; never a sibling version. So two neighbouring files differ by what changed between them, and
a learner can read, diff, run and time any of them:

    python -m tinyflash.bench versions       # check each version, then time them side by side

:data:`VERSIONS` registers each version once; ``cuda_attention(kernel=...)``, the tests, the
benchmark, lesson 05 and the version table of docs/results.md all iterate over it. The later stages go
beside these: v6 is stage 3, the tensor cores (``tinyflash.tensor_core_attention``), which takes
float16 and bfloat16 and two head dims only (:meth:`KernelVersion.accepts` says what each version
takes); ``tinyflash/backward/`` the backward pass, ``tinyflash/decode/`` split-KV decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...warpgroup_tile import HEAD_DIMS as WARPGROUP_HEAD_DIMS
from . import (tensor_core_tiling, v1_row_per_thread, v2_register_tiling, v3_unrolled_loads, v4_double_buffered,
               v5_branch_free, v6_tensor_cores, v7_wgmma, v8_tma,
               v9_warp_specialized, v10_ping_pong)


@dataclass(frozen=True)
class KernelVersion:
    """One registered kernel version."""

    name: str  # "v1", "v2", ...: the order in which they were written
    module: str  # its file in tinyflash/forward/kernels/
    changed: str  # one line on what changed since the version before
    launch: Callable  # launch(args: LaunchArgs, prob: AttentionProblem, **options)
    options: tuple = ()  # keyword options its launch takes
    dtypes: tuple = (np.dtype(np.float16), "bfloat16", np.dtype(np.float32))  # input dtypes (computed in float32)
    max_head_dim: int = 256  # largest d and dv
    head_dims: tuple | None = None  # the only d (= dv) it takes, if it does not take every d up to max_head_dim
    sized_launch: Callable | None = None  # sized_launch(n_q, n_k, heads, scale·log2(e), causal, kv_group, element,
    # tiling) -> a launch through the driver that takes only the arrays (v6: the host's fast path)

    def accepts(self, dtype, d: int, d_v: int) -> bool:
        """Whether this version computes inputs of ``dtype`` (a NumPy dtype or 'bfloat16') and head dims d, dv."""
        name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
        dims_ok = (d == d_v and d in self.head_dims) if self.head_dims else max(d, d_v) <= self.max_head_dim
        return name in [dt if isinstance(dt, str) else dt.name for dt in self.dtypes] and dims_ok


def _version(name, module, changed, options=(), **limits):
    return KernelVersion(name, module.__name__.rsplit(".", 1)[-1] + ".py", changed, module.launch, options, **limits,
                         sized_launch=getattr(module, "driver_launch", None))


VERSIONS = {v.name: v for v in (
    _version("v1", v1_row_per_thread, "one thread per query row; K_j, V_j shared through shared memory"),
    _version("v2", v2_register_tiling, "register tiling: a block's threads split each Br × Bc tile of "
             "scores, TM rows × TN strided keys each; row maxima exchanged in shared memory", ("config",)),
    _version("v3", v3_unrolled_loads, "full tiles loaded through registers, all loads in flight at once; "
             "mask only on tiles that need it; P·V two keys a step", ("config",)),
    _version("v4", v4_double_buffered, "two sets of fragment registers: the next step's shared-memory loads "
             "in flight while the current one is multiplied", ("config",)),
    _version("v5", v5_branch_free, "no branch inside the inner loops (last step peeled); K_j and V_j loads in "
             "flight together; float16 tiles read 4 elements per thread", ("config", "vector")),
    _version("v6", v6_tensor_cores, "tensor cores (stage 3): mma.sync on 16-bit inputs, P_ij kept in registers, "
             "ldmatrix fragment loads, K_j, V_j double-buffered with cp.async; float16 and bfloat16, d a multiple of 8 up "
             "to 256", ("config",), dtypes=(np.dtype(np.float16), "bfloat16"), max_head_dim=256,
             head_dims=tensor_core_tiling.HEAD_DIMS),
    _version("v7", v7_wgmma, "Hopper's wgmma (stage 4): a warpgroup of 4 warps multiplies 64 query rows at once, "
             "asynchronously; Q_i, K_j, V_j read by the tensor cores from 128-byte-swizzled shared memory through "
             "descriptors, P_ij from registers; compute capability 9.0 only", ("config",),
             dtypes=(np.dtype(np.float16), "bfloat16"), max_head_dim=256, head_dims=WARPGROUP_HEAD_DIMS),
    _version("v8", v8_tma, "TMA: one thread asks the copy engine for each tile of Q_i, K_j, V_j, which lands "
             "swizzled in shared memory and completes on an mbarrier; a ring of stages (tensor maps from the host)",
             ("config",), dtypes=(np.dtype(np.float16), "bfloat16"), max_head_dim=256,
             head_dims=WARPGROUP_HEAD_DIMS),
    _version("v9", v9_warp_specialized, "warp specialisation: a producer warpgroup issues every TMA copy, two "
             "consumer warpgroups multiply; full and empty mbarriers per stage; registers moved to the consumers "
             "(setmaxnreg)", ("config",), dtypes=(np.dtype(np.float16), "bfloat16"), max_head_dim=256,
             head_dims=WARPGROUP_HEAD_DIMS),
    _version("v10", v10_ping_pong, "the softmax of tile j taken while the tensor cores multiply (S_ij and "
             "P_i,j-1 V_j-1 issued together, wait_group 1); the two consumer warpgroups take turns issuing their "
             "products (ping-pong, named barriers)", ("config",), dtypes=(np.dtype(np.float16), "bfloat16"),
             max_head_dim=256, head_dims=WARPGROUP_HEAD_DIMS),
)}
LATEST = "v5"  # what cuda_attention runs unless told otherwise


def get(name: str | None = None) -> KernelVersion:
    """The registered version ``name`` (None: :data:`LATEST`); a ValueError names the versions."""
    if name is None:
        name = LATEST
    if name not in VERSIONS:
        raise ValueError(f"kernel must be one of {', '.join(VERSIONS)} (None: {LATEST}); got {name!r}")
    return VERSIONS[name]


def version_table() -> str:
    """The table of kernel versions, as Markdown: each version's file and what it changed (lesson 05 prints it)."""
    lines = ["| version | file | what changed |", "|---|---|---|"]
    lines += [f"| {v.name} | `{v.module}` | {v.changed} |" for v in VERSIONS.values()]
    return "\n".join(lines)
