"""Every kernel of this checkout compiled for the H200 (sm_90) without a GPU: registers, spills, stack
frame and instruction counts, one CSV row per kernel.

    PYTHONPATH=src python benchmarks/ptxas_report.py [--csv figures/data/ptxas_sm90.csv] [--ptx-dir DIR]
                                                     [--nvdisasm PATH] [--only TEXT] [--jobs N] [--sweep]

Needs numba-cuda with the CUDA 13 toolkit (``pip install "numba-cuda[cu13]==0.30.4"
"cuda-toolkit[nvrtc,nvvm,cudart,cccl]==13.0.*"``) and ``ptxas`` on the PATH; ``--nvdisasm`` takes the
path of ``nvdisasm`` (PyPI package nvidia-cuda-nvdisasm). No GPU is needed: ``numba.cuda.compile_ptx``
compiles a kernel's Python function for a signature and a compute capability, and ptxas assembles it.

The kernels, each at the settings a GPU run uses by default:

* forward v5 (``v5_branch_free``) at its default tilings, d = 64 and 128, float16 and float32;
* forward v7 on (``v7_wgmma``, ``v8_tma``, ``v9_warp_specialized``, ``v10_ping_pong``, ...) at their tilings on
  a GPU (``forward/hopper.py``'s ``TILINGS``),
  d = 64, 128 and 256 (``warpgroup_tile.HEAD_DIMS``), float16 and bfloat16, for ``sm_90a`` (wgmma and setmaxnreg exist only there); ptxas's warnings
  and wgmma notes (C7508 setmaxnreg ignored, C7510, C7515, C7519, C7520) are printed under the kernel's line;
* forward v6 (``v6_tensor_cores``) at ``tensor_core_tiling.default_tiling(d, causal, n)`` for d in
  TENSOR_CORE_DIMS (32, 64, 96, 128, 256, and 40 and 200: padded to 64 and 224), causal or not, n in (4096,
  16384), float16 and bfloat16; each tiling in the block order that runs it
  (not causal: one head at a time; causal: heads ordered in groups, and one head at a time, which runs
  where a group holds one head), each distinct kernel once;
* the decode split kernels of ``tinyflash.decode.kernels.VERSIONS`` at their defaults: on the tensor cores
  d in TENSOR_CORE_DIMS (float16), a contiguous cache and pages of 16 tokens; on the CUDA cores d = 128, float16
  and float32, with the rows per block of the decode benchmark (32 query heads on 8 K/V heads, one query);
* the tensor-core split kernel that merges its row sets (``merge=True``), d = 64, 128 and 256, float16;
* the decode combine kernel as Hopper launches it (waiting for the split kernel inside: ``after_split``), float16
  and float32 output;
* backward v1 (``v1_atomic_dq``) at its default tilings, d = 64 and 128, float16 and float32;
* backward v2 (``v2_tensor_cores``) at its default tilings, d = 64 and 128, float16 and bfloat16;
* backward v3 (``v3_wgmma``) and v4 (``v4_warp_specialized``) at their default tilings, d = 64 and 128, float16
  and bfloat16, for ``sm_90a``; v4 also with dQ added by TMA (``DQ_BY_TMA``).

With ``--sweep``, also v6 at each candidate tiling of ``tinyflash.bench.suites.V6_TILINGS`` (the H200 sweeps'),
float16, one head at a time: the registers and spills of every tiling a sweep times.

A kernel is compiled with its own options (``fastmath``, ``launch_bounds``; ``max_registers`` becomes
ptxas's ``-maxrregcount``). The signature is the kernel module's own where it has one (v6's SIGNATURE, the
decode kernels' signatures); for v5 and backward v1 it is built from the kernel's parameter names
(:data:`PARAMETER_TYPES`). Per kernel: what ``ptxas -v -arch=sm_90`` reports for its entry function
(registers, spill stores and loads, stack frame, in bytes per thread), the PTX instructions numba wrote,
and with ``--nvdisasm`` the machine (SASS) instructions of the cubin, NOPs (alignment padding) left out, and a
check of the SASS: a kernel whose ``cp.async`` copies (``LDGSTS``) read a uniform register no instruction writes
(:func:`unwritten_uniform_registers`) is reported under its line and makes the run fail.
These are ptxas's numbers for numba's PTX; the kernel a GPU runs is compiled by numba when it is first
launched, and its registers and spilled bytes are the ``regs`` and ``local_bytes`` columns of the
benchmark rows that record them.

Each row holds the date, numba-cuda's version, ptxas's version line and the commit (with '+' when the
tracked files differ from it). ``--ptx-dir DIR`` keeps each kernel's PTX as DIR/<kernel>__<variant>.ptx,
its mangled names replaced by stable ones (``_Z_name0``, ...) so that two checkouts' files differ only
where the code does. To compare two checkouts, run this in each and diff:

    (cd A && PYTHONPATH=src python benchmarks/ptxas_report.py --csv /tmp/a.csv --ptx-dir /tmp/ptx-a)
    (cd B && PYTHONPATH=src python benchmarks/ptxas_report.py --csv /tmp/b.csv --ptx-dir /tmp/ptx-b)
    diff /tmp/a.csv /tmp/b.csv          # registers, spills, instruction counts (dates and commits differ)
    diff -r /tmp/ptx-a /tmp/ptx-b       # the PTX, kernel by kernel

Compiling everything takes a few minutes (``--jobs`` processes compile side by side; ``--only`` keeps the
kernels whose kernel or variant contains a text).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

FIELDS = ["date", "numba_cuda", "ptxas", "commit", "kernel", "variant", "registers", "spill_stores", "spill_loads",
          "stack_bytes", "ptx_instructions", "sass_instructions"]
DEFAULT_CSV = Path(__file__).resolve().parents[1] / "figures" / "data" / "ptxas_sm90.csv"
CC = (9, 0)  # the H200's compute capability
ARCH = "sm_90"
TENSOR_CORE_DIMS = (32, 40, 64, 96, 128, 200, 256)  # the head dims of the tensor-core forward and decode kernels compiled


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


def cuda_core_jobs(kernel_name: str, module, tiling, variant) -> list[Job]:
    """A CUDA-core kernel (``module.make_kernel(cfg, vector)``) at ``tiling.default_config``, d = 64 and 128,
    float16 and float32, its signature by parameter name; ``variant(cfg)`` names the tiling."""
    def build(cfg, dtype):
        kernel = module.make_kernel(cfg, module.vector_width(dtype))
        return kernel, signature_by_name(kernel, dtype)

    found = []
    for d in (64, 128):
        cfg = tiling.default_config(d, d)
        for dtype in ("float16", "float32"):
            found.append(Job(kernel_name, f"d={d} {dtype} {variant(cfg)} vector={module.vector_width(dtype)}",
                             lambda cfg=cfg, dtype=dtype: build(cfg, dtype)))
    return found


def v5_jobs() -> list[Job]:
    from tinyflash.forward.kernels import tiling, v5_branch_free as v5

    return cuda_core_jobs("forward v5", v5, tiling, lambda c: f"BR={c.BR} BC={c.BC} TM={c.TM} NT={c.NT}")


def v6_jobs() -> list[Job]:
    """v6 at its default tilings: each (tiling, element, block order) that a default call at these sizes runs."""
    from tinyflash.forward.kernels import tensor_core_tiling as tct

    kernels = []  # (cfg, grouped), each once, in the order of the points
    for d in TENSOR_CORE_DIMS:
        for causal in (False, True):
            for n in (4096, 16384):
                cfg = tct.default_tiling(d, causal, n)
                for grouped in ((False, True) if causal else (False,)):
                    if (cfg, grouped) not in kernels:
                        kernels.append((cfg, grouped))
    return [v6_job(cfg, element, grouped) for element in ("float16", "bfloat16") for cfg, grouped in kernels]


def v6_job(cfg, element: str, grouped: bool, kernel: str = "forward v6") -> Job:
    """v6 at the tiling ``cfg`` for ``element`` inputs, its blocks in groups of heads or one head at a time."""
    from tinyflash.forward.kernels import v6_tensor_cores as v6

    variant = (f"d={cfg.D} {element} warps={cfg.WARPS} row_tiles={cfg.ROW_TILES} BC={cfg.BC} "
               f"q_in_smem={cfg.Q_IN_SMEM} lazy={cfg.LAZY_RESCALE} "
               f"{'heads in groups' if grouped else 'one head at a time'}")
    return Job(kernel, variant, lambda: (v6.make_kernel(cfg, element, grouped), v6.SIGNATURE))


def v6_sweep_jobs() -> list[Job]:
    """v6 at every candidate tiling of the H200 sweeps (``bench.suites.V6_TILINGS``), float16, one head at a time."""
    from tinyflash.bench.suites import V6_TILINGS
    from tinyflash.forward.kernels.tensor_core_tiling import TensorCoreTiling

    return [v6_job(TensorCoreTiling(D=d, WARPS=w, BC=bc, ROW_TILES=rt, Q_IN_SMEM=q, LAZY_RESCALE=lazy), "float16",
                   False, "forward v6, sweep") for d, tilings in V6_TILINGS.items() for w, bc, rt, q, lazy in tilings]


Problem = namedtuple("Problem", "d d_v dtype")  # what a decode kernel's split_kernel reads of a checked problem


def decode_jobs() -> list[Job]:
    """The split kernels as ``VERSIONS[name].split_kernel(problem, page_size)`` picks them, and the combine kernel."""
    import numpy as np

    from tinyflash.bench.suites import DECODE
    from tinyflash.decode.kernels import VERSIONS, combine, tensor_cores

    rows = DECODE.fixed["heads"] // DECODE.fixed["kv_heads"] * DECODE.fixed["n_q"]  # packed rows per K/V head

    def split(name, d, dtype, page_size, **options):
        chosen = VERSIONS[name].split_kernel(Problem(d, d, np.dtype(dtype)), page_size, **options)
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
    from tinyflash.decode.kernels import cuda_cores

    for dtype in ("float16", "float32"):
        variant = (f"d=128 {dtype} threads={cuda_cores.GPU_THREADS} unroll={cuda_cores.UNROLL} "
                   f"rows={min(cuda_cores.MAX_ROWS, rows)} contiguous cache")
        found.append(Job("decode split, CUDA cores", variant, lambda dtype=dtype: split("cuda_cores", 128, dtype, 0)))
    for dtype in ("float16", "float32"):
        found.append(Job("decode combine", f"{dtype} output", lambda dtype=dtype: (
            combine.make_combine_kernel("", True), combine.combine_signature(np.dtype(dtype)))))
    return found


def backward_jobs() -> list[Job]:
    from tinyflash.backward.kernels import tiling, v1_atomic_dq as v1

    return cuda_core_jobs("backward v1", v1, tiling, lambda c: f"BR={c.BR} BC={c.BC} NT={c.NT} TM={c.TM} TK={c.TK}")


def backward_tensor_core_jobs() -> list[Job]:
    """Backward v2 (tensor cores) at its default tilings, d = 64 and 128, float16 and bfloat16."""
    from tinyflash.backward.kernels import tensor_core_tiling as tct, v2_tensor_cores as v2

    found = []
    for element in ("float16", "bfloat16"):
        for d in tct.HEAD_DIMS:
            cfg = tct.default_tiling(d)
            variant = f"d={d} {element} warps={cfg.WARPS} keys={cfg.BC} BR={cfg.BR}"
            found.append(Job("backward v2", variant, lambda cfg=cfg, element=element:  # paired atomics, as on sm_90
                             (v2.make_kernel(cfg, element, pair_atomics=True), v2.SIGNATURE)))
    return found


def backward_hopper_jobs() -> list[Job]:
    """Backward v3 (wgmma) and v4 (warp-specialised; also with DQ_BY_TMA) at their default tilings, d = 64 and
    128, float16 and bfloat16, for sm_90a."""
    from dataclasses import replace

    from tinyflash.backward.kernels import hopper_tiling, tma_tiling, v3_wgmma as v3, v4_warp_specialized as v4

    found = []
    tilings = [("v3", v3, hopper_tiling.default_tiling), ("v4", v4, tma_tiling.default_tiling),
               ("v4", v4, lambda d: replace(tma_tiling.default_tiling(d), DQ_BY_TMA=True))]
    for name, module, tiling in tilings:
        for element in ("float16", "bfloat16"):
            for d in hopper_tiling.HEAD_DIMS:
                cfg = tiling(d)
                variant = (f"d={d} {element} warpgroups={cfg.WARPGROUPS} keys={cfg.BC} BR={cfg.BR}"
                           + (f" stages={cfg.STAGES} dq_by_tma={cfg.DQ_BY_TMA}" if name == "v4" else ""))
                found.append(Job(f"backward {name}", variant, lambda module=module, cfg=cfg, element=element:
                                 (module.make_kernel(cfg, element), module.SIGNATURE), arch="sm_90a"))
    return found


def hopper_jobs() -> list[Job]:
    """The wgmma kernels (v7 on) at their default tilings, each d they take, float16 and bfloat16, for sm_90a."""
    from tinyflash.forward import kernels
    from tinyflash.forward.hopper import TILINGS

    found = []
    for name in [n for n in kernels.VERSIONS if int(n[1:]) >= 7]:
        module = getattr(kernels, kernels.VERSIONS[name].module.removesuffix(".py"))
        for element in ("float16", "bfloat16"):
            for d in kernels.VERSIONS[name].head_dims:
                cfg = TILINGS[name](d)  # the tiling hopper_attention and the hopper benchmark run it at
                variant = (f"d={d} {element} warpgroups={cfg.WARPGROUPS} BC={cfg.BC} lazy={cfg.LAZY_RESCALE}"
                           + (f" stages={cfg.STAGES} producer={cfg.PRODUCER}" if name != "v7" else ""))
                found.append(Job(f"forward {name}", variant, lambda module=module, cfg=cfg, element=element:
                                 (module.make_kernel(cfg, element), module.SIGNATURE), arch="sm_90a"))
    return found


def jobs(sweep: bool = False) -> list[Job]:
    return (v5_jobs() + v6_jobs() + hopper_jobs() + decode_jobs() + backward_jobs() + backward_tensor_core_jobs()
            + backward_hopper_jobs() + (v6_sweep_jobs() if sweep else []))


# --- compiling and counting -------------------------------------------------------------------------------


def ptx_instructions(ptx: str) -> int:
    """The instructions of a PTX listing: its indented statements, less directives (.reg, ...) and comments."""
    count = 0
    for line in ptx.splitlines():
        text = line.strip()
        if line.startswith((" ", "\t")) and text.endswith(";") and not text.startswith((".", "//", "{", "}")):
            count += 1
    return count


def stable_names(ptx: str) -> str:
    """The PTX with each mangled name (``_Z...``, numba's names of the kernel and its globals) replaced by
    ``_Z_name0``, ``_Z_name1``, ... in order of first appearance: still valid PTX, the same in two checkouts."""
    names = {}
    return re.sub(r"\b_Z\w+", lambda m: names.setdefault(m.group(0), f"_Z_name{len(names)}"), ptx)


def ptxas_report(text: str) -> dict:
    """Registers, spill stores and loads, stack frame of the one entry function in ``ptxas -v``'s output."""
    entries = re.findall(r"Compiling entry function '(\w+)'", text)
    if len(entries) != 1:
        raise ValueError(f"expected one entry function in ptxas's report; found {len(entries)}")
    name = re.escape(entries[0])
    props = re.search(rf"Function properties for {name}\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                      r"(\d+) bytes spill loads", text)
    regs = re.search(rf"Compiling entry function '{name}'.*?Used (\d+) registers", text, re.S)
    if not (props and regs):
        raise ValueError(f"ptxas's report has no registers or frame for the entry function:\n{text}")
    return {"registers": int(regs.group(1)), "stack_bytes": int(props.group(1)), "spill_stores": int(props.group(2)),
            "spill_loads": int(props.group(3))}


def sass_instructions(listing: str) -> int:
    """The machine instructions in ``nvdisasm -c``'s listing, NOPs (alignment padding) left out."""
    found = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", listing)
    return sum(1 for i in found if re.sub(r"^@!?U?P\w+\s+", "", i.strip()).split()[0] != "NOP")


UNWRITTEN = "SASS reads uniform registers that no instruction writes"  # the note of a kernel the check flags
# opcodes whose first operand is read, not written: stores, copies into shared memory, reductions, barriers, branches
READS_FIRST = ("ST", "LDGSTS", "RED", "BAR", "BRA", "BRX", "CALL", "EXIT", "RET", "SYNCS", "UTMA", "UBLKCP", "WARPSYNC",
               "DEPBAR", "ARRIVES", "MEMBAR", "CCTL", "ERRBAR", "FENCE", "YIELD", "NOP", "BSYNC", "BSSY")


def unwritten_uniform_registers(listing: str) -> list[str]:
    """The uniform registers (URn) that a ``cp.async`` of ``nvdisasm -c``'s listing (``LDGSTS``) reads and no
    instruction writes.

    Why: ptxas can encode a ``cp.async`` that has a cache policy as ``LDGSTS [Rx+UR0], desc[UR1][…]`` with uniform
    registers that nothing sets (seen at d = 32 and at d = 64 with 16-key tiles in decode's split kernel, ptxas
    13.0 and 13.2: docs/notes/2026-12-03-decode-l2-hints.md); the H200 stops such a kernel with
    CUDA_ERROR_ILLEGAL_INSTRUCTION. An instruction writes its first operand unless its opcode is one of
    READS_FIRST; an opcode with ``.64`` or ``.WIDE`` writes a pair, and ``desc[URn]`` reads one (URn, URn+1).
    Only the copies' reads are checked: other instructions name registers they do not read (``HGMMA``'s
    ``gdesc[URn]`` names four, of which it reads two when A is in registers)."""
    written, read = set(), set()
    for text in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", listing):
        text = re.sub(r"^@!?U?P\w+\s+", "", text.strip())
        opcode, _, operands = text.partition(" ")
        first, _, rest = operands.partition(",")
        target = re.fullmatch(r"\s*UR(\d+)\s*", first)
        if target and not opcode.startswith(READS_FIRST):
            n = int(target.group(1))
            written.update({n, n + 1} if (".64" in opcode or ".WIDE" in opcode) else {n})
        if opcode.startswith("LDGSTS"):
            for pair in re.findall(r"desc\[UR(\d+)\]", operands):
                read.update({int(pair), int(pair) + 1})
            read.update(int(n) for n in re.findall(r"\bUR(\d+)\b", re.sub(r"desc\[UR\d+\]", "", operands)))
    return [f"UR{n}" for n in sorted(read - written)]


def file_name(job: Job) -> str:
    """<kernel>__<variant>.ptx, with only letters, digits and ``=.-`` kept (the rest become '_')."""
    slug = lambda s: re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9=.-]", "_", s)).strip("_")  # noqa: E731
    return f"{slug(job.kernel)}__{slug(job.variant)}.ptx"


def compile_job(job: Job, ptx_dir: str | None, nvdisasm: str | None) -> dict:
    """Compile one kernel to PTX, assemble it with ptxas, and count: its row's numbers."""
    from numba import cuda

    kernel, signature = job.build()
    options = kernel.targetoptions
    cc = (*CC, "a") if job.arch.endswith("a") else CC  # sm_90a: numba's compute_90a, as on a 9.0 device
    ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(signature), cc=cc, fastmath=options.get("fastmath") or False,
                              launch_bounds=options.get("launch_bounds"))
    cap = options.get("max_registers")
    with tempfile.TemporaryDirectory() as tmp:
        source, cubin = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        source.write_text(ptx)
        assembled = subprocess.run(["ptxas", "-v", f"-arch={job.arch}", *([f"-maxrregcount={cap}"] if cap else []),
                                    str(source), "-o", str(cubin)], capture_output=True, text=True, check=True)
        said = assembled.stdout + assembled.stderr
        row = {**ptxas_report(said), "ptx_instructions": ptx_instructions(ptx), "sass_instructions": "",
               # warnings, and notes such as wgmma's serialisation (C7510, C7515) or an injected arrive (C7519)
               "notes": [line.strip() for line in said.splitlines() if "warning" in line or "(C75" in line]}
        if nvdisasm:
            listing = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
            row["sass_instructions"] = sass_instructions(listing)
            unwritten = unwritten_uniform_registers(listing)
            if unwritten:  # a kernel the GPU stops with an illegal instruction: the run fails
                row["notes"].append(f"{UNWRITTEN}: {', '.join(unwritten)} (in a cp.async: LDGSTS)")
    if ptx_dir:
        (Path(ptx_dir) / file_name(job)).write_text(stable_names(ptx))
    return row


