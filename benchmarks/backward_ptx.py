"""Compile the backward kernel for the H200 (sm_90) without a GPU; print registers and spills.

    PYTHONPATH=src /work/devvenv/bin/python benchmarks/backward_ptx.py

Needs numba-cuda with the CUDA 13.0 toolkit and ``ptxas`` on the PATH (see compare_ptx.py).
For the default backward tiling at d = 64, 128 and 256, float32 and float16, and the other
tilings of the backward tile sweep (float32), it prints what
``ptxas -v -arch=sm_90`` reports: registers per thread, spill stores and loads, stack frame.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from numba import cuda, types

from tinyflash.backward.kernels import rows, tiling, v1_atomic_dq
from tinyflash.measure.bench_backward import TILE_SWEEP


def signature(dtype: str) -> tuple:
    element = types.float16 if dtype == "float16" else types.float32
    f32 = types.Array(types.float32, 1, "C")
    arrays = (types.Array(element, 1, "C"),) * 4 + (f32, f32, f32) + (types.Array(element, 1, "C"),) * 2
    return arrays + (types.int64,) * 4 + (types.float32, types.float32, types.boolean)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(d, dtype, tiling.default_config(d, d)) for d in (64, 128, 256) for dtype in ("float32", "float16")]
        runs += [(d, "float32", tiling.BackwardTileConfig(*c, D=0, DV=0).padded(d, d)) for d in TILE_SWEEP
                 for c in TILE_SWEEP[d][1:]]  # the other tilings of `python -m tinyflash.bench backward-tiles`
        for d, dtype, cfg in runs:
            kernel = v1_atomic_dq.make_kernel(cfg, v1_atomic_dq.vector_width(dtype))
            ptx = cuda.compile_ptx(kernel.py_func, signature(dtype), cc=(9, 0))[0]
            path = Path(tmp) / f"bwd_{d}_{dtype}.ptx"
            path.write_text(ptx)
            out = subprocess.run(["ptxas", "-v", "-arch=sm_90", str(path), "-o", str(path.with_suffix(".cubin"))],
                                 capture_output=True, text=True, check=True).stderr
            found = re.findall(r"Used \d+ registers|\d+ bytes spill (?:stores|loads)|\d+ bytes stack frame", out)
            print(f"d={d} {dtype} {cfg} smem {cfg.smem_bytes} B: {', '.join(found)}")
        for dtype in ("float32", "float16"):  # the two small kernels: they must compile too
            element = types.Array(types.float16 if dtype == "float16" else types.float32, 1, "C")
            f32 = types.Array(types.float32, 1, "C")
            cuda.compile_ptx(rows.row_dot.py_func, (element, element, f32, f32, types.int64, types.int64, types.int64),
                             cc=(9, 0))
            cuda.compile_ptx(rows.finish_dq.py_func, (f32, element, types.int64, types.float32), cc=(9, 0))
            print(f"row_dot and finish_dq compile for sm_90 ({dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
