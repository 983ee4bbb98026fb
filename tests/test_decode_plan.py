"""The planned path of ``cuda_split_kv_attention`` (``decode.cuda.DecodePlan``), without a GPU.

A stand-in array library (:class:`FakeArray`, registered as the library 'fake' with its :class:`ArrayLibrary`)
takes the path PyTorch and CuPy tensors take on a GPU; the kernels are :class:`HostOnlyKernel`s, whose launches
do nothing but are counted, and whose packed parameters are read back. Checked here: a plan is made once per
key (shapes, dtypes, contiguity, GPU, causal, scale, num_splits) and a call with new addresses writes them all;
each part of the key makes a new plan; bad inputs are refused with the general path's very error, a plan
existing or not; strided or misaligned inputs are copied; inputs on two GPUs are refused.
"""

import itertools

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.decode import cuda as decode_cuda
from tinyflash.gpu import arrays
from tinyflash.gpu.driver_launch import Bytes
from tinyflash.gpu.host_only import HostOnlyKernel
from tinyflash.host.plans import PLANS

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
_addresses = itertools.count(1 << 20)


class FakeArray:
    """An array of a GPU library that is not there: a shape, a dtype, a device, an address (16-byte aligned unless
    ``offset``) and whether it is C-contiguous."""

    def __init__(self, shape, dtype=F16, device=0, contiguous=True, offset=0):
        self.shape, self.dtype, self.device, self.contiguous = tuple(shape), np.dtype(dtype), device, contiguous
        self.address = 256 * next(_addresses) + offset


class Fake:
    """The library's state: its current GPU, and the streams asked for."""

    current = 0
    streams: list = []


def fake_library() -> arrays.ArrayLibrary:
    def key(q, k, v):
        return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.contiguous, k.contiguous, v.contiguous,
                q.device, k.device, v.device)

    def stream(device):
        Fake.streams.append(device)
        return 1000 + device

    return arrays.ArrayLibrary(key, lambda like, shape, dtype: FakeArray(
        (shape,) if isinstance(shape, int) else shape, like.dtype if dtype is None else dtype, like.device),
        lambda x: x.address, stream, lambda: Fake.current, lambda x: x.contiguous,
        {"float16": F16, "float32": F32})


@pytest.fixture
def planned(monkeypatch):
    """FakeArray inputs take the planned path, with host-only kernels; the plans are forgotten before and after."""
    monkeypatch.setitem(arrays._LIBRARY_OF_TYPE, FakeArray, "fake")
    monkeypatch.setitem(arrays._ARRAY_LIBRARIES, "fake", fake_library())
    monkeypatch.setattr(decode_cuda, "simulator_enabled", lambda: False)
    monkeypatch.setattr(decode_cuda, "compute_capability", lambda: (9, 0))  # a Hopper GPU
    monkeypatch.setattr(decode_cuda, "driver_kernel", HostOnlyKernel)
    monkeypatch.setattr(decode_cuda, "to_device", lambda x, like=None: Bytes(x.nbytes))  # the simulator's have no
    # __cuda_array_interface__: the block table and lengths as their sizes (the host-only kernels read nothing)
    monkeypatch.setattr(Fake, "current", 0)
    monkeypatch.setattr(Fake, "streams", [])
    monkeypatch.setattr(PLANS, "plans", {})
    return PLANS.plans


def inputs(batch=2, heads=8, kv_heads=2, n_q=1, n_k=301, d=64, dtype=F16, device=0, **options):
    return (FakeArray((batch, heads, n_q, d), dtype, device, **options),
            FakeArray((batch, kv_heads, n_k, d), dtype, device), FakeArray((batch, kv_heads, n_k, d), dtype, device))


def packed(plan):
    """The addresses in the split kernel's and the combine kernel's packed parameters, in the order they are named."""
    return ([plan.split.slots[i] for i in plan.split.where], [plan.combine.slots[i] for i in plan.combine.where])


def test_a_plan_is_made_once_and_each_call_writes_its_addresses(planned):
    launches = HostOnlyKernel.launches
    first = inputs()
    tf.cuda_split_kv_attention(*first)
    assert len(planned) == 1
    plan = next(iter(planned.values()))
    q, k, v = inputs()  # the same shapes, other arrays
    o, lse = tf.cuda_split_kv_attention(q, k, v)
    assert len(planned) == 1 and next(iter(planned.values())) is plan
    assert HostOnlyKernel.launches == launches + 4  # split and combine, twice
    assert o.shape == (2, 8, 1, 64) and o.dtype == F16 and lse.shape == (2, 8, 1) and lse.dtype == F32
    split, combine = packed(plan)
    o_part, lse_part = split[3], split[4]
    assert split[:3] == [q.address, k.address, v.address]
    assert combine == [o_part, lse_part, o.address, lse.address]
    assert lse_part - o_part == 4 * plan.lse_part_at and lse_part % 16 == 0  # one workspace, lse partials after
    assert Fake.streams == [0, 0]  # the stream of the inputs' GPU, asked at each call


