"""The block mask: which tiles of the Nq × Nk score matrix a mask empties, fills or cuts.

A mask seen in tiles of Br queries × Bc keys has three kinds of tile:

    empty    every pair masked: the tile is skipped, never loaded nor computed
    full     every pair kept: computed with no per-element mask
    partial  some kept, some not: computed, then the mask evaluated per element

FlexAttention's layout keeps, per (batch, head, query tile i), the partial key tiles and the full
ones as two sorted lists, padded to Tc with zeros:

    kv_num_blocks (B, H, Tr)        kv_indices (B, H, Tr, Tc)            partial key tiles of query tile i
    full_kv_num_blocks (B, H, Tr)   full_kv_indices (B, H, Tr, Tc)       full key tiles of query tile i

and the transposed lists, per key tile j, that the backward (one block per key tile) walks:

    q_num_blocks (B, H, Tc)         q_indices (B, H, Tc, Tr)             partial query tiles of key tile j
    full_q_num_blocks (B, H, Tc)    full_q_indices (B, H, Tc, Tr)        full query tiles of key tile j

:func:`create_block_mask` builds it by evaluating the mask (``causal`` AND ``mask_mod``, through
``tinyflash.core.mods.keep_mask``) one tile at a time. B or H may be 1 to serve any batch or any
number of heads (broadcast); the mask must then not depend on b or h, which a call checks where
it is cheap (:func:`_check_broadcast`: the first query tile, when mask_mod takes arrays).

Stage 1 computes all heads of a tile at once, so it visits a tile that any (b, h) needs and
skips the per-element mask only where the tile is full for every (b, h)
(:meth:`BlockMask.key_tiles`, :meth:`BlockMask.query_tiles`); a kernel, one (b, h) per block,
reads its own lists. :func:`key_tile_schedule` and :func:`query_tile_schedule` are the order in
which the stages visit tiles, with or without a block mask (without one, the causal rule of
``tinyflash.core.masks``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .checks import check_causal, check_positive_int
from .masks import key_stop
from .mods import Mods, check_heads_layout, check_mod, evaluate, index_grids, keep_mask

EMPTY, PARTIAL, FULL = 0, 1, 2  # the classes of a tile in to_dense()


@dataclass(frozen=True, eq=False)
class BlockMask:
    """Which key tiles each query tile skips, masks per element, or takes whole (FlexAttention's layout)."""

    kv_num_blocks: np.ndarray  # (B, H, Tr) int32: partial key tiles of each query tile
    kv_indices: np.ndarray  # (B, H, Tr, Tc) int32: their indices, ascending, then zeros
    full_kv_num_blocks: np.ndarray  # (B, H, Tr) int32: full key tiles
    full_kv_indices: np.ndarray  # (B, H, Tr, Tc) int32
    q_num_blocks: np.ndarray  # (B, H, Tc) int32: partial query tiles of each key tile
    q_indices: np.ndarray  # (B, H, Tc, Tr) int32
    full_q_num_blocks: np.ndarray  # (B, H, Tc) int32: full query tiles
    full_q_indices: np.ndarray  # (B, H, Tc, Tr) int32
    block_q: int  # Br
    block_k: int  # Bc
    shape: tuple  # (B, H, Nq, Nk)
    causal: bool  # whether the causal rule is part of the mask
    mask_mod: object = None  # the mask_mod it was built from (None: causal alone, or nothing)

    def to_dense(self) -> np.ndarray:
        """(B, H, Tr, Tc) int8: 0 an empty tile, 1 a partial one, 2 a full one (from the kv lists)."""
        dense = np.zeros(self.kv_indices.shape, dtype=np.int8)  # (B, H, Tr, Tc)
        for num, idx, kind in ((self.kv_num_blocks, self.kv_indices, PARTIAL),
                               (self.full_kv_num_blocks, self.full_kv_indices, FULL)):
            listed = np.arange(idx.shape[-1]) < num[..., None]  # (B, H, Tr, Tc) the valid entries
            b, h, i, _ = np.nonzero(listed)
            dense[b, h, i, idx[listed]] = kind
        return dense

    def sparsity(self) -> float:
        """The fraction of tiles skipped (empty), over every (b, h, query tile, key tile)."""
        return float((self.to_dense() == EMPTY).mean())

    def key_tiles(self, i: int):
        """Query tile i's key tiles for a stage that computes every (b, h) at once: ``(partial, full)``,
        two ascending int arrays; full only where the tile is full for every (b, h)."""
        return _union(self.kv_num_blocks[..., i], self.kv_indices[..., i, :], self.full_kv_num_blocks[..., i],
                      self.full_kv_indices[..., i, :])

    def query_tiles(self, j: int):
        """Key tile j's query tiles, the same way (the backward's loop): ``(partial, full)``."""
        return _union(self.q_num_blocks[..., j], self.q_indices[..., j, :], self.full_q_num_blocks[..., j],
                      self.full_q_indices[..., j, :])


def _union(num, idx, full_num, full_idx):
    """From one row of lists over (B, H): the tiles any (b, h) needs, split into full-for-all and the rest."""
    kinds = np.zeros(idx.shape, dtype=np.int8)  # (B, H, T) the class of every tile, per (b, h)
    for n, ix, kind in ((num, idx, PARTIAL), (full_num, full_idx, FULL)):
        listed = np.arange(ix.shape[-1]) < n[..., None]  # (B, H, T)
        b, h, _ = np.nonzero(listed)
        kinds[b, h, ix[listed]] = kind
    needed = (kinds != EMPTY).any(axis=(0, 1))  # (T,)
    full = (kinds == FULL).all(axis=(0, 1))  # (T,)
    return np.flatnonzero(needed & ~full), np.flatnonzero(full)


def _lists(dense, kind):
    """(num (..., R), indices (..., R, C)): per row of ``dense`` (..., R, C), its columns of ``kind``, ascending."""
    hit = dense == kind  # (..., R, C)
    num = hit.sum(axis=-1).astype(np.int32)  # (..., R)
    order = np.argsort(~hit, axis=-1, kind="stable").astype(np.int32)  # (..., R, C) the hits first, ascending
    order[np.arange(hit.shape[-1]) >= num[..., None]] = 0  # padding: zeros
    return num, order


def build_block_mask(mods: Mods, block_q: int, block_k: int) -> BlockMask:
    """The block mask of ``mods`` (causal AND mask_mod; lead (B, H)): each tile classified from its
    per-element mask, evaluated tile by tile (one vectorised call of mask_mod per tile)."""
    (B, H), n_q, n_k = mods.lead, mods.n_q, mods.n_k
    Tr, Tc = -(-n_q // block_q), -(-n_k // block_k)  # number of query tiles, of key tiles (ceil)
    dense = np.zeros((B, H, Tr, Tc), dtype=np.int8)  # (B, H, Tr, Tc) EMPTY unless found otherwise
    for i in range(Tr):
        q_start, q_end = i * block_q, min((i + 1) * block_q, n_q)
        k_stop = key_stop(q_end, n_q, n_k, mods.causal)  # causal: later key tiles are empty, unevaluated
        for j in range(-(-k_stop // block_k)):
            k_start, k_end = j * block_k, min((j + 1) * block_k, n_k)
            keep = np.broadcast_to(keep_mask(mods, np.arange(q_start, q_end), np.arange(k_start, k_end)),
                                   (B, H, q_end - q_start, k_end - k_start))  # (B, H, rows, cols)
            dense[:, :, i, j] = np.where(keep.all(axis=(-2, -1)), FULL, np.where(keep.any(axis=(-2, -1)),
                                                                                PARTIAL, EMPTY))
    return block_mask_of_classes(dense, block_q, block_k, (B, H, n_q, n_k), mods.causal, mods.mask_mod)


def block_mask_of_classes(dense: np.ndarray, block_q: int, block_k: int, shape: tuple, causal: bool,
                          mask_mod=None) -> BlockMask:
    """The block mask whose tiles are classified by ``dense`` (B, H, Tr, Tc) int8 (EMPTY, PARTIAL, FULL): its
    lists and their transposes, read-only. For a caller that knows the classes without evaluating a mask per
    element (``tinyflash.core.packed.packed_tile_classes``: the tiles of packed sequences)."""
    transposed = np.swapaxes(dense, -1, -2)  # (B, H, Tc, Tr)
    arrays = (*_lists(dense, PARTIAL), *_lists(dense, FULL), *_lists(transposed, PARTIAL), *_lists(transposed, FULL))
    for a in arrays:
        a.setflags(write=False)
    return BlockMask(*arrays, block_q=block_q, block_k=block_k, shape=tuple(shape), causal=causal, mask_mod=mask_mod)


def create_block_mask(mask_mod, B, H, Nq, Nk, *, block_q: int = 128, block_k: int = 128,
                      causal: bool = False) -> BlockMask:
    """The :class:`BlockMask` of ``mask_mod`` (and ``causal``) for B batches, H query heads, Nq queries, Nk keys.

    ``mask_mod(b, h, q_idx, kv_idx) -> bool`` as for :func:`tinyflash.blocked_attention` (None: the
    causal rule alone, or no mask). B or H may be 1 to serve any batch size or head count, if the
    mask does not depend on b or h. ``block_q`` and ``block_k`` are the tile sizes of the stage
    that will use it. Pass it as ``block_mask=`` to ``blocked_attention`` and its backward.
    """
    mask_mod = check_mod(mask_mod, "mask_mod", 4)
    B, H = check_positive_int(B, "B"), check_positive_int(H, "H")
    Nq, Nk = check_positive_int(Nq, "Nq"), check_positive_int(Nk, "Nk")
    block_q, block_k = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    mods = Mods(None, mask_mod, (B, H), Nq, Nk, check_causal(causal))
    return build_block_mask(mods, block_q, block_k)


def call_block_mask(block_mask, mods: Mods | None, block_q: int, block_k: int):
    """The block mask a stage-1 call uses, and its mods: ``block_mask`` checked against the call, or one
    built from the call's mask_mod; ``(None, mods)`` without either (the causal rule alone).

    A given block mask supplies the mask_mod of its partial tiles when the call gives none; a
    different one, or a different ``causal``, block sizes or shape, is a ValueError.
    """
    if block_mask is None:
        if mods is None or mods.mask_mod is None:
            return None, mods
        B_H = check_heads_layout(mods.lead, "mask_mod")
        return build_block_mask(replace(mods, lead=B_H), block_q, block_k), mods
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tinyflash.BlockMask (tinyflash.create_block_mask) or None; got "
                        f"{type(block_mask).__name__}")
    return block_mask, _check_against_call(block_mask, mods, block_q, block_k)


def _check_against_call(bm: BlockMask, mods: Mods, block_q: int, block_k: int) -> Mods:
    if (bm.block_q, bm.block_k) != (block_q, block_k):
        raise ValueError(f"block_mask was built with block_q={bm.block_q}, block_k={bm.block_k}; the call has "
                         f"block_q={block_q}, block_k={block_k}: pass the block mask's sizes, or build it with the call's")
    B, H, n_q, n_k = bm.shape
    lead = check_heads_layout(mods.lead, "block_mask")  # (B, H) of the call
    if (n_q, n_k) != (mods.n_q, mods.n_k) or B not in (1, lead[0]) or H not in (1, lead[1]):
        raise ValueError(f"block_mask has shape (B, H, Nq, Nk) = {bm.shape}; the call has (B, H) = {tuple(lead)} "
                         f"(B and H may be 1 in the block mask), Nq={mods.n_q}, Nk={mods.n_k}")
    if bm.causal != mods.causal:
        raise ValueError(f"block_mask was built with causal={bm.causal}; the call has causal={mods.causal}")
    if mods.mask_mod is not None and bm.mask_mod is not None and mods.mask_mod is not bm.mask_mod:
        raise ValueError("mask_mod differs from the block_mask's own mask_mod: give one of them, or the same function")
    mask_mod = mods.mask_mod if mods.mask_mod is not None else bm.mask_mod
    if mask_mod is None and not bm.causal and int(bm.kv_num_blocks.sum()) > 0:
        raise ValueError("block_mask has partial tiles but neither mask_mod nor causal says which of their keys "
                         "to keep: pass mask_mod")
    mods = replace(mods, mask_mod=mask_mod)
    if mask_mod is not None and (B < lead[0] or H < lead[1]):
        _check_broadcast(mods, bm, lead)
    return mods


def _check_broadcast(mods: Mods, bm: BlockMask, lead: tuple):
    """A block mask with B or H of 1 serves a call with more only if the mask ignores b or h: checked where
    cheap, on the first query tile against every key, when mask_mod takes arrays (one vectorised call)."""
    rows, cols = np.arange(min(bm.block_q, mods.n_q)), np.arange(mods.n_k)
    result, per_element = evaluate(mods.mask_mod, index_grids(replace(mods, lead=lead), rows, cols))
    if per_element:
        return  # element by element would cost as much as the attention: not checked
    keep = np.broadcast_to(np.asarray(result, dtype=bool), (*lead, len(rows), len(cols)))  # (B, H, rows, Nk)
    for axis, name, size in ((0, "b", bm.shape[0]), (1, "h", bm.shape[1])):
        if size == 1 and not (keep == keep.take([0], axis=axis)).all():
            raise ValueError(f"block_mask has {'B' if axis == 0 else 'H'} = 1, but mask_mod depends on {name}: "
                             f"build it with the call's (B, H) = {lead}")


def key_tile_schedule(block_mask, i: int, n_q: int, n_k: int, Br: int, Bc: int, causal: bool):
    """The key tiles query tile i visits, in order: a list of (j, masked), masked where the tile needs the
    per-element mask. With a block mask, its partial and full tiles in ascending order (the order of
    the causal loop, so that a mask that keeps every key changes no bit); without, the causal rule:
    tiles up to key_stop of the tile's last row, masked where they reach past what its first row sees."""
    if block_mask is not None:
        return _ascending(*block_mask.key_tiles(i))
    q_start, q_end = i * Br, min((i + 1) * Br, n_q)
    k_stop = key_stop(q_end, n_q, n_k, causal)
    first_row_stop = key_stop(q_start + 1, n_q, n_k, causal)
    return [(j, min((j + 1) * Bc, n_k) > first_row_stop) for j in range(-(-k_stop // Bc))]


def _ascending(partial, full):
    """[(tile, masked)] of the partial tiles (masked) and the full ones (not), in ascending order."""
    return sorted([(int(t), True) for t in partial] + [(int(t), False) for t in full])


def query_tile_schedule(block_mask, j: int, n_q: int, n_k: int, Br: int, Bc: int, causal: bool):
    """The query tiles key tile j meets in the backward, in order: a list of (i, masked), as above."""
    if block_mask is not None:
        return _ascending(*block_mask.query_tiles(j))
    k_start, k_end = j * Bc, min((j + 1) * Bc, n_k)
    tiles = []
    for i in range(-(-n_q // Br)):
        q_start, q_end = i * Br, min((i + 1) * Br, n_q)
        if key_stop(q_end, n_q, n_k, causal) > k_start:  # the tile's last row sees K_j
            tiles.append((i, k_end > key_stop(q_start + 1, n_q, n_k, causal)))
    return tiles
