"""The backward pass on the tensor cores — the host wrapper of backward kernels v2, v3 and v4.

:func:`tensor_core_attention_backward` does what :func:`tinyflash.cuda_attention_backward` does (check,
allocate, launch three kernels), for what the tensor cores multiply: float16 or bfloat16 inputs with
float32 accumulation, d = dv = 64 or 128, and grouped-query heads (dK and dV summed over the query heads
of a group, K and V never repeated). The three kernels: D = rowsum(dO ∘ O) with dQ's float32 accumulator
set to zero (``kernels/rows.py``), the main kernel (v3 on Hopper, v2 elsewhere, or the one a call names: v2,
``kernels/v2_tensor_cores.py``, on mma.sync; v3, ``kernels/v3_wgmma.py``, on Hopper's wgmma; v4,
``kernels/v4_warp_specialized.py``, v3 warp-specialised with TMA), dQ scaled and
rounded. The 16-bit arrays travel as uint32 words of two values, whatever their format: only the tensor
cores and the conversions know which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.checks import AttentionProblem, as_array, check_attention_inputs, check_backward_inputs
from ..core.online_softmax import LOG2E
from ..forward.tensor_cores import FLOAT16, FLOAT32, call_key, flat16, shape_only, sixteen_bit
from ..gpu.arrays import current_stream, dense, empty, is_device_array, library, numba_flat, result, zeros
from ..gpu.launch import MAX_GRID_Y, LaunchArgs, launch
from ..gpu.runtime import compute_capability, require_compute_capability, require_gpu, simulator_enabled
from ..warp_tile import MIN_COMPUTE_CAPABILITY, MMA_M
from .kernels import get as kernel_version
from .kernels import hopper_tiling, tma_tiling
from .kernels.rows import ROW_DOT_ROWS, ROWS_PER_BLOCK, word_rows
from .kernels.tensor_core_tiling import HEAD_DIMS, default_tiling

NAMES = ("q", "k", "v", "o", "lse", "do")
TILINGS = {"v2": default_tiling, "v3": hopper_tiling.default_tiling,  # each main kernel's tiling on a GPU, d -> tiling
           "v4": tma_tiling.default_tiling}
VERSION = "v2"  # the main kernel a call runs unless it names one (any key of TILINGS), off Hopper
HOPPER_VERSION = "v4"  # on a Hopper GPU: faster than v2 and v3 at every point of backward-tensor-cores


def _flat(x):
    """A flat numba or CuPy device array of ``x``'s 16-bit elements (bfloat16 seen as int16)."""
    return numba_flat(flat16(x))


@dataclass(frozen=True)
class BackwardPlan:
    """What :func:`tensor_core_attention_backward` learns from its inputs' shapes, dtypes and library, ``causal``
    and ``scale``: the checked problem, the 16-bit type, and, for PyTorch or CuPy arrays on a GPU, the three
    kernels sized for them (None: the general path through numba's launches)."""

    prob: AttentionProblem
    element: str  # 'float16' or 'bfloat16'
    launches: object | None  # DriverLaunches: launches(q, k, v, o, lse, do, dq, dk, dv, D, dQ_acc, turns, stream=)
    turns: int = 0  # deterministic mode on the driver's path: dQ's counters, one per query tile and query head
    kernel: str = VERSION  # the main kernel, a key of TILINGS


_PLANS: dict = {}  # backward_key(...) -> BackwardPlan, for calls that take the driver's path
MAX_PLANS = 1024


def backward_key(arrays, causal, scale, deterministic=False, kernel=VERSION):
    """What a :class:`BackwardPlan` depends on, as a dict key (None: check at every call): the forward's key of
    q, k, v, and the shapes and dtypes of o, lse and do, all of q's library and on the GPU; the main kernel."""
    q, k, v, o, lse, do = arrays
    key = call_key(q, k, v, causal, scale)
    if key is None or type(deterministic) is not bool:
        return None
    lib = key[0]
    for x in (o, lse, do):
        if library(x) != lib or (lib == "torch" and not x.is_cuda):
            return None
    return key + (o.shape, o.dtype, lse.shape, lse.dtype, do.shape, do.dtype, deterministic, kernel)


def check_kernel(kernel, deterministic) -> str:
    """The main kernel's name, checked: a key of :data:`TILINGS`, and v3 or v4 not asked for deterministic mode
    (they have none). None: :data:`HOPPER_VERSION` on a GPU of compute capability 9.0, else :data:`VERSION`; v2 where
    ``deterministic`` (v2 keeps the deterministic mode)."""
    if kernel is None:
        if deterministic is True:
            kernel = "v2"
        elif not simulator_enabled() and compute_capability() == hopper_tiling.COMPUTE_CAPABILITY:
            kernel = HOPPER_VERSION
        else:
            kernel = VERSION
    if kernel not in TILINGS:
        raise ValueError(f"kernel must be one of {', '.join(TILINGS)} (None: {VERSION}); got {kernel!r}")
    if kernel in ("v3", "v4") and deterministic is True:
        raise ValueError(f"deterministic=True needs kernel v2: backward kernel {kernel} (wgmma) adds dq by atomics in "
                         "any order and has no deterministic mode")
    return kernel


