"""The backward pass, stage by stage, with the layout of ``tinyflash.forward``.

    naive.py     stage 0: the textbook gradients through the materialised P (and, in float64, the
                 reference every backward stage is checked against)
    blocked.py   stage 1: FlashAttention-2's backward in NumPy, P recomputed tile by tile from lse
    varlen.py    the backward of packed sequences (varlen_attention_backward), stage 1 sequence by sequence
    cuda.py      stage 2: cuda_attention_backward, on the CUDA cores (main kernel v1)
    tensor_cores.py  tensor_core_attention_backward, on the tensor cores: main kernel v2 (mma.sync), v3
                 (Hopper's wgmma) and v4 (wgmma, warp-specialised, TMA); flex_attention_backward, flex_attention's
                 backward: v2 with score_mod, its derivative, mask_mod and a block mask compiled in
    kernels/     the kernels around the main one (rows.py: D = rowsum(dO ∘ O) before, dQ's finish after),
                 the main kernels v1-v4, their tilings and their registry (which runs by default, where)

cuda.py and tensor_cores.py hold the public functions and their contracts; the checks, the plans and the
launches of the main kernel are the host layer's (``tinyflash.host``).

All take the forward's conventions (q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv), causal
bottom-right aligned through ``tinyflash.core.masks.key_stop``) and return ``(dq, dk, dv)``.
"""
