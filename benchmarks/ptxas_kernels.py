"""The kernels that ``benchmarks/ptxas_report.py`` compiles, each at the settings a GPU run uses by default, every
one reached through its registry (``VERSIONS[name]``: its build and its tiling on a GPU).

* forward v1 to v5 (stage 2) at their tilings on a GPU, d = 64 and 128, float16 and float32;
* forward v7 on (the registry's stage-4 versions) at their tilings on a GPU, d = 64, 128 and 256, float16 and
  bfloat16, for ``sm_90a`` (wgmma and setmaxnreg exist only there); ptxas's warnings and wgmma notes (C7508
  setmaxnreg ignored, C7510, C7515, C7519, C7520) are printed under the kernel's line;
* forward v6 (``v6_tensor_cores``) at ``tensor_core_tiling.default_tiling(d, causal, n)`` for d in
  TENSOR_CORE_DIMS (32, 64, 96, 128, 256, and 40 and 200: padded to 64 and 224), causal or not, n in (4096,
  16384), float16 and bfloat16; each tiling in the block order that runs it
  (not causal: one head at a time; causal: heads ordered in groups, and one head at a time, which runs
  where a group holds one head), each distinct kernel once;
* forward v6's flex_fwd (``tinyflash.flex_attention``) at the tiling of FlexAttention's default block mask, d = 64
  and 128, float16, with ``tinyflash.core.variants``' closures compiled in (a softcap, ALiBi, a relative bias and
  documents read from captured tables, a sliding window; with and without a block mask); v10's flex_fwd (what
  flex_attention runs on Hopper) the same, for ``sm_90a``;
* the decode split kernels of ``tinyflash.decode.kernels.VERSIONS`` at their defaults (their ``build``): on the tensor cores
  d in TENSOR_CORE_DIMS (float16), a contiguous cache and pages of 16 tokens; on the CUDA cores d = 128, float16
  and float32, with the rows per block of the decode benchmark (32 query heads on 8 K/V heads, one query);
* the tensor-core split kernel that merges its row sets (``merge=True``), d = 64, 128 and 256, float16;
* the decode combine kernel as Hopper launches it (waiting for the split kernel inside: ``after_split``), float16
  and float32 output;
* backward v1 (``v1_atomic_dq``) at its default tilings, d = 64 and 128, float16 and float32;
* backward v2 (``v2_tensor_cores``) at its default tilings, d in BACKWARD_DIMS (64, 96, 128, 192, 256, and 200:
  padded to 224), float16 and bfloat16, for sm_90 (dQ's paired atomics) and for ``sm_80`` (an A100: two atomics);
* backward v2's flex_bwd_tc (``tinyflash.flex_attention_backward``) at its default tilings, d = 64 and 128,
  float16, with the same closures compiled in as forward v6's flex_fwd;
* backward v3 (``v3_wgmma``) and v4 (``v4_warp_specialized``) at their default tilings, d = 64 and 128, float16
  and bfloat16, for ``sm_90a``; v4 also with dQ added by TMA (``DQ_BY_TMA``).

With ``--sweep``, also v6 at each candidate tiling of ``tinyflash.bench.suites.V6_TILINGS`` (the H200 sweeps'),
float16, one head at a time: the registers and spills of every tiling a sweep times.

"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Callable

import numpy as np

ARCH = "sm_90"
TENSOR_CORE_DIMS = (32, 40, 64, 96, 128, 200, 256)  # the head dims of the tensor-core forward and decode kernels compiled
BACKWARD_DIMS = (64, 96, 128, 192, 200, 256)  # those of backward v2 (mma.sync)


@dataclass(frozen=True)
class Job:
    """One kernel to compile: its name, its setting in words, and ``build() -> (dispatcher, signature)``."""

    kernel: str
    variant: str
    build: Callable
    arch: str = ARCH  # sm_90a for the wgmma kernels (architecture-specific instructions)


# --- the kernels ----------------------------------------------------------------------------------------

# the argument type of each parameter name of v5's and backward v1's kernels: 'element' is an array of the
# inputs' type (float16 or float32), 'floats' an array of float32 (LSE, the backward's row sums and dQ
# accumulator), then the scalars as the host wrappers pass them
PARAMETER_TYPES = {"element": ("Q", "K", "V", "O", "dO", "dK", "dV"), "floats": ("LSE", "Dvec", "dQ_acc"),
                   "int64": ("n_q", "n_k", "d", "d_v", "kv_group"), "float32": ("scale", "scale_log2"),
                   "boolean": ("causal",)}


def signature_by_name(kernel, dtype: str) -> tuple:
    """The argument types of ``kernel`` for inputs of ``dtype``, parameter by parameter (PARAMETER_TYPES)."""
    from numba.cuda import types

    from tinyflash.gpu.launch import parameters

    kinds = {name: kind for kind, names in PARAMETER_TYPES.items() for name in names}
    of_kind = {"element": types.Array(getattr(types, dtype), 1, "C"), "floats": types.Array(types.float32, 1, "C"),
               "int64": types.int64, "float32": types.float32, "boolean": types.boolean}
    unknown = [name for name in parameters(kernel) if name not in kinds]
    if unknown:
        raise KeyError(f"{kernel.py_func.__name__}: no type for the parameters {unknown}; add them to PARAMETER_TYPES")
    return tuple(of_kind[kinds[name]] for name in parameters(kernel))


def stage2_jobs() -> list[Job]:
    """Forward v1 to v5 at their tilings on a GPU, d = 64 and 128, float16 and float32."""
    from tinyflash.forward.kernels import VERSIONS

    found = []
    for name in [n for n, v in VERSIONS.items() if v.stage == 2]:
        version = VERSIONS[name]
        for d in (64, 128):
            cfg = version.tilings[0](d, d)
            for dtype in ("float16", "float32"):
                tiling = f"BR={cfg.BR} BC={cfg.BC}" + (f" TM={cfg.TM} NT={cfg.NT}" if hasattr(cfg, "TM") else "")
                vector = f" vector={version.code.vector_width(dtype)}" if "vector" in version.options else ""
                found.append(Job(f"forward {name}", f"d={d} {dtype} {tiling}{vector}", lambda v=version, c=cfg, t=dtype:
                                 (lambda k: (k, signature_by_name(k, t)))(v.build(c, t))))
    return found


def v6_jobs() -> list[Job]:
    """v6 at its default tilings: each (tiling, element, block order) that a default call at these sizes runs."""
    from tinyflash.forward.kernels import VERSIONS

    kernels = []  # (cfg, grouped), each once, in the order of the points
    for d in TENSOR_CORE_DIMS:
        for causal in (False, True):
            for n in (4096, 16384):
                cfg = VERSIONS["v6"].tilings[0](d, causal, n)
                for grouped in ((False, True) if causal else (False,)):
                    if (cfg, grouped) not in kernels:
                        kernels.append((cfg, grouped))
    return [v6_job(cfg, element, grouped) for element in ("float16", "bfloat16") for cfg, grouped in kernels]


def v6_job(cfg, element: str, grouped: bool, kernel: str = "forward v6") -> Job:
    """v6 at the tiling ``cfg`` for ``element`` inputs, its blocks in groups of heads or one head at a time."""
    from tinyflash.forward.kernels import VERSIONS

    v6 = VERSIONS["v6"]
    variant = (f"d={cfg.D} {element} warps={cfg.WARPS} row_tiles={cfg.ROW_TILES} BC={cfg.BC} "
               f"q_in_smem={cfg.Q_IN_SMEM} lazy={cfg.LAZY_RESCALE} "
               f"{'heads in groups' if grouped else 'one head at a time'}")
    return Job(kernel, variant, lambda: (v6.build(cfg, element, 2 if grouped else 1), v6.signature))


def flex_mods() -> dict:
    """FlexAttention's functions that flex_jobs compile into v6, from ``tinyflash.core.variants`` as they stand: name
    -> (score_mod, mask_mod, block mask or not). The document mask and the relative bias read captured NumPy arrays
    (8 documents of 2,048 tokens; a table of 32 heads × 257 relative positions)."""
    from tinyflash.core import variants

    documents = variants.document_mask(np.repeat(np.arange(8, dtype=np.int8), 2048))  # 2 copies of 16 KiB (q, kv)
    bias = variants.relative_bias(np.linspace(-1.0, 1.0, 32 * 257, dtype=np.float32).reshape(32, 257))  # 32 KiB
    return {"softcap": (variants.softcap(30.0), None, False), "alibi": (variants.alibi(32), None, False),
            "relative bias (a captured table)": (bias, None, False),
            "sliding window, block mask": (None, variants.sliding_window(1024), True),
            "documents (a captured table), block mask": (None, documents, True),
            "softcap + sliding window, block mask": (variants.softcap(30.0), variants.sliding_window(1024), True),
            "block mask alone": (None, None, True)}


def flex_jobs() -> list[Job]:
    """v6's flex_fwd (``tinyflash.flex_attention``) at the tiling it runs for FlexAttention's default block mask
    (128 × 128) at N = 16,384, causal, d = 64 and 128, float16, with each of :func:`flex_mods` compiled in; then
    v10's (:func:`flex_v10_jobs`)."""
    from tinyflash.forward.kernels import VERSIONS
    from tinyflash.gpu.user_code import UserFunction

    v6, found = VERSIONS["v6"], []
    for d in (64, 128):
        cfg = v6.tilings[0](d, True, 16384).for_block_mask(128, 128)
        found.append(Job("forward v6 flex", f"d={d} float16 warps={cfg.WARPS} row_tiles={cfg.ROW_TILES} BC={cfg.BC} "
                         "no functions (flash_fwd)", lambda c=cfg: (v6.build(c, "float16", 2), v6.signature)))
        for name, (score, mask, sparse) in flex_mods().items():
            mods = {"score_mod": score and UserFunction.of(score, "score_mod"),
                    "mask_mod": mask and UserFunction.of(mask, "mask_mod"), "block_sparse": sparse}
            variant = f"d={d} float16 warps={cfg.WARPS} row_tiles={cfg.ROW_TILES} BC={cfg.BC} {name}"
            found.append(Job("forward v6 flex", variant, lambda c=cfg, m=mods: (v6.build(c, "float16", 2, **m),
                                                                                v6.code.FLEX_SIGNATURE)))
    return found + flex_v10_jobs()


