"""The one check of a benchmark result, for NumPy, CuPy or PyTorch arrays: before anything is timed.

A result is compared on a sample: the first and the last head (of the flattened leading dims),
CHECK_ROWS query rows of each for an output, every row of the first head for gradients. The
reference is float64 (:func:`tinyflash.reference_attention`, or the backward's, computed in float64
on the arrays' device a block of rows at a time). The rule is the project's one rule
(:func:`tinyflash.core.tolerance.within_tolerance`): float32 within a relative tolerance, float16 and
bfloat16 by FlashAttention's rule against the same computation done naively in the input's type,
S and P stored in that type, as FlashAttention's own tests do (:func:`naive_attention`,
:func:`naive_attention_backward`). That naive computation is also the benchmarks' "naive" peer.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.masks import allowed
from ..core.tolerance import F32_TOL, Verdict, lse_error, to_host64, within_tolerance
from ..forward.naive import reference_attention

CHECK_ROWS = 64  # query rows sampled per checked head
F32_GRAD_TOL = 1e-4  # float32 gradients against the float64 reference, relative
GRAD_FACTOR = 3.0  # FlashAttention's rule for 16-bit gradients: 3 × the naive error
ROW_BLOCK = 2048  # query rows per step of the backward's float64 reference


def dtype_name(x) -> str:
    """'float16', 'bfloat16', 'float32', ... of any array (PyTorch's 'torch.float16' without its prefix)."""
    return str(x.dtype).removeprefix("torch.")


class Ops:
    """The few operations the naive baselines need, for the array library of ``x`` (NumPy, CuPy, PyTorch)."""

    def __init__(self, x):
        self.lib = type(x).__module__.split(".")[0]
        if self.lib == "torch":
            import torch

            self.xp = torch
        elif self.lib == "cupy":
            import cupy

            self.xp = cupy
        else:
            self.lib, self.xp = "numpy", np

    def t(self, x):
        """The last two axes swapped."""
        return x.transpose(-1, -2) if self.lib == "torch" else x.swapaxes(-1, -2)

    def rowmax(self, x):
        return x.amax(dim=-1, keepdim=True) if self.lib == "torch" else x.max(axis=-1, keepdims=True)

    def rowsum(self, x, accumulate=None):
        """Row sums in x's type, accumulated in float32 unless ``accumulate`` is False (then in x's type)."""
        if self.lib == "torch":
            acc = None if accumulate is False else self.xp.float32
            return x.sum(dim=-1, keepdim=True, dtype=acc).to(x.dtype)
        acc = None if accumulate is False else np.float32
        return x.sum(axis=-1, keepdims=True, dtype=acc).astype(x.dtype)

    def device(self, host: np.ndarray, like):
        """A NumPy array moved to the device of ``like``."""
        if self.lib == "torch":
            return self.xp.as_tensor(host, device=like.device)
        return self.xp.asarray(host)

    def mask(self, S, keep) -> None:
        """S = -inf where ``keep`` (a boolean NumPy array that broadcasts to S) is False, in place."""
        drop = self.device(~np.asarray(keep), S)
        if self.lib == "torch":
            S.masked_fill_(drop, -math.inf)
        else:
            self.xp.copyto(S, S.dtype.type(-np.inf), where=drop)

    def float64(self, x):
        return x.double() if self.lib == "torch" else x.astype(np.float64)

    def softmax(self, S):
        """softmax(S) along the last axis, computed in float32 and rounded once to S's type."""
        if self.lib == "torch":
            return self.xp.softmax(S, dim=-1, dtype=self.xp.float32).to(S.dtype)
        x = S.astype(np.float32)
        x -= x.max(axis=-1, keepdims=True)
        self.xp.exp(x, out=x)
        x /= x.sum(axis=-1, keepdims=True)
        return x.astype(S.dtype)


SOFTMAX_ROWS = 1024  # rows of S turned into P at a time (their float32 copy is the only extra memory)


def naive_attention(q, k, v, *, causal: bool = False, rows=None, scale: float | None = None, mods=None):
    """Standard attention with S and P stored in the input's type, in the input's library: q (..., Nq, d),
    k (..., Nk, d), v (..., Nk, dv) with the same leading dims; only the query ``rows`` if given.

    As FlashAttention's tests compute their reference in the same precision: S = Q Kᵀ rounded to the
    input's type, P = softmax(S) computed in float32 and rounded once, O = P V. The benchmarks' naive peer
    (cuBLAS products, S and P in HBM) and, on sampled rows, the baseline of FlashAttention's rule. Like a
    plain softmax it gives NaN for a row that may attend no key (causal with Nq > Nk). ``mods``, for one head
    (q (Nq, d)): (score_mod, mask_mod) as the NumPy stages take them, applied to S on the host in float32
    (``core.mods``) and rounded back to S's type, before the softmax."""
    ops = Ops(q)
    n_q, n_k = q.shape[-2], k.shape[-2]
    query_rows = range(n_q) if rows is None else rows
    if rows is not None:
        q = q[..., ops.device(np.asarray(rows), q), :]  # (..., rows, d)
    S = q @ ops.t(k)  # (..., rows, Nk)  written to HBM
    S *= 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if causal:
        ops.mask(S, allowed(query_rows, np.arange(n_k), n_q, n_k))
    if mods is not None:
        S = _modified(S, ops, mods, np.asarray(query_rows), n_q, n_k)
    for r0 in range(0, S.shape[-2], SOFTMAX_ROWS):  # P in S's memory, a block of rows at a time
        S[..., r0:r0 + SOFTMAX_ROWS, :] = ops.softmax(S[..., r0:r0 + SOFTMAX_ROWS, :])
    return S @ v  # (..., rows, dv)


def _modified(S, ops, mods, rows, n_q: int, n_k: int):
    """S (rows, Nk) of one head with a score_mod and a mask_mod applied as the NumPy stages apply them (causal is
    S's own -inf already): computed on the host in float32, returned in S's type on S's device."""
    from ..core.mods import Mods, modified_scores

    host = to_host64(S).astype(np.float32)  # (rows, Nk)
    new, _ = modified_scores(Mods(*mods, lead=(), n_q=n_q, n_k=n_k, causal=False), host, rows, np.arange(n_k))
    return ops.device(new, S).to(S.dtype) if ops.lib == "torch" else ops.device(new, S).astype(S.dtype)


def at_head(mods, index: tuple):
    """(score_mod, mask_mod) called for one (b, h) of q's leading dims (B, H) while they see b = h = 0: what a
    check of one head's (N, d) slices passes to the NumPy stages."""
    score_mod, mask_mod = mods
    b, h = ((0,) * (2 - len(index)) + tuple(index))[-2:]
    return ((None if score_mod is None else lambda s, _b, _h, i, j: score_mod(s, b, h, i, j)),
            (None if mask_mod is None else lambda _b, _h, i, j: mask_mod(b, h, i, j)))


def sampled_heads(q, kv_group: int = 1) -> list[tuple]:
    """(query head index, K/V head index) of the heads a check looks at: the first and the last of q's
    leading dims; with grouped-query attention the K/V head is the query head // kv_group along axis -3."""
    lead = tuple(q.shape[:-2])
    first, last = (0,) * len(lead), tuple(n - 1 for n in lead)
    heads = sorted({first, last})
    return [(h, h[:-1] + (h[-1] // kv_group,) if h else h) for h in heads]


def check_output(o, q, k, v, *, causal: bool, rng, lse=None, rows: int = CHECK_ROWS, scale=None,
                 mods=None) -> Verdict:
    """An attention output ``o`` (and its ``lse``, if given) of q (..., H, Nq, d), k and v (..., H_kv, Nk, ·) on
    CHECK_ROWS sampled rows of the first and the last head, by the project's rule; the worst error, the
    smallest tolerance allowed. ``mods``: (score_mod, mask_mod) of the call, given to the reference and to
    the naive computation for each sampled head's (b, h)."""
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    n_q, name = q.shape[-2], dtype_name(q)
    ok, worst, tolerance = True, 0.0, math.inf
    for head, kv_head in sampled_heads(q, group):
        idx = np.sort(rng.choice(n_q, size=min(rows, n_q), replace=False))  # (rows,)
        qh, kh, vh = q[head], k[kv_head], v[kv_head]  # (N, d) each: this head and its K/V head
        score_mod, mask_mod = (None, None) if mods is None else at_head(mods, head)
        ref_o, ref_lse = reference_attention(*(to_host64(x) for x in (qh, kh, vh)), causal=causal, rows=idx, scale=scale,
                                             score_mod=score_mod, mask_mod=mask_mod)
        naive = to_host64(naive_attention(qh, kh, vh, causal=causal, rows=idx, scale=scale,
                                          mods=None if mods is None else (score_mod, mask_mod)))  # (rows, dv)
        naive = np.where(np.isnan(naive) & np.isinf(ref_lse)[:, None], 0.0, naive)  # rows that see no key: o = 0
        fast = to_host64(o[head][Ops(o).device(idx, o)])  # (rows, dv)
        verdict = within_tolerance(fast, ref_o, name, naive)
        ok, worst, tolerance = ok and verdict.ok, max(worst, verdict.error), min(tolerance, verdict.tolerance)
        if lse is not None:
            ok = ok and lse_error(to_host64(lse[head][Ops(lse).device(idx, lse)]), ref_lse) <= F32_TOL
    return Verdict(ok, worst, tolerance)


def reference_backward(q, k, v, do, *, causal: bool, scale=None):
    """float64 gradients (dq, dk, dv) of one head, q (Nq, d), k (Nk, d), v and do, on the arrays' device,
    ROW_BLOCK query rows at a time (never an Nq × Nk array)."""
    ops = Ops(q)
    q, k, v, do = (ops.float64(x) for x in (q, k, v, do))
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dq, dk, dv = (ops.xp.zeros_like(x) for x in (q, k, v))
    for r0 in range(0, n_q, ROW_BLOCK):
        rows = range(r0, min(r0 + ROW_BLOCK, n_q))
        S = scale * (q[rows.start:rows.stop] @ ops.t(k))  # (rows, Nk)
        if causal:
            ops.mask(S, allowed(rows, np.arange(n_k), n_q, n_k))
        P = ops.xp.exp(S - ops.rowmax(S))
        P /= ops.rowsum(P, accumulate=False)
        P = ops.xp.nan_to_num(P)  # rows that see no key: P = 0
        dO = do[rows.start:rows.stop]  # (rows, dv)
        dP = dO @ ops.t(v)  # (rows, Nk)
        dS = P * (dP - ops.rowsum(dP * P, accumulate=False))
        dq[rows.start:rows.stop] = scale * (dS @ k)
        dk += scale * (ops.t(dS) @ q[rows.start:rows.stop])
        dv += ops.t(P) @ dO
    return dq, dk, dv


def naive_attention_backward(q, k, v, do, *, causal: bool, scale=None):
    """The textbook backward of one head in the input's type and library: S, P, dP, dS of Nq × Nk stored in
    that type (the baseline of FlashAttention's rule for gradients, and the benchmarks' naive backward)."""
    ops = Ops(q)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    S = q @ ops.t(k)  # (..., Nq, Nk)
    S *= scale
    if causal:
        ops.mask(S, allowed(range(n_q), np.arange(n_k), n_q, n_k))
    S -= ops.rowmax(S)
    P = ops.xp.exp(S, out=S)  # (..., Nq, Nk)
    P /= ops.rowsum(P)
    dv = ops.t(P) @ do  # (..., Nk, dv)
    dS = do @ ops.t(v)  # (..., Nq, Nk): dP, turned into dS in place
    dS -= ops.rowsum(dS * P)
    dS *= P
    del P
    dq, dk = dS @ k, ops.t(dS) @ q
    dq *= scale
    dk *= scale
    return dq, dk, dv


def check_gradients(grads, q, k, v, do, *, causal: bool, reference=None, scale=None) -> Verdict:
    """Gradients (dq, dk, dv) of q, k, v, do (..., N, d) on the first head, every row, against the float64
    ``reference`` of that head (:func:`reference_backward`, computed if None): float32 within F32_GRAD_TOL,
    16-bit types by FlashAttention's rule for gradients (GRAD_FACTOR × the naive backward's error)."""
    head = (0,) * (q.ndim - 2)
    x = [t[head] for t in (q, k, v, do)]  # (N, d) each
    reference = reference or reference_backward(*x, causal=causal, scale=scale)
    name = dtype_name(q)
    naive = naive_attention_backward(*x, causal=causal, scale=scale) if name in ("float16", "bfloat16") else None
    ok, worst, tolerance = True, 0.0, math.inf
    for i, (g, ref) in enumerate(zip(grads, reference, strict=True)):
        verdict = within_tolerance(to_host64(g[head]), to_host64(ref), name,
                                   None if naive is None else to_host64(naive[i]), GRAD_FACTOR, F32_GRAD_TOL)
        ok, worst, tolerance = ok and verdict.ok, max(worst, verdict.error), min(tolerance, verdict.tolerance)
    return Verdict(ok, worst, tolerance)
