"""Stage 3 against its peers: ``python -m tinyflash.bench tensor-cores``.

The tensor-core kernel (v6, ``tinyflash.tensor_core_attention``) beside PyTorch SDPA's flash
backend (FlashAttention-2) and cuDNN backend, and stage 2's kernel (v5) in float16, all in one
run on the same PyTorch tensors, float16 and bfloat16 (CuPy has no bfloat16, so inputs here are
PyTorch tensors). Each peer is checked first (:func:`check_torch`); those that pass are timed together
by the harness's :func:`~tinyflash.measure.harness.time_interleaved`: in rounds, each round every peer
in turn, both queued (calls back to back, the GPU kept busy: GPU time per call, as FlashAttention's own
benchmarks time) and one call alone (host time included). Each row of the CSV carries ``speed_vs_flash``:
the flash backend's median queued time over this one's (1.0: as fast; > 1: faster), the quartiles of
that ratio round by round, and ``latency_vs_flash``, the same ratio for one call alone.

    python -m tinyflash.bench tensor-cores --csv figures/data/tensor_cores_h200.csv
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from . import report
from .harness import FIELDS, CsvWriter, attention_flops, environment, time_interleaved

CHECK_ROWS = 64  # query rows sampled per checked head
# beyond the harness's: a queued burst's calls, one call's latency (host included), speed over the flash backend:
# queued (median over median), the quartiles of the rounds' ratios, and one call's latency
TC_FIELDS = [*FIELDS, "burst", "latency_ms", "speed_vs_flash", "speed_vs_flash_q1", "speed_vs_flash_q3",
             "latency_vs_flash"]


def _host64(x):
    return x.detach().float().cpu().numpy().astype(np.float64)


def check_torch(o, q, k, v, *, causal: bool, rng, lse=None, rows: int = CHECK_ROWS) -> dict:
    """o of PyTorch q, k, v (B, H, N, d) on sampled rows of the first and last head: FlashAttention's
    rule (error <= 2 × that of naive attention in the input dtype, computed by PyTorch, + rounding),
    against the float64 reference; lse, if given, within F32_TOL. Returns ok, max_rel_err, tolerance."""
    import torch

    from ..core.masks import allowed
    from ..core.tolerance import F32_TOL, RuleCheck, lse_error
    from ..forward.naive import reference_attention

    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    ok, worst, tolerance = True, 0.0, math.inf
    for b, h in sorted({(0, 0), (q.shape[0] - 1, q.shape[1] - 1)}):
        idx = np.sort(rng.choice(n_q, size=min(rows, n_q), replace=False))  # (rows,)
        ref_o, ref_lse = reference_attention(*(_host64(x[b, h]) for x in (q, k, v)), causal=causal, rows=idx)
        qi = q[b, h][torch.as_tensor(idx, device=q.device)]  # (rows, d)
        S = (qi @ k[b, h].T) * (1.0 / math.sqrt(d))  # (rows, Nk) in the input dtype
        if causal:
            keep = torch.as_tensor(allowed(idx, np.arange(n_k), n_q, n_k), device=q.device)  # (rows, Nk)
            S = S.masked_fill(~keep, -math.inf)
        naive = _host64(torch.softmax(S, dim=-1) @ v[b, h])  # (rows, d): NaN for rows that see no key
        naive = np.where(np.isnan(naive), 0.0, naive)  # those rows are 0 by the project's convention
        fast = _host64(o[b, h][torch.as_tensor(idx, device=o.device)])  # (rows, d)
        r16 = torch.as_tensor(ref_o).to(q.dtype)  # flash-attn's fwd_atol: rounding of (r + 0.3) - 0.3 in the dtype
        atol = 2.0 * float((((r16 + 0.3) - 0.3) - r16).abs().max())
        rule = RuleCheck(float(np.abs(fast - ref_o).max()), float(np.abs(naive - ref_o).max()), atol, 2.0)
        scale = float(np.abs(ref_o).max()) or 1.0
        ok = ok and rule.ok and bool(np.isfinite(fast).all())
        worst, tolerance = max(worst, rule.fast_error / scale), min(tolerance, rule.bound / scale)
        if lse is not None:
            ok = ok and lse_error(_host64(lse[b, h][torch.as_tensor(idx, device=lse.device)]), ref_lse) <= F32_TOL
    return {"ok": ok, "max_rel_err": worst, "tolerance": tolerance}


def peers():
    """(impl, variant, fn(q, k, v, causal) -> o, dtypes it runs, around): the flash backend first (the
    yardstick). ``around()`` is a context entered once around the check and the timed calls, not in each
    call: SDPA's choice of backend (``sdpa_kernel``, a few µs of host time per entry) is a setting a
    program makes once, not part of the attention call; for tinyflash it does nothing."""
    from contextlib import nullcontext

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..forward.cuda import cuda_attention
    from ..forward.tensor_cores import tensor_core_attention

    def sdpa(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return [("torch_flash", "", sdpa, ("float16", "bfloat16"), lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
            ("torch_cudnn", "", sdpa, ("float16", "bfloat16"), lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
            ("tinyflash", "v6", lambda q, k, v, causal: tensor_core_attention(q, k, v, causal=causal)[0],
             ("float16", "bfloat16"), nullcontext),
            ("tinyflash", "v5", lambda q, k, v, causal: cuda_attention(q, k, v, causal=causal, kernel="v5")[0],
             ("float16",), nullcontext)]


def sweep_tensor_cores(csv_path=None, *, ns=(4096, 16384), ds=(64, 128), dtypes=("float16", "bfloat16"),
                       causals=(False, True), batch: int = 1, heads: int = 32, seed: int | None = None) -> list[dict]:
    """Check every peer on fresh random inputs (B, H, N, d), then time those that passed together
    (:func:`~tinyflash.measure.harness.time_interleaved`); print and write a row each."""
    import torch

    env, rng, rows = environment(), np.random.default_rng(seed), []
    writer = CsvWriter(csv_path, fields=TC_FIELDS)
    print(f"tensor-cores: {env['device']}  numba-cuda {env['numba_cuda']}  torch {env['torch']}  {env['date']}; "
          f"B={batch} H={heads}; ms: queued calls (GPU time per call); latency: one call alone, host included")
    print(report.LINE_HEADER + "  vs flash (q1-q3)  latency ms  vs flash")
    for dtype in dtypes:
        for d in ds:
            for causal in causals:
                for n in ns:
                    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**31)))
                    q, k, v = (torch.randn((batch, heads, n, d), device="cuda", generator=gen).to(getattr(torch, dtype))
                               for _ in range(3))  # (B, H, N, d) each
                    config = {"benchmark": "tensor-cores", "dtype": dtype, "causal": causal, "batch": batch,
                              "heads": heads, "n": n, "d": d}
                    new = measure_peers(q, k, v, causal, rng, dtype, batch, heads, n, d)
                    for row in new:
                        row = {**env, **config, **row}
                        rows.append(row)
                        writer.write(row)
                        print(report.line(row) + vs_flash_cells(row), flush=True)
                    del q, k, v
                    torch.cuda.empty_cache()
    writer.close()
    return rows


def measure_peers(q, k, v, causal, rng, dtype, batch, heads, n, d, peer_list=None, timer=time_interleaved,
                  check=None) -> list:
    """Every peer (of ``peer_list``, default :func:`peers`) that runs ``dtype`` checked on q, k, v (``check``,
    default :func:`_check`), then those that passed timed together by ``timer``; one row each: impl, variant,
    the measured fields, and speeds over the flash backend's (the ratio of medians, the quartiles of the
    rounds' ratios, and the ratio of one-call latencies)."""
    rows, timed = [], {}
    for impl, variant, fn, its_dtypes, around in peer_list or peers():
        if dtype not in its_dtypes:
            continue
        with around():
            row = {"impl": impl, "variant": variant, **(check or _check)(fn, q, k, v, causal, rng)}
        rows.append(row)
        if row["status"] == "ok":
            timed[impl, variant] = ((lambda fn: lambda: fn(q, k, v, causal))(fn), around)
    times = timer(timed) if timed else {}
    flash = times.get(("torch_flash", ""))
    for row in rows:
        t = times.get((row["impl"], row["variant"]))
        if t is None:
            continue
        row.update({key: t[key] for key in ("time_ms", "time_min_ms", "time_max_ms", "reps", "burst", "latency_ms")})
        row["tflops"] = attention_flops(batch, heads, n, n, d, causal) / (t["time_ms"] * 1e9)
        if flash:
            per_round = [f / x for f, x in zip(flash["rounds_ms"], t["rounds_ms"], strict=True)]
            q1, _, q3 = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
            row.update({"speed_vs_flash": flash["time_ms"] / t["time_ms"], "speed_vs_flash_q1": q1,
                        "speed_vs_flash_q3": q3, "latency_vs_flash": flash["latency_ms"] / t["latency_ms"]})
    return rows