def flex_v10_jobs() -> list[Job]:
    """v10's flex_fwd (``tinyflash.flex_attention`` on Hopper) at its tiling for FlexAttention's default block mask
    at N = 16,384, causal, d = 64 and 128, float16, with each of :func:`flex_mods` compiled in, for sm_90a."""
    from tinyflash.forward.kernels import VERSIONS
    from tinyflash.gpu.user_code import UserFunction

    v10, found = VERSIONS["v10"], []
    for d in (64, 128):
        cfg = v10.tilings[0](d, True, 16384).for_block_mask(128, 128)
        setting = f"d={d} float16 warpgroups={cfg.WARPGROUPS} BC={cfg.BC} stages={cfg.STAGES}"
        found.append(Job("forward v10 flex", f"{setting} no functions (flash_fwd)", lambda c=cfg: (
            v10.build(c, "float16"), v10.signature), arch="sm_90a"))
        for name, (score, mask, sparse) in flex_mods().items():
            mods = {"score_mod": score and UserFunction.of(score, "score_mod"),
                    "mask_mod": mask and UserFunction.of(mask, "mask_mod"), "block_sparse": sparse}
            found.append(Job("forward v10 flex", f"{setting} {name}", lambda c=cfg, m=mods: (
                v10.build(c, "float16", 1, **m), v10.code.FLEX_SIGNATURE), arch="sm_90a"))
    return found


