"""The runtime every kernel shares, once numba is imported: is there a GPU, what does the simulator cost, two
small conventions.

* :func:`require_gpu`: what every GPU entry point calls once its arguments are checked. It returns at once
  when a CUDA GPU is there or numba's simulator is on, and otherwise raises :class:`NoGPUError`, one message
  that says what to do, instead of numba's chained driver traceback.
* :func:`require_compute_capability`: the check before a kernel that needs newer instructions (the tensor
  cores' ``mma.sync`` on 16-bit inputs, ``cp.async``: compute capability 8.0) is compiled or launched: one
  clear error instead of a compiler or driver failure.
* :func:`simulator_enabled`: numba runs kernels on a real GPU, or on its CUDA simulator (one
  Python thread per CUDA thread) when ``NUMBA_ENABLE_CUDASIM=1`` was set before numba was imported.
* :func:`simulator_cost`: what a launch will cost on the simulator; ``gpu/launch.py`` warns before
  a long one and shows its progress.
* :func:`join_simulator_threads`: after a simulated kernel raised, wait for its other threads. numba
  raises the first thread's error at once and lets the others run on to their next barrier; until they
  end, each module whose device function one of them is in still has numba's fake ``cuda`` in place of
  the real one, so a kernel compiled there meanwhile fails with "'FakeCUDAModule' object has no
  attribute 'jit'". The tests call it after each test.
* :func:`device_function`: compile a plain Python function (the causal rule of
  ``tinyflash.core.masks``, say) as a device function, so that NumPy code and kernels run the
  same lines.
* :func:`u`: a compile-time constant as an unsigned 64-bit integer. The kernels index with
  unsigned integers: numba adds a negative-index wraparound check to every signed index, which
  costs registers and hides the alignment that vector loads need.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from numba import config, cuda

NO_GPU_MESSAGE = (
    "no CUDA GPU was found (numba could not load a CUDA driver or sees no device), and numba's CUDA "
    "simulator is off. To run the kernels on the CPU instead, on numba's simulator (correct but slow: one "
    "Python thread per CUDA thread, seconds for 64 queries × 64 keys), set NUMBA_ENABLE_CUDASIM=1 before "
    "Python starts, e.g.  NUMBA_ENABLE_CUDASIM=1 python your_script.py  (setting os.environ after numba "
    "has been imported does not work: numba reads it once, at import)")

# The simulator's speed: the time one CUDA thread takes for one key/value tile, nearly independent of d
# (switching between the Python threads dominates), the order of magnitude of the rows that
# `NUMBA_ENABLE_CUDASIM=1 python benchmarks/simulator_rate.py` measured (figures/data/simulator_rate.csv).
# So a launch's work is counted in threads × key tiles:
SIMULATOR_SECONDS_PER_THREAD_TILE = 5e-3
SIMULATOR_PROGRESS_WORK = 1_000  # threads × key tiles (about 5 s) above which a launch shows progress
SIMULATOR_WARN_WORK = 12_000  # ... and above which it warns first, once per process (about a minute)

_gpu_seen = False  # a GPU found once stays found: require_gpu is then one comparison


class NoGPUError(RuntimeError):
    """No CUDA GPU, and numba's simulator is off (see :data:`NO_GPU_MESSAGE`)."""


def simulator_enabled() -> bool:
    """True when numba runs kernels on its CPU simulator instead of a GPU."""
    return bool(config.ENABLE_CUDASIM)


def require_gpu() -> None:
    """Return if kernels can run here (a CUDA GPU, or numba's simulator); else raise NoGPUError.

    Every GPU entry point calls this before it touches CUDA. Cheap: after the first success it is
    one comparison; without a GPU, numba remembers its failed driver initialisation.
    """
    global _gpu_seen
    if _gpu_seen or simulator_enabled():
        return
    if not cuda.is_available():  # False, not an exception, when the driver library is missing
        raise NoGPUError(NO_GPU_MESSAGE)
    _gpu_seen = True


class UnsupportedGPUError(RuntimeError):
    """The GPU lacks an instruction a kernel needs (its compute capability is too low)."""


_capabilities: dict = {}  # device id -> (major, minor)


def compute_capability() -> tuple[int, int]:
    """The current device's compute capability, (major, minor); asked once per device."""
    device = cuda.get_current_device()
    if device.id not in _capabilities:
        _capabilities[device.id] = tuple(device.compute_capability)
    return _capabilities[device.id]


def require_compute_capability(minimum: tuple[int, int], who: str) -> None:
    """Return if the current GPU has compute capability ``minimum`` or more (always on the simulator, which
    emulates every instruction); else raise :class:`UnsupportedGPUError` naming ``who``, the device and what
    it needs."""
    if simulator_enabled():
        return
    found = compute_capability()
    if found < tuple(minimum):
        name = getattr(cuda.get_current_device(), "name", "GPU")
        name = name.decode() if isinstance(name, bytes) else name
        raise UnsupportedGPUError(
            f"{who} needs a GPU of compute capability {minimum[0]}.{minimum[1]} or newer (Ampere, Ada, Hopper, ...): "
            f"the instructions it is built on (cp.async, ldmatrix, mma.sync) do not exist before; this {name} has "
            f"{found[0]}.{found[1]}. tinyflash.cuda_attention and cuda_attention_backward (the CUDA cores) run there")


def require_exact_compute_capability(needed: tuple[int, int], who: str, instructions: str, instead: str) -> None:
    """Return if the current GPU's compute capability is exactly ``needed`` (always on the simulator); else raise
    :class:`UnsupportedGPUError` naming ``who``, the device, the ``instructions`` that exist only there (an
    architecture-specific target such as ``sm_90a``, whose code runs on that compute capability alone) and what
    runs ``instead``."""
    if simulator_enabled():
        return
    found = compute_capability()
    if found != tuple(needed):
        name = getattr(cuda.get_current_device(), "name", "GPU")
        name = name.decode() if isinstance(name, bytes) else name
        raise UnsupportedGPUError(
            f"{who} needs a GPU of compute capability {needed[0]}.{needed[1]} exactly: {instructions}; this {name} "
            f"has {found[0]}.{found[1]}. {instead}")


def simulator_cost(threads: int, key_tiles: int) -> tuple[int, float]:
    """(work, seconds) of a launch on the simulator: work = threads × key tiles each thread walks,
    seconds its order of magnitude at :data:`SIMULATOR_SECONDS_PER_THREAD_TILE`."""
    work = int(threads) * max(1, int(key_tiles))
    return work, work * SIMULATOR_SECONDS_PER_THREAD_TILE


def join_simulator_threads(timeout: float = 300.0) -> bool:
    """Wait up to ``timeout`` seconds for the simulator's CUDA threads still running (those of a kernel
    that raised: see the module docstring); True when none is left. On a GPU: True at once."""
    deadline = time.monotonic() + timeout
    # numba.cuda.simulator.kernel's BlockThread: the thread of one CUDA thread
    threads = [t for t in threading.enumerate() if type(t).__name__ == "BlockThread"]
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def device_function(fn):
    """``fn`` compiled as a device function, inlined into every kernel that calls it."""
    return cuda.jit(device=True, inline="always")(fn)


def u(x: int) -> np.uint64:
    """A compile-time constant as an unsigned 64-bit integer (see the module docstring)."""
    return np.uint64(x)
