"""Packed sequences on the tensor cores: a ragged batch in one launch of ``flex_attention``, with no padding.

FlexAttention's way to a packed batch: the sequences laid end to end are one long row of tokens, and a mask keeps
each query to its own sequence's keys. Seen so, a packed batch is one (total_q, total_k) score matrix whose kept
entries form blocks along the diagonal, one per sequence (triangles with ``causal``). Most of its tiles are empty,
and the block mask lists the others: a query tile visits only the key tiles of its own sequences, so no work is
spent between two sequences, and nothing is padded. This module builds that call:

    1. the block mask, from the offsets alone (``core.packed.packed_tile_classes``): each tile empty, full, or
       partial (a sequence's edge crosses it, or the causal diagonal does), with no mask evaluated per element;
    2. the mask of the partial tiles as a function the kernel compiles (:func:`packed_rules`): the query's sequence
       by a binary search in ``cu_seqlens_q`` (captured as a small table), then its key range; a user's
       ``score_mod`` and ``mask_mod`` are called with b = the sequence and positions counted from its start, as
       the NumPy stage (``tinyflash.forward.varlen``) calls them;
    3. q, k, v from the token-major packed layout (total, H, d) to the kernel's head-major (1, H, total, d), and o
       back: one transposing copy each, in the caller's array library.

Causal alignment is per sequence (bottom-right within each), so the call passes ``causal=False`` to
``flex_attention`` and the rule of step 2 applies it.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..core.block_mask import block_mask_of_classes
from ..core.packed import packed_tile_classes
from ..gpu.arrays import is_device_array, library
from ..gpu.user_code import UserFunction

BLOCK = 128  # the block mask's tiles by default: FlexAttention's 128 × 128
MAX_CALLS = 32  # packed layouts kept (their rules and block masks, whose lists stay on the GPU while kept)
_CALLS: OrderedDict = OrderedDict()


def packed_rules(cu_q: np.ndarray, cu_k: np.ndarray, causal: bool, score_mod=None, mask_mod=None):
    """``(score_mod, mask_mod)`` of the packed row, as ``flex_attention`` takes them (b = 0; q_idx, kv_idx packed
    positions): the mask keeps key kv_idx for query q_idx where both are of one sequence (and, with ``causal``, the
    key is at or before the query's diagonal within it) and the user's ``mask_mod`` keeps it; the score is the
    user's ``score_mod`` of (b = the sequence, its own positions), or unchanged for a key of another sequence (masked
    anyway). The user's functions are compiled as device functions that these call."""
    cu_q, cu_k = np.ascontiguousarray(cu_q, np.int32), np.ascontiguousarray(cu_k, np.int32)
    last = int(cu_q.shape[0]) - 2  # the last sequence's index
    user_mask = None if mask_mod is None else UserFunction.of(mask_mod, "mask_mod").device
    user_score = None if score_mod is None else UserFunction.of(score_mod, "score_mod").device

    def sequence_of(q_idx):
        """The sequence of packed query q_idx: the last s with cu_q[s] <= q_idx (binary search; cu_q repeats a value
        where a sequence is empty)."""
        lo, hi = 0, last
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cu_q[mid] <= q_idx:
                lo = mid
            else:
                hi = mid - 1
        return lo

    find = UserFunction.of(sequence_of, "cu_seqlens_q").device  # a device function that the rules call

    def packed_mask(b, h, q_idx, kv_idx):
        s = find(q_idx)
        if kv_idx < cu_k[s] or kv_idx >= cu_k[s + 1]:
            return False
        return not causal or kv_idx - cu_k[s + 1] <= q_idx - cu_q[s + 1]

    def packed_user_mask(b, h, q_idx, kv_idx):
        s = find(q_idx)
        if kv_idx < cu_k[s] or kv_idx >= cu_k[s + 1]:
            return False
        if causal and kv_idx - cu_k[s + 1] > q_idx - cu_q[s + 1]:
            return False
        return user_mask(s, h, q_idx - cu_q[s], kv_idx - cu_k[s])

    def packed_score(score, b, h, q_idx, kv_idx):
        s = find(q_idx)
        if kv_idx < cu_k[s] or kv_idx >= cu_k[s + 1]:
            return score
        return user_score(score, s, h, q_idx - cu_q[s], kv_idx - cu_k[s])

    return (None if score_mod is None else packed_score), (packed_mask if mask_mod is None else packed_user_mask)


