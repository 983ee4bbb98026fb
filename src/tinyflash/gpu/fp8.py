"""The FP8 conversions of Hopper's FP8 path, for numba.cuda kernels: two float32 to a pair of e4m3, and back.

As ``ptx.py`` does, each function emits one PTX instruction through LLVM inline assembly; on numba's simulator
``fp8_emulation.py`` runs it instead (chosen once, in ``_impl``). An e4m3 number is one byte (1 sign, 4 exponent
and 3 mantissa bits, largest 448: ``tinyflash.core.e4m3`` explains it); the instructions convert two at a time,
a pair in a 16-bit register (a ``uint16`` in Python), the first of the pair in the low byte. PTX ISA: "Data
Movement and Conversion Instructions: cvt"; compute capability 8.9 and later (Ada, Hopper), PTX ISA 7.8.

Where a kernel needs them: P = exp2(S2 - m2 + offset) leaves the softmax in float32 and enters the second
product, P·V, as e4m3 (:func:`pack_e4m3x2`, with ``satfinite``: a value beyond 448 becomes 448, never NaN);
an e4m3 pair widens exactly to a pair of float16 (:func:`unpack_e4m3x2`), since every e4m3 number is a float16
number (float16 has more exponent and mantissa bits).
"""

from __future__ import annotations

from types import SimpleNamespace

from .runtime import simulator_enabled


def _intrinsics():
    """The real instructions, compiled into the kernel (imported only off the simulator)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .inline_asm import asm

    i16, i32 = ir.IntType(16), ir.IntType(32)

    @intrinsic
    def pack_e4m3x2(typingctx, lo, hi):
        sig = types.uint16(types.float32, types.float32)

        def codegen(context, builder, sig, args):  # cvt's first source goes to the HIGH byte: pass (hi, lo)
            return asm(builder, "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f", i16, [args[1], args[0]])

        return sig, codegen

    @intrinsic
    def unpack_e4m3x2(typingctx, pair):
        sig = types.uint32(types.uint16)

        def codegen(context, builder, sig, args):  # the low byte to the low half, the high byte to the high half
            return asm(builder, "cvt.rn.f16x2.e4m3x2 $0, $1;", "=r,h", i32, list(args))

        return sig, codegen

    return SimpleNamespace(pack_e4m3x2=pack_e4m3x2, unpack_e4m3x2=unpack_e4m3x2)


def _implementation():
    if simulator_enabled():
        from . import fp8_emulation

        return fp8_emulation
    return _intrinsics()


_impl = _implementation()  # the one place where the real instruction or its emulation is chosen

pack_e4m3x2 = _impl.pack_e4m3x2
"""pack_e4m3x2(lo, hi) -> uint16: two float32 values rounded to e4m3, ``lo`` in the low byte, ``hi`` in the high.

Rounding to nearest, ties to even; magnitudes beyond 448 (and ±inf) become ±448 (``.satfinite``); NaN becomes
NaN (0x7F). PTX: ``cvt.rn.satfinite.e4m3x2.f32 d, a, b;`` with d a .b16 register, which puts its first source
``a`` in the *upper* byte of d: the function passes (hi, lo), as ``ptx.pack`` does for 16-bit pairs. One lane, no
exchange. Two such pairs make the 32-bit register of four e4m3 values that an FP8 wgmma's A operand holds.
"""

unpack_e4m3x2 = _impl.unpack_e4m3x2
"""unpack_e4m3x2(pair) -> uint32: a uint16 of two e4m3 numbers widened, exactly, to a word of two float16 values
(f16x2), the low byte's in the low half; ``ptx.unpack("float16")`` then gives two float32.

PTX: ``cvt.rn.f16x2.e4m3x2 d, a;`` (a a .b16 register, d .b32): the upper byte of a goes to the upper half of d.
Every e4m3 number is a float16 number, so ``.rn`` never rounds; NaN stays NaN. One lane, no exchange.
"""

__all__ = ["pack_e4m3x2", "unpack_e4m3x2"]
