"""Decoding with a KV cache: not built yet.

It will live here: split-KV attention (each split computes a partial (o, lse) over a slice of the
cache, and a combine step merges them with the online softmax's rescaling from
``tinyflash.core.online_softmax``), grouped-query attention and a paged cache, in NumPy first and
then as numba.cuda kernels in ``decode/kernels/``, with the runtime from ``tinyflash.gpu``.
"""
