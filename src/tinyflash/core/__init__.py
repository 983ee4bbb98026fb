"""The rules of the mathematics, each written once; every stage and kernel uses these.

    checks.py           input checks: shapes, dtypes, scale, causal (the same errors from every stage)
    e4m3.py             the 8-bit float e4m3: its bytes, rounding to it as the GPU's cvt does
    masks.py            the causal rule, key_stop (the kernels compile the same lines)
    online_softmax.py   the online softmax: the update and epilogue that stage 1 and lesson 02 call
    quantize.py         FP8 inputs: descale factors per tensor, head or block; the randomized Hadamard rotation;
                        FlashAttention-3's input with outlier entries
    tolerance.py        error metrics and FlashAttention's tolerance rule (F32_TOL, fa_rule)
    mods.py             score_mod and mask_mod: their checks, their evaluation on tiles of indices
    dual.py             dual numbers: d score_mod / d score from the function alone, for the backward
    dual_source.py      the same derivative by a source transformation of score_mod, for the backward kernel
    block_mask.py       the block mask: empty, partial and full tiles; the order stage 1 visits tiles in
    variants.py         ready-made mods: sliding window, prefix-LM, documents, softcap, ALiBi, relative bias
    sinks.py            attention sinks: one logit per head in the softmax, and its gradient

This package imports nothing else of tinyflash.
"""
