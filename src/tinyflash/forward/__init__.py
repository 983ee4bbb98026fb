"""The forward pass, stage by stage.

    naive.py     stage 0: the textbook formula (and, in float64, the reference every stage is checked against)
    blocked.py   stage 1: FlashAttention's tiled loop with the online softmax, in NumPy
    cuda.py      stage 2: the host wrapper of the numba.cuda kernels
    tensor_cores.py  stage 3: the host wrapper of the tensor-core kernel (v6)
    kernels/     the kernels, one file per version (v1-v5: stage 2; v6: stage 3), and their registry
"""
