"""The decode split kernels for the H200, without a GPU: registers, spills, shared memory, resident
blocks and bytes in flight per SM, and (with nvdisasm) the machine instructions of the main loop.

    python benchmarks/decode_ptxas.py [--nvdisasm PATH]

Needs numba-cuda with the CUDA 13.0 toolkit and ``ptxas`` on the PATH (see compare_ptx.py);
``nvdisasm`` comes from the PyPI package nvidia-cuda-nvdisasm. For float16 and d = 128, for the
tensor-core kernel's tilings that the benchmark times and for block shapes of the CUDA-core kernel
(4 packed rows: GQA 32/8, Nq = 1), each also reading through a block table, it prints what ``ptxas -v -arch=sm_90``
reports and what follows from it on an H200 (65,536 registers and 228 KB of shared memory per SM,
1 KB of it reserved per block; at most 32 blocks): blocks per SM, and bytes in flight per SM = blocks × (STAGES - 1)
tiles × keys per tile × 512 bytes (a K row and a V row). The loop's instruction count is its static
length (the mask's branch, taken only on the last tile or the diagonal, included), in warp
instructions per key: the instructions the SMs' schedulers issue for each key of the cache.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from numba import cuda

from tinyflash.decode import kernels, tensor_cores
from tinyflash.decode.paged import PAGE_SIZE

REGISTERS_PER_SM, SMEM_PER_SM, SMEM_RESERVED, MAX_BLOCKS_PER_SM = 65_536, 228 * 1024, 1024, 32
# the tensor-core kernel's default tiling, then the benchmark's other tilings at Nk = 131,072
TILINGS = [tensor_cores.default_tiling(128)] + [tensor_cores.DecodeTiling(128, keys, stages)
                                                 for keys, stages in ((16, 4), (16, 3), (32, 3), (64, 2))]
# the CUDA-core kernel's (threads, keys per slot and tile, bytes per thread and key row, register cap): its
# default, then shapes timed in earlier runs (benchmarks/results/decode_h200.log's history)
SHAPES = [(128, 4, 16, None), (128, 4, 32, None), (128, 2, 32, 168), (128, 2, 16, None), (256, 4, 16, None)]


def loop_instructions(listing: str) -> int:
    """Machine instructions of the loop that holds the ring's wait (DEPBAR.LE), from its label to its branch back."""
    lines = listing.splitlines()
    labels = {x[:-1]: i for i, x in enumerate(lines) if re.match(r"\.L_x_\d+:$", x)}
    for wait in (i for i, x in enumerate(lines) if "DEPBAR.LE" in x):  # the first wait may come before the loop
        for i in range(wait, len(lines)):
            m = re.search(r"BRA `\((\.L_x_\d+)\)", lines[i])
            if m and labels.get(m.group(1), wait) < wait:
                return sum(bool(re.search(r"/\*[0-9a-f]{4}\*/", x)) for x in lines[labels[m.group(1)]:i + 1])
    raise ValueError("no loop around the ring's wait")


def measure(kernel, signature, smem: int, threads: int, keys: int, stages: int, per_key_of_loop: float, work: Path,
            nvdisasm: str | None, cap: int | None = None) -> str:
    """What ptxas reports for ``kernel`` (d = 128, float16) and what follows on an H200; with
    ``nvdisasm``, the main loop's warp instructions per key (its length × ``per_key_of_loop``)."""
    (work / "k.ptx").write_text(cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))[0])
    capped = [f"-maxrregcount={cap}"] if cap else []  # what numba's max_registers asks of the compiler
    out = subprocess.run(["ptxas", "-v", "-arch=sm_90", *capped, str(work / "k.ptx"), "-o", str(work / "k.cubin")],
                         capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = re.search(r"(\d+) bytes spill stores", out)
    blocks = min(REGISTERS_PER_SM // (regs * threads), SMEM_PER_SM // (smem + SMEM_RESERVED), MAX_BLOCKS_PER_SM)
    in_flight = blocks * (stages - 1) * keys * 2 * 128 * 2  # tiles in flight × keys × a K row and a V row
    line = (f"{regs} registers, {spills.group(1) if spills else 0} bytes spilled, {smem // 1024} KB shared -> "
            f"{blocks} blocks per SM, {in_flight // 1024} KB in flight per SM")
    if nvdisasm:
        listing = subprocess.run([nvdisasm, "-c", str(work / "k.cubin")], capture_output=True, text=True,
                                 check=True).stdout
        line += f"; main loop {loop_instructions(listing) * per_key_of_loop:.1f} warp instructions per key"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvdisasm", help="path of nvdisasm: also count the main loop's instructions")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    print("the tensor-core split kernel (decode/tensor_cores.py), one warp per block:")
    for cfg, page_size in [(c, 0) for c in TILINGS] + [(TILINGS[0], PAGE_SIZE)]:
        kernel, smem = tensor_cores.make_split_kernel(cfg, page_size)
        line = measure(kernel, tensor_cores.SIGNATURE, smem, tensor_cores.WARP, cfg.BC, cfg.STAGES, 1 / cfg.BC, work,
                       args.nvdisasm)  # the loop's iteration: one tile of BC keys, one warp
        print(f"{'paged, ' if page_size else ''}{cfg.BC} keys per tile, {cfg.STAGES} stages: {line}")
    print("the CUDA-core split kernel (decode/kernels.py):")
    paged = [(*SHAPES[0], PAGE_SIZE)]  # and the default shape reading through a block table
    for nt, unroll, row_bytes, cap, page_size in [(*shape, 0) for shape in SHAPES] + paged:
        VEC, D, TD = kernels.lanes(128, 2, row_bytes)
        kernel, smem = kernels.make_split_kernel(4, D, VEC, nt, True, page_size, unroll)
        sig = kernels.split_signature(np.dtype(np.float16), True)
        keys = nt // TD * unroll  # keys per tile
        # an iteration: unroll keys per slot; TD threads share a key, TD / 32 of a warp
        line = measure(kernel, sig, smem, nt, keys, kernels.STAGES, TD / 32 / unroll, work, args.nvdisasm, cap)
        print(f"{'paged, ' if page_size else ''}{nt} threads, {unroll} keys per slot ({keys} per tile), {row_bytes} bytes "
              f"per row and thread{f', at most {cap} registers' if cap else ''}: {line}")


if __name__ == "__main__":
    main()
