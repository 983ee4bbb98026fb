"""Stage 2, the numba.cuda kernels, at tiny sizes: on numba's CUDA simulator without a GPU.

The simulator runs one Python thread per CUDA thread, so these tests use tiny tiles
(simulator_config: 8 × 8 tiles, 16 threads) and N <= 48; on a machine with a GPU they run there.
Each test compares against stage 1 (blocked_attention) and the float64 reference. Every
registered kernel version is tested; the latest one (what cuda_attention runs by default) most.
"""

import warnings

import numpy as np
import pytest
from conftest import HAS_GPU, make_qkv

import tinyflash as tf
import tinyflash.gpu
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule
from tinyflash.forward.kernels import VERSIONS, tiling, v1_row_per_thread, v5_branch_free
from tinyflash.gpu import arrays, launch, runtime
from tinyflash.hardware import STATIC_SMEM_PER_BLOCK

pytestmark = [pytest.mark.simulator, pytest.mark.grid]
CUDA_CORES = [name for name, v in VERSIONS.items() if v.accepts(np.float32, 8, 8)]  # v1-v5; v6: test_tensor_core.py
TILED = [name for name in CUDA_CORES if "config" in VERSIONS[name].options]  # the register-tiled versions
SHAPES = [(1, 1), (7, 7), (8, 8), (9, 17), (17, 9), (48, 48), (33, 20), (20, 33)]


