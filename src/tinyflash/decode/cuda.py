"""Split-KV decoding on the GPU: the host wrappers of ``decode/kernels/``.

:func:`cuda_split_kv_attention` (a contiguous cache) and :func:`cuda_paged_attention` (a paged
one) do what every host wrapper here does, in this order: check the inputs, allocate the outputs
(and the splits' partials), size the grid, launch the split kernel and then the combine kernel.

A decode step is short (tens of µs at short contexts), so the host's part counts. For PyTorch and CuPy
inputs on a GPU, :func:`cuda_split_kv_attention` does the checks, the sizing and the packing of both kernels'
parameters once per ``host.plans.decode_key`` (shapes, dtypes, contiguity and GPU of q, k and v; ``num_splits``,
``causal``, ``scale``): a :class:`DecodePlan`, kept in ``host.plans.PLANS``. A call then looks its plan up with one tuple, allocates
three arrays (o, lse and one workspace for the splits' partials), writes their addresses and the inputs'
into the packed parameters and launches two kernels through the driver, on the stream of the inputs'
library, without synchronising, so that a decode step can be captured in a CUDA graph
(``benchmarks/decode_host_time.py`` times that path). :func:`prepare_split_kv` and :func:`prepare_paged` go
further for a decode loop: their ``run()`` launches on buffers fixed once.

On Hopper the combine kernel is launched with programmatic dependent launch (:func:`overlaps_combine`): the
driver may start it while the split kernel's last blocks run, and each of its blocks waits inside for the
partials, so the two kernels leave less idle time between them (docs/results.md says what it gains).

The checks, the plan cache and the registry are the host layer's (``tinyflash.host``) and ``decode/kernels``'.
"""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import numpy as np

from ..core.checks import BFLOAT16, check_attention_inputs, check_positive_int
from ..core.online_softmax import LOG2E
from ..gpu.arrays import (ArrayLibrary, array_library, bfloat16_bits, dense, empty, is_device_array, library,
                          numba_flat, result, to_device, zeros)
from ..gpu.driver_launch import Bytes, PackedLaunch, driver_kernel
from ..gpu.launch import MAX_GRID_Y, by_name
from ..gpu.ptx_emulation import fast_barriers
from ..gpu.runtime import compute_capability, require_compute_capability, require_gpu, simulator_enabled
from ..hardware import current
from ..host.inputs import CUDA_CORES, placed
from ..host.plans import PLANS, decode_key
from ..warp_tile import MIN_COMPUTE_CAPABILITY
from . import kernels
from .kernels import combine as combine_kernel
from .paged import check_cache as check_paged_cache
from .split_kv import BLOCKS_PER_SM, choose_num_splits
OVERLAP_CAPABILITY = (9, 0)  # programmatic dependent launch (griddepcontrol): Hopper on


def overlaps_combine(overlap: bool | None = None) -> bool:
    """Whether the combine kernel is launched to overlap the split kernel's end (programmatic dependent launch:
    ``gpu.driver_launch.LaunchConfig``; it waits for the partials inside, ``combine.make_combine_kernel``).
    ``overlap``: None, when the current GPU has it (compute capability 9.0 on); True or False, as said (True on an
    older GPU is a ValueError)."""
    if overlap is not None and type(overlap) is not bool:
        raise TypeError(f"overlap_combine must be None or a bool; got {type(overlap).__name__} {overlap!r}")
    able = simulator_enabled() or compute_capability() >= OVERLAP_CAPABILITY
    if overlap and not able:
        need, found = (".".join(map(str, c)) for c in (OVERLAP_CAPABILITY, compute_capability()))
        raise ValueError(f"overlap_combine=True needs compute capability {need} or more; this GPU has {found}")
    return able if overlap is None else overlap


