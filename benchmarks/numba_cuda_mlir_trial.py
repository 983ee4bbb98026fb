"""numba-cuda-mlir beside numba-cuda: which of our kernels each compiles, in how long, and whether each runs.

    PYTHONPATH=<site>:src python benchmarks/numba_cuda_mlir_trial.py --csv OUT.csv [--compiler NAME]
                                                                    [--ptx-dir DIR] [--only TEXT]

``--compiler`` is ``numba-cuda`` or ``numba-cuda-mlir`` (default: numba-cuda-mlir where it can be imported); run
the script once per compiler, in separate processes. Each kernel of :data:`KERNELS` is compiled with the
compiler's ``compile_ptx`` at one setting (the first of ``ptxas_report``'s jobs for it whose variant starts with
the text given), timed; where a GPU is present it is then run once through its public entry point on small
float16 inputs and checked against the float64 reference (:func:`tinyflash.reference_attention`; the backward's
gradients against theirs) by the project's rule (``tinyflash.bench.checking``). A failure is recorded with its
first line, and the next kernel goes on; the whole traceback goes to stderr. One CSV row per (compiler,
kernel), written as it is done, after two rows that time importing the compiler and a first compile of a
three-line kernel (the compiler's own start-up).

``compile_s`` is the time from the Python function to a cubin: numba-cuda-mlir's ``compile_ptx`` links one with
nvJitLink (ptxas inside) before it returns PTX, so numba-cuda's PTX is assembled the same way here; ``ptx_s`` is
numba-cuda's time to PTX alone. ``ptx_instructions`` counts the PTX as ``ptxas_report`` does. Both compilers run
in one process each, the kernels in the order listed: a device function two kernels share is compiled for the first.

numba-cuda-mlir is imported as ``numba_cuda_mlir``, not ``numba``. To compile our kernels unchanged, the
script puts aliases in front of them (:func:`use_numba_cuda_mlir`); each is a step a move would take:

* ``numba``, ``numba.cuda``, ``numba.cuda.types``, ``numba.cuda.extending``, ``numba.core.extending``,
  ``numba.core.errors``, ``numba.cuda.cudadrv.driver`` become numba-cuda-mlir's modules of those names;
* numba-cuda-mlir has no simulator, and its config no ``ENABLE_CUDASIM``: it reads as 0 here;
* it takes numpy 2.5, where numba-cuda 0.30.4 needs ``np.row_stack``, which numpy 2.5 removed (and
  ``tinyflash.gpu`` checks for it): with numpy 2.5 the script gives numpy that alias of ``vstack`` back, for both
  compilers, so that one environment runs both;
* an ``@intrinsic`` made after the process's first compile is not typed until the registries are refreshed
  (numba-cuda refreshes them at every compile); our kernel factories make theirs late, so each is followed by
  ``refresh_registries()``;
* its ``fastmath`` is a bool: our set of flags (``warp_tile.FAST_MATH``) becomes True, libNVVM's fast options
  (ftz, fma, approximate division and square root), which the set turns on in numba-cuda too;
* it drops the ``a`` of ``cc=(9, 0, "a")`` and compiles for the device's ``sm_90`` where numba-cuda takes
  ``sm_90a``: a kernel is given ``chip="sm_90a"`` (wgmma and setmaxnreg exist only there);
* without a GPU it asks the driver for the host's compute capability even when ``compile_ptx`` is given one:
  it is told 9.0.

The inline PTX (``gpu/ptx.py``, ``wgmma.py``, ``tma.py``, ``loads.py``, ``inline_asm.py``: ``@intrinsic``
functions that build llvmlite ``InlineAsm``) is left as it is; the rows show where it stops a kernel.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import sys
import time
import traceback
import types as pytypes
from pathlib import Path

import numpy as np

import ptxas_kernels as pk  # beside this script: every kernel, as ptxas_report.py compiles it
import ptxas_report as pr  # its PTX counted and named as that script does

FIELDS = ["date", "device", "commit", "compiler", "version", "kernel", "variant", "compile", "compile_s", "ptx_s", "ptx_instructions",
          "launch", "error", "tolerance", "message"]
CC = {"sm_90": (9, 0), "sm_90a": (9, 0, "a")}  # the compute capability compile_ptx is given, by a job's arch


def use_numba_cuda_mlir() -> None:
    """Make ``import numba`` and the submodules our kernels import give numba-cuda-mlir's (module docstring)."""
    import numba_cuda_mlir.extending as extending
    import numba_cuda_mlir.numba_cuda as vendored
    from numba_cuda_mlir import cuda, tools
    from numba_cuda_mlir.numba_cuda.core import config, errors
    from numba_cuda_mlir.numba_cuda.cudadrv import driver

    class Config(pytypes.ModuleType):  # numba-cuda-mlir's config, and the simulator off
        ENABLE_CUDASIM = 0

        def __getattr__(self, name):
            return getattr(config, name)

    jit = cuda.jit

    def jit_as_numba_cuda(func_or_sig=None, **options):
        if isinstance(options.get("fastmath"), (set, frozenset)):  # {'afn', ...} -> True
            options["fastmath"] = bool(options["fastmath"])
        if options.get("cc"):  # (9, 0, 'a') -> 'sm_90a', which numba-cuda-mlir's own mapping makes 'sm_90'
            options["chip"] = "sm_" + "".join(map(str, options.pop("cc")))
        elif not options.get("device") and "chip" not in options and tools.get_gpu_compute_capability(tuple) == (9, 0):
            options["chip"] = "sm_90a"  # what numba-cuda compiles a kernel for on a 9.0 device
        return jit(func_or_sig, **options)

    def intrinsic(func):
        made = extending.intrinsic(func)
        extending.refresh_registries()  # typed from the next compile on
        return made

    cuda.jit = jit_as_numba_cuda
    if not cuda.is_available():
        tools._cached_cc = CC["sm_90"]  # the host's compute capability, which it would ask the driver
    numba = pytypes.ModuleType("numba")
    numba.__dict__.update({k: v for k, v in vars(vendored.types).items() if not k.startswith("_")})  # float32, ...
    numba.cuda, numba.types, numba.config = cuda, vendored.types, Config("numba.config")
    ext = pytypes.ModuleType("numba.cuda.extending")
    ext.intrinsic = intrinsic
    core = pytypes.ModuleType("numba.core")
    core.extending, core.errors = ext, errors
    sys.modules.update({"numba": numba, "numba.cuda": cuda, "numba.cuda.types": vendored.types,
                        "numba.cuda.extending": ext, "numba.core": core, "numba.core.extending": ext,
                        "numba.core.errors": errors, "numba.cuda.cudadrv": cuda.cudadrv,
                        "numba.cuda.cudadrv.driver": driver})


