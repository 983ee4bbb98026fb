"""Launching a kernel over (query tiles × heads), whatever the number of heads.

Every attention kernel here runs one thread block per (query tile, batch·head): ``blockIdx.x``
is the query tile, ``blockIdx.y`` the head, so that the blocks the GPU starts one after another
share one head's K and V in the L2 cache. CUDA allows at most 65,535 blocks along y, and
B × H can be more (B = 1024, H = 128 is 131,072). :func:`launch` then launches once per 65,535
heads, on views of the flat arrays that start at the first head of the slice: a kernel never
needs to know.

A kernel's arguments travel by name (:class:`LaunchArgs`): the host wrapper names each value once and a
kernel takes those of its parameters (:func:`by_name`). :class:`Tiling` is what every kernel's tiling
shares (its checks, and the shared memory a block may have), :func:`tiling_for` picks and checks one.

On numba's simulator, where one Python thread runs each CUDA thread, :func:`launch` also says what a
launch will cost before it starts: a warning (once per process) before a long one, with the
expected order of time, and a progress bar of finished thread blocks while it runs (see
:func:`tinyflash.gpu.runtime.simulator_cost`).
"""

from __future__ import annotations

import functools
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

from ..hardware import current
from .runtime import SIMULATOR_PROGRESS_WORK, SIMULATOR_WARN_WORK, simulator_cost, simulator_enabled
from .smem import allow_large_shared_memory

MAX_GRID_Y = 65_535  # CUDA's limit on gridDim.y


class SharedMemoryRefused(RuntimeError):
    """The driver would not let a kernel use the shared memory its tiling needs."""


class SimulatorSlowWarning(UserWarning):
    """A launch on numba's CUDA simulator that will take long."""


_warned_slow = False  # the slow-simulator warning is given once per process


@dataclass(frozen=True)
class LaunchArgs:
    """A kernel's arguments by the names of its parameters: flat arrays with their elements per head, and
    scalars. A kernel is given those of its parameters (:func:`by_name`): the host wrappers name every value
    once, whatever a kernel version takes of them."""

    arrays: dict  # parameter name -> (flat device array, elements per head)
    scalars: dict  # parameter name -> value
    n_heads: int  # batch · heads: the blocks along y
    kv_group: int = 1  # query heads per K/V head (GQA); kernels read K/V head `head // kv_group`
    kv_arrays: tuple = ("K", "V")  # the arrays with one matrix per K/V head
    # when the grid runs over K/V heads instead (a backward kernel sums dK, dV over a group): the arrays with
    # kv_group matrices per head of the grid (Q, dO, lse, ...); K, V, dK, dV then have one per head of the grid
    group_arrays: tuple = ()
    # arrays made for each launch from its views: (name, fn(views, heads) -> array), heads the launch's heads (the
    # TMA kernels' tensor maps, which hold the addresses of the views)
    derived: tuple = ()


def parameters(kernel) -> tuple:
    """The names of a numba kernel's parameters, in order (those of its Python function)."""
    code = kernel.py_func.__code__
    return code.co_varnames[:code.co_argcount]


def by_name(kernel, values: dict) -> tuple:
    """The arguments of ``kernel`` in the order of its parameters, taken from ``values`` by name."""
    names = parameters(kernel)
    missing = [n for n in names if n not in values]
    if missing:
        raise TypeError(f"{kernel.py_func.__name__} takes {', '.join(names)}; no value for {', '.join(missing)}")
    return tuple(values[n] for n in names)


class Tiling:
    """What every tiling of a kernel shares: ``validate()`` returns it when it has no problems, else raises a
    ValueError naming them; a tiling's own ``shape_problems()``, and shared memory beyond what a block may have
    on this GPU (``tinyflash.hardware``). A subclass is a frozen dataclass with ``smem_bytes`` and ``WHAT``."""

    WHAT = "tiling"

    def shape_problems(self) -> list:
        return []

    def problems(self) -> list:
        problems = list(self.shape_problems())
        if self.smem_bytes > current().smem_per_block:
            problems.append(f"needs {self.smem_bytes} bytes of shared memory; a block may have "
                            f"{current().smem_per_block}")
        return problems

    def validate(self):
        problems = self.problems()
        if problems:
            raise ValueError(f"invalid {self.WHAT} {self}: {'; '.join(problems)}")
        return self


def tiling_for(config, default, simulator, d: int, d_v: int):
    """``config``, or else the tiling ``default(d, dv)`` on a GPU and ``simulator(d, dv)`` on the simulator:
    validated, and checked to cover head dims d and dv (its D and DV)."""
    cfg = (config or (simulator if simulator_enabled() else default)(d, d_v)).validate()
    if cfg.D < d or cfg.DV < d_v:
        raise ValueError(f"config {cfg} is too small for d={d}, dv={d_v}")
    return cfg


