"""The tiling of the tensor-core kernel v6 and its host side: who computes what, where tiles live, how
a problem is launched. (``tiling.py`` beside this is the same for the CUDA-core kernels v2 to v5; what a
warp owns and how its fragments are laid out is ``tinyflash.warp_tile``.)

A block of WARPS warps owns Br = 16 · ROW_TILES · WARPS query rows: warp w the rows
32w .. 32w + 31 (two row tiles of 16) or 16w .. 16w + 15 (one); it walks the keys in tiles K_j, V_j of
Bc = BC keys. Shared memory holds Q_i, then two stages of (K_j, V_j), every row padded by 16 bytes:
:meth:`TensorCoreTiling.smem_layout` is its one description. A lane's place in a warp's fragments is
``tinyflash.gpu.ptx``'s.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np

from ...gpu.arrays import is_device_array, numba_flat
from ...gpu.driver_launch import GridLaunch, driver_kernel
from ...gpu.launch import MAX_GRID_Y, LaunchArgs, Tiling, launch as launch_grid
from ...gpu.runtime import simulator_enabled
from ...warp_tile import (ELEMENTS, HEAD_DIMS, MMA_K, MMA_M, PAD_WORDS, WARP, WarpTile, head_dims_text, padded_head_dim,
                          tile_problems)


@dataclass(frozen=True)
class TensorCoreTiling(Tiling):
    """Who computes what: WARPS warps of 16 · ROW_TILES query rows each, key tiles of BC keys, head dim D;
    and where Q_i's A operands are held: in registers, loaded once (Q_IN_SMEM False), or read from Q_i in
    shared memory for every key tile, two mma steps over d at a time (True: fewer registers, more ldmatrix)."""

    D: int  # head dim (d = dv)
    WARPS: int  # warps per block
    BC: int  # keys per tile K_j, V_j (Bc)
    MAX_REGISTERS: int | None = None  # a cap on registers per thread (more blocks per multiprocessor), or None
    ROW_TILES: int = 1  # 16-row tiles per warp (1 or 2): 2 feeds each K_j, V_j fragment to two mma's
    Q_IN_SMEM: bool = False  # read Q_i's A operands from shared memory per key tile instead of holding them
    LAZY_RESCALE: bool = False  # rescale acc and l_i only when a row's max grows by more than 2^RESCALE_LOG2
    HEAD_GROUP: int | None = None  # heads whose blocks are ordered together (v6's block_work); None: head_group's rule
    WHAT = "tensor-core tiling"

    @property
    def BR(self) -> int:  # query rows per block (Br): 16 per row tile
        return MMA_M * self.ROW_TILES * self.WARPS

    @property
    def NT(self) -> int:  # threads per block
        return WARP * self.WARPS

    @property
    def DP(self) -> int:  # the head dim of a row in shared memory: D padded with zero columns (tinyflash.warp_tile)
        return padded_head_dim(self.D)

    @property
    def ROW_WORDS(self) -> int:  # words (pairs of 16-bit values) of one padded row in shared memory
        return self.DP // 2 + PAD_WORDS

    @property
    def CHUNKS(self) -> int:  # 16-byte chunks per row in shared memory (one cp.async each)
        return self.DP // 8

    def warp_tile(self, element: str) -> WarpTile:
        """What each warp of this tiling owns, for inputs of ``element`` (``tinyflash.warp_tile``)."""
        return WarpTile(element, self.D, self.BC, self.ROW_TILES, self.Q_IN_SMEM, self.LAZY_RESCALE)

    def smem_layout(self) -> dict:
        """Word offsets in shared memory: Q_i, then two stages of (K_j, V_j)."""
        tile = self.BC * self.ROW_WORDS
        return {"Q_i": 0, "stage 0": self.BR * self.ROW_WORDS, "stage 1": self.BR * self.ROW_WORDS + 2 * tile,
                "V_j in a stage": tile, "end": self.BR * self.ROW_WORDS + 4 * tile}

    @property
    def smem_bytes(self) -> int:
        return 4 * self.smem_layout()["end"]

    def shape_problems(self) -> list[str]:
        problems = tile_problems(self.D, self.ROW_TILES, "row")
        if self.BC % MMA_K or (self.BC * self.CHUNKS) % self.NT or (self.BR * self.CHUNKS) % self.NT:
            problems.append("BC must be a multiple of 16, and each tile's 16-byte chunks a multiple of the threads")
        if self.HEAD_GROUP is not None and self.HEAD_GROUP < 1:
            problems.append("HEAD_GROUP must be None or at least 1")
        return problems


SHORT_CAUSAL = 8192  # causal with fewer query rows than this: blocks of 128 rows (see default_tiling)


@lru_cache(maxsize=256)  # built and validated once per (d, causal, n_q), for the last 256 of them
def default_tiling(d: int, causal: bool, n_q: int = SHORT_CAUSAL) -> TensorCoreTiling:
    """The tiling used on a GPU: for each (d, causal, N) of the H200's tiling sweep, the fastest
    (``python -m tinyflash.bench tensor-core-tiles``, figures/data/tensor_core_tiles_h200.csv: with the causal
    mask the kernel that orders its blocks by groups of heads, each tiling at its best group; without it the
    kernel that takes one head at a time, which is the one that runs there); the docs' tests check that these
    are still the record's fastest. Every warp owns 2 row tiles (32 query rows) of 64-key tiles. d = 128: 8 warps,
    Q_i read from shared memory for each key tile, rescaled lazily; causal with fewer than SHORT_CAUSAL query
    rows, 4 warps, so that blocks of uneven length are finer pieces of work to share out (the switch lies
    between the two lengths of the sweep). d = 64: 4 warps, Q_i in registers; rescaled lazily when causal, at
    every tile when not.

    Other head dims take the tiling of the next of these by DP (d padded to a multiple of 32): up to 64, d = 64's;
    up to 128, d = 128's. Past 128 a warp's accumulators of two row tiles would not fit in its 255 registers
    (DP / 2 · 8 of them), so a warp owns one row tile: 8 warps (Br = 128), Q_i in shared memory, 64-key tiles,
    as FlashAttention-2 does at d = 256 (``python -m tinyflash.bench head-dims`` times them)."""
    dp = padded_head_dim(d)
    if dp <= 64:
        return TensorCoreTiling(D=d, WARPS=4, BC=64, ROW_TILES=2, LAZY_RESCALE=causal).validate()
    if dp <= 128:
        warps = 4 if causal and n_q < SHORT_CAUSAL else 8
        return TensorCoreTiling(D=d, WARPS=warps, BC=64, ROW_TILES=2, Q_IN_SMEM=True, LAZY_RESCALE=True).validate()
    return TensorCoreTiling(D=d, WARPS=8, BC=64, ROW_TILES=1, Q_IN_SMEM=True, LAZY_RESCALE=True).validate()


# causal: the K and V of the heads ordered together, at most this many bytes (head_group): they stay in the L2 cache
# while the group's blocks read them. The docs' tests check the rule's group against the sweep's fastest.
L2_KV_BYTES = 16 * 2**20


def head_group(cfg: TensorCoreTiling, n_k: int, n_heads: int, kv_group: int, causal: bool) -> int:
    """How many heads v6 orders together, longest query tiles first (its ``block_work``). Not causal: 1, one
    head after another (every block is as long as every other; the blocks running together share one head's
    K and V in L2). Causal: the query tiles differ in length, and the blocks started last must be short ones,
    not a head's longest tile; so the heads whose K and V fit in L2_KV_BYTES together (at least one K/V head:
    kv_group query heads) start their longest tiles first, then the next-longest, and so on."""
    if cfg.HEAD_GROUP is not None:
        return min(cfg.HEAD_GROUP, n_heads)
    if not causal:
        return 1
    kv_bytes = 2 * n_k * cfg.D * 2  # one K/V head's K and V, 16-bit elements
    return min(n_heads, kv_group * max(1, L2_KV_BYTES // kv_bytes))


def simulator_tiling(d: int) -> TensorCoreTiling:
    """One warp and 16 keys per tile: the smallest tiling, for numba's CUDA simulator."""
    return TensorCoreTiling(D=d, WARPS=1, BC=16).validate()


