"""Stage 1 in FP8: the tiled loop on e4m3 inputs, as the Hopper FP8 kernel runs it, in NumPy.

Q, K and V arrive as e4m3 bytes with float32 descale factors (``tinyflash.quantize_fp8``: x ≈ x8 · descale).
The tensor cores multiply the bytes as they are, with products accumulated in float32; every descale is applied
to a float32 result, never to an input. The loop is stage 1's (``blocked.py``), in base 2 as the kernels run it,
with two changes, marked FP8 below:

    for each query tile Q8_i (Br rows), descale dq_i:
        m2 = -inf, l = 0, acc = 0
        for each key/value tile K8_j, V8_j (Bc rows), descales dk_j, dv_j:
            S2 = (Q8_i K8_jᵀ) · (dq_i · dk_j · scale · log2 e)     float32 accumulation, one factor per tile
            S2 = -inf where masked
            m_new = max(m2, rowmax(S2))
            P   = exp2(S2 - m_new + offset)                  FP8: P in [0, 2^offset], not [0, 1]
            a   = exp2(m2 - m_new)
            l   = a · l + rowsum(P)                          (the float32 P, before it is rounded)
            acc = a · acc + round_e4m3(P) V8_j  [· dv_j]     FP8: P rounded to e4m3 for the second product
            m2  = m_new
        O_i = acc · dv / l,  lse_i = (m2 + log2(l) - offset) · ln 2

**P's range.** Without the offset P = exp2(S2 - m2) lies in [0, 1], and its small entries (below 2^-6) fall into
e4m3's subnormals, or under 2^-9 to zero. FlashAttention-3 subtracts a fixed ``offset`` (8) from the row maximum
instead: P = 2^offset · exp(S - m) lies in [0, 2^offset] = [0, 256], within e4m3's 448, and entries down to
2^-14 of the largest stay normal. The factor 2^offset is in acc and in l alike, so O = acc / l needs no
correction; lse = log(l) + m takes it out (the ``- offset`` above).

**The descales.** dq_i and dk_j scale the rows and the columns of S, so each tile needs one float per row and per
column at most; with per-tensor or per-(batch, head) descales (what FlashAttention-3's kernel takes) they are one
float for the whole loop, folded into the softmax's scale. V's descale multiplies O once, at the end; a
per-block one (``dv_j``, FlashAttention-3's block quantization) multiplies each tile's P V8_j instead.

The output is float32, the unrounded O: the kernel writes bfloat16, one more rounding of at most 2^-9 relative,
which NumPy (without ml_dtypes) cannot store, and which the accuracy study applies to every method alike.
"""

from __future__ import annotations

import numpy as np

from ..core.checks import as_array, check_attention_inputs, check_positive_int
from ..core.e4m3 import decode_e4m3, round_e4m3
from ..core.heads import group_query_heads, kv_heads_view, ungroup_heads
from ..core.masks import causal_mask, key_stop
from ..core.online_softmax import LN2, LOG2E

E4M3 = "float8_e4m3fn"  # ml_dtypes' name of the type (PyTorch's is torch.float8_e4m3fn)
P_OFFSET = 8  # FlashAttention-3's: P in [0, 2^8]


def _decoded(x, name: str) -> np.ndarray:
    """e4m3 bytes (ml_dtypes' float8_e4m3fn) as exact float32 values."""
    x = as_array(x, name)
    if getattr(getattr(x, "dtype", None), "name", None) != E4M3:
        raise TypeError(f"{name} must be an array of e4m3 numbers (ml_dtypes.float8_e4m3fn, as quantize_fp8 returns "
                        f"them); got {type(x).__name__} of dtype {getattr(x, 'dtype', None)}")
    return decode_e4m3(x)


