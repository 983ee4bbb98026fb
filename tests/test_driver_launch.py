"""Launching through the driver (gpu/driver_launch.py): the parameters numba's kernels expect.

Without a GPU: the packed slots against numba's own flattening of the same argument types (its
data model, in a process without the simulator), and the values written for an array. On a GPU:
a kernel launched through the driver and through numba gives the same result, on PyTorch, CuPy
and numba arrays, bound or not.
"""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from tinyflash.gpu import driver_launch as dl
from tinyflash.gpu.host_only import HostOnlyKernel

def signatures() -> dict:
    """name -> argument types: the signatures the wrappers launch, and scalars of every other width."""
    from numba.cuda import types

    from tinyflash.decode.kernels import combine, cuda_cores
    from tinyflash.forward.kernels import v6_tensor_cores as v6

    return {"v6": v6.SIGNATURE, "split f16": cuda_cores.split_signature("float16", True),
            "split f32": cuda_cores.split_signature("float32", False), "combine": combine.combine_signature("float16"),
            "scalars": (types.int32, types.uint32, types.int16, types.uint8, types.float64, types.boolean)}


# numba's flattened kernel parameters for the same signatures, in a process without the simulator
_NUMBA_ABI = r"""
import json, sys
from numba.cuda.descriptor import cuda_target
sys.path.insert(0, sys.argv[1])
from test_driver_launch import signatures

out = {}
for name, sig in signatures().items():
    params = cuda_target.target_context.get_arg_packer(sig).argument_types
    sizes = {"float": 4, "double": 8}  # and i8 .. i64, and 8-byte pointers
    out[name] = [(str(t), 8 if str(t).endswith("*") else sizes.get(str(t)) or t.width // 8) for t in params]
print(json.dumps(out))
"""


