"""Tensor-core PTX instructions for numba.cuda kernels, one function per instruction.

numba has no tensor-core API, but ``numba.cuda.extending.intrinsic`` can emit any single PTX
instruction through LLVM inline assembly (``llvmlite.ir.InlineAsm``): that is all this module
does. Operands of 16-bit type travel in 32-bit registers holding two values each, the first in
the low half (a ``uint32`` in Python). Every docstring gives the instruction, the section of
NVIDIA's *PTX ISA* manual it comes from, and which lane holds which elements.

Lanes are named as in the PTX ISA: ``g = lane // 4`` (the group of 4 lanes) and
``t = lane % 4`` (the lane's place in its group). The same layouts, as code, are in
``ptx_emulation.py`` (functions ``a_fragment``, ``b_fragment``, ``c_fragment``,
``ldmatrix_fragment``), which also emulates each instruction for numba's CUDA simulator.
Which of the two a kernel gets is decided in one place: ``_impl`` below.

Every instruction here is for compute capability 8.0 and later (the H200 is 9.0).
"""

from __future__ import annotations

from types import SimpleNamespace

from numba import cuda

from .runtime import simulator_enabled

FULL_WARP = 0xFFFFFFFF
PTX_TYPES = {"float16": "f16", "bfloat16": "bf16"}  # the element types, by their PTX names


