"""The backward pass: not built yet.

It will live here with the layout of ``tinyflash.forward``: a naive stage (gradients through the
materialised P, and in float64 the reference), a blocked NumPy stage that recomputes P from the
saved lse tile by tile, and numba.cuda kernels in ``backward/kernels/``, one file per version,
registered like the forward ones. It will take its rules from ``tinyflash.core`` (the causal
mask, the tolerance rule for gradients) and its runtime from ``tinyflash.gpu``.
"""
