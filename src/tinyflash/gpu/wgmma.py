"""Hopper's warpgroup matrix multiply (``wgmma``) for numba.cuda kernels, one function per instruction,
and the shared-memory layout its operands are read from.

As ``ptx.py`` does for ``mma.sync``, each function emits one PTX instruction through LLVM inline
assembly; on numba's simulator ``wgmma_emulation.py`` runs it instead (chosen once, in ``_impl``).
Every instruction here needs compute capability 9.0 and the ``sm_90a`` target (numba-cuda compiles for
``sm_90a`` by default on a 9.0 device). PTX ISA: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
Instructions" (section 9.7.15 in PTX ISA 8.x).

**A warpgroup** is 4 consecutive warps (128 threads, the first warp's index a multiple of 4). One
``wgmma.mma_async.m64nNk16`` multiplies a 64 × 16 tile A by a 16 × N tile B into a 64 × N float32
accumulator D spread over the warpgroup's registers: warp w of the group holds rows 16w .. 16w + 15,
laid out as ``mma.m16n8k16``'s C fragment repeated N / 8 times (``ptx.mma_m16n8k16``'s table)::

    D (64 × N)          cols 8n + 2t, 8n + 2t + 1
      row 16w + g           d[4n + 0], d[4n + 1]
      row 16w + g + 8       d[4n + 2], d[4n + 3]

So a lane's N / 2 accumulators are, in order, the elements (e = 0 .. 3) of N / 8 mma C fragments: the
array ``s[0, n, e]`` of ``tinyflash.warp_tile`` with one row tile. A in registers (the ``rs`` form) is
four 32-bit words per lane in the layout of ``mma.m16n8k16``'s A operand, rows 16w .. 16w + 15 again.

**Asynchronous.** ``mma_async`` only issues the multiply; the tensor cores read the operands and write D
later. A kernel (1) calls :data:`fence` before the first mma_async of a batch (it orders the registers'
earlier writes before the tensor cores read them), (2) issues the batch, (3) closes it with
:data:`commit_group` and (4) waits with :func:`wait_group` before it touches D or overwrites the shared
memory the batch reads. :func:`fence_operands` keeps the compiler from moving the accumulators' reads
and writes across those points (an empty ``asm volatile`` that claims to read and write every one).

**Descriptors.** Operands in shared memory are named by a 64-bit descriptor (PTX ISA "Matrix Descriptor
Format"): bits 0-13 the start address >> 4; 16-29 the leading-dimension byte offset (LBO) >> 4; 32-45 the
stride-dimension byte offset (SBO) >> 4; 49-51 a base offset (0 here: every tile starts 1024-byte aligned);
62-63 the swizzle (0 none, 1 128-byte, 2 64-byte, 3 32-byte). The layout used here is the **128-byte
swizzle**: a tile of R rows × 64 16-bit values (128 bytes a row) is stored row after row, and the 16-byte
chunk c of row r sits at chunk position c XOR (r mod 8) of its row (:func:`swizzled_chunk`), so that the 8
rows of a core matrix fall in 8 different bank groups. A tile with d = 128 columns is two such tiles side
by side in memory: columns 0-63, then columns 64-127, each R × 128 bytes (d = 256: four, one after the
other). The hardware applies the XOR to bits 4-6 of the absolute shared address, from bits 7-9: a tile
must start 1024-byte aligned.

How a descriptor reads such a tile (the canonical layouts of CUTLASS's ``make_gmma_desc``):

* K-major (A = Q_i, B = K_j for S = Q Kᵀ: a row of the tile is one row of A, or one column of B, along k):
  element (row r, k) at ``start + (r // 8)·SBO + (r % 8)·128 + 2k``, k < 16, then swizzled. SBO = 1024
  (8 rows of 128 bytes); LBO is not used. The k-th 16 columns of a 64-column tile start 32k bytes on.
* MN-major (B = V_j for O += P V with ``trans_b``: a row of the tile is one k, a key, along n): element
  (k, n) at ``start + (k // 8)·SBO + (k % 8)·128 + (n // 64)·LBO + 2(n % 64)``, then swizzled. SBO = 1024,
  LBO = the distance from one of the tile's 64-column pieces to the next (R · 128 bytes), used when N > 64
  (N = 256: four pieces, each LBO after the one before). A may be MN-major too (``trans_a``; the
  backward's dS read from the stored dSᵀ), the same with m for n.

**FP8 (e4m3).** ``wgmma.mma_async.m64nNk32.f32.e4m3.e4m3`` (element ``"e4m3"`` of :func:`mma_async_ss` and
:func:`mma_async_rs`) multiplies a 64 × 32 A by a 32 × N B: k = 32, since a value is one byte and a k-step
still spans 32 bytes of a row. The accumulators are float32 and laid out as above. What changes:

* **K-major only.** The transposes (``trans_a``, ``trans_b``) exist for 16-bit types alone; both operands of an
  FP8 multiply are read along k. For S = Q Kᵀ that is what the tiles already are. For O += P V, B = V_j must
  be stored transposed (Vᵀ: d rows of keys bytes) so that a row of the tile runs along k, the keys.
* **One byte per element.** A 128-byte swizzled row holds 128 e4m3 values, not 64; the swizzle, SBO = 1024
  and the 32-byte k-step are the same bytes as before. Element (row r, k) of a K-major tile is at
  ``start + (r // 8)·SBO + (r % 8)·128 + k``, k < 32; the k-th 32 columns of a 128-column tile start 32k
  bytes on.
* **A in registers** (``rs``) is four 32-bit words per lane, each holding four e4m3 values (the first in the
  low byte): word j holds row 16w + g + 8·(j % 2), columns 4t + 16·(j // 2) .. + 3 (CUTLASS's
  ``ALayout_64x32``; the PTX ISA's figure "WGMMA .m64nNk32 register fragment layout for matrix A"). In
  bytes this is the 16-bit table of :func:`mma_async_rs`, so the same four loads fill it; but it is not the
  accumulator's layout (a lane's accumulators hold columns 2t, 2t + 1 of each 8): P_ij goes from S_ij's
  registers to the tensor cores after its bytes move among the four lanes of each group (or after the keys
  are renumbered to match, in P and V alike).
* **Accumulation.** D is float32, but the FP8 tensor cores add the products with fewer bits: an instruction
  errs by up to about 2^-13 of Σ|a||b| (``tests/test_wgmma_fp8_ptx.py`` says where that comes from), far
  more than float32's 2^-24. Long sums of FP8 products lose more than float32 sums would.
"""

