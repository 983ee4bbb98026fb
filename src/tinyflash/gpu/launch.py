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
    scalars: tuple  # the arguments after the arrays
    n_heads: int  # batch · heads: the blocks along y


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
    for h0 in range(0, args.n_heads, MAX_GRID_Y):
        heads = min(MAX_GRID_Y, args.n_heads - h0)
        views = [a[h0 * size:(h0 + heads) * size] for a, size in args.per_head]  # heads h0 .. h0 + heads - 1
        kernel[(n_tiles, heads), threads, 0, smem_bytes](*views, *args.scalars)
