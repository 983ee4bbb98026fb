"""A kernel version sized for one problem and launched through the driver: the lean path of device arrays on a GPU.

Sizing depends only on a problem's shape: the grid, the threads, the shared memory and the trailing scalars are
fixed once (``gpu.driver_launch.GridLaunch``), the kernel compiled on first use, and a call passes only its arrays'
addresses. A version whose kernel reads TMA tensor maps (``arguments == 'maps'``) gets them from a
``gpu.tensor_map.MapCache``, by the arrays' addresses. The functions here are kept per problem (``lru_cache``):
a plan (``host/plans.py``) holds what the first two return; a flex call (whose checks read the user's functions at
every call, and so have no plan) asks for its sized launch at each call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.online_softmax import LOG2E
from ..gpu.driver_launch import GridLaunch, driver_kernel
from ..gpu.launch import parameters
from ..gpu.tensor_map import MapCache
from .registry import KernelVersion


@dataclass(frozen=True)
class TmaLaunch:
    """A forward kernel that reads tensor maps, sized for one problem: called as the others are, on Q, K, V, O,
    LSE, it launches ``grid`` on O, LSE and the maps of Q, K and V (kept by their addresses: ``maps``)."""

    grid: GridLaunch
    maps: MapCache

    @property
    def kernel(self):  # the driver kernel, as a GridLaunch has it (its registers, its local memory)
        return self.grid.kernel

    def __call__(self, q, k, v, o, lse, stream: int = 0) -> None:
        self.grid(o, lse, self.maps(q, k, v, stream=stream), stream=stream)


@dataclass(frozen=True)
class TmaMainLaunch:
    """A backward main kernel that reads tensor maps, called as the others are (Q, K, V, dO, LSE, Dvec, dQ_acc,
    dK, dV, dQ_turn): it launches ``grid`` on LSE, Dvec, dQ_acc, dK, dV and the maps of Q, K, V, dO and dQ_acc."""

    grid: GridLaunch
    maps: MapCache

    @property
    def kernel(self):
        return self.grid.kernel

    def __call__(self, q, k, v, do, lse, D, dq_acc, dk, dv, dq_turn, stream: int = 0) -> None:
        self.grid(lse, D, dq_acc, dk, dv, self.maps(q, k, v, do, dq_acc, stream=stream), stream=stream)


@lru_cache(maxsize=256)  # by value (a version hashes by identity: no tuple of numba types is hashed per call)
def sized_forward(version: KernelVersion, n_q: int, n_k: int, n_heads: int, scale_log2, causal: bool, kv_group: int,
                  element: str, cfg):
    """A forward version on the tensor cores sized for one problem: one block per (query tile of Br rows, head),
    the heads ordered in groups of ``cfg.head_group(...)``; a call passes q, k, v, o (16-bit elements) and lse,
    C-contiguous device arrays of any library."""
    group = cfg.head_group(n_k, n_heads, kv_group, causal)
    kernel = driver_kernel(version.build(cfg, element, group), version.signature, cfg.smem_bytes)
    grid = GridLaunch.sized(kernel, (-(-n_q // cfg.BR), n_heads), cfg.NT, cfg.smem_bytes, n_q=n_q, n_k=n_k,
                            scale_log2=np.float32(scale_log2), causal=bool(causal), kv_group=kv_group, head_group=group)
    if version.arguments == "maps":
        return TmaLaunch(grid, MapCache(cfg.maps(n_q, n_k, n_heads, n_heads // kv_group)))
    return grid


@lru_cache(maxsize=256)
def sized_backward(version: KernelVersion, n_q: int, n_k: int, n_heads: int, kv_group: int, scale: float,
                   causal: bool, element: str, cfg, **options):
    """A backward main kernel on the tensor cores sized for one problem: one block per (key tile of Bc keys, K/V
    head), each walking the query tiles of its kv_group query heads; ``options`` its build's (``deterministic``)."""
    kernel = driver_kernel(version.build(cfg, element, **options), version.signature, cfg.smem_bytes)
    grid = GridLaunch.sized(kernel, (-(-n_k // cfg.BC), n_heads // kv_group), cfg.NT, cfg.smem_bytes, n_q=n_q,
                            n_k=n_k, scale=np.float32(scale), scale_log2=np.float32(scale * LOG2E),
                            causal=bool(causal), kv_group=kv_group)
    if version.arguments == "maps":
        return TmaMainLaunch(grid, MapCache(cfg.maps(n_q, n_k, n_heads, n_heads // kv_group)))
    return grid


@dataclass(frozen=True)
class FlexLaunch:
    """A kernel built for a flex call (a forward's ``flex_fwd``, a backward's ``flex_bwd_tc``, or the version's own
    kernel where the call has no function and no block mask) sized for one problem, launched through the driver: a
    call passes the arrays and the scalars (the block mask's lists among them) by the kernel's parameter names, and a
    kernel that reads tensor maps gets those of Q, K and V from ``maps`` (kept by their addresses), as
    :class:`TmaLaunch` does."""

    kernel: object  # gpu.driver_launch.DriverKernel
    grid: tuple
    threads: int
    smem_bytes: int
    maps: MapCache | None = None

    def __call__(self, arrays: dict, scalars: dict, stream: int = 0) -> None:
        values = {**arrays, **scalars}
        if self.maps is not None:
            values["TMAPS"] = self.maps(arrays["Q"], arrays["K"], arrays["V"], stream=stream)
        self.kernel(self.grid, self.threads, self.smem_bytes, *self.kernel.arguments(values), stream=stream)


def signature_of(version: KernelVersion, kernel_fn) -> tuple:
    """The driver signature of what ``version.build`` made for a flex call: its flex signature for ``flex_fwd``;
    without user functions or a block mask the build is the version's own ``flash_fwd``, which takes fewer
    arguments, and its plain signature."""
    return version.flex_signature if len(parameters(kernel_fn)) == len(version.flex_signature) else version.signature


@lru_cache(maxsize=256)
def sized_flex(version: KernelVersion, kernel_fn, cfg, n_q: int, n_k: int, n_heads: int, kv_group: int) -> FlexLaunch:
    """``kernel_fn`` (the ``flex_fwd`` that ``version.build`` made for the call's functions) sized for one problem:
    one block per (query tile of Br rows, head), through the driver (``version.flex_signature``)."""
    kernel = driver_kernel(kernel_fn, signature_of(version, kernel_fn), cfg.smem_bytes)
    maps = MapCache(cfg.maps(n_q, n_k, n_heads, n_heads // kv_group)) if version.arguments == "maps" else None
    return FlexLaunch(kernel, (-(-n_q // cfg.BR), n_heads), cfg.NT, cfg.smem_bytes, maps)


@lru_cache(maxsize=256)
def sized_flex_backward(version: KernelVersion, kernel_fn, cfg, n_q: int, n_k: int, n_heads: int,
                        kv_group: int) -> FlexLaunch:
    """A backward main kernel built for a flex call (``flex_bwd_tc``, or the version's own without functions or a
    block mask) sized for one problem: one block per (key tile of Bc keys, K/V head), through the driver; for a
    version that reads words (v2), not tensor maps."""
    if version.arguments == "maps":
        raise ValueError(f"backward kernel {version.name} reads tensor maps: its flex launch is numba's")
    kernel = driver_kernel(kernel_fn, signature_of(version, kernel_fn), cfg.smem_bytes)
    return FlexLaunch(kernel, (-(-n_k // cfg.BC), n_heads // kv_group), cfg.NT, cfg.smem_bytes)