def simulator_aware(launch_heads):
    """``launch_heads`` with, on the simulator only, :func:`simulator_progress` and
    :func:`simulator_float_rules` around it; ``key_tiles=`` (the key/value tiles each thread walks,
    default 1) is only used to tell the simulator's cost. On a GPU it adds nothing."""

    @functools.wraps(launch_heads)
    def launch(kernel, n_tiles: int, threads: int, smem_bytes: int, args: LaunchArgs, *more, key_tiles: int = 1,
               **options):
        with simulator_progress(n_tiles * args.n_heads, threads, key_tiles), simulator_float_rules():
            return launch_heads(kernel, n_tiles, threads, smem_bytes, args, *more, **options)

    return launch


@simulator_aware  # on the simulator: a warning before a long launch, a progress bar, IEEE NaN/inf without warnings
def launch(kernel, n_tiles: int, threads: int, smem_bytes: int, args: LaunchArgs) -> None:
    """Run ``kernel[(n_tiles, heads), threads, 0, smem_bytes](...)`` for all heads, its arguments by name.

    The kernel finds head ``blockIdx.y`` of each flat array at ``blockIdx.y · elements per head``.
    More than 48 KiB of shared memory is asked for first; if the driver refuses,
    :class:`SharedMemoryRefused` is raised before anything runs.
    """
    arrays = {name: a for name, (a, _) in args.arrays.items()}
    whole = by_name(kernel, {**arrays, **{name: make(arrays, args.n_heads) for name, make in args.derived},
                             **args.scalars})
    try:
        allow_large_shared_memory(kernel, whole, smem_bytes)
    except Exception as exc:
        raise SharedMemoryRefused(f"could not enable {smem_bytes} bytes of shared memory ({exc})") from exc
    g = args.kv_group
    over_kv = bool(args.group_arrays)  # the grid's heads are K/V heads, each with g query heads
    if g > MAX_GRID_Y and not over_kv:
        raise ValueError(f"kv_group (query heads per K/V head) must be at most {MAX_GRID_Y}; got {g}")
    step = MAX_GRID_Y if over_kv else MAX_GRID_Y - MAX_GRID_Y % g  # heads per launch: a multiple of kv_group
    for h0 in range(0, args.n_heads, step):
        heads = min(step, args.n_heads - h0)
        views = {}  # heads h0 .. h0 + heads - 1 of each array (K/V heads h0 / g .. (h0 + heads) / g - 1)
        for name, (a, size) in args.arrays.items():
            if name in args.group_arrays:
                first, count = h0 * g, heads * g
            elif name in args.kv_arrays and not over_kv:
                first, count = h0 // g, heads // g
            else:
                first, count = h0, heads
            views[name] = a[first * size:(first + count) * size]
        views.update({name: make(views, heads) for name, make in args.derived})
        kernel[(n_tiles, heads), threads, 0, smem_bytes](*by_name(kernel, {**views, **args.scalars}))


@contextmanager
def simulator_float_rules():
    """On the simulator, NaN and ±inf arithmetic (inf - inf = NaN) without NumPy's warnings.

    The simulator computes with NumPy scalars, which warn where a GPU silently follows IEEE 754;
    the results are the same. The filter is process-wide, so the simulator's threads see it.
    """
    if not simulator_enabled():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"invalid value encountered", RuntimeWarning)
        yield


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} minutes" if seconds < 5400 else f"{seconds / 3600:.1f} hours"


@contextmanager
def simulator_progress(blocks: int, threads: int, key_tiles: int):
    """On the simulator: warn before a long launch, and count its finished blocks in a progress bar.

    Nothing happens on a GPU, or for a launch of fewer than SIMULATOR_PROGRESS_WORK threads × key tiles.
    """
    global _warned_slow
    work, seconds = simulator_cost(blocks * threads, key_tiles)
    if not simulator_enabled() or work < SIMULATOR_PROGRESS_WORK:
        yield
        return
    if work >= SIMULATOR_WARN_WORK and not _warned_slow:
        _warned_slow = True
        warnings.warn(f"numba's CUDA simulator will run {blocks * threads:,} CUDA threads × {key_tiles} key tiles "
                      f"= {work:,} thread-tiles: of the order of {_duration(seconds)} at its measured rate (one "
                      "Python thread per CUDA thread; it varies with the CPU and the kernel). On a GPU this takes "
                      "milliseconds; on the simulator, smaller inputs (Nq, Nk ≤ 64, a few heads) run in seconds. "
                      "(Warned once.)", SimulatorSlowWarning, stacklevel=4)
    from numba.cuda.simulator import kernel as sim  # the simulator runs a launch block by block
    from tqdm import tqdm

    plain = getattr(sim, "BlockManager", None)
    if plain is None:  # another numba version: no progress bar, the warning above still stands
        yield
        return
    bar = tqdm(total=blocks, unit="block", desc=f"simulator, ~{_duration(seconds)}", leave=False)

    class CountedBlocks(plain):
        def run(self, *args, **kwargs):
            result = super().run(*args, **kwargs)
            bar.update()
            return result

    sim.BlockManager = CountedBlocks  # the simulator looks the class up for each block it runs
    try:
        yield
    finally:
        sim.BlockManager = plain
        bar.close()
