"""The checks of a FlexAttention backward call on the tensor cores (``tinyflash.flex_attention_backward``, backward
v2's ``flex_bwd_tc``): the user's functions, the inputs, the block mask's transposed lists and the tiling, before
the GPU is looked up; then what the kernel reads of the block mask.

The user's functions are compiled into the kernel as in the forward (``host/flex.py``, ``gpu.user_code``), and
score_mod with its derivative beside it (``core.dual_source``): the kernel is built per (tiling, element type,
score_mod, mask_mod, block mask or not) and kept by the version's cache. The backward's block owns a key tile and
walks the query tiles that see it, so it reads the block mask's transposed lists (``q_num_blocks``, ``q_indices``,
``full_q_num_blocks``, ``full_q_indices``): a kernel key tile of Bc keys must lie in one of the mask's key tiles
(block_k a multiple of Bc) and each of its query tiles hold whole kernel query tiles (block_q a multiple of Br):
the version's tiling is shrunk to fit where it does not (:func:`fitted_tiling`).
The three launches (D = rowsum(dO ∘ O), the main kernel, dQ's scale) are the backward's own
(``backward/tensor_cores.py``), through numba's launches.
"""

from __future__ import annotations

import math
import weakref
from functools import lru_cache
from dataclasses import dataclass, replace

import numpy as np

from ..core.checks import AttentionProblem
from ..core.dual_source import value_and_derivative
from ..core.mods import check_heads_layout
from ..gpu.launch import MAX_GRID_Y
from ..gpu.runtime import require_gpu, simulator_enabled
from ..gpu.user_code import UserFunction, check_constant_bytes
from ..warp_tile import head_dims_text
from .flex import block_mask_rule, check_block_mask, user_function
from .inputs import backward_arrays
from .registry import KernelVersion, Registry

# the block mask's transposed lists, as the backward kernel reads them (backward/kernels/flex_tile.py)
QUERY_LISTS = ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")
_on_gpu = weakref.WeakKeyDictionary()  # block mask -> its transposed lists on the GPU (while the block mask lives)
_NO_LISTS: dict = {}  # the lists of a call without a block mask, on the GPU


@dataclass(frozen=True)
class FlexBackwardPlan:
    """What a call is checked into: the problem, the 16-bit type, the main kernel and its tiling, the user's
    functions (None where absent), the block mask's transposed lists (None without one)."""

    prob: AttentionProblem
    element: str
    version: KernelVersion
    config: object
    score_mod: UserFunction | None
    mask_mod: UserFunction | None
    lists: list | None
    heads: int  # H, the query heads per batch (b = head // H, h = head % H)


def plan_flex_backward(registry: Registry, who: str, arrays, score_mod, mask_mod, block_mask, causal, scale,
                       kernel=None, config=None) -> FlexBackwardPlan:
    """Check everything a call gives (a TypeError or ValueError names the argument), then the GPU; choose the
    version (among those with FlexAttention's hooks) and its tiling."""
    score, mask = user_function(score_mod, "score_mod", 5), user_function(mask_mod, "mask_mod", 4)
    if score is not None:  # its derivative by source transformation: a TypeError now if the kernel could not have it
        check_derivative(score)
    flex_versions = [name for name, v in registry.items() if v.flex]
    if kernel is not None:
        registry.choose(kernel, who, among=flex_versions)
    (q, k, v, o, lse, do), _, element, prob = backward_arrays(
        arrays, causal, scale, who, "tinyflash.blocked_attention_backward takes score_mod and mask_mod in float32 and "
        "float64")
    version = registry[kernel] if kernel else registry.default(who)
    if prob.d != prob.d_v or not version.accepts(element, prob.d, prob.d_v):
        raise ValueError(f"{who} supports d = dv {head_dims_text(version.head_dims)}; got q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)}")
    (B, H) = check_heads_layout(tuple(prob.lead), who)
    heads = math.prod(prob.lead)
    if heads // prob.kv_group > MAX_GRID_Y:
        raise ValueError(f"{who} takes at most {MAX_GRID_Y} batch · K/V heads (one launch); got "
                         f"{heads // prob.kv_group}")
    lists = None
    if block_mask is not None:
        check_block_mask(block_mask, B, H, prob.n_q, prob.n_k, prob.causal)  # its forward lists and shape
        lists = check_query_lists(block_mask, prob.n_q, prob.n_k)
        mask = block_mask_rule(block_mask, mask, mask_mod, prob.causal)
    check_constant_bytes({"score_mod": score, "mask_mod": mask})
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    version.requirement(who)
    on_gpu, on_simulator = version.tilings
    cfg = (config or (on_simulator if simulator_enabled() else on_gpu)(prob.d)).validate()
    if cfg.D != prob.d:
        raise ValueError(f"config {cfg} is for d = {cfg.D}; got d = {prob.d}")
    if block_mask is not None and config is None:
        cfg = fitted_tiling(cfg, int(block_mask.block_q), int(block_mask.block_k))
    if block_mask is not None and (block_mask.block_q % cfg.BR or block_mask.block_k % cfg.BC):
        raise ValueError(f"block_mask's block_q = {block_mask.block_q} must be a multiple of the backward kernel's "
                         f"query tile Br = {cfg.BR} and its block_k = {block_mask.block_k} a multiple of its key tile "
                         f"Bc = {cfg.BC} (tiling {cfg}): build the block mask with such sizes, or pass a config")
    return FlexBackwardPlan(prob, element, version, cfg, score, mask, lists, H)


