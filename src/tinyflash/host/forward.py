"""The steps of a forward call on the tensor cores, for stage 3 (``tinyflash.tensor_core_attention``, v6 by default)
and stage 4 (``tinyflash.hopper_attention``, v10 by default): check the inputs, find the call's plan, allocate the
outputs in the caller's library, launch on its stream.

A call's host work is part of its time (at N = 4,096 a call takes well under a millisecond), so for PyTorch and CuPy
inputs on a GPU the checks and the sizing of the launch are done once for each combination of shapes, dtypes, GPUs,
``causal`` and ``scale`` (``plans.call_key``), and kept (a :class:`CallPlan` in ``plans.PLANS``); a call then only
looks its plan up, allocates o and lse and launches. Everything else (NumPy arrays, numba's device arrays, numba's
simulator, more heads than one grid holds, empty inputs) takes numba's launches (``launch.launch_tensor_cores``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.checks import AttentionProblem, check_attention_inputs
from ..core.online_softmax import LOG2E
from ..gpu.arrays import current_stream, dense, empty, result
from ..gpu.launch import MAX_GRID_Y, LaunchArgs
from ..gpu.runtime import require_gpu, simulator_enabled
from ..warp_tile import head_dims_text
from .inputs import FLOAT16, FLOAT32, flat16, placed, shape_only, sixteen_bit
from .launch import launch_tensor_cores
from .plans import PLANS, call_key
from .registry import KernelVersion, Registry
from .sized import sized_forward

TENSOR_CORE_ARGUMENTS = ("words", "maps")  # what the forward kernels on the tensor cores read (v6 on)


@dataclass(frozen=True)
class Entry:
    """A public function on the tensor cores: its name (in errors, and its default rule in the registry) and the
    registry of the forward's kernels."""

    who: str
    registry: Registry


@dataclass(frozen=True)
class CallPlan:
    """What a call learns from its inputs' shapes, dtypes and library, ``causal``, ``scale``, ``kernel`` and
    ``config``, and nothing else: the checked problem, the 16-bit type, the version, and for device arrays on a GPU
    the version sized for them (``sized.sized_forward``; None: numba's launches)."""

    prob: AttentionProblem
    element: str  # 'float16' or 'bfloat16'
    version: KernelVersion
    config: object | None  # a tiling the call asked for, or None: the version's own
    launch: object | None


def check_call(entry: Entry, q, k, v, causal, scale, kernel=None, flex: bool = False):
    """``(prob, element, version, on_device)`` of a call: the inputs checked (every rule of
    :func:`tinyflash.core.checks.check_attention_inputs`, and the tensor cores' own: 16-bit, d = dv among the
    version's head dims) and the version chosen among those on the tensor cores (with ``flex``, among those that
    take FlexAttention's functions). The GPU is not looked for yet."""
    arrays, on_device = placed({"q": q, "k": k, "v": v})
    element = sixteen_bit(arrays, entry.who, "tinyflash.cuda_attention takes float16, bfloat16 and float32")
    prob = check_attention_inputs(*(shape_only(x) for x in arrays.values()), causal=causal, scale=scale,
                                  allowed=(FLOAT16,))
    runs = [name for name, v in entry.registry.items() if v.arguments in TENSOR_CORE_ARGUMENTS  # v6 on
            and (v.flex or not flex)]
    # flex: the default rule's version must take the inputs (v10 on Hopper at its head dims, else v6)
    shape = {"dtype": element, "d": prob.d, "d_v": prob.d_v} if flex else {}
    version = entry.registry.choose(kernel, entry.who, among=runs, **shape)
    if prob.d != prob.d_v or prob.d not in version.head_dims:
        raise ValueError(f"{entry.who} supports d = dv {head_dims_text(version.head_dims)}; got q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)} (tinyflash.cuda_attention takes any head dim up to 256)")
    return prob, element, version, on_device


def plan_call(entry: Entry, q, k, v, causal, scale, kernel=None, config=None) -> CallPlan:
    """Check the inputs (:func:`check_call`), then the GPU, and size the launch."""
    prob, element, version, on_device = check_call(entry, q, k, v, causal, scale, kernel)
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    version.requirement(entry.who)
    heads = math.prod(prob.lead)  # batch · heads: one row of thread blocks each
    launch = None
    if on_device and not simulator_enabled() and 0 < heads <= MAX_GRID_Y and prob.n_q > 0:
        cfg = config or version.tilings[0](prob.d, prob.causal, prob.n_q)
        launch = sized_forward(version, prob.n_q, prob.n_k, heads, prob.scale * LOG2E, prob.causal, prob.kv_group,
                               element, cfg)
    return CallPlan(prob, element, version, config, launch)


def tensor_core_call(entry: Entry, q, k, v, causal, scale, kernel=None, config=None):
    """A call of ``entry``: check (once per plan), allocate, launch. Returns ``(o, lse)``."""
    # 1. check the inputs (once per call_key: the checks depend on nothing else)
    key = call_key(q, k, v, causal, scale)
    key = key and (entry.who, kernel, config, *key)
    plan = PLANS.get(key)
    if plan is None:
        plan = plan_call(entry, q, k, v, causal, scale, kernel, config)
        if plan.launch is not None:
            PLANS.keep(key, plan)
    prob = plan.prob
    if plan.launch is not None:  # device arrays on a GPU: o and lse in their library, one launch through the driver
        o, lse = empty(q, prob.out_shape), empty(q, prob.lse_shape, FLOAT32)  # 2. allocate (like q)
        # 3. launch (dense: a copy only if not contiguous), on the stream q's library works on
        plan.launch(dense(q), dense(k), dense(v), o, lse, stream=current_stream(q))
        return o, lse
    return general_call(entry, q, k, v, plan)


def general_call(entry: Entry, q, k, v, plan: CallPlan):
    """NumPy arrays (copied to the GPU and back), numba device arrays, numba's simulator, more heads than one grid
    holds, empty inputs: steps 2 and 3 through numba's launches."""
    prob = plan.prob
    found, on_device = placed({"q": q, "k": k, "v": v})
    q, k, v = found.values()
    # 2. allocate the outputs (for device inputs, in the caller's array library)
    heads = math.prod(prob.lead)  # batch · heads: one row of thread blocks each
    like = q if on_device else None
    o = empty(like, heads * prob.n_q * prob.d, FLOAT16)  # (BH·Nq·d,) flat: 16-bit elements
    lse = empty(like, heads * prob.n_q, np.float32)  # (BH·Nq,)

    # 3. size the grid and launch
    if prob.n_q > 0 and heads > 0:
        n_q, n_k, d = prob.n_q, prob.n_k, prob.d
        args = LaunchArgs(arrays={"Q": (flat16(q), n_q * d), "K": (flat16(k), n_k * d), "V": (flat16(v), n_k * d),
                                  "O": (o, n_q * d), "LSE": (lse, n_q)},  # K and V: one matrix per K/V head (GQA)
                          scalars={"n_q": n_q, "n_k": n_k, "scale_log2": np.float32(prob.scale * LOG2E),
                                   "causal": prob.causal, "kv_group": prob.kv_group},
                          n_heads=heads, kv_group=prob.kv_group)
        launch_tensor_cores(plan.version, args, prob, plan.config, plan.element, who=entry.who)
    o, lse = result(o, prob.out_shape, not on_device), result(lse, prob.lse_shape, not on_device)
    if plan.element == "bfloat16":  # the kernel wrote bfloat16 bits into a float16 array: relabel them
        o = o.view(q.dtype)  # torch.bfloat16, or ml_dtypes.bfloat16
    return o, lse
