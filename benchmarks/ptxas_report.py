"""Every kernel of this checkout compiled for the H200 (sm_90; backward v2 for the A100's sm_80 too) without a GPU:
registers, spills, stack frame and instruction counts, one CSV row per kernel.

    PYTHONPATH=src python benchmarks/ptxas_report.py [--csv figures/data/ptxas_sm90.csv] [--ptx-dir DIR]
                                                     [--nvdisasm PATH] [--only TEXT] [--jobs N] [--sweep]

Needs numba-cuda with the CUDA 13 toolkit (``pip install "numba-cuda[cu13]==0.30.4"
"cuda-toolkit[nvrtc,nvvm,cudart,cccl]==13.0.*"``) and ``ptxas`` on the PATH; ``--nvdisasm`` takes the
path of ``nvdisasm`` (PyPI package nvidia-cuda-nvdisasm). No GPU is needed: ``numba.cuda.compile_ptx``
compiles a kernel's Python function for a signature and a compute capability, and ptxas assembles it.

The kernels and their settings are listed in ``benchmarks/ptxas_kernels.py``.

A kernel is compiled with its own options (``fastmath``, ``launch_bounds``; ``max_registers`` becomes
ptxas's ``-maxrregcount``). The signature is the kernel module's own where it has one (v6's SIGNATURE, the
decode kernels' signatures); for v5 and backward v1 it is built from the kernel's parameter names
(:data:`PARAMETER_TYPES`). Per kernel: what ``ptxas -v -arch=sm_90`` reports for its entry function
(registers, spill stores and loads, stack frame, in bytes per thread), the PTX instructions numba wrote,
and with ``--nvdisasm`` the machine (SASS) instructions of the cubin, NOPs (alignment padding) left out, and a
check of the SASS: a kernel whose ``cp.async`` copies (``LDGSTS``) read a uniform register no instruction writes
(:func:`unwritten_uniform_registers`) is reported under its line and makes the run fail.
These are ptxas's numbers for numba's PTX (a GPU's kernel is compiled by numba at its first launch: its
registers and spills are the benchmark rows' ``regs`` and ``local_bytes``).

Each row holds the date, numba-cuda's version, ptxas's version line and the commit ('+': the tracked files
differ from it). ``--ptx-dir DIR`` keeps each kernel's PTX as DIR/<kernel>__<variant>.ptx, its mangled names
replaced by stable ones (``_Z_name0``, ...): two checkouts' files differ only where the code does. To compare two
checkouts, run this in each with its own --ptx-dir and ``diff -r`` the two folders (and the two CSVs).

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
from pathlib import Path

FIELDS = ["date", "numba_cuda", "ptxas", "commit", "kernel", "variant", "registers", "spill_stores", "spill_loads",
          "stack_bytes", "ptx_instructions", "sass_instructions"]
DEFAULT_CSV = Path(__file__).resolve().parents[1] / "figures" / "data" / "ptxas_sm90.csv"
CC = (9, 0)  # the H200's compute capability
ARCH = "sm_90"


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


def file_name(job) -> str:
    """<kernel>__<variant>.ptx, with only letters, digits and ``=.-`` kept (the rest become '_')."""
    slug = lambda s: re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9=.-]", "_", s)).strip("_")  # noqa: E731
    return f"{slug(job.kernel)}__{slug(job.variant)}.ptx"


def compile_job(job, ptx_dir: str | None, nvdisasm: str | None) -> dict:
    """Compile one kernel to PTX, assemble it with ptxas, and count: its row's numbers."""
    from types import SimpleNamespace

    import numba.cuda.dispatcher
    from numba import cuda

    kernel, signature = job.build()
    options = kernel.targetoptions
    cc = (int(job.arch[3]), int(job.arch[4]), *job.arch[5:])  # sm_90a: numba's compute_90a, as on a 9.0 device
    # a device function that numba compiles on its own rather than into its caller's IR (flex_attention's user
    # functions: forceinline, so that a captured array is one constant of the module) asks the current GPU for its
    # compute capability; there is none here, so it is given the job's target's
    numba.cuda.dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc[:2])
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


_JOBS: list = []  # ptxas_kernels.Job  # the jobs of this run: the worker processes (forked) find theirs by index


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
    from ptxas_kernels import jobs  # beside this script

    _JOBS[:] = [j for j in jobs(args.sweep) if not args.only or args.only in j.kernel or args.only in j.variant]
    if args.ptx_dir:
        Path(args.ptx_dir).mkdir(parents=True, exist_ok=True)
    print(f"{len(_JOBS)} kernels for {ARCH} (the wgmma ones for {ARCH}a, backward v2 for sm_80 too): numba-cuda "
          f"{fixed['numba_cuda']}, {fixed['ptxas']}, commit {fixed['commit'] or '-'}, {fixed['date']}", flush=True)
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
