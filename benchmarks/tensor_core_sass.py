"""Kernel v6's machine code for the H200, without a GPU: registers, spills, and the instructions that
one K/V tile costs each warp.

    python benchmarks/tensor_core_sass.py --nvdisasm PATH [--other LABEL=PATH/TO/OTHER/src/tinyflash] [--defaults]

Needs numba-cuda with the CUDA 13.0 toolkit and ``ptxas`` (see compare_ptx.py), and ``nvdisasm``
(PyPI package nvidia-cuda-nvdisasm). For each tiling it compiles v6 (float16) for sm_90 and counts
the instructions of the main loop (one iteration: one K/V tile per warp) on its common path: the
branch that masks scores (ragged last tile, diagonal tiles) is left out. The tensor cores' own
instructions (HMMA) are a fixed number per tile; everything else is issued by the same schedulers,
which is what makes the other instructions cost time.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections import Counter
from importlib import import_module
from pathlib import Path

from compare_checkouts import import_other  # this folder's tool: the other checkout as tinyflash_<label>
from numba import cuda

from tinyflash.forward.kernels import v6_tensor_cores

# (d, warps, keys, row tiles per warp, Q_i's operands read from shared memory per key tile[, lazy rescaling])
TILINGS = [(128, 8, 128, 1, False), (128, 8, 64, 1, False), (128, 4, 64, 1, False), (128, 4, 32, 1, False),
           (64, 4, 32, 1, False), (64, 4, 64, 1, False),
           (128, 4, 16, 2, False), (128, 4, 32, 2, False), (64, 4, 32, 2, False), (64, 4, 64, 2, False),
           (128, 4, 16, 2, True), (128, 4, 32, 2, True), (128, 8, 32, 2, True), (128, 4, 64, 2, True),
           (128, 8, 64, 2, True), (128, 4, 128, 1, True), (128, 8, 128, 1, True), (128, 8, 64, 1, True),
           (64, 4, 32, 1, True), (64, 4, 32, 2, True), (64, 4, 64, 2, True), (64, 8, 64, 2, True),
           (128, 8, 64, 2, True, True), (128, 4, 64, 2, True, True), (64, 4, 64, 2, False, True)]


def sass(ptx: str, workdir: Path, nvdisasm: str) -> tuple[str, list[str]]:
    """('N registers, S bytes spill stores', machine instructions and labels in order)."""
    (workdir / "k.ptx").write_text(ptx)
    out = subprocess.run(["ptxas", "-v", "-arch=sm_90", str(workdir / "k.ptx"), "-o", str(workdir / "k.cubin")],
                         capture_output=True, text=True, check=True).stderr
    report = ", ".join(re.findall(r"Used \d+ registers|\d+ bytes spill stores", out))
    listing = subprocess.run([nvdisasm, "-c", str(workdir / "k.cubin")], capture_output=True, text=True,
                             check=True).stdout
    lines = []
    for line in listing.splitlines():
        label = re.match(r"^\s*\.(L_x_\d+):", line)
        instruction = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if label or instruction:
            lines.append(label.group(1) + ":" if label else instruction.group(1))
    return report, lines


def tile_cost(lines: list[str]) -> Counter:
    """Opcode counts of the longest loop's body on its common path (without the masking branch)."""
    at = {line[:-1]: i for i, line in enumerate(lines) if line.endswith(":")}
    branches = [(i, at[m.group(1)]) for i, line in enumerate(lines) if (m := re.search(r"BRA\s+`\(\.(L_x_\d+)\)", line))]
    end, top = max(((i, t) for i, t in branches if t < i), key=lambda bt: bt[0] - bt[1])
    skipped = set()
    for i, target in branches:
        if top < i < end and target > i and any("FSEL" in x and "-INF" in x for x in lines[i:target]):
            skipped.update(range(i + 1, target))  # the mask: only on the tiles that need it
    body = [x for k, x in enumerate(lines[top:end + 1], top) if k not in skipped and not x.endswith(":")]
    return Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvdisasm", required=True, help="path to nvdisasm")
    ap.add_argument("--other", action="append", default=[], metavar="LABEL=PATH",
                    help="another checkout's src/tinyflash folder, compiled the same way")
    ap.add_argument("--defaults", action="store_true", help="only the tilings that default_tiling picks")
    args = ap.parse_args(argv)
    kernels = {"this": v6_tensor_cores}
    for item in args.other:
        label, path = item.split("=", 1)
        import_other(label, Path(path).resolve())
        kernels[label] = import_module(f"tinyflash_{label}.forward.kernels.v6_tensor_cores")
    with tempfile.TemporaryDirectory() as tmp:
        defaults = {v6_tensor_cores.default_tiling(d, causal, n) for d in v6_tensor_cores.HEAD_DIMS
                    for causal in (False, True) for n in (4096, 16384)}
        for d, warps, keys, row_tiles, q_smem, *lazy in TILINGS:
            for label, v6 in kernels.items():
                extra = {"ROW_TILES": row_tiles} if row_tiles != 1 else {}  # older checkouts: one row tile only
                extra.update({"Q_IN_SMEM": True} if q_smem else {})  # and Q_i's operands in registers only
                extra.update({"LAZY_RESCALE": True} if lazy and lazy[0] else {})  # and rescaling at every tile
                if any(not hasattr(v6.TensorCoreTiling(D=d, WARPS=warps, BC=keys), name) for name in extra):
                    continue
                if args.defaults and v6_tensor_cores.TensorCoreTiling(D=d, WARPS=warps, BC=keys, **extra) not in defaults:
                    continue
                kernel = v6.make_kernel(v6.TensorCoreTiling(D=d, WARPS=warps, BC=keys, **extra), "float16")
                ptx = cuda.compile_ptx(kernel.py_func, v6.SIGNATURE, cc=(9, 0), fastmath=v6.FAST_MATH)[0]  # its own
                report, lines = sass(ptx, Path(tmp), args.nvdisasm)
                ops = tile_cost(lines)
                others = ", ".join(f"{op} {n}" for op, n in ops.most_common(8) if op != "HMMA")
                where = (", Q in smem" if q_smem else "") + (", lazy" if lazy and lazy[0] else "")
                print(f"d={d} {warps} warps x {row_tiles} row tiles x {keys} keys{where}, {label}: {report}; per K/V tile "
                      f"{sum(ops.values())} "
                      f"instructions, {ops['HMMA']} HMMA ({sum(ops.values()) / ops['HMMA']:.1f} per HMMA); {others}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
