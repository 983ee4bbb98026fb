"""Copying a tile of one head's (N × d) matrix from global memory into shared memory.

Every kernel keeps its inputs as flat 1-D arrays (``src``) and finds a head's matrix at an offset
(``src_off``). A tile is ROWS consecutive rows of it, padded with zeros to COLS columns (the
kernel's head dim, rounded up) and to ROWS rows past the end of the matrix, so that padding adds
nothing to any dot product; it is stored as float32 at ``dst[dst_off + r·stride + c]``. Each element
becomes float32 through ``widen``, the kernel's :func:`tinyflash.gpu.elements.widen` (float16 and
float32: ``float32(x)``; bfloat16, held as 16-bit patterns: the pattern shifted into a float32).

Two paths, chosen per tile (the same choice for every thread of the block):

* :func:`fetch_tile` then :func:`store_tile`, for a full tile: each thread reads its elements into
  registers, all loads in flight at once, then writes them to shared memory; W = 4 neighbouring
  elements per thread and load uses one vector load (:func:`vector_load`);
* :func:`load_tile_ragged`, for the last tile and padded head dims: one bounds check per element.

:func:`load_tile` picks between them. ROWS, COLS, NT (threads) and W are compile-time constants:
the branches on them vanish when the kernel is compiled.
"""

from __future__ import annotations

from numba import cuda, float32, uint32, uint64

from . import ptx
from .elements import itemsize
from .wgmma import swizzled_chunk
from .runtime import simulator_enabled, u

ZERO, ONE, FOUR = u(0), u(1), u(4)


def vector_width(dtype, vector: int | None = None) -> int:
    """W, the elements each thread reads per global load of a full tile: ``vector`` if given (1 or 4), else
    4 for 2-byte elements (float16, bfloat16: 8 bytes a load) and 1 for 4-byte ones.

    With one float16 per thread a warp's load covers only 64 bytes, half of a 128-byte cache line; one
    float32 per thread already covers a whole line. On an H200, 4 per thread made the float16 kernels
    faster and the float32 ones slower (``python -m tinyflash.bench vector``; docs/results.md quotes it).
    """
    if vector is None:
        return 4 if itemsize(dtype) == 2 else 1
    if vector not in (1, 4):
        raise ValueError(f"vector must be 1 or 4 (or None: the dtype's default); got {vector!r}")
    return vector


def vector_load(n: int):
    """A device function ``load(src, i)`` -> (src[i], ..., src[i+n-1]) in one vector load.

    A warp's load instruction moves the most data when each thread asks for several neighbouring
    elements at once (ld.global.v4: 4 elements). The GPU requires the address to be a multiple
    of the vector's size; numba cannot know that, so the code it generates reads global arrays
    one element at a time. This small intrinsic builds the vector load itself (LLVM IR: a
    pointer to n elements, aligned to n elements); the caller guarantees the alignment. On the
    simulator it is n ordinary loads.
    """
    if simulator_enabled():

        @cuda.jit(device=True)
        def load(src, i):
            return tuple(src[i + e] for e in range(n))

        return load

    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    @intrinsic
    def load(typingctx, src, i):
        ret = types.UniTuple(src.dtype, n)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            elt = context.get_value_type(sig.args[0].dtype)
            ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.VectorType(elt, n).as_pointer())
            vec = builder.load(ptr, align=n * context.get_abi_sizeof(elt))
            vals = [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(n)]
            return context.make_tuple(builder, ret, vals)

        return ret(src, i), codegen

    return load


load4 = vector_load(4)


