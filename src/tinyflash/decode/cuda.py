"""Split-KV decoding on the GPU: the host wrappers of ``decode/kernels/``.

:func:`cuda_split_kv_attention` (a contiguous cache) and :func:`cuda_paged_attention` (a paged
one) do what every host wrapper here does, in this order: check the inputs, allocate the outputs
(and the splits' partials), size the grid, launch the split kernel and then the combine kernel.

A decode step is short (tens of µs at short contexts), so the host's part counts. For PyTorch and CuPy
inputs on a GPU, :func:`cuda_split_kv_attention` does the checks and the sizing once for each
combination of shapes, dtypes, ``num_splits``, ``causal`` and ``scale`` (a :class:`SizedDecode`, kept);
a call then allocates its outputs and launches two kernels through the driver, on the stream of the
inputs' library, so that a decode step can be captured in a CUDA graph. :func:`prepare_split_kv` and
:func:`prepare_paged` go further for a decode loop: their ``run()`` launches on buffers fixed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..core.checks import BFLOAT16, as_array, check_attention_inputs, check_positive_int
from ..core.online_softmax import LOG2E
from ..forward.tensor_cores import call_key
from ..gpu.arrays import bfloat16_bits, current_stream, dense, empty, is_device_array, numba_flat, result, to_device
from ..gpu.launch import MAX_GRID_Y, by_name
from ..gpu.ptx_emulation import fast_barriers
from ..gpu.runtime import require_compute_capability, require_gpu, simulator_enabled
from ..warp_tile import MIN_COMPUTE_CAPABILITY
from ..gpu.driver_launch import GridLaunch, driver_kernel
from ..gpu.launch import parameters
from ..hardware import current
from . import kernels
from .kernels import combine as combine_kernel
from .paged import check_cache as check_paged_cache
from .split_kv import BLOCKS_PER_SM, choose_num_splits

SUPPORTED = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))  # bfloat16: PyTorch tensors (or ml_dtypes)


def checked_problem(q, k, v, *, causal, scale):
    """:func:`check_attention_inputs` for decode's dtypes: float16, bfloat16 and float32."""
    return check_attention_inputs(q, k, v, causal=causal, scale=scale, allowed=SUPPORTED)


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


def _split_kernel(prob, *, batch, h_kv, n_k, page_size, num_splits, kernel=None, **tuning):
    """The split kernel that takes the problem (``kernel``: a name of :data:`tinyflash.decode.kernels.VERSIONS`, or
    None: the first that takes it) with its options ``tuning``, and the launch's :func:`plan`."""
    chosen = kernels.choose(prob, kernel)
    unknown = sorted(set(tuning) - set(chosen.options))
    if unknown:
        raise ValueError(f"the {chosen.name} decode kernel takes the options {list(chosen.options)}; got {unknown}")
    # both split kernels load K and V with cp.async (and the tensor cores' with mma.sync): Ampere on
    require_compute_capability(MIN_COMPUTE_CAPABILITY, f"the {chosen.name} decode kernel")
    split_kernel = chosen.split_kernel(prob, page_size, **tuning)
    if batch * h_kv > MAX_GRID_Y:
        raise ValueError(f"the decode kernels support B·H_kv <= {MAX_GRID_Y}; got {batch * h_kv}")
    return split_kernel, plan(batch, h_kv, prob.kv_group, prob.n_q, n_k, num_splits, max_rows=split_kernel.max_rows,
                              blocks_per_sm=split_kernel.blocks_per_sm)


def _split_scalars(prob, n_k: int, h_kv: int, max_pages: int) -> dict:
    """The split kernels' scalar arguments by name (each kernel takes those it has parameters for)."""
    return {"n_q": int(prob.n_q), "d": int(prob.d), "n_k": int(n_k), "h_kv": int(h_kv), "max_pages": int(max_pages),
            "scale_log2": np.float32(prob.scale * LOG2E), "causal": bool(prob.causal), "kv_group": int(prob.kv_group)}


