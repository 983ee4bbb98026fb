"""The decode split kernel for the H200, without a GPU: registers, spills, shared memory, resident
blocks and bytes in flight per SM, and (with nvdisasm) the machine instructions of its main loop.

    python benchmarks/decode_ptxas.py [--nvdisasm PATH]

Needs numba-cuda with the CUDA 13.0 toolkit and ``ptxas`` on the PATH (see compare_ptx.py);
``nvdisasm`` comes from the PyPI package nvidia-cuda-nvdisasm. For float16, d = 128, 4 packed rows
(GQA 32/8, Nq = 1) and each block shape the benchmark times, it prints what ``ptxas -v -arch=sm_90``
reports and what follows from it on an H200 (65,536 registers and 228 KB of shared memory per SM,
1 KB of it reserved per block): blocks per SM, and bytes in flight per SM = blocks × (STAGES - 1)
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

from tinyflash.decode import kernels
from tinyflash.decode.paged import PAGE_SIZE

REGISTERS_PER_SM, SMEM_PER_SM, SMEM_RESERVED = 65_536, 228 * 1024, 1024
# (threads, keys per slot and tile, bytes per thread and key row, register cap): the default, then the
# benchmark's variants at Nk = 131,072 (its 128-split variant is the default shape), then two others
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvdisasm", help="path of nvdisasm: also count the main loop's instructions")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    paged = [(*SHAPES[0], PAGE_SIZE)]  # and the default shape reading through a block table
    for nt, unroll, row_bytes, cap, page_size in [(*shape, 0) for shape in SHAPES] + paged:
        VEC, D, TD = kernels.lanes(128, 2, row_bytes)
        kernel, smem = kernels.make_split_kernel(4, D, VEC, nt, True, page_size, unroll)
        sig = kernels.split_signature(np.dtype(np.float16), True)
        (work / "k.ptx").write_text(cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))[0])
        capped = [f"-maxrregcount={cap}"] if cap else []  # what numba's max_registers asks of the compiler
        out = subprocess.run(["ptxas", "-v", "-arch=sm_90", *capped, str(work / "k.ptx"), "-o", str(work / "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
        regs = int(re.search(r"Used (\d+) registers", out).group(1))
        spills = re.search(r"(\d+) bytes spill stores", out)
        blocks = min(REGISTERS_PER_SM // (regs * nt), SMEM_PER_SM // (smem + SMEM_RESERVED))
        keys = nt // TD * unroll  # keys per tile
        in_flight = blocks * (kernels.STAGES - 1) * keys * 2 * D * 2
        line = (f"{'paged, ' if page_size else ''}{nt} threads, {unroll} keys per slot ({keys} per tile), {row_bytes} bytes per row and thread"
                f"{f', at most {cap} registers' if cap else ''}: {regs} registers, "
                f"{spills.group(1) if spills else 0} bytes spilled, {smem // 1024} KB shared -> {blocks} blocks per SM, "
                f"{in_flight // 1024} KB in flight per SM")
        if args.nvdisasm:
            listing = subprocess.run([args.nvdisasm, "-c", str(work / "k.cubin")], capture_output=True, text=True,
                                     check=True).stdout
            per_key = loop_instructions(listing) / unroll * TD / 32  # TD threads share a key: TD / 32 of a warp
            line += f"; main loop {per_key:.0f} warp instructions per key"
        print(line)


if __name__ == "__main__":
    main()