def vs_flash_cells(row: dict) -> str:
    """The printed line's last columns: speed over flash (quartiles of the rounds), latency, its speed over flash."""
    if "speed_vs_flash" not in row or row.get("speed_vs_flash") in (None, ""):
        return ""
    return (f"  {float(row['speed_vs_flash']):8.3f} ({float(row['speed_vs_flash_q1']):.3f}-"
            f"{float(row['speed_vs_flash_q3']):.3f})  {float(row['latency_ms']):10.3f}  "
            f"{float(row['latency_vs_flash']):8.3f}")


def _check(fn, q, k, v, causal, rng) -> dict:
    """Check one call (:func:`check_torch`); peak extra memory from PyTorch's allocator. A backend that
    refuses these inputs gets status 'unsupported'; a wrong result 'wrong (...)', and is not timed."""
    import torch

    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        o = fn(q, k, v, causal)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        verdict = check_torch(o, q, k, v, causal=causal, rng=rng)
        del o
        res = {"peak_bytes": peak, "max_rel_err": verdict["max_rel_err"], "tolerance": verdict["tolerance"]}
        if not verdict["ok"]:
            return {**res, "status": f"wrong (error {verdict['max_rel_err']:.2e} > {verdict['tolerance']:.2e})"}
        return {**res, "status": "ok"}
    except RuntimeError as exc:  # a backend that refuses these inputs
        if "No available kernel" in str(exc) or "not supported" in str(exc).lower():
            return {"status": "unsupported"}
        raise