# --- the kernels: how each is compiled (a ptxas_report job) and run (its entry point) --------------------------

def forward(q, k, v, version):
    """(o, lse) of ``version`` through its entry point: cuda_attention, tensor_core_attention, hopper_attention."""
    import tinyflash as tf
    from tinyflash.forward.kernels import VERSIONS

    if VERSIONS[version].stage == 4:
        return tf.hopper_attention(q, k, v, causal=True, kernel=version)
    if version == "v6":
        return tf.tensor_core_attention(q, k, v, causal=True)
    return tf.cuda_attention(q, k, v, causal=True, kernel=version)


def run_forward(version):
    def run(rng):
        from tinyflash.bench.checking import check_output

        q = rng.standard_normal((1, 2, 100, 64)).astype(np.float16)  # (B, H, Nq, d)
        k, v = (rng.standard_normal((1, 2, 130, 64)).astype(np.float16) for _ in range(2))  # (B, H, Nk, d)
        o, lse = forward(q, k, v, version)
        return check_output(o, q, k, v, causal=True, rng=rng, lse=lse)

    return run


def run_backward(version):
    def run(rng):
        import tinyflash as tf
        from tinyflash.bench.checking import check_gradients

        q, k, v, do = (rng.standard_normal((1, 2, 100, 64)).astype(np.float16) for _ in range(4))  # (B, H, N, d)
        o, lse = tf.naive_attention(q, k, v, causal=True)
        grads = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel=version)
        return check_gradients(grads, q, k, v, do, causal=True)

    return run