def checked_problem(q, k, v, *, causal, scale):
    """:func:`check_attention_inputs` for decode's dtypes: float16, bfloat16 and float32."""
    return check_attention_inputs(q, k, v, causal=causal, scale=scale, allowed=CUDA_CORES)


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
    split_kernel = chosen.build(prob, page_size, **tuning)
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
    """A block of the combine kernel per (packed row, sequence and K/V head, THREADS columns)."""
    return combine_kernel.grid(p["rows"], d, batch * h_kv)


def _prepare(q, k, v, table, lens, prob, *, batch, h_kv, n_k, max_pages, page_size, num_splits, on_device,
             kernel=None, overlap_combine=None, **tuning):
    """Check what the kernels need, allocate the outputs and the splits' partials, size the grid.

    ``kernel`` names a split kernel of :data:`tinyflash.decode.kernels.VERSIONS` (None: the first that takes
    the inputs: the tensor cores for 16-bit inputs at their head dims, the CUDA cores otherwise); ``tuning``
    are that kernel's options (the tensor cores' ``tiling``, a ``DecodeTiling``, and ``merge``: the split kernel
    merges the partials itself, at most ``combine.MAX_MERGED_SPLITS`` splits; the CUDA cores' ``threads``,
    ``unroll``, ``row_bytes``, ``max_registers``). The benchmark tries a few. ``overlap_combine``: launch the
    combine kernel to overlap the split kernel's end (:func:`overlaps_combine`; None: where the GPU can).

    Returns ``(run, o, lse)``: ``run(stream=0)`` launches the split kernel then the combine kernel (with
    ``merge``, the split kernel alone) and does nothing else, so that a benchmark times the kernels, not the
    checks (on a GPU its arguments are packed once, here). With ``merge``, ``run`` calls on one stream at a
    time: each row set's arrival counter is shared by the calls of one prepared ``run``.
    """
    d = prob.d
    split_kernel, p = _split_kernel(prob, batch=batch, h_kv=h_kv, n_k=n_k, page_size=page_size, num_splits=num_splits,
                                    kernel=kernel, **tuning)
    merged = split_kernel.merged  # the split kernel merges the partials itself: no combine kernel
    overlap = overlaps_combine(overlap_combine) and not merged  # the combine launched to overlap the split's end
    problems = combine_kernel.merge_problems(p["num_splits"], p["rb"], d) if merged else []
    if problems:
        raise ValueError("; ".join(problems))
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
    on_gpu = not simulator_enabled()  # a launch through the driver reads arrays as they are; numba's, flat
    combine = combine_kernel.make_combine_kernel(str(prob.dtype), overlap)
    q, k, v = (dense(x) if on_device and on_gpu else numba_flat(x) for x in (q, k, v))
    table, lens = ((dense(x) if on_gpu else numba_flat(x)) if is_device_array(x) else to_device(x, like)
                   for x in (table, lens))
    split_args = {"Q": q, "K": k, "V": v, "TABLE": table, "LENS": lens, "O_PART": o_part, "LSE_PART": lse_part,
                  **_split_scalars(prob, n_k, h_kv, max_pages)}
    if merged:  # one arrival counter per row set, zero between calls (the kernel leaves it so)
        split_args.update(O=o, LSE=lse, ARRIVED=zeros(like, p["grid"][1] * p["grid"][2], np.uint32))
    # run.arrays: the launches hold these addresses, so every array lives as long as run, the outputs too (a caller
    # that keeps only o must not let lse's memory go to another array that the combine kernel would then overwrite)
    keep = (q, k, v, table, lens, o_part, lse_part, o, lse, split_args.get("ARRIVED"))
    nc = combine_kernel.THREADS
    combine_grid = _combine_grid(p, d, batch, h_kv)
    combine_args = {"O_PART": o_part, "LSE_PART": lse_part, "O": o, "LSE": lse, **_combine_scalars(p, d)}

    if not on_gpu:  # numba's launches, on its (simulated) arrays; some arrays as uint32 words, as the kernel reads them
        for name in split_kernel.word_args:
            split_args[name] = split_args[name].view(np.uint32)

        def run(stream=0):
            with fast_barriers():  # the tensor-core kernel's emulated warp instructions wait at barriers
                split[p["grid"], split_kernel.threads, 0, smem](*by_name(split, split_args))
            if not merged:
                combine[combine_grid, nc](*by_name(combine, combine_args))

        run.arrays, run.plan = keep, p
        return run, o, lse
    # on a GPU, through the driver, the arguments packed once (gpu/driver_launch.py): a few µs per launch
    split_driver = driver_kernel(split, split_kernel.signature, smem)
    split_launch = split_driver.bind(p["grid"], split_kernel.threads, smem, *split_driver.arguments(split_args))
    combine_driver = driver_kernel(combine, combine_kernel.combine_signature(prob.dtype))
    combine_launch = combine_driver.bind(combine_grid, nc, 0, *combine_driver.arguments(combine_args),
                                         after_previous=overlap)

    def run(stream: int = 0):
        """Launch the split kernel then the combine kernel (unless the split kernel merges) on ``stream`` (a
        CUstream handle; 0: the default)."""
        split_launch(stream)
        if not merged:
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
    found, on_device = placed({"q": q, "k": k, "v": v})
    q, k, v = found.values()
    prob = checked_problem(q, k, v, causal=causal, scale=scale)
    if num_splits is not None:
        check_positive_int(num_splits, "num_splits")
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    batch, h_kv = _lead(prob)
    lens = np.full(batch, prob.n_k, dtype=np.int32)  # (B,) every sequence holds all Nk keys
    table = np.zeros(1, dtype=np.int32)  # no block table: the cache is contiguous
    run, o, lse = _prepare(q, k, v, table, lens, prob, batch=batch, h_kv=h_kv, n_k=prob.n_k, max_pages=1,
                           page_size=0, num_splits=num_splits, on_device=on_device, **tuning)
    return run, o, lse, prob


