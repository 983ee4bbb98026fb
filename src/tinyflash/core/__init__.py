"""The rules of the mathematics, each written once; every stage and kernel uses these.

    checks.py           input checks: shapes, dtypes, scale, causal (the same errors from every stage)
    e4m3.py             the 8-bit float e4m3: its bytes, rounding to it as the GPU's cvt does
    masks.py            the causal rule, key_stop (the kernels compile the same lines)
    online_softmax.py   the online softmax: the update and epilogue that stage 1 and lesson 02 call
    quantize.py         FP8 inputs: descale factors per tensor, head or block; the randomized Hadamard rotation
    tolerance.py        error metrics and FlashAttention's tolerance rule (F32_TOL, fa_rule)

This package imports nothing else of tinyflash.
"""
