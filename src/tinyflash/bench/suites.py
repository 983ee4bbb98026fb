"""The benchmarks, declared as data: what varies (the axes and their values), what is fixed, who runs.

Each :class:`Benchmark` is run by the one runner (``runner.run``): for every point of its axes it
makes fresh random inputs, checks every peer that takes them, times those that passed together
(``timing.time_interleaved``), and writes one row each in the record's schema. A new benchmark is a
new entry here (docs/where-things-go.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from . import peers as p
from .flex import VARIANTS as FLEX_VARIANTS, flex_peers

NS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its axes (name -> default values), the fixed sizes, and the peers at a point."""

    name: str
    doc: str  # one line: what it measures
    kind: str  # 'forward', 'backward', 'training' or 'decode': which check, which rate (TFLOP/s or TB/s of K and V)
    axes: dict  # dtype, d, causal, n (Nq = Nk) or n_k, batch: the values measured unless told otherwise
    peers: Callable  # peers(point) -> [Peer, ...], the baseline first
    fixed: dict = field(default_factory=lambda: {"batch": 1, "heads": 32})
    library: str = "cupy"  # the inputs' array library: 'cupy' or 'torch' (bfloat16 needs torch)
    rounds: int = 15  # rounds of interleaved timing
    baseline: tuple | None = ("torch_flash", "")  # the peer whose time the others are compared with
    record: str = ""  # the CSV of the record, figures/data/<record>_<device>.csv; '' for the benchmark's name
    by_n: dict = field(default_factory=dict)  # N -> fixed sizes of its own (more sequences at a shorter N)

    @property
    def csv_stem(self) -> str:
        return (self.record or self.name).replace("-", "_")


def sweep_peers(point) -> list:
    """Stage 2 (v5), stage 3 (v6) where it takes the inputs, naive attention, SDPA's flash and efficient."""
    found = [p.stage2(), p.stage3(), p.naive()]
    if p.has_torch():
        found = [p.sdpa("flash", ("float16", "bfloat16")), *found, p.sdpa("efficient")]
    return found


def version_peers(point) -> list:
    """Every registered kernel version."""
    from ..forward.kernels import VERSIONS

    return [p.stage2(name) for name in VERSIONS]


def vector_peers(point) -> list:
    """The latest kernel reading full tiles 1 and 4 elements per thread and global load."""
    return [p.stage2("v5", f"v5 vector={w}", vector=w) for w in (1, 4)]


V5_TILINGS = {  # (BR, BC, TM, NT) tried per head dim; the default tilings are chosen from their times
    64: [(64, 64, 8, 128), (64, 128, 8, 128), (128, 64, 8, 128), (128, 64, 8, 256)],
    128: [(64, 64, 8, 128), (128, 64, 8, 256), (64, 32, 8, 128)],
}


def tile_peers(point) -> list:
    """v5 with each tiling of V5_TILINGS[d]."""
    from ..forward.kernels.tiling import TileConfig

    d = point["d"]
    return [p.stage2("v5", f"v5 BR={br} BC={bc} TM={tm} NT={nt}", config=TileConfig(BR=br, BC=bc, TM=tm, NT=nt, D=d, DV=d))
            for br, bc, tm, nt in V5_TILINGS[d]]


def tensor_core_peers(point) -> list:
    """Stage 3 (v6) beside SDPA's flash (the baseline) and cuDNN backends, and stage 2 (v5) in float16."""
    return [p.sdpa("flash", ("float16", "bfloat16")), p.sdpa("cudnn", ("float16", "bfloat16")), p.stage3(),
            p.stage2("v5")]


# v6's tilings swept per head dim: (warps, keys per tile, row tiles per warp, Q_i's operands in shared memory, lazy
# rescaling); each timed with each number of heads ordered together (1: one head at a time, its own kernel)
V6_TILINGS = {128: [(8, 64, 2, True, False), (8, 64, 2, True, True), (4, 64, 2, True, False), (4, 64, 2, True, True)],
              64: [(4, 64, 2, False, False), (4, 64, 2, False, True)],
              96: [(8, 64, 2, True, True), (4, 64, 2, True, True), (8, 64, 1, False, True)],
              256: [(8, 64, 1, True, True), (8, 32, 1, True, True), (4, 32, 1, True, True)]}
