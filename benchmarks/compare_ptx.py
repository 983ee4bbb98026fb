"""Compile this checkout's default kernel and another checkout's for the H200, without a GPU, and compare.

    python benchmarks/compare_ptx.py --other PATH/TO/OTHER/src/tinyflash [--nvdisasm PATH]

Needs numba-cuda with the CUDA 13.0 toolkit (``pip install "numba-cuda[cu13]==0.30.4"
"cuda-toolkit[nvrtc,nvvm,cudart,cccl]==13.0.*"``) and ``ptxas`` on the PATH; no GPU (every device
function is inlined, so numba compiles without a device). For the default tiling at d = 64 and
128, float32 and float16, it prints: the number of PTX instructions of each, how many PTX lines
differ once register names and labels are dropped, and the opcodes whose counts differ; registers,
spills and stack frame from ``ptxas -v -arch=sm_90``; with ``--nvdisasm`` (from the PyPI package
nvidia-cuda-nvdisasm), the number of machine (SASS) instructions of each and how many of their
positions differ once register names are dropped.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from collections import Counter
from importlib import import_module
from pathlib import Path

from compare_checkouts import import_other  # this folder's tool: the other checkout as tinyflash_<label>

from numba import cuda, types  # noqa: E402

from tinyflash.forward.kernels import tiling, v5_branch_free  # noqa: E402


def signature(dtype: str, kernel=None) -> tuple:
    """The argument types of a forward kernel; with ``kernel``, as many as it takes (kernels with
    grouped-query attention take kv_group, an int64, last)."""
    element = types.float16 if dtype == "float16" else types.float32
    sig = ((types.Array(element, 1, "C"),) * 4 + (types.Array(types.float32, 1, "C"),)
           + (types.int64,) * 4 + (types.float32, types.boolean))
    extra = 0 if kernel is None else kernel.py_func.__code__.co_argcount - len(sig)
    return sig + (types.int64,) * extra


def instructions(ptx: str) -> list[str]:
    """PTX instructions with register names, labels and mangled names replaced by placeholders."""
    lines = [line.strip() for line in ptx.splitlines() if line.startswith("\t") and not line.strip().startswith((".", "//"))]
    return [re.sub(r"%\w+\d+", "%r", re.sub(r"\$L__\w+|_Z\w+|_cudapy_smem_\d+", "L", line)) for line in lines]


def ptxas(ptx: str, workdir: Path, tag: str, nvdisasm: str | None) -> tuple[str, list[str]]:
    """('N registers, S bytes spill stores, F bytes stack frame', SASS instructions or [])."""
    (workdir / f"{tag}.ptx").write_text(ptx)
    out = subprocess.run(["ptxas", "-v", "-arch=sm_90", str(workdir / f"{tag}.ptx"), "-o", str(workdir / f"{tag}.cubin")],
                         capture_output=True, text=True, check=True).stderr
    report = ", ".join(re.findall(r"Used \d+ registers|\d+ bytes spill stores|\d+ bytes stack frame", out))
    if not nvdisasm:
        return report, []
    sass = subprocess.run([nvdisasm, "-c", str(workdir / f"{tag}.cubin")], capture_output=True, text=True, check=True).stdout
    found = [m.group(1).strip() for m in (re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", line) for line in sass.splitlines()) if m]
    return report, [re.sub(r"\bU?R\d+|\bU?P\d|0x[0-9a-f]+|c\[[^]]*\]\[[^]]*\]", "X", i) for i in found]


def changed(a: list[str], b: list[str]) -> int:
    return sum(1 for line in difflib.unified_diff(a, b, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", type=Path, required=True, help="the other checkout's src/tinyflash folder")
    ap.add_argument("--label", default="other")
    ap.add_argument("--nvdisasm", help="path to nvdisasm, to compare the machine code too")
    args = ap.parse_args(argv)
    import_other(args.label, args.other.resolve())
    try:  # the layout before the reorganisation: one module
        old = import_module(f"tinyflash_{args.label}.cuda_kernel")
        old_make, old_config = old.make_kernel, old.default_config
    except ModuleNotFoundError:  # this layout
        old_make = import_module(f"tinyflash_{args.label}.forward.kernels.v5_branch_free").make_kernel
        old_config = import_module(f"tinyflash_{args.label}.forward.kernels.tiling").default_config
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for d in (64, 128):
            for dtype in ("float32", "float16"):
                width = v5_branch_free.vector_width(dtype)
                this_k, that_k = v5_branch_free.make_kernel(tiling.default_config(d, d), width), old_make(
                    old_config(d, d), width)
                this = cuda.compile_ptx(this_k.py_func, signature(dtype, this_k), cc=(9, 0))[0]
                that = cuda.compile_ptx(that_k.py_func, signature(dtype, that_k), cc=(9, 0))[0]
                a, b = instructions(that), instructions(this)
                ops = Counter(i.split()[0] for i in b)
                ops.subtract(Counter(i.split()[0] for i in a))
                print(f"d={d} {dtype}: PTX instructions {args.label} {len(a)}, this {len(b)}; lines that differ "
                      f"{changed(a, b)}; opcode counts this - {args.label}: "
                      f"{dict(sorted((k, v) for k, v in ops.items() if v))}")
                (ra, sa), (rb, sb) = (ptxas(p, workdir, tag, args.nvdisasm) for p, tag in ((that, "that"), (this, "this")))
                print(f"    ptxas sm_90: {args.label}: {ra}; this: {rb}")
                if args.nvdisasm:
                    print(f"    SASS instructions {args.label} {len(sa)}, this {len(sb)}; positions that differ "
                          f"{changed(sa, sb)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
