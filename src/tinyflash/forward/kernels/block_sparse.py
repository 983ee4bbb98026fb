"""The key tiles a forward kernel's block visits under a block mask (FlexAttention's layout), for the kernels on the
tensor cores.

A block mask (``tinyflash.create_block_mask``) lists, per (b, h) and query tile of block_q rows, the key tiles of
block_k keys that its mask cuts (partial: the mask evaluated per element) and those it keeps whole (full):

    KV_NUM (Bm · Hm · Tr,)        KV_IDX (Bm · Hm · Tr · Tc,)        partial key tiles, ascending, then padding
    FULL_NUM (Bm · Hm · Tr,)      FULL_IDX (Bm · Hm · Tr · Tc,)      full key tiles

flattened, int32; Bm and Hm are B and H, or 1 where the mask serves every batch or every head (broadcast).
A kernel block of Br rows lies in one query tile of the mask (block_q is a multiple of Br) and walks the mask's
key tiles in kernel tiles of Bc keys (block_k is a multiple of Bc: SUB = block_k / Bc kernel tiles each), the
partial ones first, then the full ones, as one numbered list of *visits*; key tiles not listed (empty) are never
loaded. The last key tile of the mask may hold fewer than block_k keys: its kernel tiles past Nk are not visited
(LAST_SUB of them are), so no copy starts past the last key.

:func:`tile_walk` builds the two device functions a kernel calls: ``lists`` (where the block's lists start, how many
visits are partial, how many in all) and ``visit`` (visit j's first key and whether it is partial). The block mask
reaches them as one tuple, ``bm`` (:data:`BM_FIELDS`), which the host fills.
"""

from __future__ import annotations

from numba import cuda, uint64

from ...gpu.runtime import u

# what a kernel reads of a block mask, in this order, as the tuple bm: the four lists; the strides of a batch and a
# head in KV_NUM (0 where the mask broadcasts), Tc (one list's length), block_q, SUB and LAST_SUB (above), and
# the heads per batch H, from which a block's flat head gives (b, h)
BM_FIELDS = ("KV_NUM", "KV_IDX", "FULL_NUM", "FULL_IDX", "bm_batch", "bm_head", "bm_tc", "bm_block_q", "bm_sub",
             "bm_last_sub", "heads")
ONE = u(1)


def tile_walk(BC: int):
    """``lists(bm, head, q_start)`` and ``visit(bm, lists, j)`` for a kernel of key tiles of BC keys."""
    BC_ = u(BC)

    @cuda.jit(device=True, inline="always")
    def visits_of(NUM, IDX, row, tc, sub, last_sub, last_tile):
        """The kernel tiles of one list (partial or full) of the mask's row ``row``: SUB per listed key tile,
        less those of the last key tile (``last_tile``) past Nk, if it is listed (then it is the list's last)."""
        n = uint64(NUM[row])
        if n == 0:
            return uint64(0)
        short = sub - last_sub if uint64(IDX[row * tc + n - ONE]) == last_tile else uint64(0)
        return n * sub - short

    @cuda.jit(device=True, inline="always")
    def lists(bm, head, q_start, n_k):
        """(where the block's lists start in KV_IDX and FULL_IDX, its partial visits, all its visits) for the block
        of flat head ``head`` (b · H + h) whose first query row is ``q_start``."""
        KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, bm_batch, bm_head, tc, block_q, sub, last_sub, heads = bm
        b, h = head // uint64(heads), head % uint64(heads)
        row = b * uint64(bm_batch) + h * uint64(bm_head) + q_start // uint64(block_q)  # the mask's (b, h, i)
        block_k = uint64(sub) * BC_
        last_tile = (n_k + block_k - ONE) // block_k - ONE  # the mask's last key tile (Tc of its own Nk)
        partial = visits_of(KV_NUM, KV_IDX, row, uint64(tc), uint64(sub), uint64(last_sub), last_tile)
        full = visits_of(FULL_NUM, FULL_IDX, row, uint64(tc), uint64(sub), uint64(last_sub), last_tile)
        return row * uint64(tc), partial, partial + full

    @cuda.jit(device=True, inline="always")
    def visit(bm, first, partial, j):
        """(first key, partial?) of the block's visit j: kernel tile j % SUB of the (j // SUB)-th key tile of its
        partial list, or past the partial visits, of its full list (``first``: where the lists start)."""
        IDX = bm[1] if j < partial else bm[3]
        p = j if j < partial else j - partial  # the visit's place in its list, in kernel tiles
        sub = uint64(bm[8])
        tile = uint64(IDX[first + p // sub])
        return (tile * sub + p % sub) * BC_, j < partial

    return lists, visit