V6_HEAD_GROUPS = {True: (1, 2, 4, 8, 16, 32), False: (1, 4)}


def tensor_core_tiling_peers(point) -> list:
    """SDPA flash, and v6 with each tiling of V6_TILINGS and each head group: the kernel alone."""
    from ..forward.kernels.tensor_core_tiling import TensorCoreTiling

    d = point["d"]
    found = [p.stage3_tiling(TensorCoreTiling(D=d, WARPS=w, BC=bc, ROW_TILES=rt, Q_IN_SMEM=q, LAZY_RESCALE=lazy), g)
             for w, bc, rt, q, lazy in V6_TILINGS[d] for g in V6_HEAD_GROUPS[point["causal"]]]
    return [p.sdpa("flash", ("float16", "bfloat16")), *found]


def hopper_peers(point) -> list:
    """Stage 4's steps (v7 wgmma, v8 TMA, v9 warp specialisation, v10 ping-pong, ...) beside stage 3 (v6) and SDPA's
    flash (the baseline) and cuDNN backends."""
    from ..forward.kernels import VERSIONS

    return [p.sdpa("flash", ("float16", "bfloat16")), p.sdpa("cudnn", ("float16", "bfloat16")), p.stage3(),
            *[p.stage4(name) for name, version in VERSIONS.items() if version.stage == 4 and "float16" in version.dtypes]]


def hopper_fp8_peers(point) -> list:
    """Kernel v11 on the inputs quantized to e4m3 (``fp8_forward``: checked against the FP8 emulation) beside v10
    on the 16-bit inputs and SDPA's flash backend (the baseline)."""
    from .fp8_forward import stage4_fp8

    return [p.sdpa("flash", ("float16", "bfloat16")), p.stage4("v10"), stage4_fp8()]


V7_TILINGS = {64: [(1, 128), (2, 64), (2, 128), (2, 192), (3, 96)], 128: [(1, 128), (2, 64), (2, 128), (3, 96)]}  # (WG, BC)


def ping_pong_peers(point) -> list:
    """Step 4 (v10, ping-pong) beside step 3 (v9) and SDPA's flash (the baseline) and cuDNN backends: the two
    kernels in one run with their peers, without the earlier steps."""
    return [p.sdpa("flash", ("float16", "bfloat16")), p.sdpa("cudnn", ("float16", "bfloat16")), p.stage4("v9"),
            p.stage4("v10")]


def hopper_tiling_peers(point) -> list:
    """SDPA flash, and v7 with each tiling of V7_TILINGS: the kernel alone."""
    from ..forward.kernels.hopper_tiling import HopperTiling

    return [p.sdpa("flash", ("float16", "bfloat16")),
            *[p.stage4_tiling(HopperTiling(D=point["d"], WARPGROUPS=wg, BC=bc)) for wg, bc in V7_TILINGS[point["d"]]]]


def head_dim_peers(point) -> list:
    """SDPA flash (the baseline), stage 3 as a user calls it (its default tiling), on a Hopper GPU stage 4 where it
    takes d (``hopper_attention``: d = 256 of these), and in float16 v6 with each tiling of V6_TILINGS[d], the
    kernel alone, its heads ordered by the rule (``TensorCoreTiling.head_group``)."""
    from ..forward.kernels import VERSIONS
    from ..forward.kernels.hopper_tiling import COMPUTE_CAPABILITY
    from ..forward.kernels.tensor_core_tiling import TensorCoreTiling
    from ..gpu.runtime import compute_capability

    d, causal = point["d"], point["causal"]
    found = [p.sdpa("flash", ("float16", "bfloat16")), p.stage3()]
    if d in VERSIONS.default("hopper_attention").head_dims and compute_capability() == COMPUTE_CAPABILITY:
        found.append(p.stage4())
    if point["dtype"] == "float16":  # the tilings once: the element type changes no register or byte
        for w, bc, rt, q, lazy in V6_TILINGS[d]:
            cfg = TensorCoreTiling(D=d, WARPS=w, BC=bc, ROW_TILES=rt, Q_IN_SMEM=q, LAZY_RESCALE=lazy)
            group = cfg.head_group(point["n_k"], point["batch"] * point["heads"], point["heads"] // point["kv_heads"],
                                   causal)
            found.append(p.stage3_tiling(cfg, group))
    return found