def plan_backward(arrays, causal, scale, deterministic=False, kernel=VERSION) -> BackwardPlan:
    """Check the inputs (every rule of :func:`check_attention_inputs` and :func:`check_backward_inputs`, and the
    tensor cores' own) and, for device arrays on a GPU, size the three launches."""
    on_device = is_device_array(arrays[0])
    if any(is_device_array(x) != on_device for x in arrays):
        raise TypeError(f"{', '.join(NAMES)} must all be device arrays or all host arrays; got a mix")
    if not on_device:
        arrays = tuple(as_array(x, n) for x, n in zip(arrays, NAMES))
    for name, x in zip(NAMES, arrays):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array; got {type(x).__name__}")
    q, k, v, o, lse, do = arrays
    element = sixteen_bit({"q": q, "k": k, "v": v, "o": o, "do": do}, "tensor_core_attention_backward",
                          "tinyflash.cuda_attention_backward takes float16, bfloat16 and float32")
    stand_ins = [shape_only(x) for x in (q, k, v, o, do)]
    prob = check_attention_inputs(*stand_ins[:3], causal=causal, scale=scale, allowed=(FLOAT16,))
    check_backward_inputs(prob, stand_ins[4], stand_ins[3], lse, grouped=True)
    if prob.d != prob.d_v or prob.d not in HEAD_DIMS:
        raise ValueError(f"tensor_core_attention_backward supports d = dv in {HEAD_DIMS}; got q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)} (tinyflash.cuda_attention_backward takes any head dim up to 256)")
    if type(deterministic) is not bool:
        raise TypeError(f"deterministic must be a bool; got {type(deterministic).__name__} {deterministic!r}")
    require_compute_capability(MIN_COMPUTE_CAPABILITY, "tensor_core_attention_backward")
    if kernel in ("v3", "v4"):
        hopper_tiling.require_hopper(f"tensor_core_attention_backward(kernel='{kernel}')")
    heads = math.prod(prob.lead)
    if (on_device and not simulator_enabled() and library(q) in ("torch", "cupy") and 0 < heads <= MAX_GRID_Y
            and prob.n_q > 0 and prob.n_k > 0):
        cfg = TILINGS[kernel](prob.d)
        launches = kernel_version(kernel).driver_launches(prob.n_q, prob.n_k, heads, prob.kv_group, float(prob.scale),
                                                          prob.causal, element, cfg, deterministic)
        return BackwardPlan(prob, element, launches, heads * -(-prob.n_q // cfg.BR) if deterministic else 0, kernel)
    return BackwardPlan(prob, element, None, kernel=kernel)


def tensor_core_attention_backward(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None,
                                   deterministic: bool = False, kernel: str | None = None):
    """The backward pass on the tensor cores: ``(dq, dk, dv)`` from the forward's ``o`` and ``lse`` and ``do`` = ∂L/∂o.

    The contract of :func:`tinyflash.cuda_attention_backward`, for float16 or bfloat16 q, k, v, o, do (all one
    type; lse float32, as :func:`tinyflash.tensor_core_attention` returns it), d = dv in (64, 128), and k, v
    with fewer heads than q (grouped-query attention: dk and dv are the sums over each group's query heads).
    NumPy float16 in, NumPy out; device arrays (CuPy, numba, PyTorch; bfloat16 as PyTorch tensors) in, the
    same library's out. dk and dv are bitwise reproducible; dq, added by atomics from every key tile, only up
    to rounding, unless ``deterministic``: then the key tiles add to each query tile in turn, in one order, and
    dq is bitwise reproducible too (at a cost in time: docs/results.md).

    ``kernel`` names the main kernel: 'v2' (mma.sync, compute capability 8.0 on), 'v3' (Hopper's wgmma,
    compute capability 9.0 only; no deterministic mode) or 'v4' (v3 warp-specialised, TMA; the same limits);
    None: :data:`HOPPER_VERSION` on a Hopper GPU, else :data:`VERSION` (v2), and v2 if ``deterministic``.

    For PyTorch and CuPy arrays on a GPU the checks and the sizing of the three launches are done once per
    combination of shapes, dtypes, ``causal``, ``scale`` and ``deterministic`` (as :func:`tinyflash.tensor_core_attention` does),
    and the kernels go to the library's current stream: a call can be captured in a CUDA graph.
    """
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    arrays = (q, k, v, o, lse, do)
    kernel = check_kernel(kernel, deterministic)
    key = backward_key(arrays, causal, scale, deterministic, kernel)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:  # 1. check the inputs and size the launches
        plan = plan_backward(arrays, causal, scale, deterministic, kernel)
        if key is not None and plan.launches is not None:
            if len(_PLANS) >= MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    if plan.launches is None:
        return _general_call(arrays, plan, deterministic)
    prob = plan.prob
    heads = math.prod(prob.lead)
    # 2. allocate the gradients (shaped like q, k, v) and the O(N) scratch, in the inputs' library
    dq, dk, dv = empty(q, tuple(q.shape)), empty(q, tuple(k.shape)), empty(q, tuple(v.shape))
    D = empty(q, heads * prob.n_q, FLOAT32)  # (BH·Nq,) rowsum(dO ∘ O)
    dq_acc = empty(q, heads * prob.n_q * prob.d, FLOAT32)  # (BH·Nq·d,) dQ before its scale, added by atomics
    turns = zeros(q, plan.turns, np.int32) if plan.turns else D  # deterministic mode's counters (else unread)
    # 3. three launches on the stream q's library works on
    plan.launches(*(dense(x) for x in arrays), dq, dk, dv, D, dq_acc, turns, stream=current_stream(q))
    return dq, dk, dv


def _general_call(arrays, plan: BackwardPlan, deterministic: bool):
    """NumPy arrays (copied to the GPU and back), numba device arrays, numba's simulator, more heads than one grid
    holds, empty inputs: the three kernels through numba's launches."""
    prob, element = plan.prob, plan.element
    on_device = is_device_array(arrays[0])
    q, k, v, o, lse, do = arrays if on_device else (as_array(x, n) for x, n in zip(arrays, NAMES))

    # 2. allocate the outputs and the O(N) scratch (in the caller's library for device inputs)
    heads, n_q, n_k, d, g = math.prod(prob.lead), prob.n_q, prob.n_k, prob.d, prob.kv_group
    kv_heads = heads // g
    like = q if on_device else None
    dq = empty(like, heads * n_q * d, FLOAT16)  # (BH·Nq·d,) flat, 16-bit elements
    dk = empty(like, kv_heads * n_k * d, FLOAT16)  # (BH_kv·Nk·d,)
    dv = empty(like, kv_heads * n_k * d, FLOAT16)
    D = empty(like, heads * n_q, FLOAT32)  # (BH·Nq,) rowsum(dO ∘ O)
    dq_acc = empty(like, heads * n_q * d, FLOAT32)  # (BH·Nq·d,) dQ before its scale, added by atomics
    tiles = -(-n_q // MMA_M)  # per query head: as many counters as the smallest tiling has query tiles, or more
    turns = zeros(like, heads * tiles if deterministic else 1, np.int32)  # deterministic mode's counters (v2)

    # 3. three launches: D and the zeroed accumulator, the main kernel, dQ's scale
    row_dot_words, finish_dq_words = word_rows(element)
    flat = {name: _flat(x) for name, x in (("Q", q), ("K", k), ("V", v), ("O", o), ("dO", do))}
    flat.update({name: numba_flat(x) for name, x in (("dQ", dq), ("dK", dk), ("dV", dv))})
    Lf, Dv, dQa = numba_flat(lse), numba_flat(D), numba_flat(dq_acc)
    if heads > 0 and n_q > 0:
        launch(row_dot_words, -(-n_q // ROW_DOT_ROWS), ROWS_PER_BLOCK, 0,
               LaunchArgs(arrays={"dO": (flat["dO"].view(np.uint32), n_q * d // 2),
                                  "O": (flat["O"].view(np.uint32), n_q * d // 2), "D": (Dv, n_q),
                                  "dQ_acc": (dQa, n_q * d)}, scalars={"n_q": n_q, "d": d}, n_heads=heads))
    if heads > 0 and n_k > 0:  # every key row of dK and dV is written (zeros where no query sees it)
        main = LaunchArgs(arrays={"Q": (flat["Q"], n_q * d), "K": (flat["K"], n_k * d), "V": (flat["V"], n_k * d),
                                  "dO": (flat["dO"], n_q * d), "LSE": (Lf, n_q), "Dvec": (Dv, n_q),
                                  "dQ_acc": (dQa, n_q * d), "dK": (flat["dK"], n_k * d), "dV": (flat["dV"], n_k * d),
                                  "dQ_turn": (numba_flat(turns), tiles if deterministic else 0)},
                          scalars={"n_q": n_q, "n_k": n_k, "scale": np.float32(prob.scale),
                                   "scale_log2": np.float32(prob.scale * LOG2E), "causal": prob.causal},
                          n_heads=heads, kv_group=g)
        kernel_version(plan.kernel).launch(main, prob, element=element, deterministic=deterministic)
    if heads > 0 and n_q > 0:
        launch(finish_dq_words, -(-(n_q * d // 2) // ROWS_PER_BLOCK), ROWS_PER_BLOCK, 0,
               LaunchArgs(arrays={"dQ_acc": (dQa, n_q * d), "dQ": (flat["dQ"].view(np.uint32), n_q * d // 2)},
                          scalars={"n": n_q * d // 2, "scale": np.float32(prob.scale)}, n_heads=heads))
    to_host = not on_device
    grads = (result(dq, q.shape, to_host), result(dk, k.shape, to_host), result(dv, v.shape, to_host))
    if element == "bfloat16":  # the kernels wrote bfloat16 bits into float16 arrays: relabel them
        grads = tuple(x.view(q.dtype) for x in grads)
    return grads