from __future__ import annotations

from types import SimpleNamespace

from numba import cuda, uint32, uint64

from .ptx import PTX_TYPES
from .runtime import simulator_enabled

WARPGROUP = 128  # threads of a warpgroup: 4 warps
WGMMA_M, WGMMA_K = 64, 16  # one wgmma.mma_async m64nNk16 on 16-bit inputs
WGMMA_K_FP8 = 32  # one wgmma.mma_async m64nNk32 on 8-bit inputs: k-steps span 32 bytes either way
WGMMA_TYPES = {**PTX_TYPES, "e4m3": "e4m3"}  # the element types, by their PTX names
SWIZZLE_ROW_BYTES = 128  # a row of a 128-byte-swizzled tile: 64 16-bit values
SWIZZLE_ATOM_BYTES = 1024  # 8 such rows: the swizzle's period, and the alignment a tile needs
SWIZZLE_ROW_VALUES = SWIZZLE_ROW_BYTES // 2
SWIZZLE_128B = 1  # the descriptor's code for the 128-byte swizzle (bits 62-63)
N_SIZES = tuple(range(8, 257, 8))  # N of m64nNk16 (16-bit inputs) and m64nNk32 (e4m3) with float32 D


def descriptor_bits(leading_bytes: int, stride_bytes: int, swizzle: int = SWIZZLE_128B) -> int:
    """The fixed bits of a shared-memory matrix descriptor (module docstring): LBO, SBO and the swizzle mode;
    the start address is added in the kernel (:func:`descriptor`)."""
    for name, value in (("leading_bytes", leading_bytes), ("stride_bytes", stride_bytes)):
        if value % 16 or not 0 <= value >> 4 < 1 << 14:
            raise ValueError(f"{name} must be a multiple of 16 below 2^18; got {value}")
    if swizzle not in (0, 1, 2, 3):
        raise ValueError(f"swizzle must be 0 (none), 1 (128 B), 2 (64 B) or 3 (32 B); got {swizzle}")
    return (leading_bytes >> 4) << 16 | (stride_bytes >> 4) << 32 | swizzle << 62


