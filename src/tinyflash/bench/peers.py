"""What the benchmarks time: tinyflash's stages and their peers, each as a :class:`Peer`.

A peer is made once per input (``make(inputs)``, untimed: the forward pass of a backward, a decode
plan, a captured graph) and returns the function that is checked and then timed; that function
returns what the check reads (an output, or the gradients). ``inputs`` is a dict: q, k, v (and do
for the backward) in the benchmark's array library, and the point being measured (``causal`` ...).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

from . import checking

ALL_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Peer:
    """One implementation, and which version or setting of it."""

    impl: str  # tinyflash, torch_flash, torch_efficient, torch_cudnn, naive, copy
    variant: str  # a kernel version, a tiling, a setting; '' for none
    make: Callable  # make(inputs) -> fn; fn() computes once and returns what is checked
    dtypes: tuple = ALL_DTYPES  # the input dtypes it takes
    around: Callable = field(default=nullcontext)  # a context around its calls, outside the timed interval
    checked: bool = True  # False: not attention (a copy), nothing to check
    check: Callable | None = None  # check(out, inputs, rng) -> Verdict, for a peer not judged on the inputs (FP8)

    @property
    def name(self) -> tuple:
        return self.impl, self.variant


def torch_view(x):
    """A PyTorch tensor of x's memory (zero-copy through DLPack for CuPy arrays)."""
    import torch

    return x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)


def sdpa_backend(name: str):
    """A context that makes PyTorch's scaled_dot_product_attention use one backend: flash, efficient, cudnn."""
    def around():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                            "cudnn": SDPBackend.CUDNN_ATTENTION}[name])

    return around


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# --- the forward pass ---------------------------------------------------------------------------------


def stage2(kernel: str | None = None, label: str | None = None, **options) -> Peer:
    """tinyflash.cuda_attention (stage 2) with kernel version ``kernel`` and its ``options``."""
    from ..forward.kernels import VERSIONS

    version = VERSIONS.choose(kernel, "cuda_attention")

    def make(x):
        from ..forward.cuda import cuda_attention

        return lambda: cuda_attention(x["q"], x["k"], x["v"], causal=x["causal"], kernel=version.name, **options)[0]

    return Peer("tinyflash", label or version.name, make, version.dtypes)


def stage3() -> Peer:
    """tinyflash.tensor_core_attention (stage 3, kernel v6), called as a user calls it."""
    def make(x):
        from ..forward.tensor_cores import tensor_core_attention

        return lambda: tensor_core_attention(x["q"], x["k"], x["v"], causal=x["causal"])[0]

    return Peer("tinyflash", "v6", make, ("float16", "bfloat16"))


