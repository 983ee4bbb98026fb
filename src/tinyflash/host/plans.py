"""The one cache of call plans, and the keys a plan depends on.

A call's host work is part of its time (a forward at N = 4,096 takes well under a millisecond on the GPU, a decode
step tens of µs), so for PyTorch and CuPy inputs on a GPU each entry point checks its inputs and sizes its launches
once per combination of what those depend on (shapes, dtypes, GPUs, ``causal``, ``scale``, ...) and keeps the
result, a *plan*: a call then looks its plan up with one tuple and launches. Every entry point keeps its plans in
:data:`PLANS`, under keys that start with its name.
"""

from __future__ import annotations

from ..gpu.arrays import library

MAX_PLANS = 1024  # then the plans are forgotten and made again: a program of ever new shapes holds no more


class PlanCache:
    """Plans by key, at most ``limit`` of them (then all are forgotten at once, and made again as calls come)."""

    def __init__(self, limit: int = MAX_PLANS):
        self.limit = limit
        self.plans: dict = {}

    def get(self, key):
        """The plan kept for ``key``; None if there is none (or the key is None: a call checked every time)."""
        return None if key is None else self.plans.get(key)

    def keep(self, key, plan) -> None:
        """Keep ``plan`` for ``key`` (nothing for a None key or plan)."""
        if key is None or plan is None:
            return
        if len(self.plans) >= self.limit:
            self.plans.clear()
        self.plans[key] = plan

    def clear(self) -> None:
        self.plans.clear()

    def __len__(self) -> int:
        return len(self.plans)


PLANS = PlanCache()  # every entry point's plans


def call_key(q, k, v, causal, scale):
    """What a plan of q, k, v depends on, as a dict key, for PyTorch CUDA tensors and CuPy arrays (the driver's
    path): the library, shapes, dtypes, ``causal``, ``scale`` and the inputs' GPUs; None for anything else, which
    is then checked at every call. Only a ``bool`` causal and a ``float`` or None scale give a key: 1 == True as a
    key, but ``causal=1`` must still be refused. A plan's kernel is loaded into the context of the GPU current when
    the plan is made: with several GPUs, call with the inputs' GPU current (``torch.cuda.device(q.device)``)."""
    if type(causal) is not bool or (scale is not None and type(scale) is not float):
        return None
    lib = library(q)
    if lib not in ("torch", "cupy") or not library(k) == library(v) == lib:
        return None
    if lib == "torch" and not (q.is_cuda and k.is_cuda and v.is_cuda):  # CuPy arrays are always on the GPU
        return None
    devices = (q.get_device(), k.get_device(), v.get_device()) if lib == "torch" else (
        q.device.id, k.device.id, v.device.id)  # a plan's kernel is loaded on one GPU
    return (lib, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, causal, scale, devices)


def backward_key(arrays, causal, scale, deterministic: bool):
    """What a backward plan depends on (None: check at every call): :func:`call_key` of q, k, v, the shapes and
    dtypes of o, lse and do, all of q's library and on the GPU, and ``deterministic``."""
    q, k, v, o, lse, do = arrays
    key = call_key(q, k, v, causal, scale)
    if key is None or type(deterministic) is not bool:
        return None
    lib = key[0]
    for x in (o, lse, do):
        if library(x) != lib or (lib == "torch" and not x.is_cuda):
            return None
    return key + (o.shape, o.dtype, lse.shape, lse.dtype, do.shape, do.dtype, deterministic)


def decode_key(lib_name: str, lib, q, k, v, num_splits, causal, scale):
    """What a decode plan depends on: the library (``lib_name``, ``lib``: ``gpu.arrays.ArrayLibrary``),
    ``num_splits``, ``causal``, ``scale``, and q's, k's and v's shapes, dtypes, contiguity and devices
    (``lib.key``). None where a key would let a wrong value through: only a ``bool`` causal, a ``float`` or None
    scale and an ``int`` or None num_splits give one (True == 1 as a key, but ``causal=1`` and
    ``num_splits=True`` must still be refused)."""
    if type(causal) is not bool or (scale is not None and type(scale) is not float) or (
            num_splits is not None and type(num_splits) is not int):
        return None
    return lib_name, num_splits, causal, scale, lib.key(q, k, v)
