"""The backward kernels, one file per version, and their registry (like ``tinyflash.forward.kernels``).

    tiling.py              who computes what in a block of v1, and where tiles live in shared memory
    rows.py                the two O(N·d) kernels around the main one: D = rowsum(dO ∘ O) before, dQ's scale after
    v1_atomic_dq.py        the main kernel on the CUDA cores: one block per key tile, dK_j and dV_j in registers,
                           dQ by atomics
    tensor_core_tiling.py  v2's tiling (the grid over K/V heads) and the argument types of v2 and v3
    v2_tensor_cores.py     the same on the tensor cores (float16, bfloat16), grouped-query heads summed in the block;
                           with FlexAttention's hooks (``tinyflash.flex_attention_backward``)
    flex_tile.py           those hooks: score_mod, its derivative and mask_mod on a warp's transposed tile, the
                           query tiles a block mask lists for a key tile
    hopper_tiling.py       v3's tiling: warpgroups of 64 keys, query tiles of 64 rows, swizzled tiles
    v3_wgmma.py            v2 on Hopper's warpgroup multiplies (wgmma), FlashAttention-3's backward
    wgmma_steps.py         the steps of the loop that v3 and v4 share: scores, P and dS, dSᵀ stored, dQ_i, the writes
    tma_tiling.py          v4's tiling: v3's warpgroups and a producer, stages, mbarriers, tensor maps
    v4_warp_specialized.py v3 warp-specialised: a producer warpgroup loads by TMA, the consumers only multiply

:data:`VERSIONS` registers each main kernel once, with what it takes, what it builds and how it is sized, and the
rules of which runs by default: ``cuda_attention_backward(kernel=...)``, ``tensor_core_attention_backward``, the
tests and the benchmark go through it.
"""

from __future__ import annotations

from functools import partial

from ...gpu.runtime import require_compute_capability
from ...host.registry import SIXTEEN_BIT, Default, KernelVersion, Registry
from ...warp_tile import MIN_COMPUTE_CAPABILITY
from . import hopper_tiling, tensor_core_tiling, tiling, tma_tiling, v1_atomic_dq, v2_tensor_cores, v3_wgmma, v4_warp_specialized

TENSOR_CORES = {"dtypes": SIXTEEN_BIT, "options": ("config", "deterministic")}  # v3, v4 refuse deterministic=True
MMA_SYNC_DIMS = {"max_head_dim": 256, "head_dims": tensor_core_tiling.HEAD_DIMS}  # v2: every multiple of 8 up to 256
WGMMA_DIMS = {"max_head_dim": 128, "head_dims": hopper_tiling.HEAD_DIMS}  # v3, v4: d = 64 and 128

# mma.sync on 16-bit inputs, cp.async, ldmatrix: a clear error on a GPU older than Ampere
TENSOR_CORES_NEEDED = partial(require_compute_capability, MIN_COMPUTE_CAPABILITY)


def _version(name, code, changed, **facts):
    return KernelVersion(name, code, changed, code.build, signature=getattr(code, "SIGNATURE", None),
                         flex_signature=getattr(code, "FLEX_SIGNATURE", None), **facts)


VERSIONS = Registry("backward kernel", (
    _version("v1", v1_atomic_dq, "one block per key tile and head; dK_j, dV_j in registers; P_ij recomputed from lse; "
             "dQ added with float32 atomics", tilings=(tiling.default_config, tiling.simulator_config),
             options=("config", "vector"), deterministic=("dk", "dv"), stage=2),
    _version("v2", v2_tensor_cores, "tensor cores: every product an mma.sync, a warp's keys as the mma rows so that Pᵀ "
             "and dSᵀ stay in registers for dV and dK; dS through shared memory for dQ (atomics, in key-tile order in "
             "deterministic mode); float16 and bfloat16, d a multiple of 8 up to 256 (padded to a multiple of "
             "32; past 128 two warps share a warp's keys, each with half of dK's and dV's columns); grouped-query "
             "heads summed in the block", tilings=(tensor_core_tiling.default_tiling, tensor_core_tiling.simulator_tiling),
             arguments="words", deterministic=("dq", "dk", "dv"), requirement=TENSOR_CORES_NEEDED, stage=3, flex=True,
             **TENSOR_CORES, **MMA_SYNC_DIMS),
    _version("v3", v3_wgmma, "Hopper's warpgroup multiplies (wgmma, FlashAttention-3's backward): a warpgroup's 64 keys "
             "as the rows of every product but dQ_i; Sᵀ, dPᵀ from shared memory, Pᵀ and dSᵀ from registers for dV, dK; "
             "dQ_i = dS K_j from the stored dSᵀ read transposed (trans-a); swizzled tiles; no deterministic mode; "
             "compute capability 9.0", tilings=(hopper_tiling.default_tiling, hopper_tiling.simulator_tiling),
             arguments="words", deterministic=("dk", "dv"), requirement=hopper_tiling.require_hopper, stage=4,
             **TENSOR_CORES, **WGMMA_DIMS),
    _version("v4", v4_warp_specialized, "warp specialisation (FlashAttention-3's backward structure): a producer "
             "warpgroup loads K_j, V_j and each Q_i, dO_i by TMA (lse_i, D_i by its first warp) into a ring of stages "
             "with full and empty mbarriers; the two consumer warpgroups only multiply, as in v3, and meet once per "
             "query tile at a named barrier for dSᵀ (two buffers); setmaxnreg moves registers to the consumers; query "
             "tiles of 128 rows at d = 64 (the warpgroups split dQ_i by rows); with the tiling's DQ_BY_TMA, dQ_i "
             "through shared memory and TMA reduce-adds; no deterministic mode; compute capability 9.0",
             tilings=(tma_tiling.default_tiling, tma_tiling.simulator_tiling), arguments="maps", deterministic=("dk", "dv"),
             requirement=hopper_tiling.require_hopper, stage=4, **TENSOR_CORES, **WGMMA_DIMS),
), defaults=(
    Default("cuda_attention_backward", "v1"),
    Default("tensor_core_attention_backward", "v2", when={"deterministic": True}),  # the one with that mode
    Default("tensor_core_attention_backward", "v4", capability=(9, 0)),  # Hopper: the fastest (docs/results.md),
    # at d = 64 and 128; v2 at the other head dims
    Default("tensor_core_attention_backward", "v2"),
    Default("flex_attention_backward", "v2"),  # FlexAttention's functions compiled in: v2's hooks (flex_bwd_tc)
))
