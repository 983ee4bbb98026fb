"""Split-KV decoding on the GPU: the host wrappers of ``decode/kernels/``.

:func:`cuda_split_kv_attention` (a contiguous cache) and :func:`cuda_paged_attention` (a paged
one) do what every host wrapper here does, in this order: check the inputs, allocate the outputs
(and the splits' partials), size the grid, launch the split kernel and then the combine kernel.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ..core.checks import as_array, check_attention_inputs, check_positive_int
from ..core.online_softmax import LOG2E
from ..gpu.arrays import dense, empty, is_device_array, numba_flat, result, to_device
from ..gpu.launch import MAX_GRID_Y, by_name
from ..gpu.ptx_emulation import fast_barriers
from ..gpu.runtime import require_gpu, simulator_enabled
from ..gpu.driver_launch import driver_kernel
from ..hardware import current
from . import kernels
from .kernels import combine as combine_kernel
from .paged import check_cache as check_paged_cache
from .split_kv import BLOCKS_PER_SM, choose_num_splits

SUPPORTED = (np.dtype(np.float16), np.dtype(np.float32))


def plan(batch: int, h_kv: int, kv_group: int, n_q: int, n_k: int, num_splits=None, *, max_rows: int,
         blocks_per_sm: int = BLOCKS_PER_SM) -> dict:
    """The launch: rows per block, row chunks, splits and the grid, for one decode call
    (``max_rows`` packed rows per block at most, ``blocks_per_sm`` of them resident per SM)."""
    rows = kv_group * n_q  # packed rows per K/V head
    rb = min(max_rows, rows)
    chunks = -(-rows // rb)
    if num_splits is None:
        num_splits = choose_num_splits(batch * h_kv * chunks, n_k, current().sms, blocks_per_sm)
    num_splits = check_positive_int(num_splits, "num_splits")
    return {"rows": rows, "rb": rb, "grid": (num_splits, batch * h_kv, chunks), "num_splits": num_splits}


def _prepare(q, k, v, table, lens, prob, *, batch, h_kv, n_k, max_pages, page_size, num_splits, on_device,
             kernel=None, **tuning):
    """Check what the kernels need, allocate the outputs and the splits' partials, size the grid.

    ``kernel`` names a split kernel of :data:`tinyflash.decode.kernels.VERSIONS` (None: the first that takes
    the inputs: the tensor cores for 16-bit inputs at their head dims, the CUDA cores otherwise); ``tuning``
    are that kernel's options (the tensor cores' ``tiling``, a ``DecodeTiling``; the CUDA cores' ``threads``,
    ``unroll``, ``row_bytes``, ``max_registers``). The benchmark tries a few.

    Returns ``(run, o, lse)``: ``run(stream=0)`` launches the split kernel then the combine kernel
    and does nothing else, so that a benchmark times the kernels, not the checks (on a GPU its
    arguments are packed once, here).
    """
    d = prob.d
    chosen = kernels.choose(prob, kernel)
    unknown = sorted(set(tuning) - set(chosen.options))
    if unknown:
        raise ValueError(f"the {chosen.name} decode kernel takes the options {list(chosen.options)}; got {unknown}")
    split_kernel = chosen.split_kernel(prob, page_size, **tuning)
    if batch * h_kv > MAX_GRID_Y:
        raise ValueError(f"the decode kernels support B·H_kv <= {MAX_GRID_Y}; got {batch * h_kv}")
    p = plan(batch, h_kv, prob.kv_group, prob.n_q, n_k, num_splits, max_rows=split_kernel.max_rows,
             blocks_per_sm=split_kernel.blocks_per_sm)
    like = q if on_device else None
    o = empty(like, batch * h_kv * p["rows"] * d, prob.dtype)  # (B·H·Nq·d,) flat: packed rows of each K/V head
    lse = empty(like, batch * h_kv * p["rows"], np.float32)  # (B·H·Nq,)
    if batch * h_kv * p["rows"] == 0:
        def nothing(stream=0):
            return None

        nothing.plan = p
        return nothing, o, lse
    o_part = empty(like, batch * h_kv * p["num_splits"] * p["rows"] * d, np.float32)  # (B·H_kv, S, rows, d)
    lse_part = empty(like, batch * h_kv * p["num_splits"] * p["rows"], np.float32)  # (B·H_kv, S, rows)
    split, smem = split_kernel.build(p["rb"])
    combine = combine_kernel.make_combine_kernel()
    on_gpu = not simulator_enabled()  # a launch through the driver reads arrays as they are; numba's, flat
    q, k, v = (dense(x) if on_device and on_gpu else numba_flat(x) for x in (q, k, v))
    table, lens = ((dense(x) if on_gpu else numba_flat(x)) if is_device_array(x) else to_device(x, like)
                   for x in (table, lens))
    split_args = {"Q": q, "K": k, "V": v, "TABLE": table, "LENS": lens, "O_PART": o_part, "LSE_PART": lse_part,
                  "n_q": int(prob.n_q), "d": int(d), "n_k": int(n_k), "h_kv": int(h_kv), "max_pages": int(max_pages),
                  "scale_log2": np.float32(prob.scale * LOG2E), "causal": bool(prob.causal),
                  "kv_group": int(prob.kv_group)}
    nc = combine_kernel.THREADS
    combine_grid = (-(-p["rows"] * d // nc), batch * h_kv)  # one thread per (packed row, column)
    combine_args = {"O_PART": o_part, "LSE_PART": lse_part, "O": o, "LSE": lse, "n_splits": int(p["num_splits"]),
                    "rows": int(p["rows"]), "d": int(d)}

    if not on_gpu:  # numba's launches, on its (simulated) arrays; some arrays as uint32 words, as the kernel reads them
        for name in split_kernel.word_args:
            split_args[name] = split_args[name].view(np.uint32)

        def run(stream=0):
            with fast_barriers():  # the tensor-core kernel's emulated warp instructions wait at barriers
                split[p["grid"], split_kernel.threads, 0, smem](*by_name(split, split_args))
            combine[combine_grid, nc](*by_name(combine, combine_args))

        run.plan = p
        return run, o, lse
    # on a GPU, through the driver, the arguments packed once (gpu/driver_launch.py): a few µs per launch
    split_driver = driver_kernel(split, split_kernel.signature, smem)
    split_launch = split_driver.bind(p["grid"], split_kernel.threads, smem, *split_driver.arguments(split_args))
    combine_driver = driver_kernel(combine, combine_kernel.combine_signature(prob.dtype))
    combine_launch = combine_driver.bind(combine_grid, nc, 0, *combine_driver.arguments(combine_args))
    # the launches hold these addresses: keep every array alive as long as run, the outputs too (a caller that
    # keeps only o must not let lse's memory go to another array that the combine kernel would then overwrite)
    keep = (q, k, v, table, lens, o_part, lse_part, o, lse)

    def run(stream: int = 0):
        """Launch the split kernel then the combine kernel on ``stream`` (a CUstream handle; 0: the default)."""
        split_launch(stream)
        combine_launch(stream)

    run.arrays, run.plan = keep, p
    return run, o, lse


def _lead(prob):
    """(B, H_kv): the sequences (every leading dim but the head axis, flattened) and K/V heads."""
    lead = prob.kv_lead
    return (math.prod(lead[:-1]), lead[-1]) if lead else (1, 1)


def prepare_split_kv(q, k, v, *, num_splits: int | None = None, causal: bool = False, scale: float | None = None,
                     **tuning):
    """Everything :func:`cuda_split_kv_attention` does before launching: ``(run, o, lse, prob)``.
    ``run()`` launches the kernels into ``o`` and ``lse`` (flat device arrays); the benchmark times
    it. ``tuning``: ``kernel`` (a name of :data:`tinyflash.decode.kernels.VERSIONS`) and that kernel's
    options (see :func:`_prepare`)."""
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    on_device = is_device_array(q)
    if not on_device:
        q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale, allowed=SUPPORTED)
    if on_device != is_device_array(k) or on_device != is_device_array(v):
        raise TypeError("q, k and v must all be device arrays or all host arrays; got a mix")
    batch, h_kv = _lead(prob)
    lens = np.full(batch, prob.n_k, dtype=np.int32)  # (B,) every sequence holds all Nk keys
    table = np.zeros(1, dtype=np.int32)  # no block table: the cache is contiguous
    run, o, lse = _prepare(q, k, v, table, lens, prob, batch=batch, h_kv=h_kv, n_k=prob.n_k, max_pages=1,
                           page_size=0, num_splits=num_splits, on_device=on_device, **tuning)
    return run, o, lse, prob


def cuda_split_kv_attention(q, k, v, *, num_splits: int | None = None, causal: bool = False,
                            scale: float | None = None):
    """Split-KV (Flash-Decoding) attention on the GPU. Returns ``(o, lse)``.

    The contract of :func:`tinyflash.split_kv_attention`: q (..., H, Nq, d), k and v
    (..., H_kv, Nk, d), H a multiple of H_kv; here float16 or float32, dv == d, d up to 256
    (float16) or 128 (float32). NumPy in, NumPy out; device arrays in, device arrays out.
    ``num_splits=None``: :func:`tinyflash.decode.split_kv.choose_num_splits` for this GPU.
    """
    run, o, lse, prob = prepare_split_kv(q, k, v, num_splits=num_splits, causal=causal, scale=scale)
    run()
    to_host = not is_device_array(q)
    return result(o, prob.out_shape, to_host), result(lse, prob.lse_shape, to_host)


def prepare_paged(q, cache, *, num_splits: int | None = None, causal: bool = False, scale: float | None = None,
                  check_cache: bool = True, **tuning):
    """Everything :func:`cuda_paged_attention` does before launching: ``(run, o, lse, prob)``. ``check_cache``:
    :func:`tinyflash.decode.paged.check_cache` first (False: for a decode loop that checked its cache once)."""
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    on_device = is_device_array(q)
    k_pages, v_pages, table, lens = cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens
    if len(q.shape) != 4 or len(k_pages.shape) != 4 or len(table.shape) != 2 or table.shape[0] != q.shape[0]:
        raise ValueError(f"q must be (B, H, Nq, d), the pages (num_pages, H_kv, page_size, d) and the block table "
                         f"(B, max_pages); got q {tuple(q.shape)}, pages {tuple(k_pages.shape)}, table "
                         f"{tuple(table.shape)}")
    if check_cache:
        check_paged_cache(cache, q.shape[0])
    if not is_device_array(table):
        table, lens = np.asarray(table, dtype=np.int32), np.asarray(lens, dtype=np.int32)  # what the kernel reads
    n_k = int(lens.max()) if not is_device_array(lens) else int(table.shape[1] * k_pages.shape[2])
    batch, (_, h_kv, page_size, d) = q.shape[0], k_pages.shape
    like_k = SimpleNamespace(shape=(batch, h_kv, n_k, d), dtype=k_pages.dtype)  # what the checks read
    like_v = SimpleNamespace(shape=(batch, h_kv, n_k, v_pages.shape[-1]), dtype=v_pages.dtype)
    prob = check_attention_inputs(q, like_k, like_v, causal=causal, scale=scale, allowed=SUPPORTED)
    run, o, lse = _prepare(q, k_pages, v_pages, table, lens, prob, batch=batch, h_kv=h_kv, n_k=n_k,
                           max_pages=table.shape[1], page_size=page_size, num_splits=num_splits, on_device=on_device,
                           **tuning)
    return run, o, lse, prob


def cuda_paged_attention(q, cache, *, num_splits: int | None = None, causal: bool = False,
                         scale: float | None = None, check_cache: bool = True):
    """Decode attention on a paged cache (:class:`tinyflash.decode.paged.PagedKVCache`, NumPy or
    device arrays in its fields) on the GPU, reading every key through the block table.

    q (B, H, Nq, d); sequence b attends its seq_lens[b] keys. Returns ``(o, lse)`` as
    :func:`tinyflash.decode.paged.paged_attention` does. The cache is checked first
    (:func:`tinyflash.decode.paged.check_cache`: a block-table entry outside the pool or a length outside the
    table is a ValueError, never a read outside the pool); ``check_cache=False`` skips it, for a decode
    loop that checked its cache once.
    """
    run, o, lse, prob = prepare_paged(q, cache, num_splits=num_splits, causal=causal, scale=scale,
                                      check_cache=check_cache)
    run()
    to_host = not is_device_array(q)
    return result(o, prob.out_shape, to_host), result(lse, prob.lse_shape, to_host)
