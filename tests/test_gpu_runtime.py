"""What a user without a GPU meets: one clear error when kernels cannot run, a warning and a
progress bar before a long simulator run, and a dtype error that says what to do."""

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import tqdm
from conftest import HAS_GPU
from numba import cuda

import tinyflash as tf
from tinyflash.gpu import launch as launch_module
from tinyflash.gpu import runtime

ROOT = Path(__file__).resolve().parents[1]

NO_GPU_SCRIPT = """
    import os
    import numba.cuda
    {patch}
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # too late: numba is imported already (the message says so)
    import numpy as np
    import tinyflash as tf
    q = np.ones((3, 8), np.float32)
    {call}
"""
GPU_ENTRY_POINTS = {  # every public function that runs a kernel, called as a user would
    "cuda_attention": "tf.cuda_attention(q, q, q)",
    "tensor_core_attention": "tf.tensor_core_attention(q.astype(np.float16), q.astype(np.float16), "
                             "q.astype(np.float16))",
    "cuda_attention_backward": "o, lse = tf.naive_attention(q, q, q); tf.cuda_attention_backward(q, q, q, o, lse, q)",
    "cuda_split_kv_attention": "tf.cuda_split_kv_attention(q[None], q[None], q[None])",
    "hopper_attention": "h = np.ones((3, 64), np.float16); tf.hopper_attention(h, h, h)",
    "tensor_core_attention_backward": "h = np.ones((3, 64), np.float16); o, lse = tf.naive_attention(h, h, h); "
                                      "tf.tensor_core_attention_backward(h, h, h, o.astype(np.float16), "
                                      "lse.astype(np.float32), h)",
}
BAD_CALLS = {  # each entry point with an argument it refuses: the refusal comes first, before the GPU is looked up
    "tensor_core_attention(float32 inputs)": ("tf.tensor_core_attention(q, q, q)",
                                              "TypeError: tensor_core_attention takes float16 or bfloat16; got q of "
                                              "dtype float32"),
    "cuda_attention(causal='yes')": ("tf.cuda_attention(q, q, q, causal='yes')",
                                     "TypeError: causal must be True or False; got 'yes'"),
    "hopper_attention(d = 8)": ("h = q.astype(np.float16); tf.hopper_attention(h, h, h)",
                                "ValueError: hopper_attention supports d = dv one of (64, 128, 256)"),
    "cuda_attention_backward(kernel='v0')": ("o, lse = tf.naive_attention(q, q, q); tf.cuda_attention_backward("
                                             "q, q, q, o, lse, q, kernel='v0')", "ValueError: kernel must be one of"),
    "cuda_split_kv_attention(num_splits=0)": ("tf.cuda_split_kv_attention(q[None], q[None], q[None], num_splits=0)",
                                              "ValueError: num_splits"),
}


