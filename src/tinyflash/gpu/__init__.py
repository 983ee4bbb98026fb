"""The GPU runtime: everything a kernel needs that is not attention.

    where.py     the choice made before numba is imported: a GPU, or numba's simulator
    runtime.py   require_gpu() (every GPU entry point calls it once its arguments are checked), the
                 simulator's cost, compiling a plain function as a device function, unsigned constants
    arrays.py    device arrays in and out: NumPy, CuPy, numba and PyTorch inputs, outputs of the same kind
    smem.py      the block's dynamic shared memory, and the permission to use more than 48 KiB of it
    loads.py     copying a tile of a (heads, N, d) array from global into shared memory (vector loads)
    launch.py    a kernel's arguments by name, the checks every tiling shares, sizing the grid and
                 launching (more than 65,535 heads included); on the simulator a warning before a long
                 launch and a progress bar
    driver_launch.py   a compiled kernel launched through the driver's cuLaunchKernel, without numba's
                 per-call work (the host's time counts where kernels are short)
    host_only.py a kernel that launches nothing: the host's part of a call, tested or timed without a GPU
    ptx.py       tensor-core PTX instructions (mma.sync, ldmatrix, cp.async, cvt), one function each
    ptx_emulation.py   the same instructions emulated for numba's simulator, and their fragment layouts
    wgmma.py     Hopper's warpgroup multiply (wgmma: fence, mma_async on 16-bit or e4m3 inputs, commit, wait),
                 its shared-memory descriptors and the 128-byte swizzle; wgmma_emulation.py emulates them
                 (asynchrony included)
    tma.py       Hopper's tensor memory accelerator (TMA copies), mbarriers, setmaxnreg and named barriers;
                 tma_emulation.py emulates them (barrier phases and transaction bytes included)
    fp8.py       the FP8 conversions (cvt: two float32 to an e4m3 pair, an e4m3 pair to two float16);
                 fp8_emulation.py emulates them
    tensor_map.py  the host's side of TMA: tensor maps encoded by the driver (a Python description on the
                 simulator), kept per array address

Nothing here knows the softmax, the mask or the tiles of attention: the kernels import these pieces,
and the attention mathematics from ``tinyflash.core`` (and, on the tensor cores, ``tinyflash.warp_tile``).
The GPU's facts are ``tinyflash.hardware``'s.

Importing this package checks first that numba-cuda can work with the installed NumPy.
"""

import numpy as np


def _check_numpy_for_numba_cuda() -> None:
    """numba-cuda 0.30.4 calls np.row_stack, which numpy 2.5 removed: fail early and clearly."""
    major, minor = (int(p) for p in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 5) and not hasattr(np, "row_stack"):
        raise ImportError(f"tinyflash's CUDA stage needs numpy < 2.5 (numba-cuda 0.30.4 calls np.row_stack, "
                          f"removed in numpy 2.5); this environment has numpy {np.__version__}. "
                          "Install it with: pip install 'numpy<2.5'")


_check_numpy_for_numba_cuda()
