"""The forward pass, stage by stage.

    naive.py     stage 0: the textbook formula (and, in float64, the reference every stage is checked against)
    blocked.py   stage 1: FlashAttention's tiled loop with the online softmax, in NumPy
    cuda.py      stage 2: cuda_attention, on the CUDA cores (kernels v1-v5)
    tensor_cores.py  stage 3: tensor_core_attention, on the tensor cores' mma.sync (kernel v6); flex_attention,
                 the same kernel with a score_mod, a mask_mod and a block mask compiled in
    hopper.py    stage 4: hopper_attention, on Hopper's wgmma, TMA, warp specialisation, ping-pong (v7-v10)
    hopper_fp8.py  hopper_fp8_attention: stage 4 on e4m3 inputs with their descales (v11), its own host steps
    varlen.py    packed sequences (varlen_attention): stage 1 sequence by sequence
    fp8.py       fp8_attention: stage 1's loop on e4m3 inputs, as the FP8 kernel (v11) runs it
    kernels/     the kernels, one file per version (v1-v5: stage 2; v6: stage 3; v7-v11: stage 4), their
                 tilings and their registry, whose rules say which version each function runs by default

cuda.py, tensor_cores.py and hopper.py hold the public functions and their contracts; what they do on the CPU
(check the arguments, find the call's plan, allocate, launch) is the host layer's (``tinyflash.host``).
"""
