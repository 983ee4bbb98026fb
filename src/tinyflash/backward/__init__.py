"""The backward pass, stage by stage, with the layout of ``tinyflash.forward``.

    naive.py     stage 0: the textbook gradients through the materialised P (and, in float64, the
                 reference every backward stage is checked against)
    blocked.py   stage 1: FlashAttention-2's backward in NumPy, P recomputed tile by tile from lse
    cuda.py      stage 2: the host wrapper of the numba.cuda kernels
    kernels/     stage 2's kernels (D = rowsum(dO ∘ O), the main kernel, dQ's finish) and their registry

All take the forward's conventions (q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv), causal
bottom-right aligned through ``tinyflash.core.masks.key_stop``) and return ``(dq, dk, dv)``.
"""
