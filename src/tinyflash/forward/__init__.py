"""The forward pass, stage by stage.

    naive.py     stage 0: the textbook formula (and, in float64, the reference every stage is checked against)
    blocked.py   stage 1: FlashAttention's tiled loop with the online softmax, in NumPy
    cuda.py      stage 2: the host wrapper of the numba.cuda kernels
    kernels/     stage 2's kernels, one file per version, and their registry
"""