@lru_cache(maxsize=256)
def check_derivative(score: UserFunction) -> None:
    """A TypeError naming score_mod if its derivative cannot be made by source transformation (``core.dual_source``);
    once per distinct function (a call in a training loop does not read its source again)."""
    value_and_derivative(score.fn, "score_mod")


def fitted_tiling(cfg, block_q: int, block_k: int):
    """The version's tiling ``cfg``, or if a block mask of block_q × block_k does not fit it (block_q a multiple of
    Br, block_k of Bc) the first valid one with fewer warps (a shorter key tile) or shorter query tiles that fits:
    FlexAttention's 128 × 128 fits the default tilings as they are, smaller blocks take smaller tiles."""
    if block_q % cfg.BR == 0 and block_k % cfg.BC == 0:
        return cfg
    for warps in sorted({cfg.WARPS, 8, 4, 2, 1}, reverse=True):
        for br in sorted({cfg.BR, 64, 32, 16}, reverse=True):
            smaller = replace(cfg, WARPS=warps, BR=br)
            if warps <= cfg.WARPS and br <= cfg.BR and not smaller.problems() and not (
                    block_q % smaller.BR or block_k % smaller.BC):
                return smaller
    return cfg  # none fits: the caller says so


def check_query_lists(bm, n_q: int, n_k: int) -> list:
    """The block mask's transposed lists, checked: (Bm, Hm, Tc) and (Bm, Hm, Tc, Tr) int arrays, as its forward
    lists are laid out, each listing 0 .. Tr query tiles in [0, Tr), ascending (the kernel takes a listed last
    query tile to be its list's last): else a ValueError, before a kernel could read rows past Nq."""
    missing = [name for name in QUERY_LISTS if not hasattr(bm, name)]
    if missing:
        raise TypeError(f"block_mask must be a tinyflash.BlockMask with the transposed lists the backward walks; "
                        f"got {type(bm).__name__}, without {', '.join(missing)}")
    Tr, Tc = -(-n_q // int(bm.block_q)), -(-n_k // int(bm.block_k))
    lists = [np.asarray(getattr(bm, name)) for name in QUERY_LISTS]
    lead = tuple(np.shape(bm.kv_num_blocks)[:2])
    want = [(*lead, Tc), (*lead, Tc, Tr)] * 2
    if [a.shape for a in lists] != want or any(a.dtype.kind not in "iu" for a in lists):
        raise ValueError(f"block_mask's transposed lists ({', '.join(QUERY_LISTS)}) must be int arrays of shapes "
                         f"{want[0]} and {want[1]}; got {[a.shape for a in lists]}")
    for name, num, idx in (("q", lists[0], lists[1]), ("full_q", lists[2], lists[3])):
        valid = np.arange(Tr) < num[..., None]  # (Bm, Hm, Tc, Tr) the listed entries
        rising = np.diff(idx.astype(np.int64), axis=-1) > 0
        if (num < 0).any() or (num > Tr).any() or ((idx < 0) | (idx >= Tr))[valid].any() or (
                ~rising & valid[..., 1:]).any():
            raise ValueError(f"block_mask's {name}_num_blocks and {name}_indices must list 0 to Tr = {Tr} query tiles "
                             f"per key tile, each in [0, {Tr}), ascending (as tinyflash.create_block_mask builds them)")
    return lists


def block_mask_scalars(plan: FlexBackwardPlan, bm) -> dict:
    """What the kernel reads of the block mask (``flex_tile.BM_FIELDS``): the flat transposed lists (on the GPU,
    once per block mask), the strides of a batch and a head in them (0 where the mask broadcasts), Tr, block_k, the
    kernel query tiles per query tile of the mask (SUB) and in its last one (LAST_SUB), the query heads per batch;
    without a block mask, lists of one zero that the kernel never reads."""
    device = not simulator_enabled()
    if bm is None:
        zero = np.zeros(1, dtype=np.int32)
        if device:
            from numba import cuda

            if "none" not in _NO_LISTS:
                _NO_LISTS["none"] = cuda.to_device(zero)
            zero = _NO_LISTS["none"]
        return {"Q_NUM": zero, "Q_IDX": zero, "FULL_Q_NUM": zero, "FULL_Q_IDX": zero, "bm_batch": 0, "bm_head": 0,
                "bm_tr": 1, "bm_block_k": 1, "bm_sub": 1, "bm_last_sub": 1, "heads": plan.heads}
    Bm, Hm, Tc, Tr = plan.lists[1].shape
    flat_lists = [np.array(a, dtype=np.int32).reshape(-1) for a in plan.lists]  # a copy: the lists are read-only
    if device:
        from numba import cuda

        if bm not in _on_gpu:
            _on_gpu[bm] = [cuda.to_device(a) for a in flat_lists]
        flat_lists = _on_gpu[bm]
    last_rows = plan.prob.n_q - (Tr - 1) * bm.block_q  # query rows in the mask's last query tile
    return {**dict(zip(("Q_NUM", "Q_IDX", "FULL_Q_NUM", "FULL_Q_IDX"), flat_lists)),
            "bm_batch": Hm * Tc if Bm > 1 else 0, "bm_head": Tc if Hm > 1 else 0, "bm_tr": Tr,
            "bm_block_k": int(bm.block_k), "bm_sub": bm.block_q // plan.config.BR,
            "bm_last_sub": -(-last_rows // plan.config.BR), "heads": plan.heads}
