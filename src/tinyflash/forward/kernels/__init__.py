"""The forward's kernels, one file per version, and the registry that lists them.

Each version is a complete, runnable numba.cuda kernel computing what stage 1 (``tinyflash.forward.blocked``)
computes, with its names. A version imports ``tinyflash.core`` (the attention rules: the causal mask, the online
softmax's constants), ``tinyflash.gpu`` (the runtime: loads, shared memory, PTX), ``warp_tile``, ``warpgroup_tile``
and the tiling modules beside it; never a sibling version. So two neighbouring files differ by what changed between
them, and a learner can read, diff, run and time any of them:

    python -m tinyflash.bench versions       # check each version, then time them side by side

    tiling.py              v2-v5's register tiling: who computes what in a block, where tiles live
    v1 ... v5              stage 2, the CUDA cores (``tinyflash.cuda_attention``)
    tensor_core_tiling.py  v6's tiling: warps of 16-row tiles, key tiles, padded rows in shared memory
    v6_tensor_cores.py     stage 3, the tensor cores' mma.sync (``tinyflash.tensor_core_attention``); with
                           FlexAttention's hooks (``tinyflash.flex_attention``)
    block_sparse.py        the key tiles a block visits under a block mask (FlexAttention's layout)
    hopper_tiling.py       v7's tiling: warpgroups of 64 rows, 128-byte-swizzled tiles
    tma_tiling.py          v8-v10's: a ring of stages filled by TMA, a producer warpgroup
    v7 ... v10             stage 4: wgmma, TMA, warp specialisation, ping-pong (``tinyflash.hopper_attention``);
                           v10 with FlexAttention's hooks too (``tinyflash.flex_attention`` on Hopper)
    fp8_tiling.py          v11's: v10's on e4m3 bytes, and the pass that writes Vᵀ
    v11_fp8.py             stage 4 on float8_e4m3 inputs (``tinyflash.hopper_fp8_attention``)

:data:`VERSIONS` registers each version once, with what it takes, what it builds (``build``) and how it is sized
(``tilings``), and the rules of which runs by default (:class:`~tinyflash.host.registry.Default`):
``cuda_attention(kernel=...)``, ``tensor_core_attention``, ``hopper_attention``, the tests, the benchmark, the
lessons and the version table of docs/results.md all go through it.
"""

from __future__ import annotations

from functools import partial

from ...gpu.runtime import require_compute_capability
from ...host.registry import SIXTEEN_BIT, Default, KernelVersion, Registry
from ...warp_tile import HEAD_DIMS, MIN_COMPUTE_CAPABILITY
from ...warpgroup_tile import HEAD_DIMS as WARPGROUP_HEAD_DIMS
from ...warpgroup_tile import FP8_HEAD_DIMS
from . import (fp8_tiling, hopper_tiling, tensor_core_tiling, tiling, tma_tiling, v1_row_per_thread,
               v2_register_tiling, v3_unrolled_loads, v4_double_buffered, v5_branch_free, v6_tensor_cores, v7_wgmma,
               v8_tma, v9_warp_specialized, v10_ping_pong, v11_fp8)

E4M3 = "float8_e4m3fn"  # the FP8 inputs' dtype, by its NumPy (ml_dtypes) and PyTorch name
TILED = (tiling.default_config, tiling.simulator_config, tiling.small_config)  # v2-v5's tilings
HOPPER = {"dtypes": SIXTEEN_BIT, "head_dims": WARPGROUP_HEAD_DIMS, "requirement": hopper_tiling.require_hopper,
          "options": ("config",), "stage": 4}

# mma.sync on 16-bit inputs, cp.async, ldmatrix: a clear error on a GPU older than Ampere
TENSOR_CORES_NEEDED = partial(require_compute_capability, MIN_COMPUTE_CAPABILITY)


def _version(name, code, changed, **facts):
    return KernelVersion(name, code, changed, code.build, signature=getattr(code, "SIGNATURE", None),
                         flex_signature=getattr(code, "FLEX_SIGNATURE", None), **facts)


