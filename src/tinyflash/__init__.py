"""tinyflash: FlashAttention explained by running it.

Stages, each checked against the one before and against a float64 reference:

0. :func:`naive_attention` — the textbook formula, materialising S and P (NumPy).
1. :func:`blocked_attention` — FlashAttention's tiles and online softmax (NumPy).
2. :func:`cuda_attention` — the same loop as numba.cuda kernels with shared-memory tiles.
3. :func:`tensor_core_attention` — the same loop on the tensor cores (float16, bfloat16), with
   PTX instructions emitted from numba.
4. :func:`hopper_attention` — the same loop with Hopper's warpgroup multiplies (``wgmma``), on
   compute capability 9.0.

All return ``(o, lse)`` for q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv). The backward pass
(``*_attention_backward``, and :mod:`tinyflash.torch` for PyTorch autograd) and decoding with a KV
cache (``split_kv_attention``, ``paged_attention`` and their ``cuda_`` kernels) follow the same
conventions. Attention as models write it: ``score_mod=``, ``mask_mod=`` and ``sinks=`` on stages 0 and 1,
:func:`create_block_mask` and the ready-made variants (:func:`sliding_window`, :func:`document_mask`,
:func:`softcap`, :func:`alibi`, ...), :func:`flex_attention` (the same functions compiled into stage 3's kernel,
stage 4's on Hopper; its backward :func:`flex_attention_backward`, the derivative of score_mod by a source
transformation) and :func:`varlen_attention` (packed sequences without padding). FP8, emulated in NumPy: :func:`quantize_fp8` (e4m3 inputs and their descale factors, per
tensor, head or block, optionally rotated) and :func:`fp8_attention` (stage 1's loop on them, as the FP8
kernel runs it); :func:`hopper_fp8_attention` runs that kernel (stage 4 on e4m3 inputs, kernel v11).

The package is the book; each folder holds one idea:

    core/       the rules of the mathematics, each written once: input checks, the causal mask,
                the online softmax, the tolerance rules; masks and score modifications as Python
                functions (mods, dual numbers, the block mask, ready-made variants, sinks)
    cost/       what attention costs in bytes: the memory of each array, the traffic to and from HBM
    forward/    the forward pass: naive.py, blocked.py, cuda.py (stage 2), tensor_cores.py (stage 3),
                hopper.py (stage 4), kernels/ (the kernel versions v1-v10 and their registry)
    backward/   the backward pass, laid out like forward/
    decode/     decoding with a KV cache: split-KV, grouped-query attention, a paged cache
    host/       what every GPU entry point does on the CPU, written once: the argument checks, the plan
                cache, the registry type and its default rules, the launches; under the public functions
                of forward/, backward/ and decode/, above their kernels and gpu/
    gpu/        the GPU runtime, no attention mathematics: arrays, shared memory, loads, launches, PTX
    warp_tile.py  a warp's tile on the tensor cores (fragments, softmax step, P·V, epilogue), for every
                tensor-core kernel; warpgroup_tile.py, a warpgroup's (wgmma), for the stage-4 kernels
    hardware.py the GPU's facts, asked of the device where it can be
    torch.py    PyTorch custom operators and autograd over the kernels

Beside the book, the tooling: ``python -m tinyflash.bench`` (benchmarks: check, time, record) and
``python -m tinyflash.plots`` (the figures), which no teaching module imports.
"""

from .backward.blocked import blocked_attention_backward
from .backward.naive import naive_attention_backward, reference_attention_backward
from .backward.varlen import varlen_attention_backward
from .core.block_mask import BlockMask, create_block_mask
from .core.masks import causal_mask
from .core.online_softmax import OnlineSoftmax, online_softmax
from .core.quantize import FP8Inputs, quantize_fp8
from .core.variants import alibi, document_mask, prefix_lm, relative_bias, sliding_window, softcap
from .cost.memory import attention_memory, format_bytes, measure_peak_bytes, tile_bytes
from .cost.traffic import HBMCounter
from .decode.cache_memory import kv_cache_bytes
from .decode.paged import PagedKVCache, paged_attention, to_paged
from .decode.split_kv import split_kv_attention
from .forward.blocked import blocked_attention
from .forward.fp8 import fp8_attention
from .forward.naive import naive_attention, reference_attention
from .forward.varlen import varlen_attention

# The GPU stages import numba, which is slow to import and must see NUMBA_ENABLE_CUDASIM before it is
# imported: they are loaded on first use (module __getattr__), from these modules.
_ON_FIRST_USE = {
    "cuda_attention": "forward.cuda",
    "tensor_core_attention": "forward.tensor_cores",
    "flex_attention": "forward.tensor_cores",
    "hopper_attention": "forward.hopper",
    "hopper_fp8_attention": "forward.hopper_fp8",
    "cuda_attention_backward": "backward.cuda",
    "tensor_core_attention_backward": "backward.tensor_cores",
    "flex_attention_backward": "backward.tensor_cores",
    "cuda_split_kv_attention": "decode.cuda",
    "cuda_paged_attention": "decode.cuda",
}

__all__ = sorted([
    "BlockMask", "FP8Inputs", "HBMCounter", "OnlineSoftmax", "PagedKVCache", "alibi", "attention_memory",
    "blocked_attention", "blocked_attention_backward", "causal_mask", "create_block_mask", "document_mask",
    "format_bytes", "fp8_attention", "kv_cache_bytes", "measure_peak_bytes", "naive_attention",
    "naive_attention_backward", "online_softmax", "paged_attention", "prefix_lm", "quantize_fp8",
    "reference_attention", "reference_attention_backward", "relative_bias", "sliding_window", "softcap",
    "split_kv_attention", "tile_bytes", "to_paged", "varlen_attention", "varlen_attention_backward",
    *_ON_FIRST_USE,
])
__version__ = "0.1.0"


def __getattr__(name):
    if name in _ON_FIRST_USE:
        from importlib import import_module

        return getattr(import_module(f".{_ON_FIRST_USE[name]}", __name__), name)
    raise AttributeError(f"module 'tinyflash' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_ON_FIRST_USE))
