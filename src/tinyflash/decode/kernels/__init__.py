"""The kernels of decoding, and the registry that lists the split kernels (like ``tinyflash.forward.kernels``).

    split.py          what every split kernel shares: a split's keys, a key's row (contiguous or paged),
                      what the host needs to launch one (SplitKernel)
    tensor_cores.py   the split kernel on the tensor cores: one warp per block of 16 packed rows, a warp tile of v6
    cuda_cores.py     the split kernel on the CUDA cores: float32 arithmetic on float16, bfloat16 or float32, d <= 256
    combine.py        the combine kernel: the splits' partials merged exactly into O and lse

:data:`VERSIONS` registers each split kernel once: ``cuda_split_kv_attention(kernel=...)``, the tests
and the benchmark iterate over it; without a name a call runs the first that takes its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...warp_tile import head_dims_text
from . import cuda_cores, tensor_cores


@dataclass(frozen=True)
class DecodeKernel:
    """One registered split kernel."""

    name: str
    module: str  # its file in tinyflash/decode/kernels/
    what: str  # one line on what it does
    split_kernel: Callable  # split_kernel(prob, page_size, **options) -> split.SplitKernel
    options: tuple  # the tuning keywords it takes
    dtypes: tuple  # input dtypes it takes, by name
    head_dims: tuple | None = None  # the only d (= dv) it takes; None: any its split_kernel allows

    def accepts(self, dtype, d: int, d_v: int) -> bool:
        """Whether this kernel computes inputs of ``dtype`` (a NumPy dtype or a name) and head dims d, dv."""
        return str(dtype) in self.dtypes and d == d_v and (self.head_dims is None or d in self.head_dims)


VERSIONS = {k.name: k for k in (
    DecodeKernel("tensor_cores", "tensor_cores.py", "one warp per block of 16 packed rows: S = Q K_jᵀ and P V_j on the "
                 "tensor cores (mma.sync), K_j, V_j by ldmatrix from a cp.async ring", tensor_cores.split_kernel,
                 ("tiling", "merge"), ("float16", "bfloat16"), tensor_cores.HEAD_DIMS),
    DecodeKernel("cuda_cores", "cuda_cores.py", "key slots of lanes on the CUDA cores, float32 arithmetic, a cp.async "
                 "ring of K/V tiles, the slots' states merged at the end", cuda_cores.split_kernel,
                 ("threads", "unroll", "row_bytes", "max_registers"), ("float16", "bfloat16", "float32")),
)}


def choose(prob, name: str | None = None) -> DecodeKernel:
    """The split kernel ``name`` for the problem ``prob`` (a ValueError says why it cannot), or, without a
    name, the first registered one that takes it."""
    if name is not None and name not in VERSIONS:
        raise ValueError(f"kernel must be one of {', '.join(VERSIONS)} (None: the first that takes the inputs); "
                         f"got {name!r}")
    if prob.d != prob.d_v:
        raise ValueError(f"the decode kernels need dv == d; got d={prob.d}, dv={prob.d_v}")
    found = [VERSIONS[name]] if name else list(VERSIONS.values())
    for kernel in found:
        if kernel.accepts(prob.dtype, prob.d, prob.d_v):
            return kernel
    kernel = found[0]
    dims = f" with d = dv {head_dims_text(kernel.head_dims)}" if kernel.head_dims else ""
    raise ValueError(f"the {kernel.name} decode kernel takes {' or '.join(kernel.dtypes)}{dims}; got {prob.dtype}, "
                     f"d={prob.d} (kernel=None: the first kernel that takes them)")