def flex_backward_jobs() -> list[Job]:
    """Backward v2's flex_bwd_tc (``tinyflash.flex_attention_backward``) at its default tilings (FlexAttention's
    128 × 128 block mask fits them), d = 64 and 128, float16, with each of :func:`flex_mods` compiled in (score_mod
    with its derivative, ``tinyflash.core.dual_source``)."""
    from tinyflash.backward.kernels import VERSIONS
    from tinyflash.gpu.user_code import UserFunction

    v2, found = VERSIONS["v2"], []
    for d in (64, 128):
        cfg = v2.tilings[0](d)
        for name, (score, mask, sparse) in flex_mods().items():
            mods = {"score_mod": score and UserFunction.of(score, "score_mod"),
                    "mask_mod": mask and UserFunction.of(mask, "mask_mod"), "block_sparse": sparse}
            variant = f"d={d} float16 warps={cfg.WARPS} keys={cfg.BC} BR={cfg.BR} {name}"
            found.append(Job("backward v2 flex", variant, lambda c=cfg, m=mods: (
                v2.build(c, "float16", pair_atomics=True, **m), v2.code.FLEX_SIGNATURE)))
    return found


def v6_sweep_jobs() -> list[Job]:
    """v6 at every candidate tiling of the H200 sweeps (``bench.suites.V6_TILINGS``), float16, one head at a time."""
    from tinyflash.bench.suites import V6_TILINGS
    from tinyflash.forward.kernels.tensor_core_tiling import TensorCoreTiling  # a tiling module, not a version

    return [v6_job(TensorCoreTiling(D=d, WARPS=w, BC=bc, ROW_TILES=rt, Q_IN_SMEM=q, LAZY_RESCALE=lazy), "float16",
                   False, "forward v6, sweep") for d, tilings in V6_TILINGS.items() for w, bc, rt, q, lazy in tilings]


