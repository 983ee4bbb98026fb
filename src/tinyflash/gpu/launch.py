"""Launching a kernel over (query tiles × heads), whatever the number of heads.

Every attention kernel here runs one thread block per (query tile, batch·head): ``blockIdx.x``
is the query tile, ``blockIdx.y`` the head, so that the blocks the GPU starts one after another
share one head's K and V in the L2 cache. CUDA allows at most 65,535 blocks along y, and
B × H can be more (B = 1024, H = 128 is 131,072). :func:`launch` then launches once per 65,535
heads, on views of the flat arrays that start at the first head of the slice: a kernel never
needs to know.
"""

from __future__ import annotations

from dataclasses import dataclass

from .smem import allow_large_shared_memory

MAX_GRID_Y = 65_535  # CUDA's limit on gridDim.y


class SharedMemoryRefused(RuntimeError):
    """The driver would not let a kernel use the shared memory its tiling needs."""


@dataclass(frozen=True)
class LaunchArgs:
    """A kernel's arguments: flat arrays with their elements per head, then scalars."""

    per_head: tuple  # ((flat device array, elements per head), ...), in the kernel's argument order
    scalars: tuple  # the arguments after the arrays (for attention kernels, kv_group last)
    n_heads: int  # batch · heads: the blocks along y
    kv_group: int = 1  # query heads per K/V head (GQA); kernels read K/V head `head // kv_group`
    kv_arrays: tuple = (1, 2)  # positions in per_head of the arrays with one matrix per K/V head (K, V)


def launch(kernel, n_tiles: int, threads: int, smem_bytes: int, args: LaunchArgs) -> None:
    """Run ``kernel[(n_tiles, heads), threads, 0, smem_bytes](*arrays, *scalars)`` for all heads.

    The kernel finds head ``blockIdx.y`` of each flat array at ``blockIdx.y · elements per head``.
    More than 48 KiB of shared memory is asked for first; if the driver refuses,
    :class:`SharedMemoryRefused` is raised before anything runs.
    """
    arrays = [a for a, _ in args.per_head]
    try:
        allow_large_shared_memory(kernel, (*arrays, *args.scalars), smem_bytes)
    except Exception as exc:
        raise SharedMemoryRefused(f"could not enable {smem_bytes} bytes of shared memory ({exc})") from exc
    g = args.kv_group
    if g > MAX_GRID_Y:
        raise ValueError(f"kv_group (query heads per K/V head) must be at most {MAX_GRID_Y}; got {g}")
    step = MAX_GRID_Y - MAX_GRID_Y % g  # heads per launch: a multiple of kv_group
    for h0 in range(0, args.n_heads, step):
        heads = min(step, args.n_heads - h0)
        views = []  # heads h0 .. h0 + heads - 1 of each array (K/V heads h0 / g .. (h0 + heads) / g - 1)
        for i, (a, size) in enumerate(args.per_head):
            first, count = (h0 // g, heads // g) if i in args.kv_arrays else (h0, heads)
            views.append(a[first * size:(first + count) * size])
        kernel[(n_tiles, heads), threads, 0, smem_bytes](*views, *args.scalars)
