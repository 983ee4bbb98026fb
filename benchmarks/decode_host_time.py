"""The host's part of a decode call: µs of Python per call of ``cuda_split_kv_attention`` on PyTorch tensors.

    PYTHONPATH=src python benchmarks/decode_host_time.py [--calls N] [--host-only]

The points of the ``decode-whole-call`` benchmark (H = 32 query heads, 8 K/V heads, d = 128, one query
token; B = 1, 8; Nk = 4,096, 32,768, 131,072; float16 and bfloat16). For each, a call is made once (it plans
the shape: checks, sizing, kernels packed), then ``--calls`` calls in a row are timed, five times, and the
µs per call of the fastest of the five printed:

    no-op launch   the whole call with both kernels' cuLaunchKernel replaced by a function that does nothing
                   (``gpu.host_only.HostOnlyKernel``): the Python path alone, from the entry to the driver,
                   in CPU time of this thread (so that other processes on a busy host do not count)
    call           on a GPU: the real call, the GPU synchronised only at the end of the loop; where the GPU
                   finishes a call's kernels sooner than the host makes the next call, this is the host time
                   with the two launches in it
    SDPA flash     on a GPU: PyTorch's scaled_dot_product_attention (flash backend set outside the loop, K/V
                   heads grouped), timed the same way: the yardstick

Then the steps of one planned call, each timed alone. Without a GPU (or with ``--host-only``) only the no-op
rows are measured, on CPU tensors: the planned path is taken as for CUDA tensors (device 0, stream 0), the
compute-capability check is skipped, the GPU taken as an H200's (compute capability 9.0: the combine kernel
launched through cuLaunchKernelEx, to overlap), and the plan's block table and lengths are not made. A CPU tensor's
allocation may cost a little less than one from PyTorch's CUDA caching allocator. Needs PyTorch.
"""

import argparse
import time
import timeit
from contextlib import contextmanager

HEADS, KV_HEADS, D = 32, 8, 128
POINTS = [(b, n_k) for b in (1, 8) for n_k in (4096, 32768, 131072)]
RUNS = 5  # runs of --calls calls per point and peer; the least is printed


@contextmanager
def no_op_launches(on_cpu: bool):
    """Plans made inside launch nothing (``HostOnlyKernel``); ``on_cpu``: CPU tensors take the planned path. The
    plans are forgotten on the way in and out, so that no real plan is used inside and no no-op plan after."""
    import torch

    from tinyflash.decode import cuda as decode_cuda
    from tinyflash.gpu import arrays, runtime
    from tinyflash.gpu.driver_launch import Bytes
    from tinyflash.gpu.host_only import HostOnlyKernel
    from tinyflash.host.plans import PLANS

    saved = {name: getattr(decode_cuda, name) for name in ("driver_kernel", "require_compute_capability", "to_device",
                                                            "compute_capability")}
    saved_library, saved_seen = arrays._ARRAY_LIBRARIES["torch"], runtime._gpu_seen
    decode_cuda.driver_kernel = HostOnlyKernel
    if on_cpu:
        real = arrays.array_library("torch")

        def key(q, k, v):  # the real key, CPU tensors counted as on GPU 0
            *rest, dq, dk, dv = real.key(q, k, v)
            return (*rest, dq + 1, dk + 1, dv + 1)

        arrays._ARRAY_LIBRARIES["torch"] = arrays.ArrayLibrary(key, real.empty, real.address, lambda device: 0,
                                                               lambda: 0, real.contiguous, real.dtypes)
        decode_cuda.require_compute_capability = lambda *args: None
        decode_cuda.compute_capability = lambda: (9, 0)  # the H200's path: the combine launched to overlap
        decode_cuda.to_device = lambda x, like=None: Bytes(x.nbytes)  # the block table and lengths: never read
        runtime._gpu_seen = True
    PLANS.clear()
    try:
        yield
    finally:
        PLANS.clear()
        for name, value in saved.items():
            setattr(decode_cuda, name, value)
        arrays._ARRAY_LIBRARIES["torch"], runtime._gpu_seen = saved_library, saved_seen


def inputs(batch: int, n_k: int, dtype, device: str):
    """q (B, H, 1, d), k and v (B, H_kv, Nk, d): random on a GPU; uninitialised on the CPU (only the host's path
    is timed there, and untouched pages cost no memory)."""
    import torch

    make = (lambda *shape: torch.randn(*shape, device=device, dtype=dtype)) if device == "cuda" else (
        lambda *shape: torch.empty(*shape, dtype=dtype))
    return make(batch, HEADS, 1, D), make(batch, KV_HEADS, n_k, D), make(batch, KV_HEADS, n_k, D)


