"""The choice made before numba is imported: a real CUDA GPU, or numba's CUDA simulator. Imports no numba.

numba reads ``NUMBA_ENABLE_CUDASIM`` once, when it is imported, so a script that wants the simulator
when there is no GPU must decide first: :func:`use_gpu_or_simulator` decides the way the tests and the
lessons do. (``runtime.py`` asks, once numba is there, which of the two it got.)
"""

from __future__ import annotations

import os


def use_gpu_or_simulator() -> bool:
    """True if kernels will run on a real GPU; else switch numba to its simulator and return False.

    A real GPU is used when ``NUMBA_ENABLE_CUDASIM`` is not set (or is "0") and CuPy sees a CUDA
    device. Otherwise ``NUMBA_ENABLE_CUDASIM=1`` is set, which works only if numba has not been
    imported yet (then every kernel runs in Python on the CPU: correct, and slow).
    """
    gpu = False
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "0":
        try:
            import cupy

            gpu = bool(cupy.cuda.is_available())
        except Exception:  # no CuPy, no driver, no device
            gpu = False
    if not gpu:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return gpu