def sized_launch(kernel_for, signature, n_q: int, n_k: int, n_heads: int, scale_log2, causal: bool, kv_group: int,
                 element: str, cfg: TensorCoreTiling) -> GridLaunch:
    """``kernel_for(cfg, element, head_group)`` compiled for ``signature`` (once: ``driver_kernel`` keeps it) and
    sized for one problem: its grid (query tiles × batch·heads), threads, shared memory and scalars (n_q, n_k,
    scale · log2(e), causal, kv_group, head_group)."""
    group = head_group(cfg, n_k, n_heads, kv_group, causal)
    kernel = driver_kernel(kernel_for(cfg, element, group), signature, cfg.smem_bytes)
    return GridLaunch.sized(kernel, (-(-n_q // cfg.BR), n_heads), cfg.NT, cfg.smem_bytes, n_q=n_q, n_k=n_k,
                            scale_log2=np.float32(scale_log2), causal=bool(causal), kv_group=kv_group, head_group=group)


def launch_tensor_cores(kernel_for, driver_launch, args: LaunchArgs, prob, config: TensorCoreTiling | None = None,
                        element: str | None = None, *, tilings=None, who: str = "kernel v6 (tensor cores)",
                        head_dims: tuple = HEAD_DIMS, derived: tuple = ()) -> None:
    """Launch ``kernel_for(tiling, element, head_group)`` on ``args`` (Q, K, V, O flat in 16-bit elements, LSE;
    n_q, n_k, scale_log2, causal, kv_group by name): device arrays on a GPU through the driver (``driver_launch``:
    the kernel's sized launch, as v6.driver_launch keeps it), else through numba. ``tilings``: the kernel's
    (default_tiling(d, causal, n_q), simulator_tiling(d)) when ``config`` is None (None: this module's);
    ``head_dims``: the d = dv the kernel takes; ``derived``: (name, fn(tiling, views, heads)), arrays made for
    each launch through numba (``LaunchArgs.derived``)."""
    if element is None:  # the problem's dtype (a NumPy dtype, or 'bfloat16')
        element = str(np.dtype(prob.dtype) if not isinstance(prob.dtype, str) else prob.dtype)
        if element not in ELEMENTS:
            raise TypeError(f"{who} takes float16 or bfloat16 inputs; got {element} "
                            "(cuda_attention's kernels v1-v5 take float32)")
    if element not in ELEMENTS:
        raise ValueError(f"element must be one of {ELEMENTS}; got {element!r}")
    if prob.d != prob.d_v or prob.d not in head_dims:
        raise ValueError(f"{who} supports d = dv {head_dims_text(head_dims)}; got d = {prob.d}, dv = {prob.d_v} "
                         "(cuda_attention's kernels v1-v5 take any head dim up to 256)")
    on_gpu, on_simulator = tilings or (default_tiling, simulator_tiling)
    cfg = config or (on_simulator(prob.d) if simulator_enabled() else on_gpu(prob.d, prob.causal, prob.n_q))
    if cfg.D != prob.d:
        raise ValueError(f"config {cfg} is for d = {cfg.D}; got d = {prob.d}")
    sc = args.scalars
    n_tiles, arrays = -(-sc["n_q"] // cfg.BR), [args.arrays[name][0] for name in ("Q", "K", "V", "O", "LSE")]
    if not simulator_enabled() and args.n_heads <= MAX_GRID_Y and all(map(is_device_array, arrays)):
        # one launch, through the driver: the lean path (device arrays of any library: it reads their addresses)
        driver_launch(sc["n_q"], sc["n_k"], args.n_heads, sc["scale_log2"], sc["causal"], args.kv_group, element,
                      cfg)(*arrays)
        return
    # kv_group: query heads per K, V head (GQA); the heads ordered together, out of at most a launch's heads
    group = head_group(cfg, sc["n_k"], min(args.n_heads, MAX_GRID_Y), args.kv_group, sc["causal"])
    kernel = kernel_for(cfg, element, group)  # v6's make_kernel validates cfg when it builds
    words = {name: (as_words(a), size // 2) if name != "LSE" else (flat(a), size)  # 16-bit pairs: Q, K, V, O
             for name, (a, size) in args.arrays.items()}
    grid_args = LaunchArgs(arrays=words, scalars={**sc, "head_group": group}, n_heads=args.n_heads,
                           kv_group=args.kv_group, derived=tuple((name, partial(make, cfg)) for name, make in derived))
    # numba's launches (gpu/launch.py; it copies host arrays, and launches once per 65,535 heads); on the
    # simulator, where every emulated warp instruction waits at a barrier, with faster barriers
    if simulator_enabled():
        from ...gpu.ptx_emulation import fast_barriers
    with fast_barriers() if simulator_enabled() else nullcontext():
        launch_grid(kernel, n_tiles, cfg.NT, cfg.smem_bytes, grid_args)


def flat(a):
    """A device array as :func:`numba_flat` makes it; a host array as a flat view of itself, which numba's launch
    copies to the GPU and back (an output written there reaches the caller's array)."""
    return numba_flat(a) if is_device_array(a) else np.asarray(a).reshape(-1)


def as_words(a):
    """A flat array of 16-bit elements as numba launches it for this kernel: uint32 words, two elements each."""
    a = flat(a)
    return a if a.dtype == np.uint32 else a.view(np.uint32)