def run_decode(kernel, num_splits=None):
    """A decode step through ``prepare_split_kv`` with the split kernel ``kernel``; the combine kernel merges
    the splits."""
    def run(rng):
        from tinyflash.bench.checking import check_output
        from tinyflash.decode.cuda import prepare_split_kv
        from tinyflash.gpu.arrays import result

        q = rng.standard_normal((1, 4, 1, 128)).astype(np.float16)  # (B, H, Nq, d)
        k, v = (rng.standard_normal((1, 2, 300, 128)).astype(np.float16) for _ in range(2))  # (B, H_kv, Nk, d)
        launch, o, lse, prob = prepare_split_kv(q, k, v, num_splits=num_splits, kernel=kernel)
        launch()
        o, lse = result(o, prob.out_shape, True), result(lse, prob.lse_shape, True)
        return check_output(o, q, k, v, causal=False, rng=rng, lse=lse)

    return run


# (kernel as ptxas_report names it, its jobs, the start of the variant compiled, its run on a GPU);
# the combine kernel runs after the CUDA-core split kernel, so that its row does not depend on inline PTX
KERNELS = [
    ("forward v1", pk.stage2_jobs, "d=64 float16", run_forward("v1")),
    ("forward v5", pk.stage2_jobs, "d=64 float16", run_forward("v5")),
    ("forward v6", pk.v6_jobs, "d=64 float16", run_forward("v6")),
    ("forward v7", pk.hopper_jobs, "d=64 float16", run_forward("v7")),
    ("forward v8", pk.hopper_jobs, "d=64 float16", run_forward("v8")),
    ("forward v10", pk.hopper_jobs, "d=64 float16", run_forward("v10")),
    ("backward v2", pk.backward_tensor_core_jobs, "d=64 float16", run_backward("v2")),
    ("backward v4", pk.backward_hopper_jobs, "d=64 float16", run_backward("v4")),
    ("decode split, tensor cores", pk.decode_jobs, "d=128 float16", run_decode("tensor_cores")),
    ("decode combine", pk.decode_jobs, "float16", run_decode("cuda_cores", num_splits=3)),
]


# --- compiling, running, recording ------------------------------------------------------------------------------

def first_line(exc: BaseException) -> str:
    """The exception's type and first line (numba's "Failed in ... pipeline" and the line after it); the whole
    traceback to stderr."""
    traceback.print_exc(file=sys.stderr)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [""]
    said = " / ".join(lines[:2]) if lines[0].startswith("Failed in") else lines[0]  # numba's: the pass, the error
    return f"{type(exc).__name__}: {said}"[:300]