def run_without_gpu(patch: str, entry: str = "cuda_attention", code: str | None = None) -> subprocess.CompletedProcess:
    """``entry``'s call (or ``code``) in a new process whose numba has no GPU and no simulator."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    code = textwrap.dedent(NO_GPU_SCRIPT.format(patch=patch, call=code or GPU_ENTRY_POINTS[entry]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("how, entry", [
    *[("driver reported missing", entry) for entry in GPU_ENTRY_POINTS],  # numba.cuda.is_available() says False:
    # what a machine without a driver shows
    pytest.param("this machine", "cuda_attention",
                 marks=pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: nothing to fail")),
])
def test_no_gpu_gives_one_clear_error(how, entry):
    patch = "numba.cuda.is_available = lambda: False" if how == "driver reported missing" else ""
    proc = run_without_gpu(patch, entry)
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tinyflash.gpu.runtime.NoGPUError: no CUDA GPU was found"), proc.stderr[-3000:]
    for words in ("set NUMBA_ENABLE_CUDASIM=1 before Python starts",
                  "setting os.environ after numba has been imported does not work"):
        assert words in last, (words, last)
    assert "CudaSupportError" not in proc.stderr and "During handling" not in proc.stderr  # no chained traceback


@pytest.mark.parametrize("call", BAD_CALLS)
def test_arguments_are_checked_before_the_gpu_is_looked_up(call):
    """Without a GPU (and without the simulator) a call with a bad argument is told what is wrong with it, not that
    there is no GPU: the entry points check their arguments first."""
    code, error = BAD_CALLS[call]
    proc = run_without_gpu("numba.cuda.is_available = lambda: False", code=code)
    assert proc.returncode != 0, proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith(error), proc.stderr[-3000:]


def test_require_gpu_passes_on_the_simulator_or_a_gpu():
    runtime.require_gpu()  # conftest: a real GPU, or the simulator; either way kernels can run


def test_simulator_cost():
    assert runtime.simulator_cost(128, 8) == (1024, 1024 * runtime.SIMULATOR_SECONDS_PER_THREAD_TILE)
    assert runtime.simulator_cost(16, 0)[0] == 16  # at least one tile
    assert runtime.SIMULATOR_PROGRESS_WORK < runtime.SIMULATOR_WARN_WORK


@pytest.mark.simulator
@pytest.mark.skipif(HAS_GPU, reason="the warning and the progress bar are the simulator's; here kernels run on a GPU")
def test_long_simulator_launch_warns_once_and_shows_progress(monkeypatch, capsys):
    q = np.random.default_rng().standard_normal((2, 20, 8)).astype(np.float32)  # (H, N, d): 2 heads
    with warnings.catch_warnings():
        warnings.simplefilter("error", launch_module.SimulatorSlowWarning)
        tf.cuda_attention(q, q, q, kernel="v1")  # small: below both thresholds, silent
    assert "block" not in capsys.readouterr().err
    monkeypatch.setattr(launch_module, "SIMULATOR_PROGRESS_WORK", 1)
    monkeypatch.setattr(launch_module, "SIMULATOR_WARN_WORK", 2)
    monkeypatch.setattr(launch_module, "_warned_slow", False)
    counted = []

    class Bar(tqdm.tqdm):  # the real bar, remembering how far it got
        def close(self):
            counted.append((self.n, self.total))
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    with pytest.warns(launch_module.SimulatorSlowWarning, match=r"CUDA threads × 2 key tiles = \d+ thread-tiles: "
                      r"of the order of \d+ s"):
        tf.cuda_attention(q, q, q, kernel="v1")
    err = capsys.readouterr().err
    assert "simulator, ~" in err and "/4 [" in err and counted == [(4, 4)]  # 2 query tiles × 2 heads, all counted
    with warnings.catch_warnings():
        warnings.simplefilter("error", launch_module.SimulatorSlowWarning)
        tf.cuda_attention(q, q, q, kernel="v1")  # warned once per process: not again


@pytest.mark.parametrize("make", [lambda x: x.astype(np.float64), lambda x: x.astype(np.float64).tolist()],
                         ids=["float64 array", "Python list"])
def test_cuda_dtype_error_says_what_to_do(make):
    q = np.random.default_rng().standard_normal((5, 8)).astype(np.float32)
    with pytest.raises(TypeError) as info:
        tf.cuda_attention(make(q), make(q), make(q))
    msg = str(info.value)
    assert msg.startswith("q has dtype float64; expected one of float16, bfloat16, float32. Convert it first: "
                          "q.astype(np.float32) for an array, np.asarray(q, dtype=np.float32) for a list"), msg
    assert "a Python list of floats becomes float64" in msg


@pytest.mark.simulator
@pytest.mark.skipif(HAS_GPU, reason="measures the simulator; here kernels run on a GPU")
def test_simulator_rate_counts_the_work_launch_counts():
    import importlib.util

    from tinyflash.forward.kernels import v1_row_per_thread

    spec = importlib.util.spec_from_file_location("simulator_rate", ROOT / "benchmarks" / "simulator_rate.py")
    simulator_rate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(simulator_rate)

    (row,) = simulator_rate.measure(sizes=((5, 20, 8),), kernels=("v1",))
    tiling = v1_row_per_thread.tiling(8, 8)
    br, bc = tiling.BR, tiling.BC
    assert br >= 5 and row["work"] == br * -(-20 // bc)  # one query tile of BR threads × the key tiles of 20 keys
    assert row["seconds"] > 0 and row["seconds_per_thread_tile"] == row["seconds"] / row["work"]


def test_the_simulators_rate_is_the_records_order_of_magnitude():
    """SIMULATOR_SECONDS_PER_THREAD_TILE is within a factor of 3 of every committed measurement of the rate
    (figures/data/simulator_rate.csv), so the warning's expected time is of the right order."""
    import csv

    from tinyflash.gpu.runtime import SIMULATOR_SECONDS_PER_THREAD_TILE

    with open(ROOT / "figures" / "data" / "simulator_rate.csv", newline="") as f:
        rates = [float(r["seconds_per_thread_tile"]) for r in csv.DictReader(f)]
    assert rates and all(SIMULATOR_SECONDS_PER_THREAD_TILE / 3 <= r <= 3 * SIMULATOR_SECONDS_PER_THREAD_TILE
                         for r in rates), rates


@pytest.mark.simulator
@pytest.mark.parametrize("entry", ["forward", "backward", "decode"])
def test_a_gpu_without_the_tensor_core_instructions_is_refused_clearly(monkeypatch, rng, entry):
    """On a GPU of compute capability below 8.0 (made up here: the simulator runs every instruction), the
    tensor-core and decode entry points refuse before any kernel is compiled or launched, naming the device's
    capability and what runs there; the CUDA-core forward still runs."""
    monkeypatch.setattr(runtime, "simulator_enabled", lambda: False)  # what require_compute_capability reads
    monkeypatch.setattr(runtime, "compute_capability", lambda: (7, 5))
    launched = []
    monkeypatch.setattr(launch_module, "launch", lambda *a, **k: launched.append(a))
    q, k, v = (rng.standard_normal((2, 20, 64)).astype(np.float16) for _ in range(3))
    calls = {"forward": lambda: tf.tensor_core_attention(q, k, v),
             "backward": lambda: tf.tensor_core_attention_backward(q, k, v, q, np.zeros((2, 20), np.float32), q),
             "decode": lambda: tf.cuda_split_kv_attention(q[:, :1], k, v)}
    with pytest.raises(runtime.UnsupportedGPUError, match=r"compute capability 8\.0 or newer .* has 7\.5\. "
                                                          r"tinyflash\.cuda_attention"):
        calls[entry]()
    assert not launched


@pytest.mark.skipif(HAS_GPU, reason="checks the simulator's threads")
def test_the_threads_of_a_failed_simulated_kernel_are_waited_for():
    """Thread 0 raises while thread 1 is still in a device function: numba raises at once, and this module's
    ``cuda`` stays numba's fake one until thread 1 ends; join_simulator_threads waits for it."""
    @cuda.jit(device=True)
    def work(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    @cuda.jit
    def fails(out):
        if cuda.threadIdx.x == 0:
            raise ArithmeticError("thread 0 fails")
        work(1.0)
        out[0] = 1.0

    with pytest.raises(ArithmeticError, match="thread 0 fails"):
        fails[1, 2](np.zeros(1))
    assert type(globals()["cuda"]).__name__ == "FakeCUDAModule"  # thread 1 still works, in this module
    assert runtime.join_simulator_threads(timeout=30.0)
    assert globals()["cuda"] is cuda  # numba's real module is back
