"""Decode benchmark: one query row per head against a long KV cache, float16, on a GPU.

    python -m tinyflash.bench decode --csv figures/data/decode_h200.csv

Shape (a Llama-like layer): H = 32 query heads, H_kv = 8 K/V heads, d = 128, Nq = 1,
B ∈ {1, 8}, Nk ∈ {4,096, 32,768, 131,072}. For each shape, every implementation is checked
against the float64 reference (first and last sequence, all heads; float16 by FlashAttention's
rule against standard attention in float16 on K/V repeated to 32 heads), then timed by the
harness's :func:`~tinyflash.measure.harness.time_call`:

* ``split_kv``: tinyflash's split kernel + combine kernel, ``num_splits`` by the rule: the
  tensor-core split kernel (``decode/tensor_cores.py``), its default tiling;
* ``split_kv`` variant ``CUDA cores``: the CUDA-core split kernel (``decode/kernels.py``), the one
  before the tensor cores;
* ``no_split``: the tensor-core kernels with one split, so one block per (sequence, K/V head):
  the idle GPU, measured;
* ``paged``: the same kernels reading the same keys through a block table (pages of 16 tokens,
  shuffled in the pool);
* ``torch_flash``, ``torch_cudnn``: PyTorch's scaled_dot_product_attention, ``enable_gqa=True``;
* ``copy``: a device-to-device copy of the K and V bytes (CuPy), the bandwidth reference;
* variant ``CUDA graph`` of ``split_kv`` and ``torch_flash``: the same launches replayed from a
  CUDA graph, without the CPU's cost per launch (see :func:`graph_of`); variant ``whole call`` of
  ``split_kv``: ``cuda_split_kv_attention`` called as a user calls it (checks, plan, allocations).

TB/s counts the K and V bytes read once (B·H_kv·Nk·d·2 bytes·2); for ``copy`` it counts what a
copy moves, read plus write. At Nk = 131,072 (B = 1 and 8) other settings of the tensor-core
split kernel are timed too (VARIANTS): other tilings (keys per tile, stages of the ring: more
blocks per SM against more bytes in flight per block; ``benchmarks/decode_ptxas.py`` prints
each one's registers, blocks per SM and instructions per key) and 128 splits (several waves of
blocks instead of the rule's one).
Run time on an H200: about a minute (mostly compiling and the float64 references).
"""

from __future__ import annotations

import math

import numpy as np

from .harness import environment, time_call

H, H_KV, D, N_Q = 32, 8, 128, 1
BATCHES, CONTEXTS = (1, 8), (4_096, 32_768, 131_072)
PAGE = 16
# other settings of the tensor-core split kernel, timed at Nk = 131,072: keys per tile and ring stages, split count
VARIANTS = ({"keys": 16, "stages": 4}, {"keys": 16, "stages": 3}, {"keys": 32, "stages": 3}, {"keys": 64, "stages": 2},
            {"num_splits": 128})
SHORT = {"num_splits": "splits", "keys": "keys", "stages": "stages"}  # in the labels
FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "impl", "variant", "batch", "n_k", "heads",
          "kv_heads", "d", "num_splits", "time_ms", "time_min_ms", "time_max_ms", "reps", "kv_bytes", "tb_per_s",
          "vs_torch_flash", "vs_copy", "status", "max_rel_err", "tolerance"]


def inputs(batch: int, n_k: int, gen):
    """q (B, H, 1, d), k and v (B, H_kv, Nk, d), float16 on the GPU (CuPy)."""
    import cupy

    def normal(*shape):
        return gen.standard_normal(shape, dtype=np.float32).astype(np.float16)

    q, k, v = normal(batch, H, N_Q, D), normal(batch, H_KV, n_k, D), normal(batch, H_KV, n_k, D)
    cupy.cuda.Device().synchronize()
    return q, k, v


def reference(q, k, v):
    """For the first and last sequence: (b, float64 reference o, float16 naive o on repeated K/V)."""
    import cupy

    from ..core.tolerance import to_host64
    from ..forward.naive import reference_attention
    from .harness import naive_same_precision

    refs = []
    for b in sorted({0, q.shape[0] - 1}):
        ref = reference_attention(*(to_host64(x[b]) for x in (q, k, v)))[0]  # (H, 1, d) float64, GQA on the host
        group = H // H_KV
        naive = naive_same_precision(q[b], cupy.repeat(k[b], group, axis=0), cupy.repeat(v[b], group, axis=0))
        refs.append((b, ref, to_host64(naive)))
    return refs