def packed_call(cu_q, cu_k, causal: bool, score_mod, mask_mod, block_q: int, block_k: int):
    """``(score_mod, block_mask)`` of a packed batch: the packed rules and the block mask that carries their mask,
    kept for the next call with the same offsets, functions and tiles (:data:`_CALLS`, the newest MAX_CALLS): a
    training loop calls with the same batch layout many times, and the tile classes cost a loop over query tiles."""
    key = (np.asarray(cu_q).tobytes(), np.asarray(cu_k).tobytes(), causal, block_q, block_k,
           None if score_mod is None else UserFunction.of(score_mod, "score_mod"),
           None if mask_mod is None else UserFunction.of(mask_mod, "mask_mod"))
    if key in _CALLS:
        _CALLS.move_to_end(key)
        return _CALLS[key]
    dense = packed_tile_classes(cu_q, cu_k, causal, block_q, block_k, masked=mask_mod is not None)
    packed_score, packed_mask = packed_rules(cu_q, cu_k, causal, score_mod, mask_mod)
    shape = (1, 1, int(cu_q[-1]), int(cu_k[-1]))
    _CALLS[key] = packed_score, block_mask_of_classes(dense, block_q, block_k, shape, False, packed_mask)
    if len(_CALLS) > MAX_CALLS:
        _CALLS.popitem(last=False)
    return _CALLS[key]


def heads_major(x, name: str):
    """A packed array (total, H, c) as the kernel's (1, H, total, c): a contiguous copy in x's array library."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(np.swapaxes(x, 0, 1))[None]
    lib = library(x) if is_device_array(x) else None
    if lib == "torch":
        return x.transpose(0, 1).contiguous().unsqueeze(0)
    if lib == "cupy":
        import cupy

        return cupy.ascontiguousarray(cupy.swapaxes(x, 0, 1))[None]
    raise TypeError(f"{name} must be a NumPy array, a CuPy array or a PyTorch CUDA tensor on the tensor cores; got "
                    f"{type(x).__name__}")


def token_major(o):
    """The kernel's o (1, H, total, dv) as the packed layout's (total, H, dv), in o's array library."""
    if isinstance(o, np.ndarray):
        return np.ascontiguousarray(np.swapaxes(o[0], 0, 1))
    if library(o) == "torch":
        return o[0].transpose(0, 1).contiguous()
    import cupy

    return cupy.ascontiguousarray(cupy.swapaxes(o[0], 0, 1))


def varlen_tensor_cores(q, k, v, cu_q: np.ndarray, cu_k: np.ndarray, *, causal: bool, score_mod, mask_mod, scale,
                        block_q: int | None, block_k: int | None):
    """``tinyflash.varlen_attention`` on 16-bit inputs (checked by the caller): one ``flex_attention`` launch over
    the packed row with the block mask of the sequences. Returns ``(o (total_q, H, dv), lse (H, total_q))``."""
    from .tensor_cores import flex_attention  # the stage-3 entry point, which picks the version for the GPU

    block_q, block_k = block_q or BLOCK, block_k or BLOCK
    packed_score, bm = packed_call(cu_q, cu_k, causal, score_mod, mask_mod, block_q, block_k)
    o, lse = flex_attention(heads_major(q, "q"), heads_major(k, "k"), heads_major(v, "v"), score_mod=packed_score,
                            block_mask=bm, causal=False, scale=scale)
    return token_major(o), lse[0]