def stage3_tiling(cfg, group: int) -> Peer:
    """Kernel v6 with the tiling ``cfg`` and ``group`` heads ordered together, launched from arguments packed once
    (``DriverKernel.bind``): the kernel alone, without the host's part of a call. The sweep of these chose v6's
    default tilings (``tensor_core_tiling.default_tiling``) and its rule for head groups."""
    kernel_name = "grouped" if group > 1 else "one-head"
    label = (f"v6 warps={cfg.WARPS} row_tiles={cfg.ROW_TILES} q_in_smem={cfg.Q_IN_SMEM} BC={cfg.BC} "
             f"lazy={cfg.LAZY_RESCALE} group={group} kernel={kernel_name}")

    def make(x):
        import math

        import numpy as np
        import torch

        from ..core.online_softmax import LOG2E
        from ..forward.kernels import VERSIONS
        from ..gpu.driver_launch import driver_kernel

        q, k, v = x["q"], x["k"], x["v"]  # (B, H, N, d) PyTorch tensors
        b, h, n, d = q.shape
        o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
        v6 = VERSIONS["v6"]
        kernel = driver_kernel(v6.build(cfg, checking.dtype_name(q), group), v6.signature, cfg.smem_bytes)
        launch = kernel.bind((-(-n // cfg.BR), b * h), cfg.NT, cfg.smem_bytes, q, k, v, o, lse, n, k.shape[-2],
                             np.float32(LOG2E / math.sqrt(d)), bool(x["causal"]), 1, group)
        fn = lambda: (launch(), o)[1]  # noqa: E731
        fn.details = {"regs": kernel.registers, "local_bytes": kernel.local_bytes, "smem_bytes": cfg.smem_bytes}
        return fn

    return Peer("tinyflash", label, make, ("float16", "bfloat16"))


def stage4(version: str | None = None) -> Peer:
    """tinyflash.hopper_attention (stage 4), called as a user calls it; with ``version`` (v7, v8, v9, ...), the same
    call path (checks, plan, driver launch) running that kernel at its default tiling."""
    from ..forward.kernels import VERSIONS

    version = version or VERSIONS.default("hopper_attention").name

    def make(x):
        from ..forward.hopper import hopper_attention

        return lambda: hopper_attention(x["q"], x["k"], x["v"], causal=x["causal"], kernel=version)[0]

    return Peer("tinyflash", version, make, ("float16", "bfloat16"))


def stage4_tiling(cfg) -> Peer:
    """Kernel v7 with the tiling ``cfg``, launched from arguments packed once (``DriverKernel.bind``): the kernel
    alone, as :func:`stage3_tiling` times v6's."""
    label = f"v7 warpgroups={cfg.WARPGROUPS} BC={cfg.BC} lazy={cfg.LAZY_RESCALE}"

    def make(x):
        import math

        import numpy as np
        import torch

        from ..core.online_softmax import LOG2E
        from ..forward.kernels import VERSIONS
        from ..gpu.driver_launch import driver_kernel

        q, k, v = x["q"], x["k"], x["v"]  # (B, H, N, d) PyTorch tensors
        b, h, n, d = q.shape
        o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
        v7 = VERSIONS["v7"]
        kernel = driver_kernel(v7.build(cfg, checking.dtype_name(q)), v7.signature, cfg.smem_bytes)
        launch = kernel.bind((-(-n // cfg.BR), b * h), cfg.NT, cfg.smem_bytes, q, k, v, o, lse, n, k.shape[-2],
                             np.float32(LOG2E / math.sqrt(d)), bool(x["causal"]), 1, 1)
        fn = lambda: (launch(), o)[1]  # noqa: E731
        fn.details = {"regs": kernel.registers, "local_bytes": kernel.local_bytes, "smem_bytes": cfg.smem_bytes}
        return fn

    return Peer("tinyflash", label, make, ("float16", "bfloat16"))


def naive() -> Peer:
    """Standard attention in the inputs' library and type, S and P in HBM (:func:`checking.naive_attention`)."""
    def make(x):
        return lambda: checking.naive_attention(x["q"], x["k"], x["v"], causal=x["causal"])

    return Peer("naive", "", make)


def sdpa(backend: str, dtypes=ALL_DTYPES) -> Peer:
    """PyTorch's scaled_dot_product_attention with one ``backend``, on zero-copy views of the inputs."""
    def make(x):
        import torch.nn.functional as F

        q, k, v = (torch_view(x[name]) for name in ("q", "k", "v"))
        gqa = q.shape[-3] != k.shape[-3]
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=x["causal"], enable_gqa=gqa)

    return Peer(f"torch_{backend}", "", make, dtypes, sdpa_backend(backend))


# --- the backward pass --------------------------------------------------------------------------------


def backward_stage2(config=None, label: str | None = None) -> Peer:
    """tinyflash.cuda_attention_backward, given the forward's o and lse (computed once, untimed)."""
    from ..backward.kernels import VERSIONS

    def make(x):
        from ..backward.cuda import cuda_attention_backward
        from ..forward.cuda import cuda_attention

        q, k, v, do, causal = x["q"], x["k"], x["v"], x["do"], x["causal"]
        o, lse = cuda_attention(q, k, v, causal=causal)
        options = {} if config is None else {"config": config}
        return lambda: cuda_attention_backward(q, k, v, o, lse, do, causal=causal, **options)

    return Peer("tinyflash", label or VERSIONS.default("cuda_attention_backward").name, make, ("float16", "float32"))


def backward_stage3(deterministic: bool = False, kernel: str = "v2") -> Peer:
    """tinyflash.tensor_core_attention_backward with main kernel ``kernel`` (v2: mma.sync; v3: Hopper's wgmma; v4:
    v3 warp-specialised), given the tensor-core forward's o and lse; ``deterministic``: dQ added in key-tile order
    (v2 only, variant 'v2 deterministic')."""
    def make(x):
        from ..backward.tensor_cores import tensor_core_attention_backward
        from ..forward.tensor_cores import tensor_core_attention

        q, k, v, do, causal = x["q"], x["k"], x["v"], x["do"], x["causal"]
        o, lse = tensor_core_attention(q, k, v, causal=causal)
        return lambda: tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic,
                                                      kernel=kernel)

    return Peer("tinyflash", f"{kernel} deterministic" if deterministic else kernel, make, ("float16", "bfloat16"))


def backward_stage3_tiling(cfg, pair_atomics: bool | None = True, kernel: str = "v2") -> Peer:
    """Backward kernel ``kernel`` (v2, or v3 and v4: wgmma, paired atomics always) with the tiling ``cfg``, v2's dQ
    added by paired or scalar atomics (None: as this GPU adds them), through its driver launches (as tensor_core_attention_backward's plan runs
    them, with this tiling): the sweep behind ``default_tiling``."""
    label = (f"v2 warps={cfg.WARPS} BR={cfg.BR} BC={cfg.BC} row_tiles={cfg.ROW_TILES}"
             + (f" dkv_groups={cfg.DKV_COLUMN_GROUPS}" if cfg.DKV_COLUMN_GROUPS > 1 else "")
             + ("" if pair_atomics is None else f" pairs={pair_atomics}")
             if kernel == "v2" else f"{kernel} warpgroups={cfg.WARPGROUPS} BR={cfg.BR} BC={cfg.BC}"
             + (f" stages={cfg.STAGES} dq_by_tma={cfg.DQ_BY_TMA}" if kernel == "v4" else "")
             + (" grid order" if kernel == "v4" and not cfg.LONGEST_FIRST else ""))

    def make(x):
        import torch

        from ..backward.kernels import VERSIONS
        from ..backward.tensor_cores import driver_launches
        from ..forward.tensor_cores import tensor_core_attention

        q, k, v, do, causal = x["q"], x["k"], x["v"], x["do"], x["causal"]  # (B, H, N, d) PyTorch tensors
        o, lse = tensor_core_attention(q, k, v, causal=causal)
        b, h, n_q, d = q.shape
        sized = (n_q, k.shape[-2], b * h, h // k.shape[1], d ** -0.5, bool(causal), checking.dtype_name(q), cfg)
        launches = driver_launches(VERSIONS[kernel], *sized, **({"pair_atomics": pair_atomics} if kernel == "v2" else {}))
        D, dq_acc = (torch.empty(b * h * n_q * m, device=q.device, dtype=torch.float32) for m in (1, d))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        stream = torch.cuda.current_stream().cuda_stream

        def fn():
            launches(q, k, v, o, lse, do, dq, dk, dv, D, dq_acc, D, stream=stream)
            return dq, dk, dv

        fn.details = {"regs": launches.main.kernel.registers, "local_bytes": launches.main.kernel.local_bytes,
                      "smem_bytes": cfg.smem_bytes}
        return fn

    return Peer("tinyflash", label, make, ("float16", "bfloat16"))


def backward_sdpa(backend: str, dtypes=ALL_DTYPES) -> Peer:
    """PyTorch SDPA's backward with one ``backend``: autograd's gradients of one forward, kept."""
    def make(x):
        import torch
        import torch.nn.functional as F

        q, k, v = (torch_view(x[name]).detach().requires_grad_() for name in ("q", "k", "v"))
        with sdpa_backend(backend)():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=x["causal"])
        do = torch_view(x["do"])
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    return Peer(f"torch_{backend}", "", make, dtypes, sdpa_backend(backend))


def backward_naive() -> Peer:
    """The textbook backward in the inputs' library and type: S, P, dP, dS in HBM."""
    def make(x):
        return lambda: checking.naive_attention_backward(x["q"], x["k"], x["v"], x["do"], causal=x["causal"])

    return Peer("naive", "", make)


# --- a training step: forward and backward through autograd -------------------------------------------


def training_step(attention):
    """``make(inputs)`` of a training step's peer: q, k, v as leaves, and a call that runs ``attention(q, k, v,
    causal)`` forward (fresh each call) and returns autograd's gradients for do."""
    def make(x):
        import torch

        q, k, v = (torch_view(x[name]).detach().requires_grad_() for name in ("q", "k", "v"))
        do, causal = torch_view(x["do"]), x["causal"]
        return lambda: torch.autograd.grad(attention(q, k, v, causal), (q, k, v), do)

    return make


def training_sdpa(backend: str) -> Peer:
    """PyTorch SDPA with one ``backend``, forward and backward."""
    def sdpa(q, k, v, causal):
        import torch.nn.functional as F

        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return Peer(f"torch_{backend}", "", training_step(sdpa), ("float16", "bfloat16"), sdpa_backend(backend))


def training_tinyflash() -> Peer:
    """tinyflash.torch.attention forward and backward."""
    def ours(q, k, v, causal):
        from ..torch import attention

        return attention(q, k, v, causal=causal)

    return Peer("tinyflash", "torch", training_step(ours), ("float16", "bfloat16", "float32"))


# --- decoding -----------------------------------------------------------------------------------------


def split_kv(label: str = "", kernel_args: dict | None = None, impl: str = "split_kv", **prepare) -> Peer:
    """tinyflash's split and combine kernels on a contiguous cache, prepared once (checks, plan, buffers):
    the timed function only launches, as a decode loop that keeps its buffers would."""
    def make(x):
        from ..decode.cuda import prepare_split_kv

        run, o, _, _ = prepare_split_kv(x["q"], x["k"], x["v"], **prepare)
        out = o.reshape(x["q"].shape)
        fn = lambda: (run(), out)[1]  # noqa: E731
        fn.details = {"num_splits": run.plan["num_splits"]}
        fn.run = run
        return fn

    return Peer(impl, label, make, ALL_DTYPES)


def split_kv_graph(label: str = "CUDA graph", **prepare) -> Peer:
    """The prepared split-KV launches captured into a CUDA graph and replayed: the kernels alone. ``prepare``: as
    :func:`split_kv`'s."""
    def make(x):
        import cupy

        fn = split_kv(**prepare).make(x)
        fn()  # compile and load the kernels first: loading cannot be captured
        cupy.cuda.Device().synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                fn.run(stream.ptr)  # the kernels, launched on the capturing stream
            finally:
                graph = stream.end_capture()
        out = fn()
        replay = lambda: (graph.launch(), out)[1]  # noqa: E731
        replay.details = fn.details
        # the graph holds the addresses of fn's arrays (the partials too): they live as long as the replay, or
        # memory the allocator has handed to another peer (its block table, its lengths) is written at each replay
        replay.prepared = fn
        return replay

    return Peer("split_kv", label, make, ("float16", "float32"))


def split_kv_whole_call() -> Peer:
    """tinyflash.cuda_split_kv_attention called as a user calls it: checks, plan, allocations, launches."""
    def make(x):
        from ..decode.cuda import cuda_split_kv_attention

        return lambda: cuda_split_kv_attention(x["q"], x["k"], x["v"])[0]

    return Peer("split_kv", "whole call", make, ALL_DTYPES)


def split_kv_whole_call_graph() -> Peer:
    """tinyflash.cuda_split_kv_attention called whole inside a PyTorch CUDA graph, replayed: a decode step as
    a server captures it (PyTorch inputs)."""
    def make(x):
        import torch

        from ..decode.cuda import cuda_split_kv_attention

        q, k, v = (torch_view(x[name]) for name in ("q", "k", "v"))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            cuda_split_kv_attention(q, k, v)  # compile and size outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = cuda_split_kv_attention(q, k, v)[0]
        return lambda: (graph.replay(), out)[1]

    return Peer("split_kv", "whole call, CUDA graph", make, ("float16", "bfloat16"))


def paged(page_size: int = 16) -> Peer:
    """The split-KV kernels reading the same keys through a block table: pages shuffled in the pool."""
    def make(x):
        import cupy
        import numpy as np

        from ..decode.cuda import prepare_paged
        from ..decode.paged import pages_from_contiguous

        q, k, v = x["q"], x["k"], x["v"]
        perm = cupy.asarray(x["rng"].permutation(q.shape[0] * (k.shape[2] // page_size)), dtype=np.int32)
        run, o, _, _ = prepare_paged(q, pages_from_contiguous(k, v, page_size, perm))
        out = o.reshape(q.shape)
        fn = lambda: (run(), out)[1]  # noqa: E731
        fn.details = {"num_splits": run.plan["num_splits"]}
        return fn

    return Peer("paged", f"page_size={page_size}", make, ("float16", "float32"))


def sdpa_graph(backend: str = "flash") -> Peer:
    """PyTorch SDPA (grouped-query heads) replayed from a CUDA graph, as a server would: no host time."""
    def make(x):
        import torch

        call = sdpa(backend).make(x)
        with sdpa_backend(backend)():
            call()  # warm-up outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = call()
        return lambda: (graph.replay(), out)[1]

    return Peer(f"torch_{backend}", "CUDA graph", make, ("float16", "bfloat16"))


def copy() -> Peer:
    """A device-to-device copy of the K and V bytes: the bandwidth a decode kernel can hope for."""
    def make(x):
        k, v = x["k"], x["v"]
        xp = checking.Ops(k).xp
        dst = xp.empty_like(k), xp.empty_like(v)

        def run():
            dst[0][...] = k
            dst[1][...] = v

        return run

    return Peer("copy", "device-to-device, K and V", make, checked=False)
