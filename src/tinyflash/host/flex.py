"""The steps of a FlexAttention call on the tensor cores (``tinyflash.flex_attention``: v10's ``flex_fwd`` on Hopper,
v6's elsewhere): check the user's functions, the inputs and the block mask, choose the tiling, allocate, launch.

The user's functions are compiled into the kernel (``gpu.user_code``): the kernel is built per (tiling, element
type, block order, score_mod, mask_mod, block mask or not) and kept by the version's own cache, in which a
function counts by its code and the values it reads from outside. Device arrays on a GPU (PyTorch, CuPy, numba)
are launched through the driver, the launch sized once per problem (``host.sized.sized_flex``: the kernel loaded
once, v10's tensor maps kept by the arrays' addresses), on the stream the caller's library works on; NumPy arrays
(copied to the GPU and back) and numba's simulator go through numba's launches (``gpu/launch.py``), v10's tensor
maps made for each launch. The block mask's lists go to the GPU once per block mask and stay there while it lives.

Without a block mask, a mask_mod is evaluated on every key tile a query tile visits (all of them, or with causal
those up to the diagonal): no block mask is built on the host, where evaluating the mask for every (b, h, q, k)
costs more than the kernel saves for the sizes a simulator runs, and at a GPU's sizes would take minutes of Python.
A caller who wants the empty tiles skipped builds the block mask once (``tinyflash.create_block_mask``) and passes
it to every call.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace

import numpy as np

from ..core.mods import check_heads_layout, check_mod
from ..core.online_softmax import LOG2E
from ..gpu.arrays import current_stream, empty, result
from ..gpu.launch import MAX_GRID_Y, LaunchArgs, launch
from ..gpu.runtime import require_gpu, simulator_enabled
from ..gpu.tensor_map import tensor_maps
from ..gpu.user_code import UserFunction, check_constant_bytes
from .forward import Entry, check_call
from .inputs import FLOAT16, as_words, flat, flat16, placed
from .launch import on_the_gpu, simulated_warps
from .sized import sized_flex

# the block mask's lists, as a kernel reads them (forward/kernels/block_sparse.py)
LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
_on_gpu = weakref.WeakKeyDictionary()  # block mask -> its lists on the GPU (while the block mask lives)
_NO_LISTS: dict = {}  # the lists of a call without a block mask, on the GPU
_listed_ok = weakref.WeakKeyDictionary()  # block masks whose lists were checked (check_lists), while they live


def user_function(fn, name: str, arity: int) -> UserFunction | None:
    """``fn`` (None, or a function of ``arity`` positional arguments: ``core.mods.check_mod``, the NumPy stages'
    rule) as the kernel takes it, keyed by its code and what it reads (a TypeError names ``name`` otherwise)."""
    fn = check_mod(fn, name, arity)
    return None if fn is None else UserFunction.of(fn, name)


def check_block_mask(bm, B: int, H: int, n_q: int, n_k: int, causal: bool):
    """The block mask's lists, checked against the call: (B or 1, H or 1, Tr) and (..., Tr, Tc) int arrays for Nq
    queries and Nk keys in tiles of its block_q × block_k, and, where it says so, built for this call's ``causal``.
    A TypeError or ValueError names ``block_mask`` otherwise."""
    missing = [name for name in (*LISTS, "block_q", "block_k") if not hasattr(bm, name)]
    if missing:
        raise TypeError(f"block_mask must be a tinyflash.BlockMask (tinyflash.create_block_mask) or None; got "
                        f"{type(bm).__name__}, without {', '.join(missing)}")
    block_q, block_k = bm.block_q, bm.block_k
    if not all(isinstance(x, (int, np.integer)) and x > 0 for x in (block_q, block_k)):
        raise ValueError(f"block_mask's block_q and block_k must be positive ints; got {block_q!r}, {block_k!r}")
    Tr, Tc = -(-n_q // int(block_q)), -(-n_k // int(block_k))
    lists = [np.asarray(getattr(bm, name)) for name in LISTS]
    Bm, Hm = lists[0].shape[:2] if lists[0].ndim == 3 else (None, None)
    want = [(Bm, Hm, Tr), (Bm, Hm, Tr, Tc)] * 2
    if Bm not in (1, B) or Hm not in (1, H) or [a.shape for a in lists] != want or any(
            a.dtype.kind not in "iu" for a in lists):
        raise ValueError(f"block_mask does not fit this call: for (B, H) = ({B}, {H}), Nq = {n_q}, Nk = {n_k} in tiles "
                         f"of block_q = {block_q}, block_k = {block_k} its lists must be int arrays of shapes (B or 1, "
                         f"H or 1, {Tr}) and (B or 1, H or 1, {Tr}, {Tc}); got {[a.shape for a in lists]}")
    if bm not in _listed_ok:
        check_lists(lists, Tc)
        _listed_ok[bm] = True
    shape = tuple(getattr(bm, "shape", (Bm, Hm, n_q, n_k)))
    if shape[2:] != (n_q, n_k):
        raise ValueError(f"block_mask was built for Nq = {shape[2]}, Nk = {shape[3]}; the call has Nq = {n_q}, "
                         f"Nk = {n_k}")
    if getattr(bm, "causal", causal) != causal:
        raise ValueError(f"block_mask was built with causal={bm.causal}; the call has causal={causal}")
    return lists


def check_lists(lists, Tc: int) -> None:
    """Each list of the block mask holds 0 .. Tc key tiles, in [0, Tc), ascending (the kernel takes a listed last
    key tile to be its list's last): else a ValueError, before a kernel could read keys past Nk."""
    for name, num, idx in (("kv", lists[0], lists[1]), ("full_kv", lists[2], lists[3])):
        valid = np.arange(Tc) < num[..., None]  # (Bm, Hm, Tr, Tc) the listed entries
        rising = np.diff(idx.astype(np.int64), axis=-1) > 0  # (Bm, Hm, Tr, Tc - 1)
        if (num < 0).any() or (num > Tc).any() or ((idx < 0) | (idx >= Tc))[valid].any() or (
                ~rising & valid[..., 1:]).any():
            raise ValueError(f"block_mask's {name}_num_blocks and {name}_indices must list 0 to Tc = {Tc} key tiles "
                             f"per query tile, each in [0, {Tc}), ascending (as tinyflash.create_block_mask builds them)")


def block_mask_rule(bm, mask: UserFunction | None, mask_mod, causal: bool) -> UserFunction | None:
    """The mask_mod of a block mask's partial tiles, as the NumPy stages take it (``core.block_mask``): the call's,
    or the block mask's own if the call gives none; the same function or one of them, and one at all if a partial
    tile needs it (else a ValueError)."""
    own = getattr(bm, "mask_mod", None)
    if mask_mod is not None and own is not None and mask_mod is not own:
        raise ValueError("mask_mod differs from the block_mask's own mask_mod: give one of them, or the same function")
    if mask is None and own is not None:
        mask = user_function(own, "block_mask.mask_mod", 4)
    if mask is None and not causal and int(np.asarray(bm.kv_num_blocks).sum()) > 0:
        raise ValueError("block_mask has partial tiles but neither mask_mod nor causal says which of their keys to "
                         "keep: pass mask_mod")
    return mask


def fitted_tiling(cfg, block_q: int, block_k: int, config_given: bool):
    """The tiling for a block mask of block_q × block_k: its key tile Bc must divide block_k and its query tile Br
    divide block_q (a block lies in one of the mask's query tiles, and walks its key tiles in whole kernel tiles).
    A tiling of the version's own is shrunk to fit (``cfg.for_block_mask``); one the call gave is only checked."""
    fitted = cfg if config_given else cfg.for_block_mask(block_q, block_k)
    if fitted is None or block_q % fitted.BR or block_k % fitted.BC:
        raise ValueError(f"block_mask's block_q = {block_q} must be a multiple of the kernel's query tile Br = "
                         f"{cfg.BR} and its block_k = {block_k} a multiple of its key tile Bc = {cfg.BC} (tiling "
                         f"{cfg}): build the block mask with such sizes, or pass a config that fits it")
    return fitted


def block_mask_scalars(lists, bm, n_k: int, H: int, cfg, device: bool) -> dict:
    """What the kernel reads of the block mask (``block_sparse.BM_FIELDS``): the flat lists (on the GPU, once per
    block mask, if ``device``), the strides of a batch and a head in them (0 where the mask broadcasts), Tc,
    block_q, the kernel tiles per key tile (SUB) and in the last key tile (LAST_SUB)."""
    Bm, Hm, Tr, Tc = lists[1].shape
    flat_lists = [np.array(a, dtype=np.int32).reshape(-1) for a in lists]  # a copy: the lists are read-only
    if device:
        from numba import cuda

        if bm not in _on_gpu:
            _on_gpu[bm] = [cuda.to_device(a) for a in flat_lists]
        flat_lists = _on_gpu[bm]
    sub = bm.block_k // cfg.BC
    last_keys = n_k - (Tc - 1) * bm.block_k  # keys in the last key tile
    return {**dict(zip(("KV_NUM", "KV_IDX", "FULL_NUM", "FULL_IDX"), flat_lists)),
            "bm_batch": Hm * Tr if Bm > 1 else 0, "bm_head": Tr if Hm > 1 else 0, "bm_tc": Tc,
            "bm_block_q": int(bm.block_q), "bm_sub": sub, "bm_last_sub": -(-last_keys // cfg.BC), "heads": H}


def no_block_mask(H: int, device: bool) -> dict:
    """The kernel's block-mask arguments for a call without one: lists of one zero, never read (on the GPU, one
    device array for every call: a host array would be copied there and back at each launch); the heads per batch."""
    zero = np.zeros(1, dtype=np.int32)
    if device:
        if "none" not in _NO_LISTS:
            from numba import cuda

            _NO_LISTS["none"] = cuda.to_device(zero)
        zero = _NO_LISTS["none"]
    return {"KV_NUM": zero, "KV_IDX": zero, "FULL_NUM": zero, "FULL_IDX": zero, "bm_batch": 0, "bm_head": 0, "bm_tc": 1,
            "bm_block_q": 1, "bm_sub": 1, "bm_last_sub": 1, "heads": H}


def flex_call(entry: Entry, q, k, v, score_mod, mask_mod, block_mask, causal, scale, kernel=None, config=None):
    """A call of ``tinyflash.flex_attention``: check, allocate, launch. Returns ``(o, lse)``."""
    # 1. check the user's functions, the inputs and the block mask; choose the version and its tiling
    score, mask = user_function(score_mod, "score_mod", 5), user_function(mask_mod, "mask_mod", 4)
    prob, element, version, on_device = check_call(entry, q, k, v, causal, scale, kernel, flex=True)
    (B, H), heads = check_heads_layout(tuple(prob.lead), "flex_attention"), math.prod(prob.lead)
    if heads > MAX_GRID_Y:
        raise ValueError(f"flex_attention takes at most {MAX_GRID_Y} batch · heads (one launch); got {heads}")
    lists = None
    if block_mask is not None:
        lists = check_block_mask(block_mask, B, H, prob.n_q, prob.n_k, prob.causal)
        mask = block_mask_rule(block_mask, mask, mask_mod, prob.causal)
    check_constant_bytes({"score_mod": score, "mask_mod": mask})
    on_gpu, on_simulator = version.tilings
    cfg = config or (on_simulator(prob.d) if simulator_enabled() else on_gpu(prob.d, prob.causal, prob.n_q))
    if block_mask is not None:
        cfg = fitted_tiling(cfg, int(block_mask.block_q), int(block_mask.block_k), config is not None)
    if cfg.D != prob.d:
        raise ValueError(f"config {cfg} is for d = {cfg.D}; got d = {prob.d}")
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    version.requirement(entry.who)

    # 2. allocate the outputs (for device inputs, in the caller's array library)
    found, _ = placed({"q": q, "k": k, "v": v})
    q, k, v = found.values()
    like = q if on_device else None
    o = empty(like, heads * prob.n_q * prob.d, FLOAT16)  # (BH·Nq·d,) flat: 16-bit elements
    lse = empty(like, heads * prob.n_q, np.float32)  # (BH·Nq,)

    # 3. build the kernel for the call's functions, size the grid and launch
    if prob.n_q > 0 and heads > 0:
        n_q, n_k, d = prob.n_q, prob.n_k, prob.d
        device = not simulator_enabled()
        blocks = no_block_mask(H, device) if block_mask is None else block_mask_scalars(
            lists, block_mask, n_k, H, cfg, device)
        group = cfg.head_group(n_k, heads, prob.kv_group, prob.causal)
        scalars = {"n_q": n_q, "n_k": n_k, "scale_log2": np.float32(prob.scale * LOG2E), "scale": np.float32(prob.scale),
                   "causal": prob.causal, "kv_group": prob.kv_group, "head_group": group, **blocks}
        kernel_fn = version.build(cfg, element, group, score_mod=score, mask_mod=mask,
                                  block_sparse=block_mask is not None)
        if device and on_device and version.flex_signature is not None:  # (heads <= MAX_GRID_Y: checked above)
            # device arrays on a GPU: one launch through the driver, sized once per problem (tensor maps kept by
            # the arrays' addresses), on the stream the caller's library works on
            sized = sized_flex(version, kernel_fn, cfg, n_q, n_k, heads, prob.kv_group)
            sized({"Q": flat16(q), "K": flat16(k), "V": flat16(v), "O": o, "LSE": lse}, scalars,
                  stream=current_stream(q))
            return finish(o, lse, q, prob, element, on_device)
        # the block mask's arrays go with the scalars: every head's block reads them whole (one launch)
        args = LaunchArgs(arrays={"Q": (as_words(flat16(q)), n_q * d // 2), "K": (as_words(flat16(k)), n_k * d // 2),
                                  "V": (as_words(flat16(v)), n_k * d // 2), "O": (as_words(o), n_q * d // 2),
                                  "LSE": (flat(lse), n_q)},
                          scalars=scalars, n_heads=heads, kv_group=prob.kv_group)
        maps = version.arguments == "maps"
        if maps:  # v10: Q, K, V through tensor maps of each launch's views (on the GPU)
            args = replace(args, derived=(("TMAPS", lambda views, h: tensor_maps(
                cfg.maps(n_q, n_k, h, h // prob.kv_group), [views[name] for name in ("Q", "K", "V")])),))
        with simulated_warps(maps):
            if maps and device and not on_device:  # a tensor map holds a device address: NumPy inputs go there
                on_the_gpu(args, ("O", "LSE"), lambda there: launch(kernel_fn, -(-n_q // cfg.BR), cfg.NT,
                                                                    cfg.smem_bytes, there))
            else:
                launch(kernel_fn, -(-n_q // cfg.BR), cfg.NT, cfg.smem_bytes, args)
    return finish(o, lse, q, prob, element, on_device)


def finish(o, lse, q, prob, element: str, on_device: bool):
    """``(o, lse)`` in the call's shapes (host arrays for host inputs), o labelled with q's 16-bit dtype."""
    o, lse = result(o, prob.out_shape, not on_device), result(lse, prob.lse_shape, not on_device)
    if element == "bfloat16":  # the kernel wrote bfloat16 bits into a float16 array: relabel them
        o = o.view(q.dtype)  # torch.bfloat16, or ml_dtypes.bfloat16
    return o, lse
