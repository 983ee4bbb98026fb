"""The backward benchmark: ``python -m tinyflash.bench backward --csv figures/data/backward_h200.csv``.

For B = 1, H = 32, d in {64, 128}, causal and not, N up to 16,384, on fresh random inputs, it
measures the backward pass alone (given q, k, v, o, lse and dO) of:

* ``tinyflash``: :func:`tinyflash.cuda_attention_backward`, float32 (float32 arithmetic);
* ``torch_efficient``: PyTorch SDPA's memory-efficient backend, float32;
* ``torch_flash``: PyTorch SDPA's flash backend, float16 (it takes no float32);
* ``cupy_naive``: the textbook backward in CuPy, float32, S and P materialised (it recomputes them
  from q and k, as a training step that kept them would have them): "oom" where it does not fit.

Each is **checked first**, on the first head, against the float64 gradients (computed on the GPU
in float64, a block of rows at a time): float32 within ``F32_GRAD_TOL``; float16 by
FlashAttention's rule for gradients (3× the error of the naive backward in float16). Then it is
timed with the harness's :func:`~tinyflash.measure.harness.time_call`. TFLOP/s count 2.5 times
the forward's FLOPs (10·B·H·Nq·Nk·d, halved for causal), as FlashAttention and Triton do. Rows
have the harness's schema (:data:`~tinyflash.measure.harness.FIELDS`), benchmark "backward".
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..core.masks import allowed
from ..core.tolerance import assert_close, assert_fa_rule
from . import report
from .harness import (
    CsvWriter,
    _peak_hook_class,
    attention_flops,
    environment,
    time_call,
)

BACKWARD_NS = [1024, 4096, 16384]  # three lengths: the whole run is meant to take a few minutes
F32_GRAD_TOL = 1e-4  # float32 gradients against the float64 reference, relative
GRAD_FACTOR = 3.0  # FlashAttention's rule for float16 gradients
ROW_BLOCK = 2048  # rows of S per step of the float64 reference
TILE_SWEEP = {  # (BR, BC, NT, TM, TK) of the backward kernel tried per head dim (``backward-tiles``); the first
    # is the default. All compile for sm_90 without spills (benchmarks/backward_ptx.py prints their registers).
    64: [(64, 64, 128, 8, 8), (64, 64, 256, 4, 4), (64, 32, 128, 8, 4)],
    128: [(64, 64, 256, 4, 8), (64, 64, 256, 8, 8), (32, 64, 256, 4, 8), (64, 32, 128, 8, 4)],
}


def backward_flops(batch, heads, n_q, n_k, d, causal) -> float:
    """2.5 × the forward's 4·B·H·Nq·Nk·d (halved for causal): the backward's five products against two."""
    return 2.5 * attention_flops(batch, heads, n_q, n_k, d, causal)


def naive_backward(q, k, v, do, causal):
    """The textbook backward in CuPy, in the input dtype: S, P, dP, dS of (..., Nq, Nk) in HBM."""
    import cupy

    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    S = cupy.matmul(q, k.swapaxes(-1, -2)) * scale  # (..., Nq, Nk)
    if causal:
        cupy.copyto(S, S.dtype.type(-np.inf), where=~allowed(range(n_q), np.arange(n_k), n_q, n_k, xp=cupy))
    P = cupy.exp(S - S.max(axis=-1, keepdims=True))  # (..., Nq, Nk)
    del S
    P /= P.sum(axis=-1, keepdims=True, dtype=np.float32).astype(P.dtype)
    dv = cupy.matmul(P.swapaxes(-1, -2), do)  # (..., Nk, dv)
    dS = cupy.matmul(do, v.swapaxes(-1, -2))  # (..., Nq, Nk) dP, turned into dS in place
    dS -= (dS * P).sum(axis=-1, keepdims=True, dtype=np.float32).astype(P.dtype)
    dS *= P
    del P
    return cupy.matmul(dS, k) * scale, cupy.matmul(dS.swapaxes(-1, -2), q) * scale, dv


def reference_head(q, k, v, do, causal):
    """float64 gradients of one head (N, d) on the GPU, ROW_BLOCK query rows at a time (CuPy)."""
    import cupy

    q, k, v, do = (x.astype(cupy.float64) for x in (q, k, v, do))
    n_q, n_k = q.shape[0], k.shape[0]
    dq, dk, dv = cupy.zeros_like(q), cupy.zeros_like(k), cupy.zeros_like(v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    for r0 in range(0, n_q, ROW_BLOCK):
        rows = range(r0, min(r0 + ROW_BLOCK, n_q))
        S = scale * (q[rows.start:rows.stop] @ k.T)  # (rows, Nk)
        if causal:
            S[~allowed(rows, np.arange(n_k), n_q, n_k, xp=cupy)] = -np.inf
        P = cupy.exp(S - S.max(axis=-1, keepdims=True))
        P /= P.sum(axis=-1, keepdims=True)
        dO = do[rows.start:rows.stop]  # (rows, dv)
        dP = dO @ v.T  # (rows, Nk)
        dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
        dq[rows.start:rows.stop] = scale * (dS @ k)
        dk += scale * (dS.T @ q[rows.start:rows.stop])
        dv += P.T @ dO
    return dq, dk, dv


def ours(config=None):
    """make(q, k, v, do, causal) for tinyflash: the forward once, then a function running the backward."""
    from ..backward.cuda import cuda_attention_backward
    from ..forward.cuda import cuda_attention

    def make(q, k, v, do, causal):
        o, lse = cuda_attention(q, k, v, causal=causal)
        options = {} if config is None else {"config": config}
        return lambda: cuda_attention_backward(q, k, v, o, lse, do, causal=causal, **options)

    return make


def tile_variants(d: int):
    """tinyflash's backward with each tiling of TILE_SWEEP[d] (float32)."""
    from ..backward.kernels.tiling import BackwardTileConfig

    found = []
    for BR, BC, NT, TM, TK in TILE_SWEEP[d]:
        cfg = BackwardTileConfig(BR, BC, NT, TM, TK, D=0, DV=0).padded(d, d)
        found.append(("tinyflash", f"v1 BR={BR} BC={BC} NT={NT} TM={TM} TK={TK}", "float32", ours(cfg)))
    return found


