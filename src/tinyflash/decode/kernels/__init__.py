"""The kernels of decoding, and the registry that lists the split kernels (like ``tinyflash.forward.kernels``).

    split.py          what every split kernel shares: a split's keys, a key's row (contiguous or paged),
                      what the host needs to launch one (SplitKernel)
    tensor_cores.py   the split kernel on the tensor cores: one warp per block of 16 packed rows, a warp tile of v6
    cuda_cores.py     the split kernel on the CUDA cores: float32 arithmetic on float16, bfloat16 or float32, d <= 256
    combine.py        the combine kernel: the splits' partials merged exactly into O and lse

:data:`VERSIONS` registers each split kernel once (its ``build`` is its ``split_kernel``: what the host needs to
launch it, ``split.SplitKernel``): ``cuda_split_kv_attention(kernel=...)``, the tests and the benchmark iterate over
it; without a name a call runs the first that takes its inputs (the registry's rule).
"""

from __future__ import annotations

from ...host.registry import Default, KernelVersion, Registry
from ...warp_tile import head_dims_text
from . import cuda_cores, tensor_cores

VERSIONS = Registry("decode kernel", (
    KernelVersion("tensor_cores", tensor_cores, "one warp per block of 16 packed rows: S = Q K_jᵀ and P V_j on the "
                  "tensor cores (mma.sync), K_j, V_j by ldmatrix from a cp.async ring", tensor_cores.split_kernel,
                  options=("tiling", "merge"), dtypes=("float16", "bfloat16"), head_dims=tensor_cores.HEAD_DIMS, stage=3),
    KernelVersion("cuda_cores", cuda_cores, "key slots of lanes on the CUDA cores, float32 arithmetic, a cp.async "
                  "ring of K/V tiles, the slots' states merged at the end", cuda_cores.split_kernel,
                  options=("threads", "unroll", "row_bytes", "max_registers"),
                  dtypes=("float16", "bfloat16", "float32"), max_head_dim=None, stage=2),
), defaults=[Default(entry, name) for entry in ("cuda_split_kv_attention", "cuda_paged_attention")
             for name in ("tensor_cores", "cuda_cores")])  # the first that takes the inputs


def choose(prob, name: str | None = None, entry: str = "cuda_split_kv_attention") -> KernelVersion:
    """The split kernel ``name`` for the problem ``prob`` (a ValueError says why it cannot), or, without a name,
    the registry's rule: the first that takes it (the tensor cores for 16-bit inputs at their head dims)."""
    if name is not None and name not in VERSIONS:
        raise ValueError(f"kernel must be one of {', '.join(VERSIONS)} (None: the first that takes the inputs); "
                         f"got {name!r}")
    if prob.d != prob.d_v:
        raise ValueError(f"the decode kernels need dv == d; got d={prob.d}, dv={prob.d_v}")
    if name is None:
        return VERSIONS.default(entry, prob.dtype, prob.d, prob.d_v)
    if not VERSIONS[name].accepts(prob.dtype, prob.d, prob.d_v):
        kernel = VERSIONS[name]
        dims = f" with d = dv {head_dims_text(kernel.head_dims)}" if kernel.head_dims else ""
        raise ValueError(f"the {kernel.name} decode kernel takes {' or '.join(kernel.dtypes)}{dims}; got "
                         f"{prob.dtype}, d={prob.d} (kernel=None: the first kernel that takes them)")
    return VERSIONS[name]