@cuda.jit(device=True, inline="always")
def is_full_tile(start, n_rows, n_cols, ROWS, COLS, NT, W):
    """Whether rows start .. start+ROWS of an (n_rows × n_cols) matrix are a full ROWS × COLS tile
    that NT threads can share evenly, W neighbouring elements each, NT·W/COLS rows at a time (the
    same answer for every thread of the block)."""
    G = COLS // W  # threads per row
    return start + ROWS <= n_rows and n_cols == COLS and NT % G == 0 and ROWS % (NT // G) == 0


@cuda.jit(device=True, inline="always")
def fetch_tile(src, src_off, start, n_cols, ROWS, COLS, tid, NT, W, buf, b0, widen):
    """A full tile, step 1 of 2: read this thread's ROWS·COLS/NT elements into ``buf[b0:]``.

    ``src`` is a whole input flattened to 1-D; this head's matrix, n_cols wide, begins at
    ``src_off``. Each thread reads W neighbouring columns at a time (W = 1, or 4 with one vector
    load), and consecutive threads the next ones, so a warp reads consecutive addresses
    (coalesced). ``buf`` is a register array: the loop has a constant length, the compiler
    unrolls it, and all the loads are in flight at once: a tile costs one memory latency, not
    one per row.
    """
    G = COLS // W  # threads per row
    r_step = NT // G  # rows between two loads of one thread
    g = src_off + (start + tid // G) * n_cols + (tid % G) * W  # index into src of its first element
    for e in range(ROWS // r_step):
        if W == ONE:
            buf[b0 + e] = widen(src[g + e * r_step * n_cols])
        else:
            x = load4(src, g + e * r_step * n_cols)
            for w in range(W):
                buf[b0 + e * W + w] = widen(x[w])


@cuda.jit(device=True, inline="always")
def store_tile(dst, dst_off, stride, ROWS, COLS, tid, NT, W, buf, b0):
    """A full tile, step 2 of 2: write ``buf[b0:]`` to dst[dst_off + r·stride + c] (shared memory)."""
    G = COLS // W
    r_step = NT // G
    sh = dst_off + (tid // G) * stride + (tid % G) * W  # index into dst of its first element
    for e in range(ROWS // r_step):
        for w in range(W):
            dst[sh + e * r_step * stride + w] = buf[b0 + e * W + w]


@cuda.jit(device=True, inline="always")
def load_tile_ragged(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT, widen):
    """Any tile, element by element: one bounds check (and a division) per element.

    Writes dst[dst_off + r·stride + c] = src[src_off + (start + r)·n_cols + c] for r < ROWS,
    c < COLS, and 0 where the tile runs past the matrix (the ragged last tile, or the head-dim
    padding c >= n_cols), so that those entries add nothing to any dot product.
    """
    for idx in range(tid, ROWS * COLS, NT):
        r = idx // COLS
        c = idx % COLS
        x = float32(0.0)
        if start + r < n_rows and c < n_cols:
            x = widen(src[src_off + (start + r) * n_cols + c])
        dst[dst_off + r * stride + c] = x


@cuda.jit(device=True, inline="always")
def load_tile(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT, W, buf, widen):
    """Copy rows start .. start+ROWS of one head's (n_rows × n_cols) matrix into shared memory,
    as float32, zero-padded to ROWS × COLS: the fast path for a full tile (the usual case), the
    ragged path otherwise. ROWS, COLS, NT and W are constants: branches on them vanish at compile time.
    """
    if is_full_tile(start, n_rows, n_cols, ROWS, COLS, NT, W):
        fetch_tile(src, src_off, start, n_cols, ROWS, COLS, tid, NT, W, buf, ZERO, widen)
        store_tile(dst, dst_off, stride, ROWS, COLS, tid, NT, W, buf, ZERO)
    else:
        load_tile_ragged(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT, widen)


def row_passes(chunks: int, threads: int, rows: int) -> tuple[int, int]:
    """How ``threads`` threads copy ``rows`` rows of ``chunks`` 16-byte pieces, one piece per thread at a time:
    (rows per pass, passes). A pass copies threads // chunks whole rows; where the pieces of a row do not divide
    the threads (12 of a d = 96 row among 32) the threads past rows per pass · chunks copy nothing, and the last
    pass may reach past the tile's rows (those are not copied)."""
    per_pass = threads // chunks
    return per_pass, -(-rows // per_pass)


def cp_async_rows(row_words: int, words: int, threads: int, tile_words: int | None = None):
    """For the tensor-core kernels: a device function ``copy_rows(src, src_off, first, n_rows, smem_addr, tid,
    CHUNKS_PER_THREAD)`` that copies rows first .. of a (rows × ``words``) matrix of uint32 words (16-bit pairs)
    into shared memory rows of ``row_words`` words (padded), 16 bytes per ``cp.async``, by ``threads`` threads;
    rows at or past n_rows become zeros (the ragged last tile), and so do the words of a row past ``words`` up to
    ``tile_words`` (a head dim padded to DP; default: none). CHUNKS_PER_THREAD is the tile's 16-byte pieces per
    thread (its rows · tile_words / 4 / threads, a whole number: the tilings check it), which gives its rows. A
    thread copies the same column of rows row0, row0 + rows per pass, ... (:func:`row_passes`): one address for
    the tile, then small offsets. The copies are in flight until the caller commits and waits for them."""
    tile_words = words if tile_words is None else tile_words
    CHUNKS, RW, DW = u(tile_words // 4), row_words, u(words)  # 16-byte chunks per row; words per row in smem, in HBM
    ROWS_PER_PASS, _ = row_passes(tile_words // 4, threads, 1)  # rows that the threads copy with one cp.async each
    ACTIVE = ROWS_PER_PASS * (tile_words // 4)  # threads that copy (the rest, if any, wait)
    EVEN, PADDED = ACTIVE == threads, tile_words > words  # every thread copies; zero words after each row
    THREADS, RPP = u(threads), u(ROWS_PER_PASS)

    @cuda.jit(device=True, inline="always")
    def copy_rows(src, src_off, first, n_rows, smem_addr, tid, CHUNKS_PER_THREAD):
        row0, col = tid // CHUNKS, (tid % CHUNKS) * FOUR  # the thread's first row; its word column
        tile_src = src_off + first * DW + (min(col, DW - FOUR) if PADDED else col)  # row `first` (it exists) at
        # that column, or at the row's last chunk for a padding column (which reads nothing)
        tile_rows = uint64(CHUNKS_PER_THREAD) * THREADS // CHUNKS  # the tile's rows (unsigned: folded at once)
        rows_left = uint32(min(n_rows - first, tile_rows))
        passes = (tile_rows + RPP - ONE) // RPP
        if EVEN or tid < ACTIVE:
            for i in range(passes):
                row = uint32(row0) + uint32(i * ROWS_PER_PASS)
                if EVEN or row < tile_rows:  # the last pass may reach past the tile
                    inside = row < rows_left and (not PADDED or col < DW)  # else 16 bytes of zeros
                    ptx.cp_async_16(smem_addr + (row * uint32(RW) + uint32(col)) * uint32(4), src,
                                    tile_src + (uint64(row) * DW if inside else ZERO),  # a valid address even if unread
                                    uint32(16) if inside else uint32(0))

    return copy_rows


def cp_async_swizzled_rows(words: int, threads: int, tile_rows: int):
    """For the wgmma kernels: as :func:`cp_async_rows`, into a 128-byte-swizzled tile of ``tile_rows`` rows
    (``wgmma.swizzled_chunk``: 64-column pieces one after the other, each row's 16-byte chunks permuted by the
    row's place among 8) instead of padded rows. ``copy_rows(src, src_off, first, n_rows, tile_addr, tid,
    CHUNKS_PER_THREAD)``; ``tile_addr`` 1024-byte aligned. Rows at or past n_rows become zeros."""
    CHUNKS, DW = u(words // 4), u(words)  # 16-byte chunks per row; words per row in HBM
    ROWS_PER_PASS = threads // (words // 4)  # rows that the threads copy with one cp.async each

    @cuda.jit(device=True, inline="always")
    def copy_rows(src, src_off, first, n_rows, tile_addr, tid, CHUNKS_PER_THREAD):
        row0, chunk = tid // CHUNKS, tid % CHUNKS  # the thread's first row; its chunk of each row
        tile_src = src_off + first * DW + chunk * FOUR  # row `first` (it exists) at that chunk
        rows_left = uint32(min(n_rows - first, uint64(ROWS_PER_PASS * CHUNKS_PER_THREAD)))
        for i in range(CHUNKS_PER_THREAD):
            row = uint32(row0) + uint32(i * ROWS_PER_PASS)
            inside = row < rows_left
            ptx.cp_async_16(tile_addr + swizzled_chunk(row, chunk, tile_rows), src,
                            tile_src + (uint64(row) * DW if inside else ZERO),  # a valid address even if unread
                            uint32(16) if inside else uint32(0))

    return copy_rows
