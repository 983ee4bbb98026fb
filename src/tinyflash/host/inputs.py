"""The argument checks every GPU entry point shares, beside the rules of ``tinyflash.core.checks``: where the arrays
live (all on the host or all on the GPU), the 16-bit types the tensor cores take, and the flat views the kernels read.

bfloat16 has no NumPy dtype. It comes as a PyTorch tensor (``torch.bfloat16``); an array whose dtype is named
bfloat16 (``ml_dtypes.bfloat16``) takes the same path. The kernels never convert an element: they move 16-bit
patterns (numba has no bfloat16), and only the tensor cores and the final rounding know which format they are.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..core.checks import BFLOAT16, AttentionProblem, as_array, check_attention_inputs, check_backward_inputs
from ..gpu.arrays import bfloat16_bits, dense, is_device_array, numba_flat

FLOAT16, FLOAT32 = np.dtype(np.float16), np.dtype(np.float32)
CUDA_CORES = (FLOAT16, BFLOAT16, FLOAT32)  # what the CUDA-core kernels take (and compute in float32)


def placed(arrays: dict) -> tuple[dict, bool]:
    """``arrays`` (name -> array), host arrays made NumPy arrays (``core.checks.as_array``), and whether they are
    device arrays. All must be on the GPU or none: a TypeError names them otherwise."""
    names = list(arrays)
    on_device = is_device_array(arrays[names[0]])
    if any(is_device_array(x) != on_device for x in arrays.values()):
        raise TypeError(f"{', '.join(names)} must all be device arrays or all host arrays; got a mix")
    if not on_device:
        arrays = {name: as_array(x, name) for name, x in arrays.items()}
    for name, x in arrays.items():
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array of shape (..., N, d); got {type(x).__name__}")
    return arrays, on_device


def element_type(x) -> str | None:
    """'bfloat16' if ``x`` holds bfloat16 (a PyTorch tensor, or a NumPy array of ml_dtypes), else None."""
    dt = getattr(x, "dtype", None)
    if isinstance(dt, np.dtype):  # NumPy's: ml_dtypes' bfloat16 is a 2-byte kind 'V' (a NumPy dtype's str() is slow)
        return "bfloat16" if dt.kind == "V" and dt.name == "bfloat16" else None
    return "bfloat16" if str(dt).rsplit(".", 1)[-1] == "bfloat16" else None  # 'torch.bfloat16' -> 'bfloat16'


def sixteen_bit(arrays: dict, who: str, instead: str) -> str:
    """'float16' or 'bfloat16', the one 16-bit type of ``arrays`` (name -> array); else a TypeError that names
    the argument, its dtype and where it can go instead (``instead``)."""
    found = {}
    for name, x in arrays.items():
        dt = element_type(x) or str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")
        if dt not in ("float16", "bfloat16"):
            raise TypeError(f"{who} takes float16 or bfloat16; got {name} of dtype {dt} ({instead})")
        found[name] = dt
    if len(set(found.values())) > 1:
        raise TypeError(f"{', '.join(found)} must share one dtype; got {', '.join(f'{n} {t}' for n, t in found.items())}")
    return next(iter(found.values()))


def shape_only(x):
    """A stand-in with ``x``'s shape and dtype float16: the shared checks know no bfloat16, and the
    rules on shapes are the same for both 16-bit types."""
    return SimpleNamespace(shape=tuple(x.shape), dtype=FLOAT16)


def flat16(x):
    """A flat device array of ``x``'s 16-bit elements, in ``x``'s library (NumPy: numba's); bfloat16
    seen as int16 (numba knows no bfloat16; the kernel only moves the bits). On a GPU it is launched
    through the driver, which reads its address (``gpu/driver_launch.py``): no numba view is made."""
    if element_type(x):
        x = bfloat16_bits(x)
    return dense(x) if is_device_array(x) else numba_flat(x)


def bits(x, dtype):
    """``x`` as numba can take it: bfloat16 as its 16-bit patterns (``gpu.arrays.bfloat16_bits``), others as
    they are (``dtype`` is the checked problem's)."""
    return bfloat16_bits(x) if dtype == BFLOAT16 else x


def flat(a):
    """A device array as :func:`numba_flat` makes it; a host array as a flat view of itself, which numba's launch
    copies to the GPU and back (an output written there reaches the caller's array)."""
    return numba_flat(a) if is_device_array(a) else np.asarray(a).reshape(-1)


def as_words(a):
    """A flat array of 16-bit elements as a kernel that reads pairs takes it: uint32 words, two elements each."""
    a = flat(a)
    return a if a.dtype == np.uint32 else a.view(np.uint32)


BACKWARD_NAMES = ("q", "k", "v", "o", "lse", "do")  # a backward call's arrays, in its arguments' order


def backward_arrays(arrays, causal, scale, who: str, instead: str) -> tuple[tuple, bool, str, AttentionProblem]:
    """The checks a tensor-core backward makes of its six arrays (q, k, v, o, lse, do): placed, 16-bit (else a
    TypeError naming ``who`` and ``instead``), every rule of ``check_attention_inputs`` and ``check_backward_inputs``
    (grouped K/V heads taken). Returns (the arrays, whether they are on the GPU, the element type, the problem)."""
    found, on_device = placed(dict(zip(BACKWARD_NAMES, arrays)))
    q, k, v, o, lse, do = found.values()
    element = sixteen_bit({"q": q, "k": k, "v": v, "o": o, "do": do}, who, instead)
    stand_ins = [shape_only(x) for x in (q, k, v, o, do)]
    prob = check_attention_inputs(*stand_ins[:3], causal=causal, scale=scale, allowed=(FLOAT16,))
    check_backward_inputs(prob, stand_ins[4], stand_ins[3], lse, grouped=True)
    return (q, k, v, o, lse, do), on_device, element, prob
