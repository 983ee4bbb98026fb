"""How ``wgmma.py`` and ``tma.py`` emit their instructions: one LLVM inline-assembly call, and an intrinsic that is
one fixed instruction without operands. Imported only off numba's simulator (by their ``_intrinsics``), since it
needs llvmlite and numba's intrinsic machinery, which the emulations do not."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic


def asm(builder, text, constraints, result, operands):
    """Emit ``text`` (PTX, operands $0, $1, ...) with LLVM ``constraints``, its result of LLVM type ``result``;
    marked as having side effects, so that the compiler neither drops nor merges it."""
    fnty = ir.FunctionType(result, [op.type for op in operands])
    return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), operands)


def void_instruction(text: str):
    """A device function of no arguments and no result that emits ``text``; it clobbers memory, so that no load or
    store is moved across it."""
    @intrinsic
    def instruction(typingctx):
        def codegen(context, builder, sig, args):
            asm(builder, text, "~{memory}", ir.VoidType(), [])
            return context.get_dummy_value()

        return types.void(), codegen

    return instruction
