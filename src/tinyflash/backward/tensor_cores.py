"""The backward pass on the tensor cores — the host wrapper of backward kernels v2, v3 and v4.

:func:`tensor_core_attention_backward` does what :func:`tinyflash.cuda_attention_backward` does (check, allocate,
launch three kernels), for what the tensor cores multiply: float16 or bfloat16 inputs with float32 accumulation,
d = dv a multiple of 8 up to 256, and grouped-query heads (dK and dV summed over the query heads of a group, K and
V never repeated). The three kernels: D = rowsum(dO ∘ O) with dQ's float32 accumulator set to zero
(``kernels/rows.py``), the main kernel (the registry's rule: v4 on Hopper at d = 64 and 128, v2 elsewhere, at the
other head dims and in deterministic mode; or the one a call names: v2, ``kernels/v2_tensor_cores.py``, on
mma.sync; v3, ``kernels/v3_wgmma.py``, on Hopper's wgmma; v4, ``kernels/v4_warp_specialized.py``, v3
warp-specialised with TMA), dQ scaled and rounded. The 16-bit arrays travel
as uint32 words of two values, whatever their format: only the tensor cores and the conversions know which. The
checks, the plans and the launches of the main kernel are the host layer's (``tinyflash.host``).

:func:`flex_attention_backward` is the same three launches for :func:`tinyflash.flex_attention`: v2 with the user's
functions and a block mask compiled in (``flex_bwd_tc``), checked by ``tinyflash.host.flex_backward``; on PyTorch
or CuPy arrays on a GPU through the driver, sized once per problem (the checks, which read the user's functions,
run at every call), else through numba's launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.checks import AttentionProblem
from ..core.online_softmax import LOG2E
from ..gpu.arrays import current_stream, dense, empty, is_device_array, library, numba_flat, result, zeros
from ..gpu.driver_launch import GridLaunch, driver_kernel
from ..gpu.launch import MAX_GRID_Y, LaunchArgs, launch
from ..gpu.runtime import require_compute_capability, require_gpu, simulator_enabled
from ..host.inputs import BACKWARD_NAMES, FLOAT16, FLOAT32, backward_arrays, flat16, placed
from ..host.flex_backward import block_mask_scalars, plan_flex_backward
from ..host.launch import launch_backward_tensor_cores
from ..host.plans import PLANS, backward_key
from ..host.registry import KernelVersion
from ..host.sized import sized_backward, sized_flex_backward
from ..warp_tile import BACKWARD_HEAD_DIMS, MIN_COMPUTE_CAPABILITY, MMA_M, head_dims_text
from .kernels import VERSIONS
from .kernels.rows import (FINISH_DQ_WORDS_SIGNATURE, ROW_DOT_ROWS, ROW_DOT_WORDS_SIGNATURE, ROWS_PER_BLOCK,
                           word_rows)

WHO = "tensor_core_attention_backward"
FLEX_WHO = "flex_attention_backward"
NAMES = BACKWARD_NAMES
MAIN_KERNELS = [name for name, version in VERSIONS.items() if version.arguments in ("words", "maps")]  # v2, v3, v4


@dataclass(frozen=True)
class DriverLaunches:
    """The backward's three kernels sized for one problem, launched through the driver (``gpu/driver_launch.py``):
    D = rowsum(dO ∘ O) with dQ's accumulator zeroed, the main kernel (``host.sized.sized_backward``), dQ scaled and
    rounded. A call passes C-contiguous device arrays of any library (16-bit ones as they are: the kernels read them
    as words)."""

    row_dot: GridLaunch
    main: object
    finish_dq: GridLaunch

    def __call__(self, q, k, v, o, lse, do, dq, dk, dv, D, dq_acc, dq_turn, *, stream: int = 0) -> None:
        """``dq_turn``: deterministic mode's counters, int32, one per query tile and query head, zero (else
        any device array: the kernel does not read it)."""
        self.row_dot(do, o, D, dq_acc, stream=stream)
        self.main(q, k, v, do, lse, D, dq_acc, dk, dv, dq_turn, stream=stream)
        self.finish_dq(dq_acc, dq, stream=stream)


def driver_launches(version: KernelVersion, n_q: int, n_k: int, n_heads: int, kv_group: int, scale: float,
                    causal: bool, element: str, cfg, **options) -> DriverLaunches:
    """:class:`DriverLaunches` for n_heads query heads (kv_group per K/V head), Nq, Nk >= 1: ``version``'s main
    kernel at the tiling ``cfg`` (``options``: its build's), and the two row kernels, one launch each."""
    row_dot, finish_dq = row_launches(element, n_q, cfg.D, n_heads, scale)
    return DriverLaunches(row_dot, sized_backward(version, n_q, n_k, n_heads, kv_group, scale, causal, element, cfg,
                                                  **options), finish_dq)


@lru_cache(maxsize=256)
def row_launches(element: str, n_q: int, d: int, n_heads: int, scale: float) -> tuple[GridLaunch, GridLaunch]:
    """The two row kernels sized for one problem: D = rowsum(dO ∘ O) with dQ's accumulator zeroed, and dQ scaled
    and rounded (``kernels/rows.py``), through the driver."""
    row_dot, finish_dq = word_rows(element)
    words = n_q * d // 2  # words of one head's dQ
    return (GridLaunch.sized(driver_kernel(row_dot, ROW_DOT_WORDS_SIGNATURE), (-(-n_q // ROW_DOT_ROWS), n_heads),
                             ROWS_PER_BLOCK, 0, n_q=n_q, d=d),
            GridLaunch.sized(driver_kernel(finish_dq, FINISH_DQ_WORDS_SIGNATURE), (-(-words // ROWS_PER_BLOCK),
                                                                                    n_heads),
                             ROWS_PER_BLOCK, 0, n=words, scale=np.float32(scale)))


@dataclass(frozen=True)
class BackwardPlan:
    """What :func:`tensor_core_attention_backward` learns from its inputs' shapes, dtypes and library, ``causal``,
    ``scale``, ``deterministic`` and ``kernel``: the checked problem, the 16-bit type, the main kernel, and, for
    PyTorch or CuPy arrays on a GPU, the three kernels sized for them (None: the general path through numba's
    launches)."""

    prob: AttentionProblem
    element: str  # 'float16' or 'bfloat16'
    version: KernelVersion  # the main kernel
    config: object | None  # its tiling, where the call gave one (None: the version's own)
    launches: DriverLaunches | None
    turns: int = 0  # deterministic mode on the driver's path: dQ's counters, one per query tile and query head


def plan_backward(arrays, causal, scale, deterministic=False, kernel=None, config=None) -> BackwardPlan:
    """Check the inputs (every rule of :func:`check_attention_inputs` and :func:`check_backward_inputs`, and the
    tensor cores' own), then the GPU; choose the main kernel and, for device arrays on a GPU, size the three
    launches."""
    if kernel is not None:
        VERSIONS.choose(kernel, WHO, among=MAIN_KERNELS)  # a main kernel on the tensor cores (else a ValueError)
    (q, k, v, o, lse, do), on_device, element, prob = backward_arrays(
        arrays, causal, scale, WHO, "tinyflash.cuda_attention_backward takes float16, bfloat16 and float32")
    if type(deterministic) is not bool:
        raise TypeError(f"deterministic must be a bool; got {type(deterministic).__name__} {deterministic!r}")
    version = VERSIONS[kernel] if kernel else None
    if deterministic and version is not None and "dq" not in version.deterministic:
        raise ValueError(f"deterministic=True needs kernel v2: backward kernel {version.name} (wgmma) adds dq by "
                         "atomics in any order and has no deterministic mode")
    if prob.d != prob.d_v or prob.d not in BACKWARD_HEAD_DIMS:  # v2's, every main kernel's at most
        raise ValueError(f"{WHO} supports d = dv {head_dims_text(BACKWARD_HEAD_DIMS)}; got q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)} (tinyflash.cuda_attention_backward takes any head dim up to 256)")
    if version is not None and not version.accepts(element, prob.d, prob.d_v):
        raise ValueError(f"backward kernel {version.name} takes d = dv {head_dims_text(version.head_dims)}; got "
                         f"d = {prob.d} (kernel v2 takes {head_dims_text(BACKWARD_HEAD_DIMS)})")
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    version = version or VERSIONS.default(WHO, element, prob.d, prob.d_v, deterministic=deterministic)  # this GPU's
    require_compute_capability(MIN_COMPUTE_CAPABILITY, WHO)  # every main kernel multiplies on the tensor cores
    version.requirement(f"{WHO}(kernel='{version.name}')")
    heads = math.prod(prob.lead)
    if (on_device and not simulator_enabled() and library(q) in ("torch", "cupy") and 0 < heads <= MAX_GRID_Y
            and prob.n_q > 0 and prob.n_k > 0):
        cfg = config or version.tilings[0](prob.d)
        options = {"deterministic": True} if deterministic else {}
        launches = driver_launches(version, prob.n_q, prob.n_k, heads, prob.kv_group, float(prob.scale), prob.causal,
                                   element, cfg, **options)
        return BackwardPlan(prob, element, version, config, launches,
                            heads * -(-prob.n_q // cfg.BR) if deterministic else 0)
    return BackwardPlan(prob, element, version, config, None)


def tensor_core_attention_backward(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None,
                                   deterministic: bool = False, kernel: str | None = None, config=None):
    """The backward pass on the tensor cores: ``(dq, dk, dv)`` from the forward's ``o`` and ``lse`` and ``do`` = ∂L/∂o.

    The contract of :func:`tinyflash.cuda_attention_backward`, for float16 or bfloat16 q, k, v, o, do (all one
    type; lse float32, as :func:`tinyflash.tensor_core_attention` returns it), d = dv a multiple of 8 up to 256,
    and k, v with fewer heads than q (grouped-query attention: dk and dv are the sums over each group's query heads).
    NumPy float16 in, NumPy out; device arrays (CuPy, numba, PyTorch; bfloat16 as PyTorch tensors) in, the
    same library's out. dk and dv are bitwise reproducible; dq, added by atomics from every key tile, only up
    to rounding, unless ``deterministic``: then the key tiles add to each query tile in turn, in one order, and
    dq is bitwise reproducible too (at a cost in time: docs/results.md).

    ``kernel`` names the main kernel: 'v2' (mma.sync, compute capability 8.0 on), 'v3' (Hopper's wgmma,
    compute capability 9.0 only, d = 64 or 128; no deterministic mode) or 'v4' (v3 warp-specialised, TMA; the same
    limits); None: the registry's rule (``tinyflash.backward.kernels.VERSIONS``): v4 on a Hopper GPU at d = 64 and
    128, else v2, and v2 if ``deterministic``. ``config``: a tiling of that kernel (None: its own for this GPU, or for numba's simulator).

    For PyTorch and CuPy arrays on a GPU the checks and the sizing of the three launches are done once per
    combination of shapes, dtypes, ``causal``, ``scale``, ``deterministic``, ``kernel`` and ``config``
    (``tinyflash.host.plans``),
    and the kernels go to the library's current stream: a call can be captured in a CUDA graph.
    """
    arrays = (q, k, v, o, lse, do)
    key = backward_key(arrays, causal, scale, deterministic)
    key = key and (WHO, kernel, config, *key)
    plan = PLANS.get(key)
    if plan is None:  # 1. check the inputs and size the launches
        plan = plan_backward(arrays, causal, scale, deterministic, kernel, config)
        if plan.launches is not None:
            PLANS.keep(key, plan)
    if plan.launches is None:
        return _general_call(arrays, plan, deterministic)
    return _driver_call(arrays, plan.prob, plan.launches, plan.turns)


def _driver_call(arrays, prob: AttentionProblem, launches: DriverLaunches, turns: int = 0):
    """Steps 2 and 3 of a call on PyTorch or CuPy arrays on a GPU: allocate the gradients (shaped like q, k, v) and
    the O(N) scratch in the inputs' library, then the three launches on the stream q's library works on. ``turns``:
    deterministic mode's counters (0: none; the kernel then never reads dQ_turn)."""
    q, k, v = arrays[:3]
    heads = math.prod(prob.lead)
    dq, dk, dv = empty(q, tuple(q.shape)), empty(q, tuple(k.shape)), empty(q, tuple(v.shape))
    D = empty(q, heads * prob.n_q, FLOAT32)  # (BH·Nq,) rowsum(dO ∘ O)
    dq_acc = empty(q, heads * prob.n_q * prob.d, FLOAT32)  # (BH·Nq·d,) dQ before its scale, added by atomics
    dq_turn = zeros(q, turns, np.int32) if turns else D  # deterministic mode's counters (else unread)
    launches(*(dense(x) for x in arrays), dq, dk, dv, D, dq_acc, dq_turn, stream=current_stream(q))
    return dq, dk, dv


def flex_attention_backward(q, k, v, o, lse, do, *, score_mod=None, mask_mod=None, block_mask=None,
                            causal: bool = False, scale: float | None = None, kernel: str | None = None, config=None):
    """The backward pass of :func:`tinyflash.flex_attention` on the tensor cores: ``(dq, dk, dv)`` from its ``o`` and
    ``lse`` and ``do`` = ∂L/∂o, with the same ``score_mod``, ``mask_mod``, ``block_mask``, ``causal`` and ``scale``.

    Inputs as :func:`tensor_core_attention_backward`'s (float16 or bfloat16 q, k, v, o, do; lse float32; d = dv a
    multiple of 8 up to 256; k, v with fewer heads than q: dk, dv summed over each group), with q (Nq, d),
    (H, Nq, d) or (B, H, Nq, d), which defines b and h for the functions. The functions are compiled into backward
    kernel v2 (``flex_bwd_tc``): the scores are recomputed, score_mod applied with its derivative, which a source
    transformation of score_mod gives (``tinyflash.core.dual_source``: score_mod's source must be readable, and
    within what it lists), and dS = P ∘ (dP − D) · d score_mod / d score feeds dq and dk, as in
    :func:`tinyflash.blocked_attention_backward`. A block mask's transposed lists say which query tiles each key
    tile meets (empty ones never loaded; mask_mod on the partial ones only); its block_q must be a multiple of the
    kernel's query tile Br and its block_k of its key tile Bc (``config``'s, or the default tiling's: Bc = 128,
    Br = 64 at d = 32, 64, 128; FlexAttention's 128 × 128 fits every default tiling). dk and dv are bitwise
    reproducible, dq (atomics) up to rounding: there is no deterministic mode. ``kernel``: a version with the hooks
    (v2, the default); ``config``: a tiling of it.
    """
    arrays = (q, k, v, o, lse, do)
    plan = plan_flex_backward(VERSIONS, FLEX_WHO, arrays, score_mod, mask_mod, block_mask, causal, scale, kernel,
                              config)
    options = {"score_mod": plan.score_mod, "mask_mod": plan.mask_mod, "block_sparse": block_mask is not None}
    prob, heads, flex_scalars = plan.prob, math.prod(plan.prob.lead), block_mask_scalars(plan, block_mask)
    if (library(q) in ("torch", "cupy") and is_device_array(q) and not simulator_enabled() and 0 < heads <= MAX_GRID_Y
            and prob.n_q > 0 and prob.n_k > 0 and plan.version.flex_signature and plan.version.arguments != "maps"):
        return _driver_call(arrays, prob, flex_driver_launches(plan, flex_scalars, options))
    general = BackwardPlan(plan.prob, plan.element, plan.version, plan.config, None)
    return _general_call(arrays, general, False, flex_scalars, options)


def flex_driver_launches(plan, flex_scalars: dict, options: dict) -> DriverLaunches:
    """:class:`DriverLaunches` of a flex backward: the row kernels, and the main kernel built for the user's
    functions (``options``) sized once per problem (``host.sized.sized_flex_backward``), given the scale and the
    block mask (``flex_scalars``) at each call."""
    prob, cfg = plan.prob, plan.config
    heads, g = math.prod(prob.lead), prob.kv_group
    row_dot, finish_dq = row_launches(plan.element, prob.n_q, prob.d, heads, float(prob.scale))
    sized = sized_flex_backward(plan.version, plan.version.build(cfg, plan.element, **options), cfg, prob.n_q,
                                prob.n_k, heads, g)
    scalars = {"n_q": prob.n_q, "n_k": prob.n_k, "scale": np.float32(prob.scale),
               "scale_log2": np.float32(prob.scale * LOG2E), "causal": prob.causal, "kv_group": g, **flex_scalars}

    def main(q, k, v, do, lse, D, dq_acc, dk, dv, dq_turn, stream: int = 0) -> None:  # DriverLaunches' main
        sized({"Q": q, "K": k, "V": v, "dO": do, "LSE": lse, "Dvec": D, "dQ_acc": dq_acc, "dK": dk, "dV": dv,
               "dQ_turn": dq_turn}, scalars, stream=stream)

    return DriverLaunches(row_dot, main, finish_dq)


def _general_call(arrays, plan: BackwardPlan, deterministic: bool, flex_scalars=None, flex_options=None):
    """NumPy arrays (copied to the GPU and back), numba device arrays, numba's simulator, more heads than one grid
    holds, empty inputs: the three kernels through numba's launches. FlexAttention's calls add the scale and the
    block mask (``flex_scalars``) and the user's functions (``flex_options``) to the main kernel's."""
    prob, element = plan.prob, plan.element
    found, on_device = placed(dict(zip(NAMES, arrays)))
    q, k, v, o, lse, do = found.values()

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
    flat = {name: numba_flat(flat16(x)) for name, x in (("Q", q), ("K", k), ("V", v), ("O", o), ("dO", do))}
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
                                   "scale_log2": np.float32(prob.scale * LOG2E), "causal": prob.causal,
                                   **(flex_scalars or {})},
                          n_heads=heads, kv_group=g)
        options = {"deterministic": True} if deterministic else dict(flex_options or {})
        launch_backward_tensor_cores(plan.version, main, prob, plan.config, element,
                                     who=f"backward kernel {plan.version.name}", **options)
    if heads > 0 and n_q > 0:
        launch(finish_dq_words, -(-(n_q * d // 2) // ROWS_PER_BLOCK), ROWS_PER_BLOCK, 0,
               LaunchArgs(arrays={"dQ_acc": (dQa, n_q * d), "dQ": (flat["dQ"].view(np.uint32), n_q * d // 2)},
                          scalars={"n": n_q * d // 2, "scale": np.float32(prob.scale)}, n_heads=heads))
    to_host = not on_device
    grads = (result(dq, q.shape, to_host), result(dk, k.shape, to_host), result(dv, v.shape, to_host))
    if element == "bfloat16":  # the kernels wrote bfloat16 bits into float16 arrays: relabel them
        grads = tuple(x.view(q.dtype) for x in grads)
    return grads