def assemble(ptx: str, arch: str) -> None:
    """PTX to a cubin by nvJitLink (ptxas inside), as numba-cuda-mlir's ``compile_ptx`` does before it returns."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(1, [f"-arch={arch}"])
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(handle)
    finally:
        nvjitlink.destroy(handle)


def compile_kernel(jobs, kernel: str, variant: str, assembles: bool, ptx_dir: str | None, prefix: str) -> dict:
    """Compile the first job of ``jobs()`` named ``kernel`` whose variant starts with ``variant``, timed: to PTX
    (``ptx_s``) and on to a cubin (``compile_s``; ``assembles``: by :func:`assemble`, else the compiler does)."""
    from numba import cuda

    row = {"kernel": kernel, "variant": variant}
    start = time.perf_counter()
    try:
        job = next(j for j in jobs() if j.kernel == kernel and j.variant.startswith(variant))
        row["variant"] = f"{job.variant} {job.arch}"
        start = time.perf_counter()
        dispatcher, signature = job.build()
        options = dispatcher.targetoptions
        ptx, _ = cuda.compile_ptx(dispatcher.py_func, tuple(signature), cc=CC[job.arch],
                                  fastmath=options.get("fastmath") or False,
                                  launch_bounds=options.get("launch_bounds"))
        if assembles:
            row["ptx_s"] = f"{time.perf_counter() - start:.2f}"
            assemble(ptx, job.arch)
    except Exception as exc:  # recorded; the next kernel is compiled all the same
        return {**row, "compile": "failed", "compile_s": f"{time.perf_counter() - start:.2f}",
                "message": first_line(exc)}
    if ptx_dir:
        Path(ptx_dir, prefix + pr.file_name(job)).write_text(pr.stable_names(ptx))
    return {**row, "compile": "ok", "compile_s": f"{time.perf_counter() - start:.2f}",
            "ptx_instructions": pr.ptx_instructions(ptx)}


def launch_kernel(run) -> dict:
    """Run once on the GPU and check: 'ok', 'wrong' (outside the tolerance) or 'failed' (an exception)."""
    try:
        verdict = run(np.random.default_rng(0))
    except Exception as exc:
        return {"launch": "failed", "message": first_line(exc)}
    return {"launch": "ok" if verdict.ok else "wrong", "error": f"{verdict.error:.3e}",
            "tolerance": f"{verdict.tolerance:.3e}"}


def warm_up() -> dict:
    """The first compile of a process: a three-line kernel, timed (the compiler's start-up)."""
    from numba import cuda, float32

    def add(a, b, c):
        i = cuda.grid(1)
        if i < c.shape[0]:
            c[i] = a[i] + b[i]

    row, start = {"kernel": "warm-up", "variant": "c[i] = a[i] + b[i]", "compile": "ok"}, time.perf_counter()
    try:
        cuda.compile_ptx(add, (float32[::1],) * 3, cc=CC["sm_90"])
    except Exception as exc:
        row.update(compile="failed", message=first_line(exc))
    return {**row, "compile_s": f"{time.perf_counter() - start:.2f}"}


def import_compiler(name: str) -> str:
    """Import ``name`` (with numba-cuda-mlir, behind its aliases) and find the GPU; its version."""
    if not hasattr(np, "row_stack"):  # numpy 2.5 has vstack alone: numba-cuda 0.30.4 and tinyflash.gpu ask for both
        np.row_stack = np.vstack
    if name == "numba-cuda-mlir":
        use_numba_cuda_mlir()
        from numba_cuda_mlir import __version__ as version
    else:
        from numba_cuda import __version__ as version
    from numba import cuda

    cuda.is_available()
    return version


def device_name(cuda) -> str:
    """The GPU's name as the compiler's runtime reports it (bytes in numba-cuda)."""
    try:
        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception as exc:  # another runtime's device object: the row says so
        return f"unknown GPU ({type(exc).__name__})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = "numba-cuda-mlir" if importlib.util.find_spec("numba_cuda_mlir") else "numba-cuda"
    ap.add_argument("--csv", required=True, help="write the rows here")
    ap.add_argument("--compiler", choices=("numba-cuda", "numba-cuda-mlir"), default=default,
                    help="default: %(default)s (numba-cuda-mlir where it can be imported)")
    ap.add_argument("--ptx-dir", help="keep each kernel's PTX here, named <compiler>__<kernel>__<variant>.ptx")
    ap.add_argument("--only", help="only the kernels whose name contains this text")
    args = ap.parse_args(argv)

    start = time.perf_counter()
    common = {"date": datetime.date.today().isoformat(), "compiler": args.compiler,
              "version": import_compiler(args.compiler)}
    first = {"kernel": "import", "variant": "the compiler, and the GPU found", "compile": "ok",
             "compile_s": f"{time.perf_counter() - start:.2f}"}
    from numba import cuda

    on_gpu = cuda.is_available()
    from tinyflash.bench.record import git_commit  # imports no compiler

    common.update(device=device_name(cuda) if on_gpu else "no GPU", commit=git_commit())
    if args.ptx_dir:
        Path(args.ptx_dir).mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=FIELDS)
        out.writeheader()

        def record(row):
            out.writerow({**common, **row})
            f.flush()
            print(" | ".join(str(row.get(k, "")) for k in FIELDS[5:] if row.get(k, "") != ""), flush=True)

        record(first)
        record(warm_up())
        for kernel, jobs, variant, run in KERNELS:
            if args.only and args.only not in kernel:
                continue
            compiled = compile_kernel(jobs, kernel, variant, args.compiler == "numba-cuda", args.ptx_dir,
                                      f"{args.compiler}__")
            launched = launch_kernel(run) if on_gpu else {"launch": "no GPU"}
            said = [f"{step}: {r['message']}" for step, r in (("compile", compiled), ("launch", launched))
                    if "message" in r]
            record({**compiled, **launched, "message": " / ".join(said)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