def us_per_call(fn, calls: int, sync, runs: int = RUNS, clock=time.perf_counter) -> float:
    """µs per call over ``calls`` calls in a row (after 20 more), synchronised at the end, by ``clock`` (wall time;
    or ``time.thread_time``, this thread's CPU time, which other processes on a busy host do not disturb): the
    least of ``runs`` runs."""
    for _ in range(20):
        fn()
    sync()
    best = float("inf")
    for _ in range(runs):
        start = clock()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, clock() - start)
    return 1e6 * best / calls


def steps(q, k, v) -> dict:
    """µs of each step of a planned call on (q, k, v), each timed alone (this thread's CPU time, the fastest of 5 runs
    of 2,000)."""
    from tinyflash.decode import cuda as decode_cuda
    from tinyflash.gpu.arrays import array_library, library
    from tinyflash.host.plans import PLANS, decode_key

    decode_cuda.cuda_split_kv_attention(q, k, v)  # makes the plan
    lib = array_library("torch")
    key = ("cuda_split_kv_attention", *decode_key("torch", lib, q, k, v, None, False, None))
    plan = PLANS.get(key)
    table = {"library(q) x3, array_library": lambda: (library(q), library(k), library(v), array_library("torch")),
             "decode_key": lambda: decode_key("torch", lib, q, k, v, None, False, None),
             "plan lookup (PLANS.get)": lambda: PLANS.get(key),
             "lib.device()": lib.device,
             "address x3": lambda: (lib.address(q), lib.address(k), lib.address(v)),
             "empty: o": lambda: lib.empty(q, plan.out_shape, None),
             "empty: workspace": lambda: lib.empty(q, plan.workspace, plan.float32),
             "lib.stream(device)": lambda: lib.stream(plan.device),
             "split launch (packed)": lambda: plan.split.launch(lib.stream(plan.device)),
             "plan(q, k, v)": lambda: plan(q, k, v),
             "the whole call": lambda: decode_cuda.cuda_split_kv_attention(q, k, v)}
    return {name: 1e6 * min(timeit.Timer(fn, timer=time.thread_time).repeat(number=2000, repeat=5)) / 2000
            for name, fn in table.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Run from the repository root with PYTHONPATH=src.")
    ap.add_argument("--calls", type=int, default=1000, help="calls timed per point (default: %(default)s)")
    ap.add_argument("--host-only", action="store_true", help="only the no-op launches, on CPU tensors")
    args = ap.parse_args(argv)

    import torch

    from tinyflash.bench.record import environment
    from tinyflash.decode.cuda import cuda_split_kv_attention

    on_gpu = torch.cuda.is_available() and not args.host_only
    device = "cuda" if on_gpu else "cpu"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    env = environment(torch.cuda.get_device_name() if on_gpu else "no GPU (CPU tensors, no-op launches)")
    print(f"decode host time: {env['device']}, torch "
          f"{torch.__version__}, commit {env['commit'] or '-'}, {env['date']}; H={HEADS} H_kv={KV_HEADS} d={D} Nq=1; "
          f"µs per call over {args.calls} calls in a row (no-op launch: CPU time), the fastest of {RUNS} runs")
    print(f"  {'dtype':<9} {'B':>2} {'Nk':>7}  {'no-op launch':>12}" + (f"  {'call':>8}  {'SDPA flash':>10}" if on_gpu
                                                                       else ""))
    for dtype in (torch.float16, torch.bfloat16):
        for batch, n_k in POINTS:
            q, k, v = inputs(batch, n_k, dtype, device)
            call = lambda: cuda_split_kv_attention(q, k, v)  # noqa: E731
            with no_op_launches(on_cpu=not on_gpu):
                host = us_per_call(call, args.calls, sync, clock=time.thread_time)
            line = f"  {str(dtype).removeprefix('torch.'):<9} {batch:>2} {n_k:>7}  {host:12.1f}"
            if on_gpu:
                import torch.nn.functional as F

                from tinyflash.bench.peers import sdpa_backend

                real = us_per_call(call, args.calls, sync)
                with sdpa_backend("flash")():
                    flash = us_per_call(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                                        args.calls, sync)
                line += f"  {real:8.1f}  {flash:10.1f}"
            print(line, flush=True)
            del q, k, v

    q, k, v = inputs(1, 4096, torch.float16, device)
    print("  the steps of a planned call at B=1, Nk=4,096, float16, no-op launches (µs of CPU time, fastest of 5 runs "
          "of 2,000):")
    with no_op_launches(on_cpu=not on_gpu):
        for name, us in steps(q, k, v).items():
            print(f"    {name:<32} {us:6.2f}")
        sync()


if __name__ == "__main__":
    main()