Problem = namedtuple("Problem", "d d_v dtype")  # what a decode kernel's split_kernel reads of a checked problem


def decode_jobs() -> list[Job]:
    """The split kernels as ``VERSIONS[name].build(problem, page_size)`` makes them, and the combine kernel."""
    import numpy as np

    from tinyflash.bench.suites import DECODE
    from tinyflash.decode.kernels import VERSIONS, combine

    tensor_cores, cuda_cores = VERSIONS["tensor_cores"].code, VERSIONS["cuda_cores"].code  # their files' defaults

    rows = DECODE.fixed["heads"] // DECODE.fixed["kv_heads"] * DECODE.fixed["n_q"]  # packed rows per K/V head

    def split(name, d, dtype, page_size, **options):
        chosen = VERSIONS[name].build(Problem(d, d, np.dtype(dtype)), page_size, **options)
        kernel, _ = chosen.build(min(chosen.max_rows, rows))
        return kernel, chosen.signature

    found = []
    for d in TENSOR_CORE_DIMS:
        cfg = tensor_cores.default_tiling(d)
        for page_size in (0, 16):
            variant = (f"d={d} float16 BC={cfg.BC} STAGES={cfg.STAGES} "
                       f"{f'pages of {page_size} tokens' if page_size else 'contiguous cache'}")
            found.append(Job("decode split, tensor cores", variant,
                             lambda d=d, page_size=page_size: split("tensor_cores", d, "float16", page_size)))
    for d in (64, 128, 256):  # the split kernel that merges its row sets (merge=True), contiguous cache
        cfg = tensor_cores.default_tiling(d)
        found.append(Job("decode split, tensor cores, merging", f"d={d} float16 BC={cfg.BC} STAGES={cfg.STAGES} "
                         f"rows={min(tensor_cores.ROWS, rows)} contiguous cache",
                         lambda d=d: split("tensor_cores", d, "float16", 0, merge=True)))
    for dtype in ("float16", "float32"):
        variant = (f"d=128 {dtype} threads={cuda_cores.GPU_THREADS} unroll={cuda_cores.UNROLL} "
                   f"rows={min(cuda_cores.MAX_ROWS, rows)} contiguous cache")
        found.append(Job("decode split, CUDA cores", variant, lambda dtype=dtype: split("cuda_cores", 128, dtype, 0)))
    for dtype in ("float16", "float32"):
        found.append(Job("decode combine", f"{dtype} output", lambda dtype=dtype: (
            combine.make_combine_kernel("", True), combine.combine_signature(np.dtype(dtype)))))
    return found


def backward_jobs() -> list[Job]:
    """Backward v1 at its tilings on a GPU, d = 64 and 128, float16 and float32."""
    from tinyflash.backward.kernels import VERSIONS

    v1, found = VERSIONS["v1"], []
    for d in (64, 128):
        c = v1.tilings[0](d, d)
        for dtype in ("float16", "float32"):
            found.append(Job("backward v1", f"d={d} {dtype} BR={c.BR} BC={c.BC} NT={c.NT} TM={c.TM} TK={c.TK} "
                             f"vector={v1.code.vector_width(dtype)}", lambda c=c, t=dtype:
                             (lambda k: (k, signature_by_name(k, t)))(v1.build(c, t))))
    return found


def backward_tensor_core_jobs() -> list[Job]:
    """Backward v2 (tensor cores) at its default tilings, d in BACKWARD_DIMS, float16 and bfloat16: for sm_90 with
    dQ's paired atomics, and for sm_80 (an A100) with two atomics, as each runs."""
    from tinyflash.backward.kernels import VERSIONS

    v2, found = VERSIONS["v2"], []
    for arch, pairs in ((ARCH, True), ("sm_80", False)):
        for element in ("float16", "bfloat16"):
            for d in BACKWARD_DIMS:
                cfg = v2.tilings[0](d)
                variant = (f"d={d} {element} warps={cfg.WARPS} keys={cfg.BC} BR={cfg.BR}"
                           + (f" dkv_groups={cfg.DKV_COLUMN_GROUPS}" if cfg.DKV_COLUMN_GROUPS > 1 else "")
                           + ("" if arch == ARCH else f" {arch}"))
                found.append(Job("backward v2", variant, lambda cfg=cfg, element=element, pairs=pairs:
                                 (v2.build(cfg, element, pair_atomics=pairs), v2.signature), arch))
    return found