def _intrinsics():
    """The real instructions, compiled into the kernel (imported only off the simulator)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, f32 = ir.IntType(32), ir.FloatType()

    def asm(builder, text, constraints, result, operands, side_effect=False):
        fnty = ir.FunctionType(result, [op.type for op in operands])
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), operands)

    def tuple_of(context, builder, sig, value, n):
        return context.make_tuple(builder, sig.return_type, [builder.extract_value(value, i) for i in range(n)])

    def make_mma(element):
        element = PTX_TYPES[element]
        text = (f"mma.sync.aligned.m16n8k16.row.col.f32.{element}.{element}.f32 "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")

        @intrinsic
        def mma_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            sig = types.UniTuple(types.float32, 4)(*[types.uint32] * 6, *[types.float32] * 4)

            def codegen(context, builder, sig, args):
                out = asm(builder, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", ir.LiteralStructType([f32] * 4), args)
                return tuple_of(context, builder, sig, out, 4)

            return sig, codegen

        return mma_m16n8k16

    def make_pack(element):
        @intrinsic
        def pack(typingctx, lo, hi):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):  # cvt's first source goes to the HIGH half
                return asm(builder, f"cvt.rn.{PTX_TYPES[element]}x2.f32 $0, $1, $2;", "=r,f,f", i32, [args[1], args[0]])

            return sig, codegen

        return pack

    def make_unpack(element):
        # float16: split the word into its halves and widen each; bfloat16 is the top half of a float32: shift the
        # low half up, clear the high half's low bits
        text = ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }"
                if element == "float16" else
                "{ .reg .b32 lo, hi; shl.b32 lo, $2, 16; and.b32 hi, $2, 0xFFFF0000; mov.b32 $0, lo; mov.b32 $1, hi; }")

        @intrinsic
        def unpack(typingctx, word):
            sig = types.UniTuple(types.float32, 2)(types.uint32)

            def codegen(context, builder, sig, args):
                out = asm(builder, text, "=f,=f,r", ir.LiteralStructType([f32] * 2), args)
                return tuple_of(context, builder, sig, out, 2)

            return sig, codegen

        return unpack

    @intrinsic
    def shared_address(typingctx, smem, index):
        sig = types.uint32(smem, types.uint64)

        def codegen(context, builder, sig, args):
            array = context.make_array(sig.args[0])(context, builder, value=args[0])
            pointer = builder.gep(array.data, [args[1]])
            shared = builder.addrspacecast(pointer, ir.PointerType(pointer.type.pointee, 3))  # 3: shared
            return builder.ptrtoint(shared, i32)

        return sig, codegen

    def make_ldmatrix(suffix):
        text = f"ldmatrix.sync.aligned.m8n8.x4{suffix}.shared.b16 {{$0,$1,$2,$3}}, [$4];"

        @intrinsic
        def ldmatrix(typingctx, address):
            sig = types.UniTuple(types.uint32, 4)(types.uint32)

            def codegen(context, builder, sig, args):
                out = asm(builder, text, "=r,=r,=r,=r,r,~{memory}", ir.LiteralStructType([i32] * 4), args, True)
                return tuple_of(context, builder, sig, out, 4)

            return sig, codegen

        return ldmatrix

    def make_cp_async_16(prefetch: int = 0):
        size = f".L2::{prefetch}B" if prefetch else ""
        text = f"cp.async.cg.shared.global{size} [$0], [$1], 16, $2;"

        @intrinsic
        def cp_async_16(typingctx, address, src, index, nbytes):
            sig = types.void(types.uint32, src, types.uint64, types.uint32)

            def codegen(context, builder, sig, args):
                array = context.make_array(sig.args[1])(context, builder, value=args[1])
                pointer = builder.ptrtoint(builder.gep(array.data, [args[2]]), ir.IntType(64))
                asm(builder, text, "r,l,r,~{memory}", ir.VoidType(), [args[0], pointer, args[3]], True)
                return context.get_dummy_value()

            return sig, codegen

        return cp_async_16

    @intrinsic
    def red_add_f32x2(typingctx, array, index, a, b):
        sig = types.void(array, types.uint64, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, value=args[0])
            pointer = builder.ptrtoint(builder.gep(data.data, [args[1]]), ir.IntType(64))
            asm(builder, "red.global.add.v2.f32 [$0], {$1, $2};", "l,f,f,~{memory}", ir.VoidType(),
                [pointer, args[2], args[3]], True)
            return context.get_dummy_value()

        return sig, codegen

    def make_void(text):
        @intrinsic
        def instruction(typingctx):
            def codegen(context, builder, sig, args):
                asm(builder, text, "~{memory}", ir.VoidType(), [], True)
                return context.get_dummy_value()

            return types.void(), codegen

        return instruction

    @cuda.jit(device=True, inline="always")
    def shfl_xor(value, lane_mask):
        return cuda.shfl_xor_sync(FULL_WARP, value, lane_mask)

    return SimpleNamespace(make_mma=make_mma, make_pack=make_pack, make_unpack=make_unpack, shared_address=shared_address,
                           ldmatrix_x4=make_ldmatrix(""), ldmatrix_x4_trans=make_ldmatrix(".trans"),
                           cp_async_16=make_cp_async_16(), make_cp_async_16=make_cp_async_16,
                           red_add_f32x2=red_add_f32x2, cp_async_commit=make_void("cp.async.commit_group;"),
                           cp_async_wait_all=make_void("cp.async.wait_group 0;"), shfl_xor=shfl_xor,
                           make_cp_async_wait_group=lambda n: make_void(f"cp.async.wait_group {int(n)};"),
                           wait_for_prior_grids=make_void("griddepcontrol.wait;"))


def _implementation():
    if simulator_enabled():
        from . import ptx_emulation

        return ptx_emulation
    return _intrinsics()


_impl = _implementation()  # the one place where the real instruction or its emulation is chosen


def mma_m16n8k16(element: str):
    """D = A·B + C on the tensor cores, one warp: A 16 × 16 and B 16 × 8 in ``element`` (float16
    or bfloat16), C and D 16 × 8 in float32. Returns the device function
    ``mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``.

    PTX: ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` (``.bf16.bf16`` for bfloat16).
    PTX ISA: "Warp Level Matrix Multiply-Accumulate Instructions: mma", fragments in "Matrix
    Fragments for mma.m16n8k16 with floating point type". ``row``/``col``: A is read by rows,
    B by columns. Each register a*, b* holds two elements (low half first); c*, d* one float::

        A (16 × 16)        cols 2t, 2t+1        cols 2t+8, 2t+9
          row g                a0                    a2
          row g + 8            a1                    a3
        B (16 × 8)         col g
          rows 2t, 2t+1        b0
          rows 2t+8, 2t+9      b1
        C, D (16 × 8)      col 2t    col 2t+1
          row g              c0        c1
          row g + 8          c2        c3

    So lane 0 (g = 0, t = 0) holds A[0, 0:2], A[8, 0:2], A[0, 8:10], A[8, 8:10]; B[0:2, 0] and
    B[8:10, 0]; C[0, 0:2] and C[8, 0:2]. The four lanes of a group share rows g and g + 8 of C:
    a row of S = Q Kᵀ lives in one group of 4 lanes. And the C layout, two rows × pairs of
    columns, is the A layout of one 16 × 8 half: two C tiles side by side, packed into 16-bit
    pairs, *are* an A operand. (That is why P never leaves the registers in a FlashAttention
    kernel.) Multiply-adds per instruction: 16·8·16 = 2048.
    """
    return _impl.make_mma(element)


def pack(element: str):
    """Two float32 values rounded (to nearest even) into one 32-bit word of two ``element`` values.
    Returns the device function ``pack(lo, hi) -> uint32``: ``lo`` in the low half, ``hi`` in the high.

    PTX: ``cvt.rn.f16x2.f32 d, a, b;`` (``cvt.rn.bf16x2.f32`` for bfloat16), which puts its first
    source ``a`` in the *upper* half of d: the function passes (hi, lo). PTX ISA: "Data Movement
    and Conversion Instructions: cvt". One lane, no exchange: a lane packs its own c0, c1 (one
    row, two neighbouring columns) into the word an A operand wants there.
    """
    return _impl.make_pack(element)


def unpack(element: str):
    """One 32-bit word of two ``element`` values widened to two float32 values, exactly. Returns the device
    function ``unpack(word) -> (lo, hi)``: the inverse of :func:`pack` up to its rounding.

    PTX: ``mov.b32 {lo, hi}, w; cvt.f32.f16`` of each half for float16; for bfloat16, whose bits are the top
    half of a float32, ``shl.b32`` (the low half) and ``and.b32`` (the high half). PTX ISA: "Data Movement
    and Conversion Instructions: cvt, mov"; "Logic and Shift Instructions". One lane, no exchange.
    """
    return _impl.make_unpack(element)


shared_address = _impl.shared_address
"""shared_address(smem, index) -> uint32: the byte address of ``smem[index]`` in the shared state
space, as ldmatrix and cp.async want it (``smem`` a shared array, ``index`` a uint64).

LLVM's ``addrspacecast`` of the element's generic pointer to address space 3, then a 32-bit
integer: what PTX's ``cvta.to.shared`` computes. PTX ISA: "State Spaces: Shared State Space".
"""

ldmatrix_x4 = _impl.ldmatrix_x4
"""ldmatrix_x4(address) -> (r0, r1, r2, r3): four 8 × 8 matrices of 16-bit values, shared memory to registers.

PTX: ``ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0, r1, r2, r3}, [address];`` PTX ISA:
"Warp Level Matrix Load Instruction: ldmatrix". Lanes 8i .. 8i+7 give the addresses of rows
0 .. 7 of matrix i (16 bytes each, anywhere in shared memory); every lane receives one word of
each matrix, ri = matrix i's elements (row g, columns 2t and 2t + 1)::

    matrix i (8 × 8)   cols 2t, 2t+1
      row g               ri of lane 4g + t

which is the layout of one A register (a row g, a column pair) and, for the rows of Kᵀ, of a B
register. One instruction replaces 4 scalar loads per lane, without bank conflicts when the 8
rows of a matrix fall in different banks (the kernel pads its rows by 16 bytes).
"""

ldmatrix_x4_trans = _impl.ldmatrix_x4_trans
"""ldmatrix_x4_trans(address) -> (r0, r1, r2, r3): as :data:`ldmatrix_x4`, each matrix transposed.

PTX: ``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16``. PTX ISA: "Warp Level Matrix Load
Instruction: ldmatrix". ri of lane 4g + t = matrix i's elements (row 2t, column g) and (row 2t + 1,
column g)::

    matrix i (8 × 8)   col g
      rows 2t, 2t+1       ri of lane 4g + t

which is the B layout (two rows, one column) read from a matrix stored row by row: V_j is
stored key by key, and P·V wants it column by column.
"""

cp_async_16 = _impl.cp_async_16
"""cp_async_16(address, src, index, nbytes): copy 16 bytes, src[index:index+4] (uint32 words), to
the shared byte ``address`` without passing through registers; only ``nbytes`` (16 or 0) are read,
the rest of the 16 bytes are zeros (0: a row past the end of the matrix becomes zeros).

PTX: ``cp.async.cg.shared.global [address], [src + 4·index], 16, nbytes;`` (.cg: cached in L2
only). PTX ISA: "Data Movement and Conversion Instructions: cp.async". One lane, asynchronous:
the copy is in flight until a :data:`cp_async_wait_all` of its group.
"""


def make_cp_async_16(prefetch: int = 0):
    """:data:`cp_async_16` that also has L2 fetch ``prefetch`` bytes (0, 64, 128 or 256) around each copy's 16
    (``.L2::128B``...). The hint changes no result; the simulator ignores it.

    PTX: ``cp.async.cg.shared.global.L2::128B [address], [src], 16, nbytes;``. PTX ISA: "cp.async"."""
    if prefetch not in (0, 64, 128, 256):
        raise ValueError(f"prefetch must be 0, 64, 128 or 256 bytes; got {prefetch!r}")
    return _impl.make_cp_async_16(int(prefetch))


cp_async_commit = _impl.cp_async_commit
"""cp_async_commit(): close the group of cp.async copies issued so far by this thread.

PTX: ``cp.async.commit_group;`` PTX ISA: "Data Movement and Conversion Instructions:
cp.async.commit_group".
"""

cp_async_wait_all = _impl.cp_async_wait_all
"""cp_async_wait_all(): wait until every committed group of this thread has landed in shared memory.
Other threads' copies are visible only after a barrier as well.

PTX: ``cp.async.wait_group 0;`` PTX ISA: "Data Movement and Conversion Instructions: cp.async.wait_group".
"""


red_add_f32x2 = _impl.red_add_f32x2
"""red_add_f32x2(array, index, a, b): array[index] += a and array[index + 1] += b, atomically, in one
instruction (``array`` float32 in global memory, ``index`` a uint64, even: the pair is 8-byte aligned).

PTX: ``red.global.add.v2.f32 [array + 4·index], {a, b};`` PTX ISA: "Parallel Synchronization and
Communication Instructions: red" (vector types: compute capability 9.0 and PTX ISA 8.1 on). One lane, no
result: a reduction in L2. Two neighbouring floats of an mma accumulator (c0, c1: one row, columns 2t and
2t + 1) go in one request instead of two, and a warp's request fills whole 32-byte sectors.
"""


def cp_async_wait_group(pending: int):
    """A device function ``wait()``: wait until at most ``pending`` of this thread's most recent
    committed groups are still in flight (every older group has landed in shared memory). In a
    ring of S stages where tile j + S - 1 is requested just before tile j is used, ``pending = S - 1``
    waits for tile j only and lets tiles j + 1 .. j + S - 1 keep flying.

    PTX: ``cp.async.wait_group N;`` (N a constant). PTX ISA: "Data Movement and Conversion
    Instructions: cp.async.wait_group". ``pending = 0`` is :data:`cp_async_wait_all`.
    """
    return _impl.make_cp_async_wait_group(pending)


shfl_xor = _impl.shfl_xor
"""shfl_xor(value, lane_mask): the ``value`` of lane ``lane ^ lane_mask`` (all 32 lanes take part).

numba's ``cuda.shfl_xor_sync``, which compiles to PTX ``shfl.sync.bfly.b32``. PTX ISA: "Data
Movement and Conversion Instructions: shfl.sync". With lane masks 1 and 2 the four lanes of a
group (one row of an mma accumulator) exchange their values.
"""

wait_for_prior_grids = _impl.wait_for_prior_grids
"""wait_for_prior_grids(): wait until the grids this one depends on have finished and their memory is visible.

A kernel launched with programmatic stream serialization (``gpu.driver_launch.LaunchConfig``: programmatic dependent
launch) may start while the kernel before it on the stream is still running; its blocks must call this before they
read what that kernel writes. In a kernel launched the ordinary way it returns at once.

PTX: ``griddepcontrol.wait;`` PTX ISA: "Parallel Synchronization and Communication Instructions:
griddepcontrol" (compute capability 9.0 on).
"""

__all__ = ["cp_async_16", "cp_async_commit", "cp_async_wait_all", "cp_async_wait_group", "ldmatrix_x4", "ldmatrix_x4_trans",
           "make_cp_async_16", "mma_m16n8k16", "pack", "red_add_f32x2", "shared_address", "shfl_xor", "unpack",
           "wait_for_prior_grids"]