def _combine_scalars(p: dict, d: int) -> dict:
    return {"n_splits": int(p["num_splits"]), "rows": int(p["rows"]), "d": int(d)}


def _combine_grid(p: dict, d: int, batch: int, h_kv: int) -> tuple:
    """One thread of the combine kernel per (packed row, column), a row of blocks per (sequence, K/V head)."""
    return -(-p["rows"] * d // combine_kernel.THREADS), batch * h_kv


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
    split_kernel, p = _split_kernel(prob, batch=batch, h_kv=h_kv, n_k=n_k, page_size=page_size, num_splits=num_splits,
                                    kernel=kernel, **tuning)
    like = q if on_device else None
    if prob.dtype == BFLOAT16:  # numba has no bfloat16: the kernels take its 16-bit patterns
        q, k, v = (bfloat16_bits(x) for x in (q, k, v))
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
    combine = combine_kernel.make_combine_kernel(str(prob.dtype))
    on_gpu = not simulator_enabled()  # a launch through the driver reads arrays as they are; numba's, flat
    q, k, v = (dense(x) if on_device and on_gpu else numba_flat(x) for x in (q, k, v))
    table, lens = ((dense(x) if on_gpu else numba_flat(x)) if is_device_array(x) else to_device(x, like)
                   for x in (table, lens))
    split_args = {"Q": q, "K": k, "V": v, "TABLE": table, "LENS": lens, "O_PART": o_part, "LSE_PART": lse_part,
                  **_split_scalars(prob, n_k, h_kv, max_pages)}
    nc = combine_kernel.THREADS
    combine_grid = _combine_grid(p, d, batch, h_kv)
    combine_args = {"O_PART": o_part, "LSE_PART": lse_part, "O": o, "LSE": lse, **_combine_scalars(p, d)}

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
    prob = checked_problem(q, k, v, causal=causal, scale=scale)
    if on_device != is_device_array(k) or on_device != is_device_array(v):
        raise TypeError("q, k and v must all be device arrays or all host arrays; got a mix")
    batch, h_kv = _lead(prob)
    lens = np.full(batch, prob.n_k, dtype=np.int32)  # (B,) every sequence holds all Nk keys
    table = np.zeros(1, dtype=np.int32)  # no block table: the cache is contiguous
    run, o, lse = _prepare(q, k, v, table, lens, prob, batch=batch, h_kv=h_kv, n_k=prob.n_k, max_pages=1,
                           page_size=0, num_splits=num_splits, on_device=on_device, **tuning)
    return run, o, lse, prob


@dataclass(frozen=True)
class SizedDecode:
    """A contiguous-cache decode call sized once for PyTorch or CuPy inputs of one shape on a GPU: the split and
    combine kernels' launches (grids, threads, shared memory and scalars fixed), the sizes of the outputs and the
    partials, and the block table and lengths the split kernel reads (device arrays, made once). A call allocates
    o, lse and the partials in the inputs' library and launches the two kernels on its current stream."""

    prob: object
    split: GridLaunch
    combine: GridLaunch
    sizes: tuple  # elements of o, lse, the splits' O partials, their lse partials
    table: object
    lens: object

    def __call__(self, q, k, v):
        n_o, n_lse, n_o_part, n_lse_part = self.sizes
        o, lse = empty(q, n_o, self.prob.dtype), empty(q, n_lse, np.float32)
        o_part, lse_part = empty(q, n_o_part, np.float32), empty(q, n_lse_part, np.float32)
        stream = current_stream(q)
        self.split(dense(q), dense(k), dense(v), self.table, self.lens, o_part, lse_part, stream=stream)
        self.combine(o_part, lse_part, o, lse, stream=stream)
        return o.reshape(self.prob.out_shape), lse.reshape(self.prob.lse_shape)


_SIZED: dict = {}  # key -> SizedDecode
MAX_SIZED = 1024  # then forgotten and made again: a program of ever new shapes holds no more


def sized_decode(q, k, v, num_splits, causal, scale) -> SizedDecode | None:
    """The :class:`SizedDecode` of these inputs, made on first use and kept; None where the whole-call path does
    not apply (NumPy or numba arrays, the simulator, an empty problem), and the general path runs."""
    key = call_key(q, k, v, causal, scale)
    if key is None or simulator_enabled() or (num_splits is not None and type(num_splits) is not int):
        return None
    key += (num_splits,)
    sized = _SIZED.get(key)
    if sized is None:
        prob = checked_problem(q, k, v, causal=causal, scale=scale)
        batch, h_kv = _lead(prob)
        if batch * h_kv * prob.n_q * prob.d == 0:
            return None
        split_kernel, p = _split_kernel(prob, batch=batch, h_kv=h_kv, n_k=prob.n_k, page_size=0, num_splits=num_splits)
        split, smem = split_kernel.build(p["rb"])
        scalars = _split_scalars(prob, prob.n_k, h_kv, 1)
        split_launch = GridLaunch.sized(driver_kernel(split, split_kernel.signature, smem), p["grid"],
                                        split_kernel.threads, smem,
                                        **{n: scalars[n] for n in parameters(split) if n in scalars})
        combine = combine_kernel.make_combine_kernel(str(prob.dtype))
        combine_launch = GridLaunch.sized(driver_kernel(combine, combine_kernel.combine_signature(prob.dtype)),
                                          _combine_grid(p, prob.d, batch, h_kv),
                                          combine_kernel.THREADS, 0, **_combine_scalars(p, prob.d))
        rows = batch * h_kv * p["rows"]
        sizes = (rows * prob.d, rows, rows * p["num_splits"] * prob.d, rows * p["num_splits"])
        table, lens = to_device(np.zeros(1, np.int32), q), to_device(np.full(batch, prob.n_k, np.int32), q)
        sized = SizedDecode(prob, split_launch, combine_launch, sizes, table, lens)
        if len(_SIZED) >= MAX_SIZED:
            _SIZED.clear()
        _SIZED[key] = sized
    return sized


def cuda_split_kv_attention(q, k, v, *, num_splits: int | None = None, causal: bool = False,
                            scale: float | None = None):
    """Split-KV (Flash-Decoding) attention on the GPU. Returns ``(o, lse)``.

    The contract of :func:`tinyflash.split_kv_attention`: q (..., H, Nq, d), k and v
    (..., H_kv, Nk, d), H a multiple of H_kv; here float16, bfloat16 or float32, dv == d, d up to 256
    (float16, bfloat16) or 128 (float32). NumPy in, NumPy out; device arrays in, device arrays out.
    ``num_splits=None``: :func:`tinyflash.decode.split_kv.choose_num_splits` for this GPU. bfloat16 (PyTorch
    tensors; NumPy has no bfloat16) at every head dim: on the tensor cores at theirs (64, 128), on the CUDA
    cores (float32 arithmetic) at the others. PyTorch and CuPy inputs on a GPU take the whole-call path
    (:class:`SizedDecode`: checked and sized once per shape, launched on the library's current stream).
    """
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    sized = sized_decode(q, k, v, num_splits, causal, scale)
    if sized is not None:
        return sized(q, k, v)
    run, o, lse, prob = prepare_split_kv(q, k, v, num_splits=num_splits, causal=causal, scale=scale)
    run()
    to_host = not is_device_array(q)
    bits_as = q.dtype if prob.dtype == BFLOAT16 else None  # host bfloat16 (ml_dtypes): the patterns relabelled
    return result(o, prob.out_shape, to_host, bits_as), result(lse, prob.lse_shape, to_host)


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
    prob = checked_problem(q, like_k, like_v, causal=causal, scale=scale)
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
    bits_as = q.dtype if prob.dtype == BFLOAT16 else None  # host bfloat16 (ml_dtypes): the patterns relabelled
    return result(o, prob.out_shape, to_host, bits_as), result(lse, prob.lse_shape, to_host)