_JOBS: list[Job] = []  # the jobs of this run: the worker processes (forked) find theirs by index


def _work(task) -> tuple:
    """(index, row or None, error text or None) of one job, in a worker process."""
    index, ptx_dir, nvdisasm = task
    try:
        return index, compile_job(_JOBS[index], ptx_dir, nvdisasm), None
    except Exception as exc:  # reported at the end; the other kernels are still compiled
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
        return index, None, f"{type(exc).__name__}: {exc} {detail}".strip()


def ptxas_version() -> str:
    """ptxas's version line ('Cuda compilation tools, release 13.0, V13.0.88')."""
    out = subprocess.run(["ptxas", "--version"], capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("Cuda compilation tools")]
    return lines[0] if lines else out.strip().splitlines()[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Run with PYTHONPATH=src from the repository root.")
    ap.add_argument("--csv", default=str(DEFAULT_CSV), help="write the rows here (default: %(default)s)")
    ap.add_argument("--ptx-dir", help="keep each kernel's PTX here, named by kernel and variant")
    ap.add_argument("--nvdisasm", help="path of nvdisasm: also count the machine instructions")
    ap.add_argument("--sweep", action="store_true", help="also v6 at each candidate tiling of the H200 sweeps")
    ap.add_argument("--only", help="only the kernels whose kernel name or variant contains this text")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes (default: %(default)s)")
    args = ap.parse_args(argv)

    from tinyflash.bench.record import CsvWriter, environment

    env = environment(device="")  # the date, the versions and the commit; no GPU is asked
    fixed = {"date": env["date"], "numba_cuda": env["numba_cuda"], "ptxas": ptxas_version(), "commit": env["commit"]}
    _JOBS[:] = [j for j in jobs(args.sweep) if not args.only or args.only in j.kernel or args.only in j.variant]
    if args.ptx_dir:
        Path(args.ptx_dir).mkdir(parents=True, exist_ok=True)
    print(f"{len(_JOBS)} kernels for {ARCH} (the wgmma ones for {ARCH}a): numba-cuda {fixed['numba_cuda']}, {fixed['ptxas']}, "
          f"commit {fixed['commit'] or '-'}, {fixed['date']}", flush=True)
    tasks = [(i, args.ptx_dir, args.nvdisasm) for i in range(len(_JOBS))]
    writer, failed = CsvWriter(args.csv, fields=FIELDS), []
    # forked workers inherit the jobs (their build functions are closures, which do not pickle); nothing here
    # touches a GPU, so a fork is safe
    with multiprocessing.get_context("fork").Pool(max(1, min(args.jobs, len(tasks)))) as pool:
        for index, row, error in pool.imap(_work, tasks):  # in the jobs' order, as they finish
            job = _JOBS[index]
            if error:
                failed.append(f"{job.kernel}, {job.variant}: {error}")
                print(f"{job.kernel:28} {job.variant}: FAILED ({error.splitlines()[0][:200]})", flush=True)
                continue
            notes = row.pop("notes")
            failed += [f"{job.kernel}, {job.variant}: {note}" for note in notes if note.startswith(UNWRITTEN)]
            writer.write({**fixed, "kernel": job.kernel, "variant": job.variant, **row})
            sass = f", {row['sass_instructions']} SASS" if row["sass_instructions"] != "" else ""
            print(f"{job.kernel:28} {job.variant}: {row['registers']} registers, spills {row['spill_stores']}/"
                  f"{row['spill_loads']} B, stack {row['stack_bytes']} B, {row['ptx_instructions']} PTX{sass}",
                  *[f"\n    {note[:300]}" for note in notes], flush=True)
    writer.close()
    if failed:
        print(f"\n{len(failed)} of {len(tasks)} kernels did not compile, or compiled to SASS that reads uniform "
              "registers nothing writes:", *failed, sep="\n", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
