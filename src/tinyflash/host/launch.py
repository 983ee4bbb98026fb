"""Launching a kernel version through numba: host arrays (copied to the GPU and back), numba's device arrays,
numba's simulator, more heads than one grid holds. Device arrays on a GPU go through the driver instead
(``host/sized.py``), by the same functions.

What a version builds and how it is sized come from its registry entry (``host/registry.py``): ``build``, its
``tilings`` (on a GPU, on the simulator, and a fallback) and the arguments its kernel reads; the grid and its
launches are ``gpu/launch.py``'s (one block per (tile, head), once per 65,535 heads). Three kinds of kernels:

* the CUDA cores' (forward v1-v5, backward v1): arrays of the inputs' type, one block per query tile (forward) or
  key tile (backward) and head (:func:`launch_cuda_cores`);
* the forward on the tensor cores (v6-v10): 16-bit arrays read as words of two values, or through TMA tensor maps,
  one block per query tile and head (:func:`launch_tensor_cores`);
* the backward on the tensor cores (v2-v4): one block per key tile and K/V head, which walks the query tiles of
  its group of query heads (:func:`launch_backward_tensor_cores`).
"""

from __future__ import annotations

import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import numpy as np

from ..gpu.arrays import is_device_array
from ..gpu.launch import MAX_GRID_Y, LaunchArgs, SharedMemoryRefused, launch, tiling_for
from ..gpu.runtime import simulator_enabled
from ..gpu.tensor_map import tensor_maps
from ..warp_tile import head_dims_text
from .inputs import as_words, flat
from .registry import SIXTEEN_BIT, KernelVersion, dtype_name
from .sized import sized_forward

# the backward's arrays with one matrix per query head (the rest, K, V, dK, dV, one per K/V head)
QUERY_ARRAYS = ("Q", "dO", "LSE", "Dvec", "dQ_acc", "dQ_turn")