def check_against_stages(o, lse, q, k, v, causal, what):
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    blk_o, blk_lse = tf.blocked_attention(q, k, v, causal=causal, block_q=8, block_k=8)
    if q.dtype == np.float16:
        naive_o = tf.naive_attention(q, k, v, causal=causal)[0]
        assert_fa_rule(o, naive_o, ref_o, np.float16, what=f"{what} o vs reference")
        assert_fa_rule(o, blk_o, ref_o, np.float16, what=f"{what} o vs stage 1")
    else:
        assert_close(o, ref_o, F32_TOL, f"{what} o vs reference")
        assert_close(o, blk_o, F32_TOL, f"{what} o vs stage 1")
    assert_close(lse, ref_lse, F32_TOL, f"{what} lse vs reference", is_lse=True)
    assert_close(lse, blk_lse, F32_TOL, f"{what} lse vs stage 1", is_lse=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", SHAPES)
def test_fast_kernel_lengths(rng, n_q, n_k, causal):
    """Ragged tiles (N not a multiple of 8), Nq != Nk, causal: the fast kernel against stage 1."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=8, d_v=5, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=causal)
    assert o.shape == (2, n_q, 5) and o.dtype == np.float32 and lse.dtype == np.float32
    check_against_stages(o, lse, q, k, v, causal, "fast")


@pytest.mark.parametrize("d, d_v", [(1, 1), (5, 16), (16, 3), (13, 24)])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_kernel_head_dims(rng, d, d_v, causal):
    """Head dims that need padding (d not a multiple of 8, dv not of 16)."""
    q, k, v = make_qkv(rng, (), 19, 26, d=d, d_v=d_v, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=causal)
    check_against_stages(o, lse, q, k, v, causal, f"d={d} dv={d_v}")


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_fast_kernel_leading_dims_float16(rng, lead):
    """float16 in memory, float32 arithmetic, float16 out; FlashAttention's 2x rule."""
    q, k, v = make_qkv(rng, lead, 23, 17, d=16, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    assert o.dtype == np.float16 and o.shape == (*lead, 23, 16) and lse.shape == (*lead, 23)
    check_against_stages(o, lse, q, k, v, True, "float16")


@pytest.mark.parametrize("kernel", CUDA_CORES)
@pytest.mark.parametrize("causal", [False, True])
# float32 with Nq > Nk (and causal, grouped heads): every version in test_kernel_versions.py
@pytest.mark.parametrize("n_q, n_k, dtype", [(9, 40, np.float32), (24, 24, np.float16)])
def test_every_version(rng, kernel, n_q, n_k, dtype, causal):
    """Every registered version computes the same thing: ragged tiles, Nq != Nk, d != dv, float16."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=8, d_v=5, dtype=dtype)
    o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel=kernel)
    assert o.dtype == dtype and o.shape == (2, n_q, 5) and lse.dtype == np.float32
    check_against_stages(o, lse, q, k, v, causal, kernel)


@pytest.mark.parametrize("kernel", TILED)
def test_config_with_several_rows_per_thread_and_a_ragged_last_tile(rng, kernel):
    """A tiling shaped like the GPU one (TM = 4 rows per thread, strided keys), still small."""
    cfg = tiling.TileConfig(BR=16, BC=16, TM=4, NT=16, D=8, DV=16)
    q, k, v = make_qkv(rng, (), 37, 45, d=8, d_v=10, dtype=np.float32)
    for causal in (False, True):
        o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel=kernel, config=cfg)
        check_against_stages(o, lse, q, k, v, causal, f"{kernel} TM=4")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_config_with_fewer_tile_rows_than_a_load_step(rng, dtype):
    """128 threads load an 8-wide K_j 16 rows at a time (float16, 4 elements per thread: 64
    rows), but the tile has only 8 rows: the fast (full-tile) load path must not be taken. Here
    V_j (dv = 64) is full too, so both take it together unless the tile shape is checked."""
    cfg = tiling.TileConfig(BR=16, BC=8, TM=1, NT=128, D=8, DV=64)
    q, k, v = make_qkv(rng, (), 20, 33, d=8, d_v=64, dtype=dtype)
    o, lse = tf.cuda_attention(q, k, v, config=cfg)
    check_against_stages(o, lse, q, k, v, False, "BC=8, NT=128")


def test_fully_masked_rows(rng):
    q, k, v = make_qkv(rng, (), 12, 5, d=8, dtype=np.float32)
    for kernel in CUDA_CORES:
        o, lse = tf.cuda_attention(q, k, v, causal=True, kernel=kernel)
        assert np.all(o[:7] == 0) and np.all(np.isneginf(lse[:7]))  # rows 0..6 may attend no key
        assert np.isfinite(lse[7:]).all()


def test_empty_queries(rng):
    q, k, v = make_qkv(rng, (2,), 0, 5, d=8, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v)
    assert o.shape == (2, 0, 8) and o.dtype == np.float16 and lse.shape == (2, 0) and lse.dtype == np.float32


def test_inputs_unmodified_and_non_contiguous(rng):
    base = rng.standard_normal((2, 8, 30)).astype(np.float32)
    q = np.swapaxes(base, 1, 2)  # (2, 30, 8) transposed view
    k = rng.standard_normal((2, 60, 8)).astype(np.float32)[:, ::2]  # every other row
    v = rng.standard_normal((2, 30, 8)).astype(np.float32)
    copies = [x.copy() for x in (q, k, v)]
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    for x, c in zip((q, k, v), copies):
        assert np.array_equal(x, c)
    check_against_stages(o, lse, q, k, v, True, "non-contiguous")


def test_nan_propagates(rng):
    q, k, v = make_qkv(rng, (), 20, 20, d=8, dtype=np.float32)
    q[3, 0] = np.nan
    o, lse = tf.cuda_attention(q, k, v)
    assert np.isnan(o[3]).all() and np.isnan(lse[3])
    assert np.isfinite(np.delete(o, 3, axis=0)).all()


def test_huge_logits(rng):
    q, k, v = make_qkv(rng, (), 30, 30, d=16, dtype=np.float32)
    q *= 50.0
    k *= 50.0
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    assert np.abs(ref_lse).max() > 3e3 and np.isfinite(o).all()
    # float32 knows scores of size |S| only to about eps·|S| (here ~1e-3 absolute), and a softmax passes
    # that absolute error on as a relative error of its weights: the output can be no better.
    assert_close(o, ref_o, 4 * np.finfo(np.float32).eps * float(np.abs(ref_lse).max()), "o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)


def test_device_arrays_stay_on_the_device(rng):
    """numba device arrays in, numba device arrays out (no copy to the host in between)."""
    from numba import cuda

    q, k, v = make_qkv(rng, (2,), 11, 13, d=8, dtype=np.float32)
    o, lse = tf.cuda_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v))
    assert arrays.is_device_array(o) and arrays.is_device_array(lse) and not isinstance(o, np.ndarray)
    assert o.shape == (2, 11, 8) and lse.shape == (2, 11)
    check_against_stages(o.copy_to_host(), lse.copy_to_host(), q, k, v, False, "device arrays")


def test_shared_memory_fallback_warns_and_stays_correct(rng, monkeypatch):
    """If the driver refuses more than 48 KiB of shared memory, a smaller tiling is used, with a warning."""
    def refuse(kernel, args, nbytes):
        if nbytes > STATIC_SMEM_PER_BLOCK:
            raise RuntimeError("refused for the test")

    monkeypatch.setattr(launch, "allow_large_shared_memory", refuse)
    q, k, v = make_qkv(rng, (), 20, 20, d=8, dtype=np.float32)
    big = tiling.TileConfig(BR=64, BC=128, TM=8, NT=128, D=8, DV=64)  # 87 KiB: more than 48
    assert big.smem_bytes > STATIC_SMEM_PER_BLOCK
    with pytest.warns(RuntimeWarning, match="falling back to the slower tiling"):
        o, lse = tf.cuda_attention(q, k, v, config=big)
    check_against_stages(o, lse, q, k, v, False, "fallback")


def test_more_heads_than_one_grid_column_holds(rng, monkeypatch):
    """B × H above CUDA's 65,535 blocks along y is launched in slices of heads; here the limit is
    lowered to 2 so that 7 heads take 4 launches (the GPU tests run 70,000 real heads)."""
    monkeypatch.setattr(launch, "MAX_GRID_Y", 2)
    q, k, v = make_qkv(rng, (7,), 10, 9, d=8, d_v=5, dtype=np.float32)
    for kernel in ("v1", VERSIONS.default("cuda_attention").name):
        o, lse = tf.cuda_attention(q, k, v, causal=True, kernel=kernel)
        check_against_stages(o, lse, q, k, v, True, f"{kernel}, 7 heads in slices of 2")


def test_launch_slices_the_heads(monkeypatch):
    """What the launch helper does with 7 heads and at most 2 blocks along y: 4 launches, each on
    views that start at the first head of its slice."""
    monkeypatch.setattr(launch, "MAX_GRID_Y", 2)
    calls = []

    class Kernel:  # records each launch's grid and the first element of each array it is given
        @staticmethod
        def py_func(A, B, n, flag):  # the kernel's parameters, by which the launch orders its arguments
            pass

        def __getitem__(self, config):
            return lambda *args: calls.append((config[0], [int(a[0]) for a in args[:2]], args[2:]))

    arrays = {"B": (np.arange(7 * 3), 3), "A": (np.arange(7 * 4), 4)}  # two arrays: 3 and 4 elements per head
    launch.launch(Kernel(), 5, 16, 1024, launch.LaunchArgs(arrays=arrays, scalars={"flag": True, "n": 9}, n_heads=7))
    assert calls == [((5, 2), [0, 0], (9, True)), ((5, 2), [8, 6], (9, True)), ((5, 2), [16, 12], (9, True)),
                     ((5, 1), [24, 18], (9, True))]


def test_simple_kernel_asks_for_large_shared_memory(rng, monkeypatch):
    """v1 with d = dv = 256 needs 64 KiB of shared memory on a GPU (its tiles there: GPU_TILE),
    more than a kernel may use without asking: its launch goes through the one launch helper,
    which asks (the GPU tests run it for real)."""
    BR, BC = v1_row_per_thread.GPU_TILE
    assert 4 * BC * (256 + 256) == 64 * 1024 > STATIC_SMEM_PER_BLOCK
    asked, ask = [], launch.allow_large_shared_memory

    def record_and_ask(kernel, args, nbytes):  # the request, recorded and then made (a GPU refuses it otherwise)
        asked.append(nbytes)
        ask(kernel, args, nbytes)

    monkeypatch.setattr(launch, "allow_large_shared_memory", record_and_ask)
    q, k, v = make_qkv(rng, (), 3, 3, d=256, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, kernel="v1")
    BR, BC = v1_row_per_thread.SIMULATOR_TILE if runtime.simulator_enabled() else v1_row_per_thread.GPU_TILE
    assert asked == [4 * BC * (256 + 256)]
    check_against_stages(o, lse, q, k, v, False, "v1, d = 256")


# ---- configuration and errors (no kernel launch) ----------------------------------------------


def test_tile_configs_fit_the_hardware():
    for d in range(1, 257, 7):
        assert tiling.small_config(d, d).smem_bytes <= 48 * 1024
        cfg = tiling.default_config(d, d)
        assert cfg.D >= d and cfg.DV >= d and cfg.smem_bytes <= 227 * 1024  # Hopper's per-block maximum
    with pytest.raises(ValueError, match="invalid tile configuration"):
        tiling.TileConfig(BR=64, BC=64, TM=8, NT=96, D=64, DV=64).validate()


def test_shared_memory_layout_is_the_one_description():
    """The regions follow each other, cover smem_bytes exactly, and hold what the kernels put there."""
    for cfg in (tiling.default_config(64, 64), tiling.default_config(128, 128), tiling.simulator_config(8, 8)):
        regions = cfg.smem_layout()
        assert [r.name for r in regions] == ["Q_i", "K_j, then P_ij", "V_j", "row max / row sum exchange"]
        assert regions[0].offset == 0 and all(a.offset + a.floats == b.offset for a, b in zip(regions, regions[1:]))
        assert 4 * (regions[-1].offset + regions[-1].floats) == cfg.smem_bytes
        assert regions[1].floats >= cfg.BC * cfg.KS and regions[1].floats >= cfg.BC * cfg.PS  # K_j and P_ijᵀ fit
    assert tiling.default_config(128, 128).smem_bytes // 1024 == 102


def test_vector_width():
    """float16 tiles are read 4 elements (8 bytes) per thread and load, float32 ones 1 (docs/results.md)."""
    from tinyflash.gpu.loads import vector_width

    assert vector_width(np.float16) == 4 and vector_width(np.float32) == 1 and vector_width(np.float16, 1) == 1
    with pytest.raises(ValueError, match="vector must be 1 or 4; got 2"):
        v5_branch_free.make_kernel(tiling.simulator_config(8, 8), 2)
    with pytest.raises(ValueError, match=r"vector must be 1 or 4 \(or None: the dtype's default\); got 3"):
        tf.cuda_attention(np.ones((4, 8), np.float32), np.ones((4, 8), np.float32), np.ones((4, 8), np.float32),
                          vector=3)


def test_registry():
    """Every version is registered once, in order, with a file, a line on what changed, what it builds and how it is
    sized; each entry point's default is the rule's, and a name outside the registry is refused with the names."""
    assert list(VERSIONS) == [f"v{i}" for i in range(1, len(VERSIONS) + 1)]
    # cuda_attention's default: the latest version on the CUDA cores (every input)
    assert VERSIONS.default("cuda_attention").name == CUDA_CORES[-1]
    assert VERSIONS.default("tensor_core_attention").name == "v6" and VERSIONS.default("hopper_attention").name == "v10"
    for name, version in VERSIONS.items():
        assert version.module.startswith(name + "_") and version.changed and callable(version.build)
        assert len(version.tilings) >= 2 and all(map(callable, version.tilings))
        assert f"def {version.build.__name__}(" in version.source()  # its file says what it builds
    assert VERSIONS.choose(None, "cuda_attention") is VERSIONS[CUDA_CORES[-1]] and VERSIONS.choose("v1") is VERSIONS["v1"]
    with pytest.raises(ValueError, match=r"kernel must be one of v1, v2, .*v10 \(None: v5\); got 'v0'"):
        tf.cuda_attention(np.ones((4, 8), np.float32), np.ones((4, 8), np.float32), np.ones((4, 8), np.float32),
                          kernel="v0")
    table = VERSIONS.table().splitlines()
    assert len(table) == 2 + len(VERSIONS) and all(f"| {name} |" in " ".join(table) for name in VERSIONS)


def test_bad_inputs():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(TypeError, match="^q has dtype float64; expected one of float16, bfloat16, float32"):
        tf.cuda_attention(x.astype(np.float64), x.astype(np.float64), x.astype(np.float64))
    big = np.ones((4, 257), np.float32)
    with pytest.raises(ValueError, match="head dims up to 256; got d .* = 257"):
        tf.cuda_attention(big, big, big)
    with pytest.raises(ValueError, match="head dims up to 256; got dv"):
        tf.cuda_attention(x, x, np.ones((4, 300), np.float32))
    with pytest.raises(ValueError, match="kernel must be one of v1, v2, .* got 'fastest'"):
        tf.cuda_attention(x, x, x, kernel="fastest")
    with pytest.raises(TypeError, match=r"kernel v1 takes the options \[\]; got \['config'\]"):
        tf.cuda_attention(x, x, x, kernel="v1", config=tiling.simulator_config(8, 8))
    with pytest.raises(ValueError, match="same head dimension"):
        tf.cuda_attention(x, x[:, :4], x)
    with pytest.raises(ValueError, match="at least one key"):
        tf.cuda_attention(x, x[:0], x[:0])
    with pytest.raises(TypeError, match="causal must be True or False"):
        tf.cuda_attention(x, x, x, causal="yes")
    with pytest.raises(ValueError, match="too small for d=8"):
        tf.cuda_attention(x, x, x, config=tiling.TileConfig(BR=8, BC=8, TM=2, NT=16, D=0, DV=16))


def test_mixed_host_and_device_arrays():
    from numba import cuda

    x = np.ones((4, 8), np.float32)
    with pytest.raises(TypeError, match="all be device arrays or all host arrays"):
        tf.cuda_attention(cuda.to_device(x), x, x)


def test_numpy_25_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(np, "__version__", "2.5.2")
    monkeypatch.delattr(np, "row_stack", raising=False)
    with pytest.raises(ImportError, match=r"needs numpy < 2.5 .*pip install 'numpy<2.5'"):
        tinyflash.gpu._check_numpy_for_numba_cuda()


def test_simulator_flag_matches_the_machine():
    assert runtime.simulator_enabled() == (not HAS_GPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tiling.default_config(64, 64).BC == 128


def test_launch_arguments_go_by_name():
    """A kernel is given its parameters by name, whatever order or extra values the host passes; a missing one
    is a TypeError that names it."""
    def flash_fwd(Q, K, n_q, causal):
        pass

    kernel = type("K", (), {"py_func": staticmethod(flash_fwd)})()
    assert launch.parameters(kernel) == ("Q", "K", "n_q", "causal")
    assert launch.by_name(kernel, {"causal": True, "d": 64, "K": "k", "n_q": 3, "Q": "q"}) == ("q", "k", 3, True)
    with pytest.raises(TypeError, match="flash_fwd takes Q, K, n_q, causal; no value for n_q"):
        launch.by_name(kernel, {"Q": "q", "K": "k", "causal": False})