def test_slots_match_numbas_parameters():
    """One slot per parameter of numba's compiled kernel, of the same size and kind (int, float, pointer)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}  # the real target's data model
    out = subprocess.run([sys.executable, "-c", _NUMBA_ABI, os.path.dirname(__file__)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    numba_params = json.loads(out.stdout.strip().splitlines()[-1])
    for name, signature in signatures().items():
        codes = [c for ty in signature for c in dl.slot_codes(ty)]
        expected = numba_params[name]
        assert len(codes) == len(expected), (name, codes, expected)
        for code, (llvm, size) in zip(codes, expected):
            assert struct.calcsize("<" + code) == size, (name, code, llvm)
            assert (code in "fd") == (llvm in ("float", "double")), (name, code, llvm)
            assert not llvm.endswith("*") or code == "Q", (name, code, llvm)  # addresses: unsigned 64-bit
        assert struct.calcsize(dl.slot_format(signature)) == dl.SLOT * len(codes)


class _DeviceArrayStandIn:
    """Something with a CUDA array interface (no GPU needed): an address, a shape, 16-bit elements."""

    def __init__(self, shape, address, strides=None):
        self.shape = shape
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": "<f2",
                                         "data": (address, False), "version": 3}


def test_array_values_from_its_bytes():
    """An array becomes numba's 7 fields, its elements counted in the signature's type: 2·3·64 float16
    elements are 192 uint32 words; a strided array is refused, naming what it got."""
    from numba.cuda import types

    words = types.Array(types.uint32, 1, "C")
    x = _DeviceArrayStandIn((2, 3, 64), address=1 << 20)
    values = dl.param_values((words, types.int64, types.float32, types.boolean), (x, 7, np.float32(0.5), True))
    assert values == [0, 0, 192, 4, 1 << 20, 192, 4, 7, np.float32(0.5), True]
    packed = struct.pack(dl.slot_format((words, types.int64, types.float32, types.boolean)), *values)
    assert struct.unpack_from("<q", packed, 2 * dl.SLOT)[0] == 192 and struct.unpack_from("<f", packed, 8 * dl.SLOT)[0] == 0.5
    with pytest.raises(ValueError, match="C-contiguous.*strides"):
        dl.address_and_bytes(_DeviceArrayStandIn((2, 3, 64), 1 << 20, strides=(768, 2, 256)))
    with pytest.raises(TypeError, match="1-D arrays"):
        dl.slot_codes(types.Array(types.float32, 2, "C"))


def test_packed_launch_writes_only_the_addresses():
    """A PackedLaunch of the combine kernel, packed with the outputs' sizes only (Bytes), then given their
    addresses: the very bytes DriverKernel packs from the arrays themselves, launched as often as called."""
    from tinyflash.decode.kernels import combine

    kernel = HostOnlyKernel(combine.make_combine_kernel("float16"), combine.combine_signature("float16"))
    shapes = {"O_PART": (3, 5, 64), "LSE_PART": (3, 5), "O": (5, 64), "LSE": (5,)}
    arrays = {name: _DeviceArrayStandIn(shape, address=(i + 1) << 20) for i, (name, shape) in enumerate(shapes.items())}
    for name, x in arrays.items():  # float32 partials and lse: 4 bytes an element, as the signature reads them
        if name != "O":
            x.__cuda_array_interface__["typestr"] = "<f4"
    scalars = {"n_splits": 3, "rows": 5, "d": 64}
    sizes = {name: dl.Bytes(dl.address_and_bytes(x)[1]) for name, x in arrays.items()}
    launch = dl.PackedLaunch(kernel, (2, 1), 128, 0, {**sizes, **scalars}, moving=tuple(shapes))
    for at, x in zip(launch.where, arrays.values()):
        launch.slots[at] = dl.address_and_bytes(x)[0]
    expected = struct.pack(kernel.format, *dl.param_values(kernel.argument_types, (*arrays.values(), 3, 5, 64)))
    assert bytes(launch.params.buffer) == expected
    launches = HostOnlyKernel.launches
    launch.launch(stream=7)
    assert HostOnlyKernel.launches == launches + 1


@pytest.mark.parametrize("after_previous", [False, True])
def test_a_launch_after_the_previous_one_goes_through_cuLaunchKernelEx(after_previous):
    """after_previous: the launch asks the driver for programmatic stream serialization (cuLaunchKernelEx with that
    attribute, grid and block as given); else a plain cuLaunchKernel, as before."""
    from tinyflash.decode.kernels import combine

    kernel = HostOnlyKernel(combine.make_combine_kernel("float16", after_previous),
                               combine.combine_signature("float16"))
    sizes = {"O_PART": dl.Bytes(3 * 5 * 64 * 4), "LSE_PART": dl.Bytes(3 * 5 * 4), "O": dl.Bytes(5 * 64 * 2),
             "LSE": dl.Bytes(5 * 4)}
    launch = dl.PackedLaunch(kernel, (5, 2, 1), 128, 0, {**sizes, "n_splits": 3, "rows": 5, "d": 64},
                             moving=tuple(sizes), after_previous=after_previous)
    bound = kernel.bind((5, 2, 1), 128, 0, *(_DeviceArrayStandIn((4,), (i + 1) << 20) for i in range(4)), 3, 5, 64,
                        after_previous=after_previous)
    launches, after = HostOnlyKernel.launches, HostOnlyKernel.after_previous
    launch.launch(stream=7)
    bound(7)
    assert HostOnlyKernel.launches == launches + 2
    assert HostOnlyKernel.after_previous == after + (2 if after_previous else 0)
    if after_previous:
        c = launch.config.config
        assert (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ) == (5, 2, 1, 128, 1, 1)
        assert c.numAttrs == 1 and c.hStream == 7
    else:
        assert launch.config is None


@pytest.mark.gpu
def test_driver_launch_equals_numbas():
    """The same kernel through numba and through the driver (now, and bound with its arguments
    packed once), on numba, CuPy and PyTorch arrays: the same numbers."""
    import cupy
    from numba import cuda
    from numba.cuda import types

    @cuda.jit
    def affine(x, out, n, a, shift, flag):  # out[i] = a·x[i] + shift (+ 1 if flag), i < n
        i = cuda.grid(1)
        if i < n:
            out[i] = a * x[i] + shift + (1.0 if flag else 0.0)

    floats = types.Array(types.float32, 1, "C")
    kernel = dl.driver_kernel(affine, (floats, floats, types.int64, types.float32, types.int32, types.boolean))
    n = 1000
    x = np.random.default_rng().standard_normal(n).astype(np.float32)
    expected = cuda.device_array(n, np.float32)
    affine[(n + 127) // 128, 128](cuda.to_device(x), expected, n, np.float32(1.5), -3, True)
    outs = []
    for make in (cuda.to_device, cupy.asarray):
        out = cupy.zeros(n, np.float32)
        kernel(((n + 127) // 128,), 128, 0, make(x), out, n, np.float32(1.5), -3, True)
        outs.append(out)
    out = cupy.zeros(n, np.float32)
    launch = kernel.bind(((n + 127) // 128,), 128, 0, cupy.asarray(x), out, n, np.float32(1.5), -3, True)
    launch()
    outs.append(out)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        out_t = torch.zeros(n, device="cuda")
        kernel(((n + 127) // 128,), 128, 0, torch.from_numpy(x).cuda(), out_t, n, np.float32(1.5), -3, True)
        torch.cuda.synchronize()
        outs.append(cupy.asarray(out_t))
    cuda.synchronize()
    for got in outs:
        np.testing.assert_array_equal(cupy.asnumpy(got), expected.copy_to_host())