@cuda.jit(device=True, inline="always")
def descriptor(address, bits):
    """The descriptor of the matrix that starts at shared byte ``address`` (uint32, a multiple of 16) with
    :func:`descriptor_bits` ``bits`` (uint64). Shared addresses are below 2^18: the start field holds them."""
    return uint64(bits) | ((uint64(address) >> uint64(4)) & uint64(0x3FFF))


@cuda.jit(device=True, inline="always")
def swizzled_chunk(row, chunk, rows):
    """Byte offset in a 128-byte-swizzled tile of ``rows`` rows of the 16-byte chunk ``chunk`` (8 values:
    columns 8·chunk ..) of row ``row``: its 64-column piece, its row, its chunk XOR the row's place among 8."""
    return (uint32(chunk) // uint32(8) * uint32(rows) + uint32(row)) * uint32(SWIZZLE_ROW_BYTES) + (
        (uint32(chunk) % uint32(8)) ^ (uint32(row) % uint32(8))) * uint32(16)


def _intrinsics():
    """The real instructions, compiled into the kernel (imported only off the simulator)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .inline_asm import asm, void_instruction

    f32, i64 = ir.FloatType(), ir.IntType(64)

    def elements(context, builder, aryty, value, n):
        """Pointers to the first n elements of a C-contiguous array (a local array: registers after inlining)."""
        data = context.make_array(aryty)(context, builder, value=value).data
        return [builder.gep(data, [ir.Constant(i64, i)]) for i in range(n)]

    def through_asm(builder, text, pointers, more, more_constraints, kind="f"):
        """Load the accumulators, run ``text`` with them tied to its first outputs, store them back
        (``kind``: 'f' float32 registers, 'r' 32-bit integer ones)."""
        n = len(pointers)
        regs = ",".join(f"${i}" for i in range(n))
        constraints = ",".join([f"={kind}"] * n + [str(i) for i in range(n)] + more_constraints + ["~{memory}"])
        out = asm(builder, text.replace("{D}", "{" + regs + "}"), constraints,
                  ir.LiteralStructType([f32 if kind == "f" else ir.IntType(32)] * n),
                  [builder.load(p) for p in pointers] + more)
        for i, p in enumerate(pointers):
            builder.store(builder.extract_value(out, i), p)

    def make_mma(element, n, from_registers, trans_b, trans_a=False):
        e = WGMMA_TYPES[element]
        k = WGMMA_K_FP8 if element == "e4m3" else WGMMA_K
        half = n // 2  # accumulators per lane
        # the immediates after p: scale-a, scale-b (1: not negated), then the transposes (16-bit types only)
        transposes = "" if element == "e4m3" else (f", {int(trans_b)}" if from_registers else
                                                   f", {int(trans_a)}, {int(trans_b)}")
        if from_registers:  # operands after the tied accumulators: a0..a3, the B descriptor, scale-d
            a, b, scale = "{" + ",".join(f"${2 * half + i}" for i in range(4)) + "}", f"${2 * half + 4}", 2 * half + 5
        else:
            a, b, scale = f"${2 * half}", f"${2 * half + 1}", 2 * half + 2
        text = (f"{{ .reg .pred p; setp.ne.b32 p, ${scale}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{e}.{e} {{D}}, {a}, {b}, p, 1, 1{transposes}; }}")

        if from_registers:
            @intrinsic
            def mma_async_rs(typingctx, acc, a0, a1, a2, a3, desc_b, scale_d):
                sig = types.void(acc, *[types.uint32] * 4, types.uint64, types.uint32)

                def codegen(context, builder, sig, args):
                    through_asm(builder, text, elements(context, builder, sig.args[0], args[0], half), list(args[1:]),
                                ["r"] * 4 + ["l", "r"])
                    return context.get_dummy_value()

                return sig, codegen

            return mma_async_rs

        @intrinsic
        def mma_async_ss(typingctx, acc, desc_a, desc_b, scale_d):
            sig = types.void(acc, types.uint64, types.uint64, types.uint32)

            def codegen(context, builder, sig, args):
                through_asm(builder, text, elements(context, builder, sig.args[0], args[0], half), list(args[1:]),
                            ["l", "l", "r"])
                return context.get_dummy_value()

            return sig, codegen

        return mma_async_ss

    def make_fence_operands(count):
        @intrinsic
        def fence_operands(typingctx, acc):
            kind = "f" if acc.dtype == types.float32 else "r"  # float32, or 32-bit words (uint32)

            def codegen(context, builder, sig, args):
                through_asm(builder, "// {D}", elements(context, builder, sig.args[0], args[0], count), [], [], kind)
                return context.get_dummy_value()

            return types.void(acc), codegen

        return fence_operands

    return SimpleNamespace(make_mma=make_mma, make_fence_operands=make_fence_operands,
                           fence=void_instruction("wgmma.fence.sync.aligned;"),
                           commit_group=void_instruction("wgmma.commit_group.sync.aligned;"),
                           make_wait_group=lambda n: void_instruction(f"wgmma.wait_group.sync.aligned {int(n)};"),
                           fence_proxy_async=void_instruction("fence.proxy.async.shared::cta;"))


def _implementation():
    if simulator_enabled():
        from . import wgmma_emulation

        return wgmma_emulation
    return _intrinsics()


_impl = _implementation()  # the one place where the real instruction or its emulation is chosen


def _check(element: str, n: int, trans_b: bool = False, trans_a: bool = False):
    if element not in WGMMA_TYPES:
        raise ValueError(f"element must be one of {tuple(WGMMA_TYPES)}; got {element!r}")
    if n not in N_SIZES:
        raise ValueError(f"N of wgmma m64nNk16 / m64nNk32 must be a multiple of 8 from 8 to 256; got {n}")
    if element == "e4m3" and (trans_a or trans_b):
        raise ValueError(f"e4m3 operands must be K-major: trans_a and trans_b must be False; got trans_a={trans_a}, "
                         f"trans_b={trans_b} (store the tile transposed instead, as Vᵀ for P·V)")


def mma_async_ss(element: str, n: int, trans_b: bool = False, trans_a: bool = False):
    """D (+)= A·B by one warpgroup, A (64 × 16) and B (16 × n) read from shared memory through descriptors.
    Returns the device function ``mma(acc, desc_a, desc_b, scale_d)``: ``acc`` a C-contiguous float32 local
    array whose first n / 2 elements are the lane's accumulators in register order (module docstring),
    updated in place once the batch is waited for; ``scale_d`` (uint32) 0: D = A·B, else D = A·B + D.
    A is K-major, or MN-major with ``trans_a`` (a row of the tile is one k, along m: the backward's dS K_j
    reads dS from the dSᵀ that its registers hold); B K-major, or MN-major with ``trans_b``. Both
    transposes are allowed for 16-bit types only.

    PTX: ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 d, a-desc, b-desc, p, 1, 1, trans_a, trans_b;``
    (``.bf16.bf16`` for bfloat16), p = (scale_d != 0). Multiply-adds: 64 · n · 16 (n = 128: 131,072, 64
    mma.sync's worth).

    ``element="e4m3"``: A (64 × 32) and B (32 × n) of one-byte e4m3 values, both K-major (no transposes),
    float32 D. PTX: ``wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 d, a-desc, b-desc, p, 1, 1;``
    Multiply-adds: 64 · n · 32, twice a 16-bit instruction's (Hopper's FP8 rate is twice its 16-bit rate).
    """
    _check(element, n, trans_b, trans_a)
    return _impl.make_mma(element, n, False, trans_b, trans_a)


def mma_async_rs(element: str, n: int, trans_b: bool = False):
    """As :func:`mma_async_ss`, A from registers: ``mma(acc, a0, a1, a2, a3, desc_b, scale_d)``, a0 .. a3 the
    lane's four words of A (rows 16w + g and 16w + g + 8; the layout of ``mma.m16n8k16``'s A: a0 row g,
    columns 2t, 2t + 1; a1 row g + 8; a2 row g, columns 2t + 8, 2t + 9; a3 row g + 8). An accumulator's
    layout packed to 16-bit pairs is this layout: P_ij goes from S_ij's registers to the tensor cores.

    PTX: ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 d, {a0, a1, a2, a3}, b-desc, p, 1, 1, trans_b;``
    ``trans_b`` (B MN-major) is allowed for 16-bit types only.

    ``element="e4m3"``: A (64 × 32) in registers, each word four e4m3 values, low byte first: a0 row g,
    columns 4t .. 4t + 3; a1 row g + 8; a2 row g, columns 4t + 16 .. 4t + 19; a3 row g + 8 (the module
    docstring; the same bytes as the 16-bit table). B (32 × n) K-major.
    PTX: ``wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 d, {a0, a1, a2, a3}, b-desc, p, 1, 1;``
    """
    _check(element, n, trans_b)
    return _impl.make_mma(element, n, True, trans_b)


def fence_operands(count: int):
    """A device function ``fence_operands(acc)``: the first ``count`` elements of ``acc`` (a C-contiguous local
    array of float32 or uint32) are read and written
    here, as far as the compiler knows (an empty ``asm volatile`` with each tied to an output). Called after
    :func:`wait_group`, it keeps reads of the accumulators from moving above the wait; before :data:`fence`,
    writes from moving below it. No instruction is emitted. (CUTLASS: ``warpgroup_fence_operand``.)"""
    return _impl.make_fence_operands(count)


def wait_group(pending: int):
    """A device function ``wait()``: wait until at most ``pending`` of this warpgroup's committed wgmma groups
    are still in flight; the others' accumulators are then written and their shared memory read.

    PTX: ``wgmma.wait_group.sync.aligned N;`` PTX ISA: "wgmma.wait_group".
    """
    return _impl.make_wait_group(pending)


fence = _impl.fence
"""fence(): order this warpgroup's earlier register accesses (accumulators, A words) before the wgmma.mma_async
that follow. Needed before the first mma_async of each batch.

PTX: ``wgmma.fence.sync.aligned;`` PTX ISA: "wgmma.fence".
"""

commit_group = _impl.commit_group
"""commit_group(): close the batch of wgmma.mma_async issued since the last commit into one wgmma group.

PTX: ``wgmma.commit_group.sync.aligned;`` PTX ISA: "wgmma.commit_group".
"""

fence_proxy_async = _impl.fence_proxy_async
"""fence_proxy_async(): make this thread's writes to shared memory (stores, cp.async copies that have landed)
visible to the async proxy, through which wgmma reads its operands; then a barrier makes every thread's visible.

PTX: ``fence.proxy.async.shared::cta;`` PTX ISA: "Memory Consistency Model: Proxies", "membar / fence".
"""

__all__ = ["SWIZZLE_128B", "WARPGROUP", "WGMMA_K_FP8", "WGMMA_TYPES", "commit_group", "descriptor", "descriptor_bits",
           "fence", "fence_operands", "fence_proxy_async", "mma_async_rs", "mma_async_ss", "swizzled_chunk",
           "wait_group"]