def example_peers(point) -> list:
    return [p.stage3(), p.stage2("v5")]


def backward_peers(point) -> list:
    """tinyflash's backwards (CUDA cores, tensor cores), naive, and SDPA's efficient (float32) and flash (16-bit)."""
    found = [p.backward_stage2(), p.backward_stage3(), p.backward_naive()]
    if p.has_torch():
        found = [p.backward_sdpa("flash", ("float16", "bfloat16")), *found, p.backward_sdpa("efficient")]
    return found


def backward_tensor_core_peers(point) -> list:
    """SDPA's flash backward (the baseline, FlashAttention-2's) and its cuDNN backward (the strongest on Hopper), and
    the tensor-core backward: v2 atomic and deterministic, v3 (Hopper's wgmma) and v4 (v3 warp-specialised; on other
    GPUs their rows say why they did not run)."""
    return [p.backward_sdpa("flash", ("float16", "bfloat16")), p.backward_sdpa("cudnn", ("float16", "bfloat16")),
            p.backward_stage3(), p.backward_stage3(deterministic=True), p.backward_stage3(kernel="v3"),
            p.backward_stage3(kernel="v4")]


def training_step_peers(point) -> list:
    """A training step's attention, forward and backward through autograd: SDPA's flash (the baseline) and
    tinyflash.torch.attention."""
    return [p.training_sdpa("flash"), p.training_tinyflash()]


BACKWARD_TILINGS = {  # (BR, BC, NT, TM, TK) of the backward kernel tried per head dim; the first is the default
    64: [(64, 64, 128, 8, 8), (64, 64, 256, 4, 4), (64, 32, 128, 8, 4)],
    128: [(64, 64, 256, 4, 8), (64, 64, 256, 8, 8), (32, 64, 256, 4, 8), (64, 32, 128, 8, 4)],
}


def backward_tile_peers(point) -> list:
    from ..backward.kernels.tiling import BackwardTileConfig

    d = point["d"]
    return [p.backward_stage2(BackwardTileConfig(br, bc, nt, tm, tk, D=0, DV=0).padded(d, d),
                              f"v1 BR={br} BC={bc} NT={nt} TM={tm} TK={tk}") for br, bc, nt, tm, tk in BACKWARD_TILINGS[d]]


BACKWARD_TENSOR_CORE_TILINGS = ((4, 64), (8, 64), (8, 128), (8, 32))  # (WARPS, BR) of backward kernel v2 tried per d


def backward_tensor_core_tile_peers(point) -> list:
    """SDPA's flash backward (the baseline), backward kernel v2 at each tiling, dQ added by paired atomics or
    by scalar ones (``v2_tensor_cores.make_kernel``'s ``pair_atomics``), v3 (wgmma) with 1 and 2 warpgroups, and v4
    (warp-specialised) at its tiling, with 3 stages, with the other query tile (64 or 128 rows, where it fits in
    shared memory), with dQ_i added by TMA (DQ_BY_TMA) and, causal, with its blocks in the grid's order rather
    than the longest first (LONGEST_FIRST)."""
    from ..backward.kernels.hopper_tiling import BackwardHopperTiling
    from ..backward.kernels.tensor_core_tiling import BackwardTensorCoreTiling
    from ..backward.kernels import tma_tiling

    found = [p.backward_sdpa("flash", ("float16", "bfloat16"))]
    for warps, br in BACKWARD_TENSOR_CORE_TILINGS:
        cfg = BackwardTensorCoreTiling(D=point["d"], WARPS=warps, BR=br)
        if not cfg.problems() and cfg.smem_bytes <= 227 * 1024:
            found += [p.backward_stage3_tiling(cfg, pairs) for pairs in (True, False)]
    found += [p.backward_stage3_tiling(BackwardHopperTiling(D=point["d"], WARPGROUPS=wg), kernel="v3") for wg in (1, 2)]
    chosen = tma_tiling.default_tiling(point["d"])
    v4 = [chosen, replace(chosen, STAGES=3), replace(chosen, BR=192 - chosen.BR), replace(chosen, DQ_BY_TMA=True)]
    v4 += [replace(chosen, LONGEST_FIRST=False)] if point["causal"] else []
    return found + [p.backward_stage3_tiling(cfg, kernel="v4") for cfg in v4 if not cfg.problems()]


