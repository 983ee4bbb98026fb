"""Stage 3: FlashAttention's forward pass on the tensor cores — the host wrapper of kernel v6.

:func:`tensor_core_attention` does what :func:`tinyflash.cuda_attention` does (check the inputs,
allocate the outputs, size the grid and launch), for what the tensor cores multiply: 16-bit
inputs, float16 or bfloat16, with float32 accumulation. The kernel is
``tinyflash/forward/kernels/v6_tensor_cores.py``; its PTX instructions are in ``tinyflash/gpu/ptx.py``.

bfloat16 has no NumPy dtype. It comes as a PyTorch CUDA tensor (``torch.bfloat16``); an array
whose dtype is named bfloat16 (``ml_dtypes.bfloat16``) takes the same path, untested here:
tinyflash does not require ml_dtypes (its simulator tests build bfloat16 bit patterns themselves).
The kernel never converts an element: it moves 16-bit patterns, two per 32-bit word; only the
tensor cores and the final rounding know which format they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from ..core.checks import AttentionProblem, as_array, check_attention_inputs
from ..core.online_softmax import LOG2E
from ..gpu.arrays import bfloat16_bits, current_stream, dense, empty, is_device_array, library, numba_flat, result
from ..gpu.driver_launch import GridLaunch
from ..gpu.launch import MAX_GRID_Y, LaunchArgs
from ..gpu.runtime import require_compute_capability, require_gpu, simulator_enabled
from ..warp_tile import MIN_COMPUTE_CAPABILITY, head_dims_text
from .kernels import get as kernel_version
from .kernels.tensor_core_tiling import HEAD_DIMS, default_tiling

FLOAT16, FLOAT32 = np.dtype(np.float16), np.dtype(np.float32)


def element_type(x) -> str | None:
    """'bfloat16' if ``x`` holds bfloat16 (a PyTorch tensor, or a NumPy array of ml_dtypes), else None."""
    dt = getattr(x, "dtype", None)
    if isinstance(dt, np.dtype):  # NumPy's: ml_dtypes' bfloat16 is a 2-byte kind 'V' (a NumPy dtype's str() is slow)
        return "bfloat16" if dt.kind == "V" and dt.name == "bfloat16" else None
    return "bfloat16" if str(dt).rsplit(".", 1)[-1] == "bfloat16" else None  # 'torch.bfloat16' -> 'bfloat16'


def sixteen_bit(arrays: dict, who: str, instead: str) -> str:
    """'float16' or 'bfloat16', the one 16-bit type of ``arrays`` (name -> array); else a TypeError that names
    the argument, its dtype and where it can go instead (``instead``)."""
    found = {}
    for name, x in arrays.items():
        dt = element_type(x) or str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")
        if dt not in ("float16", "bfloat16"):
            raise TypeError(f"{who} takes float16 or bfloat16; got {name} of dtype {dt} ({instead})")
        found[name] = dt
    if len(set(found.values())) > 1:
        raise TypeError(f"{', '.join(found)} must share one dtype; got {', '.join(f'{n} {t}' for n, t in found.items())}")
    return next(iter(found.values()))


def shape_only(x):
    """A stand-in with ``x``'s shape and dtype float16: the shared checks know no bfloat16, and the
    rules on shapes are the same for both 16-bit types."""
    return SimpleNamespace(shape=tuple(x.shape), dtype=FLOAT16)


def flat16(x):
    """A flat device array of ``x``'s 16-bit elements, in ``x``'s library (NumPy: numba's); bfloat16
    seen as int16 (numba knows no bfloat16; the kernel only moves the bits). On a GPU it is launched
    through the driver, which reads its address (``gpu/driver_launch.py``): no numba view is made,
    which took a visible part of a call's time at N = 4,096."""
    if element_type(x):
        x = bfloat16_bits(x)
    return dense(x) if is_device_array(x) else numba_flat(x)


@dataclass(frozen=True)
class Entry:
    """What an entry point on the tensor cores calls: its name (in errors), its kernel version, the check of the
    GPU in hand (``require(who)``), the version's tiling on a GPU (``default_tiling(d, causal, n_q)``) and its head
    dims."""

    who: str
    version: str
    require: Callable
    default_tiling: Callable
    head_dims: tuple = HEAD_DIMS  # the d = dv its kernel takes


TENSOR_CORES = Entry("tensor_core_attention", "v6",
                     lambda who: require_compute_capability(MIN_COMPUTE_CAPABILITY, who), default_tiling)


@dataclass(frozen=True)
class CallPlan:
    """What :func:`tensor_core_attention` learns from its inputs' shapes, dtypes and library, ``causal`` and
    ``scale``, and nothing else: the checked problem, the 16-bit type, and, for device arrays on a GPU, the
    kernel sized for them (v6's ``sized_launch``; None: the general path below)."""

    prob: AttentionProblem
    element: str  # 'float16' or 'bfloat16'
    launch: GridLaunch | None


_PLANS: dict = {}  # call_key(...) -> CallPlan, for calls that took the driver's path
MAX_PLANS = 1024  # then the plans are forgotten and made again: a program of ever new shapes holds no more


def call_key(q, k, v, causal, scale):
    """What a :class:`CallPlan` depends on, as a dict key, for PyTorch CUDA tensors and CuPy arrays (the
    driver's path): the library, shapes, dtypes, ``causal``, ``scale`` and the inputs' GPUs; None for anything
    else, which is then checked at every call. Only a ``bool`` causal and a ``float`` or None scale give a key:
    1 == True as a key, but ``causal=1`` must still be refused. A plan's kernel is loaded into the context of the
    GPU current when the plan is made: with several GPUs, call with the inputs' GPU current
    (``torch.cuda.device(q.device)``)."""
    if type(causal) is not bool or (scale is not None and type(scale) is not float):
        return None
    lib = library(q)
    if lib not in ("torch", "cupy") or not library(k) == library(v) == lib:
        return None
    if lib == "torch" and not (q.is_cuda and k.is_cuda and v.is_cuda):  # CuPy arrays are always on the GPU
        return None
    devices = (q.get_device(), k.get_device(), v.get_device()) if lib == "torch" else (
        q.device.id, k.device.id, v.device.id)  # a plan's kernel is loaded on one GPU
    return (lib, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, causal, scale, devices)


def plan_call(q, k, v, causal, scale, entry: Entry = TENSOR_CORES) -> CallPlan:
    """Check the inputs (every rule of :func:`tinyflash.core.checks.check_attention_inputs`, and the
    tensor cores' own: 16-bit, d = dv in HEAD_DIMS) and size the launch."""
    on_device = is_device_array(q)
    if not on_device:
        q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array of shape (..., N, d); got {type(x).__name__}")
    element = sixteen_bit({"q": q, "k": k, "v": v}, entry.who,
                          "tinyflash.cuda_attention takes float16, bfloat16 and float32")
    prob = check_attention_inputs(*(shape_only(x) for x in (q, k, v)), causal=causal, scale=scale, allowed=(FLOAT16,))
    if prob.d != prob.d_v or prob.d not in entry.head_dims:
        raise ValueError(f"{entry.who} supports d = dv {head_dims_text(entry.head_dims)}; got q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)} (tinyflash.cuda_attention takes any head dim up to 256)")
    if on_device != is_device_array(k) or on_device != is_device_array(v):
        raise TypeError("q, k and v must all be device arrays or all host arrays; got a mix")
    entry.require(entry.who)
    heads = math.prod(prob.lead)  # batch · heads: one row of thread blocks each
    launch = None
    if on_device and not simulator_enabled() and 0 < heads <= MAX_GRID_Y and prob.n_q > 0:
        cfg = entry.default_tiling(prob.d, prob.causal, prob.n_q)
        launch = kernel_version(entry.version).sized_launch(prob.n_q, prob.n_k, heads, prob.scale * LOG2E, prob.causal, prob.kv_group,
                                  element, cfg)
    return CallPlan(prob, element, launch)


def tensor_core_attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """Stage 3: FlashAttention's forward pass on the tensor cores. Returns ``(o, lse)``.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, d) in float16 or bfloat16 (all three alike), with
    d = dv a multiple of 8 up to 256 and any Nq, Nk >= 1; o (..., Nq, d) in the input dtype, lse (..., Nq) in
    float32. Products accumulate in float32 on the tensor cores; P_ij is rounded to the input type
    before P·V, as in FlashAttention. ``causal`` masks bottom-right (``tinyflash.core.masks``).
    NumPy float16 inputs are copied to the GPU and back; device arrays (CuPy, numba, PyTorch CUDA
    tensors) stay there and the results are of the same library. For float32 inputs, other head
    dims or different d and dv, use :func:`tinyflash.cuda_attention`.

    A call's host work is part of its time (at N = 4,096 a call takes well under a millisecond), so
    for PyTorch and CuPy inputs the checks and the sizing of the launch are done once for each
    combination of shapes, dtypes, GPUs, ``causal`` and ``scale``, and kept (:func:`call_key`); a call
    then only looks its plan up, allocates o and lse and launches.
    """
    return attention_call(q, k, v, causal, scale, TENSOR_CORES)


def attention_call(q, k, v, causal, scale, entry: Entry):
    """The steps of a call of ``entry`` (``tensor_core_attention``, ``hopper_attention``): check, allocate, launch."""
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    # 1. check the inputs (once per call_key: the checks depend on nothing else)
    key = call_key(q, k, v, causal, scale)
    key = key and (entry.version, *key)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = plan_call(q, k, v, causal, scale, entry)
        if key is not None and plan.launch is not None:
            if len(_PLANS) >= MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    prob = plan.prob
    if plan.launch is not None:  # device arrays on a GPU: o and lse in their library, one launch through the driver
        o, lse = empty(q, prob.out_shape), empty(q, prob.lse_shape, FLOAT32)  # 2. allocate (like q)
        # 3. launch (dense: a copy only if not contiguous), on the stream q's library works on
        plan.launch(dense(q), dense(k), dense(v), o, lse, stream=current_stream(q))
        return o, lse
    return _general_call(q, k, v, plan, entry.version)


def _general_call(q, k, v, plan: CallPlan, version: str = "v6"):
    """NumPy arrays (copied to the GPU and back), numba device arrays, numba's simulator, more heads
    than one grid holds, empty inputs: steps 2 and 3 through the version's ``launch``."""
    prob, on_device = plan.prob, is_device_array(q)
    if not on_device:
        q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    # 2. allocate the outputs (for device inputs, in the caller's array library)
    heads = math.prod(prob.lead)  # batch · heads: one row of thread blocks each
    like = q if on_device else None
    o = empty(like, heads * prob.n_q * prob.d, FLOAT16)  # (BH·Nq·d,) flat: 16-bit elements
    lse = empty(like, heads * prob.n_q, np.float32)  # (BH·Nq,)

    # 3. size the grid and launch (v6's launch)
    if prob.n_q > 0 and heads > 0:
        n_q, n_k, d = prob.n_q, prob.n_k, prob.d
        args = LaunchArgs(arrays={"Q": (flat16(q), n_q * d), "K": (flat16(k), n_k * d), "V": (flat16(v), n_k * d),
                                  "O": (o, n_q * d), "LSE": (lse, n_q)},  # K and V: one matrix per K/V head (GQA)
                          scalars={"n_q": n_q, "n_k": n_k, "scale_log2": np.float32(prob.scale * LOG2E),
                                   "causal": prob.causal, "kv_group": prob.kv_group},
                          n_heads=heads, kv_group=prob.kv_group)
        kernel_version(version).launch(args, prob, element=plan.element)
    o, lse = result(o, prob.out_shape, not on_device), result(lse, prob.lse_shape, not on_device)
    if plan.element == "bfloat16":  # the kernel wrote bfloat16 bits into a float16 array: relabel them
        o = o.view(q.dtype)  # torch.bfloat16, or ml_dtypes.bfloat16
    return o, lse