def backward_hopper_jobs() -> list[Job]:
    """Backward v3 (wgmma) and v4 (warp-specialised; also with DQ_BY_TMA) at their default tilings, d = 64 and
    128, float16 and bfloat16, for sm_90a."""
    from dataclasses import replace

    from tinyflash.backward.kernels import VERSIONS

    found = []
    v3, v4 = VERSIONS["v3"], VERSIONS["v4"]
    tilings = [("v3", v3, v3.tilings[0]), ("v4", v4, v4.tilings[0]),
               ("v4", v4, lambda d: replace(v4.tilings[0](d), DQ_BY_TMA=True))]
    for name, version, tiling in tilings:
        for element in ("float16", "bfloat16"):
            for d in version.head_dims:
                cfg = tiling(d)
                variant = (f"d={d} {element} warpgroups={cfg.WARPGROUPS} keys={cfg.BC} BR={cfg.BR}"
                           + (f" stages={cfg.STAGES} dq_by_tma={cfg.DQ_BY_TMA}" if name == "v4" else ""))
                found.append(Job(f"backward {name}", variant, lambda version=version, cfg=cfg, element=element:
                                 (version.build(cfg, element), version.signature), arch="sm_90a"))
    return found


def hopper_jobs() -> list[Job]:
    """The wgmma kernels (v7 on) at their default tilings, each d they take, float16 and bfloat16, for sm_90a."""
    from tinyflash.forward.kernels import VERSIONS

    found = []
    for name in [n for n, v in VERSIONS.items() if v.stage == 4 and "float16" in v.dtypes]:  # v11 (e4m3): its own
        version = VERSIONS[name]
        for element in ("float16", "bfloat16"):
            for d in version.head_dims:
                cfg = version.tilings[0](d)  # the tiling hopper_attention and the hopper benchmark run it at
                variant = (f"d={d} {element} warpgroups={cfg.WARPGROUPS} BC={cfg.BC} lazy={cfg.LAZY_RESCALE}"
                           + (f" stages={cfg.STAGES} producer={cfg.PRODUCER}" if name != "v7" else ""))
                found.append(Job(f"forward {name}", variant, lambda version=version, cfg=cfg, element=element:
                                 (version.build(cfg, element), version.signature), arch="sm_90a"))
    return found


def fp8_jobs() -> list[Job]:
    """Forward v11 (e4m3) at its tilings on a GPU, d = 128 and 256, for sm_90a; and its Vᵀ pass."""
    from numba.cuda import types

    from tinyflash.forward.kernels import VERSIONS
    from tinyflash.forward.kernels.fp8_tiling import transpose_v

    v11, found = VERSIONS["v11"], []
    for d in v11.head_dims:
        cfg = v11.tilings[0](d)
        found.append(Job("forward v11", f"d={d} e4m3 warpgroups={cfg.WARPGROUPS} BC={cfg.BC} stages={cfg.STAGES}",
                         lambda cfg=cfg: (v11.build(cfg, "e4m3"), v11.signature), arch="sm_90a"))
        u8 = types.Array(types.uint8, 1, "C")
        found.append(Job("forward v11 Vᵀ pass", f"d={d}", lambda d=d: (transpose_v(d), (u8, u8, types.int64,
                                                                                         types.int64))))
    return found


def jobs(sweep: bool = False) -> list[Job]:
    return (stage2_jobs() + v6_jobs() + flex_jobs() + hopper_jobs() + fp8_jobs() + decode_jobs() + backward_jobs() + backward_tensor_core_jobs()
            + flex_backward_jobs() + backward_hopper_jobs() + (v6_sweep_jobs() if sweep else []))


def main(argv=None) -> int:
    """Print the kernels and settings that ptxas_report.py compiles, one line each (nothing is compiled)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__, epilog="Run with PYTHONPATH=src from the repository root.")
    ap.add_argument("--sweep", action="store_true", help="also v6 at each candidate tiling of the H200 sweeps")
    ap.add_argument("--only", help="only the kernels whose kernel name or variant contains this text")
    args = ap.parse_args(argv)
    for job in jobs(args.sweep):
        if not args.only or args.only in job.kernel or args.only in job.variant:
            print(f"{job.kernel:36} {job.variant}  ({job.arch})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