def verdict(o, refs) -> dict:
    """The project's float16 rule on each checked sequence; the worst error, the smallest tolerance."""
    from ..core.tolerance import to_host64, within_tolerance

    ok, worst, tol = True, 0.0, math.inf
    for b, ref, naive in refs:
        v = within_tolerance(to_host64(o[b]), ref, np.float16, naive)
        ok, worst, tol = ok and v.ok, max(worst, v.error), min(tol, v.tolerance)
    return {"ok": ok, "max_rel_err": worst, "tolerance": tol}


def candidates(q, k, v, rng):
    """(impl, variant, num_splits, run, output) for everything timed on this input: run() launches,
    output() is the result to check (None: the copy, which is not attention)."""
    import cupy

    from ..decode.cuda import cuda_split_kv_attention, prepare_paged, prepare_split_kv
    from ..decode.paged import pages_from_contiguous

    found = []

    def ours(impl, variant, prepared):
        run, o, _, _ = prepared  # run() launches the split and the combine kernel into o
        found.append((impl, variant, run.plan["num_splits"], run, lambda: o.reshape(q.shape)))

    ours("split_kv", "", prepare_split_kv(q, k, v))
    graphed = graph_of(found[-1][3])
    if graphed is not None:
        found.append(("split_kv", "CUDA graph", found[-1][2], graphed, found[-1][4]))
    whole = {}  # cuda_split_kv_attention called as a user calls it: checks, allocations, packing, launches

    def whole_call():
        whole["o"] = cuda_split_kv_attention(q, k, v)[0]

    found.append(("split_kv", "whole call", found[0][2], whole_call, lambda: whole["o"]))
    ours("no_split", "", prepare_split_kv(q, k, v, num_splits=1))
    ours("split_kv", "CUDA cores", prepare_split_kv(q, k, v, tensor_cores=False))  # the kernel before the tensor cores
    if k.shape[2] == CONTEXTS[-1]:  # a fixed split count beside the rule's choice, and other tilings
        for variant in VARIANTS:
            label = " ".join(f"{SHORT[key]}={val}" for key, val in variant.items())
            ours("split_kv", label, prepare_split_kv(q, k, v, **tuning(variant)))
    perm = cupy.asarray(rng.permutation(q.shape[0] * (k.shape[2] // PAGE)), dtype=np.int32)  # pool page of each page
    ours("paged", f"page_size={PAGE}", prepare_paged(q, pages_from_contiguous(k, v, PAGE, perm)))
    found += torch_candidates(q, k, v)
    dst = cupy.empty_like(k), cupy.empty_like(v)

    def copy():
        cupy.copyto(dst[0], k)
        cupy.copyto(dst[1], v)

    found.append(("copy", "device-to-device, K and V", 0, copy, None))
    return found


def tuning(variant: dict) -> dict:
    """A VARIANTS entry as prepare_split_kv's arguments: keys and stages make a DecodeTiling."""
    from ..decode.tensor_cores import DecodeTiling

    args = {key: val for key, val in variant.items() if key not in ("keys", "stages")}
    if "keys" in variant:
        args["tiling"] = DecodeTiling(D=D, BC=variant["keys"], STAGES=variant["stages"])
    return args


def torch_candidates(q, k, v) -> list:
    """PyTorch SDPA, flash and cuDNN backends, grouped-query attention without repeating K/V."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return []
    tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))  # zero-copy views
    found = []
    for impl, backend in (("torch_flash", SDPBackend.FLASH_ATTENTION), ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)):
        result = {}

        def run(backend=backend, result=result):
            with sdpa_kernel(backend):
                result["o"] = F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)

        found.append((impl, "enable_gqa=True", 0, run, lambda result=result: result["o"]))
    try:  # the flash backend replayed from a CUDA graph, as a server would (no CPU launch cost)
        captured = {}  # the graph's own output, which each replay rewrites (not the plain call's)
        run = found[0][3]
        run(result=captured)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run(result=captured)
        found.append(("torch_flash", "CUDA graph", 0, graph.replay, lambda: captured["o"]))
    except Exception as exc:  # a backend that cannot run or be captured: reported, not timed
        print(f"torch_flash in a CUDA graph: not measured ({type(exc).__name__}: {exc})")
    return found


def graph_of(run):
    """``run``'s launches captured into a CUDA graph (CuPy stream capture, the driver launching on that
    stream); returns a function that replays it on the current stream, or None if capture fails.
    A graph replays every launch from the GPU's side: the CPU's cost per launch disappears, as in
    servers that capture their decode steps."""
    import cupy

    try:
        run()  # compile and load the kernels first: loading cannot be captured
        cupy.cuda.Device().synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                run(stream.ptr)  # the kernels, launched on the capturing stream
            finally:
                graph = stream.end_capture()
        return graph.launch
    except Exception as exc:
        print(f"split_kv in a CUDA graph: not measured ({type(exc).__name__}: {exc})")
        return None


def measure_one(impl, run, output, refs) -> dict:
    """Check (unless it is the copy), then time; a backend that refuses the inputs is 'unsupported'."""
    import cupy

    try:
        run()
        cupy.cuda.Device().synchronize()
        if output is not None:
            o = output()
            o = o if isinstance(o, cupy.ndarray) else cupy.from_dlpack(o)  # PyTorch's output: a zero-copy view
            ver = verdict(o, refs)
            if not ver.pop("ok"):
                return {**ver, "status": f"wrong (error {ver['max_rel_err']:.2e} > {ver['tolerance']:.2e})"}
        else:
            ver = {}
        return {**ver, **time_call(run), "status": "ok"}
    except Exception as exc:  # e.g. a PyTorch backend that has no kernel for these inputs
        if impl.startswith("torch") or "not supported" in str(exc).lower():
            print(f"{impl}: unsupported ({type(exc).__name__}: {str(exc)[:200]})")
            return {"status": "unsupported"}
        raise


def run(csv_path: str | None = None, seed: int | None = None, batches=BATCHES, contexts=None) -> list[dict]:
    """Measure every shape (``contexts``: the Nk to run, default CONTEXTS); print a table; write
    the rows to ``csv_path``."""
    import cupy

    from .harness import CsvWriter

    rng = np.random.default_rng(seed)
    env = environment()
    writer, rows = CsvWriter(csv_path, FIELDS), []
    print(f"{'impl':12} {'variant':26} {'B':>2} {'Nk':>7} {'splits':>6} {'µs':>9} {'TB/s':>6} {'×flash':>7} "
          f"{'/copy':>6}  status")
    for batch in batches:
        for n_k in contexts or CONTEXTS:
            gen = cupy.random.default_rng(int(rng.integers(2**31)))
            q, k, v = inputs(batch, n_k, gen)
            refs = reference(q, k, v)
            kv_bytes = 2 * batch * H_KV * n_k * D * 2  # K and V, float16
            found = candidates(q, k, v, rng)
            shape_rows = []
            for impl, variant, splits, fn, output in found:
                res = measure_one(impl, fn, output, refs)
                moved = 2 * kv_bytes if impl == "copy" else kv_bytes
                row = {**env, "impl": impl, "variant": variant, "batch": batch, "n_k": n_k, "heads": H,
                       "kv_heads": H_KV, "d": D, "num_splits": splits or "", "kv_bytes": kv_bytes, **res}
                if res["status"] == "ok":
                    row["tb_per_s"] = moved / (res["time_ms"] * 1e-3) / 1e12
                shape_rows.append(row)
            ratios(shape_rows)
            for row in shape_rows:
                writer.write(row)
                print_row(row)
            rows += shape_rows
            del q, k, v, found
            cupy.get_default_memory_pool().free_all_blocks()
    writer.close()
    return rows


def ratios(rows: list[dict]) -> None:
    """vs_torch_flash: SDPA flash's time / this one's (above 1: faster), launched the same way (both
    plain, or both from CUDA graphs); vs_copy: this one's K/V read rate / the copy's read + write rate."""
    ok = [r for r in rows if r["status"] == "ok"]
    flash = {r["variant"] == "CUDA graph": r for r in ok if r["impl"] == "torch_flash"}
    copy = next((r for r in ok if r["impl"] == "copy"), None)
    for r in ok:
        base = flash.get(r["variant"] == "CUDA graph")
        if base is not None:
            r["vs_torch_flash"] = base["time_ms"] / r["time_ms"]
        if copy is not None:
            r["vs_copy"] = r["tb_per_s"] / copy["tb_per_s"]


def print_row(r: dict) -> None:
    us = f"{r['time_ms'] * 1e3:9.1f}" if r["status"] == "ok" else f"{'–':>9}"
    tbs = f"{r['tb_per_s']:6.2f}" if "tb_per_s" in r else f"{'–':>6}"
    vs = f"{r['vs_torch_flash']:6.2f}×" if "vs_torch_flash" in r else f"{'–':>7}"
    cp = f"{r['vs_copy']:6.0%}" if "vs_copy" in r else f"{'–':>6}"
    print(f"{r['impl']:12} {r['variant']:26} {r['batch']:>2} {r['n_k']:>7} {r['num_splits']!s:>6} {us} {tbs} {vs} "
          f"{cp}  {r['status']}")


SUMMARY_IMPLS = (("split_kv", ""), ("no_split", ""), ("paged", f"page_size={PAGE}"), ("torch_flash", "enable_gqa=True"),
                 ("torch_cudnn", "enable_gqa=True"), ("copy", "device-to-device, K and V"))


def _row(rows: list[dict], impl: str, variant: str, b, n) -> dict | None:
    """The CSV row of ``impl`` (``variant``) at batch ``b`` and Nk ``n``, or None."""
    return next((r for r in rows if (r["impl"], r["variant"], r["batch"], r["n_k"]) == (impl, variant, b, n)), None)


def _shapes(rows: list[dict]) -> list[tuple]:
    """The (B, Nk) of a decode CSV, smallest first."""
    return sorted({(r["batch"], r["n_k"]) for r in rows}, key=lambda x: (int(x[0]), int(x[1])))


def summary_table(rows: list[dict]) -> str:
    """The README's table of a decode CSV: µs per call of each implementation per (B, Nk), the
    split count the rule chose, split-KV's K/V read rate, its ratios to SDPA flash (one call each;
    and both replayed from CUDA graphs, where no host time counts: the kernels alone) and to the
    copy, and the paged kernel's time over the contiguous one's."""
    def us(r):
        return f"{float(r['time_ms']) * 1e3:,.1f}" if r and r["status"] == "ok" else (r["status"] if r else "–")

    def over(a, b, fmt):  # a's time over b's, or – if either is missing or failed
        ok = a is not None and b is not None and a["status"] == b["status"] == "ok"
        return fmt.format(float(a["time_ms"]) / float(b["time_ms"])) if ok else "–"

    names = " | ".join(impl for impl, _ in SUMMARY_IMPLS)
    lines = [f"| B | Nk | splits | {names} | split_kv TB/s | split_kv / SDPA flash | the same, CUDA graphs | "
             "split_kv / copy | paged / split_kv |",
             "|---" * (len(SUMMARY_IMPLS) + 8) + "|"]
    for b, n in _shapes(rows):
        ours = _row(rows, "split_kv", "", b, n)
        cells = " | ".join(us(_row(rows, impl, var, b, n)) for impl, var in SUMMARY_IMPLS)
        ok = ours is not None and ours["status"] == "ok"
        ratio = f"{float(ours['vs_torch_flash']):.2f}×" if ok and ours.get("vs_torch_flash") else "–"
        graphs = over(_row(rows, "torch_flash", "CUDA graph", b, n), _row(rows, "split_kv", "CUDA graph", b, n),
                      "{:.2f}×")
        share = f"{float(ours['vs_copy']):.0%}" if ok and ours.get("vs_copy") else "–"
        tbs = f"{float(ours['tb_per_s']):.2f}" if ok else "–"
        paged = over(_row(rows, "paged", f"page_size={PAGE}", b, n), ours, "{:.2f}")
        lines.append(f"| {b} | {int(n):,} | {ours['num_splits'] if ours else '–'} | {cells} | {tbs} | {ratio} | "
                     f"{graphs} | {share} | {paged} |")
    return "\n".join(lines)


BAR_VS_FLASH, BAR_VS_COPY, BAR_PAGED = 0.9, 0.8, 1.1  # issue 13's bar: of SDPA flash's speed, of a copy's, paged time


def bar_sentence(rows: list[dict]) -> str:
    """Where a decode CSV stands against issue 13's bar (per call: at least 0.9× SDPA flash at every
    shape, 80% of the copy's rate at the largest, paged within 10% of contiguous), in the README's words."""
    def time(impl, variant, b, n):
        r = _row(rows, impl, variant, b, n)
        return float(r["time_ms"]) if r is not None and r["status"] == "ok" else float("nan")

    shapes = _shapes(rows)
    per_call = [time("torch_flash", "enable_gqa=True", b, n) / time("split_kv", "", b, n) for b, n in shapes]
    graphs = [time("torch_flash", "CUDA graph", b, n) / time("split_kv", "CUDA graph", b, n) for b, n in shapes]
    paged = [time("paged", f"page_size={PAGE}", b, n) / time("split_kv", "", b, n) for b, n in shapes]
    largest = shapes[-1]
    copy = float(_row(rows, "split_kv", "", *largest)["vs_copy"])  # its K/V read rate over the copy's
    met = min(per_call) >= BAR_VS_FLASH and copy >= BAR_VS_COPY and max(paged) <= BAR_PAGED  # NaN: not met
    return (f"per call, as timed above, split-KV is at {min(per_call):.2f}× or more of SDPA flash at every shape, "
            f"reads K and V at {copy:.0%} of the copy's rate at B = {largest[0]}, Nk = {int(largest[1]):,}, and "
            f"the paged kernel takes {min(paged):.2f}–{max(paged):.2f}× the contiguous one's time: "
            f"{'the bar is met' if met else 'the bar is not met'}. The kernels alone (CUDA graphs) run at "
            f"{min(graphs):.2f}–{max(graphs):.2f}× of SDPA flash's")