@pytest.mark.parametrize("change", [{"n_k": 302}, {"batch": 3}, {"dtype": F32}, {"device": 1}])
def test_a_new_shape_dtype_or_gpu_makes_a_new_plan(planned, change):
    tf.cuda_split_kv_attention(*inputs())
    Fake.current = change.get("device", 0)
    tf.cuda_split_kv_attention(*inputs(**change))
    assert len(planned) == 2
    plans = list(planned.values())
    assert plans[1].device == change.get("device", 0) and plans[0].device == 0
    tf.cuda_split_kv_attention(*inputs(**change))  # and then it is reused
    assert len(planned) == 2


@pytest.mark.parametrize("options", [{"causal": True}, {"scale": 0.5}, {"num_splits": 3}])
def test_causal_scale_and_splits_are_part_of_the_key(planned, options):
    tf.cuda_split_kv_attention(*inputs())
    tf.cuda_split_kv_attention(*inputs(), **options)
    assert len(planned) == 2


BAD = [  # (what changes in the inputs, the options): each refused by the checks every path runs
    ({"k": (2, 2, 300, 64)}, {}),  # k and v of different Nk
    ({"k": (2, 2, 301, 32), "v": (2, 2, 301, 32)}, {}),  # q and k of different d
    ({"k": (2, 3, 301, 64), "v": (2, 3, 301, 64)}, {}),  # H = 8 not a multiple of H_kv = 3
    ({}, {"num_splits": 0}),
    ({}, {"scale": -1.0}),
]


@pytest.mark.parametrize("shapes, options", BAD)
def test_bad_inputs_are_refused_as_the_general_path_refuses_them(planned, shapes, options):
    """The error of the planned path, a plan of the good inputs existing, is the NumPy (general) path's."""
    tf.cuda_split_kv_attention(*inputs())  # a plan exists
    good = {"q": (2, 8, 1, 64), "k": (2, 2, 301, 64), "v": (2, 2, 301, 64), **shapes}
    with pytest.raises((ValueError, TypeError)) as on_host:
        tf.cuda_split_kv_attention(*(np.ones(s, np.float16) for s in good.values()), **options)
    with pytest.raises(on_host.type) as planned_error:
        tf.cuda_split_kv_attention(*(FakeArray(s) for s in good.values()), **options)
    assert str(planned_error.value) == str(on_host.value)
    assert len(planned) == 1  # and no plan for them


def test_inputs_on_two_gpus_are_refused(planned):
    q, k, _ = inputs()
    with pytest.raises(ValueError, match="q, k and v must be on one GPU; got q on GPU 0, k on GPU 0, v on GPU 1"):
        tf.cuda_split_kv_attention(q, k, FakeArray(k.shape, device=1))


@pytest.mark.parametrize("options", [{"contiguous": False}, {"offset": 8}])
def test_strided_or_misaligned_inputs_are_copied(planned, monkeypatch, options):
    copies = []

    def dense(x):  # what gpu.arrays.dense gives: a contiguous, aligned copy where x is neither
        if x.contiguous and x.address % 16 == 0:
            return x
        copies.append(FakeArray(x.shape, x.dtype, x.device))
        return copies[-1]

    monkeypatch.setattr(decode_cuda, "dense", dense)
    q, k, v = inputs(**options)
    tf.cuda_split_kv_attention(q, k, v)
    plan = next(iter(planned.values()))
    assert plan.gather == ("contiguous" in options)
    assert len(copies) == 1 and packed(plan)[0][:3] == [copies[0].address, k.address, v.address]


@pytest.mark.parametrize("capability, overlap", [((8, 0), False), ((9, 0), True), ((10, 0), True)])
def test_on_hopper_the_combine_kernel_is_launched_to_overlap_the_split_kernel(planned, monkeypatch, capability,
                                                                              overlap):
    """Compute capability 9.0 on: the plan launches the combine kernel with programmatic stream serialization (the
    kernel that waits for the split kernel's partials); before it, with a plain launch."""
    monkeypatch.setattr(decode_cuda, "compute_capability", lambda: capability)
    launches, after = HostOnlyKernel.launches, HostOnlyKernel.after_previous
    tf.cuda_split_kv_attention(*inputs())
    plan = next(iter(planned.values()))
    assert (plan.split.config is None) and (plan.combine.config is not None) == overlap
    assert HostOnlyKernel.launches == launches + 2 and HostOnlyKernel.after_previous == after + overlap


def test_overlap_combine_is_a_bool_that_the_gpu_must_have(monkeypatch):
    monkeypatch.setattr(decode_cuda, "simulator_enabled", lambda: False)
    monkeypatch.setattr(decode_cuda, "compute_capability", lambda: (8, 0))
    assert decode_cuda.overlaps_combine() is False and decode_cuda.overlaps_combine(False) is False
    with pytest.raises(ValueError, match=r"overlap_combine=True needs compute capability 9\.0 or more; this GPU has 8\.0"):
        decode_cuda.overlaps_combine(True)
    with pytest.raises(TypeError, match="overlap_combine must be None or a bool; got int 1"):
        decode_cuda.overlaps_combine(1)
    monkeypatch.setattr(decode_cuda, "compute_capability", lambda: (9, 0))
    assert decode_cuda.overlaps_combine() is True and decode_cuda.overlaps_combine(False) is False