VERSIONS = Registry("kernel", (
    _version("v1", v1_row_per_thread, "one thread per query row; K_j, V_j shared through shared memory",
             tilings=(partial(v1_row_per_thread.tiling, simulator=False), partial(v1_row_per_thread.tiling,
                                                                                  simulator=True)), stage=2),
    _version("v2", v2_register_tiling, "register tiling: a block's threads split each Br × Bc tile of "
             "scores, TM rows × TN strided keys each; row maxima exchanged in shared memory", tilings=TILED,
             options=("config",), stage=2),
    _version("v3", v3_unrolled_loads, "full tiles loaded through registers, all loads in flight at once; "
             "mask only on tiles that need it; P·V two keys a step", tilings=TILED, options=("config",), stage=2),
    _version("v4", v4_double_buffered, "two sets of fragment registers: the next step's shared-memory loads "
             "in flight while the current one is multiplied", tilings=TILED, options=("config",), stage=2),
    _version("v5", v5_branch_free, "no branch inside the inner loops (last step peeled); K_j and V_j loads in "
             "flight together; float16 tiles read 4 elements per thread", tilings=TILED, options=("config", "vector"),
             stage=2),
    _version("v6", v6_tensor_cores, "tensor cores (stage 3): mma.sync on 16-bit inputs, P_ij kept in registers, "
             "ldmatrix fragment loads, K_j, V_j double-buffered with cp.async; float16 and bfloat16, d a multiple of 8 "
             "up to 256", tilings=(tensor_core_tiling.default_tiling, tensor_core_tiling.simulator_tiling),
             arguments="words", options=("config",), dtypes=SIXTEEN_BIT, head_dims=HEAD_DIMS,
             requirement=TENSOR_CORES_NEEDED, stage=3, flex=True),
    _version("v7", v7_wgmma, "Hopper's wgmma (stage 4): a warpgroup of 4 warps multiplies 64 query rows at once, "
             "asynchronously; Q_i, K_j, V_j read by the tensor cores from 128-byte-swizzled shared memory through "
             "descriptors, P_ij from registers; compute capability 9.0 only",
             tilings=(hopper_tiling.default_tiling, hopper_tiling.simulator_tiling), arguments="words", **HOPPER),
    _version("v8", v8_tma, "TMA: one thread asks the copy engine for each tile of Q_i, K_j, V_j, which lands "
             "swizzled in shared memory and completes on an mbarrier; a ring of stages (tensor maps from the host)",
             tilings=(tma_tiling.default_tiling, tma_tiling.simulator_tiling), arguments="maps", **HOPPER),
    _version("v9", v9_warp_specialized, "warp specialisation: a producer warpgroup issues every TMA copy, two "
             "consumer warpgroups multiply; full and empty mbarriers per stage; registers moved to the consumers "
             "(setmaxnreg)", tilings=(tma_tiling.default_specialised_tiling, tma_tiling.simulator_specialised_tiling),
             arguments="maps", **HOPPER),
    _version("v10", v10_ping_pong, "the softmax of tile j taken while the tensor cores multiply (S_ij and "
             "P_i,j-1 V_j-1 issued together, wait_group 1); the two consumer warpgroups take turns issuing their "
             "products (ping-pong, named barriers)",
             tilings=(tma_tiling.ping_pong_tiling, tma_tiling.simulator_specialised_tiling), arguments="maps",
             flex=True, **HOPPER),
    _version("v11", v11_fp8, "FP8: v10 on float8_e4m3 Q, K, V (m64nNk32 wgmma's), P_ij rounded to e4m3 in [0, 256] "
             "(a fixed offset from the row max), V transposed by a pass before the kernel, descales folded into the "
             "scale and the epilogue; bfloat16 out",
             tilings=(fp8_tiling.fp8_tiling, fp8_tiling.simulator_fp8_tiling), arguments="fp8 maps",
             dtypes=(E4M3,), head_dims=FP8_HEAD_DIMS, requirement=hopper_tiling.require_hopper, stage=4),
), defaults=(
    Default("cuda_attention", "v5"),  # the CUDA cores: the fastest version that takes every input
    Default("tensor_core_attention", "v6"),  # stage 3, on compute capability 8.0 on
    Default("hopper_attention", "v10"),  # stage 4: the fastest of v7-v10 (docs/results.md)
    # FlexAttention's functions compiled in (flex_fwd): v10's hooks on Hopper, at d = 64, 128, 256; else v6's
    Default("flex_attention", "v10", capability=hopper_tiling.COMPUTE_CAPABILITY),
    Default("flex_attention", "v6"),
    Default("hopper_fp8_attention", "v11"),  # e4m3 inputs on Hopper
))
# the versions on 16-bit (or wider) inputs, and those on e4m3 (hopper_fp8_attention's, with their own host steps)
FP8_VERSIONS = tuple(name for name, version in VERSIONS.items() if E4M3 in version.dtypes)
WIDER_VERSIONS = tuple(name for name in VERSIONS if name not in FP8_VERSIONS)
