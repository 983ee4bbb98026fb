"""The backward kernels, one file per version, and their registry (like ``tinyflash.forward.kernels``).

    tiling.py              who computes what in a block of v1, and where tiles live in shared memory
    rows.py                the two O(N·d) kernels around the main one: D = rowsum(dO ∘ O) before, dQ's scale after
    v1_atomic_dq.py        the main kernel on the CUDA cores: one block per key tile, dK_j and dV_j in registers,
                           dQ by atomics
    tensor_core_tiling.py  v2's tiling and the tensor-core kernels' launch (the grid over K/V heads; v3's too)
    v2_tensor_cores.py     the same on the tensor cores (float16, bfloat16), grouped-query heads summed in the block
    hopper_tiling.py       v3's tiling: warpgroups of 64 keys, query tiles of 64 rows, swizzled tiles
    v3_wgmma.py            v2 on Hopper's warpgroup multiplies (wgmma), FlashAttention-3's backward
    wgmma_steps.py         the steps of the loop that v3 and v4 share: scores, P and dS, dSᵀ stored, dQ_i, the writes
    tma_tiling.py          v4's tiling and host side: v3's warpgroups and a producer, stages, mbarriers, tensor maps
    v4_warp_specialized.py v3 warp-specialised: a producer warpgroup loads by TMA, the consumers only multiply

:data:`VERSIONS` registers each main kernel once; ``cuda_attention_backward(kernel=...)``, the
tests and the benchmark iterate over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import hopper_tiling, tensor_core_tiling, tma_tiling, v1_atomic_dq, v2_tensor_cores, v3_wgmma, v4_warp_specialized


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
    dtypes: tuple = (np.dtype(np.float16), "bfloat16", np.dtype(np.float32))  # input dtypes (computed in float32)
    head_dims: tuple | None = None  # the only d (= dv) it takes, if it does not take every d up to max_head_dim
    # driver_launches(n_q, n_k, heads, kv_group, scale, causal, element, tiling, deterministic): the kernels sized
    # for one problem, launched through the driver (gpu/driver_launch.py); None where there is no such path
    driver_launches: Callable | None = None


VERSIONS = {v.name: v for v in (
    BackwardVersion("v1", "v1_atomic_dq.py", "one block per key tile and head; dK_j, dV_j in registers; P_ij "
                    "recomputed from lse; dQ added with float32 atomics", v1_atomic_dq.launch, ("config", "vector")),
    BackwardVersion("v2", "v2_tensor_cores.py", "tensor cores: every product an mma.sync, a warp's keys as the "
                    "mma rows so that Pᵀ and dSᵀ stay in registers for dV and dK; dS through shared memory for dQ "
                    "(atomics, in key-tile order in deterministic mode); float16 and bfloat16, d = 64 or 128; "
                    "grouped-query heads summed in the block",
                    v2_tensor_cores.launch, ("config", "element", "deterministic"), max_head_dim=128,
                    dtypes=(np.dtype(np.float16), "bfloat16"), head_dims=tensor_core_tiling.HEAD_DIMS,
                    driver_launches=v2_tensor_cores.driver_launches),
    BackwardVersion("v3", "v3_wgmma.py", "Hopper's warpgroup multiplies (wgmma, FlashAttention-3's backward): a "
                    "warpgroup's 64 keys as the rows of every product but dQ_i; Sᵀ, dPᵀ from shared memory, Pᵀ and "
                    "dSᵀ from registers for dV, dK; dQ_i = dS K_j from the stored dSᵀ read transposed (trans-a); "
                    "swizzled tiles; no deterministic mode; compute capability 9.0",
                    v3_wgmma.launch, ("config", "element", "deterministic"), deterministic=("dk", "dv"),
                    max_head_dim=128, dtypes=(np.dtype(np.float16), "bfloat16"), head_dims=hopper_tiling.HEAD_DIMS,
                    driver_launches=v3_wgmma.driver_launches),
    BackwardVersion("v4", "v4_warp_specialized.py", "warp specialisation (FlashAttention-3's backward structure): a "
                    "producer warpgroup loads K_j, V_j and each Q_i, dO_i by TMA (lse_i, D_i by its first warp) into "
                    "a ring of stages with full and empty mbarriers; the two consumer warpgroups only multiply, as "
                    "in v3, and meet once per query tile at a named barrier for dSᵀ (two buffers); setmaxnreg "
                    "moves registers to the consumers; query tiles of 128 rows at d = 64 (the warpgroups split dQ_i "
                    "by rows); with the tiling's DQ_BY_TMA, dQ_i through shared memory and TMA reduce-adds; no "
                    "deterministic mode; compute capability 9.0",
                    v4_warp_specialized.launch, ("config", "element", "deterministic"), deterministic=("dk", "dv"),
                    max_head_dim=128, dtypes=(np.dtype(np.float16), "bfloat16"), head_dims=tma_tiling.HEAD_DIMS,
                    driver_launches=v4_warp_specialized.driver_launches),
)}
LATEST = "v1"


def get(name: str | None = None) -> BackwardVersion:
    """The registered version ``name`` (None: :data:`LATEST`); a ValueError names the versions."""
    name = LATEST if name is None else name
    if name not in VERSIONS:
        raise ValueError(f"kernel must be one of {', '.join(VERSIONS)} (None: {LATEST}); got {name!r}")
    return VERSIONS[name]