BACKWARD_HEAD_DIM_TILINGS = ((4, 32), (8, 32), (4, 64), (8, 64))  # (WARPS, BR) of v2 tried beside d = 64 and 128


def backward_head_dim_peers(point) -> list:
    """SDPA's flash backward (the baseline) and backward kernel v2 at each tiling of BACKWARD_HEAD_DIM_TILINGS that
    takes the head dim (two warps on each 16 keys past DP = 128, as ``default_tiling``), dQ added as this GPU adds
    it: the sweep behind ``tensor_core_tiling.default_tiling`` at the head dims beside 64 and 128."""
    from ..backward.kernels.tensor_core_tiling import BackwardTensorCoreTiling
    from ..warp_tile import padded_head_dim

    d = point["d"]
    groups = 1 if padded_head_dim(d) <= 128 else 2
    tilings = [BackwardTensorCoreTiling(D=d, WARPS=warps, BR=br, DKV_COLUMN_GROUPS=groups)
               for warps, br in BACKWARD_HEAD_DIM_TILINGS]
    return [p.backward_sdpa("flash", ("float16", "bfloat16"))] + [p.backward_stage3_tiling(cfg, pair_atomics=None)
                                                                 for cfg in tilings if not cfg.problems()]


DECODE_TILINGS = ({"keys": 16, "stages": 4}, {"keys": 16, "stages": 3}, {"keys": 32, "stages": 3},
                  {"keys": 64, "stages": 2})


def decode_peers(point) -> list:
    """Split-KV (prepared, replayed from a graph, called whole), one split, the CUDA-core kernel, the paged
    cache, SDPA with grouped-query heads (and from a graph), a copy; where the split rule takes few enough splits,
    the split kernel that merges its row sets itself (merge=True: no combine kernel); at the longest cache, other
    tilings."""
    from ..decode.kernels.combine import MAX_MERGED_SPLITS
    from ..decode.kernels import VERSIONS
    from ..decode.split_kv import choose_num_splits
    from ..hardware import current

    tensor_cores = VERSIONS["tensor_cores"].code  # the split kernel's file: its tiling
    found = [p.split_kv(), p.split_kv_graph(), p.split_kv_whole_call(), p.split_kv(impl="no_split", num_splits=1),
             p.split_kv("CUDA cores", kernel="cuda_cores"), p.paged()]
    splits = choose_num_splits(point["batch"] * point["kv_heads"], point["n_k"], current().sms,
                               tensor_cores.default_tiling(point["d"]).blocks_per_sm())  # the rule's, one row set per K/V head
    if splits <= MAX_MERGED_SPLITS:
        found += [p.split_kv("merged", merge=True), p.split_kv_graph("merged, CUDA graph", merge=True)]
    if point["n_k"] == max(DECODE.axes["n_k"]):
        found += [p.split_kv(f"keys={t['keys']} stages={t['stages']}",
                             tiling=tensor_cores.DecodeTiling(D=point["d"], BC=t["keys"], STAGES=t["stages"])) for t in DECODE_TILINGS]
        found.append(p.split_kv("splits=128", num_splits=128))
    if p.has_torch():
        found = [p.sdpa("flash"), p.sdpa_graph("flash"), p.sdpa("cudnn"), *found]
    return found + [p.copy()]


