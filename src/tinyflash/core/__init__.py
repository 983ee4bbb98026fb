"""The rules of the mathematics, each written once; every stage and kernel uses these.

    checks.py           input checks: shapes, dtypes, scale, causal (the same errors from every stage)
    masks.py            the causal rule, key_stop (the kernels compile the same lines)
    online_softmax.py   the online softmax: the update and epilogue that stage 1 and lesson 02 call
    tolerance.py        error metrics and FlashAttention's tolerance rule (F32_TOL, fa_rule)

This package imports nothing else of tinyflash.
"""