def speed_table(rows: list[dict]) -> str:
    """Markdown: v6's TFLOP/s and its speed relative to the flash backend per configuration (queued; the
    middle half of the rounds' ratios; one call alone), with the peers' TFLOP/s (the README's stage-3 table).
    '–' where a CSV has no such column (runs before interleaved timing)."""
    ok = {(r["impl"], r["variant"], r["dtype"], r["d"], r["causal"], r["n"]): r for r in rows if r["status"] == "ok"}
    keys = sorted({k[2:] for k in ok}, key=lambda k: (k[0], int(k[1]), k[2], int(k[3])))
    lines = ["| dtype | d | causal | N | v6 TFLOP/s | v6 / flash | its rounds' middle half "
             "| one call alone: v6 / flash | SDPA flash | SDPA cuDNN | v5 (stage 2) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(impl, variant, key, fmt="{:.1f}", field="tflops"):
        r = ok.get((impl, variant, *key))
        return fmt.format(float(r[field])) if r and r.get(field) not in (None, "") else "–"

    for key in keys:
        q1, q3 = cell("tinyflash", "v6", key, "{:.2f}", "speed_vs_flash_q1"), cell("tinyflash", "v6", key, "{:.2f}",
                                                                                    "speed_vs_flash_q3")
        lines.append(f"| {' | '.join(str(x) for x in key)} | {cell('tinyflash', 'v6', key)} | "
                     f"{cell('tinyflash', 'v6', key, '{:.2f}×', 'speed_vs_flash')} | "
                     f"{'–' if q1 == '–' else f'{q1}–{q3}×'} | "
                     f"{cell('tinyflash', 'v6', key, '{:.2f}×', 'latency_vs_flash')} | "
                     f"{cell('torch_flash', '', key)} | {cell('torch_cudnn', '', key)} | "
                     f"{cell('tinyflash', 'v5', key)} |")
    return "\n".join(lines)
