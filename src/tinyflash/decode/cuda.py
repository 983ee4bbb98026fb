"""Split-KV decoding on the GPU: the host wrappers of ``decode/kernels.py``.

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
from ..gpu.arrays import empty, flat_device, is_device_array, result, to_device_flat, to_device_like
from ..gpu.launch import MAX_GRID_Y
from ..gpu.ptx_emulation import fast_barriers
from ..gpu.runtime import require_gpu, simulator_enabled
from ..gpu.driver_launch import driver_kernel
from ..hardware import current
from . import kernels
from . import tensor_cores as tc
from .split_kv import BLOCKS_PER_SM, choose_num_splits

SUPPORTED = (np.dtype(np.float16), np.dtype(np.float32))


def plan(batch: int, h_kv: int, kv_group: int, n_q: int, n_k: int, num_splits=None, *, max_rows: int = kernels.MAX_ROWS,
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


def use_tensor_cores(prob, tensor_cores=None) -> bool:
    """Whether a decode call runs the tensor-core split kernel (``decode/tensor_cores.py``): float16
    with d = dv in its head dims, unless ``tensor_cores`` says otherwise (False: the CUDA-core kernel;
    True: the tensor cores, or a clear error)."""
    fits = prob.dtype == np.float16 and prob.d == prob.d_v and prob.d in tc.HEAD_DIMS
    if tensor_cores and not fits:
        raise ValueError(f"the tensor-core decode kernel takes float16 with d = dv in {tc.HEAD_DIMS}; got "
                         f"{prob.dtype.name}, d={prob.d}, dv={prob.d_v} (tensor_cores=False: the CUDA-core kernel)")
    return fits if tensor_cores is None else bool(tensor_cores)


def _split_kernel(prob, page_size, tensor_cores, tiling, threads, unroll, row_bytes, max_registers):
    """Which split kernel this call runs, checked: ``(build, threads per block, max packed rows per
    block, blocks per SM, signature, words)``; ``build(rb)`` returns (kernel, shared memory bytes)
    for rb packed rows per block; ``words``: K and V travel as uint32 words (pairs of 16-bit values,
    or whole 16-byte pieces of float32 rows)."""
    d = prob.d
    if prob.d_v != d:
        raise ValueError(f"the decode kernels need dv == d; got d={d}, dv={prob.d_v}")
    if use_tensor_cores(prob, tensor_cores):
        if threads or unroll or row_bytes or max_registers:
            raise ValueError("threads, unroll, row_bytes and max_registers tune the CUDA-core kernel; the "
                             "tensor-core kernel takes tiling= (a decode.tensor_cores.DecodeTiling)")
        cfg = (tiling or tc.default_tiling(d)).validate()
        if cfg.D != d:
            raise ValueError(f"tiling {cfg} is for d = {cfg.D}; got d = {d}")
        return (lambda rb: tc.make_split_kernel(cfg, page_size)), tc.WARP, tc.ROWS, cfg.blocks_per_sm(), \
            tc.SIGNATURE, True
    if tiling is not None:
        raise ValueError(f"tiling= tunes the tensor-core kernel (float16, d in {tc.HEAD_DIMS}); this call runs the "
                         "CUDA-core kernel")
    row_bytes = row_bytes or kernels.LOAD_BYTES
    if row_bytes % kernels.LOAD_BYTES:
        raise ValueError(f"row_bytes must be a multiple of {kernels.LOAD_BYTES}; got {row_bytes}")
    VEC, D, TD = kernels.lanes(d, prob.dtype.itemsize, row_bytes)
    if TD > 32:
        raise ValueError(f"the decode kernels support head dims up to {32 * VEC} for {prob.dtype.name}; got d={d}")
    nt, unroll = threads or kernels.threads(), unroll or kernels.UNROLL
    if nt % 32 or nt < TD or unroll < 1:
        raise ValueError(f"threads must be a multiple of 32 and at least {TD}, unroll at least 1; got {nt}, {unroll}")
    full = d == D  # whole 16-byte pieces per row: K and V are copied by cp.async, as uint32 words

    def build(rb):
        return kernels.make_split_kernel(rb, D, VEC, nt, full, page_size, unroll, prob.dtype.itemsize, max_registers)

    return build, nt, kernels.MAX_ROWS, BLOCKS_PER_SM, kernels.split_signature(prob.dtype, full), full


def _prepare(q, k, v, table, lens, prob, *, batch, h_kv, n_k, max_pages, page_size, num_splits, on_device,
             tensor_cores=None, tiling=None, threads=None, unroll=None, row_bytes=None, max_registers=None):
    """Check what the kernels need, allocate the outputs and the splits' partials, size the grid.

    ``tensor_cores``: None picks the tensor-core split kernel for float16 at d in
    ``tensor_cores.HEAD_DIMS``, the CUDA-core one otherwise; False or True force one. ``tiling``
    (a :class:`~tinyflash.decode.tensor_cores.DecodeTiling`) tunes the tensor-core kernel;
    ``threads``, ``unroll``, ``row_bytes`` and ``max_registers`` the CUDA-core one: its block size,
    keys per slot and tile, bytes per thread and key row (kernels.threads(), kernels.UNROLL,
    kernels.LOAD_BYTES; row_bytes a multiple of 16), a cap on registers per thread (default: none).
    The benchmark tries a few.

    Returns ``(run, o, lse)``: ``run(stream=0)`` launches the split kernel then the combine kernel
    and does nothing else, so that a benchmark times the kernels, not the checks (on a GPU its
    arguments are packed once, here).
    """
    d = prob.d
    build, nt, max_rows, per_sm, signature, words = _split_kernel(prob, page_size, tensor_cores, tiling, threads,
                                                                 unroll, row_bytes, max_registers)
    if batch * h_kv > MAX_GRID_Y:
        raise ValueError(f"the decode kernels support B·H_kv <= {MAX_GRID_Y}; got {batch * h_kv}")
    p = plan(batch, h_kv, prob.kv_group, prob.n_q, n_k, num_splits, max_rows=max_rows, blocks_per_sm=per_sm)
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
    split, smem = build(p["rb"])
    combine = kernels.make_combine_kernel()
    q, k, v = (flat_device(x) if on_device else to_device_flat(x) for x in (q, k, v))
    table, lens = (flat_device(x) if is_device_array(x) else to_device_like(like, x) for x in (table, lens))
    tensor = signature is tc.SIGNATURE
    scalars = ((int(prob.n_q), int(n_k), int(h_kv), int(max_pages)) if tensor
               else (int(prob.n_q), int(d), int(n_k), int(h_kv), int(max_pages)))
    scalars += (np.float32(prob.scale * LOG2E), bool(prob.causal), int(prob.kv_group))
    nc = kernels.COMBINE_THREADS
    combine_grid = (-(-p["rows"] * d // nc), batch * h_kv)  # one thread per (packed row, column)
    combine_sizes = (int(p["num_splits"]), int(p["rows"]), int(d))

    if simulator_enabled():  # numba's launches, on its (simulated) arrays
        as_words = (lambda x: x.view(np.uint32)) if words else (lambda x: x)
        inputs = (as_words(q) if tensor else q, as_words(k), as_words(v))

        def run(stream=0):
            with fast_barriers():  # the tensor-core kernel's emulated warp instructions wait at barriers
                split[p["grid"], nt, 0, smem](*inputs, table, lens, o_part, lse_part, *scalars)
            combine[combine_grid, nc](o_part, lse_part, o, lse, *combine_sizes)

        run.plan = p
        return run, o, lse
    # on a GPU, through the driver, the arguments packed once (gpu/driver_launch.py): a few µs per launch
    split_launch = driver_kernel(split, signature, smem).bind(p["grid"], nt, smem, q, k, v, table, lens, o_part,
                                                              lse_part, *scalars)
    combine_launch = driver_kernel(combine, kernels.combine_signature(prob.dtype)).bind(
        combine_grid, nc, 0, o_part, lse_part, o, lse, *combine_sizes)
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
    it. ``tuning``: ``threads``, ``unroll``, ``row_bytes``, ``max_registers`` (see
    :func:`_prepare`)."""
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
                  **tuning):
    """Everything :func:`cuda_paged_attention` does before launching: ``(run, o, lse, prob)``."""
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    on_device = is_device_array(q)
    k_pages, v_pages, table, lens = cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens
    if len(q.shape) != 4 or len(k_pages.shape) != 4 or len(table.shape) != 2 or table.shape[0] != q.shape[0]:
        raise ValueError(f"q must be (B, H, Nq, d), the pages (num_pages, H_kv, page_size, d) and the block table "
                         f"(B, max_pages); got q {tuple(q.shape)}, pages {tuple(k_pages.shape)}, table "
                         f"{tuple(table.shape)}")
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
                         scale: float | None = None):
    """Decode attention on a paged cache (:class:`tinyflash.decode.paged.PagedKVCache`, NumPy or
    device arrays in its fields) on the GPU, reading every key through the block table.

    q (B, H, Nq, d); sequence b attends its seq_lens[b] keys. Returns ``(o, lse)`` as
    :func:`tinyflash.decode.paged.paged_attention` does.
    """
    run, o, lse, prob = prepare_paged(q, cache, num_splits=num_splits, causal=causal, scale=scale)
    run()
    to_host = not is_device_array(q)
    return result(o, prob.out_shape, to_host), result(lse, prob.lse_shape, to_host)
