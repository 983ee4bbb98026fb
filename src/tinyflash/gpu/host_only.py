"""Kernels that launch nothing: the host's part of a call, tested or timed without a GPU.

A :class:`HostOnlyKernel` is a ``driver_launch.DriverKernel`` that compiles nothing and whose launches, through a
stand-in of the driver's binding (:class:`_NoDriver`), only count themselves: a plan made with it packs its
parameters as a GPU's would, and a test reads them back (``tests/test_decode_plan.py``), or a benchmark times the
Python path alone (``benchmarks/decode_host_time.py``).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from .driver_launch import DriverKernel, PackedParams, item_sizes, slot_format


class HostOnlyKernel(DriverKernel):
    """A :class:`DriverKernel` that compiles nothing and whose launches do nothing (they are counted): the host's
    part of a call, timed or tested without a GPU (``benchmarks/decode_host_time.py``, the plan tests)."""

    launches = 0  # launches made by every host-only kernel
    after_previous = 0  # of them, launches with programmatic stream serialization

    def __init__(self, dispatcher, signature: tuple, smem_bytes: int = 0):
        self._driver = _NoDriver
        self.dispatcher, self.signature = dispatcher, signature
        self.argument_types = tuple(signature)
        self._sizes = item_sizes(self.argument_types)
        self.handle = 0
        self.format = slot_format(self.argument_types)
        self._params = PackedParams(self.format)
        self._lock = threading.Lock()
        self._stream0 = 0


class _NoDriver:
    """The few names of the driver's binding that a launch uses, launching nothing."""

    class CUresult:
        CUDA_SUCCESS, CUDA_ERROR_INVALID_CONTEXT = 0, 201

    class CUlaunchAttributeID:
        CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 3

    class CUlaunchAttribute:
        def __init__(self):
            self.id, self.value = 0, SimpleNamespace(programmaticStreamSerializationAllowed=0)

    CUlaunchConfig = SimpleNamespace
    CUstream = int

    @staticmethod
    def cuLaunchKernel(*args):
        HostOnlyKernel.launches += 1
        return (0,)

    @staticmethod
    def cuLaunchKernelEx(config, *args):
        HostOnlyKernel.launches += 1
        HostOnlyKernel.after_previous += config.attrs[0].value.programmaticStreamSerializationAllowed
        return (0,)