def _descale_blocks(descale, name: str, lead: tuple, n: int, block: int) -> np.ndarray:
    """A descale given per tensor (shape ()), per head (``lead``) or per block of ``block`` rows (lead + (T,)), as
    one float32 per (head, block): shape lead + (T,), T = ceil(n / block), or lead + (1,) when it has no blocks."""
    t = -(-n // block)
    d = np.asarray(descale)
    if d.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real number or an array of them; got dtype {d.dtype}")
    if d.shape not in ((), lead, (*lead, t)):
        raise ValueError(f"{name} must have shape () (per tensor), {lead} (per head) or {(*lead, t)} (per block of "
                         f"{block} rows: the forward's tile; quantize_fp8 with block={block}); got {d.shape}")
    bad = d[~(np.isfinite(d) & (d > 0))]
    if bad.size:
        raise ValueError(f"{name} must be finite and > 0; got {bad.size} entries that are not, the first {bad[0]}")
    d = d.astype(np.float32)
    if d.shape == (*lead, t):
        return d  # (..., H, T)
    return np.broadcast_to(d if d.shape == () else d[..., None], (*lead, 1))  # (..., H, 1)


@np.errstate(invalid="ignore", over="ignore")
def fp8_attention(q, k, v, descale_q=1.0, descale_k=1.0, descale_v=1.0, *, causal: bool = False,
                  scale: float | None = None, block_q: int = 64, block_k: int = 64, p_offset: int = P_OFFSET):
    """Attention on e4m3 inputs, emulated as the FP8 kernel computes it. Returns ``(o, lse)``, both float32.

    q (..., H, Nq, d), k (..., H_kv, Nk, d), v (..., H_kv, Nk, dv): ml_dtypes ``float8_e4m3fn`` arrays, with
    float32 descales such that the inputs stand for q · descale_q, ... (:func:`tinyflash.quantize_fp8` makes
    both). A descale is a number (per tensor), an array of the leading dims (per head) or of the leading dims and
    one entry per tile of ``block_q`` (q) or ``block_k`` (k, v) rows (per block). Otherwise stage 1's contract
    (``causal``, ``scale``, grouped-query heads, ragged tiles). ``p_offset``: P is computed in [0, 2^p_offset]
    before it is rounded to e4m3 (FlashAttention-3's 8).
    """
    q, k, v = _decoded(q, "q"), _decoded(k, "k"), _decoded(v, "v")  # float32, exact
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale)
    Br, Bc = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    if isinstance(p_offset, (bool, np.bool_)) or not isinstance(p_offset, (int, np.integer)) or not 0 <= p_offset <= 8:
        raise ValueError(f"p_offset must be an integer from 0 to 8 (P <= 2^p_offset must fit e4m3's 448); got {p_offset!r}")
    n_q, n_k, g = prob.n_q, prob.n_k, prob.kv_group
    dq = _descale_blocks(descale_q, "descale_q", q.shape[:-2], n_q, Br)  # (..., H, Tr or 1)
    dk = _descale_blocks(descale_k, "descale_k", k.shape[:-2], n_k, Bc)  # (..., H_kv, Tc or 1)
    dv = _descale_blocks(descale_v, "descale_v", v.shape[:-2], n_k, Bc)  # (..., H_kv, Tc or 1)
    v_per_block = dv.shape[-1] > 1  # per tile, into each P V8_j; else once, at the end

    # grouped-query heads by views, as in stage 1; the descales as (..., T, 1) columns grouped the same way
    q, k, v = group_query_heads(q, g), kv_heads_view(k, g), kv_heads_view(v, g)
    dq, dk, dv = group_query_heads(dq[..., None], g), kv_heads_view(dk[..., None], g), kv_heads_view(dv[..., None], g)
    lead = q.shape[:-2]
    O = np.empty((*lead, n_q, prob.d_v), dtype=np.float32)  # (..., Nq, dv)
    lse = np.empty((*lead, n_q), dtype=np.float32)  # (..., Nq)
    for i in range(-(-n_q // Br)):  # one query tile: one thread block (one consumer warpgroup) on the GPU
        q_start, q_end = i * Br, min(i * Br + Br, n_q)
        Q_i = q[..., q_start:q_end, :]  # (..., Br, d)  e4m3 values
        dq_i = dq[..., min(i, dq.shape[-2] - 1), :, None]  # (..., 1, 1)
        m2 = np.full((*lead, q_end - q_start), -np.inf, dtype=np.float32)  # (..., Br)  running max, base 2
        l_i = np.zeros((*lead, q_end - q_start), dtype=np.float32)  # (..., Br)  running sum of P
        acc = np.zeros((*lead, q_end - q_start, prob.d_v), dtype=np.float32)  # (..., Br, dv)
        k_stop = key_stop(q_end, n_q, n_k, prob.causal)
        for j in range(-(-n_k // Bc)):
            k_start = j * Bc
            if k_start >= k_stop:
                break  # this tile and all later ones are masked for every row of the tile
            k_end = min(k_start + Bc, n_k)
            K_j, V_j = k[..., k_start:k_end, :], v[..., k_start:k_end, :]  # (..., Bc, d), (..., Bc, dv)
            dk_j = dk[..., min(j, dk.shape[-2] - 1), :, None]  # (..., 1, 1)
            # S in base 2: the e4m3 product accumulated in float32, then one float32 factor per tile
            S2 = (Q_i @ np.swapaxes(K_j, -1, -2)) * (dq_i * dk_j * np.float32(prob.scale * LOG2E))  # (..., Br, Bc)
            if k_end > key_stop(q_start + 1, n_q, n_k, prob.causal):
                S2 = np.where(causal_mask(n_q, n_k, q_start, k_start, q_end - q_start, k_end - k_start), S2, -np.inf)
            m_new = np.maximum(m2, S2.max(axis=-1))  # (..., Br)
            m_safe = np.where(m_new == -np.inf, np.float32(0), m_new)  # rows with no allowed key yet
            # FP8: P = 2^offset · exp(S - m) in [0, 2^offset]: the offset is subtracted from the row max
            P = np.exp2(S2 - (m_safe - np.float32(p_offset))[..., None])  # (..., Br, Bc) float32
            alpha = np.exp2(m2 - m_safe)  # (..., Br)  rescale what came before to the new max
            l_i = alpha * l_i + P.sum(axis=-1)  # (..., Br)  from the float32 P, as FlashAttention-3 sums it
            PV = round_e4m3(P) @ V_j  # (..., Br, dv)  FP8: P rounded to e4m3, products accumulated in float32
            if v_per_block:
                PV *= dv[..., j, :, None]  # V's descale of this tile
            acc = alpha[..., None] * acc + PV  # (..., Br, dv)
            m2 = m_new
        # epilogue: the 2^offset of P is in acc and in l alike: O needs none; lse takes it out
        with np.errstate(divide="ignore"):
            O_i = np.where(l_i[..., None] == 0, np.float32(0), acc / l_i[..., None])  # (..., Br, dv)
            lse_i = np.where(l_i == 0, -np.inf, (m2 + np.log2(l_i) - np.float32(p_offset)) * np.float32(LN2))
        O[..., q_start:q_end, :] = O_i if v_per_block else O_i * dv[..., 0, :, None]
        lse[..., q_start:q_end] = lse_i
    return ungroup_heads(O, prob.out_shape), ungroup_heads(lse, prob.lse_shape)