class DecodePlan:
    """A contiguous-cache decode call planned once, for PyTorch or CuPy inputs on a GPU, per ``host.plans.decode_key``:
    every check passed, the split kernel chosen, the grids sized, the block table and lengths the split kernel
    reads made (device arrays on the inputs' GPU), and both kernels' parameters packed (:class:`PackedLaunch`)
    but for the addresses of q, k, v, the outputs and the partials.

    A call (:meth:`__call__`) allocates three arrays in the inputs' library, on its current stream: o, lse, and
    one workspace that holds the splits' O partials and then their lse partials. It writes the seven addresses
    that change (q, k, v, o, lse, and the two parts of the workspace) into the packed parameters and launches the
    split kernel and then the combine kernel on that stream. It does not synchronise. The workspace is freed
    when the call returns. PyTorch's caching allocator and CuPy's memory pool hand freed memory only to later
    work on the same stream, and both kernels are queued on that stream before the free, so the next user of
    that memory runs after the combine kernel has read it. A workspace kept between calls (one per plan and stream) would save one allocation (2-4 µs),
    but it would hold up to tens of MB per plan for as long as the plan lives, and a CUDA graph captured with
    it would hold its address after the plan is forgotten.
    """

    def __init__(self, prob, lib: ArrayLibrary, device: int, split: PackedLaunch, combine: PackedLaunch,
                 o_part_elements: int, lse_part_elements: int, gather: bool, keep: tuple):
        self.prob, self.lib, self.device, self.split, self.combine = prob, lib, device, split, combine
        self.out_shape, self.lse_shape = prob.out_shape, prob.lse_shape
        self.float32 = lib.dtypes["float32"]
        self.lse_part_at = 4 * (-(-o_part_elements // 4))  # the lse partials start 16 bytes aligned
        self.workspace = self.lse_part_at + lse_part_elements  # float32 elements
        self.gather = gather  # an input is not C-contiguous (the key says which): copied at each call
        self.keep = keep  # the block table and lengths that the split kernel's packed parameters point to
        self.lock = threading.Lock()  # the packed parameters are shared: one call writes and launches at a time

    def __call__(self, q, k, v):
        lib = self.lib
        if lib.device() != self.device:  # the inputs' GPU is not the current one: allocate and launch there
            from numba import cuda

            with cuda.gpus[self.device]:
                return self._call(q, k, v, lib)
        return self._call(q, k, v, lib)

    def _call(self, q, k, v, lib):
        address = lib.address
        if self.gather:
            q, k, v = dense(q), dense(k), dense(v)
        q_at, k_at, v_at = address(q), address(k), address(v)
        if (q_at | k_at | v_at) & 15:  # a view that starts off a 16-byte boundary (cp.async needs one): a copy
            q, k, v = dense(q), dense(k), dense(v)
            q_at, k_at, v_at = address(q), address(k), address(v)
        o = lib.empty(q, self.out_shape, None)  # (..., H, Nq, d) in q's dtype: packed rows of each K/V head
        lse = lib.empty(q, self.lse_shape, self.float32)  # (..., H, Nq)
        work = lib.empty(q, self.workspace, self.float32)  # (B·H_kv·S·rows·d,) O partials, (B·H_kv·S·rows,) lse
        o_part_at = address(work)
        lse_part_at = o_part_at + 4 * self.lse_part_at
        stream = lib.stream(self.device)
        split, combine = self.split, self.combine
        with self.lock:
            slots, (at_q, at_k, at_v, at_o_part, at_lse_part) = split.slots, split.where
            slots[at_q], slots[at_k], slots[at_v], slots[at_o_part], slots[at_lse_part] = (
                q_at, k_at, v_at, o_part_at, lse_part_at)
            slots, (at_o_part, at_lse_part, at_o, at_lse) = combine.slots, combine.where
            slots[at_o_part], slots[at_lse_part], slots[at_o], slots[at_lse] = (
                o_part_at, lse_part_at, address(o), address(lse))
            split.launch(stream)
            combine.launch(stream)
        return o, lse


def make_plan(lib: ArrayLibrary, key, q, k, v, num_splits, causal, scale) -> DecodePlan | None:
    """Check the inputs and plan their call (:class:`DecodePlan`); None where the planned path does not apply (the
    simulator, host tensors, an empty problem) and the general path runs, with its own checks and errors."""
    devices = key[-1][-3:]
    if simulator_enabled() or min(devices) < 0:
        return None
    if len(set(devices)) > 1:
        raise ValueError(f"q, k and v must be on one GPU; got q on GPU {devices[0]}, k on GPU {devices[1]}, "
                         f"v on GPU {devices[2]}")
    prob = checked_problem(q, k, v, causal=causal, scale=scale)
    batch, h_kv = _lead(prob)
    if batch * h_kv * prob.n_q * prob.d == 0:
        return None
    device = devices[0]
    if lib.device() != device:  # load the kernels into the inputs' GPU's context, size for its SMs
        from numba import cuda

        with cuda.gpus[device]:
            return _plan(lib, prob, q, k, v, batch, h_kv, device, num_splits)
    return _plan(lib, prob, q, k, v, batch, h_kv, device, num_splits)


def _plan(lib, prob, q, k, v, batch, h_kv, device, num_splits) -> DecodePlan:
    """:func:`make_plan`'s work on the inputs' GPU: choose and size the split kernel, pack both kernels."""
    split_kernel, p = _split_kernel(prob, batch=batch, h_kv=h_kv, n_k=prob.n_k, page_size=0, num_splits=num_splits)
    split, smem = split_kernel.build(p["rb"])
    rows = batch * h_kv * p["rows"]  # packed rows of every K/V head
    o_part, lse_part = rows * p["num_splits"] * prob.d, rows * p["num_splits"]  # float32 elements
    element = 4 if prob.dtype == np.float32 else 2  # bytes
    table, lens = to_device(np.zeros(1, np.int32), q), to_device(np.full(batch, prob.n_k, np.int32), q)
    arrays = {"Q": Bytes(element * math.prod(q.shape)), "K": Bytes(element * math.prod(k.shape)),
              "V": Bytes(element * math.prod(v.shape)), "TABLE": table, "LENS": lens,
              "O_PART": Bytes(4 * o_part), "LSE_PART": Bytes(4 * lse_part), "O": Bytes(element * rows * prob.d),
              "LSE": Bytes(4 * rows)}
    split_launch = PackedLaunch(driver_kernel(split, split_kernel.signature, smem), p["grid"], split_kernel.threads,
                                smem, {**arrays, **_split_scalars(prob, prob.n_k, h_kv, 1)},
                                moving=("Q", "K", "V", "O_PART", "LSE_PART"))
    overlap = overlaps_combine()  # the combine launched to overlap the split kernel's end, where the GPU can
    combine = combine_kernel.make_combine_kernel(str(prob.dtype), overlap)
    combine_launch = PackedLaunch(driver_kernel(combine, combine_kernel.combine_signature(prob.dtype)),
                                  _combine_grid(p, prob.d, batch, h_kv), combine_kernel.THREADS, 0,
                                  {**arrays, **_combine_scalars(p, prob.d)}, moving=("O_PART", "LSE_PART", "O", "LSE"),
                                  after_previous=overlap)
    gather = not all(lib.contiguous(x) for x in (q, k, v))
    return DecodePlan(prob, lib, device, split_launch, combine_launch, o_part, lse_part, gather, (table, lens))


def cuda_split_kv_attention(q, k, v, *, num_splits: int | None = None, causal: bool = False,
                            scale: float | None = None):
    """Split-KV (Flash-Decoding) attention on the GPU. Returns ``(o, lse)``.

    The contract of :func:`tinyflash.split_kv_attention`: q (..., H, Nq, d), k and v
    (..., H_kv, Nk, d), H a multiple of H_kv; here float16, bfloat16 or float32, dv == d, d up to 256
    (float16, bfloat16) or 128 (float32). NumPy in, NumPy out; device arrays in, device arrays out.
    ``num_splits=None``: :func:`tinyflash.decode.split_kv.choose_num_splits` for this GPU. bfloat16 (PyTorch
    tensors; NumPy has no bfloat16) at every head dim: on the tensor cores at theirs (64, 128), on the CUDA
    cores (float32 arithmetic) at the others. PyTorch and CuPy inputs on a GPU take the planned path
    (:class:`DecodePlan`: checked and sized once per shape, dtype, contiguity and GPU, launched on the library's
    current stream on the inputs' GPU).
    """
    name = library(q)
    lib = array_library(name) if library(k) == library(v) == name else None
    key = lib and decode_key(name, lib, q, k, v, num_splits, causal, scale)
    if key is not None:
        key = ("cuda_split_kv_attention", *key)
        plan = PLANS.get(key)
        if plan is None:
            plan = make_plan(lib, key, q, k, v, num_splits, causal, scale)
            PLANS.keep(key, plan)
        if plan is not None:
            return plan(q, k, v)
    run, o, lse, prob = prepare_split_kv(q, k, v, num_splits=num_splits, causal=causal, scale=scale)
    run()
    to_host = not is_device_array(q)
    bits_as = q.dtype if prob.dtype == BFLOAT16 else None  # host bfloat16 (ml_dtypes): the patterns relabelled
    return result(o, prob.out_shape, to_host, bits_as), result(lse, prob.lse_shape, to_host)


def prepare_paged(q, cache, *, num_splits: int | None = None, causal: bool = False, scale: float | None = None,
                  check_cache: bool = True, **tuning):
    """Everything :func:`cuda_paged_attention` does before launching: ``(run, o, lse, prob)``. ``check_cache``:
    :func:`tinyflash.decode.paged.check_cache` first (False: for a decode loop that checked its cache once)."""
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
    if num_splits is not None:
        check_positive_int(num_splits, "num_splits")
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
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