def launch_cuda_cores(version: KernelVersion, args: LaunchArgs, prob, config=None, *, over_keys: bool = False,
                      **options) -> None:
    """One block of cfg.NT threads per (query tile of cfg.BR rows, head), or with ``over_keys`` per (key tile of
    cfg.BC keys, head), of ``version.build(cfg, dtype, **options)``; ``config=None`` takes the version's tiling on
    a GPU (on the simulator, its small one). If the driver refuses the tiling's shared memory and the version has a
    fallback tiling, this warns and launches that one."""
    on_gpu, on_simulator, *fallback = version.tilings
    cfg = tiling_for(config, on_gpu, on_simulator, prob.d, prob.d_v)
    dtype = dtype_name(prob.dtype)

    def run(cfg):
        blocks = -(-prob.n_k // cfg.BC) if over_keys else -(-prob.n_q // cfg.BR)
        key_tiles = 1 if over_keys else -(-prob.n_k // cfg.BC)
        launch(version.build(cfg, dtype, **options), blocks, cfg.NT, cfg.smem_bytes, args, key_tiles=key_tiles)

    try:
        run(cfg)
    except SharedMemoryRefused as exc:  # fall back to a tiling that needs no permission
        if not fallback:
            raise
        small = fallback[0](prob.d, prob.d_v)
        warnings.warn(f"{exc}; falling back to the slower tiling {small}", RuntimeWarning, stacklevel=3)
        run(small)


def sixteen_bit_element(prob, element: str | None, who: str, instead: str) -> str:
    """The element type a 16-bit kernel is built for: ``element``, or the problem's dtype (a TypeError if it is not
    float16 or bfloat16: ``instead`` says where such inputs go)."""
    if element is None:
        element = dtype_name(prob.dtype)
        if element not in SIXTEEN_BIT:
            raise TypeError(f"{who} takes float16 or bfloat16 inputs; got {element} ({instead})")
    if element not in SIXTEEN_BIT:
        raise ValueError(f"element must be one of {SIXTEEN_BIT}; got {element!r}")
    return element


@contextmanager
def simulated_warps(maps: bool):
    """On numba's simulator, the barriers the emulated warp instructions wait at made faster
    (``ptx_emulation.fast_barriers``), and for the TMA kernels each warp's exchanges made to wait for its own lanes
    (``warp_barriers``); nothing on a GPU."""
    with ExitStack() as stack:
        if simulator_enabled():
            from ..gpu.ptx_emulation import fast_barriers, warp_barriers

            if maps:
                stack.enter_context(warp_barriers())
            stack.enter_context(fast_barriers())
        yield


def on_the_gpu(args: LaunchArgs, outputs: tuple, launch_there) -> None:
    """``launch_there(args)`` with ``args``' host arrays copied to the GPU first (a tensor map holds a device
    address), and those of the ``outputs`` copied back into the caller's arrays (an output already on the GPU,
    as the host wrappers allocate them for NumPy inputs, is written there)."""
    from numba import cuda

    on_device = {name: (a if is_device_array(a) else cuda.to_device(a), size) for name, (a, size) in args.arrays.items()}
    launch_there(replace(args, arrays=on_device))
    for name in outputs:
        if not is_device_array(args.arrays[name][0]):
            on_device[name][0].copy_to_host(args.arrays[name][0])


def launch_tensor_cores(version: KernelVersion, args: LaunchArgs, prob, config=None, element: str | None = None, *,
                        who: str) -> None:
    """Launch a forward version on the tensor cores on ``args`` (Q, K, V, O flat in 16-bit elements, LSE; n_q,
    n_k, scale_log2, causal, kv_group by name): device arrays on a GPU through the driver (``sized_forward``), else
    through numba, with its tensor maps made for each launch when its kernel reads them. ``config`` overrides the
    version's tiling (on a GPU ``tilings[0](d, causal, n_q)``, on the simulator ``tilings[1](d)``)."""
    element = sixteen_bit_element(prob, element, who, "cuda_attention's kernels v1-v5 take float32")
    if prob.d != prob.d_v or prob.d not in version.head_dims:
        raise ValueError(f"{who} supports d = dv {head_dims_text(version.head_dims)}; got d = {prob.d}, dv = {prob.d_v} "
                         "(cuda_attention's kernels v1-v5 take any head dim up to 256)")
    on_gpu, on_simulator = version.tilings
    cfg = config or (on_simulator(prob.d) if simulator_enabled() else on_gpu(prob.d, prob.causal, prob.n_q))
    if cfg.D != prob.d:
        raise ValueError(f"config {cfg} is for d = {cfg.D}; got d = {prob.d}")
    maps, sc = version.arguments == "maps", args.scalars
    arrays = [args.arrays[name][0] for name in ("Q", "K", "V", "O", "LSE")]
    if not simulator_enabled() and not all(map(is_device_array, arrays)):
        if maps:  # a tensor map holds a device address: host arrays go to the GPU first, O and LSE come back
            return on_the_gpu(args, ("O", "LSE"), lambda there: launch_tensor_cores(
                version, there, prob, config, element, who=who))
    elif not simulator_enabled() and args.n_heads <= MAX_GRID_Y:  # one launch, through the driver: the lean path
        sized_forward(version, sc["n_q"], sc["n_k"], args.n_heads, sc["scale_log2"], sc["causal"], args.kv_group,
                      element, cfg)(*arrays)
        return
    # kv_group: query heads per K, V head (GQA); the heads ordered together, out of at most a launch's heads
    group = cfg.head_group(sc["n_k"], min(args.n_heads, MAX_GRID_Y), args.kv_group, sc["causal"])
    words = {name: (as_words(a), size // 2) if name != "LSE" else (flat(a), size)  # 16-bit pairs: Q, K, V, O
             for name, (a, size) in args.arrays.items()}

    def tensor_maps_of(views, heads):  # the maps of one launch's views of Q, K and V
        return tensor_maps(cfg.maps(sc["n_q"], sc["n_k"], heads, heads // args.kv_group),
                           [views[name] for name in ("Q", "K", "V")])

    grid_args = LaunchArgs(arrays=words, scalars={**sc, "head_group": group}, n_heads=args.n_heads,
                           kv_group=args.kv_group, derived=(("TMAPS", tensor_maps_of),) if maps else ())
    with simulated_warps(maps):  # numba's launches (gpu/launch.py: it copies host arrays, heads in slices)
        launch(version.build(cfg, element, group), -(-sc["n_q"] // cfg.BR), cfg.NT, cfg.smem_bytes, grid_args)


def launch_backward_tensor_cores(version: KernelVersion, args: LaunchArgs, prob, config=None,
                                 element: str | None = None, *, who: str, **options) -> None:
    """Launch a backward main kernel on the tensor cores: one block per (key tile, K/V head), the query heads of
    each K/V head walked by its blocks. ``args`` as the host wrappers build them (n_heads query heads, kv_group of
    them per K/V head; Q, K, V, dO, dK, dV in 16-bit elements, handed to the kernel as words of two; LSE, Dvec,
    dQ_acc float32; dQ_turn int32); ``config`` overrides the version's tiling (``tilings[0](d)`` on a GPU,
    ``tilings[1](d)`` on the simulator); ``options`` are its build's (``deterministic``)."""
    element = sixteen_bit_element(prob, element, who, "kernel v1 takes float32")
    default, simulator = version.tilings
    cfg = (config or (simulator if simulator_enabled() else default)(prob.d)).validate()
    if cfg.D != prob.d or prob.d != prob.d_v:
        raise ValueError(f"{who} needs d = dv = {cfg.D} for {cfg}; got d = {prob.d}, "
                         f"dv = {prob.d_v} (kernel v1 takes any head dim up to 256)")
    maps = version.arguments == "maps"
    if maps and not simulator_enabled() and not all(is_device_array(a) for a, _ in args.arrays.values()):
        return on_the_gpu(args, ("dQ_acc", "dK", "dV"), lambda there: launch_backward_tensor_cores(
            version, there, prob, config, element, who=who, **options))
    n_q, n_k, g = args.scalars["n_q"], args.scalars["n_k"], args.kv_group

    def tensor_maps_of(views, kv_heads):  # the launch's views: kv_heads K/V heads, g query heads each
        if n_q == 0:  # no query tile is read or added to; a map needs rows: K's and V's stand in the others' places
            k_map, v_map = cfg.maps(n_k, n_k, kv_heads, kv_heads)[1:3]
            return tensor_maps((k_map, k_map, v_map, v_map, k_map), [views[n] for n in ("K", "K", "V", "V", "K")])
        return tensor_maps(cfg.maps(n_q, n_k, kv_heads * g, kv_heads),
                           [views[n] for n in ("Q", "K", "V", "dO", "dQ_acc")])

    words = {name: (a.view(np.uint32), size // 2) if a.dtype.itemsize == 2 else (a, size)
             for name, (a, size) in args.arrays.items()}
    grid = LaunchArgs(arrays=words, scalars={**args.scalars, "kv_group": g}, n_heads=args.n_heads // g, kv_group=g,
                      kv_arrays=(), group_arrays=QUERY_ARRAYS,
                      derived=(("TMAPS", tensor_maps_of),) if maps else ())
    if n_k > 0 and grid.n_heads > 0:
        with simulated_warps(maps):
            launch(version.build(cfg, element, **options), -(-n_k // cfg.BC), cfg.NT, cfg.smem_bytes, grid,
                   key_tiles=-(-n_q // cfg.BR) * g)