def variants(d: int):
    """(impl, variant, dtype, make) with make(q, k, v, do, causal) -> a function computing (dq, dk, dv)."""
    from ..backward.kernels import LATEST

    found = [("tinyflash", LATEST, "float32", ours()),
             ("cupy_naive", "", "float32", lambda q, k, v, do, causal: lambda: naive_backward(q, k, v, do, causal))]
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return found

    def sdpa(backend):
        def make(q, k, v, do, causal):
            tq, tk, tv = (torch.from_dlpack(x).requires_grad_() for x in (q, k, v))
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            tdo = torch.from_dlpack(do)
            return lambda: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True)

        return make

    return found + [("torch_efficient", "", "float32", sdpa(SDPBackend.EFFICIENT_ATTENTION)),
                    ("torch_flash", "", "float16", sdpa(SDPBackend.FLASH_ATTENTION))]


def check_head(grads, q, k, v, do, causal, ref):
    """The first head's gradients against the float64 ``ref``: (ok, max relative error)."""
    import cupy

    head = [cupy.asarray(g)[0, 0] for g in grads]  # (N, d) each
    worst = 0.0
    try:
        if q.dtype == np.float32:
            for name, g, r in zip(("dq", "dk", "dv"), head, ref):
                worst = max(worst, assert_close(g, r, F32_GRAD_TOL, name))
        else:
            naive = naive_backward(q[0, 0], k[0, 0], v[0, 0], do[0, 0], causal)  # float16, the rule's baseline
            for name, g, n, r in zip(("dq", "dk", "dv"), head, naive, ref):
                assert_fa_rule(g, n, r, np.float16, factor=GRAD_FACTOR, what=name)
                worst = max(worst, float(cupy.abs(g.astype(np.float64) - r).max() / cupy.abs(r).max()))
    except AssertionError as exc:
        return False, str(exc)
    return True, worst


def measure_backward(make, q, k, v, do, causal, ref, meter):
    """Check, then time one implementation; the measured fields of a row."""
    import cupy

    try:
        run = make(q, k, v, do, causal)
        with _peak_hook_class()() as hook:  # CuPy's allocations; PyTorch's are its own
            if meter == "torch":
                import torch

                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            grads = run()
            cupy.cuda.Device().synchronize()
        peak = torch.cuda.max_memory_allocated() - base if meter == "torch" else hook.peak
        ok, err = check_head(grads, q, k, v, do, causal, ref)
        del grads
        if not ok:
            return {"status": f"wrong ({err})", "peak_bytes": peak}
        return {**time_call(run), "status": "ok", "peak_bytes": peak, "max_rel_err": err}
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError":
            return {"status": "oom"}
        raise
    finally:
        cupy.get_default_memory_pool().free_all_blocks()


def run_backward(*, ns=None, ds=(64, 128), causals=(False, True), impls=None, batch=1, heads=32, csv_path=None,
                 seed=None, tiles: bool = False) -> list[dict]:
    """Measure every variant for every d, causal and N; print a line and write a CSV row each.
    ``tiles``: instead, the tilings of TILE_SWEEP (default N: 16,384 only)."""
    import cupy
    from numba.core.errors import NumbaPerformanceWarning

    warnings.simplefilter("ignore", NumbaPerformanceWarning)
    env, rng, rows, writer = environment(), np.random.default_rng(seed), [], CsvWriter(csv_path)
    print(f"backward: {env['device']}  numba-cuda {env['numba_cuda']}  cupy {env['cupy']}  torch {env['torch'] or '-'}"
          f"  {env['date']}; B={batch} H={heads}; TFLOP/s = 2.5 × forward FLOPs")
    print(report.LINE_HEADER)
    for d in ds:
        for causal in causals:
            for n in ns or ([16384] if tiles else BACKWARD_NS):
                gen = cupy.random.default_rng(int(rng.integers(2**31)))
                # float16 values stored as float32: every implementation, whatever its dtype, gets the same inputs
                q, k, v, do = (gen.standard_normal((batch, heads, n, d), dtype=np.float32).astype(np.float16)
                               .astype(np.float32) for _ in range(4))  # (B, H, N, d) each
                ref = reference_head(q[0, 0], k[0, 0], v[0, 0], do[0, 0], causal)  # (N, d) each, float64
                for impl, variant, dtype, make in (tile_variants(d) if tiles else variants(d)):
                    if impls and impl not in impls:
                        continue
                    x = [a.astype(dtype) for a in (q, k, v, do)]  # (B, H, N, d) each
                    res = measure_backward(make, *x, causal, ref, "torch" if impl.startswith("torch") else "cupy")
                    row = {**env, "benchmark": "backward-tiles" if tiles else "backward", "impl": impl, "variant": variant, "dtype": dtype,
                           "causal": causal, "batch": batch, "heads": heads, "n": n, "d": d, **res}
                    if res["status"] == "ok":
                        row["tflops"] = backward_flops(batch, heads, n, n, d, causal) / (res["time_ms"] * 1e9)
                    rows.append(row)
                    writer.write(row)
                    print(report.line(row), flush=True)
                    del x
                del q, k, v, do, ref
                cupy.get_default_memory_pool().free_all_blocks()
    writer.close()
    return rows
