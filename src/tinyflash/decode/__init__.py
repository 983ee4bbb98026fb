"""Decoding with a KV cache: split-KV attention (Flash-Decoding), grouped-query attention, a paged cache.

    split_kv.py     split the keys, attend each split, combine the partial (O, lse) exactly (NumPy),
                    and how many splits to take (choose_num_splits)
    paged.py        a paged cache (pages in one pool + a block table per sequence) and its NumPy attention
    kernels/        the split kernels (GQA heads packed into one block; contiguous or paged cache), on
                    the tensor cores and on the CUDA cores, their registry, and the combine kernel
    cuda.py         the public functions on the GPU, cuda_split_kv_attention and cuda_paged_attention (and
                    prepare_split_kv, prepare_paged for a decode loop): the checks, the plans, the launches of
                    both kernels, the combine launched to overlap the split kernel's end on Hopper
    cache_memory.py bytes of a KV cache for a model shape

The combine uses the online softmax's rescaling from ``tinyflash.core.online_softmax``; the
kernels take their runtime from ``tinyflash.gpu``. Lesson 09 walks through all of it.
"""

from .cache_memory import kv_cache_bytes
from .paged import PagedKVCache, paged_attention, to_paged
from .split_kv import choose_num_splits, combine, split_kv_attention

__all__ = ["PagedKVCache", "choose_num_splits", "combine", "kv_cache_bytes", "paged_attention",
           "split_kv_attention", "to_paged"]
