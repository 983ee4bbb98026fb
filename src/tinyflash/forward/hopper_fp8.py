"""Stage 4 on FP8 inputs: :func:`hopper_fp8_attention`, kernel v11 on float8_e4m3 Q, K, V with their descales.

A function of its own beside :func:`tinyflash.hopper_attention`, because its contract differs: e4m3 inputs come
with descale factors (x ≈ x8 · descale, ``tinyflash.quantize_fp8``), and the output is bfloat16 whatever the input
(e4m3 is a storage format, not one to compute the result in). What it computes is
:func:`tinyflash.fp8_attention`'s, the NumPy emulation of the kernel, with per-tensor or per-head descales.

The steps are the host layer's, in its order: check the arguments (before anything looks for a GPU), the GPU,
allocate, launch. A call makes two launches: the pass that writes Vᵀ (``kernels/fp8_tiling.transpose_v``: FP8
wgmma reads V transposed, with its keys renumbered as P's registers hold them), then v11. On PyTorch or CuPy arrays
on a GPU both go through the driver, sized once per problem (:func:`sized_fp8`: the tensor maps kept by the
arrays' addresses, the descales kept on the GPU by their values), on the caller's stream, so that queued calls
queue. Otherwise (NumPy arrays, numba's, the simulator) through numba's launches (``gpu/launch.py``), the heads in
slices of a grid's 65,535, the tensor maps and the descales copied to the GPU at every call, which then waits for
the kernels before it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from ..core.checks import check_attention_inputs
from ..core.online_softmax import LOG2E
from ..gpu.arrays import current_stream, dense, empty, is_device_array, library, numba_flat, result
from ..gpu.driver_launch import GridLaunch, driver_kernel
from ..gpu.launch import MAX_GRID_Y, LaunchArgs, launch
from ..gpu.runtime import require_gpu, simulator_enabled
from ..gpu.tensor_map import MapCache, tensor_maps
from ..host.inputs import FLOAT16, as_words, placed, shape_only
from ..host.launch import simulated_warps
from .kernels import E4M3, FP8_VERSIONS, VERSIONS
from .kernels.fp8_tiling import TRANSPOSE_KEYS, TRANSPOSE_SIGNATURE, TRANSPOSE_THREADS, padded_keys, transpose_v

WHO = "hopper_fp8_attention"
MAX_SCALES = 64  # descales kept on the GPU by their values (device_scales)
_SCALES: OrderedDict = OrderedDict()


def e4m3_bytes(x, name: str):
    """``x``'s e4m3 numbers as bytes (uint8, the same memory): an array of ml_dtypes' float8_e4m3fn, a PyTorch
    tensor of torch.float8_e4m3fn, or a device array of uint8 (CuPy, numba: e4m3 bytes as they are); a TypeError
    names anything else."""
    dtype = getattr(x, "dtype", None)
    kind = str(dtype).removeprefix("torch.")
    if kind == E4M3:
        if library(x) == "torch":
            import torch

            return x.detach().view(torch.uint8)
        return x.view(np.uint8)
    if kind == "uint8" and is_device_array(x) and library(x) != "torch":
        return x
    raise TypeError(f"{WHO} takes e4m3 inputs: ml_dtypes.float8_e4m3fn or torch.float8_e4m3fn arrays (or CuPy / numba "
                    f"device arrays of uint8, their bytes); got {name} of dtype {kind} (tinyflash.quantize_fp8 makes "
                    "them; tinyflash.hopper_attention takes float16 and bfloat16)")


def per_head(descale, name: str, shapes: dict) -> np.ndarray:
    """A descale as float32, one entry per head of ``shapes``' first (name -> the leading dims it may have):
    shape () (per tensor) or one of those (per head; a K/V head's entry repeated over its query heads)."""
    try:
        d = np.asarray(descale)
    except Exception as exc:
        raise TypeError(f"{name} must be a number or a host array (NumPy, or a CPU tensor); got "
                        f"{type(descale).__name__}") from exc
    if d.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real number or an array of them; got dtype {d.dtype}")
    lead = next(iter(shapes.values()))  # the query heads' dims (..., H)
    for what, shape in shapes.items():
        if d.shape == shape and shape:
            d = np.repeat(d, lead[-1] // shape[-1], axis=-1)  # (..., H): K/V head h // g's entry for query head h
            break
    else:
        if d.shape != ():
            raise ValueError(f"{name} must have shape () (per tensor) or " + " or ".join(
                f"{s} ({w})" for w, s in shapes.items()) + f"; got {d.shape} (per-block descales: "
                "tinyflash.fp8_attention emulates them; the kernel takes one per head)")
    bad = d[~(np.isfinite(d) & (d > 0))]
    if bad.size:
        raise ValueError(f"{name} must be finite and > 0; got {bad.size} entries that are not, the first {bad[0]}")
    return np.broadcast_to(d.astype(np.float32), lead).reshape(-1)  # (B·H,)


def check_fp8_call(q, k, v, descale_q, descale_k, descale_v, causal, scale, kernel):
    """``(prob, version, bytes of q, k, v, on_device, QK_SCALE, V_SCALE)``: every argument checked, nothing on the
    GPU yet. QK_SCALE (one float32 per query head) = dq · dk · scale · log2 e, in fp8_attention's order; V_SCALE
    (one per query head) = dv of its K/V head."""
    arrays, on_device = placed({"q": q, "k": k, "v": v})
    found = {name: e4m3_bytes(x, name) for name, x in arrays.items()}
    prob = check_attention_inputs(*(shape_only(x) for x in arrays.values()), causal=causal, scale=scale,
                                  allowed=(FLOAT16,))
    version = VERSIONS.choose(kernel, WHO, among=FP8_VERSIONS)
    if prob.d != prob.d_v or prob.d not in version.head_dims:
        raise ValueError(f"{WHO} supports d = dv one of {version.head_dims}; got q {tuple(q.shape)}, v "
                         f"{tuple(v.shape)} (tinyflash.fp8_attention emulates any head dim)")
    lead_q, lead_kv = tuple(q.shape[:-2]), tuple(k.shape[:-2])
    dq = per_head(descale_q, "descale_q", {"per query head": lead_q, "per (batch, K/V head)": lead_kv})
    dk = per_head(descale_k, "descale_k", {"per query head": lead_q, "per (batch, K/V head)": lead_kv})
    dv = per_head(descale_v, "descale_v", {"per query head": lead_q, "per (batch, K/V head)": lead_kv})
    qk_scale = (dq * dk * np.float32(prob.scale * LOG2E)).astype(np.float32)  # (B·H,)  as fp8_attention's S2
    return prob, version, found, on_device, qk_scale, dv


def transposed_v(v_bytes, prob, like):
    """Vᵀ of every K/V head on the GPU (``fp8_tiling.transpose_v``): (heads, d, padded_keys(Nk)) bytes, flat."""
    n_k, d = prob.n_k, prob.d
    nkp, kv_heads = padded_keys(n_k), math.prod(prob.lead) // prob.kv_group
    vt = empty(like, kv_heads * d * nkp, np.uint8)
    kernel = transpose_v(d)
    for h0 in range(0, kv_heads, MAX_GRID_Y):
        h1 = min(h0 + MAX_GRID_Y, kv_heads)
        kernel[(nkp // TRANSPOSE_KEYS, h1 - h0), TRANSPOSE_THREADS](
            v_bytes[h0 * n_k * d:h1 * n_k * d], vt[h0 * d * nkp:h1 * d * nkp], n_k, nkp)
    return vt, nkp


@dataclass(frozen=True)
class Fp8Launch:
    """v11 sized for one problem, through the driver: the pass that writes Vᵀ (``transpose``: one block per 32 keys
    and K/V head), then v11 on O, LSE, the descales and the tensor maps of Q, K and Vᵀ (kept by their addresses)."""

    transpose: GridLaunch
    main: GridLaunch
    maps: MapCache

    def __call__(self, q, k, v, vt, o, lse, qk_scale, v_scale, stream: int = 0) -> None:
        """q, k, v: e4m3 bytes; vt: a buffer for Vᵀ's bytes; o: bfloat16 bits; qk_scale, v_scale: float32 per head."""
        self.transpose(v, vt, stream=stream)
        self.main(o, lse, qk_scale, v_scale, self.maps(q, k, vt, stream=stream), stream=stream)


@lru_cache(maxsize=256)
def sized_fp8(version, n_q: int, n_k: int, n_heads: int, kv_group: int, causal: bool, cfg) -> Fp8Launch:
    """An FP8 version and its Vᵀ pass sized for one problem: Vᵀ's columns n_k padded to a key tile, one block per
    (query tile of Br rows, head)."""
    nkp, kv_heads = padded_keys(n_k), n_heads // kv_group
    transpose = GridLaunch.sized(driver_kernel(transpose_v(cfg.D), TRANSPOSE_SIGNATURE),
                                 (nkp // TRANSPOSE_KEYS, kv_heads), TRANSPOSE_THREADS, 0, n_k=n_k, nkp=nkp)
    main = GridLaunch.sized(driver_kernel(version.build(cfg, "e4m3"), version.signature, cfg.smem_bytes),
                            (-(-n_q // cfg.BR), n_heads), cfg.NT, cfg.smem_bytes, n_q=n_q, n_k=n_k, causal=bool(causal),
                            kv_group=kv_group)
    return Fp8Launch(transpose, main, MapCache(cfg.maps(n_q, n_k, n_heads, kv_heads)))


def device_scales(qk_scale: np.ndarray, v_scale: np.ndarray, like) -> tuple:
    """The descales on the GPU, in ``like``'s library, kept by their values (the last MAX_SCALES of them): a call with
    the descales of a call before copies nothing. A copy is asynchronous where the library allows it (PyTorch's
    non_blocking), so that a call does not wait for the kernels queued before it."""
    key = (library(like), str(getattr(like, "device", "")), qk_scale.tobytes(), v_scale.tobytes())
    found = _SCALES.pop(key, None)
    if found is None:
        if library(like) == "torch":
            import torch

            found = tuple(torch.from_numpy(a.copy()).to(like.device, non_blocking=True) for a in (qk_scale, v_scale))
        else:
            import cupy

            found = tuple(cupy.asarray(a) for a in (qk_scale, v_scale))
        if len(_SCALES) >= MAX_SCALES:
            _SCALES.pop(next(iter(_SCALES)))
    _SCALES[key] = found  # the newest last
    return found


def hopper_fp8_attention(q, k, v, descale_q=1.0, descale_k=1.0, descale_v=1.0, *, causal: bool = False,
                         scale: float | None = None, kernel: str | None = None, config=None):
    """FlashAttention's forward pass on e4m3 inputs with Hopper's FP8 warpgroup multiplies. Returns ``(o, lse)``.

    q (..., H, Nq, d), k (..., H_kv, Nk, d), v (..., H_kv, Nk, d): e4m3 numbers, as ml_dtypes.float8_e4m3fn arrays
    (NumPy: copied to the GPU and back), torch.float8_e4m3fn CUDA tensors, or CuPy / numba device arrays of uint8
    holding e4m3 bytes; d = dv = 64, 128 or 256; k and v may have fewer heads (grouped-query attention). The inputs
    stand for q · descale_q, k · descale_k, v · descale_v (``tinyflash.quantize_fp8`` with granularity "tensor"
    or "head"): each descale a number, or an array of q's leading dims (per query head) or of k's (per batch and
    K/V head, FlashAttention-3's), on the host. ``causal``, ``scale``: stage 1's.

    o (..., H, Nq, d) is bfloat16 (torch.bfloat16, ml_dtypes.bfloat16; CuPy and numba, which have no bfloat16:
    uint16 bit patterns), lse (..., H, Nq) float32. The result is :func:`tinyflash.fp8_attention`'s (its
    docstring: P in [0, 256] rounded to e4m3 for P·V), up to float32's roundings and, on a GPU, the FP8 tensor
    cores' accumulation (about 13 bits kept while they add). ``kernel``: v11 (None); ``config``: its tiling.
    Needs a Hopper GPU (compute capability 9.0).
    """
    # 1. check the arguments (no GPU is looked for before they pass)
    prob, version, found, on_device, qk_scale, v_scale = check_fp8_call(q, k, v, descale_q, descale_k, descale_v,
                                                                        causal, scale, kernel)
    require_gpu()
    version.requirement(WHO)
    on_simulator, on_gpu = version.tilings[1], version.tilings[0]
    cfg = config or (on_simulator(prob.d) if simulator_enabled() else on_gpu(prob.d, prob.causal, prob.n_q))
    if cfg.D != prob.d:
        raise ValueError(f"config {cfg} is for d = {cfg.D}; got d = {prob.d}")

    # 2. the inputs as flat bytes on the GPU, Vᵀ, and the outputs in the inputs' library (numba's for NumPy)
    heads, n_q, n_k, d = math.prod(prob.lead), prob.n_q, prob.n_k, prob.d
    if (on_device and library(q) in ("torch", "cupy") and not simulator_enabled() and 0 < heads <= MAX_GRID_Y
            and n_q > 0):  # PyTorch or CuPy on a GPU: the two launches through the driver, on the caller's stream
        qb, kb, vb = (dense(found[n]) for n in ("q", "k", "v"))
        o, lse = empty(q, heads * n_q * d, FLOAT16), empty(q, heads * n_q, np.float32)
        vt = empty(q, heads // prob.kv_group * d * padded_keys(n_k), np.uint8)
        sized_fp8(version, n_q, n_k, heads, prob.kv_group, prob.causal, cfg)(
            qb, kb, vb, vt, o, lse, *device_scales(qk_scale, v_scale, q), stream=current_stream(q))
        return bfloat16_result(o, prob.out_shape, True), result(lse, prob.lse_shape, False)
    qb, kb, vb = (numba_flat(found[n]) for n in ("q", "k", "v"))
    like = q if on_device else None
    o = empty(like, heads * n_q * d, FLOAT16)  # (B·H·Nq·d,) bfloat16 bits
    lse = empty(like, heads * n_q, np.float32)  # (B·H·Nq,)
    if n_q > 0 and heads > 0:
        vt, nkp = transposed_v(vb, prob, like)

        # 3. size the grid and launch: one block per (query tile, head)
        def tensor_maps_of(views, h):  # the maps of one launch's views of Q, K and Vᵀ
            return tensor_maps(cfg.maps(n_q, n_k, h, h // prob.kv_group), [views[n] for n in ("Q", "K", "V")])

        args = LaunchArgs(arrays={"Q": (qb, n_q * d), "K": (kb, n_k * d), "V": (numba_flat(vt), d * nkp),
                                  "O": (as_words(o), n_q * d // 2), "LSE": (numba_flat(lse), n_q),
                                  "QK_SCALE": (numba_flat(qk_scale), 1), "V_SCALE": (numba_flat(v_scale), 1)},
                          scalars={"n_q": n_q, "n_k": n_k, "causal": prob.causal, "kv_group": prob.kv_group},
                          n_heads=heads, kv_group=prob.kv_group, derived=(("TMAPS", tensor_maps_of),))
        with simulated_warps(True):
            launch(version.build(cfg, "e4m3"), -(-n_q // cfg.BR), cfg.NT, cfg.smem_bytes, args,
                   key_tiles=-(-n_k // cfg.BC))
    return bfloat16_result(o, prob.out_shape, on_device), result(lse, prob.lse_shape, not on_device)


def bfloat16_result(o, shape, on_device: bool):
    """O's bfloat16 bits in the caller's form: torch.bfloat16, a NumPy array of ml_dtypes.bfloat16, or uint16."""
    if not on_device:
        return result(o, shape, True, ml_dtypes.bfloat16)
    o = o.reshape(shape)
    if library(o) == "torch":
        import torch

        return o.view(torch.bfloat16)
    return o.view(np.uint16)
