"""Where kernels run, and two small conventions every kernel shares.

* :func:`simulator_enabled`: numba runs kernels on a real GPU, or on its CUDA simulator (one
  Python thread per CUDA thread) when ``NUMBA_ENABLE_CUDASIM=1`` was set before numba was imported.
* :func:`device_function`: compile a plain Python function (the causal rule of
  ``tinyflash.core.masks``, say) as a device function, so that NumPy code and kernels run the
  same lines.
* :func:`u`: a compile-time constant as an unsigned 64-bit integer. The kernels index with
  unsigned integers: numba adds a negative-index wraparound check to every signed index, which
  costs registers and hides the alignment that vector loads need.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda


def simulator_enabled() -> bool:
    """True when numba runs kernels on its CPU simulator instead of a GPU."""
    return bool(config.ENABLE_CUDASIM)


def device_function(fn):
    """``fn`` compiled as a device function, inlined into every kernel that calls it."""
    return cuda.jit(device=True, inline="always")(fn)


def u(x: int) -> np.uint64:
    """A compile-time constant as an unsigned 64-bit integer (see the module docstring)."""
    return np.uint64(x)