DECODE = Benchmark("decode", "split-KV decoding (GQA, paged cache) beside SDPA and a copy's bandwidth", "decode",
                   {"batch": (1, 8), "n_k": (4096, 32768, 131072), "dtype": ("float16",)}, decode_peers,
                   fixed={"heads": 32, "kv_heads": 8, "d": 128, "n_q": 1, "causal": False}, rounds=7)

def decode_call_peers(point) -> list:
    """Decode as a PyTorch program calls it: SDPA flash with grouped-query heads called whole (the baseline) and
    from a CUDA graph; tinyflash called whole, prepared once (a decode loop's run()), and called whole inside a
    CUDA graph."""
    return [p.sdpa("flash", ("float16", "bfloat16")), p.sdpa_graph("flash"), p.split_kv_whole_call(), p.split_kv(),
            p.split_kv_whole_call_graph()]


DECODE_CALL = Benchmark("decode-whole-call", "decoding called as a PyTorch program calls it, float16 and bfloat16",
                        "decode", {"batch": (1, 8), "n_k": (4096, 32768, 131072), "dtype": ("float16", "bfloat16")},
                        decode_call_peers, fixed=DECODE.fixed, library="torch", rounds=7)

BENCHMARKS = {b.name: b for b in (
    Benchmark("sweep", "stages 2 and 3 beside naive attention and PyTorch SDPA, against N", "forward",
              {"dtype": ("float16", "float32"), "d": (64, 128), "causal": (False, True), "n": NS}, sweep_peers,
              rounds=3, record="bench"),
    Benchmark("versions", "every registered kernel version, side by side", "forward",
              {"dtype": ("float32", "float16"), "d": (64, 128), "causal": (False,), "n": (16384,)}, version_peers,
              rounds=5, baseline=None, record="kernel_versions"),
    Benchmark("vector", "v5 reading 1 or 4 elements per thread and load", "forward",
              {"dtype": ("float16", "float32"), "d": (64, 128), "causal": (False, True), "n": (16384,)},
              vector_peers, rounds=5, baseline=("tinyflash", "v5 vector=1"), record="vector_loads"),
    Benchmark("tiles", "v5 with each tiling of its sweep", "forward",
              {"dtype": ("float32", "float16"), "d": (64, 128), "causal": (False, True), "n": (16384,)}, tile_peers,
              rounds=5, baseline=None, record="tile_sweep"),
    Benchmark("tensor-cores", "stage 3 (v6) beside SDPA's flash and cuDNN backends", "forward",
              {"dtype": ("float16", "bfloat16"), "d": (64, 128), "causal": (False, True), "n": (4096, 16384)},
              tensor_core_peers, library="torch"),
    Benchmark("tensor-core-tiles", "v6's tilings and head groups, the kernel alone, beside SDPA flash", "forward",
              {"dtype": ("float16",), "d": (128, 64), "causal": (False, True), "n": (4096, 16384)},
              tensor_core_tiling_peers, library="torch", rounds=5),
    Benchmark("hopper", "stage 4's steps (v7 wgmma, v8 TMA, v9 warp specialisation, v10 ping-pong) beside v6 and "
              "SDPA's flash and cuDNN backends", "forward",
              {"dtype": ("float16", "bfloat16"), "d": (64, 128), "causal": (False, True), "n": (4096, 16384)},
              hopper_peers, library="torch", rounds=5, by_n={4096: {"batch": 4}}),
    Benchmark("hopper-ping-pong", "step 4 (v10, ping-pong) beside v9 and SDPA's flash and cuDNN backends", "forward",
              {"dtype": ("float16", "bfloat16"), "d": (64, 128), "causal": (False, True), "n": (4096, 16384)},
              ping_pong_peers, library="torch", rounds=5, by_n={4096: {"batch": 4}}),
    Benchmark("hopper-fp8", "FP8: v11 on e4m3 inputs (quantized per tensor from the 16-bit ones) beside v10 and "
              "SDPA flash on the 16-bit inputs", "forward",
              {"dtype": ("bfloat16",), "d": (64, 128, 256), "causal": (False, True), "n": (4096, 16384)},
              hopper_fp8_peers, library="torch", rounds=5, by_n={4096: {"batch": 4}}),
    Benchmark("hopper-tiles", "v7's tilings, the kernel alone, beside SDPA flash", "forward",
              {"dtype": ("float16",), "d": (64, 128), "causal": (False, True), "n": (16384,)},
              hopper_tiling_peers, library="torch", rounds=5),
    Benchmark("head-dims", "stage 3 (v6) at head dims beside 64 and 128 against SDPA flash, and v6's candidate "
              "tilings there; on Hopper, stage 4 at d = 256", "forward",
              {"dtype": ("float16", "bfloat16"), "d": (96, 256), "causal": (False, True), "n": (16384,)},
              head_dim_peers, library="torch", rounds=5),
    Benchmark("flex", "flex_attention's masks and score modifications (v6, and v10 on Hopper, with the functions "
              "compiled in, a block mask) beside FlexAttention compiled and SDPA with the dense mask; TFLOP/s counted as "
              "causal attention's",
              "forward", {"dtype": ("bfloat16",), "d": (128,), "causal": (True,), "n": (16384,), "mods": FLEX_VARIANTS},
              flex_peers, library="torch", rounds=5, baseline=("torch_flex", "")),
    Benchmark("example-32k", "the 32k-token example: B = 1, H = 32, N = 32,768, d = 128, causal", "forward",
              {"dtype": ("float16", "bfloat16"), "d": (128,), "causal": (True,), "n": (32768,)}, example_peers,
              library="torch", rounds=5, baseline=None),
    Benchmark("backward", "the backward pass beside SDPA's backwards and naive attention", "backward",
              {"dtype": ("float32", "float16"), "d": (64, 128), "causal": (False, True), "n": (1024, 4096, 16384)},
              backward_peers, rounds=5, baseline=("torch_efficient", "")),
    Benchmark("backward-tensor-cores", "the tensor-core backward (v2, v3, v4) beside SDPA's flash and cuDNN backwards",
              "backward",
              {"dtype": ("float16", "bfloat16"), "d": (64, 128), "causal": (False, True), "n": (4096, 16384)},
              backward_tensor_core_peers, library="torch", by_n={4096: {"batch": 4}}),
    Benchmark("backward-tensor-core-tiles", "backward kernel v2's tilings and dQ atomics, v3's warpgroups and v4's "
              "stages, beside SDPA's flash backward",
              "backward", {"dtype": ("float16",), "d": (64, 128), "causal": (False, True), "n": (4096, 16384)},
              backward_tensor_core_tile_peers, library="torch", by_n={4096: {"batch": 4}}, rounds=3),
    Benchmark("backward-head-dims", "backward kernel v2 at head dims beside 64 and 128, at its candidate tilings, "
              "beside SDPA's flash backward", "backward",
              {"dtype": ("bfloat16",), "d": (96, 192, 256), "causal": (False, True), "n": (8192,)},
              backward_head_dim_peers, library="torch", rounds=3),
    Benchmark("training-head-dims", "a training step through tinyflash.torch at head dims beside 64 and 128 against "
              "SDPA flash", "training", {"dtype": ("bfloat16",), "d": (96, 192, 256), "causal": (True,), "n": (8192,)},
              training_step_peers, library="torch"),
    Benchmark("training-step", "forward and backward through autograd: tinyflash.torch against SDPA flash",
              "training", {"dtype": ("float16", "bfloat16"), "d": (128,), "causal": (True,), "n": (4096, 16384)},
              training_step_peers, library="torch", by_n={4096: {"batch": 4}}),
    Benchmark("backward-tiles", "tilings of the backward kernel", "backward",
              {"dtype": ("float32",), "d": (64, 128), "causal": (False, True), "n": (16384,)}, backward_tile_peers,
              rounds=5, baseline=None),
    DECODE,
    DECODE_CALL,
)}
